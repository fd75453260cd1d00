"""Every speculation method gives the same bytes interpreted (``engine.jit = off``) and compiled: the
proposal rule, a head's lag, goodput's learning of a matcher's misses and the run-length model are
rules both paths call (sim/speculation/proposals.py), so the compiled runs (sim/serving/kernel.py) must agree."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.config import load_config
from sim.jit import numba_available
from sim.simulate import execute, prepare
from tests.conftest import CPU_DEFAULTS
from tests.synthetic import make_profile
from tests.test_decode_runs import assert_identical

pytestmark = pytest.mark.skipif(not numba_available(), reason="numba is not installed")


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    return make_profile(tmp_path_factory.mktemp("profiles") / "methods", batch=(1, 2, 4, 8),
                        drafters=("eagle3", "medusa", "ngram"))


def _both(profile, **overrides):
    out = []
    for jit in ("off", "on"):
        flags = {"profile": (str(profile), "--profile"), "engine.jit": (jit, "--jit")}
        flags.update({key.replace("__", "."): (value, f"--{key}") for key, value in overrides.items()})
        out.append(execute(prepare(load_config(CPU_DEFAULTS, flags))))
    return out


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(["eagle3", "medusa", "ngram"]), scheduler=st.sampled_from(["v0", "vllm-v1"]),
       policy=st.sampled_from(["fixed", "goodput", "none"]), rate=st.sampled_from([1.0, 20.0, float("inf")]),
       max_batch=st.integers(1, 8), seed=st.integers(0, 3))
def test_methods_are_identical_compiled(profile, method, scheduler, policy, rate, max_batch, seed):
    params = {"policy__name": policy}
    if policy == "goodput":
        params.update(policy__k_max=3, policy__smoothing=0.5)
    elif policy == "fixed":
        params["policy__k"] = 3
    off, on = _both(profile, speculative__config={"method": method, "num_speculative_tokens": 3},
                    engine__scheduler=scheduler, engine__max_batch_size=max_batch, workload__num_requests=40,
                    workload__rate=rate, workload__output_tokens="uniform:1:60",
                    workload__prompt_tokens="uniform:8:200", seed=seed, **params)
    assert_identical(off, on)


def test_runlength_is_identical_with_rules_compiled(profile, tmp_path):
    path = tmp_path / "runs.jsonl"
    rng = np.random.default_rng(0)
    path.write_text("".join(json.dumps({"prompt_tokens": int(rng.integers(8, 100)),
                                        "ngram": rng.integers(1, 6, size=int(rng.integers(5, 60))).tolist()}) + "\n"
                            for _ in range(20)))
    off, on = _both(profile, speculative__config={"method": "ngram", "num_speculative_tokens": 3},
                    acceptance__model="runlength", acceptance__trace=str(path), acceptance__proposer="ngram",
                    acceptance__trace_lengths=True, workload__num_requests=40, workload__rate=20.0,
                    policy__name="goodput", policy__k_max=3)
    assert_identical(off, on)
