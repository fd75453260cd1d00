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


def import_in_background() -> None:
    """Start importing matplotlib and pyplot on a thread (about a second of CPU): a command that waits on its
    pool's workers before it draws (``capacity``, ``tune``) then draws at once. A thread, not the start of the
    drawing: a later import waits for it under Python's import lock, and nothing here can fail the command."""
    if not have_matplotlib():
        return
    import threading

    def load() -> None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot  # noqa: F401
        except Exception:  # the drawing itself will say what is wrong, where it is wanted
            pass

    threading.Thread(target=load, name="import-matplotlib", daemon=True).start()
