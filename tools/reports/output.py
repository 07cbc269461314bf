"""The one rule for the files qir's commands and Python facades write, applied in one place.

**The rule.** A command never replaces an existing file unless it is told to (``--force`` on the
command line, ``overwrite=True`` in Python). It names every file it will write before any long
work; :meth:`Outputs.check` then refuses, in one error, all of them that exist, and any that cannot
be written (a read-only folder, a file where a folder should be). Files it does not own are never
touched: it writes only files it names, creates a folder only to write into it, and deletes
nothing. Every file is written atomically (:func:`qir.files.atomic_write`): a failed write (a full
disk) leaves the old file as it was, and the error names the path. The one exception is the
engine's results file: ``qir evaluate --resume`` continues it, and rewrites that run's
``variants.csv`` and ``engine_stats.json``.

::

    out = Outputs("debug_result", overwrite=force)
    out.plan(*node_sensitivity.files()).check()     # before the analysis runs
    report = ...                                    # the long work
    node_sensitivity.write_report(report, out)      # each file through out, atomically

A name is relative to the folder (an absolute path stays as it is); :meth:`Outputs.sub` is a view
on a subfolder that shares the plan. A file that was not planned is checked when it is written
(the same rule, only later); a file this plan wrote already may be written again.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from qir.errors import OutputError
from qir.files import atomic_write, check_outputs
from qir.json_dump import JsonReport, JsonValue

__all__ = ["Outputs", "as_outputs"]


class _Plan:
    """What every view of one :class:`Outputs` shares: the permission, the planned files, the
    files that may be replaced anyway, and the files written so far."""

    def __init__(self, overwrite: bool) -> None:
        self.overwrite = overwrite
        self.planned: dict[Path, None] = {}
        self.replaceable: set[Path] = set()
        self.written: set[Path] = set()


class Outputs:
    """The files one command (or facade call) writes; see the module docstring for the rule."""

    def __init__(self, folder: str | Path = ".", *, overwrite: bool = False, _plan: _Plan | None = None) -> None:
        self.folder = Path(folder)
        self._plan = _plan if _plan is not None else _Plan(bool(overwrite))

    def __repr__(self) -> str:
        return f"Outputs({str(self.folder)!r}, overwrite={self.overwrite}, planned={len(self._plan.planned)})"

    @property
    def overwrite(self) -> bool:
        """Whether existing files may be replaced (``--force``)."""
        return self._plan.overwrite

    @property
    def planned(self) -> list[Path]:
        """Every file planned so far, by any view, in order."""
        return list(self._plan.planned)

    @property
    def written(self) -> list[Path]:
        """Every file written so far through this plan (by any view), in no particular order."""
        return list(self._plan.written)

    def sub(self, name: str | Path) -> Outputs:
        """A view on the subfolder ``name`` that shares this plan (and its permission)."""
        return Outputs(self.path(name), _plan=self._plan)

    def path(self, name: str | Path) -> Path:
        """Where ``name`` goes: in this folder, unless it is absolute."""
        return self.folder / name

    def plan(self, *names: str | Path, replace: bool = False) -> Outputs:
        """Add ``names`` to the files to write; with ``replace`` they may replace existing files even
        without ``overwrite`` (a pipeline step's own ``overwrite=True``, a resumed run's files)."""
        for name in names:
            path = self.path(name)
            self._plan.planned[path] = None
            if replace:
                self._plan.replaceable.add(path)
        return self

    def check(self) -> Outputs:
        """Refuse, in one :class:`~qir.errors.OutputError`, every planned file that exists (unless
        allowed) or cannot be written. Call it before the long work; nothing is created."""
        plan = self._plan
        check_outputs([p for p in plan.planned if p not in plan.written], overwrite=plan.overwrite,
                      replaceable=plan.replaceable)
        return self

    def adopt(self, *names: str | Path) -> Outputs:
        """Count planned files as written by this plan when code that cannot write through it wrote
        them (a pass spilling values into a checked folder): they may then be written again."""
        self._plan.written.update(self.path(name) for name in names)
        return self

    # ------------------------------------------------------------------ writing
    def write(self, name: str | Path, write: Callable[[Path], Any]) -> Path:
        """Write the file ``name`` through ``write(temporary path)`` (:func:`qir.files.atomic_write`),
        creating its folder; a file not written by this plan is checked first. Returns its path."""
        path = self.path(name)
        plan = self._plan
        if path not in plan.written:
            check_outputs([path], overwrite=plan.overwrite, replaceable=plan.replaceable)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create the folder {path.parent}: {exc.strerror or exc}") from exc
        atomic_write(path, write)
        plan.written.add(path)
        return path

    def write_text(self, name: str | Path, text: str) -> Path:
        """``text`` (UTF-8) as the file ``name``."""
        return self.write(name, lambda tmp: tmp.write_text(text, encoding="utf-8"))

    def write_bytes(self, name: str | Path, data: bytes) -> Path:
        """``data`` as the file ``name``."""
        return self.write(name, lambda tmp: tmp.write_bytes(data))

    def write_json(self, name: str | Path, schema: str, doc: JsonReport | Mapping[str, JsonValue], version: int = 1) -> Path:
        """A report as strict JSON with its schema and version (:func:`qir.json_dump.json_text`)."""
        from qir.json_dump import json_text  # noqa: I001

        return self.write_text(name, json_text(schema, doc, version))

    def write_csv(self, name: str | Path, rows: Iterable[Sequence[Any]]) -> Path:
        """``rows`` (the header first) as CSV, as :func:`csv.writer` writes them."""
        def write(tmp: Path) -> None:
            with open(tmp, "w", newline="") as f:
                csv.writer(f).writerows(rows)
        return self.write(name, write)

    def save_npz(self, name: str | Path, arrays: Mapping[str, np.ndarray]) -> Path:
        """``{name: array}`` as an ``.npz`` without pickles (:func:`qir.data.save_npz`)."""
        from qir.data import save_npz

        return self.write(name, lambda tmp: save_npz(tmp, arrays))

    def save_npy(self, name: str | Path, array: np.ndarray) -> Path:
        """One array as ``.npy`` (no pickle)."""
        return self.write(name, lambda tmp: np.save(tmp, np.asarray(array), allow_pickle=False))

    def save_figure(self, name: str | Path, fig: Any, dpi: int = 110) -> Path:
        """A matplotlib figure, its format from the name's suffix; the figure is closed either way."""
        from qir.tools.reports.plots import pyplot

        try:
            return self.write(name, lambda tmp: fig.savefig(tmp, dpi=dpi))
        finally:
            pyplot().close(fig)


def as_outputs(where: Outputs | str | Path, *, overwrite: bool = False) -> Outputs:
    """``where`` itself when it is an :class:`Outputs`, else a new one on that folder."""
    return where if isinstance(where, Outputs) else Outputs(where, overwrite=overwrite)
