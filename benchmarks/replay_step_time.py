"""Where a GPU validation's decode steps spend their time: passes against their price, and the
engine's time outside the passes against the profile's overhead, by batch size (docs/validation.md).

    python benchmarks/replay_step_time.py --from RECORDS --profile PROFILE

RECORDS holds one folder per case, each with the ``step_costs.csv`` that ``specbatch validate``
writes (per step: the profile's price of its passes plus the engine overhead, and the measured
step and passes); PROFILE is the profile the cases were priced by. The first table is per case:
the decode steps' passes measured against their price (the replay's speed), and the time a step
spends outside its passes (from its start to the loop's next clock reading, less its passes),
median and mean, beside what the profile charges for it. The second splits that time by the
steps' batch size, where an overhead that grows with the batch shows. Where a case's
``validation.json`` records its first replay's passes by kind (replays since 2026-11-28), a third
gives each kind's mean time between its events and in its graph's replay alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BATCH_BUCKETS = ((1, 4), (5, 8), (9, 12), (13, 16))


def decode_steps(case: Path) -> pd.DataFrame:
    steps = pd.read_csv(case / "step_costs.csv")
    return steps[steps.group.str.startswith("decode")]


def outside_ms(steps: pd.DataFrame) -> pd.Series:
    return (steps.measured_s - steps.measured_passes_s) * 1e3


def tables(records: Path, overhead_at, profile_name: str) -> str:
    """``overhead_at(rows)``: the engine overhead the profile charges a decode step of that many rows."""
    cases = sorted(p for p in records.iterdir() if (p / "step_costs.csv").is_file())
    if not cases:
        raise SystemExit(f"replay_step_time: no case folder with step_costs.csv under {records}")
    width = max(len(c.name) for c in cases) + 2
    one, sixteen = (1e3 * float(overhead_at(rows)) for rows in (1, 16))
    charged = f"{one:.2f} ms" if one == sixteen else f"{one:.2f} (1 row) to {sixteen:.2f} ms (16 rows)"
    lines = [f"decode steps: passes measured / priced, and the time outside the passes (ms) against the "
             f"{charged} the profile charges ({profile_name})",
             f"{'case':<{width}}{'steps':>7}{'passes meas/priced':>20}{'outside median':>16}{'mean':>8}"
             f"{'13-16 rows':>12}"]
    for case in cases:
        steps = decode_steps(case)
        priced = steps.predicted_s.sum() - overhead_at(steps.batch_size.to_numpy()).sum()
        out = outside_ms(steps)
        lines.append(f"{case.name:<{width}}{len(steps):>7}{steps.measured_passes_s.sum() / priced:>20.3f}"
                     f"{out.median():>16.3f}{out.mean():>8.3f}{(steps.batch_size >= 13).mean():>12.0%}")
    lines += ["", "time outside the passes by the step's rows (ms, median; steps in brackets)",
              f"{'case':<{width}}" + "".join(f"{f'{lo}-{hi} rows':>16}" for lo, hi in BATCH_BUCKETS)]
    for case in cases:
        steps = decode_steps(case)
        out = outside_ms(steps)
        cells = ""
        for lo, hi in BATCH_BUCKETS:
            chosen = out[(steps.batch_size >= lo) & (steps.batch_size <= hi)]
            cell = f"{np.median(chosen):.3f} ({len(chosen)})" if len(chosen) else "-"
            cells += f"{cell:>16}"
        lines.append(f"{case.name:<{width}}{cells}")
    kinds = {case.name: passes_by_kind(case) for case in cases}
    if any(kinds.values()):
        lines += ["", "the first replay's passes by kind: ms a pass between its events / in its graph alone "
                      "(the rest: staging its inputs and reading its outputs)",
                  f"{'case':<{width}}" + "".join(f"{kind:>18}" for kind in KINDS)]
        for name, by_kind in kinds.items():
            cells = ""
            for kind in KINDS:
                v = by_kind.get(kind)
                cell = f"{1e3 * v['span_s'] / v['passes']:.3f} / {1e3 * v['graph_s'] / v['passes']:.3f}" if v else "-"
                cells += f"{cell:>18}"
            lines.append(f"{name:<{width}}{cells}")
    return "\n".join(lines)


KINDS = ("draft", "target", "verify", "prefill-draft", "prefill-target")


def passes_by_kind(case: Path) -> dict:
    """The first replay's passes by kind from the case's validation.json ({} where not recorded)."""
    path = case / "validation.json"
    if not path.is_file():
        return {}
    kinds = json.loads(path.read_text()).get("replay", {}).get("cuda_graphs", {}).get("passes_by_kind") or {}
    return {k: v for k, v in kinds.items() if v.get("passes")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--from", dest="records", type=Path, required=True,
                        help="a folder of case folders, each with step_costs.csv")
    parser.add_argument("--profile", required=True, help="the profile the cases were priced by (a name or a folder)")
    args = parser.parse_args(argv)
    from sim.costmodel.profile import load_profile
    from sim.errors import InputError

    try:
        profile = load_profile(args.profile)
    except InputError as exc:
        print(f"replay_step_time: {exc}", file=sys.stderr)
        return 2
    if not args.records.is_dir():
        print(f"replay_step_time: no records folder {args.records}", file=sys.stderr)
        return 2
    print(tables(args.records, profile.decode_overhead_at, Path(args.profile).name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
