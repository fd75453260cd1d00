"""specbatch for notebooks and scripts: simulate LLM serving with speculative decoding from Python.

    import specbatch
    result = specbatch.run(policy="goodput", rate=0.1, num_requests=50)
    result.summary["p99_ttft_ms"], result.requests, result.steps   # a dict, two DataFrames
    table = specbatch.sweep({"axes": {"rate": [0.05, 0.1], "policy": ["none", "goodput"]}})
    report = specbatch.capacity(slo={"p99_ttft_ms": 20000}, policies=["none", "goodput"])
    tuned = specbatch.tune(rate=20, num_requests=2000, objective="p99_tpot_ms")   # tuned.formats()["vllm"]
    specbatch.assert_no_regression("baseline.toml", policy=MyPolicy)              # in a team's pytest suite

Bad input raises :class:`InputError` with the CLI's one-line message. See docs/python-api.md.
This top-level module only re-exports :mod:`sim.commands.api`, where the API is implemented.
"""

from sim import __version__
from sim.commands.api import (CapacityReport, InputError, Run, RunWarning, assert_no_regression, capacity,
                              check_baseline, compare, compose, run, sweep, tune, validate)

__all__ = ["CapacityReport", "InputError", "Run", "RunWarning", "__version__", "assert_no_regression", "capacity",
           "check_baseline", "compare", "compose", "run", "sweep", "tune", "validate"]
