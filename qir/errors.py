"""Error types whose messages are meant for the user: what failed, where, and what to do."""
from __future__ import annotations

import difflib
from typing import Iterable

__all__ = ["QirError", "ImportError_", "UnsupportedOpError", "NotFoundError", "InputError",
           "OutputError", "ExecutionError", "did_you_mean", "shown"]


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
    """``"no node 'x'; did you mean 'y', 'z'?"`` with up to three close matches; a name past
    :data:`NAME_SHOWN` characters is shown cut, with its length (a message stays one short line)."""
    close = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.5) if len(name) <= NAME_SHOWN else []
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return f"no {what} named {shown(name)}{hint}"


NAME_SHOWN = 200  # characters of a name a message shows


def shown(name: object) -> str:
    """``repr(name)``, cut to :data:`NAME_SHOWN` characters with the full length after it."""
    text = repr(name)
    return text if len(text) <= NAME_SHOWN else f"{text[:NAME_SHOWN]}... ({len(str(name))} characters)"
