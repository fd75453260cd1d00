"""Acceptance models beyond one geometric alpha (sim/speculation/acceptance.py): per-position rates, vLLM traces,
and the recording of what was drawn for vLLM's speculation metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specbatch
from sim.speculation.acceptance import (AcceptanceSampler, PositionSampler, RecordingSampler, SharedAlphaSampler, TraceSampler,
                            acceptance_scale, accepted_per_position, parse_rates, per_request_steps, position_rates,
                            read_acceptance_trace)
from sim.errors import InputError

RUN = dict(num_requests=150, rate=25, seed=4)
EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"


def _write_trace(path, records, nested=False):
    lines = []
    for a, d in records:
        obj = {"per_step_accepted": a, "per_step_drafted": d}
        lines.append({"metrics": {"speculative_decoding": obj}} if nested else obj)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


# ----------------------------------------------------------------------------- per-position


@pytest.mark.parametrize("rates,k", [((0.8, 0.6, 0.45), 3), ((0.9, 0.5), 2), ((0.7, 0.7, 0.2, 0.1), 4)])
def test_per_position_rate_is_the_probability_of_keeping_position_j(rates, k):
    n = 200_000
    sampler = PositionSampler(np.random.default_rng(1), position_rates(rates, k))
    a = np.concatenate([sampler.accepted(np.zeros(1000), k) for _ in range(n // 1000)])
    assert a.min() >= 0 and a.max() <= k
    for j, p in enumerate(rates[:k]):
        assert abs(np.mean(a > j) - p) < 5 * math.sqrt(p * (1 - p) / n) + 1e-9, j


def test_positions_past_the_list_keep_its_last_conditional_rate():
    assert position_rates((0.8, 0.4), 4) == pytest.approx([0.8, 0.4, 0.2, 0.1])
    assert position_rates((0.6,), 3) == pytest.approx([0.6, 0.36, 0.216])
    assert position_rates((0.8, 0.6, 0.4), 2) == pytest.approx([0.8, 0.6])


def test_per_position_with_a_ragged_k_caps_each_row_at_its_own_k():
    sampler = PositionSampler(np.random.default_rng(2), position_rates((0.99, 0.99, 0.99), 3))
    ks = np.array([0, 1, 2, 3] * 250)
    a = sampler.accepted(np.zeros(ks.size), ks)
    assert np.all(a <= ks) and np.all(a[ks == 0] == 0)


@pytest.mark.parametrize("raw,message", [("0.5,0.7", "must not increase"), ("1.2", "in [0, 1]"), ("", "not a list"),
                                         ("a,b", "not a list of numbers"), ([0.0], "first rate is 0")])
def test_bad_rates_are_refused_with_a_reason(raw, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_rates(raw)


def test_a_per_position_run_reports_the_rates_it_was_given():
    run = specbatch.run(**RUN, k=4, acceptance_model="per-position", acceptance_per_position="0.85,0.6,0.4")
    per_pos = run.result.spec_decode["acceptance_rate_per_pos"]
    expected = position_rates((0.85, 0.6, 0.4), 4)
    drafts = run.result.spec_decode["spec_decode_num_drafts"]
    for got, p in zip(per_pos, expected):
        assert abs(got - p) < 5 * math.sqrt(p * (1 - p) / drafts)


def test_the_per_position_model_needs_its_rates_and_rates_need_the_model():
    with pytest.raises(InputError, match="needs its rates"):
        specbatch.run(**RUN, acceptance_model="per-position")
    with pytest.raises(InputError, match="applies only to --acceptance-model per-position"):
        specbatch.run(**RUN, acceptance_per_position="0.8")


# ------------------------------------------------------------------------------------ trace


def test_a_trace_step_keeps_min_of_recorded_and_k_and_draws_past_a_full_acceptance(tmp_path):
    # record 0: a rejection at position 3 (kept 2 of 4); record 1: every draft kept (3 of 3).
    trace = read_acceptance_trace(_write_trace(tmp_path / "t.jsonl", [([2], [4]), ([3], [3])]))
    for k in range(0, 7):
        sampler = TraceSampler(np.random.default_rng(0), trace, 2)
        a = sampler.accepted(np.array([0.0, 1.0]), k)
        assert a[0] == min(2, k)
        assert a[1] >= min(3, k) and a[1] <= k


def test_a_request_walks_its_record_and_wraps_round(tmp_path):
    trace = read_acceptance_trace(_write_trace(tmp_path / "t.jsonl", [([0, 1, 2], [3, 3, 3])]))
    sampler = TraceSampler(np.random.default_rng(0), trace, 3)  # all three requests replay record 0
    got = [sampler.accepted(np.array([0.0, 2.0]), 3).tolist() for _ in range(4)]
    assert got == [[0, 0], [1, 1], [2, 2], [0, 0]]


def test_requests_take_records_in_turn_and_empty_records_draw_at_the_traces_rate(tmp_path):
    trace = read_acceptance_trace(_write_trace(tmp_path / "t.jsonl", [([1], [2]), ([], []), ([1], [2])]))
    assert len(trace) == 3
    assert trace.record_alpha == pytest.approx([0.5, 0.5, 0.5])
    sampler = TraceSampler(np.random.default_rng(0), trace, 6)
    a = sampler.accepted(np.arange(6, dtype=float), 2)
    assert a[0] == a[2] == a[3] == a[5] == 1


@given(st.lists(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=0, max_size=8), min_size=1,
                max_size=5), st.integers(0, 8), st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_trace_replay_respects_the_rule_for_any_record_and_k(tmp_path_factory, records, k, seed):
    records = [([min(a, d) for a, d in r], [max(a, d) for a, d in r]) for r in records]
    path = _write_trace(tmp_path_factory.mktemp("t") / "t.jsonl", records)
    trace = read_acceptance_trace(path)
    n = len(records)
    sampler = TraceSampler(np.random.default_rng(seed), trace, n)
    a = sampler.accepted(np.arange(n, dtype=float), k)
    for r, (acc, drf) in enumerate(records):
        first_a, first_d = (acc[0], drf[0]) if acc else (0, 0)
        assert 0 <= a[r] <= k
        if first_a < first_d or k <= first_d:
            assert a[r] == min(first_a, k)
        else:
            assert a[r] >= first_d


@pytest.mark.parametrize("line,message", [
    ("{not json", "not JSON"),
    ('{"per_step_accepted": [1]}', "needs per_step_accepted and per_step_drafted"),
    ('{"per_step_accepted": [1, 2], "per_step_drafted": [3]}', "one length"),
    ('{"per_step_accepted": [4], "per_step_drafted": [3]}', "accepted 4 of 3"),
    ('{"per_step_accepted": [1.5], "per_step_drafted": [3]}', "whole numbers"),
])
def test_a_bad_trace_line_names_the_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"per_step_accepted": [1], "per_step_drafted": [2]}\n' + line + "\n")
    with pytest.raises(InputError, match=message) as info:
        read_acceptance_trace(str(path))
    assert info.value.line == 2 and str(path) in str(info.value)


def test_a_missing_trace_fails_before_the_run_naming_the_key():
    with pytest.raises(InputError, match="no such acceptance trace file") as info:
        specbatch.run(**RUN, acceptance_model="trace", acceptance_trace="nowhere.jsonl")
    assert info.value.field == "acceptance.trace"


def test_the_example_trace_reads_and_runs():
    run = specbatch.run(**RUN, k=4, acceptance_model="trace", acceptance_trace=str(EXAMPLES / "acceptance-trace.jsonl"))
    assert 0.3 < run.summary["acceptance_rate"] < 0.7
    per_pos = run.result.spec_decode["acceptance_rate_per_pos"]
    assert per_pos == sorted(per_pos, reverse=True)


def test_a_detailed_run_replayed_as_a_trace_at_the_same_k_is_the_same_run(tmp_path):
    first = specbatch.run(**RUN, k=3, alpha_distribution="beta", per_request_spec_decode_metrics="detailed",
                          out=str(tmp_path / "a"))
    trace = str(tmp_path / "a" / "spec_decode.jsonl")
    again = specbatch.run(**RUN, k=3, acceptance_model="trace", acceptance_trace=trace)
    assert np.array_equal(first.requests.accepted_tokens, again.requests.accepted_tokens)
    assert np.array_equal(first.requests.e2el_s, again.requests.e2el_s)


# ------------------------------------------------------------------------ recording draws


@pytest.mark.parametrize("shared", [True, False])
def test_recording_changes_no_draw(shared):
    alphas = np.full(64, 0.7) if shared else np.random.default_rng(3).uniform(0.2, 0.9, 64)
    scale = acceptance_scale(alphas)

    def make():
        rng = np.random.default_rng(9)
        return SharedAlphaSampler(rng, float(scale[0])) if shared else AcceptanceSampler(rng)

    plain = make()
    for per_request in (False, True):
        recorded, plain = RecordingSampler(make(), scale, per_request), make()
        values = np.arange(64, dtype=float) if per_request else scale
        for k in (1, 3, 5):
            assert np.array_equal(recorded.accepted(values, k), plain.accepted(scale, k))


def test_per_position_counts_and_per_request_steps_agree_with_the_run():
    run = specbatch.run(**RUN, k=4, alpha_distribution="beta", per_request_spec_decode_metrics="summary")
    spec, per_request = run.result.spec_decode, run.result.spec_decode_requests
    assert spec["spec_decode_num_accepted_tokens_per_pos"][0] <= spec["spec_decode_num_drafts"]
    assert sum(spec["spec_decode_num_accepted_tokens_per_pos"]) == spec["spec_decode_num_accepted_tokens"]
    assert sum(r["num_spec_steps"] for r in per_request) == spec["spec_decode_num_drafts"]
    assert sum(r["num_draft_tokens"] for r in per_request) == spec["spec_decode_num_draft_tokens"]
    assert [r["num_accepted_draft_tokens"] for r in per_request] == run.requests.accepted_tokens.tolist()
    for r in per_request:
        assert sum(r["acceptance_histogram"]) == r["num_spec_steps"] and len(r["acceptance_histogram"]) == 5
        assert "per_step_accepted" not in r


def test_per_position_counts_survive_the_recorders_folding():
    """The recorder folds its per-step draws into counts every few thousand steps (a long run's
    memory stays flat); the per-position counts must be those of every draw, folded or not."""
    scale = acceptance_scale(np.full(5, 0.7))
    sampler = RecordingSampler(SharedAlphaSampler(np.random.default_rng(3), float(scale[0])), scale, False)
    drawn = [sampler.accepted(scale, 1 + step % 4) for step in range(10_000)]
    kept = np.concatenate(drawn)
    expected = np.array([np.count_nonzero(kept > j) for j in range(4)])
    assert np.array_equal(accepted_per_position([sampler], 4), expected)
    assert len(sampler.accepted_log) < 4096  # folded, not kept


def test_per_request_steps_group_rows_by_request_in_step_order():
    sampler = RecordingSampler(SharedAlphaSampler(np.random.default_rng(0), 1.0), np.ones(3), True)
    sampler.accepted(np.array([2.0, 0.0]), 2)
    sampler.accepted(np.array([0.0, 1.0]), np.array([1, 0]))  # request 1 drafted nothing: not a step
    steps = per_request_steps([sampler], 3)
    assert steps.offset.tolist() == [0, 2, 2, 3]
    assert steps.drafted.tolist() == [2, 1, 2]
    assert accepted_per_position([sampler], 2).shape == (2,)


@pytest.mark.parametrize("replicas", [1, 3])
def test_asking_for_per_request_metrics_changes_no_result(replicas):
    settings_ = dict(RUN, k=3, alpha_distribution="beta", replicas=replicas)
    plain = specbatch.run(**settings_)
    detailed = specbatch.run(**settings_, per_request_spec_decode_metrics="detailed")
    assert plain.summary == detailed.summary
    assert plain.requests.equals(detailed.requests)
