"""The one matplotlib setup of qir's reports: a headless backend. Figures are saved (and closed)
by :meth:`qir.tools.reports.output.Outputs.save_figure`."""
from __future__ import annotations

import re

__all__ = ["pyplot", "safe_filename"]


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
