"""The engine's time per step outside its passes, measured by calibration's overhead replay at several
batch sizes (docs/validation.md): does it grow with the rows, and by how much?

    python benchmarks/overhead_by_batch.py measure --profile PROFILE [--batches 1,2,4,8,16] [--k 3] --out FILE
    python benchmarks/overhead_by_batch.py table FILE

``measure`` runs :func:`calibrate.overhead.measure_overhead` once a batch size on the profile's device and
models (a GPU profile needs that GPU; the simulator's dependencies too) and writes every record to FILE;
``table`` prints them, with a least-squares line a + b x rows through the decode overheads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def measure(profile: str, batches: list[int], k: int, out: Path) -> dict:
    from calibrate.overhead import measure_overhead
    from sim.atomic_write import write_file

    doc = {"profile": profile, "k": k, "records": []}
    for b in batches:
        record = measure_overhead(profile, batch=b, k=k)
        doc["records"].append(record)
        print(f"batch {b}: decode {1e3 * record['decode_overhead_s']:.3f} ms, prefill "
              f"{1e3 * record['prefill_overhead_s']:.3f} ms ({record['steps']} steps)", flush=True)
        write_file(out, json.dumps(doc, indent=1) + "\n")  # what finished survives a stopped machine
    return doc


def table(doc: dict) -> str:
    records = doc["records"]
    lines = [f"engine overhead per step by batch size (overhead replays of 3 x batch requests, k = {doc['k']}; "
             f"{Path(doc['profile']).name})",
             f"{'batch':>6}{'steps':>7}{'decode ms':>11}{'of which between steps':>24}{'prefill ms':>12}"]
    for r in records:
        lines.append(f"{r['batch_size']:>6}{r['steps']:>7}{1e3 * r['decode_overhead_s']:>11.3f}"
                     f"{1e3 * r.get('decode_between_steps_s', float('nan')):>24.3f}{1e3 * r['prefill_overhead_s']:>12.3f}")
    if len(records) >= 2:
        rows = np.array([r["batch_size"] for r in records], dtype=float)
        decode = np.array([r["decode_overhead_s"] for r in records]) * 1e3
        slope, intercept = np.polyfit(rows, decode, 1)
        lines.append(f"decode overhead ~ {intercept:.3f} ms + {slope:.4f} ms x rows (least squares)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="run the overhead replays (the profile's device)")
    m.add_argument("--profile", required=True)
    m.add_argument("--batches", default="1,2,4,8,16", help="comma-separated batch sizes (default %(default)s)")
    m.add_argument("--k", type=int, default=3, help="the fixed k of every replay (default %(default)s)")
    m.add_argument("--out", type=Path, required=True)
    t = sub.add_parser("table", help="print a measured file")
    t.add_argument("file", type=Path)
    args = parser.parse_args(argv)
    if args.command == "measure":
        try:
            batches = [int(b) for b in args.batches.split(",")]
        except ValueError:
            print(f"overhead_by_batch: --batches {args.batches!r} is not comma-separated integers", file=sys.stderr)
            return 2
        doc = measure(args.profile, batches, args.k, args.out)
    else:
        if not args.file.is_file():
            print(f"overhead_by_batch: no file {args.file}", file=sys.stderr)
            return 2
        doc = json.loads(args.file.read_text())
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
