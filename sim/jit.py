"""One source for each step rule, run interpreted or compiled (``engine.jit``).

The engine's rules (sim/serving/rules.py, the schedulers in sim/scheduler/, goodput's
choice in policies/goodput_rules.py) are plain Python functions over numpy arrays, written in
the subset of Python numba compiles. The step-by-step loop calls them one step at a time, the
compiled runs (sim/serving/compiled.py) call them in a loop inside one compiled function; both
call *the same* functions, so there is one implementation of each rule and the two paths give
the same bytes (tests/test_decode_runs.py).

* ``interpreted`` (``engine.jit = off``): the plain functions, as Python runs them. Slow (a
  Python loop over the batch's rows per step) but needs no compiler: for debugging, and where
  numba is not installed.
* ``compiled`` (``auto``, ``on``): :func:`compiled` returns a function's numba-compiled twin,
  made on first use. The rules are registered with numba (``register_jitable``), so a compiled
  rule that calls another compiles the callee into itself.

The rules allocate nothing (every buffer is handed in), so they are compiled without numba's
reference counting (``_nrt=False``): counting references to the forty-odd arrays a step hands
from rule to rule cost more than the step's own work (2-3 µs a step, measured with perf).

Compiled code is cached on disk so that a process pays only numba's start (~0.3 s), not the
compilation (tens of seconds, once per machine and code version). The cache folder is keyed by
a hash of every file that holds a rule and of numba's version: numba itself checks only the
timestamp of the file a compiled entry point lives in, not of the rules it inlined from others.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable

JIT_MODES = ("auto", "on", "off")

# The modules whose functions the compiled code is built from (their rules are registered, and
# their bytes key the cache). Each lists its rules in a module-level tuple named RULES.
RULE_MODULES = ("sim.serving.rules", "sim.scheduler.kvcache", "sim.scheduler.v0", "sim.scheduler.v1",
                "sim.proposals", "sim.serving.kernel", "policies.goodput_rules", "sim.costmodel_rules")

_TWINS: dict[Callable, Callable] = {}
_READY = False


def numba_available() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def wants_compiled(mode: str) -> bool:
    """Whether a run under ``engine.jit = mode`` runs compiled rules (``on`` needs numba:
    checked where the config is, sim.simulate.prepare)."""
    return mode != "off" and numba_available()


def _cache_folder() -> Path:
    from sim.cache import cache_dir

    digest = hashlib.sha256()
    import numba

    digest.update(numba.__version__.encode())
    digest.update(sys.version.encode())
    digest.update(Path(__file__).read_bytes())  # how the rules are compiled
    for name in RULE_MODULES:
        digest.update(Path(importlib.import_module(name).__file__).read_bytes())
    base = cache_dir() or Path(tempfile.gettempdir()) / f"specbatch-{os.getuid() if hasattr(os, 'getuid') else 0}"
    return base / f"numba-{digest.hexdigest()[:16]}"


def prepare() -> None:
    """Register every rule with numba and point its cache at this code version's folder (once per
    process: the folder is the cache directory's at the first call)."""
    global _READY
    if _READY:
        return
    import numba
    from numba.extending import register_jitable

    folder = _cache_folder()
    if sys.stderr.isatty() and not (folder.is_dir() and any(folder.rglob("*.nbi"))):  # long work says so
        print("note: compiling the simulation engine for this machine and code version (once; about ten "
              "seconds of CPU)", file=sys.stderr)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        numba.config.CACHE_DIR = str(folder)
    except OSError:  # an unwritable cache: compile in every process rather than fail
        pass
    for name in RULE_MODULES:
        for rule in importlib.import_module(name).RULES:
            register_jitable(_nrt=False)(rule)
    _READY = True


def compiled(fn: Callable) -> Callable:
    """``fn``'s compiled twin (numba, cached on disk), made on first use."""
    twin = _TWINS.get(fn)
    if twin is None:
        prepare()
        import numba

        twin = _TWINS[fn] = numba.njit(cache=True, nogil=True, _nrt=False)(fn)
    return twin


