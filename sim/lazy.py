"""Modules imported on first use, so that a command pays only for what it touches.

pandas costs about 0.4 s to import, more than a small run; ``sim.costmodel.profile`` needs it to
read a profile's points, which a run whose fitted curves come from the cache
(:mod:`sim.costmodel.cache`) never does. :func:`lazy_module` is the standard library's recipe
(:class:`importlib.util.LazyLoader`): the module object exists at once and executes on
first attribute access; an already imported module is returned as it is.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy_module(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module
