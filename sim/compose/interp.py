"""Interpolation in a measured kernel table, in log space, never past its edges.

Kernel latencies grow like powers of their sizes (a GEMM's time is flat in m while
memory-bound, then linear; attention is linear in KV length once it leaves the launch
floor), so straight lines between measured points are drawn in log(size) -> log(time).
A query outside a table's measured range, or next to a hole in it, answers NaN: the
caller records that point as not priced instead of inventing a number.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import isotonic_regression


@dataclass(frozen=True)
class LogTable:
    """Latency (seconds) on a regular grid of positive axes; NaN where not measured."""

    axes: tuple[str, ...]
    grid: tuple[np.ndarray, ...]  # sorted unique values per axis
    log_values: np.ndarray  # log(latency), NaN where the table has no point

    @classmethod
    def from_frame(cls, frame: pd.DataFrame, axes: tuple[str, ...], value: str = "latency_s") -> "LogTable":
        """Duplicated grid points (repeated collection runs) are averaged.

        Every axis is a size (rows, columns, sequences, KV length, heads): more work never
        takes less time, so each line of the table along each axis is replaced by its
        least-squares non-decreasing fit (isotonic regression, in log time). Single kernels
        vary by 5-10 % between neighbouring sizes (cuBLAS picks another kernel at m = 17 than
        at m = 16); a fit averages such a dip or spike with its neighbours instead of letting
        one outlier lift everything above it.
        """
        mean = frame.groupby(list(axes), sort=True)[value].mean()
        grid = tuple(np.unique(frame[a].to_numpy(dtype=float)) for a in axes)
        values = np.full(tuple(g.size for g in grid), np.nan)
        keys = mean.index.to_frame(index=False)
        index = tuple(np.searchsorted(g, keys[a].to_numpy(dtype=float)) for g, a in zip(grid, axes))
        values[index] = np.log(mean.to_numpy(dtype=float))
        return cls(axes, grid, monotone_fit(values))

    def bounds(self, axis: str) -> tuple[float, float]:
        values = self.grid[self.axes.index(axis)]
        return float(values[0]), float(values[-1])

    def __call__(self, **coords) -> np.ndarray:
        """Multilinear interpolation of log(latency) over log(coordinates); NaN off the table."""
        arrays = np.broadcast_arrays(*(np.asarray(coords[a], dtype=float) for a in self.axes))
        shape = arrays[0].shape
        flat = [a.ravel() for a in arrays]
        lower, weight, inside = [], [], np.ones(flat[0].size, dtype=bool)
        for values, x in zip(self.grid, flat):
            if values.size == 1:  # one measured value: only an exact match is priced
                inside &= np.isclose(x, values[0], rtol=1e-9)
                lower.append(np.zeros(x.size, dtype=int))
                weight.append(np.zeros(x.size))
                continue
            inside &= (x >= values[0] * (1 - 1e-9)) & (x <= values[-1] * (1 + 1e-9))
            xc = np.clip(x, values[0], values[-1])
            j = np.clip(np.searchsorted(values, xc, side="right") - 1, 0, values.size - 2)
            lx, l0, l1 = np.log(xc), np.log(values[j]), np.log(values[j + 1])
            lower.append(j)
            weight.append(np.clip((lx - l0) / (l1 - l0), 0.0, 1.0))
        total = np.zeros(flat[0].size)
        for corner in np.ndindex(*(2,) * len(self.axes)):
            w = np.ones(flat[0].size)
            index = []
            for bit, j, f, values in zip(corner, lower, weight, self.grid):
                w = w * (f if bit else 1.0 - f)
                index.append(np.minimum(j + bit, values.size - 1))
            v = self.log_values[tuple(index)]
            used = w > 0  # a hole next to an exact hit does not spoil it
            total = total + np.where(used, w * np.where(used, v, 0.0), 0.0)
            inside &= ~(used & np.isnan(v))
        return np.where(inside, np.exp(total), np.nan).reshape(shape)


def running_max(values: np.ndarray) -> np.ndarray:
    """Running maximum along every axis in turn; holes (NaN) stay holes and do not carry values over."""
    holes = np.isnan(values)
    out = np.where(holes, -np.inf, values)
    for axis in range(values.ndim):
        out = np.maximum.accumulate(out, axis=axis)
    return np.where(holes, np.nan, out)


def monotone_fit(values: np.ndarray) -> np.ndarray:
    """Isotonic regression along every axis in turn, over each line's measured points (holes stay)."""
    out = values.copy()
    for axis in range(values.ndim):
        moved = np.moveaxis(out, axis, -1)
        lines = moved.reshape(-1, moved.shape[-1])
        for line in lines:
            measured = ~np.isnan(line)
            if measured.sum() > 1:
                line[measured] = isotonic_regression(line[measured]).x
        out = np.moveaxis(lines.reshape(moved.shape), -1, axis)
    return out
