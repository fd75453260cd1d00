"""Policies by name, or a user's own as ``module:Class``."""

from __future__ import annotations

import importlib
import inspect
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


def available_policies() -> list[str]:
    return sorted(BUILTIN)


def make_policy(name: str, params: dict[str, Any] | None = None) -> Policy:
    """Build a policy; unknown names or parameters raise :class:`PolicyError`."""
    cls = policy_class(name)
    params = dict(params or {})
    accepted = inspect.signature(cls).parameters  # not cls.__init__: object's takes *args, **kwargs
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    unknown = [key for key in params if key not in accepted and not takes_any]
    if unknown:
        raise PolicyError(f"policy '{name}' takes no parameter '{unknown[0]}'", field=unknown[0])
    try:
        policy = cls(**params)
    except TypeError as exc:
        raise PolicyError(f"policy '{name}': {exc}") from None
    if not isinstance(policy, Policy):
        raise PolicyError(f"'{name}' is not a subclass of policies.Policy", field="name")
    try:
        max_k = policy.max_k
    except NotImplementedError:
        max_k = None
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
    except ImportError as exc:
        raise PolicyError(f"cannot import module '{module_name}' for policy '{name}': {exc}", field="name") from None
    cls = getattr(module, class_name, None)
    if not (inspect.isclass(cls) and issubclass(cls, Policy)):
        raise PolicyError(f"'{name}' does not name a subclass of policies.Policy", field="name")
    return cls
