"""Token-length distributions for prompts and outputs.

Written compactly on the command line as ``128``, ``uniform:64:256`` or
``lognormal:MEAN:SIGMA[:MAX]`` (MEAN is the mean of the lengths, SIGMA the standard
deviation of their logarithm), or as a TOML table with the same fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from workloads.limits import MAX_TOKENS

KINDS = ("fixed", "uniform", "lognormal")


@dataclass(frozen=True)
class LengthSpec:
    kind: str
    value: int = 0          # fixed
    low: int = 0            # uniform, inclusive
    high: int = 0           # uniform, inclusive
    mean: float = 0.0       # lognormal: mean of the lengths
    sigma: float = 0.0      # lognormal: std of log-lengths
    max: int | None = None  # lognormal: optional clip

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown length distribution '{self.kind}' (one of {', '.join(KINDS)})")
        if self.kind == "fixed" and self.value < 1:
            raise ValueError("a fixed length must be at least 1")
        if self.kind == "uniform" and not 1 <= self.low <= self.high:
            raise ValueError("uniform lengths need 1 <= low <= high")
        if self.kind == "lognormal":
            if not self.mean >= 1 or not self.sigma >= 0 or not math.isfinite(self.mean + self.sigma):
                raise ValueError("lognormal lengths need mean >= 1 and sigma >= 0")
            if self.max is not None and self.max < 1:
                raise ValueError("lognormal max must be at least 1")

    @property
    def upper_bound(self) -> int | None:
        """Largest length this spec can produce, if bounded."""
        return {"fixed": self.value, "uniform": self.high}.get(self.kind, self.max)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(n, self.value, dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.low, self.high, size=n, endpoint=True, dtype=np.int64)
        mu = math.log(self.mean) - 0.5 * self.sigma**2  # so that E[length] = mean
        draws = np.rint(rng.lognormal(mu, self.sigma, size=n))
        lengths = np.minimum(draws, MAX_TOKENS).astype(np.int64)  # a long tail must not wrap around int64
        return np.clip(lengths, 1, self.max if self.max is not None else None)

    def to_dict(self) -> dict:
        if self.kind == "fixed":
            return {"dist": "fixed", "value": self.value}
        if self.kind == "uniform":
            return {"dist": "uniform", "low": self.low, "high": self.high}
        out = {"dist": "lognormal", "mean": self.mean, "sigma": self.sigma}
        if self.max is not None:
            out["max"] = self.max
        return out


def parse_length_spec(value: object) -> LengthSpec:
    """From an int, a compact string, or a TOML table; raises ValueError saying what is wrong."""
    if isinstance(value, bool):
        raise ValueError("expected a length, not a boolean")
    if isinstance(value, int):
        return LengthSpec("fixed", value=value)
    if isinstance(value, dict):
        table = dict(value)
        kind = table.pop("dist", None)
        allowed = {"fixed": {"value"}, "uniform": {"low", "high"}, "lognormal": {"mean", "sigma", "max"}}
        if kind not in allowed:
            raise ValueError(f"'dist' must be one of {', '.join(KINDS)}")
        unknown = set(table) - allowed[kind]
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join(sorted(unknown))} for dist '{kind}'")
        if allowed[kind] - {"max"} - set(table):  # every field has a default: a missing one must not pass
            raise ValueError(f"dist '{kind}' needs {', '.join(sorted(allowed[kind] - {'max'}))}")
        for key, item in table.items():
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                raise ValueError(f"'{key}' must be a number")
            if key != "sigma" and key != "mean" and not float(item).is_integer():
                raise ValueError(f"'{key}' must be a whole number of tokens")
        ints = {k: int(v) for k, v in table.items() if k in ("value", "low", "high", "max")}
        floats = {k: float(v) for k, v in table.items() if k in ("mean", "sigma")}
        return LengthSpec(kind, **ints, **floats)
    if isinstance(value, str):
        parts = value.strip().split(":")
        try:
            if len(parts) == 1:
                return LengthSpec("fixed", value=int(parts[0]))
            if parts[0] == "uniform" and len(parts) == 3:
                return LengthSpec("uniform", low=int(parts[1]), high=int(parts[2]))
            if parts[0] == "lognormal" and len(parts) in (3, 4):
                top = int(parts[3]) if len(parts) == 4 else None
                return LengthSpec("lognormal", mean=float(parts[1]), sigma=float(parts[2]), max=top)
        except ValueError as exc:
            if "invalid literal" not in str(exc) and "could not convert" not in str(exc):
                raise
        raise ValueError(f"'{value}' is not a length: use N, uniform:LOW:HIGH or lognormal:MEAN:SIGMA[:MAX]")
    raise ValueError(f"expected a length, got {type(value).__name__}")
