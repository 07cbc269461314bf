"""The one matplotlib setup of qir's reports: a headless backend, figures closed once saved."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

__all__ = ["pyplot", "save_figure", "safe_filename"]


def pyplot():
    """``matplotlib.pyplot`` on the file-only ``Agg`` backend (reports never open a window), imported
    on first use so commands that draw nothing start fast."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def safe_filename(name: str) -> str:
    """A node name as a file name (path separators and odd characters become ``_``)."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", name).strip("_") or "node"


def save_figure(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` (its folder created), close it, and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path
