"""Tree drafts (SGLang's EAGLE with ``--speculative-eagle-topk`` > 1): their shape and the longest accepted path.

A head drafting a tree proposes, at each depth, its ``topk`` best candidates for the children of
the nodes it kept; the engine keeps the ``num_draft_tokens - 1`` most likely candidates and the
target verifies them (plus the root, the token the step starts from) in one pass under a tree
attention mask. Verification walks down from the root: a node whose token is the target's own
continuation is accepted, and the step keeps the longest accepted path.

The model (greedy verification, each candidate judged independently):

* at depth d, the best-ranked child of an accepted node is the target's token with the chain's
  conditional rate ``c_d`` (the acceptance model's: alpha, or per-position rates);
* the r-th ranked child (r >= 2) is, given that no better-ranked sibling was, with the sibling
  rate ``s_r`` (``--acceptance-sibling-rates``: no measured default ships);

so a node is on the accepted path with probability P(node) = product over its path of
q(d, r) = c_d for r = 1 and (1 - c_d) (1 - s_2) ... (1 - s_(r-1)) s_r otherwise. The tree is
built as SGLang's EAGLE builds it: candidates by decreasing P, children of at most ``topk``
nodes per depth (its beam), ``num_draft_tokens - 1`` nodes, at most ``steps`` deep. Since at
most one node per depth lies on the accepted path, P(a >= j) is the sum of P over the tree's
depth-j nodes: the per-position acceptance the step's draws use (sim.speculation.acceptance's POSITIONS
sampler), and the target verifies 1 + (nodes at depth <= k) tokens at depth k.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Tree:
    """A built tree: ``reach[j - 1]`` = P(a >= j), ``per_depth[d - 1]`` nodes at depth d."""

    reach: tuple[float, ...]
    per_depth: tuple[int, ...]

    def target_tokens(self, k: int) -> int:
        """Tokens the target verifies per sequence when the tree is cut at depth k (root included)."""
        return 1 + sum(self.per_depth[:k])

    @property
    def expected_accepted(self) -> float:
        return float(sum(self.reach))


def chain_rates(per_position: tuple[float, ...] | np.ndarray, depth: int) -> np.ndarray:
    """Conditional chain rates c_1..c_depth from P(a >= j) (a per-position acceptance list)."""
    reach = np.asarray(per_position, dtype=float)[:depth]
    previous = np.concatenate(([1.0], reach[:-1]))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(previous > 0, reach / np.maximum(previous, 1e-300), 0.0)


def build_tree(chain: np.ndarray, siblings: tuple[float, ...], steps: int, topk: int, nodes: int) -> Tree:
    """The tree of the module docstring: ``chain[d - 1]`` = c_d, ``siblings`` = s_2, s_3, ... (the last
    repeated for further ranks), at most ``steps`` deep, ``topk`` children per expanded node."""
    sib = list(siblings) or [0.0]

    def sibling(r: int) -> float:  # s_r, r >= 2
        return sib[min(r - 2, len(sib) - 1)]

    def child_rates(d: int) -> list[float]:
        c = float(chain[d - 1])
        out, miss = [c], 1.0 - c
        for r in range(2, topk + 1):
            out.append(miss * sibling(r))
            miss *= 1.0 - sibling(r)
        return out

    heap: list[tuple[float, int, int]] = []
    counter = 0
    for rank, q in enumerate(child_rates(1), start=1):
        heapq.heappush(heap, (-q, counter, 1))
        counter += 1
    reach = [0.0] * steps
    per_depth = [0] * steps
    taken = 0
    while heap and taken < nodes:
        neg, _, depth = heapq.heappop(heap)
        p = -neg
        reach[depth - 1] += p
        per_depth[depth - 1] += 1
        taken += 1
        if depth < steps and per_depth[depth - 1] <= topk:  # one of the depth's beam: it is expanded
            for q in child_rates(depth + 1):
                heapq.heappush(heap, (-p * q, counter, depth + 1))
                counter += 1
    reach = np.minimum.accumulate(np.minimum(np.asarray(reach), 1.0))  # exact sums; guard rounding only
    return Tree(tuple(float(x) for x in reach), tuple(per_depth))
