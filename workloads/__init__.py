"""Workloads: who arrives when, with how many prompt and output tokens.

Everything here is generated from a seed with vectorised numpy and imports nothing
of ``sim`` or ``calibrate``: a workload is plain arrays (:class:`Requests`).
"""

import importlib

# Each name, from the module that defines it, imported on first use (PEP 562): a module that needs one
# submodule (sim.errors: workloads.files) does not load numpy with the rest, and ``specbatch --help``
# stays quick.
_HOME = {
    "gamma_arrivals": "arrivals", "poisson_arrivals": "arrivals",
    "LengthSpec": "lengths", "parse_length_spec": "lengths",
    "Requests": "requests",
    "TraceError": "trace", "read_trace": "trace", "write_trace": "trace",
    "RateProfile": "traffic", "burstiness_from_cv": "traffic", "parse_rate_profile": "traffic",
    "profile_arrivals": "traffic",
    "VllmResult": "vllm_result", "read_vllm_result": "vllm_result",
}


def __getattr__(name: str):
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'workloads' has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(f"workloads.{home}"), name)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))


__all__ = sorted(_HOME)
