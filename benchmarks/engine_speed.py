"""How fast the simulator runs: engine steps and simulated requests per wall-clock second.

    python benchmarks/engine_speed.py                    # every case of the README's table, into runs/benchmarks/
    python benchmarks/engine_speed.py --update           # the same, into the tracked JSON the README's table reads
    python benchmarks/engine_speed.py --cases fixed cpu-fixed --out /tmp/engine_speed.json
    python benchmarks/engine_speed.py --requests 100000 --policy none   # one run of your own; prints only
    python benchmarks/engine_speed.py --config tests/baselines/scenarios/cpu.toml --policy goodput

Each case is a continuous-batching run at a rate that keeps the batch busy (80% of the
saturation rate, probed first). Prints the best of --repeats runs (the machine's noise
only ever slows a run down). The default case's workload, at the same rate, then runs
under the vllm-v1 scheduler (chunked prefill in mixed steps, paged KV; docs/scheduling.md)
and its steps/s are printed on a last line (``--no-v1`` skips it).

Without scenario flags (--config, --policy, --k, --profile, --replicas, --rate) it
measures the cases in ``CASES`` and writes their JSON to a scratch folder
(runs/benchmarks/engine_speed.json, ignored by git); ``--update`` writes
``benchmarks/results/engine_speed.json`` instead, from which docs/generate.py's
``engine-speed`` block renders the README's Speed table, so a trial run never changes the
tracked figures. With scenario flags it measures that one scenario and writes JSON only
where --out says.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "engine_speed.json"  # tracked: written with --update
SCRATCH = ROOT / "runs" / "benchmarks" / "engine_speed.json"    # otherwise
CPU_SCENARIO = "tests/baselines/scenarios/cpu.toml"


@dataclass(frozen=True)
class Case:
    """One row of the README's table: a scenario (config file or the default) and a policy."""

    label: str
    config: str | None = None
    policy: str = "fixed"
    k: int | None = 3
    profile: str | None = None
    replicas: int = 1
    rate: float | None = None
    v1: bool = False  # also run it under the vllm-v1 scheduler

    @property
    def policy_label(self) -> str:
        return f"`{self.policy} --k {self.k}`" if self.policy == "fixed" else f"`{self.policy}`"


CASES = {
    "fixed": Case("default (H100 profile, chat traffic)", v1=True),
    "goodput": Case("default", policy="goodput", k=None),
    "replicas": Case("default, `--replicas 4` (round-robin, 4× the rate)", replicas=4),
    "cpu-fixed": Case(f"CPU profile (`--config {CPU_SCENARIO}`)", config=CPU_SCENARIO),
    "cpu-goodput": Case("CPU profile", config=CPU_SCENARIO, policy="goodput", k=None),
}


COMPILED_POLICIES = ("fixed", "none", "lut", "goodput")  # decode runs compile (engine.jit; sim/serving/compiled.py)


def flags_of(case: Case, requests: int, max_batch_size: int) -> dict:
    flags = {"workload.num_requests": (requests, "--requests"), "policy.name": (case.policy, "--policy"),
             "engine.max_batch_size": (max_batch_size, "--max-batch-size"), "seed": (0, "--seed"),
             "cluster.replicas": (case.replicas, "--replicas")}
    if case.policy == "fixed":
        flags["policy.k"] = (case.k, "--k")
    if case.profile:
        flags["profile"] = (case.profile, "--profile")
    if case.rate is not None:
        flags["workload.rate"] = (case.rate, "--rate")
    return flags


def configure(case: Case, requests: int, max_batch_size: int):
    """The case's config; without a rate, one that loads the server: 80% of a saturated probe's throughput."""
    from sim.config import load_config
    from sim.simulate import execute, prepare

    flags = flags_of(case, requests, max_batch_size)
    if case.rate is not None:
        return load_config(case.config, flags)
    probe = execute(prepare(load_config(case.config, {**flags, "workload.num_requests": (200, "--requests"),
                                                      "workload.rate": (1e6, "--rate"),
                                                      "cluster.replicas": (1, "--replicas")})))
    rate = 0.8 * probe.summary["request_throughput"] * case.replicas
    return load_config(case.config, {**flags, "workload.rate": (rate, "--rate")})


def fastest(config, repeats: int):
    """The best of ``repeats`` runs: the machine's noise only ever slows a run down."""
    from sim.simulate import execute, prepare

    best = None
    for _ in range(repeats):
        result = execute(prepare(config))
        if best is None or result.wall_s < best.wall_s:
            best = result
    return best


def measure(name: str, case: Case, args) -> dict:
    """Run one case (and its vllm-v1 twin), print what the README quotes, return its row."""
    config = configure(case, args.requests, args.max_batch_size)
    best = fastest(config, args.repeats)
    s = best.summary
    steps = int(s["num_steps"])
    row = {"case": name, "label": case.label, "policy": case.policy_label, "config": case.config,
           "replicas": case.replicas, "requests": args.requests, "rate": config.workload.rate,
           "profile": best.profile.name, "steps": steps, "decode_steps": int(s["num_decode_steps"]),
           "prefill_steps": int(s["num_prefill_steps"]), "mean_batch": float(s["mean_batch_size"]),
           "engine_s": best.engine_wall_s, "whole_s": best.wall_s,
           "engine_steps_per_s": steps / best.engine_wall_s, "whole_steps_per_s": steps / best.wall_s,
           "requests_per_s": args.requests / best.wall_s}
    print(f"case           {name}: {case.label}")
    print(f"profile        {row['profile']}")
    print(f"workload       {args.requests} requests at {row['rate']:.3g} req/s, policy {case.policy}"
          f"{f' k={case.k}' if case.policy == 'fixed' else ''}, continuous batching (max {args.max_batch_size}), "
          f"mean batch {row['mean_batch']:.1f}" + (f", {case.replicas} replicas" if case.replicas > 1 else ""))
    print(f"engine steps   {steps} ({row['decode_steps']} decode, {row['prefill_steps']} prefill)")
    print(f"engine loop    {row['engine_s']:.3f} s  -> {row['engine_steps_per_s']:,.0f} engine steps/s")
    print(f"whole run      {row['whole_s']:.3f} s  -> {row['whole_steps_per_s']:,.0f} steps/s, "
          f"{row['requests_per_s']:,.0f} simulated requests/s (tabulation, engine and metrics)", flush=True)
    if case.policy in COMPILED_POLICIES:  # the same run with its decode runs compiled (sim/serving/compiled.py)
        compiled_config = replace(config, engine=replace(config.engine, jit="on"))
        compiled = fastest(compiled_config, args.repeats + 1)  # the extra run loads (or compiles) the kernel
        row["compiled"] = {"engine_s": compiled.engine_wall_s, "whole_s": compiled.wall_s,
                           "engine_steps_per_s": steps / compiled.engine_wall_s,
                           "whole_steps_per_s": steps / compiled.wall_s,
                           "identical": compiled.summary == s}
        rc = row["compiled"]
        print(f"compiled       --jit on: engine loop {rc['engine_s']:.3f} s -> {rc['engine_steps_per_s']:,.0f} engine "
              f"steps/s, whole run {rc['whole_steps_per_s']:,.0f} steps/s; summary identical: {rc['identical']}",
              flush=True)
    if case.v1 and not args.no_v1:
        v1 = fastest(replace(config, engine=replace(config.engine, scheduler="vllm-v1")), args.repeats)
        s1 = v1.summary
        row["v1"] = {"steps": int(s1["num_steps"]), "mixed_steps": int(s1["num_mixed_steps"]),
                     "preemptions": int(s1["num_preemptions"]),
                     "max_num_batched_tokens": config.engine.max_num_batched_tokens,
                     "engine_s": v1.engine_wall_s, "whole_s": v1.wall_s,
                     "engine_steps_per_s": s1["num_steps"] / v1.engine_wall_s,
                     "whole_steps_per_s": s1["num_steps"] / v1.wall_s,
                     "requests_per_s": args.requests / v1.wall_s}
        r1 = row["v1"]
        print(f"vllm-v1        {r1['steps']} steps ({r1['mixed_steps']} mixed, {r1['preemptions']} preemptions), "
              f"max {r1['max_num_batched_tokens']} tokens/step: engine loop {r1['engine_steps_per_s']:,.0f} steps/s, "
              f"whole run {r1['whole_steps_per_s']:,.0f} steps/s, {r1['requests_per_s']:,.0f} simulated requests/s",
              flush=True)
    row["load_average"] = os.getloadavg()[0]  # other work on the machine slows every figure
    return row


def rounded(x: float) -> str:
    """Three significant figures: the machine's noise is larger than the rest."""
    return f"{float(f'{x:.3g}'):,.0f}"


def table(doc: dict) -> str:
    """The README's Speed table and the vllm-v1 sentence (docs/generate.py's ``engine-speed`` block)."""
    rows = ["| scenario | policy | engine steps | engine loop | compiled (`--jit on`) | whole run (tabulation, "
            "engine, metrics) |", "|---|---|---:|---:|---:|---|"]
    for r in sorted(doc["rows"], key=lambda r: list(CASES).index(r["case"])):
        bold = "**" if r["case"] == "fixed" else ""
        compiled = (f"{bold}{rounded(r['compiled']['engine_steps_per_s'])} steps/s{bold}" if "compiled" in r
                    else "step by step")
        rows.append(f"| {r['label']} | {r['policy']} | {r['steps']:,} | {rounded(r['engine_steps_per_s'])} "
                    f"steps/s | {compiled} | {rounded(r['whole_steps_per_s'])} steps/s, "
                    f"{rounded(r['requests_per_s'])} simulated requests/s |")
    rows.append("")
    v0 = next((r for r in doc["rows"] if "v1" in r), None)
    if v0:
        v1 = v0["v1"]
        which = "the first row's" if v0["case"] == "fixed" else f"the {v0['case']} case's"
        rows.append(f"Under `--scheduler vllm-v1` {which} workload at the same rate needed {v1['steps']:,} steps "
                    f"({v1['mixed_steps']:,} mixed) and ran {rounded(v1['engine_steps_per_s'])} engine steps/s "
                    f"against the v0 scheduler's {rounded(v0['engine_steps_per_s'])}: "
                    f"{v1['engine_steps_per_s'] / v0['engine_steps_per_s']:.2f}× (whole run "
                    f"{rounded(v1['whole_steps_per_s'])} against {rounded(v0['whole_steps_per_s'])} steps/s).")
    machine = doc["machine"]
    low, high = (f"{f(r['load_average'] for r in doc['rows']):.1f}" for f in (min, max))
    rows.append(f"Measured {doc['date']} with `{doc['command']}` ({doc['requests']:,} requests, max batch "
                f"{doc['max_batch_size']}, best of {doc['repeats']}) on {machine['cpu']} ({machine['cores']} cores), "
                f"Python {machine['python']}, numpy {machine['numpy']}, with a 1-minute load average of "
                f"{low if low == high else f'{low}–{high}'} during the runs.")
    return "\n".join(rows) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-v1", action="store_true", help="skip the vllm-v1 scheduler's run")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=None,
                        help="measure only these of the README's cases (default: all)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"results JSON (default {SCRATCH.relative_to(ROOT)} for the README's cases, "
                             "none for a scenario of your own)")
    parser.add_argument("--update", action="store_true",
                        help=f"write the README's cases to the tracked {RESULTS.relative_to(ROOT)} (then run "
                             "python docs/generate.py)")
    own = parser.add_argument_group("a scenario of your own (measures it alone)")
    own.add_argument("--config", default=None, help="scenario TOML under the flags (default: the shipped default)")
    own.add_argument("--policy", default=None, help="default: fixed")
    own.add_argument("--k", type=int, default=None, help="default: 3")
    own.add_argument("--profile", default=None, help="default: the scenario's profile")
    own.add_argument("--replicas", type=int, default=None,
                     help="a cluster of N replicas (round-robin), at N times the rate")
    own.add_argument("--rate", type=float, default=None,
                     help="request rate (default: 80%% of the saturation rate on the profile)")
    args = parser.parse_args()

    custom = any(getattr(args, name) is not None for name in ("config", "policy", "k", "profile", "replicas", "rate"))
    if custom and args.cases:
        parser.error("--cases measures the README's cases; it does not combine with a scenario of your own")
    if args.update and (custom or args.out is not None):
        parser.error("--update writes the README's cases to the tracked results; it takes no --out or scenario")
    if custom:
        cases = {"custom": Case("custom", config=args.config, policy=args.policy or "fixed", k=args.k or 3,
                                profile=args.profile, replicas=args.replicas or 1, rate=args.rate, v1=True)}
        out = args.out
    else:
        cases = {name: CASES[name] for name in (args.cases or CASES)}
        out = RESULTS if args.update else args.out or SCRATCH
    sys.path.insert(0, str(Path(__file__).parent))
    from scale import machine  # one description of the machine for both benchmarks

    import numpy as np

    about = machine()
    print(f"machine        {about['cpu']}, {about['cores']} cores, Python {about['python']}, numpy {np.__version__}")
    rows = []
    for name, case in cases.items():
        rows.append(measure(name, case, args))
        print()
    if out is not None:
        command = shlex.join(["python", "benchmarks/engine_speed.py", *sys.argv[1:]])
        doc = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "machine": about, "command": command,
               "requests": args.requests, "max_batch_size": args.max_batch_size, "repeats": args.repeats,
               "rows": rows}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
