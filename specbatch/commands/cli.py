"""The ``specbatch`` command line.

``specbatch run`` simulates; ``specbatch calibrate`` times real torch passes (it
hands over to ``calibrate.cli``, imported only then, so the simulator never needs
torch); ``specbatch profiles`` lists and describes profiles; ``specbatch lut`` builds
the batch size -> k table of the ``lut`` policy from a profile.

Every command answers the same way (docs/errors.md): bad input is one line and exit 2,
before any work; Ctrl-C is one line and exit 130, with nothing half-written; an exception
from a user's policy is one line naming it (``--debug``, anywhere on the line, shows the
traceback of either).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import signal
import sys
import threading
import traceback
from typing import Sequence

from sim.errors import InputError

# Everything else is imported inside main()'s handlers, so that even a Ctrl-C while numpy and
# pandas load is the one-line exit 130, not a traceback through the import machinery.


# Commands that live in their own module: name -> (module, help). The module provides
# ``add_arguments(parser)`` and ``main(args) -> int`` (raising InputError for bad input);
# it is imported when the parser is built, so keep its top-level imports light.
COMMANDS: dict[str, tuple[str, str]] = {
    "regress": ("specbatch.commands.regress", "run a baseline's scenarios and fail on a metric regression (CI checks)"),
    "sweep": ("specbatch.commands.sweep.cli", "run a grid of scenarios (policy x rate x seed ...) into one table; resumable"),
    "capacity": ("specbatch.commands.capacity.cli", "highest request rate per replica within SLOs, per policy; replicas and cost"),
    "tune": ("specbatch.commands.tune.cli", "the speculation schedule (k per batch-size band) best for a traffic; engine configs"),
    "replay": ("specbatch.commands.replay_cli", "serve a scenario for real on its profile's device and models (needs torch)"),
    "validate": ("specbatch.commands.validation", "replay a scenario for real, simulate it, and print the simulator's error"),
    "compose": ("specbatch.commands.compose", "compose a GPU profile from published kernel microbenchmarks (gpu-data extra)"),
    "compare": ("specbatch.commands.compare", "a real `vllm bench serve` result against the simulation of its requests"),
    "fit": ("specbatch.commands.fit", "fit a profile's named overhead terms to per-request measurements (train/test errors)"),
}


class _Parser(argparse.ArgumentParser):
    """argparse, but bad flags end as one line and exit code 2 like every other bad input (a flag of
    vllm bench serve's that a simulation has no use for: a line saying what to give instead), a
    flag is taken only as spelled in full (``--num-req`` is not silently ``--num-requests``), and
    one setting named twice in two spellings (``--request-rate 12 --rate 5``) is refused, in every
    command that takes the run flags."""

    def __init__(self, *args, settings: bool = True, **kwargs) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)
        self.settings = settings  # False: a line without a command, which names no setting

    def parse_known_args(self, args=None, namespace=None):
        if self.settings:
            from specbatch.commands.flags import flag_names, one_name_per_setting

            one_name_per_setting(flag_names(sys.argv[1:] if args is None else args))
        return super().parse_known_args(args, namespace)

    def error(self, message: str):  # noqa: D401
        from specbatch.commands.vllm_bench import pointer

        if message.startswith("unrecognized arguments: "):  # a vllm bench serve habit gets a pointer to ours
            hint = pointer(message.split(": ", 1)[1].split())
            if hint is not None:
                self.exit(2, f"error: {self.prog}: {hint}\n")
        self.exit(2, f"error: {self.prog}: {message}\n")



def build_parser(command: str | None = None, *, every: bool = True) -> argparse.ArgumentParser:
    """The command line's parser. ``every=False`` gives each command other than ``command`` its name and
    help but not its flags, so that a run imports no other command's modules (0.02-0.03 s of every short
    run) and ``specbatch --help`` none of the simulator's: not even numpy."""
    def flags_of(name: str) -> bool:
        return every or name == command

    parser = _Parser(prog="specbatch", description="Simulate LLM serving with speculative decoding.",
                     settings=every or command is not None)
    parser.add_argument("--version", action="version", version=f"specbatch {_version()}")
    parser.add_argument("--debug", action="store_true",
                        help="on an error, also print its traceback (may be given anywhere on the line)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    run = sub.add_parser("run", help="simulate serving a workload (no flags: the shipped default scenario)")
    if flags_of("run"):
        _add_run_arguments(run)
    sub.add_parser("calibrate", help="time real draft/target passes and write a profile (needs torch)",
                   add_help=False)
    profiles = sub.add_parser("profiles", help="list shipped profiles, or describe one")
    profiles.add_argument("profile", nargs="?", help="profile name or directory to describe")
    lut = sub.add_parser("lut", help="build the lut policy's batch size -> k table from a profile")
    if flags_of("lut"):
        _add_lut_arguments(lut)
    for name, (module, text) in COMMANDS.items():
        if flags_of(name):
            importlib.import_module(module).add_arguments(sub.add_parser(name, help=text))
        else:
            sub.add_parser(name, help=text)
    return parser


def _add_run_arguments(run: argparse.ArgumentParser) -> None:
    from specbatch.commands import vllm_bench
    from specbatch.commands.flags import add_run_flags

    run.add_argument("--config", help="TOML scenario file; flags override its values")
    add_run_flags(run)
    run.add_argument("--quiet", action="store_true", help="print only the output folder")
    vllm_bench.add_arguments(run)


def _add_lut_arguments(lut: argparse.ArgumentParser) -> None:
    from specbatch.commands.flags import typed

    lut.add_argument("--profile", default=None, help="profile directory or shipped profile name "
                     "(default: the shipped default profile)")
    lut.add_argument("--alpha", type=typed("--alpha", float), required=True,
                     help="per-token acceptance rate of the model pair, in (0, 1)")
    lut.add_argument("--k-max", type=typed("--k-max", int), default=None,
                     help="largest k to consider (default 4; at most the profile's k_max)")
    lut.add_argument("--context", type=typed("--context", float), default=None,
                     help="reference context length in tokens at which steps are priced (default 512)")
    lut.add_argument("--max-batch", type=typed("--max-batch", int), default=None,
                     help="tabulate batch sizes 1..N (default: the default scenario's engine.max_batch_size)")
    lut.add_argument("--out", default=None, help="also write the table as a TOML [policy] snippet here "
                     "(with --format: the engine config)")
    lut.add_argument("--format", choices=("vllm", "sglang", "trtllm"), default=None,
                     help="print the table as a ready-to-paste engine config instead: vLLM's speculative_config "
                          "JSON, SGLang's adaptive config JSON, or TensorRT-LLM's draft_len_schedule")


def main(argv: Sequence[str] | None = None) -> int:
    global _NOTHING_LEFT_TO_DO
    _NOTHING_LEFT_TO_DO = False  # until this command says so (nothing_left_to_do)
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in argv[:argv.index("--")] if "--" in argv else DEBUG_FLAG in argv
    if debug:
        argv.remove(DEBUG_FLAG)
    try:
        with _noting_interrupts() as interrupts:
            return _dispatch(argv)
    except InputError as exc:
        _print_traceback(exc, debug)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: nothing was written (outputs appear whole or not at all)", file=sys.stderr)
        return 130
    except Exception as exc:
        if interrupts:  # Ctrl-C inside a lazy import (pandas, scipy) can surface as another error
            print("interrupted: nothing was written (outputs appear whole or not at all)", file=sys.stderr)
            return 130
        from policies import plugin_failure

        line = plugin_failure(exc)
        if line is None:  # not the user's policy: our bug, and its traceback is for us
            raise
        _print_traceback(exc, debug)
        print(f"error: {line}" + ("" if debug else " (--debug shows the traceback)"), file=sys.stderr)
        return 2


DEBUG_FLAG = "--debug"


@contextlib.contextmanager
def _noting_interrupts():
    """Yields a list that records each SIGINT (then handled as before: by default, KeyboardInterrupt).

    pandas and scipy are imported on first use, mid-run; Ctrl-C during a module's import can
    leave it half-initialised, so the run fails with an ImportError or AttributeError rather
    than KeyboardInterrupt. A failure after Ctrl-C is still reported as the interrupt."""
    seen: list[int] = []
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield seen  # signals are the main thread's; an ignored or default-action SIGINT stays so
        return

    def note(signum, frame):  # then whatever handled it before (Python's, or a host's such as Jupyter's)
        seen.append(signum)
        previous(signum, frame)

    signal.signal(signal.SIGINT, note)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


def _print_traceback(exc: BaseException, debug: bool) -> None:
    """With --debug: the traceback, down the chain of causes even where a one-line error hid it (``from None``)."""
    if not debug:
        return
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    for link in reversed(chain):
        print("".join(traceback.format_exception(type(link), link, link.__traceback__, chain=False)),
              file=sys.stderr, end="")


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] == "calibrate":
        try:
            from calibrate.cli import main as calibrate_main
        except ImportError as exc:
            print(f"error: specbatch calibrate needs torch ({exc}); pip install 'specbatch[calibrate]'",
                  file=sys.stderr)
            return 2
        return calibrate_main(argv[1:], prog="specbatch calibrate")
    command = next((word for word in argv if not word.startswith("-")), None)  # the top level takes no values
    args = build_parser(command, every=False).parse_args(argv)
    if args.command == "run":
        return _run(args)
    if args.command == "profiles":
        return _profiles(args.profile)
    if args.command == "lut":
        return _lut(args)
    if args.command in COMMANDS:
        return importlib.import_module(COMMANDS[args.command][0]).main(args)
    build_parser(every=False).print_help()
    return 0


_NOTHING_LEFT_TO_DO = False  # see nothing_left_to_do
_EXITS_AFTER_RUN = False  # set by entry_point: the process ends when main() returns


def nothing_left_to_do() -> None:
    """Said by a command once its outputs are all written and closed, and nothing it started needs the
    interpreter's exit to clean up (its pool's workers and the fork server end with this process,
    specbatch/commands/workers.py): a successful console script then ends without the interpreter's
    teardown (0.26-0.43 s after a capacity search or a tune, from its last line to its exit)."""
    global _NOTHING_LEFT_TO_DO
    _NOTHING_LEFT_TO_DO = True


def _run(args: argparse.Namespace) -> int:
    with _without_collection():
        return _simulate(args)


@contextlib.contextmanager
def _without_collection():
    """Python's cyclic garbage collector off for a run: importing numba, pyarrow and the simulator
    allocates some 10^5 long-lived objects, and collecting them over and over (about 150 collections,
    one of them full) took 0.05-0.08 s of a short run; a whole run leaves a few thousand
    objects in cycles (200k requests: 3,400), which the process's exit frees.

    The console script's process ends as the run does (:func:`entry_point`), so there it stays off:
    turned back on, it collected every object the run had made at the next allocation (0.01 s)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled and not _EXITS_AFTER_RUN:
            gc.enable()


def _simulate(args: argparse.Namespace) -> int:
    from sim.atomic_write import check_output
    from specbatch.commands import vllm_bench
    from specbatch.commands.flags import run_overrides
    from sim.config import load_config

    overrides = run_overrides(args)
    given = any(overrides[key][0] is not None for key in ("workload.prompt_tokens", "workload.output_tokens"))
    overrides.update(vllm_bench.dataset_overrides({k: getattr(args, k) for k in vllm_bench.DATASET_KEYWORDS}, given))
    overrides.update(vllm_bench.sampling_overrides({k: getattr(args, k) for k in vllm_bench.SAMPLING_KEYWORDS},
                                                   overrides["workload.sampling"][0] is not None))
    config = load_config(args.config, overrides)
    config.profile_path()  # the names a run is most often given wrong: checked before the simulator is loaded
    config.policy_class()
    chosen = vllm_bench.selection(args)
    saved = vllm_bench.result_path(args, config)
    if saved is not None:
        check_output(saved, folder=False, field="result", source="--result-filename")
    from specbatch.commands.outputs import format_summary, run_to_folder  # the simulator: after the inputs' checks

    result, out = run_to_folder(config, default_folder=True,  # a vLLM result file reads the steps: keep them
                                warn=lambda warning: print(f"warning: {warning}", file=sys.stderr),
                                keep_steps=saved is not None)
    if saved is not None:
        vllm_bench.write_result(saved, result, *(chosen or vllm_bench.default_selection()), args.save_detailed)
    nothing_left_to_do()  # every file is written; what is left is printing
    timeline = config.output.timeline
    if args.quiet:
        print(out)
        return 0
    print(format_summary(result, chosen))
    steps = result.summary["num_steps"]
    print(f"Simulated {result.request_count} requests, {steps} engine steps in {result.wall_s:.2f} s wall "
          f"({steps / max(result.wall_s, 1e-9):,.0f} steps/s, "
          f"{result.request_count / max(result.wall_s, 1e-9):,.0f} requests/s).")
    print(f"Wrote {out}/ (summary.json, config.toml"
          + ("" if config.output.records == "none" else f", requests.{config.output.records}, "
             f"steps.{config.output.records}") + ")")
    if timeline:
        print(f"Wrote {timeline} (Chrome trace events: open in https://ui.perfetto.dev)")
    if saved is not None:
        print(f"Wrote {saved} (vllm bench serve's result JSON)")
    return 0


def _profiles(name: str | None) -> int:
    from sim.costmodel.profile import DEFAULT_PROFILE, gpus_per_replica, load_meta, load_profile, shipped_profiles

    if name is None:  # from the sidecars alone
        print(f"{'profile':<40} {'source':<9} {'GPUs':>4}  device")
        for shipped in shipped_profiles():
            meta = load_meta(shipped)
            mark = " (default)" if shipped == DEFAULT_PROFILE else ""
            print(f"{shipped + mark:<40} {profile_source(meta):<9} {gpus_per_replica(meta):>4}  "
                  f"{meta.get('device', {}).get('name', '?')}")
        return 0
    profile = load_profile(name)
    meta = profile.meta
    device = meta.get("device", {})
    models = meta.get("models", {})
    print(f"profile      {profile.name}  ({profile.path})")
    print(f"source       {profile_source(meta)}" + (
        f" from {meta['composition']['package']} {meta['composition']['package_version']} "
        f"({meta['composition']['framework']} {meta['composition']['framework_version']} kernels; "
        f"assumptions in {profile.path / 'profile.json'})" if "composition" in meta else ""))
    gpus = profile.gpus_per_replica
    print(f"device       {device.get('name', '?')} [{device.get('type', '?')}], dtype {meta.get('dtype')}; "
          + (f"{gpus} GPUs per replica (tensor parallel)" if gpus > 1 else "1 GPU per replica"))
    draft = (f"draft {models['draft'].get('name')}" if profile.has_draft else
             "no draft (target only: runs --policy none)")
    placement = meta.get("draft_placement", {}).get("tensor_parallel_size")
    placement = "" if placement is None or not profile.has_draft else f" on {placement} GPU(s)"
    print(f"models       target {models.get('target', {}).get('name')}, {draft}{placement}")
    print(f"timing       {meta.get('timing', {}).get('method')}, created {meta.get('created_utc')}")
    print(f"k_max        {profile.k_max}    kv capacity {profile.kv_capacity_tokens} tokens")
    others = [mode for mode in profile.samplings() if mode != profile.sampling]
    print(f"sampling     {profile.sampling} (its verify / target points)"
          + (f"; --sampling {', '.join(others)} priced too" if others else ""))
    overhead = meta.get("engine_overhead", {})
    if "decode_overhead_s" in overhead:
        origin = ("fitted (specbatch fit)" if "fitted" in overhead else
                  "from a published figure" if profile_source(meta) == "composed" else
                  "measured by short replays at several batch sizes" if "by_batch" in overhead else
                  "measured by a short replay")
        per_row = profile.engine_overhead_per_row_s("decode")
        print(f"overhead     {1e3 * profile.engine_overhead_s('decode'):.2f} ms per decode step"
              + (f" + {1e3 * per_row:.3f} ms per running row" if per_row else "") + ", "
              f"{1e3 * profile.engine_overhead_s('prefill'):.2f} ms per prefill step ({origin})"
              + (f"; overlapped with the passes (async scheduling), {1e3 * profile.exposed_overhead_s:.2f} ms "
                 f"exposed" if profile.overhead_overlapped else ""))
    elif overhead:
        print(f"overhead     none charged ({overhead.get('error', 'not measured')})")
    counts = profile.points.groupby(["phase", "model"]).size()
    for (phase, model), n in counts.items():
        rows = profile.phase(phase, model)
        print(f"  {phase:8} {model:7} {n:4} points  batch {rows.batch_size.min()}..{rows.batch_size.max()}"
              f"  q {rows.query_tokens.min()}..{rows.query_tokens.max()}"
              f"  ctx {rows.context_tokens.min()}..{rows.context_tokens.max()}")
    if len(profile.skipped):
        print(f"  skipped  {len(profile.skipped)} points (out of memory or failed)")
    return 0


def profile_source(meta: dict) -> str:
    """'measured' (calibrate; also profiles from before the field existed) or 'composed'."""
    return str(meta.get("source", "measured"))


def _lut(args: argparse.Namespace) -> int:
    import math
    from pathlib import Path

    from policies.lut import DEFAULT_CONTEXT, DEFAULT_K_MAX, build_lut
    from sim.atomic_write import write_file
    from sim.config import load_config
    from sim.atomic_write import check_output
    from sim.limits import MAX_BATCH
    from sim.costmodel.profile import DEFAULT_PROFILE
    from sim.simulate import profile_and_costs

    alpha = args.alpha
    if not (0.0 < alpha < 1.0):
        raise InputError(f"must be inside (0, 1), got {alpha:g}", source="--alpha")
    k_max = DEFAULT_K_MAX if args.k_max is None else args.k_max
    context = float(DEFAULT_CONTEXT if args.context is None else args.context)
    if not (context >= 0 and math.isfinite(context)):
        raise InputError(f"must be a number of tokens >= 0, got {context:g}", source="--context")
    max_batch = args.max_batch if args.max_batch is not None else load_config(None).engine.max_batch_size
    if max_batch < 1:
        raise InputError(f"must be at least 1, got {max_batch}", source="--max-batch")
    if max_batch > MAX_BATCH:
        raise InputError(f"must be at most {MAX_BATCH} (beyond any serving engine's batch), got {max_batch}",
                         source="--max-batch")
    if args.out:
        check_output(args.out, folder=False, source=f"--out {args.out}")
    profile, model, _ = profile_and_costs(args.profile or DEFAULT_PROFILE)  # fitted once per machine, as a run's
    if not 0 <= k_max <= profile.k_max:
        raise InputError(f"must be in 0..{profile.k_max} (the profile's measured k_max), got {k_max}",
                         source="--k-max")
    step_time = step_times_at(model, k_max, max_batch, context)
    table = build_lut(step_time, alpha, k_max, max_batch, context)
    out = Path(args.out) if args.out else None
    if args.format:
        return _lut_engine_config(args.format, table, out)
    if out is not None:  # written first, so that a path that cannot be written leaves one error line
        rows = ", ".join(f"[{s}, {e}, {k}]" for s, e, k in table)
        ctx = int(context) if context.is_integer() else context
        text = (f"# built by: specbatch lut --profile {args.profile or DEFAULT_PROFILE} --alpha {alpha} "
                f"--k-max {k_max} --context {ctx} --max-batch {max_batch}\n"
                f"[policy]\nname = \"lut\"\ntable = [{rows}]\n")
        try:
            write_file(out, text)
        except OSError as exc:
            raise InputError(f"cannot write the table: {exc.strerror or exc}", source=out) from None
    print("\n".join(_lut_lines(profile.name, step_time, table, alpha, k_max, context, max_batch)))
    if out is not None:
        print(f"Wrote {out}")
    return 0


def step_times_at(model, k_max: int, max_batch: int, context: float):
    """``model.step_time(b, k, context)`` for b in 1..max_batch and k in 0..k_max, evaluated in one call
    (one at a time, the 1,285 a default table asks for took 1.6 s), as a function of (b, k, c)."""
    import numpy as np

    times = model.step_times(np.arange(1, max_batch + 1)[:, None], np.arange(k_max + 1)[None, :], context)

    def step_time(batch_size: int, k: int, context_tokens: float) -> float:
        assert context_tokens == context, "tabulated at one context"
        return float(times[batch_size - 1, k])

    return step_time


def _lut_engine_config(fmt: str, table: list, out) -> int:
    """The table as the engine takes it (docs/policy-engines.md); the matching policy reads it back."""
    import json

    from sim.atomic_write import write_file

    if fmt == "vllm":
        from policies.vllm_dynamic import engine_config
        text = json.dumps(engine_config(table))
    elif fmt == "sglang":
        from policies.sglang_adaptive import engine_config
        config, raised = engine_config(table)
        text = json.dumps(config)
        for start, end, _ in raised:
            print(f"note: SGLang drafts at least one step: batch {start}-{end} (k = 0 in the table) gets steps [1]",
                  file=sys.stderr)
    else:
        from policies.trtllm_schedule import engine_config, format_schedule
        text = format_schedule(engine_config(table))
    if out is not None:
        try:
            write_file(out, text + "\n")
        except OSError as exc:
            raise InputError(f"cannot write the config: {exc.strerror or exc}", source=out) from None
    print(text)
    return 0


def _lut_lines(name: str, step_time, table: list, alpha: float, k_max: int, context: float,
               max_batch: int) -> list[str]:
    """The table as printed: each range's k, expected ms per token with it and without, and the ratio."""
    from policies.lut import best_k, expected_tokens

    lines = [f"lut for profile {name}: alpha {alpha:g}, k in 0..{k_max}, context {context:g} tokens, "
             f"batch 1..{max_batch}",
             "time per token = step time / expected tokens per sequence, (1 - alpha^(k+1)) / (1 - alpha)"]
    header = f"{'batch':>9}  {'k':>2}  {'ms/token (k)':>15}  {'ms/token (k=0)':>15}  {'speedup':>11}"
    lines += [header, "-" * len(header)]

    def span(lo: float, hi: float, fmt: str) -> str:
        a, b = format(lo, fmt), format(hi, fmt)
        return a if a == b else f"{a}..{b}"

    for start, end, k in table:
        ends = (start, end)
        with_k = [1e3 * best_k(step_time, alpha, k_max, b, context)[1] for b in ends]
        plain = [1e3 * step_time(b, 0, context) for b in ends]
        speedup = [p / w for p, w in zip(plain, with_k)]
        batch = str(start) if start == end else f"{start}-{end}"
        lines.append(f"{batch:>9}  {k:>2}  {span(*with_k, '.1f'):>15}  {span(*plain, '.1f'):>15}  "
                     f"{span(*speedup, '.2f') + 'x':>11}")
    lines.append(f"(figures at each range's first and last batch size; above {max_batch} the last k applies; "
                 f"E[tokens] at k: {', '.join(f'{expected_tokens(alpha, k):.2f}' for k in range(k_max + 1))})")
    return lines


def _version() -> str:
    import sim
    return sim.__version__


def entry_point() -> None:
    """Console script: like main(), but a closed pipe (``specbatch run | head``) ends quietly."""
    global _EXITS_AFTER_RUN
    _EXITS_AFTER_RUN = True
    try:
        code = main()
        sys.stdout.flush()
    except KeyboardInterrupt:  # between main's own handling and the exit
        code = 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        code = 0
    if code == 130 or (code == 0 and _NOTHING_LEFT_TO_DO):
        # CPython remembers an interrupt that landed in code it ran itself (an import, say) and
        # then exits as killed by SIGINT whatever we return; the promised status is 130.
        # A finished run exits the same way: the interpreter's teardown (freeing every module and the
        # run's arrays, numba's and LLVM's shutdown) took a ninth of a short run's whole process.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry_point()
