"""How an experiment's picture is saved: laid out, written whole or not at
all (a reader never sees half a PNG), and closed, so that a sweep drawing
many pictures does not keep every figure alive in pyplot."""

from __future__ import annotations

from pathlib import Path

from minidist.atomic_file import atomic_path


def save_figure(figure, path) -> Path:
    """Lay out ``figure`` (a pyplot figure), write it to ``path`` as a
    100 dpi picture, atomically, and close it. Returns ``path`` as a Path."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    path = Path(path)
    with atomic_path(path) as name:
        figure.savefig(name, dpi=100)
    plt.close(figure)
    return path
