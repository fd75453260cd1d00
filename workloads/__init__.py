"""Workloads: who arrives when, with how many prompt and output tokens.

Everything here is generated from a seed with vectorised numpy and imports nothing
of ``sim`` or ``calibrate``: a workload is plain arrays (:class:`Requests`).
"""

from workloads.arrivals import gamma_arrivals, poisson_arrivals
from workloads.lengths import LengthSpec, parse_length_spec
from workloads.requests import Requests
from workloads.trace import TraceError, read_trace, write_trace

__all__ = [
    "LengthSpec",
    "Requests",
    "TraceError",
    "gamma_arrivals",
    "parse_length_spec",
    "poisson_arrivals",
    "read_trace",
    "write_trace",
]
