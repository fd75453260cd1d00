"""What a run ran, in words and as data: the one description of a resolved run config.

Every report says which speculation method ran, what drafted its tokens and which acceptance
model priced them, with its parameters as the run used them: summary.json (``described``),
``specbatch capacity``'s table, report and capacity.json, ``specbatch tune``'s printed result,
report and tune.json. They all call :func:`describe` on the config the runs were given, so
a report cannot say "draft model, alpha 0.7" while the runs used EAGLE-3's per-position
defaults (the config's acceptance is already the method's default where none was given:
``sim.config._settle_speculation``).
"""

from __future__ import annotations

from typing import Any

from sim.config import RunConfig
from sim.speculation.methods import ACCEPTANCE_DEFAULTS, Speculation, default_match_rate


def describe(config: RunConfig, profile: Any = None, k_max: int | None = None) -> dict[str, Any]:
    """The method, drafter and acceptance of ``config`` (resolved: as ``load_config`` returns it).

    ``profile`` (a loaded ``sim.costmodel.profile.Profile``, or None to load ``config.profile``) names the
    drafter as its sidecar does; ``k_max``: the largest k the runs may draft (None: the method's
    num_speculative_tokens, else the rates given). Keys: ``method``, ``method_text``, ``drafter``,
    ``acceptance`` (the model and its parameters as used), ``acceptance_text`` and ``text`` (one line)."""
    if profile is None:
        from sim.simulate import checked_profile

        profile = checked_profile(config.profile)
    spec = config.speculation
    acceptance = acceptance_as_used(config, spec, k_max)
    drafter = drafter_name(spec, profile)
    text = acceptance_text(acceptance)
    return {"method": spec.method, "method_text": spec.label(), "drafter": drafter, "acceptance": acceptance,
            "acceptance_text": text, "text": f"{spec.label()}; drafter {drafter}; acceptance {text}"}


def drafter_name(spec: Speculation, profile: Any) -> str:
    """What drafts, as the profile's sidecar names it (``models.draft`` for a draft model, ``models.<method>``
    for a head or a host proposer: 'llama-3.2-1b', 'eagle3 head of llama-3.1-8b'); a profile that names
    none: the method's kind of drafter."""
    models = profile.meta.get("models") or {}
    name = (models.get(spec.profile_model) or {}).get("name")
    if name is not None:
        return str(name)
    if spec.drafter == "model":
        return "none (the profile has no draft model)"
    kind = {"head": f"{spec.method} head", "heads": "medusa heads", "host": f"{spec.method} proposer (host)"}
    return f"{kind[spec.drafter]} (unnamed in the profile)"


def acceptance_as_used(config: RunConfig, spec: Speculation | None = None, k_max: int | None = None) -> dict[str, Any]:
    """The acceptance model and the parameters a run reads (``sim.speculation.acceptance``): alpha and its distribution
    for the geometric model, the per-position rates up to ``k_max`` or the method's k (the last conditional
    rate repeated beyond those given, as the runs extend them), a trace's file; the host proposers' match
    rate; a tree's sibling rates; and whether the values are the method's defaults
    (docs/speculation-methods.md)."""
    from sim.speculation.acceptance import position_rates

    spec = spec or config.speculation
    a = config.acceptance
    out: dict[str, Any] = {"model": a.model}
    if a.model == "geometric":
        out.update(alpha=a.alpha, distribution=a.distribution)
        if a.distribution == "beta":
            out["concentration"] = a.concentration
    elif a.model == "per-position":
        positions = (k_max if k_max else spec.num_speculative_tokens if spec.given and spec.num_speculative_tokens
                     else len(a.per_position))
        out["per_position"] = [round(float(r), 6) for r in position_rates(a.per_position, positions)]
    else:
        out["trace"] = a.trace
        if a.model == "runlength":
            out["proposer"] = a.proposer
    if spec.drafter == "host":
        out["match_rate"] = a.match_rate if a.match_rate is not None else default_match_rate(spec.method, a.model)
    if spec.is_tree and a.sibling_rates is not None:
        out["sibling_rates"] = list(a.sibling_rates)
    defaults = ACCEPTANCE_DEFAULTS[spec.method]
    out["method_default"] = bool(spec.given and defaults and a.model == defaults.get("model", "geometric")
                                 and (a.per_position is None or tuple(a.per_position) == defaults.get("per_position")))
    return out


def acceptance_text(acceptance: dict[str, Any]) -> str:
    """``acceptance_as_used`` in words: 'per-position P(a >= j) 0.6937, 0.4602, 0.3177 (the method's default)'."""
    model = acceptance["model"]
    if model == "geometric":
        text = f"geometric, alpha {acceptance['alpha']:g}, {acceptance['distribution']}"
        if acceptance["distribution"] == "beta":
            text += f" (concentration {acceptance['concentration']:g})"
    elif model == "per-position":
        text = "per-position P(a >= j) " + ", ".join(f"{r:.4g}" for r in acceptance["per_position"])
    elif model == "trace":
        text = f"trace {acceptance['trace']}"
    else:
        text = f"runlength trace {acceptance['trace']} ({acceptance['proposer']} runs)"
    if acceptance["method_default"]:
        text += " (the method's default)"
    if "match_rate" in acceptance:  # sim.speculation.methods.default_match_rate: its meaning under each model
        share = f"{100 * acceptance['match_rate']:.4g}%"
        text += (f"; a run of 1 still matched at {share} of positions" if model == "runlength"
                 else f"; proposes at {share} of output positions")
    if "sibling_rates" in acceptance:
        text += "; sibling rates " + ", ".join(f"{r:g}" for r in acceptance["sibling_rates"])
    return text


def policy_k_max(config: RunConfig) -> int | None:
    """The largest k the config's policy may choose (None where the policy cannot say without its run)."""
    from policies.registry import make_policy

    try:
        return make_policy(config.policy.name, config.policy.params).max_k
    except Exception:  # noqa: BLE001 - a policy that needs its run (or a plugin's) to know: the method's k stands
        return None
