"""Matplotlib figures (headless Agg backend), written atomically as PNG, each titled so it stands alone.

Every figure names what it shows, the property, the model, the data, n and the seed — on the figure, in its
title, and in the PNG's metadata (``Title``, and ``cprobe.caption`` as JSON), so a figure copied into a slide
or a chat still says what it is. :func:`caption` does this; :func:`save` writes the PNG and, when
``CPROBE_STRICT_FIGURES=1`` (the test suite sets it), refuses a figure without a complete caption.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cprobe.io import atomic_write_bytes

CAPTION_KEY = "cprobe.caption"
FIELDS = ("property", "model", "data", "n")  # every figure names these (and the seed when known)
STRICT_ENV = "CPROBE_STRICT_FIGURES"


def new_figure(ncols: int = 1, width: float = 5.0, height: float = 3.6):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False, layout="constrained")
    return fig, axes[0]


def values(v: Any, limit: int = 4) -> str:
    """A value, or the distinct values of a column/list in order of appearance: ``a, b, c, … (7 in all)``."""
    if v is None:
        return ""
    if isinstance(v, str) or not isinstance(v, Iterable):
        return _fmt(v)
    seen = list(dict.fromkeys(_fmt(x) for x in v if x is not None and x == x))  # drop None/NaN
    if len(seen) > limit:
        return ", ".join(seen[:limit]) + f", … ({len(seen)} in all)"
    return ", ".join(seen)


def _fmt(x: Any) -> str:
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


def counts(n: Mapping[str, Any] | Any, unit: str = "") -> str:
    """n as words: ``599`` / ``599 test items`` / ``z_c 599, z_e 390 test items`` for a mapping of counts."""
    if isinstance(n, Mapping):
        distinct = set(map(_fmt, n.values()))
        text = _fmt(next(iter(n.values()))) if len(distinct) == 1 else ", ".join(f"{k} {_fmt(v)}" for k, v in n.items())
    else:
        text = values(n)
    return f"{text} {unit}".strip()


def caption(fig: Any, shows: str, *, property: Any, model: Any, data: Any, n: Any, seed: Any = None,
            note: str = "") -> str:
    """Title ``fig`` so it stands alone: ``shows`` on the first line, then property · model · data · n · seed
    (each a value, a list or a table column: distinct values are listed), then ``note``. Returns the title;
    :func:`save` also writes it into the PNG's metadata."""
    fields = {"property": values(property), "model": values(model), "data": values(data), "n": counts(n),
              "seed": values(seed)}
    line = " · ".join(f"{k}: {v}" for k, v in fields.items() if v)
    title = "\n".join(t for t in (shows, line, note) if t)
    fig.suptitle(title, fontsize=10)
    fig._cprobe_caption = {"title": title, "shows": shows, **fields}
    return title


def missing_fields(cap: Mapping[str, str] | None) -> list[str]:
    """The fields of :data:`FIELDS` a caption lacks (all of them without a caption)."""
    if cap is None:
        return list(FIELDS)
    return [f for f in FIELDS if not cap.get(f) or cap[f] not in cap.get("title", "")]


def save(fig, path: Path) -> None:
    """The figure as a PNG at ``path`` (atomically), its caption in the PNG metadata."""
    import matplotlib.pyplot as plt

    cap = getattr(fig, "_cprobe_caption", None)  # the caption :func:`caption` gave ``fig`` (None without one)
    missing = missing_fields(cap)
    if missing and os.environ.get(STRICT_ENV, "") not in ("", "0"):
        plt.close(fig)
        raise ValueError(f"figure {Path(path).name} does not name its {missing} in its title: title it with "
                         "cprobe.plots.caption(fig, shows, property=, model=, data=, n=, seed=)")
    meta = {"Title": cap["title"].replace("\n", " — "), CAPTION_KEY: json.dumps(cap, sort_keys=True)} if cap else {}
    buf = io.BytesIO()
    if fig.get_layout_engine() is None:  # figures built with layout="constrained" lay themselves out
        fig.tight_layout()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight", metadata=meta)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
