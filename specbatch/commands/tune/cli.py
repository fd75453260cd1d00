"""``specbatch tune``: the command line (registered in specbatch.commands.cli.COMMANDS).

The scenario is given as ``specbatch run`` takes it (``--config`` and the run flags: profile,
traffic as a rate, a rate profile or a trace, lengths, engine, acceptance, ``--goodput``
SLOs); its policy is what the tune chooses, so the policy flags are not taken.
"""

from __future__ import annotations

import argparse
import sys

from specbatch.commands.tune import DEFAULT_BANDS, DEFAULT_K_MAX, DEFAULT_SEEDS
from specbatch.commands.tune.objective import DEFAULT, GOODPUT
from specbatch.commands.tune.space import FORMATS


def scenario_flags() -> list[str]:
    """The run flags that describe the scenario: all but the policy's and the run folder's (--goodput stays:
    it sets the SLOs of the goodput objective)."""
    from specbatch.commands.flags import RUN_FLAGS

    return [flag for flag, (key, _, _) in RUN_FLAGS.items()
            if not key.startswith("policy.") and (not key.startswith("output.") or key == "output.goodput")]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from specbatch.commands.flags import add_run_flags, typed

    parser.add_argument("--config", help="scenario TOML (its [policy] is replaced by the tune's candidates); "
                        "the flags below override it")
    add_run_flags(parser, scenario_flags(), helps={
        "--seed": "first seed: the search uses SEED.., the held-out check the next ones (default 0)"})
    parser.add_argument("--objective", default=DEFAULT,
                        help=f"what to optimise, named as in summary.json: mean_/median_/p90_/p99_ of ttft, tpot, "
                             f"itl or e2el (_ms), minimised; or {GOODPUT}, maximised, with --goodput "
                             f"(default {DEFAULT})")
    parser.add_argument("--bands", default=str(DEFAULT_BANDS),
                        help=f"batch-size bands: a count, cut geometrically over 1..max batch size (default "
                             f"{DEFAULT_BANDS}), or upper edges such as 4,16,64,256")
    parser.add_argument("--context-bands", default=None, metavar="EDGES",
                        help="also one k per context band: upper edges in tokens, e.g. 1024,4096 (the schedule "
                             "is then a context table: --format lut)")
    parser.add_argument("--k-max", type=typed("--k-max", int), default=None,
                        help=f"largest k to try (default {DEFAULT_K_MAX}, or the profile's k_max if smaller)")
    parser.add_argument("--seeds", type=typed("--seeds", int), default=DEFAULT_SEEDS,
                        help=f"seeds each candidate is judged on (default {DEFAULT_SEEDS})")
    parser.add_argument("--holdout-seeds", type=typed("--holdout-seeds", int), default=DEFAULT_SEEDS,
                        help=f"further seeds, unseen by the search, for the comparison (default {DEFAULT_SEEDS})")
    parser.add_argument("--format", choices=FORMATS, default="lut",
                        help="how to print the schedule: a lut [policy] table, vLLM's speculative_config JSON, "
                             "SGLang's adaptive config (the search then keeps k >= 1) or TensorRT-LLM's "
                             "draft_len_schedule; the folder has them all (default lut)")
    parser.add_argument("--executor", choices=("pool", "serial"), default=None,
                        help="pool: a local process pool (the default); serial: in this process")
    parser.add_argument("--workers", type=typed("--workers", int), default=None,
                        help="processes of the pool or of --dask local (default: all cores)")
    parser.add_argument("--dask", metavar="ADDRESS", default=None,
                        help="run on a Dask distributed scheduler at ADDRESS, or 'local' for a LocalCluster")
    parser.add_argument("--out", default=None,
                        help="output folder (default runs/tune-<hash of the inputs>); rerunning resumes there")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar and lines")


def main(args: argparse.Namespace) -> int:
    from sim.atomic_write import check_output, output_lock
    from specbatch.commands.flags import run_overrides
    from specbatch.commands.tune.plan import plan_tune
    from specbatch.commands.tune.report import check_out_dir
    from sim.errors import InputError

    if args.dask is not None and args.executor is not None:
        raise InputError("give either --executor or --dask, not both", source="--dask")
    if args.out:
        check_out_dir(args.out)
        check_output(args.out, folder=True, field="out", source=f"--out {args.out}")
    plan = plan_tune(args.config, run_overrides(args, scenario_flags()), objective=args.objective, bands=args.bands,
                     contexts=args.context_bands, k_max=args.k_max, seeds=args.seeds, holdout=args.holdout_seeds,
                     fmt=args.format, executor="dask" if args.dask is not None else (args.executor or "pool"),
                     workers=args.workers, dask_address=args.dask)
    out = check_out_dir(args.out or plan.default_out())
    source = f"--out {out}" if args.out else None
    check_output(out, folder=True, field="out", source=source)
    try:
        with output_lock(out, field="out", source=source):
            result = plan.run_into(out, progress=not args.no_progress)
    except KeyboardInterrupt:
        print(f"interrupted: the runs finished so far are in {out / 'cells'}; the same command resumes",
              file=sys.stderr)
        return 130
    from specbatch.commands.cli import nothing_left_to_do
    from specbatch.commands.figures import have_matplotlib

    if args.dask is None:  # (with --dask, Dask's own exit handlers are left to run)
        nothing_left_to_do()
    print(result.text())
    figure = "" if have_matplotlib() else "; no figure: matplotlib is not installed, pip install 'specbatch[report]'"
    print(f"{result.ran} runs now, {result.stored} from the store; the tune took {result.wall_s:.1f} s. "
          f"Wrote {out}/ (report.html, report.md, tune.json, schedule files, trials.csv{figure})")
    return 0
