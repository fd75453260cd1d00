"""Acceptance model: how many draft tokens a verification step keeps.

Each draft token is accepted with probability alpha, independently, until the first
rejection, so a sequence keeps a = min(G, k) tokens where P(G >= j) = alpha^j and
emits a + 1 (docs/acceptance.md). Per-request alpha may be drawn from a Beta distribution.

Sampling is vectorised and cheap per step: G = floor(E / -ln(alpha)) with E a
standard exponential, drawn ahead in large blocks from a seeded generator, so one
step costs a slice, a multiply and a clip, whatever alpha each sequence has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DISTRIBUTIONS = ("fixed", "beta")
_EDGE = 1e-12  # keeps per-request alpha strictly inside (0, 1)


@dataclass(frozen=True)
class AcceptanceSpec:
    """alpha: mean acceptance rate of the model pair on the dataset, in (0, 1).

    distribution "fixed": every request has alpha; "beta": each request draws its
    own from Beta(alpha * concentration, (1 - alpha) * concentration).
    """

    alpha: float = 0.7
    distribution: str = "fixed"
    concentration: float = 10.0

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha must be inside (0, 1), got {self.alpha}")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}")
        if not (self.concentration > 0 and math.isfinite(self.concentration)):
            raise ValueError("concentration must be a positive number")

    def request_alphas(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.distribution == "fixed":
            return np.full(n, self.alpha)
        a, b = self.alpha * self.concentration, (1.0 - self.alpha) * self.concentration
        return np.clip(rng.beta(a, b, size=n), _EDGE, 1.0 - _EDGE)


def expected_tokens_per_step(alpha: float | np.ndarray, k: int) -> float | np.ndarray:
    """E[a + 1] = (1 - alpha^(k+1)) / (1 - alpha): tokens one sequence emits per step."""
    return (1.0 - np.power(alpha, k + 1)) / (1.0 - alpha)


def acceptance_scale(alphas: np.ndarray) -> np.ndarray:
    """Per-sequence 1 / -ln(alpha), the factor that turns an exponential into G."""
    return 1.0 / -np.log(alphas)


class AcceptanceSampler:
    """Draws accepted-token counts for a batch, one step at a time."""

    def __init__(self, rng: np.random.Generator, block: int = 1 << 16) -> None:
        self._rng = rng
        self._block = block
        self._buffer = self._fresh(block)
        self._pos = 0

    def _fresh(self, n: int) -> np.ndarray:
        return self._rng.standard_exponential(n)

    def _take(self, n: int) -> np.ndarray:
        if self._pos + n > self._buffer.shape[0]:
            self._buffer = np.concatenate((self._buffer[self._pos:], self._fresh(max(self._block, n))))
            self._pos = 0
        draws = self._buffer[self._pos:self._pos + n]
        self._pos += n
        return draws

    def accepted(self, scale: np.ndarray, k: int) -> np.ndarray:
        """Accepted draft tokens per sequence, each in [0, k]; ``scale`` from :func:`acceptance_scale`."""
        draws = self._take(scale.shape[0]) * scale
        np.minimum(draws, k, out=draws)
        return draws.astype(np.int64)


class SharedAlphaSampler(AcceptanceSampler):
    """The same draws when every sequence shares one alpha, with G precomputed per block.

    Gives exactly the counts :class:`AcceptanceSampler` would for a constant scale,
    at the cost of one clip per step instead of a multiply, a clip and a cast.
    """

    def __init__(self, rng: np.random.Generator, scale: float, block: int = 1 << 16) -> None:
        self._scale = scale
        super().__init__(rng, block)

    def _fresh(self, n: int) -> np.ndarray:
        return (self._rng.standard_exponential(n) * self._scale).astype(np.int64)

    def accepted(self, scale: np.ndarray, k: int) -> np.ndarray:
        return np.minimum(self._take(scale.shape[0]), k)
