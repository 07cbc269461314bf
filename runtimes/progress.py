"""Progress of long work, reported without printing.

The library's long loops (the engine's variants, calibration, sample captures, the bad-case
search, the layer comparison) open a :func:`task` (or wrap their loop in :func:`track`) and
advance it. What a task shows is up to the *reporter*, a callable
``reporter(desc, total, unit, initial) -> Progress``:

- by default :class:`LogProgress`: a line on the ``qir.progress`` logger (INFO) once the task has
  run ``DELAY`` seconds (2), then every ``INTERVAL`` seconds (10), with the count done, the
  elapsed time and the ETA, and a last line when such a task ends; a short task says nothing;
- :mod:`qir.tools.progress` (the only code that uses tqdm) makes it a tqdm bar with ETA when
  stderr is a terminal (:func:`set_reporter`; :func:`use_reporter` for a block of code).
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, TypeVar

__all__ = ["Progress", "LogProgress", "task", "track", "set_reporter", "use_reporter", "log_reporter",
           "DELAY", "INTERVAL"]

logger = logging.getLogger("qir.progress")

DELAY = 2.0  # seconds a task runs before its first progress line
INTERVAL = 10.0  # seconds between its lines after that

T = TypeVar("T")


class Progress:
    """One task's progress: ``update(n)`` as work is done, ``close()`` at the end (also a context
    manager: a block left by an exception, Ctrl-C's KeyboardInterrupt included, sets ``stopped``
    to its name before closing). This base class shows nothing."""

    stopped: str | None = None

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.stopped = exc_type.__name__
        self.close()


class LogProgress(Progress):
    """Progress as log lines on ``qir.progress``: the first once ``delay`` seconds have passed,
    then one every ``interval`` seconds (default: the module's ``DELAY`` and ``INTERVAL``), and a
    last one at the end of a task that logged any: ``variants: 120/480 runs (25%), 6.1 s, ETA 18 s``,
    then ``...: done, 480 runs in 24.0 s``, or, for a task stopped early (Ctrl-C, an error, fewer
    units than its total), ``...: stopped after 120/480 runs in 6.3 s (KeyboardInterrupt)``."""

    def __init__(self, desc: str, total: int | None, unit: str = "it", initial: int = 0, *,
                 delay: float | None = None, interval: float | None = None) -> None:
        self.desc, self.total, self.unit = desc, total, unit
        self.n = self.initial = initial
        self.interval = INTERVAL if interval is None else interval
        self.start = time.perf_counter()
        self.next = self.start + (DELAY if delay is None else delay)
        self.logged = False

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if now >= self.next:
            self.next = now + self.interval
            self.logged = True
            logger.info("%s", self.line(now))

    def close(self) -> None:
        if not self.logged:
            return
        self.logged = False
        took = time.perf_counter() - self.start
        if self.stopped is None and (not self.total or self.n >= self.total):
            logger.info("%s: done, %d %s in %.1f s", self.desc, self.n, self.unit, took)
            return
        count = f"{self.n}/{self.total}" if self.total else str(self.n)
        why = f" ({self.stopped})" if self.stopped and self.stopped != "GeneratorExit" else ""
        logger.info("%s: stopped after %s %s in %.1f s%s", self.desc, count, self.unit, took, why)

    def line(self, now: float) -> str:
        elapsed = now - self.start
        if not self.total:
            return f"{self.desc}: {self.n} {self.unit}, {elapsed:.1f} s"
        done = self.n - self.initial
        eta = f", ETA {elapsed / done * (self.total - self.n):.0f} s" if done > 0 else ""
        return f"{self.desc}: {self.n}/{self.total} {self.unit} ({100 * self.n / self.total:.0f}%), {elapsed:.1f} s{eta}"


Reporter = Callable[[str, "int | None", str, int], Progress]
_reporter: Reporter = LogProgress


def log_reporter(delay: float | None = None, interval: float | None = None) -> Reporter:
    """A reporter of :class:`LogProgress` tasks with this ``delay`` and ``interval``."""
    return lambda desc, total, unit, initial: LogProgress(desc, total, unit, initial, delay=delay, interval=interval)


def set_reporter(reporter: Reporter) -> None:
    """Make ``reporter`` the one every later task uses."""
    global _reporter
    _reporter = reporter


@contextmanager
def use_reporter(reporter: Reporter) -> Iterator[None]:
    """Tasks opened inside the block use ``reporter``."""
    before = _reporter
    set_reporter(reporter)
    try:
        yield
    finally:
        set_reporter(before)


def task(desc: str, total: int | None, *, unit: str = "it", initial: int = 0, enabled: bool = True) -> Progress:
    """A task of ``total`` units (None: unknown), ``initial`` of them already done, shown by the
    current reporter; a silent one when not ``enabled``."""
    return _reporter(desc, total, unit, initial) if enabled else Progress()


def track(items: Iterable[T], desc: str, *, total: int | None = None, unit: str = "it",
          enabled: bool = True) -> Iterator[T]:
    """``items``, one by one, as a task that advances with each (``total``: ``len(items)`` when
    it has one)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with task(desc, total, unit=unit, enabled=enabled) as progress:
        for item in items:
            yield item
            progress.update()
