"""specbatch for notebooks and scripts: simulate LLM serving with speculative decoding from Python.

    import specbatch
    result = specbatch.run(policy="goodput", rate=0.1, num_requests=50)
    result.summary["p99_ttft_ms"], result.requests, result.steps   # a dict, two DataFrames
    table = specbatch.sweep({"axes": {"rate": [0.05, 0.1], "policy": ["none", "goodput"]}})
    report = specbatch.capacity(slo={"p99_ttft_ms": 20000}, policies=["none", "goodput"])
    tuned = specbatch.tune(rate=20, num_requests=2000, objective="p99_tpot_ms")   # tuned.formats()["vllm"]
    specbatch.assert_no_regression("baseline.toml", policy=MyPolicy)              # in a team's pytest suite

Bad input raises :class:`InputError` with the CLI's one-line message. See docs/python-api.md.

The package holds what users run: the commands (:mod:`specbatch.commands`, the CLI and this
API, in :mod:`specbatch.commands.api`) over the simulator's core (``sim``). The API's names are
loaded when first used, so that the ``specbatch`` command starts without importing them.
"""

from sim import __version__

__all__ = ["CapacityReport", "InputError", "Run", "RunWarning", "__version__", "assert_no_regression", "capacity",
           "check_baseline", "compare", "compose", "run", "sweep", "tune", "validate"]


def __getattr__(name: str):
    if name in __all__:
        from specbatch.commands import api

        return getattr(api, name)
    raise AttributeError(f"module 'specbatch' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
