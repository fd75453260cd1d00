"""Workloads: who arrives when, with how many prompt and output tokens.

Everything here is generated from a seed with vectorised numpy and imports nothing
of ``sim`` or ``calibrate``: a workload is plain arrays (:class:`Requests`).
"""

from workloads.arrivals import gamma_arrivals, poisson_arrivals
from workloads.lengths import LengthSpec, parse_length_spec
from workloads.requests import Requests
from workloads.trace import TraceError, read_trace, write_trace
from workloads.traffic import RateProfile, burstiness_from_cv, parse_rate_profile, profile_arrivals
from workloads.vllm_result import VllmResult, read_vllm_result

__all__ = [
    "LengthSpec",
    "RateProfile",
    "Requests",
    "TraceError",
    "VllmResult",
    "burstiness_from_cv",
    "gamma_arrivals",
    "parse_length_spec",
    "parse_rate_profile",
    "poisson_arrivals",
    "profile_arrivals",
    "read_trace",
    "read_vllm_result",
    "write_trace",
]
