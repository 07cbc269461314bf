"""Error types whose messages are meant for the user: what failed, where, and what to do."""
from __future__ import annotations

import difflib
from typing import Iterable

__all__ = ["QirError", "ImportError_", "UnsupportedOpError", "NotFoundError", "InputError",
           "OutputError", "ExecutionError", "did_you_mean"]


class QirError(Exception):
    """Base of every error qir raises on purpose; the CLI prints its message as one line."""


class ImportError_(QirError):
    """A model file could not be read or lowered into the IR."""


class UnsupportedOpError(QirError):
    """An op the IR or a runtime cannot represent or execute."""


class NotFoundError(QirError, KeyError):
    """A node or value name that does not exist; the message suggests close names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class InputError(QirError):
    """Input data (feeds, calibration data) does not fit the model."""


class OutputError(InputError):
    """A file qir was asked to write cannot be written: it exists and replacing it was not allowed,
    its folder is not writable, or the write failed (a full disk). The message names the path."""


class ExecutionError(QirError):
    """A runtime failed while executing a node; the message names the node."""


def did_you_mean(name: str, candidates: Iterable[str], what: str = "node") -> str:
    """``"no node 'x'; did you mean 'y', 'z'?"`` with up to three close matches."""
    close = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return f"no {what} named {name!r}{hint}"
