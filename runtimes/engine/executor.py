"""Running shards: the executor base class, and what every worker does around a shard function.

A *shard function* ``fn(common, shard)`` is a generator of messages (tuples whose first item
names their kind: ``rows``, ``left_out``, ``stats``, ``scores``...). :func:`run_shard` runs one on
a worker: the warnings qir logs meanwhile become ``log`` messages, which the driver logs once
(:func:`relog`) rather than once per worker, and a qir error becomes an ``error`` message, raised
again on the driver (:func:`raise_remote`). :class:`Executor` runs shards one after the other in
this process; :mod:`.ray_cluster` and :mod:`.torch_cluster` run them on workers
(:mod:`.cluster` chooses).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterator, Sequence

from qir import errors
from qir.errors import QirError

__all__ = ["Executor", "run_shard", "follow", "relog", "raise_remote"]


class Executor:
    """Runs shards somewhere (see the module docstring). ``driver``: this process gathers the
    results and writes the files; ``shared_state``: every worker is a copy of the driver's
    program (a torchrun rank), so a shard function gets the caller's own ``common`` object
    rather than a copy sent over.

    This base class runs ``shards`` shards one after the other in this process (the cluster
    ``Cluster("serial", shards=N)``: the seam without a cluster, for tests)."""

    kind = "serial"
    driver = True
    shared_state = False
    rank = 0  # this process's place among the workers of the program (a torchrun rank's)

    def __init__(self, shards: int = 1) -> None:
        self.shards = max(1, int(shards))

    def open(self) -> bool:
        """Connect; True when this call made the connection (then :meth:`close` ends it)."""
        return False

    def close(self) -> None:
        pass

    def workers(self) -> int:
        """How many shards to cut: one per worker."""
        return self.shards

    def run(self, fn: Callable[[Any, Any], Iterator[tuple]], common: Any,
            shards: Sequence[Any]) -> Iterator[tuple[int, tuple]]:
        """``(shard index, message)`` of every shard's ``fn(common, shard)``, as they come."""
        for k, shard in enumerate(shards):
            for message in run_shard(fn, common, shard):
                yield k, message

    def share(self, value: Any) -> Any:
        """The driver's ``value``, on every worker of the program (torch ranks); else itself."""
        return value

    def gather(self, value: Any) -> list[Any]:
        """Every worker's ``value`` in worker order, on every worker of the program (torch ranks,
        each with its own ``value``); else ``[value]``."""
        return [value]

    def where(self, k: int) -> str:
        """How messages name worker ``k``."""
        return f"shard {k}"


def _to_root(record: logging.LogRecord) -> None:
    """Pass ``record`` to the root logger's handlers (where a qir record goes when it propagates)."""
    logging.getLogger().handle(record)


class _Capture(logging.Handler):
    """Keeps the WARNING and ERROR records of qir's loggers as ``("log", level, logger, text)``;
    passes the others (progress lines) on to the root logger's handlers."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[tuple] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.messages.append(("log", record.levelno, record.name, record.getMessage()))
        else:
            _to_root(record)


def run_shard(fn: Callable[[Any, Any], Iterator[tuple]], common: Any, shard: Any) -> Iterator[tuple]:
    """``fn(common, shard)``'s messages, with the warnings qir logs meanwhile as ``log`` messages
    placed before the message that follows them (not printed here: :func:`relog` logs them once
    on the driver). An error of qir's (:class:`~qir.errors.QirError`) becomes an ``error``
    message ending the shard, which :func:`raise_remote` raises again on the driver."""
    root = logging.getLogger("qir")
    capture, propagate = _Capture(), root.propagate
    root.addHandler(capture)
    root.propagate = False
    try:
        for message in fn(common, shard):
            yield from _drain(capture)
            yield message
        yield from _drain(capture)
    except QirError as exc:
        yield from _drain(capture)
        yield ("error", type(exc).__name__, str(exc))
    finally:
        root.removeHandler(capture)
        root.propagate = propagate


def _drain(capture: _Capture) -> list[tuple]:
    out, capture.messages = capture.messages, []
    return out


def follow(executor: Executor, fn: Callable[[Any, Any], Iterator[tuple]], common: Any,
           shards: Sequence[Any]) -> Iterator[tuple[int, tuple]]:
    """``(shard, message)`` of the shards' messages other than ``log`` (logged once, :func:`relog`)
    and ``error``: the first worker error is raised, at once, or when the workers are ranks of one
    program (``shared_state``) once every rank is done, on every rank, so that all stop with it."""
    seen: set = set()
    error = None
    for k, message in executor.run(fn, common, shards):
        if message[0] == "log":
            relog(message, seen)
        elif message[0] == "error":
            error = error or (message, executor.where(k))
            if not executor.shared_state:
                raise_remote(*error)
        else:
            yield k, message
    if executor.shared_state:
        error = executor.share(error)
    if error:
        raise_remote(*error)


def relog(message: tuple, seen: set) -> None:
    """Log a worker's ``log`` message on the driver, once however many workers sent it."""
    _, level, name, text = message
    source = logging.getLogger(name)
    if (level, name, text) not in seen and source.isEnabledFor(level):
        seen.add((level, name, text))
        _to_root(source.makeRecord(name, level, "(worker)", 0, text, (), None))


def raise_remote(message: tuple, where: str) -> None:
    """Raise a worker's ``error`` message as the qir error it was, naming the worker."""
    _, kind, text = message
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, QirError):
        raise cls(f"{where}: {text}")
    raise QirError(f"{where}: {kind}: {text}")  # not qir's: its kind says what it was
