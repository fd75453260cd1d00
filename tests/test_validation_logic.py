"""The logic check's playback (sim.serving.recorded) and the validation's statistics, without torch.

A priced simulation is its own perfect "replay": its steps, played back through the
RecordedBackend, must give the simulation again, bit for bit, whatever the batching and
policy; a step that differs from the record is named.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbatch.commands.fidelity import equivalence_test, noise_floor, pooled_summary, step_cost_summary
from sim.serving.priced import PricedBackend
from sim.serving.queues import arrival_queue
from sim.serving.recorded import LogicDivergence, RecordedBackend, RecordedSteps
from sim.serving.records import DECODE, PREFILL
from sim.simulate import execute, make_sampler, prepare


class Spy(PricedBackend):
    """The simulator's own backend, keeping each step's accepted counts per row (as the replay does)."""

    def __init__(self, run):
        super().__init__(run.table, make_sampler(run.config, run.alphas))
        self.accepted: list = []

    def run(self, plan):
        dt, accepted = super().run(plan)
        self.accepted.append(None if accepted is None else accepted.copy())
        return dt, accepted


def recorded(result, accepted) -> RecordedSteps:
    """A simulation's steps as a replay would have recorded them: the loop reads its clock when a
    step starts, when it ends, and when it finds nothing to do (then sleeps to the next arrival)."""
    steps = result.steps
    readings, top = [0.0], 0.0
    for start, end in zip(steps.start_s.tolist(), steps.end_s.tolist()):
        if start != top:  # it slept: the next look at the clock found the arrival
            readings.append(start)
        readings += [end, end]  # the step's end, and the loop's next look (no time passes in between)
        top = end
    return RecordedSteps.from_replay(steps, np.array(readings), accepted)


def simulated(run_config, **overrides):
    run = prepare(run_config(**overrides))
    spy = Spy(run)
    return run, execute(run, backend=spy), spy


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batching=st.sampled_from(["continuous", "static"]), policy=st.sampled_from(["none", "fixed", "goodput"]),
       rate=st.sampled_from([0.5, 4.0, 40.0]), seed=st.integers(0, 50), limit=st.sampled_from([None, None, 2, 5]))
def test_a_simulation_played_back_is_the_simulation(run_config, batching, policy, rate, seed, limit):
    overrides = {"engine__batching": batching, "policy__name": policy, "workload__rate": rate, "seed": seed,
                 "workload__num_requests": 40, "engine__max_batch_size": 8, "workload__max_concurrency": limit,
                 "workload__prompt_tokens": "uniform:8:64", "workload__output_tokens": "uniform:1:40"}
    if policy == "fixed":
        overrides["policy__k"] = 3
    run, original, spy = simulated(run_config, **overrides)
    backend = RecordedBackend(recorded(original, spy.accepted))
    played = execute(prepare(run.config), backend=backend)
    backend.check_done()
    # Every decision is the same and every count exact; times agree to float rounding only: the clock
    # wakes at an arrival as now + (arrival - now), which may sit one ulp off the arrival the
    # playback starts that step from.
    for column in ("accepted_tokens", "drafted_tokens"):
        np.testing.assert_array_equal(played.requests[column], original.requests[column], err_msg=column)
    for column in ("first_token_s", "finish_s", "scheduled_s"):
        np.testing.assert_allclose(played.requests[column], original.requests[column], rtol=1e-12, err_msg=column)
    np.testing.assert_allclose(played.steps.end_s, original.steps.end_s, rtol=1e-12)
    assert played.summary.keys() == original.summary.keys()
    for key, value in original.summary.items():
        assert played.summary[key] == pytest.approx(value, rel=1e-9, nan_ok=True), key


def test_the_first_different_decision_is_named(run_config):
    run, original, spy = simulated(run_config, **{"policy__name": "fixed", "policy__k": 3, "workload__rate": 20.0,
                                                  "workload__num_requests": 20, "engine__max_batch_size": 4})
    steps = recorded(original, spy.accepted)
    decode = int(np.flatnonzero(steps.phase == DECODE)[3])
    k = steps.k.copy()
    k[decode] = 2  # the replay "ran" k = 2 where the policy says 3
    bad = RecordedSteps(steps.phase, steps.batch, k, steps.until_s, steps.idle_before, steps.accepted)
    with pytest.raises(LogicDivergence, match=f"step {decode}: the simulation runs a decode of .* at k = 3, "
                                              f"the replay ran .* at k = 2"):
        execute(prepare(run.config), backend=RecordedBackend(bad))
    short = RecordedSteps(*(getattr(steps, f)[:-1] for f in ("phase", "batch", "k", "until_s", "idle_before")),
                          steps.accepted[:-1])
    with pytest.raises(LogicDivergence, match="a step more than the replay's"):
        execute(prepare(run.config), backend=RecordedBackend(short))


def test_time_is_played_back_absolutely_from_the_replays_clock(run_config):
    # Each step ends at the replay's next clock reading (its end plus the loop's work after it);
    # a step after an idle spell starts at the arrival that woke the replica.
    run, original, spy = simulated(run_config, **{"policy__name": "none", "workload__rate": 0.5,
                                                  "workload__num_requests": 10})
    steps = recorded(original, spy.accepted)
    assert steps.idle_before.sum() >= 2 and steps.phase[steps.idle_before].tolist() == [PREFILL] * int(
        steps.idle_before.sum())
    late = RecordedSteps(steps.phase, steps.batch, steps.k, steps.until_s + 0.002, steps.idle_before, steps.accepted)
    played = execute(prepare(run.config), backend=RecordedBackend(late))
    np.testing.assert_allclose(played.steps.end_s, original.steps.end_s + 0.002, rtol=0, atol=1e-12)
    np.testing.assert_allclose(played.requests.finish_s, original.requests.finish_s + 0.002, rtol=0, atol=1e-12)


# ------------------------------------------------------------------ statistics
def test_noise_floor_is_the_spread_over_replays():
    summaries = [{"mean_e2el_ms": v, "output_throughput": 10.0} for v in (90.0, 100.0, 110.0)]
    floor = noise_floor(summaries).set_index("metric")
    row = floor.loc["mean_e2el_ms"]
    assert row["repeats"] == 3 and row["mean"] == pytest.approx(100.0)
    assert row["range"] == pytest.approx(0.2) and row["cv"] == pytest.approx(10.0 / 100.0)
    assert floor.loc["output_throughput", "cv"] == 0.0
    assert math.isnan(noise_floor(summaries[:1]).set_index("metric").loc["mean_e2el_ms", "cv"])


def test_pooled_latencies_are_over_every_request_of_every_replay():
    a = pd.DataFrame({"e2el_s": [1.0, 2.0], "ttft_s": [0.1, 0.2], "tpot_s": [0.01, np.nan]})
    b = pd.DataFrame({"e2el_s": [3.0, 4.0], "ttft_s": [0.3, 0.4], "tpot_s": [0.03, 0.04]})
    pooled = pooled_summary([{"output_throughput": 1.0}, {"output_throughput": 3.0}], [a, b])
    assert pooled["mean_e2el_ms"] == pytest.approx(2500.0)
    assert pooled["p99_e2el_ms"] == pytest.approx(np.percentile([1, 2, 3, 4], 99) * 1e3)
    assert pooled["mean_tpot_ms"] == pytest.approx(1e3 * np.mean([0.01, 0.03, 0.04]))
    assert pooled["output_throughput"] == 2.0


def test_tost_tells_equivalent_from_off_by_ten_percent():
    rng = np.random.default_rng(0)
    real = pd.DataFrame({"request_id": np.arange(300), "e2el_s": rng.uniform(1, 3, 300)})
    close = real.assign(e2el_s=real.e2el_s * (1 + rng.normal(0.01, 0.02, 300)))
    off = real.assign(e2el_s=real.e2el_s * 1.10)
    yes, no = equivalence_test(real, close), equivalence_test(real, off)
    assert yes["equivalent"] and yes["p_value"] < 0.05 and yes["n_pairs"] == 300
    assert not no["equivalent"] and no["mean_difference_relative"] == pytest.approx(0.10)
    assert equivalence_test(real.head(1), close.head(1))["p_value"] is None


def test_step_cost_error_per_phase_and_k():
    frame = pd.DataFrame({"group": ["prefill", "decode k=3", "decode k=3", "decode k=0"],
                          "predicted_s": [1.1, 0.9, 1.0, 2.0], "corrected_s": [1.0, 1.0, 1.0, 2.0],
                          "measured_s": [1.0, 1.0, 1.0, 1.0]})
    rows = {r["group"]: r for r in step_cost_summary(frame)}
    assert list(rows) == ["prefill", "decode k=0", "decode k=3", "all steps"]
    assert rows["prefill"]["median_ape"] == pytest.approx(0.1) and rows["prefill"]["corrected_median_ape"] == 0
    assert rows["decode k=3"]["median_ape"] == pytest.approx(0.05) and rows["decode k=3"]["median_error"] == \
        pytest.approx(-0.05)
    assert rows["decode k=0"]["median_error"] == pytest.approx(1.0)
    assert rows["all steps"]["steps"] == 4


def test_step_cost_bias_by_batch_size_shows_a_mispriced_size():
    from specbatch.commands.fidelity import step_cost_by_batch

    frame = pd.DataFrame({"group": ["prefill", "decode k=0", "decode k=0", "decode k=2", "decode k=0"],
                          "batch_size": [3, 1, 1, 3, 3],
                          "predicted_s": [9.0, 1.1, 1.1, 0.5, 0.6], "corrected_s": [9.0, 1.0, 1.0, 0.6, 0.6],
                          "measured_s": [1.0, 1.0, 1.0, 1.0, 1.0]})
    rows = step_cost_by_batch(frame)  # decode steps only: the prefill at batch 3 is not counted
    assert [(r["batch_size"], r["steps"]) for r in rows] == [(1, 2), (3, 2)]
    assert rows[0]["corrected_median_error"] == 0 and rows[0]["median_error"] == pytest.approx(0.1)
    assert rows[1]["corrected_median_error"] == pytest.approx(-0.4)


def test_a_replay_that_overslept_past_the_next_arrival_is_reproduced(run_config):
    """The real replay's ``sleep`` can overshoot past the next arrival; it then admits both on
    waking, and the playback must admit both too (it releases up to the replay's wake-up)."""
    import pandas as pd

    from sim.serving.clock import serve_wall_clock
    from sim.serving.loop import ServingLoop
    from sim.serving.queues import ArrivalQueue
    from sim.simulate import acceptance_values

    run = prepare(run_config(policy__name="fixed", policy__k=3, workload__rate=5.0, workload__num_requests=30,
                             engine__max_batch_size=8, workload__prompt_tokens="uniform:8:32",
                             workload__output_tokens="uniform:2:12"))
    now = [0.0]
    readings: list[float] = []

    class Timed(Spy):  # the wall clock moves by each step's price, as if the step had run
        def run(self, plan):
            dt, accepted = super().run(plan)
            now[0] += dt
            return dt, accepted

    def clock() -> float:
        readings.append(now[0])
        return now[0]

    def oversleep(seconds: float) -> None:
        now[0] += seconds + 0.4  # 0.4 s late: past the next arrival (0.2 s apart on average)

    backend = Timed(run)
    requests = run.requests
    queue = arrival_queue(requests.arrival_s, run.replica.inputs(requests.prompt_tokens, requests.output_tokens, None),
                          acceptance_values(run.config, run.alphas), None)
    loop = run.replica.loop(queue, run.policy, backend.sampler, backend)
    serve_wall_clock(loop, clock, oversleep)
    steps = RecordedSteps.from_replay(pd.DataFrame(loop.records().steps), np.array(readings), backend.accepted)
    woke_to_several = steps.idle_before & (steps.phase == PREFILL) & (steps.batch > 1)
    assert woke_to_several.any()  # the case this test is about happened
    playback = RecordedBackend(steps)
    execute(prepare(run.config), backend=playback)
    playback.check_done()


def test_the_client_rule_is_checked_on_both_sides_of_the_logic_check():
    """Sends at max(arrival, the (i - N)-th finish in time order); an off send is measured."""
    from specbatch.commands.fidelity import _client_rule_error

    planned = np.array([0.0, 0.0, 0.0, 5.0, 5.0])
    finish = np.array([3.0, 2.0, 7.0, 9.0, 8.0])
    good = pd.DataFrame({"arrival_s": [0.0, 0.0, 2.0, 5.0, 7.0], "finish_s": finish})  # N = 2: finishes 2, 3, 7
    assert _client_rule_error(planned, good, 2) == 0.0
    late = good.assign(arrival_s=[0.0, 0.0, 2.0, 5.5, 7.0])
    assert _client_rule_error(planned, late, 2) == pytest.approx(0.5)
    assert _client_rule_error(planned, good.assign(arrival_s=planned), 10) == 0.0  # a limit that never binds



def test_a_step_backend_is_refused_for_a_cluster(run_config):
    run, original, spy = simulated(run_config, workload__num_requests=10, workload__rate=4.0)
    backend = RecordedBackend(recorded(original, spy.accepted))
    with pytest.raises(ValueError, match="one replica"):
        execute(prepare(run_config(workload__num_requests=10, workload__rate=4.0, cluster__replicas=2)),
                backend=backend)


def test_the_simulation_is_pooled_like_the_replays():
    """p99 over 5 x 60 pooled replays is not p99 over 60: the simulated side is computed over as
    many copies of its requests, so the two percentiles are the same statistic."""
    from specbatch.commands.fidelity import as_pooled

    e2el = np.concatenate((np.linspace(1.0, 2.0, 58), [3.0, 10.0]))  # one request far worse than the rest
    requests = pd.DataFrame({"e2el_s": e2el, "ttft_s": e2el / 10, "tpot_s": e2el / 100})
    summary = {"output_throughput": 7.0}
    assert as_pooled(summary, requests, 1) is summary
    pooled = as_pooled(summary, requests, 5)
    assert pooled["p99_e2el_ms"] == pytest.approx(1e3 * np.percentile(np.tile(e2el, 5), 99))
    assert pooled["p99_e2el_ms"] == pytest.approx(10_000)  # the worst request, as in 5 replays pooled
    assert np.percentile(e2el, 99) < 7.2  # one run's p99 sits between the two worst
    assert pooled["output_throughput"] == 7.0 and pooled["mean_e2el_ms"] == pytest.approx(1e3 * e2el.mean())
