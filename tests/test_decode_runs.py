"""Compiled runs (sim.serving.compiled) give the step-by-step loop's results to the bit.

``engine.jit = off`` interprets every rule step by step in Python; ``on`` runs the same rules
compiled, in compiled runs wherever they apply. The two must agree on every record, under both
schedulers (vllm-v1 with preemption and prefix caching included).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.jit import numba_available
from sim.serving import compiled
from sim.simulate import execute, prepare
from tests.synthetic import make_profile

pytestmark = pytest.mark.skipif(not numba_available(), reason="numba is not installed")


@pytest.fixture(scope="module")
def lagging_profile(tmp_path_factory):
    """The draft's catch-up has a price (it measured several query lengths), so lags > 2 cost more."""
    return make_profile(tmp_path_factory.mktemp("profiles") / "lagging", draft_q_max=6, batch=(1, 2, 4, 8))


def _both(run_config, **overrides):
    results = []
    for jit in ("off", "on"):
        results.append(execute(prepare(run_config(engine__jit=jit, **overrides))))
    return results


def _text(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)  # NaN == NaN here


def assert_identical(off, on):
    assert _text(off.summary) == _text(on.summary)
    assert list(off.step_columns) == list(on.step_columns)
    for name, column in off.step_columns.items():
        assert column.dtype == on.step_columns[name].dtype, name
        assert np.array_equal(column, on.step_columns[name]), name
    for name, column in off.request_columns.items():
        assert np.array_equal(column, on.request_columns[name], equal_nan=column.dtype.kind == "f"), name
    assert _text(off.spec_decode) == _text(on.spec_decode)
    assert _text(off.replicas) == _text(on.replicas)


# SGLang's ladder per batch-size slot, moving at every verify after two (its defaults wait 10, then every 5)
SGLANG_SLOTS = ('{"1": [1, 2], "3": {"steps": [1, 3, 5], "up_hysteresis": 0.1}, "warmup_batches": 2, '
                '"update_interval": 1, "ema_alpha": 0.5}')
# k by batch size and mean context: the runs below reach contexts of a few hundred tokens, and a gap (batch 4)
CONTEXT_TABLE = [[1, 3, 0, 100, 3], [1, 3, 101, 100000, 1], [5, 256, 0, 150, 2], [5, 256, 151, 100000, 0]]
POLICIES = [{"policy__name": "fixed", "policy__k": 3}, {"policy__name": "fixed", "policy__k": 1},
            {"policy__name": "none"}, {"policy__name": "lut", "policy__table": [[1, 2, 3], [3, 4, 0], [5, 256, 2]]},
            {"policy__name": "goodput", "policy__k": None},
            {"policy__name": "goodput", "policy__k": None, "policy__k_max": 3, "policy__smoothing": 0.5,
            "policy__alpha_init": 0.3, "policy__tie_break": 0.05},
            {"policy__name": "sglang-adaptive", "policy__k": None},
            {"policy__name": "sglang-adaptive", "policy__k": None, "policy__adaptive_config": SGLANG_SLOTS},
            {"policy__name": "context", "policy__table": CONTEXT_TABLE},
            {"policy__name": "trtllm-schedule", "policy__draft_len_schedule": '{"2": 3, "5": 1}'},
            {"policy__name": "vllm-dynamic", "policy__speculative_config":
             '{"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 2, 3], [3, 256, 1]]}'}]
ACCEPTANCE = [{}, {"acceptance__distribution": "beta", "acceptance__concentration": 4.0},
              {"acceptance__model": "per-position", "acceptance__per_position": [0.8, 0.5, 0.3]},
              {"acceptance__alpha": 0.97}]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(policy=st.sampled_from(POLICIES), acceptance=st.sampled_from(ACCEPTANCE),
       batching=st.sampled_from(["continuous", "static"]), replicas=st.sampled_from([1, 1, 2, 3]),
       router=st.sampled_from(["round-robin", "least-requests", "least-tokens"]),
       rate=st.sampled_from([0.5, 3.0, 30.0, float("inf")]), max_batch=st.integers(1, 8),
       kv=st.sampled_from([None, 600, 3000]), seed=st.integers(0, 3))
def test_decode_runs_change_nothing(run_config, policy, acceptance, batching, replicas, router, rate, max_batch, kv,
                                    seed):
    """v0: every record, the summary and the speculation counters, whatever the policy, acceptance
    model, batching, cluster, load and KV pressure (requests waiting while rows finish)."""
    overrides = dict(workload__num_requests=60, workload__rate=rate, engine__batching=batching,
                     engine__max_batch_size=max_batch, cluster__replicas=replicas, cluster__router=router,
                     workload__output_tokens="uniform:1:60", workload__prompt_tokens="uniform:8:200", seed=seed,
                     **policy, **acceptance)
    if kv is not None:
        overrides["engine__kv_cache_tokens"] = kv
    off, on = _both(run_config, **overrides)
    assert_identical(off, on)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(policy=st.sampled_from(POLICIES), acceptance=st.sampled_from(ACCEPTANCE), replicas=st.sampled_from([1, 1, 2]),
       rate=st.sampled_from([0.5, 3.0, 30.0, float("inf")]), max_batch=st.integers(1, 8),
       kv=st.sampled_from([None, 480, 1600]), budget=st.sampled_from([8, 64, 512]),
       block=st.sampled_from([1, 16]), prompts=st.sampled_from([None, 3, 40]), caching=st.booleans(),
       chunked=st.booleans(), asynchronous=st.booleans(), seed=st.integers(0, 3))
def test_v1_runs_change_nothing(run_config, tmp_path_factory, policy, acceptance, replicas, rate, max_batch, kv,
                                budget, block, prompts, caching, chunked, asynchronous, seed):
    """vllm-v1: the same, with budgets that cut speculation, preemption under KV pressure and prefix
    caching over repeated prompts (a trace with prompt ids)."""
    overrides = dict(workload__num_requests=60, workload__rate=rate, engine__scheduler="vllm-v1",
                     engine__max_batch_size=max_batch, engine__max_num_batched_tokens=max(budget, max_batch),
                     engine__block_size=block, engine__enable_prefix_caching=caching,
                     engine__chunked_prefill=chunked, engine__async_scheduling=asynchronous, cluster__replicas=replicas,
                     workload__output_tokens="uniform:1:60", workload__prompt_tokens="uniform:8:200", seed=seed,
                     **policy, **acceptance)
    if not chunked:
        overrides["engine__max_num_batched_tokens"] = max(overrides["engine__max_num_batched_tokens"], 600)
    if kv is not None:
        overrides["engine__kv_cache_tokens"] = kv
    if prompts is not None:  # the same prompts sent again, behind a shared system prompt
        trace = tmp_path_factory.mktemp("trace") / "prompts.csv"
        rng = np.random.default_rng(seed)
        ids = rng.integers(0, prompts, 60)
        lengths = 40 + 7 * ids
        arrivals = np.cumsum(rng.exponential(1 / min(rate, 100.0), 60))
        rows = ["arrival_s,prompt_tokens,output_tokens,prompt_id,prefix_id,prefix_tokens"]
        rows += [f"{float(a)!r},{p},{o},{i},0,24" for a, p, o, i in zip(arrivals, lengths, rng.integers(1, 60, 60), ids)]
        trace.write_text("\n".join(rows) + "\n")
        overrides["workload__trace"] = str(trace)
    off, on = _both(run_config, **overrides)
    assert_identical(off, on)


def test_lags_beyond_two_are_priced_alike(run_config, lagging_profile):
    """A table that alternates k = 0 and k > 0 with the batch size lets the draft lag several tokens."""
    off, on = _both(run_config, profile=str(lagging_profile), workload__num_requests=300, workload__rate=40.0,
                    engine__max_batch_size=8, policy__name="lut", policy__table=[[1, 2, 3], [3, 5, 0], [6, 8, 4]],
                    workload__output_tokens="uniform:20:120")
    assert_identical(off, on)
    steps = off.step_columns
    assert {0, 3, 4} <= set(np.unique(steps["k"]).tolist())


def test_long_runs_refill_draws_and_record_room(run_config, monkeypatch):
    """Runs longer than a kernel call's room (records, gaps, the draw block) resume where they stopped."""
    monkeypatch.setattr(compiled, "RECORD_ROOM", 7)
    monkeypatch.setattr(compiled, "ITL_ROOM", 5)
    from sim.speculation import acceptance
    monkeypatch.setattr(acceptance, "DRAW_BLOCK", 37)
    off, on = _both(run_config, workload__num_requests=400, workload__rate=2.0, engine__max_batch_size=16,
                    workload__output_tokens="uniform:50:400", policy__name="fixed", policy__k=4)
    assert_identical(off, on)


def _learns_alike(run_config, **overrides):
    """A learning policy's run interpreted and compiled: every record, and the policy object's state after
    the run (``state_arrays``: a run can go on step by step from it), the same to the bit."""
    from sim.serving.loop import ServingLoop

    states = []
    original = ServingLoop.records

    def keep_state(self):
        states.append([array.tolist() for array in self.policy.state_arrays()])
        return original(self)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(ServingLoop, "records", keep_state)
        off, on = _both(run_config, workload__num_requests=300, workload__rate=40.0, engine__max_batch_size=8,
                        policy__k=None, workload__output_tokens="uniform:20:120", **overrides)
    assert_identical(off, on)
    assert states[0] == states[1]
    decoding = on.step_columns["batch_size"] > 0
    assert len(set(on.step_columns["k"][decoding].tolist())) > 1  # it did choose, not sit at one k


def test_goodput_learns_in_the_kernel_as_it_does_in_python(run_config, lagging_profile):
    """goodput's choices and estimates, stepped in the kernel, are the policy's own."""
    _learns_alike(run_config, policy__name="goodput")
    _learns_alike(run_config, policy__name="goodput", profile=str(lagging_profile))


def test_sglangs_ladder_moves_in_the_kernel_as_it_does_in_python(run_config):
    """SGLang's adaptive controller, its ladders moved in the kernel, on one ladder and per batch-size slot."""
    _learns_alike(run_config, policy__name="sglang-adaptive", acceptance__alpha=0.6)
    _learns_alike(run_config, policy__name="sglang-adaptive", acceptance__alpha=0.6,
                  policy__adaptive_config=SGLANG_SLOTS)


def test_which_policies_run_compiled(run_config):
    from policies.fixed import FixedK
    from policies.goodput import Goodput
    from policies.context import ContextTable
    from policies.sglang_adaptive import SglangAdaptive
    from policies.trtllm_schedule import TrtllmSchedule
    from policies.vllm_dynamic import VllmDynamic

    class Peeking(FixedK):  # overrides choose_k but not k_by_batch_size: not trusted with the table
        def choose_k(self, view):
            return 0 if view.mean_context_tokens > 300 else self.k

    class Learning(FixedK):
        def observe(self, feedback):
            pass

    assert compiled.policy_form(FixedK(2), 4, 4).k_by_batch.tolist() == [2] * 5
    assert compiled.policy_form(Peeking(2), 4, 4) is None
    assert compiled.policy_form(Learning(2), 4, 4) is None
    assert compiled.policy_form(Goodput(), 4, 4) is None
    assert compiled.policy_form(SglangAdaptive(), 4, 7).k_by_batch.tolist() == [0] * 5
    assert compiled.policy_form(SglangAdaptive({"2": [1], "4": [2, 3]}), 4, 7).k_by_batch.tolist() == [0, 0, 0, 0, 1]
    assert compiled.policy_form(SglangAdaptive(), 4, 6) is None  # its ladder's 7 is beyond the run's k_max
    context = compiled.policy_form(ContextTable(CONTEXT_TABLE), 6, 7)  # columns: bands from batch 1, 4, 5, 257
    assert context.k_by_batch.tolist() == [0, 0, 0, 0, 1, 2, 2] and context.scalars.tolist() == [0, 101, 151, 100001]
    assert compiled.policy_form(ContextTable(CONTEXT_TABLE), 6, 2) is None  # its k = 3 is beyond the run's k_max
    # the engines' own schedules by batch size: TensorRT-LLM's up to each key, vLLM's by range
    assert compiled.policy_form(TrtllmSchedule({2: 3, 5: 1}), 6, 7).k_by_batch.tolist() == [3, 3, 3, 1, 1, 1, 0]
    vllm = VllmDynamic({"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 2, 3], [3, 4, 1]]})
    assert compiled.policy_form(vllm, 6, 7).k_by_batch.tolist() == [3, 3, 3, 1, 1, 1, 1]


def test_what_does_not_run_compiled(run_config, monkeypatch):
    """A timeline's reasons, per-request speculation metrics, a concurrency limit, a learning policy
    other than goodput and SGLang's ladder, or goodput per request: step by step (a compiled run would
    raise here); the static tables, by batch size or by batch size and context, compiled."""
    def refuse(self, now, stop_at):
        raise AssertionError("a compiled decode run")

    base = dict(workload__num_requests=30, workload__rate=5.0, engine__jit="on", policy__name="fixed", policy__k=2)
    execute(prepare(run_config(**base, engine__max_batch_size=4)))  # it does run compiled ...
    monkeypatch.setattr(compiled.CompiledRuns, "run", refuse)
    for runs in ({}, {"policy__name": "goodput", "policy__k": None}, {"engine__scheduler": "vllm-v1"},
                 {"policy__name": "sglang-adaptive", "policy__k": None},
                 {"policy__name": "context", "policy__k": None, "policy__table": CONTEXT_TABLE}):
        with pytest.raises(AssertionError, match="compiled"):
            execute(prepare(run_config(**{**base, **runs})))
    for extra in ({"output__per_request_spec_decode_metrics": "summary"}, {"workload__max_concurrency": 4},
                  {"policy__name": "adaptive", "policy__k": None},
                  {"policy__name": "goodput", "policy__k": None, "policy__per_request": True},
                  {"output__timeline": "timeline.html"}):
        execute(prepare(run_config(**{**base, **extra})))  # ... and these do not


def test_auto_compiles_when_numba_is_there():
    from sim.jit import wants_compiled

    assert wants_compiled("auto") and wants_compiled("on") and not wants_compiled("off")


def test_goodputs_choice_in_the_kernel_is_the_policys_on_exact_ties_too():
    """The kernel's argmax against Goodput.choose_k on one table: random prices, lags and contexts,
    and prices that make every k's goodput exactly equal (the tie goes to the smallest k, as the
    policy's docstring says; a >= in place of > would give k_max)."""
    from policies.base import BatchView
    from policies.goodput import Goodput
    from sim.costmodel.model import StepTable
    from sim.jit import compiled as compile_rule
    from sim.serving import kernel, step
    from sim.serving.priced import prices_of
    from sim.scheduler.layout import N_COUNTERS, ROW_INTS, ROW_LAG

    choose = compile_rule(kernel.choose)
    rng = np.random.default_rng(3)
    k_max, batches, columns, lags = 4, 5, 6, 4
    tied = np.broadcast_to((np.arange(k_max + 1) + 1.0)[None, :, None] * 2.0 ** -6, (batches, k_max + 1, columns))
    for decode in (rng.uniform(0.01, 0.05, (batches, k_max + 1, columns)), tied):
        table = StepTable.from_arrays({
            "decode": decode, "decode_lag2": decode, "prefill": np.ones((batches, columns)),
            "catch_up": rng.uniform(0.0, 0.01, (batches, lags, columns)) * (decode is not tied),
            "context_step": 10.0, "prompt_step": 10.0, "max_batch": batches - 1, "k_max": k_max,
            "chunk_step": 1.0, "prefill_overhead": 0.0})
        policy = Goodput(alpha_init=0.999999, k_max=k_max) if decode is tied else Goodput(k_max=k_max)
        policy.bind(k_max, table)
        scalars, rows = policy.state_arrays()
        if decode is tied:  # E[tokens](k) = k + 1, so tokens per second is the same for every k
            rows[3] = np.arange(k_max + 1) + 1.0
        view = BatchView(k_max)
        engine_rows, ctr = np.zeros((ROW_INTS, 8), dtype=np.int64), np.zeros(N_COUNTERS, dtype=np.int64)
        none, no_ints = np.zeros((1, 1)), np.zeros(1, np.int64)
        state = step.Replica(step.Batch(engine_rows, none, no_ints, no_ints, np.zeros(1, np.bool_)),
                             step.Requests(np.zeros((1, 1), np.int64), none[0], np.zeros((1, 1), np.int64), none),
                             step.Blocks(np.zeros((1, 1), np.int64), no_ints, no_ints, np.zeros((1, 1), np.int64), no_ints),
                             ctr, none[0], np.zeros((1, 1), np.int64), no_ints, True, 1)
        chooser = kernel.Chooser(kernel.GOODPUT_K, no_ints, scalars, rows, True, k_max, np.zeros(k_max + 1),
                                 np.zeros((2, k_max + 2), np.int64))
        for _ in range(200):
            b, lag = int(rng.integers(1, batches)), int(rng.integers(1, lags + 2))
            total = int(rng.integers(0, 60 * b))
            view.batch_size, view.mean_context_tokens = b, total / b
            engine_rows[ROW_LAG, :b] = 1
            engine_rows[ROW_LAG, b - 1] = lag
            view.lag_tokens = engine_rows[ROW_LAG, :b]
            expected = policy.choose_k(view)
            got = choose(state, prices_of(table), chooser, b, b, total / b)
            assert got == expected
            if decode is tied:
                assert got == 0


def test_backends_and_samplers_say_whether_a_compiled_run_can_stand_in_for_them():
    """No type checks in the engine: a priced backend or a sampler that changes how a step is executed
    or drawn is run step by step unless it declares otherwise; the built-ins say what they are."""
    from sim.speculation.acceptance import (AcceptanceSampler, PositionSampler, RunLengthSampler, SharedAlphaSampler,
                                TraceSampler)
    from sim.serving.priced import PricedBackend
    from sim.serving.recorded import RecordedBackend

    assert PricedBackend.steps_compiled and not RecordedBackend.steps_compiled
    assert all(c.draws_compiled for c in (AcceptanceSampler, SharedAlphaSampler, PositionSampler))
    assert not TraceSampler.draws_compiled and not RunLengthSampler.draws_compiled

    class Timed(PricedBackend):
        def run(self, plan):
            return super().run(plan)

    class Relabelled(PricedBackend):  # changes nothing a step does
        name = "relabelled"

    class Vouched(Timed):
        steps_compiled = True

    class OwnDraws(SharedAlphaSampler):
        def accepted(self, scale, k):
            return super().accepted(scale, k)

    assert not Timed.steps_compiled and Relabelled.steps_compiled and Vouched.steps_compiled
    assert not OwnDraws.draws_compiled


def test_a_direct_call_resolves_the_types_again_when_an_argument_changes_class_or_the_state_object():
    """sim.jit.DirectCall skips numba's dispatch only while the state object and every argument's class
    are those it resolved: an int where a float was (SimPy's clock starts at int 0), or a new state
    tuple (arrays grown), is typed afresh, never unboxed as the old type."""
    from sim.jit import direct

    def scaled(state, x):
        state.values[0] = x * state.factor
        return state.values[0]

    from collections import namedtuple
    State = namedtuple("State", "values factor")
    call = direct(scaled)
    a = State(np.zeros(1), 2.0)
    assert call(a, 0) == 0.0  # compiled for an int x
    assert call(a, 0.75) == 1.5  # a float: resolved again, not truncated to 0
    assert call(a, 1.25) == 2.5  # ... and called directly from then on
    b = State(np.zeros(1), 3.0)
    assert call(b, 1.25) == 3.75 and a.values[0] == 2.5  # another state object: its own arrays
