"""The host proposers (calibrate/host.py) that compose and calibrate time: what they propose, and
that timing them gives a time (the composed profiles' staleness test leaves the timing out)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calibrate.host import HOST_METHODS, ngram_propose, sample_contexts, suffix_propose, time_proposer


def test_ngram_proposes_the_tokens_after_the_earliest_occurrence_of_the_longest_match():
    #            0  1  2  3  4  5  6  7  8  9 10 11 12 13
    row = [7, 1, 2, 3, 9, 8, 1, 2, 3, 5, 6, 1, 2, 3]  # "1 2 3" twice before the end; earliest at 1
    out = ngram_propose(np.array([row]), 3, lookup=(2, 3))
    assert out.tolist() == [[9, 8, 1]]
    assert ngram_propose(np.array([[1, 2, 3, 4, 5]]), 2, lookup=(2, 3)).tolist() == [[-1, -1]]  # no match


def test_suffix_takes_the_longest_match_and_at_most_its_length():
    row = [5, 1, 2, 4, 2, 9, 1, 2]  # suffix "1 2": longest at 1-2 (then 4); "2" alone later at 4 (then 9)
    assert suffix_propose(np.array([row]), 4).tolist() == [[4, 2, -1, -1]]  # at most 2 tokens: the match's length


def test_proposals_past_the_context_are_minus_one():
    row = [3, 1, 2, 1, 2]
    assert ngram_propose(np.array([row]), 4, lookup=(2, 2)).tolist() == [[1, 2, -1, -1]]


@pytest.mark.parametrize("method", HOST_METHODS)
def test_timing_gives_a_positive_time_per_step(method):
    seconds = time_proposer(method, 4, 3, 256, repeats=3, budget_s=0.05)
    assert math.isfinite(seconds) and 0 < seconds < 1.0
    assert sample_contexts(4, 256).shape == (4, 256)
