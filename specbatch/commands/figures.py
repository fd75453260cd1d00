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


def plain_log_labels(axis) -> None:
    """Label a log axis in plain numbers (0.04 s, batch 16) where matplotlib writes 4×10⁻² and 2⁴: easier to
    read, and those run matplotlib's mathtext parser (0.1-0.2 s of a report's first figure). Which ticks
    carry a label is matplotlib's own choice (decades, and minor ticks when the axis spans few)."""
    from matplotlib.ticker import LogFormatter

    class PlainLogFormatter(LogFormatter):
        def __call__(self, x, pos=None):
            return f"{x:g}" if super().__call__(x, pos) else ""

    base = axis.get_transform().base
    axis.set_major_formatter(PlainLogFormatter(base=base))
    axis.set_minor_formatter(PlainLogFormatter(base=base, labelOnlyBase=False))


def place_axes(fig, axes, title: str | None = None, *, left: float = 0.75, right: float = 0.2, bottom: float = 0.55,
               top: float = 0.5, column_gap: float = 0.8, row_gap: float = 0.75) -> None:
    """Place a figure's grid of axes, and its title, by margins in inches: room for the tick and axis labels
    our reports write. ``tight_layout`` measures every label for this, which lays out each tick's text twice
    (once to measure, once to draw)."""
    rows, columns = axes.shape
    width, height = fig.get_size_inches()
    if title is not None:  # a fixed distance from the top edge, however tall the figure
        fig.suptitle(title, y=1 - 0.12 / height)
    axes_width = (width - left - right - column_gap * (columns - 1)) / columns
    axes_height = (height - bottom - top - row_gap * (rows - 1)) / rows
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height,
                        wspace=column_gap / axes_width, hspace=row_gap / axes_height)
