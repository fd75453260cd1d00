"""The ``specbatch`` command line.

``specbatch run`` simulates; ``specbatch calibrate`` times real torch passes (it
hands over to ``calibrate.cli``, imported only then, so the simulator never needs
torch); ``specbatch profiles`` lists and describes profiles.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from sim.errors import InputError

# run flag -> (config key, type); every run option can also come from the TOML file.
RUN_FLAGS: dict[str, tuple[str, type, str]] = {
    "--profile": ("profile", str, "profile directory or shipped profile name"),
    "--policy": ("policy.name", str, "speculation-length policy: none, fixed, or module:Class"),
    "--k": ("policy.k", int, "speculation length for --policy fixed"),
    "--rate": ("workload.rate", float, "mean request rate (req/s)"),
    "--duration": ("workload.duration_s", float, "generate arrivals for this many seconds"),
    "--num-requests": ("workload.num_requests", int, "generate exactly this many requests instead"),
    "--arrival": ("workload.arrival", str, "arrival process: poisson or gamma"),
    "--burstiness": ("workload.burstiness", float, "gamma shape (vLLM's burstiness; 1 = Poisson)"),
    "--prompt-tokens": ("workload.prompt_tokens", str, "N, uniform:LOW:HIGH or lognormal:MEAN:SIGMA[:MAX]"),
    "--output-tokens": ("workload.output_tokens", str, "N, uniform:LOW:HIGH or lognormal:MEAN:SIGMA[:MAX]"),
    "--trace": ("workload.trace", str, "replay a CSV trace (arrival_s, prompt_tokens, output_tokens)"),
    "--batching": ("engine.batching", str, "continuous or static"),
    "--max-batch-size": ("engine.max_batch_size", int, "most sequences in a batch"),
    "--kv-cache-tokens": ("engine.kv_cache_tokens", int, "KV-cache budget in tokens (default: the profile's)"),
    "--alpha": ("acceptance.alpha", float, "per-token acceptance rate in (0, 1)"),
    "--alpha-distribution": ("acceptance.distribution", str, "fixed, or beta for per-request alpha"),
    "--alpha-concentration": ("acceptance.concentration", float, "Beta concentration (alpha*c, (1-alpha)*c)"),
    "--seed": ("seed", int, "random seed; same config and seed give the same bytes"),
    "--out": ("output.dir", str, "output folder (default runs/<config hash>)"),
    "--records": ("output.records", str, "per-request and per-step records: csv, parquet or none"),
}


class _Parser(argparse.ArgumentParser):
    """argparse, but bad flags end as one line and exit code 2 like every other bad input."""

    def error(self, message: str):  # noqa: D401
        self.exit(2, f"error: {self.prog}: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="specbatch", description="Simulate LLM serving with speculative decoding.")
    parser.add_argument("--version", action="version", version=f"specbatch {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    run = sub.add_parser("run", help="simulate serving a workload (no flags: the shipped default scenario)")
    run.add_argument("--config", help="TOML scenario file; flags override its values")
    for flag, (key, kind, text) in RUN_FLAGS.items():
        run.add_argument(flag, dest=key, type=_typed(flag, kind), default=None, help=text)
    run.add_argument("--quiet", action="store_true", help="print only the output folder")
    sub.add_parser("calibrate", help="time real draft/target passes and write a profile (needs torch)",
                   add_help=False)
    profiles = sub.add_parser("profiles", help="list shipped profiles, or describe one")
    profiles.add_argument("profile", nargs="?", help="profile name or directory to describe")
    return parser


def _typed(flag: str, kind: type):
    def convert(text: str):
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a valid {kind.__name__}") from None
    convert.__name__ = kind.__name__
    return convert


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "calibrate":
        try:
            from calibrate.cli import main as calibrate_main
        except ImportError as exc:
            print(f"error: specbatch calibrate needs torch ({exc}); pip install 'specbatch[calibrate]'",
                  file=sys.stderr)
            return 2
        return calibrate_main(argv[1:], prog="specbatch calibrate")
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "profiles":
            return _profiles(args.profile)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    build_parser().print_help()
    return 0


def _run(args: argparse.Namespace) -> int:
    from sim.config import load_config
    from sim.outputs import default_output_dir, format_summary, write_run
    from sim.simulate import execute, prepare

    overrides = {key: (getattr(args, key), flag) for flag, (key, _, _) in RUN_FLAGS.items()}
    config = load_config(args.config, overrides)
    run = prepare(config)
    for warning in run.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    result = execute(run)
    out = write_run(result, config.output.dir or default_output_dir(config.digest()))
    if args.quiet:
        print(out)
        return 0
    print(format_summary(result))
    steps = result.summary["num_steps"]
    print(f"Simulated {len(result.requests)} requests, {steps} engine steps in {result.wall_s:.2f} s wall "
          f"({steps / max(result.wall_s, 1e-9):,.0f} steps/s, "
          f"{len(result.requests) / max(result.wall_s, 1e-9):,.0f} requests/s).")
    print(f"Wrote {out}/ (summary.json, config.toml"
          + ("" if config.output.records == "none" else f", requests.{config.output.records}, "
             f"steps.{config.output.records}") + ")")
    return 0


def _profiles(name: str | None) -> int:
    from sim.profile import DEFAULT_PROFILE, load_profile, shipped_profiles

    if name is None:
        for shipped in shipped_profiles():
            mark = " (default)" if shipped == DEFAULT_PROFILE else ""
            print(f"{shipped}{mark}")
        return 0
    profile = load_profile(name)
    meta = profile.meta
    device = meta.get("device", {})
    models = meta.get("models", {})
    print(f"profile      {profile.name}  ({profile.path})")
    print(f"device       {device.get('name', '?')} [{device.get('type', '?')}], dtype {meta.get('dtype')}")
    print(f"models       target {models.get('target', {}).get('name')}, draft {models.get('draft', {}).get('name')}")
    print(f"timing       {meta.get('timing', {}).get('method')}, created {meta.get('created_utc')}")
    print(f"k_max        {profile.k_max}    kv capacity {profile.kv_capacity_tokens} tokens")
    counts = profile.points.groupby(["phase", "model"]).size()
    for (phase, model), n in counts.items():
        rows = profile.phase(phase, model)
        print(f"  {phase:8} {model:7} {n:4} points  batch {rows.batch_size.min()}..{rows.batch_size.max()}"
              f"  q {rows.query_tokens.min()}..{rows.query_tokens.max()}"
              f"  ctx {rows.context_tokens.min()}..{rows.context_tokens.max()}")
    if len(profile.skipped):
        print(f"  skipped  {len(profile.skipped)} points (out of memory or failed)")
    return 0


def _version() -> str:
    import sim
    return sim.__version__


def entry_point() -> None:
    """Console script: like main(), but a closed pipe (``specbatch run | head``) ends quietly."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        code = 0
    sys.exit(code)


if __name__ == "__main__":
    entry_point()
