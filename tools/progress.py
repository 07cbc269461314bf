"""Long work shown to a person: a tqdm bar with ETA on a terminal, periodic log lines otherwise.

The library reports progress through :mod:`qir.runtimes.progress` and never prints; this module,
the only one that uses tqdm, gives it a reporter (:func:`terminal_reporter`) that draws a tqdm
bar on stderr when stderr is a terminal and otherwise keeps the library's log lines (INFO on the
``qir.progress`` logger, which the command line shows). Importing :mod:`qir.tools` installs it
(:func:`install`), so the command line and the Python facades (``qir.tools.compat.hmct``,
``qir.tools.runall``, ``qir.tools.compat.quant_analysis``) show bars on terminals. A bar appears once
its task has run ``DELAY`` seconds.
"""
from __future__ import annotations

import sys

from qir.execution import Level
from qir.runtimes.progress import LogProgress, Progress, set_reporter, track

__all__ = ["TqdmProgress", "terminal_reporter", "install", "run_samples", "DELAY"]

DELAY = 2.0  # seconds before a bar appears: short steps stay quiet


class TqdmProgress(Progress):
    """A task as a tqdm bar on stderr, with rate and ETA, removed when the task ends."""

    def __init__(self, desc: str, total: int | None, unit: str = "it", initial: int = 0) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=initial, desc=desc, unit=f" {unit}", leave=False, delay=DELAY,
                        file=sys.stderr, disable=False, dynamic_ncols=True)

    def update(self, n: int = 1) -> None:
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()


def terminal_reporter(desc: str, total: int | None, unit: str = "it", initial: int = 0) -> Progress:
    """A :class:`TqdmProgress` when stderr is a terminal, else the library's :class:`LogProgress`."""
    isatty = getattr(sys.stderr, "isatty", None)
    if isatty is not None and isatty():
        return TqdmProgress(desc, total, unit, initial)
    return LogProgress(desc, total, unit, initial)


def install() -> None:
    """Make :func:`terminal_reporter` the reporter of every task."""
    set_reporter(terminal_reporter)


def run_samples(ir, samples, runtime: str, *, desc: str = "run", capture=(),
                level: str = Level.FAKEQUANT, march: str | None = None) -> list[dict]:
    """Run every sample at ``level`` (``march``: the integer level's profile), showing progress (a
    bar on terminals, log lines otherwise)."""
    from qir.runtimes.base import get_runtime

    rt = get_runtime(runtime, level=level, march=march)
    return [rt.run(ir, s, capture=capture) for s in track(samples, desc, unit="samples")]
