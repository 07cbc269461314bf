"""``round-weights``: choose each GEMM's int8 weight rounding to minimise that layer's output error
on calibration data: AdaRound (Nagel et al. 2020) with torch, an output-MSE per-channel weight
threshold search without."""
from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from typing import Any, MutableMapping

import numpy as np

from qir.data import model_samples
from qir.errors import InputError, QirError
from qir.execution import DEFAULT_MARCH, Level, Runtime
from qir.graph import QIR
from qir.kinds import CalibRole
from qir.passes.base import Pass, PassResult, register_pass
from qir.passes.lib.repair import (
    RepairReport,
    Site,
    Skipped,
    all_int8_error,
    check_repair_options,
    finished,
    note_change,
    run_step,
)
from qir.passes.round_weights.layers import OP_TYPES, Layer, find_layers, rows
from qir.passes.round_weights.solve import (
    QMAX,
    QMIN,
    Choice,
    adaround,
    apply_rows,
    chosen_threshold,
    decode_up,
    encode_up,
    load_torch,
    nearest_codes,
    threshold_search,
)
from qir.runtimes.base import check_feeds, get_runtime
from qir.runtimes.numerics import apply_calibration
from qir.runtimes.numpy_ref.interpreter import execution_plan

__all__ = ["RoundWeightsPass", "METHODS", "INPUTS"]

logger = logging.getLogger(__name__)

METHODS = ("auto", "adaround", "threshold")
INPUTS = ("quantized", "float")
MIN_ROWS = 128  # fewer rows than this (a classifier's Gemm on a few samples): the layer is left alone
FACTORS = tuple(round(f, 2) for f in np.arange(0.5, 1.001, 0.02))


@register_pass
class RoundWeightsPass(Pass):
    """Choose each layer's int8 weights by the error they cause at the layer's output.

    Runs on a **calibrated** IR (after ``calibrate``); an uncalibrated one is refused.

    1. A layer is a Conv (1-D/2-D, grouped and depthwise included), a Gemm (no transA) or a MatMul
       with a constant 2-D weight behind an int8 WEIGHT calibration node that only it reads
       (:mod:`.layers`); others are skipped and reported (int16 weights, shared weights, ...).
    2. Rows: ``rows`` input rows per layer (a Conv's row is the patch one output pixel reads),
       drawn evenly from the calibration samples at the same positions in both models. The
       target is the **float model's** output of the layer there (one float run over the data,
       layers in batches of ``memory_mb`` of rows). With ``inputs="quantized"`` (default) a
       layer reads the **fake-quant model's** activations with every layer upstream already
       re-rounded (AdaRound's asymmetric reconstruction, sequential): one pass of the numpy
       runtime over all the samples at once, op by op, choosing each layer when its input is
       computed. Where the numpy runtime cannot run the model, and with ``inputs="float"``, a
       layer reads the float activations (the report's ``inputs`` says which). (Quantized
       inputs taken from the model as given, every layer at once, would have each layer
       compensate the same upstream error again: on PP-OCR cls that halved no error and cost
       0.03 of output cosine.)
    3. Per layer, ``method``:

       * ``adaround`` (``auto`` when torch is importable): a soft rounding variable per weight,
         ``iterations`` Adam steps (``lr``) on ``batch`` rows at a time, rounding regularizer
         ``reg`` with β annealed from 20 to 2 (:func:`.solve.adaround`). The chosen codes
         become the float weight itself (``code · scale``, which re-quantizes to the same code
         bit for bit with the same threshold), and the weight's calibration node is marked
         ``fixed`` so a later ``calibrate`` keeps its threshold.
       * ``threshold`` (``auto`` without torch): per output channel, the threshold
         ``f · threshold`` for f in ``factors`` whose nearest rounding gives the least output
         MSE; the calibration node gets the new threshold, ``fixed``.

       A choice is applied only where its output MSE on the layer's rows is below nearest
       rounding's; the other layers are left as they are (reported as unchanged), and so are
       layers with fewer than ``MIN_ROWS`` (128) rows in the data (a classifier's Gemm reads one
       row a sample: whatever fits a few rows fits those samples only).
    4. ``time_budget_s``: no layer is started once it is spent (the rest are reported skipped);
       ``store`` (a mapping the caller may keep in a file): each layer's choice is saved under
       its name and a digest of its weight, threshold, rows, targets and the options, and found
       again by the next run, which then only computes what is missing.
    5. The float model changes where weights were re-rounded (they are the int8 values); with
       ``measure`` the report holds the all-int8 error on the calibration data before and after,
       both against the float outputs of the model as given. Changed ops carry a note.
    """

    name = "round-weights"

    def __init__(self, data: Any = None, op_types: tuple[str, ...] | list[str] = OP_TYPES, *, method: str = "auto",
                 inputs: str = "quantized", rows: int = 2048, iterations: int = 500, batch: int = 256,
                 reg: float = 0.01, lr: float = 0.01, factors: tuple[float, ...] | list[float] = FACTORS,
                 time_budget_s: float | None = None, store: MutableMapping[str, Any] | None = None,
                 memory_mb: int = 256, seed: int = 0, runtime: str = Runtime.ORT, limit: int | None = None,
                 measure: bool = True, march: str = DEFAULT_MARCH) -> None:
        check_repair_options(self.name, data, "each layer's output error", op_types, OP_TYPES,
                             method=(method, METHODS), inputs=(inputs, INPUTS))
        if min(rows, iterations, batch) < 1 or not factors or min(factors) <= 0 or max(factors) > 1:
            raise InputError("round-weights: rows, iterations and batch must be >= 1, and factors in (0, 1]")
        torch = load_torch() if method != "threshold" else None
        if method == "adaround" and torch is None:
            raise InputError("round-weights{method=adaround} needs torch (pip install torch); "
                             "method=threshold runs without it")
        self.data, self.op_types, self.inputs, self.store = data, tuple(op_types), inputs, store
        self.torch, self.method = torch, ("adaround" if torch is not None else "threshold")
        self.rows, self.iterations, self.batch, self.reg, self.lr = int(rows), int(iterations), int(batch), reg, lr
        self.factors = tuple(sorted({float(f) for f in factors} | {1.0}))
        self.time_budget_s, self.memory_mb, self.seed = time_budget_s, memory_mb, int(seed)
        self.runtime, self.limit, self.measure, self.march = runtime, limit, bool(measure), march
        self.options = {"op_types": list(self.op_types), "method": self.method, "inputs": inputs, "rows": self.rows,
                        "runtime": runtime, **({"iterations": self.iterations} if torch is not None else {})}
        self.report: RepairReport | None = None

    def run(self, ir: QIR) -> PassResult:
        if not ir.calibrations(CalibRole.WEIGHT):
            raise InputError("round-weights runs on a calibrated model (after calibrate): it needs each weight's "
                             "calibration node; run insert-calibration and calibrate first")
        start = time.monotonic()
        deadline = None if self.time_budget_s is None else start + float(self.time_budget_s)
        report = RepairReport(self.name)
        layers, left_out = find_layers(ir, self.op_types)
        report.skipped += [Skipped(name, why) for name, why in left_out]
        original = ir.clone()
        if layers and self.measure:
            report.before = self._error(ir, original)
        self._start, self._deadline, self._stopped = start, deadline, False
        inputs = self.inputs
        plan = self._plan(ir, layers) if inputs == "quantized" and layers else None
        if plan is None and inputs == "quantized" and layers:
            inputs = "float (the numpy runtime cannot run this model)"
        if plan is not None:
            targets = {layer.op.name: t for batch in self._batches(layers, inputs=False)
                       for layer, (_, t) in zip(batch, self._collect(original, batch, inputs=False))}
            self._sequential(ir, plan, layers, targets, report)
        else:
            for batch in self._batches(layers):
                for layer, (x, target) in zip(batch, self._collect(original, batch)):
                    self._choose(ir, layer, x, target, report)
        self.report = report
        result = finished(ir, report, (lambda: self._error(ir, original)) if self.measure else None, "layer(s) re-rounded")
        result.report.update({"method": self.method, "inputs": inputs, "stopped_by_time_budget": self._stopped,
                              "seconds": round(time.monotonic() - start, 3)})
        return result

    def _choose(self, ir: QIR, layer: Layer, x: np.ndarray, target: np.ndarray, report: RepairReport) -> bool:
        """One layer's choice, from the store or solved (unless the time budget is spent), applied
        when it beats nearest rounding; True when the layer's quantized weight changed."""
        if len(x) < MIN_ROWS:
            report.skipped.append(Skipped(layer.op.name, f"only {len(x)} input rows in the data (under {MIN_ROWS}): a "
                                                         "choice would fit these samples only"))
            return False
        key = self._key(layer, x, target)
        choice = self._stored(layer, key)
        if choice is None:
            self._stopped = self._stopped or (self._deadline is not None and time.monotonic() > self._deadline)
            choice = None if self._stopped else self._solve(layer, x, target, self._deadline)
            if choice is None:
                self._stopped = True
                report.skipped.append(Skipped(layer.op.name, f"the time budget ({self.time_budget_s} s) was spent "
                                                             "first; run again with the same store to go on"))
                return False
            if self.store is not None:
                self.store[key] = _to_json(choice)
        logger.info("round-weights: %s %s, output MSE %.3g -> %.3g (%.0f s so far)", layer.op.name, choice.method,
                    choice.mse_nearest, choice.mse_chosen, time.monotonic() - self._start)
        return self._apply(ir, layer, choice, report)

    def _plan(self, ir: QIR, layers: list[Layer]):
        """The numpy runtime's plan of ``ir`` with every layer's input kept, or None (logged) when
        that runtime cannot run the model."""
        try:
            return execution_plan(ir, frozenset(ir.outputs) | {layer.op.inputs[0] for layer in layers},
                                  fold_batchnorm=False)
        except QirError as exc:
            logger.info("round-weights: the numpy runtime cannot run %s (%s): float inputs instead", ir.name, exc)
            return None

    def _sequential(self, ir: QIR, plan, layers: list[Layer], targets: dict[str, np.ndarray],
                    report: RepairReport) -> None:
        """Rule 2's quantized inputs: one fake-quant pass of the numpy plan over every sample at
        once, op by op; each layer is chosen when its input is computed, and its new quantized
        weight is what the layers after it see."""
        samples = model_samples(ir, self.data, self.limit)
        per_sample = math.ceil(self.rows / len(samples))
        envs = [{**plan.weights, **check_feeds(ir, s)} for s in samples]
        at = {layer.op.name: layer for layer in layers}
        for step in plan.steps:
            layer = at.get(step.rec.name)
            if layer is not None:
                x = np.concatenate([rows(layer, np.asarray(env[layer.op.inputs[0]]), per_sample, self._rng(layer, i))
                                    for i, env in enumerate(envs)])
                if self._choose(ir, layer, x, targets.pop(layer.op.name), report):
                    wq = apply_calibration(layer.cal, np.asarray(ir.weight_array(layer.cal.input), np.float32))
                    for env in envs:
                        env[layer.op.inputs[1]] = wq
            run_step(step, envs)
            for env in envs:
                for name in step.free:
                    del env[name]

    def _error(self, ir: QIR, original: QIR):
        return all_int8_error(ir, self.data, march=self.march, runtime=self.runtime, limit=self.limit,
                              reference=original)

    def _batches(self, layers: list[Layer], inputs: bool = True) -> list[list[Layer]]:
        """Layers grouped so that each group's rows (inputs, unless not ``inputs``, and targets)
        fit ``memory_mb``."""
        batches: list[list[Layer]] = [[]]
        size = 0
        for layer in layers:
            g, o, k = layer.row_size
            nbytes = 4 * self.rows * g * ((k if inputs else 0) + 2 * o)
            if batches[-1] and size + nbytes > self.memory_mb << 20:
                batches.append([])
                size = 0
            batches[-1].append(layer)
            size += nbytes
        return [b for b in batches if b]

    def _collect(self, ir: QIR, batch: list[Layer], inputs: bool = True) -> list[tuple[np.ndarray | None, np.ndarray]]:
        """Each layer's float rows and targets ``(x, W·x)`` (``x`` None unless ``inputs``), from one
        float run over the data (module docstring, rule 2)."""
        samples = model_samples(ir, self.data, self.limit)
        per_sample = math.ceil(self.rows / len(samples))
        values = sorted({layer.op.inputs[0] for layer in batch})
        rt = get_runtime(self.runtime, level=Level.FLOAT)
        parts: list[tuple[list, list]] = [([], []) for _ in batch]
        for i, sample in enumerate(samples):
            got = rt.run(ir, check_feeds(ir, sample), capture=values)
            for j, layer in enumerate(batch):
                x = rows(layer, np.asarray(got[layer.op.inputs[0]]), per_sample, self._rng(layer, i))
                if inputs:
                    parts[j][0].append(x)
                parts[j][1].append(apply_rows(layer.gemm(layer.weight), x))
        return [(np.concatenate(x) if x else None, np.concatenate(t)) for x, t in parts]

    def _rng(self, layer: Layer, sample: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, sample, int(hashlib.sha1(layer.op.name.encode()).hexdigest()[:8], 16)])

    def _key(self, layer: Layer, xq: np.ndarray, target: np.ndarray) -> str:
        h = hashlib.sha1()
        for a in (layer.weight, layer.scale, xq, target):
            h.update(np.ascontiguousarray(a).tobytes())
        opts = {"method": self.method, "iterations": self.iterations, "batch": self.batch, "reg": self.reg,
                "lr": self.lr, "seed": self.seed} if self.method == "adaround" else {"factors": self.factors}
        h.update(json.dumps(opts, sort_keys=True).encode())
        return f"{layer.op.name}:{h.hexdigest()}"

    def _stored(self, layer: Layer, key: str) -> Choice | None:
        entry = None if self.store is None else self.store.get(key)
        if entry is None:
            return None
        up = decode_up(entry["up"], layer.weight.shape) if entry.get("up") is not None else None
        return Choice(entry["method"], entry["mse_nearest"], entry["mse_chosen"], up, entry.get("factors"),
                      {**entry.get("detail", {}), "from_store": True})

    def _solve(self, layer: Layer, xq: np.ndarray, target: np.ndarray, deadline: float | None) -> Choice | None:
        if self.method == "threshold":
            return threshold_search(layer, xq, target, np.asarray(self.factors))
        return adaround(self.torch, layer, xq, target, iterations=self.iterations, batch=self.batch, reg=self.reg,
                        lr=self.lr, seed=self.seed, deadline=deadline)

    def _apply(self, ir: QIR, layer: Layer, choice: Choice, report: RepairReport) -> bool:
        detail = {"method": choice.method, "mse_nearest": choice.mse_nearest, "mse_after": choice.mse_chosen,
                  "weight_mode": layer.cal.mode.value, **choice.detail}
        if not choice.better:
            report.skipped.append(Skipped(layer.op.name, f"unchanged: {choice.method} did not beat rounding to "
                                                         f"nearest on its rows ({choice.mse_chosen:.3g} vs "
                                                         f"{choice.mse_nearest:.3g})"))
            return False
        cal = layer.cal
        if choice.up is not None:
            codes = np.clip(np.floor(layer.weight / layer.scale) + choice.up, QMIN, QMAX)
            detail["flipped"] = int(np.sum(codes != nearest_codes(layer.weight, layer.scale)))
            ir.set_weight(cal.input, (codes * layer.scale).astype(np.float32))
            ir.set_calibration(cal.name, fixed=True)
        else:
            ir.set_calibration(cal.name, threshold=chosen_threshold(layer, choice.factors), fixed=True)
        note_change(ir, layer.op, self.name, detail)
        report.changed.append(Site(layer.op.name, [layer.op.name], detail))
        return True


def _to_json(choice: Choice) -> dict[str, Any]:
    return {"method": choice.method, "mse_nearest": choice.mse_nearest, "mse_chosen": choice.mse_chosen,
            "up": None if choice.up is None else encode_up(choice.up), "factors": choice.factors,
            "detail": choice.detail}
