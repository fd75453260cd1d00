"""What the studies' scripts share when they write: the output folder and a figure saved and closed."""

from __future__ import annotations

from pathlib import Path


def output_dir(out_dir) -> Path:
    """The study's output folder, made if missing."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


def save_figure(fig, out_dir: Path, name: str) -> Path:
    """Lay out, save at the studies' resolution and close ``fig`` as ``out_dir / name``."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(out_dir) / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
