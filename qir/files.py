"""Writing files so that a failed write never costs the file that was there: the primitive every
writer of qir uses (``qir.save``, JSON and ``.npz`` files, reports, IR dumps), and the check of a
command's planned outputs before it does any long work.

- :func:`atomic_write` lets a writer fill a temporary file beside the target (same folder, so the
  same file system), then ``os.replace``-s it over the target. Until that rename the old file is
  untouched. If the writer fails (a full disk, no permission), the temporary file is removed, the
  old file stays as it was, and :class:`~qir.errors.OutputError` names the path that failed.
- :func:`check_outputs` looks at every file a command will write, before it writes any: the ones
  that exist (unless replacing them is allowed) and the ones whose folder cannot be written are
  refused together, in one error.

The rule these serve (``qir.tools.reports.output.Outputs`` applies it to every command): an
existing file is never replaced unless the caller allows it (``--force``, ``overwrite=True``).
"""
from __future__ import annotations

import json
import os
import secrets
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Iterator

from qir.errors import OutputError

__all__ = ["atomic_write", "write_text", "write_bytes", "check_outputs", "temporary_path", "REPLACE_HINT", "JsonlStore"]

REPLACE_HINT = "pass --force (overwrite=True in Python) to replace"
_LISTED = 10  # existing files named in one error; the rest are counted


def temporary_path(path: Path) -> Path:
    """The hidden temporary file ``path`` is written to first: same folder, a random part, and the
    same suffix (matplotlib picks the format by it, numpy appends ``.npy`` without it)."""
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp{path.suffix}")


def atomic_write(path: str | Path, write: Callable[[Path], Any]) -> Path:
    """Write ``path`` through ``write(temporary_path)``, then move the result over ``path``.

    ``path`` is either its old content or the complete new one, never a truncated mix. On an
    ``OSError`` (a full disk, a read-only folder, a missing folder) the temporary file is removed
    and an :class:`~qir.errors.OutputError` names ``path`` and the reason; any other error of
    ``write`` also removes the temporary file and is raised as it is. Returns ``path``.
    """
    path = Path(path)
    tmp = temporary_path(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        _remove(tmp)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from exc
    except OutputError as exc:  # a writer that writes atomically itself: name this path, not its temporary one
        _remove(tmp)
        cause = exc.__cause__
        if isinstance(cause, OSError):
            raise OutputError(f"cannot write {path}: {cause.strerror or cause}") from cause
        raise
    except BaseException:
        _remove(tmp)
        raise
    return path


def write_text(path: str | Path, text: str) -> Path:
    """``text`` to ``path`` (UTF-8), atomically (:func:`atomic_write`)."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_bytes(path: str | Path, data: bytes) -> Path:
    """``data`` to ``path``, atomically (:func:`atomic_write`)."""
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _nearest_existing(folder: Path) -> Path:
    """``folder`` or its closest ancestor that exists (the folder a new file's folders go into)."""
    folder = Path(os.path.abspath(folder))
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def check_outputs(paths: Iterable[str | Path], *, overwrite: bool = False,
                  replaceable: Collection[Path] = ()) -> None:
    """Refuse, in one :class:`~qir.errors.OutputError`, every file of ``paths`` that exists (unless
    ``overwrite``, or it is in ``replaceable``), is a folder, or cannot be created because its folder
    (or the closest one that exists) is not a writable folder. Nothing is created or changed."""
    existing: list[Path] = []
    problems: dict[str, str] = {}
    for path in dict.fromkeys(Path(p) for p in paths):
        if path.is_dir():
            problems[str(path)] = f"{path} is a directory, not a file"
            continue
        allowed = overwrite or path in replaceable
        if (path.exists() or path.is_symlink()) and not allowed:
            existing.append(path)
            continue
        folder = _nearest_existing(path.parent)
        if not folder.is_dir():
            problems[str(folder)] = f"{folder} is a file, so {path} cannot be created"
        elif not os.access(folder, os.W_OK | os.X_OK):
            problems[str(folder)] = f"cannot write in {folder} (permission denied)"
    messages = []
    if len(existing) == 1:
        messages.append(f"{existing[0]} already exists; choose another output location or {REPLACE_HINT} it")
    elif existing:
        named = ", ".join(str(p) for p in existing[:_LISTED])
        more = f" and {len(existing) - _LISTED} more" if len(existing) > _LISTED else ""
        messages.append(f"{len(existing)} files already exist: {named}{more}; choose another output location "
                        f"or {REPLACE_HINT} them")
    messages += problems.values()
    if messages:
        raise OutputError("; ".join(messages))


class JsonlStore(MutableMapping):
    """A mapping that only grows, kept in a JSON-lines file so that an interrupted run can go on:
    a header line (the subclass writes or checks it), then one ``{"key": k, FIELD: v}`` line per
    entry, appended as it is set. A line cut short by an interruption is skipped on reading."""

    FIELD = "value"
    NOUN = "the store"

    def __init__(self, path: str | Path) -> None:
        self.path, self.data = Path(path), {}

    def _read(self, lines: Iterable[str]) -> None:
        """The entries of ``lines`` (the file's lines after its header) into :attr:`data`."""
        for line in lines:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by an interruption
            self.data[entry["key"]] = entry[self.FIELD]

    def _line(self, key: str, value: Any) -> str:
        return json.dumps({"key": key, self.FIELD: value}) + "\n"

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.data[key] = value
        with open(self.path, "a") as f:
            f.write(self._line(key, value))

    def __delitem__(self, key: str) -> None:
        raise TypeError(f"{self.NOUN} only grows")

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)
