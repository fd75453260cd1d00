"""The engine's time per step outside its passes, measured by calibration's overhead replay at several
batch sizes (docs/validation.md): does it grow with the rows, and by how much?

    python benchmarks/overhead_by_batch.py measure --profile PROFILE [--batches 1,2,4,8,16] [--k 3] --out FILE
    python benchmarks/overhead_by_batch.py table FILE
    python benchmarks/overhead_by_batch.py profile FILE --profile PROFILE --out DIR

``measure`` runs :func:`calibrate.overhead.measure_overhead` once a batch size on the profile's device and
models (a GPU profile needs that GPU; the simulator's dependencies too) and writes every record to FILE;
``table`` prints them, with the least-squares line a + b x rows through the decode overheads (all of them,
and those at the batch sizes calibration replays at, :func:`calibrate.overhead.sweep_batches`); ``profile``
writes a copy of PROFILE to DIR whose engine overhead is that line, as calibration now measures it
(:func:`calibrate.overhead.overhead_record`): a profile calibrated before it, repriced as if after.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


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
    from calibrate.overhead import fit_per_row, sweep_batches

    records = doc["records"]
    lines = [f"engine overhead per step by batch size (overhead replays of 3 x batch requests, k = {doc['k']}; "
             f"{Path(doc['profile']).name})",
             f"{'batch':>6}{'steps':>7}{'decode ms':>11}{'of which between steps':>24}{'prefill ms':>12}"]
    for r in records:
        lines.append(f"{r['batch_size']:>6}{r['steps']:>7}{1e3 * r['decode_overhead_s']:>11.3f}"
                     f"{1e3 * r.get('decode_between_steps_s', float('nan')):>24.3f}{1e3 * r['prefill_overhead_s']:>12.3f}")
    sizes = [r["batch_size"] for r in records]
    for label, chosen in (("all", records), (f"calibration's {', '.join(map(str, sweep_batches(sizes)))}",
                                             [r for r in records if r["batch_size"] in sweep_batches(sizes)])):
        base, per_row = fit_per_row(chosen)
        lines.append(f"decode overhead ~ {1e3 * base:.3f} ms + {1e3 * per_row:.4f} ms x rows (least squares, {label})")
    return "\n".join(lines)


def refit_profile(doc: dict, profile: str, out: Path) -> Path:
    """A copy of ``profile`` in ``out`` whose engine overhead is fitted from ``doc``'s replays at the batch
    sizes calibration replays at for its grid."""
    import shutil

    from calibrate.overhead import overhead_record, sweep_batches
    from sim.costmodel.profile import load_profile, resolve_profile_path

    source = resolve_profile_path(profile)
    meta = load_profile(source).meta
    wanted = sweep_batches(meta.get("grid", {}).get("batch_sizes", [1]))
    records = [r for r in doc["records"] if r["batch_size"] in wanted]
    missing = sorted(set(wanted) - {r["batch_size"] for r in records})
    if missing:
        raise SystemExit(f"overhead_by_batch: the file has no replay at batch {', '.join(map(str, missing))}, "
                         f"which calibration replays at for {source.name}'s grid")
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(source, out)
    sidecar = out / "profile.json"
    meta = json.loads(sidecar.read_text())
    meta["engine_overhead"] = {**meta.get("engine_overhead", {}), **overhead_record(records)}
    sidecar.write_text(json.dumps(meta, indent=1) + "\n")
    return out


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
    r = sub.add_parser("profile", help="a copy of a profile with its engine overhead fitted from a measured file")
    r.add_argument("file", type=Path)
    r.add_argument("--profile", required=True)
    r.add_argument("--out", type=Path, required=True)
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
        if args.command == "profile":
            out = refit_profile(doc, args.profile, args.out)
            overhead = json.loads((out / "profile.json").read_text())["engine_overhead"]
            print(f"wrote {out}: decode overhead {1e3 * overhead['decode_overhead_s']:.3f} ms + "
                  f"{1e3 * overhead['decode_overhead_per_row_s']:.4f} ms x rows")
            return 0
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
