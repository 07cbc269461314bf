"""Which file an IR was loaded from, while it still is what that file holds.

:func:`qir.api.load` remembers, for each IR it reads from a file, the file, the input shapes it
was read with, the IR's ``version`` then, and the file's size and modification time
(:func:`remember`). :func:`loaded_from` answers with the file and shapes while neither the IR
(its ``version``: every mutator bumps it) nor the file has changed since: loading that file
again gives the same IR. The engine sends such a path to the workers of a cluster instead of the
IR. A clone is another IR, which it does not know.
"""
from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any, Mapping, Sequence

from qir.graph import QIR

__all__ = ["remember", "loaded_from"]

# IR -> (file, input_shapes, the IR's version after loading, the file's size and mtime then)
_LOADED: "weakref.WeakKeyDictionary[QIR, tuple]" = weakref.WeakKeyDictionary()


def remember(ir: QIR, path: str | Path, input_shapes: Mapping[str, Sequence[int]] | None) -> None:
    """Note that ``ir`` is what ``path`` holds, read with ``input_shapes``."""
    path = Path(path).resolve()
    stat = path.stat()
    shapes = None if input_shapes is None else {k: list(v) for k, v in dict(input_shapes).items()}
    _LOADED[ir] = (str(path), shapes, ir.version, stat.st_size, stat.st_mtime_ns)


def loaded_from(ir: QIR) -> tuple[str, dict[str, Any] | None] | None:
    """``(file, input_shapes)`` that ``ir`` was loaded from, while neither has changed since (see
    the module docstring); else None."""
    entry = _LOADED.get(ir)
    if entry is None:
        return None
    path, shapes, version, size, mtime = entry
    try:
        stat = Path(path).stat()
    except OSError:
        return None
    if ir.version != version or (stat.st_size, stat.st_mtime_ns) != (size, mtime):
        return None
    return path, shapes
