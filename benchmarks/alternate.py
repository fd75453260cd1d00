"""Timing a command against another checkout on a shared, noisy machine: alternate them.

``python benchmarks/X.py --against DIR`` runs the same whole process with ``PYTHONPATH=DIR``
(another checkout, e.g. ``git worktree add --detach /tmp/before main``) and with this one,
before, after, before, after ..., so that load from other jobs falls on both alike, and
compares medians.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def checkout_env(checkout: Path | None = None) -> dict:
    """This process's environment with ``checkout``'s code (else this one's) first on the import path."""
    return {**os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, (str(checkout or ROOT), os.environ.get("PYTHONPATH"))))}


def cli_module(checkout: Path | None = None) -> str:
    """``checkout``'s command-line module: ``specbatch.commands.cli``, or ``sim.commands.cli`` in code from
    before the commands moved out of the simulator's package (0356564), so that older code can be timed too."""
    moved = ((checkout or ROOT) / "specbatch" / "commands" / "cli.py").is_file()
    return "specbatch.commands.cli" if moved else "sim.commands.cli"


def run_timed(command: list[str], checkout: Path | None = None) -> float:
    """Wall seconds of one whole process of ``command`` (python -m ...) run from ``checkout``'s code."""
    env = checkout_env(checkout)
    started = time.perf_counter()
    # from the checkout's own folder: ``python -m`` puts the working directory first on sys.path
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True, env=env, cwd=checkout or ROOT)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}) from {checkout or ROOT}:\n{done.stderr}")
    return wall


def order(repeat: int, against: Path | None) -> list[tuple[str, Path | None]]:
    """(name, checkout) in the order to run them: before and after alternating, ``repeat`` times each."""
    if against is None:
        return [("this checkout", None)] * repeat
    return [pair for _ in range(repeat) for pair in (("before", against), ("after", None))]


def medians(walls: dict[str, list[float]]) -> list[str]:
    lines = [f"{name}: median {statistics.median(w):.1f} s wall over {len(w)} runs ({', '.join(f'{x:.1f}' for x in w)})"
             for name, w in walls.items()]
    if "before" in walls and "after" in walls:
        lines.append(f"before / after: {statistics.median(walls['before']) / statistics.median(walls['after']):.2f}x")
    return lines


def machine_line(what: str) -> str:
    import platform

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{platform.machine()}, {cores} cores, Python {platform.python_version()}; {what}; "
            f"load average {load:.1f} at the start (other jobs on the machine)")
