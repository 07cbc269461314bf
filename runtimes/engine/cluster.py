"""Where the engine's work runs: the executor seam.

A *cluster* names where the variants of an analysis (and the samples of the bad-case search)
are evaluated:

- ``local`` (or None, the default): this process, as the engine always ran (threads);
- ``ray``: a Ray cluster (:mod:`.ray_cluster`); ``auto`` is the Ray cluster this machine belongs
  to (``ray start``), ``ray://HOST:PORT`` one reached through the Ray client, ``ray`` the Ray this
  process is connected to (``ray.init(...)`` before), else a new one on this machine;
- ``torch``: the ranks of a ``torchrun`` job (:mod:`.torch_cluster`): ``RANK`` / ``WORLD_SIZE``
  from the environment, gloo on CPU, nccl where CUDA is present; every rank runs the same
  program, rank 0 gathers the results and writes the files.

The work is cut into *shards* (:mod:`.shards`), one per worker: variants longest first to the
least-loaded worker by their predicted cost, samples in equal counts. A shard runs a *shard
function* ``fn(common, shard)``, a generator of messages (:mod:`.executor`: the warnings it logs
become messages too, which the driver logs once, not once per worker); the executor's
:meth:`~.executor.Executor.run` streams every shard's messages to the driver as they come.

``Engine(cluster=...)`` and ``find_bad_cases(cluster=...)`` take one; without it they use the
one set by :func:`use_cluster` (the command line's ``--cluster``), else local. A workflow that
every rank of a program runs (QuantAnalysis) also finds a process group the program made itself
(:func:`program_cluster`).
"""
from __future__ import annotations

import contextvars
import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from qir import errors
from qir.errors import InputError
from qir.runtimes.engine.executor import Executor

__all__ = ["Cluster", "parse_cluster", "use_cluster", "current_cluster", "program_cluster", "executor_for",
           "CLUSTER_CHOICES"]

CLUSTER_CHOICES = "local, auto (the Ray cluster this machine belongs to), ray://HOST:PORT, ray or torch (inside torchrun)"
_RAY_CLIENT = re.compile(r"^ray://(?P<host>[^:/\s]+|\[[0-9a-fA-F:]+\]):(?P<port>\d{1,5})$")


@dataclass(frozen=True)
class Cluster:
    """A parsed cluster: ``kind`` ``ray`` or ``torch`` (or ``serial``: ``shards`` shards one after
    the other in this process); ``address`` the Ray address (``auto``, ``ray://HOST:PORT``, or
    None for the connected or a new local Ray)."""

    kind: str
    address: str | None = None
    shards: int = 1

    def __str__(self) -> str:
        return self.address or self.kind


def parse_cluster(spec: "str | Cluster | None") -> Cluster | None:
    """``spec`` as a :class:`Cluster` (None for local); one clear error for anything else, e.g.
    a Ray client address without a valid port."""
    if spec is None or isinstance(spec, Cluster):
        return spec
    if not isinstance(spec, str):
        raise InputError(f"cluster must be a string ({CLUSTER_CHOICES}), got {type(spec).__name__}")
    text = spec.strip()
    if text in ("", "local"):
        return None
    if text in ("ray", "auto"):
        return Cluster("ray", None if text == "ray" else "auto")
    if text == "torch":
        return Cluster("torch")
    match = _RAY_CLIENT.match(text)
    if match and 1 <= int(match["port"]) <= 65535:
        return Cluster("ray", text)
    if text.startswith("ray://"):
        raise InputError(f"cluster {errors.shown(spec)}: a Ray client address is ray://HOST:PORT with a port in "
                         "1..65535 (the head node's client port, 10001 by default)")
    raise InputError(f"unknown cluster {errors.shown(spec)}; give {CLUSTER_CHOICES}")


_CURRENT: contextvars.ContextVar[Cluster | None] = contextvars.ContextVar("qir_cluster", default=None)


def current_cluster() -> Cluster | None:
    """The cluster set by :func:`use_cluster` (None: local)."""
    return _CURRENT.get()


def program_cluster(spec: "str | Cluster | None" = None) -> Cluster | None:
    """Where a workflow that every rank of a program runs (QuantAnalysis) works: ``spec`` when
    given (``local``: this process alone); else the cluster set by :func:`use_cluster`; else, in a
    program that initialised a ``torch.distributed`` process group of more than one rank itself
    (``torch.multiprocessing.spawn`` and ``dist.init_process_group``, no torchrun), its ranks
    (``torch``); else local."""
    if spec is not None:
        return parse_cluster(spec)
    if current_cluster() is not None:
        return current_cluster()
    from qir.runtimes.engine.torch_cluster import in_process_group

    return Cluster("torch") if in_process_group() else None


@contextmanager
def use_cluster(spec: "str | Cluster | None") -> Iterator[Cluster | None]:
    """Run the engine and the bad-case search on ``spec`` inside the block (the default of
    ``cluster=``). Connects first (a bad address fails here, before any work); a torch process
    group or a Ray connection made here is closed at the end."""
    cluster = parse_cluster(spec)
    opened = executor_for(cluster).open() if cluster is not None else False
    token = _CURRENT.set(cluster)
    try:
        yield cluster
    finally:
        _CURRENT.reset(token)
        if opened:
            executor_for(cluster).close()


def executor_for(cluster: Cluster | None) -> Executor:
    """The executor of ``cluster`` (None, ``serial``: in this process, shard after shard)."""
    if cluster is None or cluster.kind == "serial":
        return Executor(cluster.shards if cluster else 1)
    if cluster.kind == "ray":
        from qir.runtimes.engine.ray_cluster import RayExecutor

        return RayExecutor(cluster.address)
    from qir.runtimes.engine.torch_cluster import TorchExecutor

    return TorchExecutor()
