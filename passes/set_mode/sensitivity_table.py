"""Reading a sensitivity table back (``sensitive_ops.json``) and picking its most sensitive
quantizers, by count or by share, for ``set-mode --sensitive``."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

from qir.errors import InputError
from qir.json_dump import JsonValue


def load_report(path: str | Path) -> dict[str, JsonValue]:
    """The ``sensitive_ops.json`` document at ``path`` (one clear error when it is not one)."""
    import json

    p = Path(path)
    if not p.is_file():
        raise InputError(f"no sensitivity report at {p}; run qir compare (or op_sensitivity) first")
    try:
        doc = json.loads(p.read_text())
    except ValueError as exc:
        raise InputError(f"{p} is not a JSON sensitivity report: {exc}") from None
    if doc.get("schema") != "qir.sensitive_ops":
        raise InputError(f"{p} is not a sensitive_ops.json report (schema {doc.get('schema')!r})")
    return doc


def select_sensitive(report: Mapping[str, JsonValue], top_k: int | None = None, ratio: float | None = None) -> list[str]:
    """The calibration nodes of the ``top_k`` (or the top ``ratio`` share of) rows of every
    output's table, most sensitive first, without repeats."""
    if (top_k is None) == (ratio is None):
        raise InputError("choose the sensitive rows with exactly one of --top-k N or --ratio R (top_k / ratio)")
    if top_k is not None and top_k < 1:
        raise InputError(f"--top-k must be >= 1, got {top_k}")
    if ratio is not None and not 0 < ratio <= 1:
        raise InputError(f"--ratio must be in (0, 1], got {ratio}")
    chosen: dict[str, None] = {}
    for rows in report["outputs"].values():
        n = top_k if top_k is not None else max(1, math.ceil(ratio * len(rows)))
        for row in rows[:n]:
            chosen.update(dict.fromkeys(row["calibrations"]))
    if not chosen:
        raise InputError("the sensitivity report has no rows to choose from")
    return list(chosen)
