"""Shards on a Ray cluster (``pip install 'qir[ray]'``; :mod:`.cluster` for the seam).

- **Connecting.** ``auto`` joins the Ray cluster this machine belongs to (``ray start --head``
  there before), ``ray://HOST:PORT`` reaches one through the Ray client; without an address the
  Ray this process has already initialised is used, else a new one starts on this machine. An
  address that cannot be reached is one clear error.
- **Workers.** One shard per CPU of the cluster; each is a Ray task asking for one CPU, whose
  engine uses one core. The shared part of the work (the model, the data or its path, the
  options) is put in the object store once.
- **Streaming.** A shard task is a Ray generator: each message it yields (a job's rows) reaches
  the driver as soon as it is produced, not when the shard ends. Through the Ray client
  (``ray://``), which has no generators, a shard's rows come when it ends.
- **Faults.** A worker that dies (its process killed, its machine lost) has its task re-run by
  Ray (``max_retries``); Ray replays a generator without sending again what it had already
  sent, and the driver drops any row it already has. A task that still fails ends the analysis
  with one error; the rows so far are in the results file, for ``--resume``.
- Workers' warnings come back as messages, logged once by the driver (:func:`.cluster.run_shard`).
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable, Iterator, Sequence

from qir.errors import ExecutionError, InputError, QirError
from qir.runtimes.engine.executor import Executor, run_shard

__all__ = ["RayExecutor", "MAX_RETRIES", "ray_module"]

logger = logging.getLogger(__name__)

MAX_RETRIES = 3  # re-runs of a shard whose worker died
_END = object()


def ray_module():
    """``ray``, or an InputError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise InputError("running on a Ray cluster needs Ray: pip install 'qir[ray]' (or pip install ray)") from None
    return ray


def _shard_task(fn: Callable, common: Any, shard: Any) -> Iterator[tuple]:
    """The body of a shard's Ray task (a generator: messages stream back as they are made)."""
    yield from run_shard(fn, common, shard)


class RayExecutor(Executor):
    """Shards as Ray tasks (see the module docstring)."""

    kind = "ray"

    def __init__(self, address: str | None = None) -> None:
        super().__init__()
        self.address = address

    def open(self) -> bool:
        """Connect to Ray (see the module docstring); True when this call initialised it."""
        ray = ray_module()
        if ray.is_initialized():
            return False
        try:
            ray.init(address=self.address, logging_level=logging.WARNING, include_dashboard=False)
        except Exception as exc:  # ConnectionError, a client that cannot reach the head, a bad address
            where = {None: "on this machine", "auto": "that this machine belongs to (auto)"}.get(self.address,
                                                                                             f"at {self.address}")
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            raise InputError(f"cannot connect to a Ray cluster {where} ({type(exc).__name__}: "
                             f"{(lines[-1] if lines else '')[:300]}); "
                             "start one with `ray start --head` (or check the address and port), or leave --cluster "
                             "out to run here") from None
        return True

    def close(self) -> None:
        ray_module().shutdown()

    def workers(self) -> int:
        ray = ray_module()
        self.open()
        return max(1, int(ray.cluster_resources().get("CPU", 1)))

    def where(self, k: int) -> str:
        return f"Ray worker (shard {k})"

    def run(self, fn: Callable[[Any, Any], Iterator[tuple]], common: Any,
            shards: Sequence[Any]) -> Iterator[tuple[int, tuple]]:
        """Every shard's messages, as they come (one driver thread follows each shard)."""
        ray = ray_module()
        self.open()
        if not shards:
            return
        shared = ray.put(common)
        if _through_client(ray):  # the Ray client has no generators: a shard's messages come when it ends
            task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES)(_shard_messages)
            pending = [task.remote(fn, shared, shard) for shard in shards]
            sources = [(lambda ref=ref: iter(ray.get(ref))) for ref in pending]
        else:
            task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES)(_shard_task)
            pending = [task.remote(fn, shared, shard) for shard in shards]
            sources = [(lambda gen=gen: (ray.get(ref) for ref in gen)) for gen in pending]
        messages: queue.Queue = queue.Queue()

        def follow(k: int, source: Callable[[], Iterator[tuple]]) -> None:
            try:
                for message in source():
                    messages.put((k, message))
                messages.put((k, _END))
            except BaseException as exc:  # noqa: BLE001 (raised again in the driver's thread)
                messages.put((k, exc))

        threads = [threading.Thread(target=follow, args=(k, source), name=f"qir-ray-{k}", daemon=True)
                   for k, source in enumerate(sources)]
        for t in threads:
            t.start()
        running = len(threads)
        try:
            while running:
                k, message = messages.get()
                if message is _END:
                    running -= 1
                elif isinstance(message, BaseException):
                    raise self._failure(ray, k, message)
                else:
                    yield k, message
        finally:
            if running:  # the analysis failed: stop the other shards
                for ref in pending:
                    try:
                        ray.cancel(ref, force=True)
                    except Exception:  # noqa: BLE001 (already finished, or not cancellable)
                        pass
            for t in threads:
                t.join(timeout=5)

    def _failure(self, ray, k: int, exc: BaseException) -> BaseException:
        """The error a shard's failure ends the analysis with: a qir error raised in the task as
        itself, a worker lost for good (Ray's retries spent) as an ExecutionError; anything else
        as it is."""
        cause = getattr(exc, "cause", None)
        if isinstance(cause, QirError):
            return type(cause)(f"{self.where(k)}: {cause}")
        if isinstance(exc, ray.exceptions.RayTaskError):
            return ExecutionError(f"{self.where(k)} failed: {type(cause or exc).__name__}: {cause or exc}")
        if isinstance(exc, ray.exceptions.RayError):
            first = str(exc).splitlines()[0][:300] if str(exc) else ""
            return ExecutionError(f"{self.where(k)} was lost and Ray's {MAX_RETRIES} re-runs of its shard did not "
                                  f"finish it ({type(exc).__name__}: {first})")
        return exc


def _shard_messages(fn: Callable, common: Any, shard: Any) -> list[tuple]:
    """The body of a shard's Ray task through the Ray client: every message, at the end."""
    return list(run_shard(fn, common, shard))


def _through_client(ray) -> bool:
    """Whether this process reaches Ray through the Ray client (``ray://``)."""
    try:
        return bool(ray.util.client.ray.is_connected())
    except AttributeError:
        return False
