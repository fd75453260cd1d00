"""What the tuned schedule is compared with, and the comparison on held-out seeds.

The baselines are the policies a user would otherwise run: no speculation, every fixed k
of the searched range (also what vLLM and TensorRT-LLM run without a schedule: their static
``num_speculative_tokens`` / ``max_draft_len`` at every step), the analytic ``lut`` at the
scenario's alpha (what ``specbatch lut`` prints), ``goodput`` (SmartSpec) over the same k
range, and SGLang's adaptive controller with its default ladder (its steps beyond the largest k the
method or the profile allows left out; not with a tree, which SGLang adapts only as a chain). None
goes beyond the method's ``num_speculative_tokens``: vLLM sizes every step by it. Each runs on the held-out
seeds with the tuned schedule, so every row shares the tuned one's workloads and the
differences are paired.
"""

from __future__ import annotations

from dataclasses import dataclass

from specbatch.commands.tune.objective import NOISE_LEVEL, Objective, Paired, paired
from specbatch.commands.tune.trials import ROW_METRICS, Candidate

SGLANG_DEFAULT_STEPS = (1, 3, 7)  # SGLang's default candidate_steps (policies/sglang_adaptive.py)
TUNED = "tuned"


def baselines(k_values: tuple[int, ...], alpha: float, k_limit: int, tree: bool = False) -> list[Candidate]:
    """The baselines over the searched k range; ``k_limit``: the largest k a run may choose (the profile's
    k_max, or the method's num_speculative_tokens); ``tree``: the method drafts a tree (no SGLang row)."""
    top = k_values[-1]
    steps = [s for s in SGLANG_DEFAULT_STEPS if s <= k_limit]
    sglang = ({"name": "sglang-adaptive"} if len(steps) == len(SGLANG_DEFAULT_STEPS) else
              {"name": "sglang-adaptive", "adaptive_config": {"candidate_steps": steps}})
    return ([Candidate("none", {"name": "none"})]
            + [Candidate(f"fixed k={k}", {"name": "fixed", "k": k}) for k in range(1, top + 1)]
            + [Candidate(f"lut alpha={alpha:g}", {"name": "lut", "alpha": alpha, "k_max": top}),
               Candidate(f"goodput k_max={top}", {"name": "goodput", "k_max": top})]
            + ([] if tree else [Candidate(f"sglang-adaptive steps {steps}", sglang)]))


@dataclass(frozen=True)
class Row:
    """One policy on the held-out seeds."""

    label: str
    policy: dict
    losses: tuple[float, ...]          # per held-out seed
    metrics: dict[str, float]          # each ROW_METRICS' mean over the seeds (None when absent)
    tuned_minus: Paired                # the tuned schedule's loss - this policy's, per seed (< 0: tuned better)

    def value(self, objective: Objective) -> float:
        return objective.value(sum(self.losses) / len(self.losses))


def comparison(candidates: list[Candidate], summaries: dict[str, list[dict]], objective: Objective) -> list[Row]:
    """One row per candidate (the tuned schedule first), from its per-seed summaries."""
    losses = {c.label: tuple(objective.loss(s) for s in summaries[c.label]) for c in candidates}
    tuned = losses[TUNED]
    rows = []
    for c in candidates:
        runs = summaries[c.label]
        metrics = {}
        for name in ROW_METRICS:
            values = [s.get(name) for s in runs]
            metrics[name] = None if any(v is None for v in values) else sum(values) / len(values)
        rows.append(Row(c.label, c.policy, losses[c.label], metrics, paired(tuned, losses[c.label])))
    return rows


def best_baseline(rows: list[Row]) -> Row:
    """The baseline with the lowest mean loss (ties to the earlier row)."""
    others = [r for r in rows if r.label != TUNED]
    return min(others, key=lambda r: sum(r.losses) / len(r.losses))


def verdict_level(rows: list[Row]) -> float:
    """The confidence level of the verdict: 95%, Bonferroni-corrected for picking the best of the baselines
    on the same held-out seeds (the best of eleven looks better than it is)."""
    return NOISE_LEVEL / max(1, len(rows) - 1)


def verdict_category(rows: list[Row]) -> str:
    """"better", "within noise" or "worse": the tuned schedule against the best baseline."""
    return best_baseline(rows).tuned_minus.category(verdict_level(rows))


def verdict(rows: list[Row], objective: Objective) -> str:
    """Whether the tuned schedule is better than, within noise of, or worse than the best baseline."""
    best = best_baseline(rows)
    diff, level = best.tuned_minus, verdict_level(rows)
    tuned_value = next(r for r in rows if r.label == TUNED).value(objective)
    gap = f"{objective.metric} {tuned_value:.4g} vs {best.value(objective):.4g}"
    margin = (f"paired difference {abs(diff.mean):.3g} ± {diff.interval(level):.2g} {objective.unit} over "
              f"{diff.seeds} held-out seeds ({1 - level:.1%} confidence: 95% for the best of {len(rows) - 1} "
              f"baselines)")
    category = diff.category(level)
    if category == "better":
        return f"better than the best baseline ({best.label}): {gap}; {margin}"
    if category == "within noise":
        return f"within noise of the best baseline ({best.label}): {gap}; {margin}"
    return f"WORSE than the best baseline ({best.label}) beyond noise: {gap}; {margin}"
