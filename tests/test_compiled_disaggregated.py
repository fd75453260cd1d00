"""A compiled disaggregated run (sim/serving/compiled_disaggregated.py) gives the SimPy run's records to the bit.

The SimPy run (sim/serving/clock.py ``simulate_disaggregated``) is the reference: each test runs the same
config twice, once as it runs (compiled, where it applies) and once with the compiled run refused, and
compares every record, the transfers' columns and the summary. Where it does not apply (llm-d's flow,
shared links, a policy stepped in Python), the SimPy run is what runs.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import sim.disaggregated as disaggregated
from sim.jit import numba_available
from sim.router import ROUTERS
from sim.serving import compiled_disaggregated
from sim.simulate import execute, prepare
from tests.test_decode_runs import assert_identical

pytestmark = pytest.mark.skipif(not numba_available(), reason="numba is not installed")

V1 = dict(engine__scheduler="vllm-v1", engine__max_batch_size=16, engine__max_num_batched_tokens=256,
          workload__prompt_tokens="uniform:16:300", workload__output_tokens="uniform:1:48", engine__jit="on",
          workload__num_requests=150, workload__rate=12.0)


def run_both(run_config, monkeypatch, compiled=True, **overrides):
    """(as it runs, SimPy) results of one config; fails unless the first ran compiled (``compiled``) or did not."""
    config = run_config(**{**V1, **overrides})
    ran = []
    run = compiled_disaggregated.CompiledDisaggregated.run
    with monkeypatch.context() as m:
        m.setattr(compiled_disaggregated.CompiledDisaggregated, "run", lambda self: (ran.append(1), run(self)))
        fast = execute(prepare(config))
    assert bool(ran) == compiled, "the run did not run compiled" if compiled else "the run ran compiled"
    with monkeypatch.context() as m:
        m.setattr(disaggregated, "compiled_disaggregated_for", lambda *args: None)
        slow = execute(prepare(config))
    return fast, slow


def assert_same_run(slow, fast) -> None:
    """Every record, the transfers' columns and the disaggregated summary, to the bit."""
    assert_identical(slow, fast)
    assert slow.requests.equals(fast.requests) and slow.steps.equals(fast.steps)
    assert json.dumps(slow.extra, sort_keys=True) == json.dumps(fast.extra, sort_keys=True)


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("prefill,decode,rate,seed", [(1, 1, 6.0, 0), (1, 3, 20.0, 1), (2, 2, 12.0, 2),
                                                      (3, 1, 8.0, 3)])
def test_the_compiled_run_is_the_simpy_run(run_config, monkeypatch, router, prefill, decode, rate, seed):
    fast, slow = run_both(run_config, monkeypatch, cluster__router=router, cluster__prefill_replicas=prefill,
                          cluster__decode_replicas=decode, workload__rate=rate, seed=seed)
    assert_same_run(slow, fast)


@pytest.mark.parametrize("overrides", [
    {"policy__name": "none"},
    {"policy__name": "goodput", "policy__k": None},  # each decode replica learns its own alpha, compiled
    {"engine__enable_prefix_caching": False},
    {"workload__shared_prefix": "64:4:64", "cluster__router": "prefix-aware"},  # cached blocks on both sides
    {"workload__shared_prefix": "64:4:64", "cluster__router": "least-tokens"},
    {"engine__kv_cache_tokens": 700},  # preemptions, held blocks, transfers waiting for blocks on both sides
    {"cluster__decode": "max_batch_size=2,kv_cache_tokens=900"},  # a tight decode pool: take waits
    {"cluster__prefill": "max_num_batched_tokens=64,max_batch_size=4"},
    {"cluster__kv_link_bandwidth_gb_s": 0.5},  # transfers queue on the links
    {"cluster__kv_link": "nvlink"},
    {"workload__rate": float("inf")},  # every request at 0: ties everywhere
    {"workload__output_tokens": "8", "workload__prompt_tokens": "16", "policy__name": "none"},  # steps end together
    # every slot of the fleet taken (a longer fleet is the same code at another tuple length, compiled on its own:
    # minutes of CPU a test run cannot spare)
    {"cluster__prefill_replicas": 3, "cluster__decode_replicas": 5},
    {"acceptance__distribution": "beta", "acceptance__concentration": 4.0},
    {"acceptance__model": "per-position", "acceptance__per_position": [0.8, 0.5, 0.3]},
    {"workload__num_requests": 1500, "workload__rate": 40.0},  # queues, records and the held store grow
])
def test_the_compiled_run_is_the_simpy_run_where_events_tie_or_room_runs_out(run_config, monkeypatch, overrides):
    base = dict(cluster__prefill_replicas=2, cluster__decode_replicas=2, cluster__router="least-requests")
    fast, slow = run_both(run_config, monkeypatch, **{**base, **overrides})
    assert_same_run(slow, fast)


def test_each_pool_on_its_own_profile(run_config, monkeypatch, tmp_path):
    """--decode-profile: the pools' step tables differ; the compiled run prices each pool by its own."""
    from tests.synthetic import linear_latency, make_profile

    faster = make_profile(tmp_path / "faster", lambda *point: 0.5 * linear_latency(*point))
    fast, slow = run_both(run_config, monkeypatch, cluster__prefill_replicas=1, cluster__decode_replicas=2,
                          cluster__decode_profile=str(faster), workload__rate=20.0)
    assert_same_run(slow, fast)


@pytest.mark.parametrize("overrides", [
    {"cluster__pd_threshold": 150},  # llm-d's decode-first flow
    {"cluster__kv_transfers": "shared"},
    {"policy__name": "adaptive", "policy__k": None},  # a policy stepped in Python
])
def test_what_does_not_compile_runs_in_simpy(run_config, monkeypatch, overrides):
    fast, slow = run_both(run_config, monkeypatch, compiled=False, cluster__prefill_replicas=2,
                          cluster__decode_replicas=2, **overrides)
    assert_same_run(slow, fast)


def test_the_transfers_are_the_simpy_runs(run_config, monkeypatch):
    """The transfers' own columns (where, when ready, allocated, started and ended) are there and match."""
    fast, slow = run_both(run_config, monkeypatch, cluster__prefill_replicas=2, cluster__decode_replicas=3,
                          cluster__kv_link_bandwidth_gb_s=1.0, workload__rate=30.0)
    req = fast.requests
    assert (req.kv_transfer_start_s > req.prefill_done_s).any()  # some queued
    assert np.isfinite(req.kv_transfer_end_s).all()
    for column in ("prefill_replica", "decode_replica", "prefill_done_s", "kv_blocks_allocated_s",
                   "kv_transfer_start_s", "kv_transfer_end_s", "kv_transfer_bytes"):
        assert np.array_equal(req[column].to_numpy(), slow.requests[column].to_numpy()), column
