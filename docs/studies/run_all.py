"""Regenerate every study: figures, result tables and headline numbers.

    python docs/studies/run_all.py                                  # the shipped CPU profile
    python docs/studies/run_all.py --profile h100-opt --out /tmp/h100-studies

Each study is a module here with ``run(profile, out_dir) -> dict``; each derives its
grid (batch sizes, k range, contexts, request rates) from the profile, so the same
command runs unchanged on a GPU profile. Headline numbers are printed and written to
``headlines.json`` in the output folder.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STUDIES = ("optimal_k", "traffic", "rates", "long_context", "scheduling", "tune")  # the order of the issues
# Studies of replicas of several GPUs (issues 28, 37): each runs on its own shipped or composed multi-GPU
# profiles, so they run with the default profile's studies (or by name with --only), never on another --profile.
MULTI_GPU = ("smartspec_70b", "draft_1b_70b", "tp_vs_replicas", "disaggregation")


def main(argv: list[str] | None = None) -> int:
    from sim.costmodel.profile import DEFAULT_PROFILE

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--profile", default=DEFAULT_PROFILE, help="profile name or directory")
    parser.add_argument("--out", type=Path, default=HERE / "figures", help="folder for figures and tables")
    parser.add_argument("--only", choices=STUDIES + MULTI_GPU, action="append", help="run just these studies")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    args.out.mkdir(parents=True, exist_ok=True)
    headlines = {}
    for name in args.only or STUDIES + (MULTI_GPU if args.profile == DEFAULT_PROFILE else ()):
        started = time.perf_counter()
        print(f"[{name}] running on {args.profile} ...", flush=True)
        headlines[name] = importlib.import_module(name).run(args.profile, args.out)
        print(f"[{name}] done in {time.perf_counter() - started:.0f} s: {headlines[name]}", flush=True)
    path = args.out / "headlines.json"  # one study run alone updates its own entry
    previous = json.loads(path.read_text()) if args.only and path.is_file() else {}
    path.write_text(json.dumps({**previous, **headlines}, indent=2, sort_keys=True, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
