"""What compiling the engine costs, kernel by kernel, from an empty cache: what a machine's first runs,
the background warm-up (``python -m sim.warm``) and a cold test session pay once per code version.

    python benchmarks/compile_time.py            # every warm-up run, in a fresh process and cache
    python benchmarks/compile_time.py --update   # also write benchmarks/results/compile_time.txt
    python benchmarks/compile_time.py --against /tmp/before --update   # and another checkout's, run first

Runs sim.warm's runs one after another (as the warm-up does) in a child process whose compiled-code
cache is an empty temporary folder, and prints for each the wall time and the compiled entry points it
made, each with its time and the part of it spent in LLVM (numba's compile events; an entry point's
time includes the rules compiled into it). Single-threaded: run it on an idle machine. ``--against DIR``
measures another checkout's code the same way first, in the same invocation, and adds its wall time per run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from alternate import checkout_env, machine_line

RESULTS = Path(__file__).resolve().parent / "results" / "compile_time.txt"
ROOT = Path(__file__).resolve().parents[1]
MACHINE_NOTE = "one process, an empty compiled-code cache"


def measure() -> list[dict]:
    """In this process (the child): each warm run's wall time and the entry points it compiled."""
    import time

    from numba.core import event

    from sim import jit, warm

    class EntryPoints(event.Listener):
        """Top-level compilations (an entry point's, not the rules compiled into it), with LLVM's part."""

        def __init__(self) -> None:
            self.depth, self.made = 0, []

        def on_start(self, ev) -> None:
            if self.depth == 0:
                self.started, self.llvm_at_start = time.perf_counter(), llvm.duration
            self.depth += 1

        def on_end(self, ev) -> None:
            self.depth -= 1
            if self.depth == 0:
                fn = ev.data["dispatcher"].py_func
                self.made.append({"entry": f"{fn.__module__}.{fn.__qualname__}",
                                  "s": time.perf_counter() - self.started, "llvm_s": llvm.duration - self.llvm_at_start})

    jit.prepare()
    rows = []
    with event.install_timer("numba:llvm_lock", lambda duration: None) as llvm:
        listener = EntryPoints()
        event.register("numba:compile", listener)
        for overrides in warm.WARM_RUNS:
            started = time.perf_counter()
            warm.run_compiled((overrides,))
            rows.append({"run": overrides, "s": time.perf_counter() - started, "made": listener.made})
            listener.made = []
    return rows


def lines(rows: list[dict], before: list[dict] | None = None, commit: str = "", machine: str = "") -> list[str]:
    """The table: each warm-up run's wall time and what it compiled, with ``before``'s wall time for the same run
    beside it (``-`` where the code before has no such run), under ``machine`` (the machine as it is now if
    none is given)."""
    was = {json.dumps(row["run"]): row["s"] for row in before or ()}
    out = [machine or machine_line(MACHINE_NOTE), f"{'warm-up run':<62} {'wall':>7}" + (f" {'before':>7}" if before else "")
           + "   compiled entry points (s, of which LLVM)"]
    for row in rows:
        made = ", ".join(f"{m['entry'].split('.', 1)[1]} {m['s']:.0f} ({m['llvm_s']:.0f})" for m in row["made"]) or "-"
        then = json.dumps(row["run"])
        beside = (f" {was[then]:6.1f}s" if then in was else f" {'-':>7}") if before else ""
        out.append(f"{then:<62} {row['s']:6.1f}s{beside}   {made}")
    total = sum(r["s"] for r in rows)
    if before:
        was_total = sum(was.values())
        out.append(f"{'all':<62} {total:6.1f}s {was_total:6.1f}s   {was_total / total:.2f}x faster than the code "
                   f"before ({commit}), measured first in the same invocation")
    else:
        out.append(f"{'all':<62} {total:6.1f}s")
    return out


def compile_runs(checkout: Path) -> list[dict]:
    """sim.warm's runs compiled by ``checkout``'s code in a child process, from an empty cache."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**checkout_env(checkout), "SPECBATCH_CACHE_DIR": cache, "SPECBATCH_BACKGROUND_COMPILE": "0"}
        done = subprocess.run([sys.executable, __file__, "--child"], cwd=checkout, env=env, capture_output=True,
                              text=True)
    if done.returncode:
        sys.exit(done.stderr)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help=f"write {RESULTS.relative_to(ROOT)}")
    parser.add_argument("--against", type=Path, default=None,
                        help="another checkout (the code before a change), measured first the same way")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.against and not (args.against / "sim" / "warm.py").is_file():
        parser.error(f"--against {args.against}: not a checkout of specbatch (no sim/warm.py there)")
    if args.child:
        print(json.dumps(measure()))
        return
    machine = machine_line(MACHINE_NOTE)  # the load as it starts
    before = compile_runs(args.against.resolve()) if args.against else None
    commit = ""
    if args.against:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.against, capture_output=True,
                                text=True).stdout.strip()
    text = "\n".join(lines(compile_runs(ROOT), before, commit, machine)) + "\n"
    print(text, end="")
    if args.update:
        RESULTS.write_text(text)


if __name__ == "__main__":
    main()
