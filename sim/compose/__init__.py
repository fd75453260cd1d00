"""Composed profiles: cost curves for a GPU you do not have, from published kernel microbenchmarks.

A composed profile sums measured kernel latencies (GEMMs and attention from NVIDIA's
aiconfigurator-core data, collected with the kernels vLLM runs) over a model's layers,
prices the memory-bound rest from the GPU's spec sheet, and writes the same profile
format that ``calibrate`` writes, with ``source = "composed"`` and every assumption in
the sidecar. See docs/gpu-profiles.md.

Modules: :mod:`.data` (finding and reading the tables and spec sheets), :mod:`.interp`
(log-space interpolation that never leaves a table), :mod:`.shapes` (a model's kernels),
:mod:`.price` (one forward pass), :mod:`.build` (a whole profile). No torch, no calibrate.
"""

from sim.compose.build import Request, compose, points_of
from sim.compose.shapes import ModelShape

__all__ = ["ModelShape", "Request", "compose", "points_of"]
