"""Figures are optional: the README's first install (``pip install -e .``) has no matplotlib.

A report is then written without its figures and says so in one line (``capacity``, ``tune``);
``pip install 'specbatch[report]'`` brings them.
"""

from __future__ import annotations

NO_MATPLOTLIB = "matplotlib is not installed (pip install 'specbatch[report]')"


def have_matplotlib() -> bool:
    """Whether figures can be drawn, asked without importing matplotlib (slow, and absent on a plain install)."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None
