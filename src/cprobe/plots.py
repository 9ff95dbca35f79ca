"""Matplotlib figures (headless Agg backend), written atomically as PNG."""

from __future__ import annotations

import io
from pathlib import Path

from cprobe.io import atomic_write_bytes


def new_figure(ncols: int = 1, width: float = 5.0, height: float = 3.6):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, axes[0]


def save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    if fig.get_layout_engine() is None:  # figures built with layout="constrained" lay themselves out
        fig.tight_layout()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
