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

__all__ = ["ModelShape", "Request", "compose", "points_of"]


def __getattr__(name: str):
    """The package's names, loaded when first used: a submodule (the fitted terms, the sampler's
    modes) is read without loading the composer (pandas, the kernel tables)."""
    if name == "ModelShape":
        from sim.compose.shapes import ModelShape

        return ModelShape
    if name in __all__:
        from sim.compose import build

        return getattr(build, name)
    raise AttributeError(f"module 'sim.compose' has no attribute {name!r}")
