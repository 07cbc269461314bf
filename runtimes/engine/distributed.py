"""The engine on a cluster (:mod:`.cluster`): variants in cost-balanced shards, rows streamed back.

The driver (this process; rank 0 of a torchrun job):

1. opens ``engine_results.jsonl`` as a local run does (``resume`` keeps the rows it holds, from
   any executor: the file does not say where rows were computed) and finds the (variant,
   sample) pairs missing;
2. predicts each pending variant's cost (:mod:`.shards`: its cone's predicted work, or the step
   times the engine measured, times its missing samples) and assigns the variants to one shard per worker,
   longest first to the least-loaded (LPT);
3. runs the shards: each worker's own engine (its own reference cache) evaluates its variants on
   every sample with missing rows, and its rows stream back as they are produced; the driver
   appends each to the results file once (a shard re-run after its worker died sends rows again:
   they are dropped), and gathers the samples left out and the workers' statistics.

What is sent to a Ray worker (:class:`EngineSpec`, put in the object store once per analysis):
the model file's path, its SHA-1 and the shapes it was loaded with when the IR is unchanged since
:func:`qir.api.load` read it (:func:`qir.io.sources.loaded_from`), else the IR itself, pickled once; the
data's path when the samples came from a file or folder (with ``data_num``), else the samples'
arrays, once; the engine's options and the variants. A worker on another machine reads the same
paths, so they must be on a shared filesystem; it checks that the model file has the same SHA-1
and that its samples have the driver's digest (the analysis fingerprint), else the shard fails
with an error naming the difference. Ranks of a torchrun job run the same program on the same
arguments: each uses its own engine, and only the shards' variants and the rows are exchanged.

The results equal the local executor's: every worker's engine is the same engine, and a
variant's rows do not depend on which other variants share its engine (batched rows are checked
bit for bit against single runs; :mod:`.rows`).
"""
from __future__ import annotations

import hashlib
import logging
import pickle
import queue
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from qir.errors import ExecutionError, InputError
from qir.graph import QIR
from qir.io.onnx_import import import_onnx
from qir.io.sources import loaded_from
from qir.runtimes.engine.cluster import executor_for
from qir.runtimes.engine.executor import follow
from qir.runtimes.engine.results import PEAK_STATS, SUMMED_STATS, EngineResult, EngineStats, ResultsFile, open_results
from qir.runtimes.engine.shards import lpt, step_costs, step_work, variant_costs
from qir.runtimes.engine.variants import Variant
from qir.runtimes.progress import Progress

__all__ = ["EngineSpec", "EngineCommon", "EngineShard", "engine_spec", "engine_shard", "evaluate_distributed",
           "model_payload", "load_model", "data_payload", "assign_shards", "stream"]

logger = logging.getLogger(__name__)



@dataclass
class EngineSpec:
    """What a worker builds its engine from (see the module docstring)."""

    model: ModelPayload
    data: DataPayload
    options: Any  # the driver's EngineOptions
    variants: list[Variant]
    engine: type  # the engine class (sent by reference: the worker imports it)
    threads: int = 1  # cores a worker's engine uses (a Ray task asks for this many CPUs)


# ------------------------------------------------------------------------------ what is sent
@dataclass(frozen=True)
class ModelPayload:
    """The model as sent to workers (:func:`model_payload`): its file (``path``, ``sha1``,
    ``input_shapes``), or the IR ``pickle``d."""

    path: str | None = None
    sha1: str | None = None
    input_shapes: dict[str, list[int]] | None = None
    pickle: bytes | None = None


@dataclass(frozen=True)
class DataPayload:
    """The data as sent to workers (:func:`data_payload`): its ``path``, or the ``samples``."""

    path: str | None = None
    samples: list[dict[str, np.ndarray]] | None = None

    @property
    def data(self) -> str | list[dict[str, np.ndarray]]:
        """What :func:`qir.data.model_samples` reads on the worker."""
        return self.path if self.path is not None else self.samples


_SHA1: dict[tuple, str] = {}  # (path, size, mtime) -> SHA-1 of the file


def _file_sha1(path: Path) -> str:
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _SHA1:
        h = hashlib.sha1()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _SHA1[key] = h.hexdigest()
    return _SHA1[key]


def model_payload(ir: QIR) -> ModelPayload:
    """The model as sent to workers: its file (path, SHA-1, input shapes) while the IR is what
    :func:`qir.api.load` read from it, else the IR pickled."""
    source = loaded_from(ir)
    if source is not None:
        path, shapes = source
        return ModelPayload(path=path, sha1=_file_sha1(Path(path)), input_shapes=shapes)
    return ModelPayload(pickle=pickle.dumps(ir.clone(), protocol=pickle.HIGHEST_PROTOCOL))


def load_model(payload: ModelPayload) -> QIR:
    """The IR of a :func:`model_payload`; a file missing here or other than the driver's is an InputError."""
    if payload.pickle is not None:
        return pickle.loads(payload.pickle)
    path = Path(payload.path)
    where = socket.gethostname()
    if not path.is_file():
        raise InputError(f"the model file {path} is not on this worker ({where}); workers read the model from the "
                         "driver's path: put it on a filesystem every machine shares")
    if _file_sha1(path) != payload.sha1:
        raise InputError(f"the model file {path} on this worker ({where}) differs from the driver's (another SHA-1); "
                         "give every machine the same file")
    return import_onnx(path, input_shapes=payload.input_shapes)


def data_payload(data: Any, samples) -> DataPayload:
    """The data as sent to workers: its path when it is a file or folder, else the samples' arrays."""
    if isinstance(data, (str, Path)):
        return DataPayload(path=str(Path(data).resolve()))
    return DataPayload(samples=[{k: np.asarray(v) for k, v in sample.items()} for sample in samples])


def engine_spec(engine, variants: list[Variant]) -> EngineSpec:
    """What a worker needs to build ``engine`` again and check it analyses the same thing."""
    return EngineSpec(model_payload(engine.ir), data_payload(engine.data, engine.samples), engine.options,
                      list(variants), type(engine))


def _build_engine(spec: EngineSpec):
    return spec.engine(load_model(spec.model), spec.data.data, spec.options.for_worker(spec.threads))


# ------------------------------------------------------------------------------ the worker
def stream(run: Callable[[Callable[..., None]], None]) -> Iterator[tuple]:
    """``("rows", rows, skipped)`` for each ``emit(rows, skipped)`` that ``run(emit)`` makes, as it
    makes them (``run`` works in a thread); its exception is raised here."""
    messages: queue.Queue = queue.Queue()
    end = object()

    def target() -> None:
        try:
            run(lambda rows, skipped=0: messages.put(("rows", list(rows), skipped)))
            messages.put(end)
        except BaseException as exc:  # noqa: BLE001 (raised again in the reading thread)
            messages.put(exc)

    thread = threading.Thread(target=target, name="qir-shard", daemon=True)
    thread.start()
    while (message := messages.get()) is not end:
        if isinstance(message, BaseException):
            raise message
        yield message
    thread.join()


@dataclass(frozen=True)
class EngineCommon:
    """What every shard of an evaluation shares: the worker's own ``engine`` (a torchrun rank's,
    a copy of the driver's program), the driver's ``analysis`` fingerprint and the ``variants``;
    or the ``spec`` a worker builds its engine from."""

    engine: Any = None
    analysis: str | None = None
    variants: list[Variant] | None = None
    spec: EngineSpec | None = None


@dataclass(frozen=True)
class EngineShard:
    """One worker's share of an evaluation: the driver's ``analysis`` fingerprint, the names of
    its ``variants``, and the ``(variant, sample)`` rows already ``done``."""

    analysis: str
    variants: list[str]
    done: list[tuple[str, int]]


def engine_shard(common: EngineCommon, shard: EngineShard) -> Iterator[tuple]:
    """A worker's shard (a shard function of :mod:`.cluster`): its variants on every sample whose
    row is missing, with the worker's own engine (``common.engine``, a torchrun rank's) or one
    built from ``common.spec``. Messages: ``rows`` as produced, then ``left_out`` and ``stats``."""
    start = time.perf_counter()
    engine = common.engine
    if engine is None:
        engine = _build_engine(common.spec)
        mine = engine.fingerprint(common.spec.variants, engine.data_digest())
    else:
        mine = common.analysis
    if mine != shard.analysis:
        raise InputError("this worker's analysis differs from the driver's: its model, data or options are not the "
                         "same (check that every machine reads the same files)")
    by_name = {v.name: v for v in (common.spec.variants if common.spec is not None else common.variants)}
    variants = [by_name[name] for name in shard.variants]
    done = {(name, int(s)) for name, s in shard.done}
    yield from stream(lambda emit: engine.evaluate_missing(variants, done, emit))
    yield ("left_out", dict(engine._left_out))
    yield ("stats", engine._final_stats(start))


# ------------------------------------------------------------------------------ the driver
def assign_shards(engine, variants: list[Variant], pending: dict[int, int], workers: int) -> list[list[int]]:
    """Indices of ``variants`` (those in ``pending``: index -> its missing samples) in at most
    ``workers`` non-empty shards, by LPT on the predicted cost (:mod:`.shards`) times the missing samples."""
    order = sorted(pending)
    measured = getattr(engine.ref_cache, "step_cost", None)
    costs = step_costs(step_work(engine.ir, engine.plan), measured)
    changed = [list(engine.variant_records.changes(variants[i])) for i in order]
    cost = variant_costs(engine.plan, costs, changed, whole=engine.whole is not None)
    cost = cost * np.array([pending[i] for i in order], np.float64)
    return [[order[j] for j in shard] for shard in lpt(cost, min(workers, len(order))) if shard]


def evaluate_distributed(engine, variants: list[Variant], out_dir: str | Path | None, *, resume: bool,
                         force: bool) -> EngineResult:
    """:meth:`.engine.Engine.evaluate` on ``engine.cluster`` (see the module docstring)."""
    executor = executor_for(engine.cluster)
    executor.open()
    start = time.perf_counter()
    count = len(engine.samples)
    data = engine.data_digest()
    analysis = engine.fingerprint(variants, data)
    if executor.driver:
        rows, results = open_results(out_dir, analysis, variants, count, resume=resume, force=force, data=data)
    else:
        rows, results = [], ResultsFile(None)
    done = {(r["variant"], r["sample"]) for r in rows}
    missing = {i: sum((v.name, s) not in done for s in range(count)) for i, v in enumerate(variants)}
    shards = assign_shards(engine, variants, {i: n for i, n in missing.items() if n}, executor.workers())
    tasks = [EngineShard(analysis, [variants[i].name for i in shard],
                         sorted((n, s) for n, s in done if n in {variants[i].name for i in shard})) for shard in shards]
    common = (EngineCommon(engine=engine, analysis=analysis, variants=variants) if executor.shared_state
              else EngineCommon(spec=engine_spec(engine, variants)))
    bar = engine._bar(len(variants), len(done)) if executor.driver else Progress()
    gathered = _gather(executor, common, tasks, rows, results, done, bar)
    shared = executor.share(gathered)
    engine.check_left_out(shared["left_out"])
    stats = _merged_stats(engine, shared["stats"], start, len(tasks))
    return engine.result(shared["rows"], variants, stats, shared["left_out"])


def _gather(executor, common: EngineCommon, tasks: list[EngineShard], rows: list[dict], results: ResultsFile, done: set,
            bar: Progress) -> dict[str, Any]:
    """Run the shards (:func:`.executor.follow`) and take in their messages: each new row into
    ``rows`` and the results file (a row already there is dropped), the samples left out, the
    workers' statistics. Returns them."""
    left_out: dict[int, str] = {}
    stats: list[EngineStats] = []
    try:
        for _, message in follow(executor, engine_shard, common, tasks):
            kind = message[0]
            if kind == "rows":
                new = [r for r in message[1] if (r["variant"], r["sample"]) not in done]
                done.update((r["variant"], r["sample"]) for r in new)
                rows.extend(new)
                results.append(new)
                bar.update(len(new) + message[2])
            elif kind == "left_out":
                left_out.update({int(s): why for s, why in message[1].items()})
            elif kind == "stats":
                stats.append(message[1])
    except ExecutionError as exc:  # a worker lost for good: what is done is in the results file
        raise ExecutionError(f"{exc}; {_resume_hint(results, len(rows))}") from None
    finally:
        bar.close()
    return {"rows": rows, "left_out": left_out, "stats": stats}


def _resume_hint(results: ResultsFile, count: int) -> str:
    if results.path is None:
        return "no results file was kept (give an output folder to continue an interrupted analysis)"
    return (f"the {count} rows computed so far are in {results.path}; run the same command again with --resume "
            "to compute the rest")


def _merged_stats(engine, stats: list[EngineStats], start: float, shards: int) -> EngineStats:
    """The workers' statistics summed (peaks: the largest), with the driver's time and the shards."""
    out: dict[str, Any] = {key: type(engine.stats.get(key, 0))(sum(getattr(s, key) for s in stats))
                           for key in SUMMED_STATS}
    out.update({key: max((getattr(s, key) for s in stats), default=0) for key in PEAK_STATS})
    return EngineStats(**out, seconds=round(time.perf_counter() - start, 3), steps=len(engine.plan.steps),
                       segments=len(engine.plan.segments), batch=engine.batch, cluster=str(engine.cluster), shards=shards)
