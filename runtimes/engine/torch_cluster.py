"""Shards on the ranks of a ``torchrun`` job (:mod:`.cluster` for the seam).

Every rank runs the same program on the same arguments (``torchrun --nproc_per_node=N -m qir
sensitivity ... --cluster torch``, or a script that builds the same engine on every rank, as
QuantAnalysis' multi-machine example does). The engine's work is collective:

- **Joining.** ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` come from the
  environment torchrun sets; the process group is gloo on CPU and nccl where CUDA is present
  (one GPU per local rank; qir's engine itself computes on the CPU). A process group the
  program initialised itself is used as it is (``torch.multiprocessing.spawn`` and
  ``dist.init_process_group``, as QuantAnalysis' multi-machine example does: QuantAnalysis
  finds it, :func:`in_process_group`). qir's own messages go through a gloo group (objects, on
  the CPU, whatever the backend).
- **Shards.** Rank 0 is the driver: it decides the shards (one per rank) and broadcasts them;
  every rank evaluates its own with its own engine (the variants' rows need nothing from the
  other ranks) and sends its messages to rank 0 as they are made: a header (the message's
  size, tag 1) received from any rank, then the message (tag 2) from that rank. Rank 0 runs its
  own shard in a thread meanwhile, writes the rows, and at the end broadcasts the results, so
  that every rank returns the same thing.
- **Faults.** A rank that dies ends the job: torchrun stops the others (SIGTERM), or rank 0's
  receive fails first; either way rank 0 ends with one error naming the rank and what to do,
  the rows received so far being in its results file (``--resume`` continues from them). An
  error a rank raises (a file missing there) reaches every rank, which all stop with it.
"""
from __future__ import annotations

import logging
import os
import pickle
import queue
import signal
import sys
import threading
from datetime import timedelta
from typing import Any, Callable, Iterator, Sequence

from qir.errors import ExecutionError, InputError
from qir.runtimes.engine.executor import Executor, run_shard

__all__ = ["TorchExecutor", "TIMEOUT", "in_process_group"]

logger = logging.getLogger(__name__)

TIMEOUT = timedelta(hours=12)  # how long a rank waits for the others (rank 0 may spend long between analyses)
_HEADER, _BODY = 1, 2  # message tags
_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_GROUP: dict[str, Any] = {}  # the gloo group qir's messages use (made once per process group)


def _dist():
    try:
        import torch.distributed as dist
    except ImportError:
        raise InputError("running under torchrun needs torch: pip install 'qir[torch]'") from None
    if not dist.is_available():
        raise InputError("this torch build has no torch.distributed; install a build with it to run under torchrun")
    return dist


def in_process_group() -> bool:
    """Whether this program has initialised a default process group of more than one rank (torch
    is not imported here: a program without it has none)."""
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


class TorchExecutor(Executor):
    """Shards on torchrun's ranks (see the module docstring)."""

    kind = "torch"
    shared_state = True

    def open(self) -> bool:
        """Join the process group from torchrun's environment, unless the program already has."""
        dist = _dist()
        made = False
        if not dist.is_initialized():
            missing = [k for k in _ENV if k not in os.environ]
            if missing:
                raise InputError(f"cluster 'torch' runs inside a torchrun job, but {', '.join(missing)} "
                                 f"{'is' if len(missing) == 1 else 'are'} not set: start it with torchrun "
                                 "--nproc_per_node=N -m qir ... --cluster torch")
            import torch

            backend = "nccl" if torch.cuda.is_available() else "gloo"
            if backend == "nccl":  # one GPU per local rank (shared round-robin when there are fewer GPUs)
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
            dist.init_process_group(backend, timeout=TIMEOUT)
            made = True
        self.group()
        return made

    def close(self) -> None:
        dist = _dist()
        _GROUP.clear()
        if dist.is_initialized():
            dist.destroy_process_group()

    def group(self):
        """The gloo group of qir's messages: the default group when it is gloo, else one made once."""
        dist = _dist()
        if not dist.is_initialized():
            self.open()
        key = str(id(dist.group.WORLD))
        if key not in _GROUP:
            _GROUP.clear()
            _GROUP[key] = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo", timeout=TIMEOUT)
        return _GROUP[key]

    @property
    def rank(self) -> int:
        self.group()
        return _dist().get_rank()

    @property
    def driver(self) -> bool:  # type: ignore[override]
        return self.rank == 0

    def workers(self) -> int:
        self.group()
        return _dist().get_world_size()

    def where(self, k: int) -> str:
        return f"rank {k} of {self.workers()}"

    # ------------------------------------------------------------------ messages
    def _send(self, message: tuple) -> None:
        import torch

        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        dist, group = _dist(), self.group()
        dist.send(torch.tensor([len(data)], dtype=torch.int64), dst=0, group=group, tag=_HEADER)
        dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), dst=0, group=group, tag=_BODY)

    def _receive(self) -> tuple[int, tuple]:
        import torch

        dist, group = _dist(), self.group()
        size = torch.zeros(1, dtype=torch.int64)
        src = dist.recv(size, group=group, tag=_HEADER)
        body = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.recv(body, src=src, group=group, tag=_BODY)
        return src, pickle.loads(body.numpy().tobytes())

    def share(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""
        box = [value if self.rank == 0 else None]
        _dist().broadcast_object_list(box, src=0, group=self.group())
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, by rank, on every rank."""
        out: list[Any] = [None] * self.workers()
        _dist().all_gather_object(out, value, group=self.group())
        return out

    # ------------------------------------------------------------------ shards
    def run(self, fn: Callable[[Any, Any], Iterator[tuple]], common: Any,
            shards: Sequence[Any]) -> Iterator[tuple[int, tuple]]:
        """Rank 0: every rank's messages as they come; another rank: its own shard's messages go to
        rank 0 and nothing is yielded. Rank 0's ``shards`` are the ones every rank runs."""
        shards = list(self.share(list(shards)))
        rank, world = self.rank, self.workers()
        mine = shards[rank] if rank < len(shards) else None
        if rank != 0:
            self._serve(fn, common, mine)
            return
        messages: queue.Queue = queue.Queue()
        own = threading.Thread(target=self._run_own, args=(fn, common, mine, messages), name="qir-rank0", daemon=True)
        own.start()
        receiver = threading.Thread(target=self._receive_all, args=(world - 1, messages), name="qir-recv", daemon=True)
        receiver.start()
        yield from self._follow(messages, world)

    def _serve(self, fn, common, shard) -> None:
        """A rank other than 0: run its shard, sending each message to rank 0, then ``done``."""
        try:
            if shard is not None:
                for message in run_shard(fn, common, shard):
                    self._send(message)
        except Exception as exc:  # a bug on this rank: rank 0 (and so every rank) stops with it
            self._send(("error", "ExecutionError", f"{type(exc).__name__}: {exc}"))
        self._send(("done",))

    @staticmethod
    def _run_own(fn, common, shard, messages: queue.Queue) -> None:
        try:
            if shard is not None:
                for message in run_shard(fn, common, shard):
                    messages.put((0, message))
            messages.put((0, ("done",)))
        except BaseException as exc:  # noqa: BLE001 (raised again in the main thread)
            messages.put((0, exc))

    def _receive_all(self, others: int, messages: queue.Queue) -> None:
        done = 0
        while done < others:
            try:
                src, message = self._receive()
            except Exception as exc:  # noqa: BLE001 (a rank died: its connection closed)
                messages.put((-1, exc))
                return
            done += message[0] == "done"
            messages.put((src, message))

    def _follow(self, messages: queue.Queue, world: int) -> Iterator[tuple[int, tuple]]:
        """Rank 0's loop over the ranks' messages until every rank is done; a lost rank, or
        SIGTERM from torchrun, is an ExecutionError (raised here, where the loop looks, never in
        the code that consumes the messages: a signal can arrive while that runs)."""
        done = 0
        stopped = threading.Event()
        installed, previous = _on_sigterm(stopped)
        try:
            while done < world:
                if stopped.is_set():
                    raise ExecutionError("this torchrun job was stopped (SIGTERM: torchrun stops every rank when one "
                                         "fails; its report names the rank)")
                try:
                    k, message = messages.get(timeout=0.5)
                except queue.Empty:
                    continue
                if isinstance(message, BaseException):
                    if k == 0:
                        raise message
                    raise ExecutionError(f"a rank of this torchrun job stopped before finishing its shard "
                                         f"({type(message).__name__}: {str(message).splitlines()[0][:200]})")
                if message[0] == "done":
                    done += 1
                    continue
                yield k, message
        finally:
            if installed:
                signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _on_sigterm(stopped: threading.Event) -> tuple[bool, Any]:
    """Make SIGTERM set ``stopped`` (in the main thread): ``(True, the handler replaced)``;
    ``(False, None)`` off the main thread, where nothing is changed."""
    if threading.current_thread() is not threading.main_thread():
        return False, None

    def stop(signum, frame):
        stopped.set()

    return True, signal.signal(signal.SIGTERM, stop)
