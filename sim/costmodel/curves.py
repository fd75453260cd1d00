"""A measured latency curve: interpolation inside the grid, roofline fit outside it.

Inside the measured grid, latency is interpolated linearly along each axis (batch
size, query tokens, context length are all on a linear scale: a compute-bound pass
grows linearly in tokens, a memory-bound one stays flat, and both are piecewise
linear). Outside it, the value at the nearest grid point is scaled by a fitted
roofline-shaped model,

    t(x) = max(memory terms . theta_m, compute terms . theta_c),   theta >= 0,

so the curve stays continuous at the grid's edge and grows the way the hardware
would: with bytes moved while memory-bound, with FLOPs once compute-bound. Grid
points that were skipped (out of memory) are filled from the same fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

# scipy is imported where a curve is fitted or first evaluated: a run whose curves and step
# table come from the cache (sim.costmodel.cache) never needs it.
if TYPE_CHECKING:
    import pandas as pd

Features = Callable[[dict[str, np.ndarray]], tuple[np.ndarray, np.ndarray]]


def _ones(x: np.ndarray) -> np.ndarray:
    return np.ones_like(x, dtype=float)


def decode_features(x: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Decode/verify pass: weights + KV reads (memory), linear + attention FLOPs (compute)."""
    b, q, c = x["batch_size"], x["query_tokens"], x["context_tokens"]
    memory = np.stack([_ones(b), b * c], axis=-1)
    compute = np.stack([b * q, b * q * c], axis=-1)
    return memory, compute


def prefill_features(x: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Prefill: weights + activations (memory), linear FLOPs and quadratic attention (compute)."""
    b, p = x["batch_size"], x["query_tokens"]
    memory = np.stack([_ones(b), b * p], axis=-1)
    compute = np.stack([b * p, b * p * p], axis=-1)
    return memory, compute


def verify_features(x: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Rejection sampling: a fixed launch cost, then work linear in rows of vocabulary."""
    b, k = x["batch_size"], x["query_tokens"]
    return _ones(b)[..., None], (b * (2 * k + 1))[..., None]


@dataclass
class Curve:
    """Latency (seconds) as a function of named integer axes."""

    name: str
    axes: tuple[str, ...]
    grid: tuple[np.ndarray, ...]
    values: np.ndarray
    features: Features
    theta_memory: np.ndarray
    theta_compute: np.ndarray
    fit_median_rel_error: float

    @classmethod
    def from_points(cls, name: str, points: "pd.DataFrame", axes: tuple[str, ...], features: Features) -> "Curve":
        coords = {a: points[a].to_numpy(dtype=float) for a in axes}
        latency = points["latency_median_s"].to_numpy(dtype=float)
        theta_m, theta_c, err = _fit_roofline(features, coords, latency)
        grid = tuple(np.unique(coords[a]) for a in axes)
        values = np.full(tuple(g.size for g in grid), np.nan)
        index = tuple(np.searchsorted(g, coords[a]) for g, a in zip(grid, axes))
        values[index] = latency
        curve = cls(name, axes, grid, values, features, theta_m, theta_c, err)
        missing = np.isnan(values)
        if missing.any():
            mesh = np.meshgrid(*grid, indexing="ij")
            fill = curve.fit({a: m[missing] for a, m in zip(axes, mesh)})
            values[missing] = fill
        curve._build()
        return curve

    def _build(self) -> None:
        self._live = [i for i, g in enumerate(self.grid) if g.size > 1]
        self._interp = None  # built on first evaluation (:meth:`_interpolator`)
        self._constant = float(self.values.reshape(-1)[0])

    def _interpolator(self):
        if self._interp is None:
            from scipy.interpolate import RegularGridInterpolator

            live = self._live
            squeezed = self.values.reshape(tuple(self.grid[i].size for i in live))
            self._interp = RegularGridInterpolator(tuple(self.grid[i] for i in live), squeezed, method="linear")
        return self._interp

    def state(self) -> dict[str, np.ndarray]:
        """What rebuilds this curve without fitting it again (:meth:`from_state`): arrays only."""
        out = {"values": self.values, "theta_memory": self.theta_memory, "theta_compute": self.theta_compute,
               "fit_median_rel_error": np.float64(self.fit_median_rel_error)}
        out.update({f"grid_{i}": g for i, g in enumerate(self.grid)})
        return out

    @classmethod
    def from_state(cls, name: str, axes: tuple[str, ...], features: Features, state) -> "Curve":
        grid = tuple(np.asarray(state[f"grid_{i}"], dtype=float) for i in range(len(axes)))
        curve = cls(name, axes, grid, np.asarray(state["values"], dtype=float), features,
                    np.asarray(state["theta_memory"], dtype=float), np.asarray(state["theta_compute"], dtype=float),
                    float(state["fit_median_rel_error"]))
        curve._build()
        return curve

    def fit(self, x: dict[str, np.ndarray]) -> np.ndarray:
        memory, compute = self.features(x)
        return np.maximum(memory @ self.theta_memory, compute @ self.theta_compute)

    def bounds(self, axis: str) -> tuple[float, float]:
        g = self.grid[self.axes.index(axis)]
        return float(g[0]), float(g[-1])

    def __call__(self, **coords: np.ndarray | float) -> np.ndarray:
        """Vectorised evaluation; broadcasting over the coordinate arrays.

        An axis of the broadcast shape along which no coordinate varies (every array a broadcast view
        there: a zero stride) holds the same points over and over: they are evaluated once and the
        values repeated. A step table's verification does not vary with the context, nor its drafting
        with k: evaluating each point once made a table quicker to build (0.66 s -> 0.37-0.47 s at
        batch 256, k 7), with the same values to the bit (every shipped profile's tables, checked)."""
        arrays = np.broadcast_arrays(*(np.asarray(coords[a], dtype=float) for a in self.axes))
        shape = arrays[0].shape
        repeated = [i for i, n in enumerate(shape) if n > 1 and all(a.strides[i] == 0 for a in arrays)]
        if repeated:
            once = tuple(slice(0, 1) if i in repeated else slice(None) for i in range(len(shape)))
            return np.ascontiguousarray(np.broadcast_to(self(**{a: v[once] for a, v in zip(self.axes, arrays)}), shape))
        x = dict(zip(self.axes, arrays))
        clamped = {a: np.clip(v, g[0], g[-1]) for (a, v), g in zip(x.items(), self.grid)}
        if not self._live:
            inside = np.full(arrays[0].shape, self._constant)
        else:
            pts = np.stack([clamped[self.axes[i]] for i in self._live], axis=-1)
            inside = self._interpolator()(pts.reshape(-1, len(self._live))).reshape(arrays[0].shape)
        outside = np.zeros(arrays[0].shape, dtype=bool)
        for a in self.axes:
            outside |= x[a] != clamped[a]
        if outside.any():
            at = {a: v[outside] for a, v in x.items()}
            edge = {a: v[outside] for a, v in clamped.items()}
            inside = inside.copy()
            inside[outside] *= self.fit(at) / self.fit(edge)
        return inside


def _fit_roofline(features: Features, x: dict[str, np.ndarray], t: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Non-negative least squares on relative error of max(memory, compute)."""
    from scipy.optimize import least_squares

    memory, compute = features(x)
    n_m = memory.shape[1]
    scale_m = np.maximum(np.abs(memory).max(axis=0), 1e-30)
    scale_c = np.maximum(np.abs(compute).max(axis=0), 1e-30)
    memory_n, compute_n = memory / scale_m, compute / scale_c
    t_max = float(t.max())

    def residual(theta: np.ndarray) -> np.ndarray:
        pred = np.maximum(memory_n @ theta[:n_m], compute_n @ theta[n_m:])
        return (pred - t) / t

    start = np.concatenate([np.full(n_m, float(t.min()) / n_m), np.full(compute.shape[1], t_max / compute.shape[1])])
    result = least_squares(residual, start, bounds=(0.0, np.inf), method="trf")
    theta = result.x
    theta_m, theta_c = theta[:n_m] / scale_m, theta[n_m:] / scale_c
    # A fit that is zero everywhere would divide by zero when extrapolating.
    if not np.any(theta_m > 0):
        theta_m = theta_m.copy()
        theta_m[0] = float(t.min())
    err = float(np.median(np.abs(residual(theta))))
    return theta_m, theta_c, err
