"""Policies by name, or a user's own as ``module:Class``.

A user's policy is code we did not write: whatever it raises (a syntax error, at import, in
``__init__``, in ``max_k``, or in ``choose_k`` in the middle of a run) is answered with one
line naming the policy, the method and the plugin's file and line (:func:`plugin_failure`);
``specbatch --debug`` shows the traceback.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import traceback
from typing import Any

from policies.adaptive import Adaptive
from policies.base import Policy, PolicyError
from policies.context import ContextTable
from policies.fixed import FixedK
from policies.goodput import Goodput
from policies.lut import LookupTable
from policies.none import NoSpeculation
from policies.sglang_adaptive import SglangAdaptive
from policies.trtllm_schedule import TrtllmSchedule
from policies.vllm_dynamic import VllmDynamic

BUILTIN: dict[str, type[Policy]] = {cls.name: cls for cls in (NoSpeculation, FixedK, LookupTable, Goodput,
                                                                  ContextTable, Adaptive, VllmDynamic,
                                                                  SglangAdaptive, TrtllmSchedule)}

_PLUGIN_FILES: dict[str, str] = {}  # source file of an imported user policy -> its policy name


def available_policies() -> list[str]:
    return sorted(BUILTIN)


def make_policy(name: str, params: dict[str, Any] | None = None) -> Policy:
    """Build a policy; unknown names or parameters raise :class:`PolicyError`."""
    cls = policy_class(name)
    params = dict(params or {})
    # not cls.__init__: object's takes *args, **kwargs; and a class with neither its own __init__ nor __new__
    # takes nothing (inspect would parse object's text signature for it, a few milliseconds of a short run)
    plain = cls.__init__ is object.__init__ and cls.__new__ is object.__new__
    accepted = {} if plain else inspect.signature(cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    unknown = [key for key in params if key not in accepted and not takes_any]
    if unknown:
        raise PolicyError(f"policy '{name}' takes no parameter '{unknown[0]}'", field=unknown[0])
    try:
        policy = cls(**params)
    except PolicyError:
        raise
    except TypeError as exc:
        if name in BUILTIN or not _raised_inside_plugin(exc):  # a wrong parameter, not a bug inside
            raise PolicyError(f"policy '{name}': {exc}") from None
        raise PolicyError(_raised(name, "__init__", exc), field="name") from exc
    except Exception as exc:  # noqa: BLE001 - a user's policy: any exception is one line
        raise PolicyError(_raised(name, "__init__", exc), field="name") from exc
    if not isinstance(policy, Policy):
        raise PolicyError(f"'{name}' is not a subclass of policies.Policy", field="name")
    try:
        max_k = policy.max_k
    except NotImplementedError:
        max_k = None
    except Exception as exc:  # noqa: BLE001
        raise PolicyError(_raised(name, "max_k", exc), field="name") from exc
    if isinstance(max_k, bool) or not isinstance(max_k, int) or max_k < 0:
        raise PolicyError(f"policy '{name}' must define max_k, the largest k it may return, as a whole "
                          f"number >= 0 (got {max_k!r})", field="name")
    return policy


def policy_class(name: str) -> type[Policy]:
    """The class a policy name stands for (built in, or ``module:Class`` imported); PolicyError if none."""
    if name in BUILTIN:
        return BUILTIN[name]
    if ":" not in name:
        raise PolicyError(f"unknown policy '{name}' (built in: {', '.join(available_policies())}; "
                          "or give your own as module:Class)", field="name")
    module_name, _, class_name = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise PolicyError(f"cannot import module '{module_name}' for policy '{name}': {exc}", field="name") from None
    except SyntaxError as exc:
        raise PolicyError(f"policy '{name}': syntax error in {exc.filename}:{exc.lineno}: {exc.msg}",
                          field="name") from exc
    except Exception as exc:  # noqa: BLE001 - importing runs the user's module
        raise PolicyError(_raised(name, f"importing module '{module_name}'", exc), field="name") from exc
    cls = getattr(module, class_name, None)
    if not (inspect.isclass(cls) and issubclass(cls, Policy)):
        raise PolicyError(f"'{name}' does not name a subclass of policies.Policy", field="name")
    source = getattr(module, "__file__", None)
    if source:
        _PLUGIN_FILES[os.path.realpath(source)] = name
    return cls


def _raised(name: str, where: str, exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    inside = [f for f in frames if os.path.realpath(f.filename) in _PLUGIN_FILES] or frames[-1:]
    at = f" (at {inside[-1].filename}:{inside[-1].lineno})" if inside else ""
    if not inside and isinstance(exc, SyntaxError):
        at = f" (at {exc.filename}:{exc.lineno})"
    where = where if where.startswith("importing") else f"in {where}"
    return f"policy '{name}' raised {type(exc).__name__} {where}: {exc}{at}"


def _raised_inside_plugin(exc: BaseException) -> bool:
    """True when a TypeError comes from inside the user's code rather than from calling it wrongly."""
    return any(os.path.realpath(f.filename) in _PLUGIN_FILES for f in traceback.extract_tb(exc.__traceback__)[1:])


_REMOTE_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def plugin_failure(exc: BaseException) -> str | None:
    """One line for an exception a user's policy raised during a run (in this process or, through the
    pool's remote traceback, in a worker), naming the policy, the method we called and its file and line;
    None when no user policy is on the traceback (then it is our bug, and the traceback is for us).
    The chain of causes is searched too: SimPy re-raises a process's exception as a copy caused by it."""
    link, seen = exc, set()
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        frames = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(link.__traceback__)]
        if type(link).__name__ == "_RemoteTraceback":  # concurrent.futures' text of a worker's traceback
            frames = [(file, int(line), func) for file, line, func in _REMOTE_FRAME.findall(str(link))]
        inside = [frame for frame in frames if os.path.realpath(frame[0]) in _PLUGIN_FILES]
        if inside:
            name = _PLUGIN_FILES[os.path.realpath(inside[0][0])]
            return (f"policy '{name}' raised {type(exc).__name__} in {inside[0][2]}: {exc} "
                    f"(at {inside[-1][0]}:{inside[-1][1]})")
        link = link.__cause__ or link.__context__
    return None
