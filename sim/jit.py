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

The rules a step calls once each (a module's ``INLINED``, a part of its ``RULES``) are compiled
into their callers (numba's ``inline="always"``): a call to a rule that takes the replica's state
passes every field of its forty-odd arrays on the stack (about 150 pushes a call, ten calls a
step), which cost a third of a compiled step (the default scenario's 200k requests, 760k steps:
1.61 s -> 1.07 s, medians of 3 alternating runs), against about twice the compilation (``python -m
sim.warm``: 44 s -> 95 s of CPU; a run's own, 14 s -> 46 s; once per machine and code version). Most of that
compilation was numba's way with inlined functions, not the code: it typed the deepest rules dozens of times
over and compiled every inlined rule on its own as well; here each is typed once per argument types and
compiled only into its callers (:func:`_type_inlined_rules_once`), the same code coming out.

A kernel another calls whole (the single replica's ``run_steps``, called by the routed cluster's kernel) is
its own cached entry point, linked into its callers (a module's ``LINKED``): compiled into each caller
instead, numba typed it again every time (the routed cluster's kernel: 119 s -> 64 s of a 2-core machine's
CPU, the same code run). One process at a time compiles an entry point (a lock file beside its cached
code); the others wait and load it: a test session's workers, a search's pool and a run beside the
background warm-up do not compile the same minutes twice at once.

A cluster's kernels read one replica's state out of a tuple of every replica's at a run-time index
(``f.states[g]``); numba does that by value, a switch that copies each replica's forty-odd arrays, and
LLVM spent most of those kernels' compilation on it. Their fleet is read through ``.pinned``
(:func:`_register_pinned`): each tuple kept in memory, the one entry loaded where it lies.

Compiled code is cached on disk so that a process pays only numba's start (~0.3 s), not the
compilation (tens of seconds, once per machine and code version); it is loaded without the
refresh of numba's compilation context that loading does not need (:func:`_load_without_refresh`). The cache folder is keyed by
a hash of every file that holds a rule and of numba's version: numba itself checks only the
timestamp of the file a compiled entry point lives in, not of the rules it inlined from others.

The first run of a code version on a machine (:func:`use_compiled`): under ``auto``, a run of
at most ``SMALL_RUN`` requests is interpreted, which is faster than compiling first, while a
background process (``python -m sim.warm``) compiles every entry point into the
cache for the runs after it; a larger run compiles in-process. Either way one line on stderr
says so. ``SPECBATCH_BACKGROUND_COMPILE=0`` keeps every compilation in-process (no process is
started: what a CI job or a test suite that must not leave processes behind wants).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

JIT_MODES = ("auto", "on", "off")
# A cold run of at most this many requests is interpreted rather than compiled first: interpreted,
# the default scenario's 5,435 requests take about 5 s of CPU; compiling everything takes minutes of CPU
# (benchmarks/results/compile_time.txt).
SMALL_RUN = 10_000
BACKGROUND_ENV = "SPECBATCH_BACKGROUND_COMPILE"
READY = "ready"  # written in the cache folder once sim.warm has compiled every entry point
FAILED = "warm-failed"  # ... or what stopped it (then runs compile in-process, as without a warm-up)
WARMING = "warming"  # the background warm-up's lock: its process id; stale once that process is gone
WARM_TIMEOUT_S = 600.0  # ... or after this long

# The modules whose functions the compiled code is built from (their rules are registered, and
# their bytes key the cache). Each lists its rules in a module-level tuple named RULES.
RULE_MODULES = ("sim.serving.rules", "sim.scheduler.kvcache", "sim.scheduler.v0", "sim.scheduler.v1",
                "sim.scheduler.work",
                "sim.speculation.proposals", "sim.serving.step", "sim.serving.kernel", "policies.goodput_rules",
                "policies.ladder_rules", "policies.context_rules", "sim.costmodel.rules", "sim.serving.routing",
                "sim.serving.cluster_kernel", "sim.serving.pd_kernel", "sim.float_text", "sim.csv_rows")
# Modules whose constants the rules read (numba compiles a global's value in), and sim.prefetch, whose hint
# they call: their bytes key the cache too.
CONSTANT_MODULES = ("sim.scheduler.layout", "policies.base", "sim.prefetch")

_TWINS: dict[Callable, Callable] = {}
_MAKING = threading.Lock()  # one twin per function, whichever threads ask at once (a run's writer, its replicas)
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
    from sim.costmodel.cache import cache_dir

    digest = hashlib.sha256()
    import numba

    digest.update(numba.__version__.encode())
    digest.update(sys.version.encode())
    digest.update(Path(__file__).read_bytes())  # how the rules are compiled
    # numba files a compiled function under its source file's path: another checkout of the same code
    # would find this folder ready and still compile everything, silently, in its first run.
    digest.update(str(Path(__file__).resolve().parent).encode())
    for name in RULE_MODULES + CONSTANT_MODULES:
        digest.update(Path(importlib.import_module(name).__file__).read_bytes())
    base = cache_dir() or Path(tempfile.gettempdir()) / f"specbatch-{os.getuid() if hasattr(os, 'getuid') else 0}"
    return base / f"numba-{digest.hexdigest()[:16]}"


def prepare() -> None:
    """Register every rule with numba and point its cache at this code version's folder (once per
    process: the folder is the cache directory's at the first call)."""
    global _READY, _folder
    if _READY:
        return
    import numba
    from numba.extending import register_jitable

    folder = _cache_folder()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        numba.config.CACHE_DIR = str(folder)
    except OSError:  # an unwritable cache: compile in every process rather than fail
        pass
    _folder = folder
    _type_inlined_rules_once()
    _register_pinned()
    _register_prefetch()
    for name in RULE_MODULES:
        module = importlib.import_module(name)
        inlined, linked = getattr(module, "INLINED", ()), getattr(module, "LINKED", ())
        for rule in module.RULES:
            if rule in linked:
                _register_linked(rule)
            else:
                register_jitable(_nrt=False, inline="always" if rule in inlined else "never")(rule)
    _READY = True


def _type_inlined_rules_once() -> None:
    """Type each inlined rule once per argument types, and never compile it on its own.

    For a function registered ``inline="always"``, numba compiles it whole on its own (typed, lowered,
    optimised by LLVM: code nothing calls) and then types it again, each time a caller's type inference
    resolves a call to it; each caller being itself compiled on its own and typed several times, the rules
    nested deepest were typed dozens of times with the same types (the single replica's kernel: its
    scheduler 30 times, one of its helpers 98) and every level's code was compiled once per level above it.
    Here a rule is typed for inlining only (its IR and the signature type inference gives it), once per
    argument types; each later call gets a fresh copy of that IR (inlining renames the variables of the IR
    it is handed). The same IR is inlined, so the same code is compiled (the same bytes out,
    tests/test_decode_runs.py). Every warm-up run from an empty cache: 577 s -> 218 s on a 2-core machine
    (benchmarks/compile_time.py --against, the single replica's kernel 129 s -> 30 s).
    A rule numba's way is needed for (defaults, a closure, keyword arguments) and numba's typing templates
    not being what this was written against both leave it to numba. The change is numba's for the whole
    process once specbatch has prepared it: other code's ``inline="always"`` functions in the same process
    (a notebook's) are typed this way too."""
    import copy

    try:
        from numba.core.typing.templates import _OverloadFunctionTemplate
    except ImportError:
        return
    numba_generic = _OverloadFunctionTemplate.__dict__.get("generic")
    if numba_generic is None or getattr(numba_generic, "typed_once", False):
        return

    def generic(self, args, kws):
        inline = getattr(self, "_inline", None)
        if inline is None or not inline.is_always_inline:
            return numba_generic(self, args, kws)
        typed = type(self).__dict__.get("_typed_once")
        if typed is None:
            typed = type(self)._typed_once = {}
        key = (self.context, tuple(args), tuple(kws.items()))
        if key in typed:
            sig, folded_args, info, pristine = typed[key]
            self._inline_overloads[sig.args] = {"folded_args": folded_args,
                                                "iinfo": info._replace(func_ir=copy.deepcopy(pristine))}
            return sig
        sig = None
        if not kws:
            try:
                sig = _type_for_inlining(self, tuple(args))
            except Exception:  # numba's way below says what is wrong, as it would have
                sig = None
        if sig is None:
            sig = numba_generic(self, args, kws)
        entry = self._inline_overloads.get(sig.args) if sig is not None else None
        if entry is not None and "iinfo" in entry:
            info = entry["iinfo"]
            typed[key] = (sig, entry["folded_args"], info, copy.deepcopy(info.func_ir))
        return sig

    generic.typed_once = True
    generic.__wrapped__ = numba_generic
    _OverloadFunctionTemplate.generic = generic


def _type_for_inlining(template, args: tuple):
    """The signature of ``template``'s rule called with ``args``, and its typed IR recorded for numba's
    inliner as numba's own typing for inlining records it; None for a rule this does not handle."""
    import inspect

    from numba.core import compiler, ir_utils, typed_passes
    from numba.core.inline_closurecall import InlineWorker
    from numba.core.registry import cpu_target
    from numba.core.typing.templates import Signature, _EmptyImplementationEntry, _inline_info

    rule = template._overload_func(*args)
    if not inspect.isfunction(rule) or rule.__closure__:
        return None
    params = inspect.signature(rule).parameters.values()
    if len(params) != len(args) or any(p.kind is not p.POSITIONAL_OR_KEYWORD or p.default is not p.empty
                                       for p in params):
        return None
    target = cpu_target.target_context
    flags = compiler.Flags()
    worker = InlineWorker(template.context, target, {}, compiler.Compiler(template.context, target, None, None,
                                                                          None, flags, None), flags, None)
    ir = worker.run_untyped_passes(rule, enable_ssa=True)
    typemap, return_type, calltypes, _ = typed_passes.type_inference_stage(template.context, target, ir, args, None)
    ir = typed_passes.PreLowerStripPhis()._strip_phi_nodes(ir)
    ir._definitions = ir_utils.build_definitions(ir.blocks)
    sig = Signature(return_type, args, None)
    template._inline_overloads[args] = {"folded_args": args, "iinfo": _inline_info(ir, typemap, calltypes, sig)}
    template._compiled_overloads[args] = _EmptyImplementationEntry("always inlined")
    return sig


def _register_pinned() -> None:
    """``fleet.pinned`` compiled: a named tuple whose fields are tuples of one type (a cluster's ``Fleet``:
    one entry per replica), each kept in memory in the frame of the function that reads it, so that
    indexing one at a run-time index loads that one element where it lies. Interpreted, the property gives
    the named tuple itself.

    numba indexes a tuple at a run-time index by value: a switch over every element, each a copy of a
    replica's forty-odd arrays, at every such read; for the cluster kernels (eight replicas' tuples) that was
    most of their compilation (benchmarks/results/compile_time.txt: the disaggregated kernel's took 2.6 times
    as long, the routed cluster's twice), for the same outputs.

    Reading ``.pinned`` is an attribute (numba's alias analysis then knows that what is read through it is
    the caller's arrays: a function call returning the same would have its writes dropped as dead code once
    anything is inlined). A pinned tuple lives as long as the function that pinned it: never return one."""
    import operator

    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.core.datamodel import models
    from numba.core.imputils import impl_ret_borrowed, lower_builtin, lower_getattr
    from numba.core.typing.templates import AbstractTemplate, AttributeTemplate, infer_getattr, infer_global, signature
    from numba.extending import register_model

    class Pinned(types.Type):
        """A tuple of one type in memory: a pointer to it."""

        def __init__(self, items: types.UniTuple) -> None:
            self.items = items
            super().__init__(name=f"Pinned({items})")

        @property
        def key(self):
            return self.items

    @register_model(Pinned)
    class PinnedModel(models.PrimitiveModel):
        def __init__(self, dmm, fe_type):
            super().__init__(dmm, fe_type, dmm.lookup(fe_type.items).get_value_type().as_pointer())

    def pinned_type(ty):
        return types.NamedTuple([Pinned(t) if isinstance(t, types.UniTuple) else t for t in ty.types],
                                ty.instance_class)

    @infer_getattr
    class PinnedAttribute(AttributeTemplate):
        key = types.BaseNamedTuple

        def resolve_pinned(self, ty):
            if isinstance(getattr(ty.instance_class, "pinned", None), property):
                return pinned_type(ty)

    @lower_getattr(types.BaseNamedTuple, "pinned")
    def pin(context, builder, ty, value):
        parts = []
        for i, field in enumerate(ty.types):
            part = builder.extract_value(value, i)
            if isinstance(field, types.UniTuple):
                where = cgutils.alloca_once(builder, context.get_value_type(field))
                builder.store(part, where)
                part = where
            parts.append(part)
        return context.make_tuple(builder, pinned_type(ty), parts)

    @infer_global(operator.getitem)
    class Pick(AbstractTemplate):
        def generic(self, args, kws):
            if len(args) == 2 and isinstance(args[0], Pinned) and isinstance(args[1], types.Integer):
                return signature(args[0].items.dtype, *args)

    @lower_builtin(operator.getitem, Pinned, types.Integer)
    def pick(context, builder, sig, args):
        where, i = args
        i = context.cast(builder, i, sig.args[1], types.intp)
        count = context.get_constant(types.intp, sig.args[0].items.count)
        with cgutils.if_unlikely(builder, builder.icmp_unsigned(">=", i, count)):  # negative too: a replica's number
            context.call_conv.return_user_exc(builder, IndexError, ("tuple index out of range",))
        element = builder.load(builder.gep(where, [ir.Constant(ir.IntType(32), 0), i]))
        return impl_ret_borrowed(context, builder, sig.return_type, element)


def _register_prefetch() -> None:
    """:func:`sim.prefetch.prefetch` compiled: LLVM's ``llvm.prefetch`` of the row's first element's address,
    for writing, kept in every cache level (a hint: it changes no value, so compiled and interpreted runs
    stay the same to the bit)."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.core.imputils import lower_builtin
    from numba.core.typing.templates import AbstractTemplate, infer_global, signature

    from sim.prefetch import prefetch

    @infer_global(prefetch)
    class Prefetch(AbstractTemplate):
        def generic(self, args, kws):
            if len(args) == 2 and not kws and isinstance(args[0], types.Array) and isinstance(args[1], types.Integer):
                return signature(types.none, *args)

    @lower_builtin(prefetch, types.Array, types.Integer)
    def lower_prefetch(context, builder, sig, args):
        array_type, row_type = sig.args
        array = context.make_array(array_type)(context, builder, args[0])
        row = context.cast(builder, args[1], row_type, types.intp)
        zero = context.get_constant(types.intp, 0)
        where = cgutils.get_item_pointer2(context, builder, data=array.data,
                                          shape=cgutils.unpack_tuple(builder, array.shape),
                                          strides=cgutils.unpack_tuple(builder, array.strides),
                                          layout=array_type.layout, inds=[row] + [zero] * (array_type.ndim - 1),
                                          wraparound=False, boundscheck=False)
        byte, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        hint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [byte, i32, i32, i32]),
                                              "llvm.prefetch.p0i8")
        builder.call(hint, [builder.bitcast(where, byte), i32(1), i32(3), i32(1)])  # write, keep, data
        return context.get_dummy_value()


def _register_linked(rule: Callable) -> None:
    """Compiled code that calls ``rule`` calls its own cached entry point (:func:`compiled`), linked in,
    instead of compiling ``rule`` again into every caller: for a rule whose callers call it, not inline it
    (a module's ``LINKED``), each caller's compilation then loads it from the cache in milliseconds."""
    import inspect

    from numba.extending import overload

    names = ", ".join(inspect.signature(rule).parameters)
    scope: dict = {}
    exec(f"def call({names}):\n    return twin({names})\n", scope)  # the rule's own parameters: numba checks them
    call = scope["call"]

    @overload(rule, jit_options={"_nrt": False}, inline="always", strict=False)
    def typed(*args, **kwargs):
        call.__globals__["twin"] = compiled(rule)  # made on first use, as every twin
        return call


_folder: Path | None = None  # this process's compiled-code folder (prepare)
_SAID: set[str] = set()  # the notes this process has printed (each once)


def _note(text: str) -> None:
    """Long or unusual work says so, once per process, on stderr whatever it is (a terminal, a CI
    log, a notebook's cell)."""
    if text not in _SAID:
        _SAID.add(text)
        print(f"note: {text}", file=sys.stderr, flush=True)


def cache_folder() -> Path:
    """This code version's compiled-code folder (fixed at the process's first :func:`prepare`)."""
    prepare()
    return _folder


def is_warm() -> bool:
    """Whether sim.warm has compiled this code version on this machine."""
    return (cache_folder() / READY).is_file()


def use_compiled(mode: str, requests: int) -> bool:
    """Whether a run of ``requests`` requests under ``engine.jit = mode`` runs compiled rules, and on a
    cold cache what happens meanwhile (the module docstring)."""
    if not wants_compiled(mode):
        return False
    if is_warm():
        return True
    if mode == "auto" and requests <= SMALL_RUN and start_warm_up():
        _note(NOTE_BACKGROUND)
        return False
    if not any(cache_folder().rglob("*.nbi")):  # nothing compiled yet (else most is loaded, not compiled)
        _note(NOTE_COMPILING)
    return True


NOTE_BACKGROUND = ("the first run of this specbatch version on this machine is interpreted while the engine "
                   "compiles in the background for the runs after it (a few minutes of CPU, once)")
NOTE_COMPILING = "compiling the simulation engine for this machine and code version (once; a few minutes)"
FIRST_RUN_NOTES = tuple(f"note: {text}" for text in (NOTE_BACKGROUND, NOTE_COMPILING))


def start_warm_up() -> bool:
    """Start sim.warm in a background process unless one is running; False where background
    compilation is off (``SPECBATCH_BACKGROUND_COMPILE=0``) or the process cannot be started."""
    if os.environ.get(BACKGROUND_ENV, "1").strip() in ("0", "false", "no", "off"):
        return False
    folder = cache_folder()
    if (folder / FAILED).is_file():
        return False  # it failed here once (the file says why): compile in-process
    lock = folder / WARMING
    try:
        if lock.is_file() and _warming(lock):
            return True  # another process is compiling this version already
        lock.unlink(missing_ok=True)
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return True  # another process took the lock between the check and the open
    except OSError:
        return False  # an unwritable cache: compile in-process
    try:
        process = subprocess.Popen([sys.executable, "-m", "sim.warm"], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True, env={**os.environ, BACKGROUND_ENV: "0"})
    except OSError:
        os.close(fd)
        lock.unlink(missing_ok=True)
        return False
    os.write(fd, str(process.pid).encode())
    os.close(fd)
    return True


def _warming(lock: Path) -> bool:
    """Whether the warm-up that took ``lock`` is still at work (its process alive, not timed out)."""
    try:
        if time.time() - lock.stat().st_mtime > WARM_TIMEOUT_S:
            return False
        text = lock.read_text().strip()
    except OSError:
        return False
    if not text:
        return True  # just taken: its process id is being written
    try:
        os.kill(int(text), 0)
    except ProcessLookupError:
        return False
    except (OSError, ValueError):
        return True  # alive under another user, or unreadable: leave it to the timeout
    return True


def compiled(fn: Callable) -> Callable:
    """``fn``'s compiled twin (numba, cached on disk), made on first use."""
    twin = _TWINS.get(fn)
    if twin is None:
        with _MAKING:
            twin = _TWINS.get(fn)
            if twin is None:
                prepare()
                import numba

                twin = numba.njit(cache=True, nogil=True, _nrt=False)(fn)
                _load_without_refresh(twin)
                _compile_once(twin, fn)
                _TWINS[fn] = twin
    return twin


def _compile_once(twin, fn: Callable) -> None:
    """Let one process at a time compile ``twin`` (a lock file beside its cached code): the others wait
    and then load what it wrote, rather than compile the same minutes of code again at the same time
    (a test session's workers, a search's pool, a run beside the background warm-up). A process that
    dies lets go of its lock; where there is no ``fcntl`` or the folder is unwritable, each compiles."""
    try:
        import fcntl
    except ImportError:
        return
    if not hasattr(twin, "overloads"):  # NUMBA_DISABLE_JIT: the plain function
        return
    lock = cache_folder() / f"{fn.__module__}.{fn.__qualname__}.lock"
    numba_compile = twin.compile

    def compile(sig):
        if isinstance(sig, tuple) and sig in twin.overloads:  # made or loaded in this process already
            return numba_compile(sig)
        try:
            fd = os.open(lock, os.O_CREAT | os.O_RDWR)
        except OSError:
            return numba_compile(sig)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return numba_compile(sig)  # numba's own: the cache first (what another process wrote meanwhile)
        finally:
            os.close(fd)  # releases the lock

    twin.compile = compile


def _load_without_refresh(twin) -> None:
    """Load ``twin``'s cached code without refreshing numba's target context first.

    numba refreshes the context before loading a cached function (installing every lowering
    and typing registry: importing most of numba's implementation modules, a fifth of a warm
    run's whole process), though loading and calling compiled code needs none of them; a
    compile refreshes it anyway (numba's compiler does, whatever happened before). Only this
    project's compiled rules load this way, and only where numba's cache has the methods this
    was checked against (tests/test_decode_runs.py runs both paths); elsewhere numba loads as
    it does."""
    cache = getattr(twin, "_cache", None)
    guard = getattr(cache, "_guard_against_spurious_io_errors", None)
    load = getattr(cache, "_load_overload", None)
    if guard is None or load is None:
        return

    def load_overload(sig, target_context):
        with guard():
            return load(sig, target_context)

    cache.load_overload = load_overload


class DirectCall:
    """A compiled rule called at its compiled entry point, past numba's per-call type dispatch.

    numba types every argument of every call; for the step's named tuples of arrays
    (sim/serving/step.py) that costs microseconds a call, several times a step's own work in a
    loop stepped from Python. Such a caller passes the same state object step after step, so the
    types are resolved once, and again whenever the first argument is another object (the state
    rebuilt as its arrays grew) or another argument's class changes (an int where a float was),
    and the call goes straight to the entry point compiled for them.
    """

    __slots__ = ("dispatcher", "_first", "_classes", "_entry")

    def __init__(self, dispatcher) -> None:
        self.dispatcher = dispatcher
        self._first = self._classes = self._entry = None

    def __call__(self, *args):
        if args[0] is self._first and tuple(map(type, args)) == self._classes:
            return self._entry(*args)
        result = self.dispatcher(*args)
        d = self.dispatcher
        overload = d.overloads.get(tuple(d.typeof_pyval(a) for a in args))
        if overload is not None:  # else (a signature numba matched by conversion): dispatch every call
            self._first, self._classes, self._entry = args[0], tuple(map(type, args)), overload.entry_point
        return result


def direct(fn: Callable) -> DirectCall | Callable:
    """``fn``'s compiled twin called as :class:`DirectCall` says: for a caller whose argument types never change.
    Under ``NUMBA_DISABLE_JIT=1`` numba hands back ``fn`` itself, which is then called as it is."""
    twin = compiled(fn)
    return DirectCall(twin) if hasattr(twin, "overloads") else twin
