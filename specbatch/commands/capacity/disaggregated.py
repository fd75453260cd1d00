"""``--pd-ratios`` / ``--gpu-budget``: capacity of disaggregated prefill and decode against aggregated serving.

Each split P:D is searched as one unit, P prefill and D decode replicas simulated together as
``specbatch run --prefill-replicas P --decode-replicas D`` runs them (sim/disaggregated.py), with
the same search, keep-up test and confirmation runs as one aggregated replica; the policy is
the decode pool's (a prefill replica never drafts). Like aggregated replicas, units are assumed
to split the traffic evenly: units for a target = ceil(target / the unit's max rate). Beside each
split the report puts aggregated serving on the same GPUs: one aggregated replica is searched
per policy, and N replicas on the split's GPUs serve N times its rate (the same even-split
rule). A GPU budget either scales each ratio to the most units that fit in it, or, without
ratios, tries every split that uses it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.errors import InputError
from specbatch.commands.figures import plain_log_labels

AGGREGATED = "aggregated"
RATIOS_FLAG, BUDGET_FLAG = "--pd-ratios", "--gpu-budget"
# the run flags of disaggregated serving that a capacity search over splits passes on to every split
POOL_FLAGS = ("--decode-profile", "--kv-link", "--kv-link-bandwidth", "--kv-link-latency-us", "--pd-threshold",
              "--prefill-engine", "--decode-engine")
PREFILL_PROFILE_FLAG = "--prefill-profile"  # capacity's own: the splits' prefill pool on another profile


@dataclass(frozen=True)
class Split:
    """P prefill and D decode replicas, and the GPUs a replica of each pool occupies."""

    prefill: int
    decode: int
    prefill_gpus: int = 1    # per prefill replica
    decode_gpus: int = 1     # per decode replica

    @property
    def name(self) -> str:
        return f"{self.prefill}P:{self.decode}D"

    @property
    def gpus(self) -> int:
        """GPUs of the whole unit: what one unit costs per hour, in GPU-hours."""
        return self.prefill * self.prefill_gpus + self.decode * self.decode_gpus


@dataclass(frozen=True)
class SplitAsk:
    """What a disaggregated capacity search compares: the splits (by name) and the aggregated replica's GPUs."""

    splits: dict            # name -> Split
    aggregated_gpus: int    # GPUs of one aggregated replica
    budget: int | None
    link: str               # the KV link, in words
    decode_profile: str | None = None  # the decode pool's own profile (--decode-profile), else the run's
    prefill_profile: str | None = None  # the prefill pool's own profile (--prefill-profile), else the run's

    def same_gpus_replicas(self, split: Split) -> int:
        """Aggregated replicas on the split's GPUs (as many as fit)."""
        return split.gpus // self.aggregated_gpus


def parse_ratios(text: str) -> tuple[tuple[int, int], ...]:
    """``1:1,1:2,2:3`` -> ((1, 1), (1, 2), (2, 3)); each pool at least one replica (one line otherwise)."""
    ratios = []
    for part in (p.strip() for p in text.split(",")):
        p, sep, d = part.partition(":")
        if not sep or not p.strip().isdigit() or not d.strip().isdigit():
            raise InputError(f"'{part}' is not PREFILL:DECODE replicas, e.g. 1:2", source=RATIOS_FLAG)
        p, d = int(p), int(d)
        if p == 0 or d == 0:
            pool = "prefill" if p == 0 else "decode"
            raise InputError(f"'{part}' has no {pool} replica: disaggregated serving needs at least one in "
                             "each pool", source=RATIOS_FLAG)
        if (p, d) in ratios:
            raise InputError(f"{p}:{d} is given twice", source=RATIOS_FLAG)
        ratios.append((p, d))
    return tuple(ratios)


def plan_splits(ratios: str | None, budget: int | None, prefill_gpus: int, decode_gpus: int) -> tuple[Split, ...]:
    """The splits to search: the ratios as given (the smallest unit), scaled to the budget, or every split
    that uses the budget exactly."""
    parsed = parse_ratios(ratios) if ratios is not None else None
    if budget is None:
        return tuple(Split(p, d, prefill_gpus, decode_gpus) for p, d in parsed)
    smallest = prefill_gpus + decode_gpus
    if budget < max(2, smallest):
        raise InputError(f"disaggregated serving needs at least {max(2, smallest)} GPUs (a prefill and a decode "
                         f"replica), got {budget}", source=BUDGET_FLAG)
    if parsed is None:
        splits = tuple(Split(p, d, prefill_gpus, decode_gpus) for p in range(1, budget)
                       for d in range(1, budget) if p * prefill_gpus + d * decode_gpus == budget)
        if not splits:
            raise InputError(f"no split of whole replicas ({prefill_gpus} GPU(s) a prefill replica, {decode_gpus} a "
                             f"decode replica) uses {budget} GPUs", source=BUDGET_FLAG)
        return splits
    out = []
    for p, d in parsed:
        unit = Split(p, d, prefill_gpus, decode_gpus)
        times = budget // unit.gpus
        if times == 0:
            raise InputError(f"{p}:{d} takes {unit.gpus} GPUs, more than the budget of {budget}", source=BUDGET_FLAG)
        scaled = Split(p * times, d * times, prefill_gpus, decode_gpus)
        if scaled in out:
            raise InputError(f"{p}:{d} scales to {scaled.name}, as another ratio does", source=RATIOS_FLAG)
        out.append(scaled)
    return tuple(out)


def split_overrides(split: Split, prefill_profile: str | None = None, decode_profile: str | None = None,
                    decode_given: bool = False) -> dict:
    """The config keys that make a run this split; with ``prefill_profile`` the prefill pool runs on it (the
    run's profile) and the decode pool on ``decode_profile`` (--decode-profile's if ``decode_given``, else the
    aggregated replica's)."""
    out = {"cluster.prefill_replicas": (split.prefill, RATIOS_FLAG),
           "cluster.decode_replicas": (split.decode, RATIOS_FLAG)}
    if prefill_profile is not None:
        out["profile"] = (prefill_profile, PREFILL_PROFILE_FLAG)
        out["cluster.decode_profile"] = (decode_profile, "--decode-profile" if decode_given else PREFILL_PROFILE_FLAG)
    return out


def pool_keys() -> tuple[str, ...]:
    """The config keys of POOL_FLAGS."""
    from specbatch.commands.flags import RUN_FLAGS

    return tuple(RUN_FLAGS[flag][0] for flag in POOL_FLAGS)


def check_not_v0(config) -> None:
    """vLLM's KV connectors are V1's: a one-line refusal, naming the flag, before any run."""
    if config.engine.scheduler != "vllm-v1":
        raise InputError(f"disaggregated serving runs under --scheduler vllm-v1 (vLLM's KV connectors are V1's); "
                         f"the scheduler is {config.engine.scheduler}", source="--scheduler")


def link_text(config) -> str:
    from sim.serving.transfer import link_for

    c = config.cluster
    link = link_for(c.kv_link, c.kv_link_bandwidth_gb_s, c.kv_link_latency_us)
    return f"{link.name}, {link.bandwidth_gb_s:g} GB/s per GPU, {link.latency_us:g} us"


# ---------------------------------------------------------------- the comparison, in the report

FIGURE = "disaggregated_frontier.png"
EXPLAINED = (
    "Each split is one unit of P prefill and D decode replicas, simulated together (KV transfers priced on the "
    "link named above) and searched like one aggregated replica: its max rate is a rate its own runs showed "
    "sustained within every SLO. Aggregated on the same GPUs = as many aggregated replicas as the split's GPUs "
    "hold, each at the aggregated replica's max rate (traffic split evenly, as for replicas). For a target, units "
    "= ceil(target / the unit's max rate); GPUs = units × the unit's GPUs.")


def header(inputs) -> list[str]:
    cols = ["split", "prefill GPUs", "decode GPUs", "GPUs", "policy", "max rate (req/s)", "req/s per GPU",
            "aggregated on the same GPUs (req/s)", "disaggregated / aggregated"]
    if inputs.target_rate is not None:
        cols += [f"GPUs for {inputs.target_rate:g} req/s", f"aggregated GPUs for {inputs.target_rate:g} req/s"]
    if inputs.priced:
        cols += ["$ / 1M output tokens at max rate", "aggregated $ / 1M output tokens at max rate"]
    return cols


def comparisons(inputs, outcomes: dict, costs: dict) -> list[dict]:
    """Per split and policy, in numbers: the split's max rate and cost beside aggregated serving's on the same
    GPUs (the report's table, the API's and capacity.json's)."""
    ask = inputs.splits
    rows = []
    for name, split in ask.splits.items():
        for label, o in outcomes[name].items():
            agg, agg_cost, cost = outcomes[AGGREGATED][label], costs[AGGREGATED][label], costs[name][label]
            same = ask.same_gpus_replicas(split) * agg.max_rate
            agg_gpus = None if agg_cost.replicas is None else agg_cost.replicas * ask.aggregated_gpus
            rows.append({"split": name, "policy": label, "prefill_replicas": split.prefill,
                         "decode_replicas": split.decode, "prefill_gpus": split.prefill * split.prefill_gpus,
                         "decode_gpus": split.decode * split.decode_gpus, "gpus": split.gpus,
                         "max_rate": o.max_rate, "rate_per_gpu": o.max_rate / split.gpus,
                         "aggregated_same_gpus_rate": same,
                         "ratio_to_aggregated": o.max_rate / same if same > 0 else None,
                         "gpus_for_target": None if cost.replicas is None else cost.replicas * split.gpus,
                         "aggregated_gpus_for_target": agg_gpus,
                         "cost_per_m_at_max_rate": cost.cost_per_m_at_max_rate,
                         "aggregated_cost_per_m_at_max_rate": agg_cost.cost_per_m_at_max_rate})
    return rows


def rows(inputs, outcomes: dict, costs: dict) -> list[list[str]]:
    from specbatch.commands.capacity.formats import money_text, num_text, policy_text

    out = []
    for r in comparisons(inputs, outcomes, costs):
        policy = policy_text(r["policy"], outcomes[r["split"]][r["policy"]])
        row = [r["split"], str(r["prefill_gpus"]), str(r["decode_gpus"]), str(r["gpus"]), policy,
               num_text(r["max_rate"]) if r["max_rate"] > 0 else "none meets the SLOs", num_text(r["rate_per_gpu"]),
               num_text(r["aggregated_same_gpus_rate"]), "—" if r["ratio_to_aggregated"] is None
               else f"{r['ratio_to_aggregated']:.2f}x"]
        if inputs.target_rate is not None:
            row += ["—" if r["gpus_for_target"] is None else str(r["gpus_for_target"]),
                    "—" if r["aggregated_gpus_for_target"] is None else str(r["aggregated_gpus_for_target"])]
        if inputs.priced:
            row += [money_text(r["cost_per_m_at_max_rate"]), money_text(r["aggregated_cost_per_m_at_max_rate"])]
        out.append(row)
    return out


def frontier_figure(plt, inputs, outcomes: dict, colors: dict):
    """Per SLO statistic: the rate per GPU each split (and the aggregated replica) served against that
    statistic, at every rate the search ran; a star at each max rate, the SLO's limit dashed."""
    n = len(inputs.slos)
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n + 0.6, 4.2), squeeze=False)
    styles = ("-", "--", ":", "-.")
    policies = list(dict.fromkeys(label for by_policy in outcomes.values() for label in by_policy))
    for ax, slo in zip(axes[0], inputs.slos):
        for name, by_policy in outcomes.items():
            gpus = inputs.gpus(name)
            for label, o in by_policy.items():
                rates = sorted(o.points)
                style = styles[policies.index(label) % len(styles)]
                ax.plot([o.points[r].stats[slo.metric] for r in rates], [r / gpus for r in rates], ls=style,
                        marker=".", color=colors[name], label=f"{name} / {label}")
                if o.max_rate in o.points:
                    ax.plot([o.points[o.max_rate].stats[slo.metric]], [o.max_rate / gpus], marker="*",
                            markersize=11, color=colors[name])
        ax.axvline(slo.limit_ms, color="dimgrey", ls="--", lw=1.5)
        ax.set_xscale("log")
        plain_log_labels(ax.xaxis)
        ax.set_xlabel(f"{slo.metric} (ms)")
        ax.set_ylabel("request rate per GPU (req/s)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Rate per GPU against each SLO statistic, per split and policy (star: max rate within every SLO; "
                 "dashed: the SLO)", fontsize=9)
    fig.tight_layout()
    return fig
