"""Both models of a comparison run on one sample with every layer kept (:class:`LayerRun`), the
layers a comparison reports, and the shadow re-run of a layer on the baseline's inputs through
its own quantizers (see :mod:`qir.passes.layer_compare` for the maths)."""
from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from qir.calibration import QRANGE
from qir.errors import InputError, shown
from qir.execution import Level, Runtime
from qir.files import atomic_write
from qir.graph import QIR
from qir.kinds import NodeKind
from qir.metrics import nonfinite_note
from qir.passes.lib.fusion import fusion_groups, unit_of
from qir.passes.lib.model_pair import level_runtime, model_pair
from qir.records import CalibRecord, OpRecord
from qir.runtimes.engine.cache import release_free_memory
from qir.runtimes.numerics import apply_calibration, clip_only
from qir.runtimes.numpy_ref.interpreter import run_op
from qir.runtimes.progress import track

__all__ = ["LayerRun", "NonFiniteBaseline", "run_layers", "captured_values", "compared_ops", "shadow_outputs"]

logger = logging.getLogger(__name__)


class NonFiniteBaseline(InputError):
    """The baseline's outputs hold NaN or Inf on the sample :func:`run_layers` was given;
    ``note`` says which and how many (:func:`qir.metrics.nonfinite_note`). Analyses over many
    samples catch it and leave that sample out."""

    def __init__(self, message: str, note: str) -> None:
        super().__init__(message)
        self.note = note


@dataclass
class LayerRun:
    """Both models' values on one sample (see the module docstring)."""

    baseline: QIR
    analysis: QIR
    levels: tuple[str, str]
    sample: dict[str, np.ndarray]
    base_values: dict[str, np.ndarray]
    analy_values: dict[str, np.ndarray]

    def base(self, value: str) -> np.ndarray | None:
        """The baseline's value matching the analysis model's ``value`` (:meth:`base_name`)."""
        return self.base_values.get(self.base_name(value))

    def base_name(self, value: str) -> str | None:
        """The baseline value matching the analysis model's ``value``: the same name (or the
        name it had before ``fold-bn`` renamed the quantity, ``ir.meta["value_aliases"]``), else
        the same output of the baseline's node of the same name (a quantizer can rename what a
        node writes: torch.ao, onnxruntime's QDQ)."""
        alias = self.analysis.meta.get("value_aliases", {}).get(value)
        for name in (alias, value):
            if name in self.base_values:
                return name
        op = self.analysis.producer(value) if self.analysis.has_value(value) else None
        twin = self.baseline.node(op.name) if isinstance(op, OpRecord) and self.baseline.has_node(op.name) else None
        if isinstance(twin, OpRecord):
            k = op.outputs.index(value)
            if k < len(twin.outputs) and twin.outputs[k] in self.base_values:
                return twin.outputs[k]
        return None


def run_layers(baseline: Any, analysis: Any, sample: Mapping[str, np.ndarray], *, runtime: str = Runtime.ORT,
               store: str | Path | None = None, memory_budget: int = 512 << 20, level: str = Level.FAKEQUANT,
               march: str | None = None) -> LayerRun:
    """Run both models on ``sample`` keeping every layer's values. With ``store`` (a folder),
    the values spill to ``store/baseline/<k>.npy`` and ``store/analysis/<k>.npy`` as they are
    produced (``k``: the value's index in :func:`captured_values`) and are read back
    memory-mapped, so a large model's layers need not fit in RAM: each model runs once per
    ``memory_budget`` bytes of values it captures. The spill is this run's memory, not a report:
    the index a person reads (``layers.json``) is written by
    :func:`qir.tools.reports.layer_compare.save_layers`. Each file is written atomically and
    replaces one of its name: the caller checks them first (``layer_compare.layer_files``), and no
    other file of ``store`` is touched.

    A sample on which the baseline's outputs hold NaN or Inf is an InputError,
    :class:`NonFiniteBaseline` (the analyses over many samples leave such a sample out; here it
    is the only one): every layer's metrics would score only what is finite, or nothing.

    ``level="integer"`` (numpy runtime, ``march``): the analysis model's values are what that NPU
    computes. Every op output being captured, no GEMM's accumulator takes a following Add there
    (a fused Conv+Add's Conv output exists only when unobserved): its layers compute apart."""
    (base_ir, base_level), (analy_ir, analy_level) = model_pair(baseline, analysis, level)
    run = LayerRun(base_ir, analy_ir, (base_level, analy_level), dict(sample), {}, {})
    for name, ir, ir_level, values in (("baseline", base_ir, base_level, run.base_values),
                                       ("analysis", analy_ir, analy_level, run.analy_values)):
        values.update(_capture(ir, level_runtime(runtime, ir_level, march), sample,
                               None if store is None else Path(store) / name, memory_budget))
        if name == "baseline":
            note = nonfinite_note({v: values[v] for v in base_ir.outputs if v in values})
            if note is not None:
                raise NonFiniteBaseline(f"the baseline model's outputs hold NaN or Inf on this sample ({note}): "
                                        "nothing to compare the layers with; check the input for NaN or infinite "
                                        "values, or choose another sample", note)
    return run


def captured_values(ir: QIR) -> list[str]:
    """The values a run keeps, in a fixed order (a value's index names its ``<k>.npy`` file):
    every op output, then the graph inputs."""
    return list(dict.fromkeys([v for r in ir.ops() for v in r.outputs if v] + list(ir.inputs)))


def _capture(ir: QIR, rt, sample, folder: Path | None, budget: int) -> dict[str, np.ndarray]:
    values = captured_values(ir)
    if folder is None:
        got = rt.run(ir, sample, capture=values)
        return {v: np.asarray(got[v]) for v in values}
    folder.mkdir(parents=True, exist_ok=True)
    chunks, size = [[]], 0
    for v in values:  # (unknown shapes count 0: they go with the chunk at hand)
        shape = ir.value(v).shape or ()
        nbytes = 4 * int(np.prod([d for d in shape if isinstance(d, int)], dtype=np.int64))
        if chunks[-1] and size + nbytes > budget:
            chunks.append([])
            size = 0
        chunks[-1].append(v)
        size += nbytes
    out, model = {}, ir.clone()  # the capture sessions are cached on the clone and go with it
    for chunk in chunks:
        got = rt.run(model, sample, capture=chunk)
        for v in chunk:
            path = atomic_write(folder / f"{values.index(v)}.npy",
                                lambda tmp, a=np.asarray(got[v]): np.save(tmp, a, allow_pickle=False))
            out[v] = np.load(path, mmap_mode="r")
        del got
    del model, rt
    release_free_memory()
    return out


def _readers(ir: QIR, value: str) -> list[CalibRecord]:
    return [r for r in ir.consumers(value) if isinstance(r, CalibRecord)]


def _selected(ir: QIR, op: OpRecord, prefixes: tuple[str, ...], types: tuple[str, ...]) -> bool:
    """Whether the layer ending at ``op`` (its fusion group, if any) has an op matching both."""
    unit = unit_of(ir, op)
    names = [n for o in unit for n in (o.name, o.module) if n]
    if prefixes and not any(n.startswith(p) or fnmatch.fnmatchcase(n, p) for n in names for p in prefixes):
        return False
    return not types or any(o.op_type in types for o in unit)


def _fused_away(ir: QIR) -> set[str]:
    """Ops inside a fusion group other than its last one."""
    return {m for members in fusion_groups(ir).values() for m in members[:-1]}


def compared_ops(ir: QIR, prefixes: Iterable[str] = (), types: Iterable[str] = ()) -> list[OpRecord]:
    """The layers of ``ir`` compared, in order: every op except those inside a fusion group
    before its last op, restricted to name/module-path ``prefixes`` (or globs) and op ``types``
    (a fused layer matches when any of its ops does)."""
    prefixes, types = tuple(prefixes or ()), tuple(types or ())
    skip = _fused_away(ir)
    ops = [op for op in ir.ops() if op.name not in skip and _selected(ir, op, prefixes, types)]
    if (prefixes or types) and not ops:
        raise InputError(f"no layer matches prefixes {shown(list(prefixes))} / types {shown(list(types))}")
    return ops


def shadow_outputs(run: LayerRun, ops: Iterable[OpRecord] | None = None) -> dict[str, tuple | None]:
    """``{op name: (f(Q(x_b)) outputs, f(C(x_b)) outputs)}`` (see the module docstring) for the
    analysis model's ops with a quantized input; for the last op of a fusion group, ``f`` is
    the whole group. The second entry is None when it equals the baseline: a float baseline and
    no quantizer clipping anything (``f(C(x_b)) = f(x_b) = b``). An op whose shadow cannot be
    computed (an input the baseline lacks, no numpy kernel) maps to None. Computed with the
    numpy kernels."""
    float_baseline = run.levels[0] == "float" or not any(c.quantizes for c in run.baseline.calibrations())
    found: dict[str, tuple | None] = {}
    for op in track(compared_ops(run.analysis) if ops is None else ops, "layer shadows", unit="layers"):
        unit = unit_of(run.analysis, op)
        full = _run_unit(run, unit, apply_calibration)
        if full is _NOT_QUANTIZED:
            continue
        clip = _run_unit(run, unit, clip_only) if full is not None and (
            not float_baseline or _clips(run, unit)) else None
        found[op.name] = None if full is None or clip is _NOT_QUANTIZED else (full, clip)
    return found


_NOT_QUANTIZED = object()  # _run_unit: no input of the layer passes through a quantizer


def _source(run: LayerRun, cal: CalibRecord) -> np.ndarray | None:
    """The baseline's value entering calibration node ``cal`` of the analysis model."""
    ir = run.analysis
    return ir.weight_array(cal.input) if ir.value(cal.input).kind is NodeKind.WEIGHT else run.base(cal.input)


def _clips(run: LayerRun, unit: list[OpRecord]) -> bool:
    for op in unit:
        for v in op.inputs:
            cal = run.analysis.producer(v) if v else None
            if isinstance(cal, CalibRecord) and cal.mode in QRANGE:
                x = _source(run, cal)
                if x is not None and np.any(clip_only(cal, np.asarray(x)) != x):
                    return True
    return False


def _run_unit(run: LayerRun, unit: list[OpRecord], quantize) -> tuple | None | object:
    """The last op's outputs when ``unit`` runs on the baseline's values with its inputs'
    calibration nodes applied by ``quantize``; ``_NOT_QUANTIZED`` when no input is quantized;
    None when an input is unknown or a kernel fails."""
    ir, env, quantized = run.analysis, {}, False
    for op in unit:
        args = []
        for v in op.inputs:
            producer = ir.producer(v) if v else None
            if not v:
                args.append(None)
            elif v in env:
                args.append(env[v])
            elif isinstance(producer, CalibRecord):
                x = _source(run, producer)
                if x is None:
                    return None
                args.append(quantize(producer, np.asarray(x)))
                quantized = quantized or producer.quantizes
            elif ir.value(v).kind is NodeKind.WEIGHT:
                args.append(ir.weight_array(v))
            elif run.base(v) is not None:
                args.append(run.base(v))
            else:
                return None
        if not quantized and op is unit[-1]:
            return _NOT_QUANTIZED
        try:
            env.update(zip(op.outputs, run_op(ir, op, args)))
        except Exception as exc:  # an op the numpy kernels cannot run: no split for it
            logger.warning("no error split for %s (%s): %s", op.name, op.op_type, exc)
            return None
    return tuple(env[v] for v in unit[-1].outputs)
