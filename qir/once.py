"""The one place qir keeps process-wide state: what has been said once per process.

Some warnings are worth one line per process, not one per sample or per run: a sample file with
NaN or Inf inputs (:mod:`qir.data`), an integer-level float fallback or accumulator overflow
(:mod:`qir.runtimes.integer.interpreter`). Each topic has a set of the keys already said;
:func:`forget` clears one topic or all of them (the command line forgets per command, tests
between cases). Nothing else in qir is module-level mutable state, except the progress reporter
the command line installs (:func:`qir.runtimes.progress.use_reporter`, scoped by a ``with``)."""
from __future__ import annotations

from typing import Hashable

__all__ = ["first_time", "forget", "said"]

_SAID: dict[str, set[Hashable]] = {}


def said(topic: str) -> set[Hashable]:
    """The keys of ``topic`` said so far in this process (the live set: callers may add to it)."""
    return _SAID.setdefault(topic, set())


def first_time(topic: str, key: Hashable) -> bool:
    """True the first time ``key`` is met under ``topic`` in this process (and records it)."""
    keys = said(topic)
    if key in keys:
        return False
    keys.add(key)
    return True


def forget(topic: str | None = None) -> None:
    """Say everything of ``topic`` (default: every topic) again."""
    if topic is None:
        for keys in _SAID.values():
            keys.clear()
    else:
        said(topic).clear()
