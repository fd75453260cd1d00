"""``python -m calibrate``: time a model pair on this machine and write a profile.

The parser is self-contained so ``specbatch calibrate`` can delegate with
``calibrate.cli.main(argv)``. Bad input is one ``error: ...`` line on stderr and exit
code 2 with nothing written; torch is imported only once the input has been checked.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from calibrate.configs import DTYPE_BYTES, check_buildable, describe, get_config, known_models
from calibrate.grid import DRAFTERS, default_grid, drafter_list
from sim.errors import InputError
from sim.costmodel.profile import REQUIRED_PHASES
from workloads.numbers import NotFinite, read_number

EXIT_INPUT = 2
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, so errors stay one line; a flag
    is taken only as spelled in full (no abbreviations)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise InputError(message)


def int_list(text: str) -> list[int]:
    """A comma-separated list of integers (a grid axis), for argparse."""
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def finite(text: str) -> float:
    """A number flag's text, read as every number is (workloads.numbers: no NaN, no infinity)."""
    try:
        return read_number(text)
    except NotFinite as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a valid float") from None


def add_grid_axes(group) -> None:
    """The grid's axes, named alike wherever a grid is chosen (calibrate, compose)."""
    group.add_argument("--batch-sizes", type=int_list, metavar="LIST", help="e.g. 1,2,4,8")
    q = group.add_mutually_exclusive_group()
    q.add_argument("--query-tokens", type=int_list, metavar="LIST", help="target decode q values, e.g. 1,2,3,4")
    q.add_argument("--k-max", type=int, metavar="K", help="largest speculation length: q = 1..K+1")
    group.add_argument("--contexts", type=int_list, metavar="LIST", help="KV-cache lengths for decode points")
    group.add_argument("--prompts", type=int_list, metavar="LIST", help="prompt lengths for prefill points")


def build_parser(prog: str = "python -m calibrate") -> argparse.ArgumentParser:
    p = _Parser(prog=prog, description="Time draft/target forward passes and the verification kernel on this "
                "machine and write a specbatch profile (CSV + JSON).")
    p.add_argument("--target", default="tinyllama-1.1b",
                   help="target model: a built-in name, a Hugging Face config.json (or its folder) or a Hugging "
                        "Face id in the local cache (default: %(default)s)")
    p.add_argument("--draft", default="llama-68m", help="draft model, as --target (default: %(default)s)")
    p.add_argument("--list-models", action="store_true",
                   help="print the built-in model names and shapes (and the Hugging Face ids with a shipped config), then exit")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if available, else cpu")
    p.add_argument("--out", type=Path, help="output directory for the profile (required)")
    p.add_argument("--dtype", default="auto", choices=("auto", *DTYPE_BYTES),
                   help="auto: bfloat16 (or float16) on CUDA, float32 on CPU")
    p.add_argument("--drafters", type=drafter_list, default=None, metavar="LIST",
                   help=f"drafters to time besides the draft model ({', '.join(DRAFTERS)}): heads built at the "
                        "target's width from their published structure, host proposers timed on the CPU "
                        "(docs/speculation-methods.md)")
    g = p.add_argument_group("grid (defaults depend on the device)")
    add_grid_axes(g)
    g.add_argument("--max-prefill-tokens", type=int, metavar="N", help="skip prefill points with batch*prompt > N")
    g.add_argument("--warmup", type=int, metavar="N", help="untimed passes per point")
    g.add_argument("--repeats", type=int, metavar="N", help="timed passes per point (at most)")
    g.add_argument("--point-budget", type=finite, metavar="SEC", dest="budget_s",
                   help="stop repeating a point once its samples add up to SEC seconds")
    r = p.add_argument_group("run")
    r.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's choice)")
    r.add_argument("--memory-fraction", type=finite, default=0.9,
                   help="fraction of free memory a point may use; larger points are skipped as oom (default 0.9)")
    r.add_argument("--no-cuda-graphs", action="store_true", help="time decode passes eagerly on CUDA")
    r.add_argument("--ragged-contexts", action="store_true",
                   help="time each decode point over rows whose contexts spread from a quarter to 1.75 times the "
                        "point's, as a served batch's rows differ, instead of every row at it (docs/calibration.md)")
    r.add_argument("--no-overhead", action="store_true",
                   help="skip measuring the engine's per-step overhead (a short real replay at the end)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--fresh", action="store_true", help="discard a partial run in --out instead of resuming it")
    r.add_argument("--quiet", action="store_true", help="no progress bar and no summary")
    return p


def main(argv: list[str] | None = None, *, prog: str = "python -m calibrate") -> int:
    """Run the calibration CLI; returns the exit code (0 ok, 1 unusable profile, 2 bad input, 130 Ctrl-C)."""
    try:
        args = build_parser(prog).parse_args(argv)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    if args.list_models:
        for name in known_models():
            print(describe(get_config(name)))
        from calibrate.hf_config import shipped_ids

        ids = shipped_ids()
        print("\nAny Hugging Face config.json (a path, its folder, or an id in the local Hugging Face cache) is "
              "read too" + (f"; aiconfigurator-core ships the configs of: {', '.join(ids)}" if ids else ""))
        return 0
    try:
        settings = _settings(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    return _run(settings, args)


def _settings(args: argparse.Namespace) -> Any:
    """Check every input before anything is imported, allocated or written."""
    if args.out is None:
        raise InputError("the --out directory is required", field="out")
    if args.out.exists() and not args.out.is_dir():
        raise InputError(f"'{args.out}' exists and is not a directory", field="out")
    target, draft = get_config(args.target, "target"), get_config(args.draft, "draft")
    check_buildable(target, "target")
    check_buildable(draft, "draft")
    if not 0 < args.memory_fraction <= 1:
        raise InputError("must lie in (0, 1]", field="memory_fraction")
    if args.threads is not None and args.threads < 1:
        raise InputError("must be at least 1", field="threads")
    if args.k_max is not None and args.k_max < 0:
        raise InputError("must be at least 0", field="k_max")
    try:
        import torch
    except ImportError:
        raise InputError("calibration needs torch: pip install torch (CPU or CUDA build)", field="device") from None
    from calibrate.runner import Settings, resolve_dtype

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("CUDA is not available to this torch build or machine", field="device")
    max_len = min(target.max_position_embeddings, draft.max_position_embeddings)
    grid = default_grid(device, max_len, batch_sizes=args.batch_sizes, query_tokens=args.query_tokens,
                        k_max=args.k_max, contexts=args.contexts, prompts=args.prompts,
                        max_prefill_tokens=args.max_prefill_tokens, warmup=args.warmup, repeats=args.repeats,
                        budget_s=args.budget_s)
    return Settings(target=args.target, draft=args.draft, device=device, dtype=resolve_dtype(args.dtype, device),
                    grid=grid, seed=args.seed, threads=args.threads, memory_fraction=args.memory_fraction,
                    cuda_graphs=not args.no_cuda_graphs, measure_overhead=not args.no_overhead,
                    drafters=tuple(args.drafters or ()), ragged_contexts=args.ragged_contexts)


def _run(settings: Any, args: argparse.Namespace) -> int:
    from calibrate.partial import PARTIAL_CSV
    from calibrate.runner import run_calibration

    try:
        result = run_calibration(settings, args.out, fresh=args.fresh, progress=not args.quiet)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print(f"\ninterrupted: finished points are kept in {args.out / PARTIAL_CSV}; run the same command "
              f"again to resume (or add --fresh to start over)", file=sys.stderr)
        return EXIT_INTERRUPTED
    if not args.quiet:
        print(summary(result))
    ok = result.table[result.table.status == "ok"]
    missing = [f"{p}/{m}" for p, m in REQUIRED_PHASES if not ((ok.phase == p) & (ok.model == m)).any()]
    if missing:
        print(f"warning: the profile has no measured {', '.join(missing)} points, so the simulator cannot use "
              f"it; profile.json lists why each point was skipped", file=sys.stderr)
        return 1
    return 0


def summary(result: Any) -> str:
    """Points per phase and status, where the profile went, how long it took."""
    table = result.table
    lines = [f"{'phase':<8} {'model':<7} {'measured':>8} {'oom':>5} {'error':>5}"]
    for phase in ("prefill", "decode", "verify", "propose"):
        for model in ("target", "draft", *DRAFTERS):
            rows = table[(table.phase == phase) & (table.model == model)]
            if len(rows):
                n = rows.status.value_counts()
                lines.append(f"{phase:<8} {model:<7} {n.get('ok', 0):>8} {n.get('oom', 0):>5} {n.get('error', 0):>5}")
    minutes, seconds = divmod(result.elapsed_s, 60)
    lines.append("")
    if result.resumed:
        lines.append(f"resumed {result.resumed} points from an interrupted run; measured {result.measured} now")
    lines.append(f"profile written to {result.out} (profile.csv, profile.json) in {int(minutes)}m {seconds:04.1f}s")
    return "\n".join(lines)
