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
from qir.errors import InputError
from qir.execution import DEFAULT_MARCH, Level, Runtime
from qir.graph import QIR
from qir.kinds import CalibRole
from qir.passes.base import Pass, PassResult, register_pass
from qir.passes.lib.repair import RepairReport, Site, Skipped, all_int8_error, finished, note_change
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

__all__ = ["RoundWeightsPass", "METHODS", "INPUTS"]

logger = logging.getLogger(__name__)

METHODS = ("auto", "adaround", "threshold")
INPUTS = ("quantized", "float")
FACTORS = tuple(round(f, 2) for f in np.arange(0.5, 1.001, 0.02))


@register_pass
class RoundWeightsPass(Pass):
    """Choose each layer's int8 weights by the error they cause at the layer's output.

    Runs on a **calibrated** IR (after ``calibrate``); an uncalibrated one is refused.

    1. A layer is a Conv (1-D/2-D, grouped and depthwise included), a Gemm (no transA) or a MatMul
       with a constant 2-D weight behind an int8 WEIGHT calibration node that only it reads
       (:mod:`.layers`); others are skipped and reported (int16 weights, shared weights, ...).
    2. Rows: ``rows`` input rows per layer (a Conv's row is the patch one output pixel reads),
       drawn evenly from the calibration samples, in one pass of each model over the data (layers
       in batches of ``memory_mb`` of rows). With ``inputs="quantized"`` (default) a layer reads
       the **fake-quant model's** activations as calibrated (every upstream quantizer and
       upstream weights rounded to nearest: AdaRound's asymmetric reconstruction, without the
       per-layer re-run that sequential rounding would cost), and its target is the **float
       model's** output of the layer; ``inputs="float"`` reads the float activations.
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
       rounding's; the other layers are left as they are (reported as unchanged).
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
        if data is None:
            raise InputError("round-weights needs calibration data (a folder, .npz, .npy or samples) to measure "
                             "each layer's output error; give it data=...")
        unknown = set(op_types) - set(OP_TYPES)
        if unknown:
            raise InputError(f"round-weights: unknown op types {sorted(unknown)}; choose from {', '.join(OP_TYPES)}")
        for what, value, allowed in (("method", method, METHODS), ("inputs", inputs, INPUTS)):
            if value not in allowed:
                raise InputError(f"round-weights: unknown {what} {value!r}; choose one of {', '.join(allowed)}")
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
        stopped = False
        for batch in self._batches(layers):
            for layer, (xq, target) in zip(batch, self._collect(original, batch)):
                key = self._key(layer, xq, target)
                choice = self._stored(layer, key)
                if choice is None:
                    stopped = stopped or (deadline is not None and time.monotonic() > deadline)
                    choice = None if stopped else self._solve(layer, xq, target, deadline)
                    if choice is None:
                        stopped = True
                        report.skipped.append(Skipped(layer.op.name, f"the time budget ({self.time_budget_s} s) was "
                                                                     "spent first; run again with the same store to go on"))
                        continue
                    if self.store is not None:
                        self.store[key] = _to_json(choice)
                logger.info("round-weights: %s %s, output MSE %.3g -> %.3g (%.0f s so far)", layer.op.name,
                            choice.method, choice.mse_nearest, choice.mse_chosen, time.monotonic() - start)
                self._apply(ir, layer, choice, report)
        self.report = report
        result = finished(ir, report, (lambda: self._error(ir, original)) if self.measure else None, "layer(s) re-rounded")
        result.report.update({"method": self.method, "inputs": self.inputs, "stopped_by_time_budget": stopped,
                              "seconds": round(time.monotonic() - start, 3)})
        return result

    def _error(self, ir: QIR, original: QIR):
        return all_int8_error(ir, self.data, march=self.march, runtime=self.runtime, limit=self.limit,
                              reference=original)

    def _batches(self, layers: list[Layer]) -> list[list[Layer]]:
        """Layers grouped so that each group's rows (inputs and targets) fit ``memory_mb``."""
        batches: list[list[Layer]] = [[]]
        size = 0
        for layer in layers:
            g, o, k = layer.row_size
            nbytes = 4 * self.rows * g * (k + 2 * o)
            if batches[-1] and size + nbytes > self.memory_mb << 20:
                batches.append([])
                size = 0
            batches[-1].append(layer)
            size += nbytes
        return [b for b in batches if b]

    def _collect(self, ir: QIR, batch: list[Layer]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each layer's rows ``(x̂, target)``: the quantized (or float) input rows and the float
        output rows, from one run of each model over the data (module docstring, rule 2)."""
        samples = model_samples(ir, self.data, self.limit)
        per_sample = math.ceil(self.rows / len(samples))
        values = sorted({layer.op.inputs[0] for layer in batch})
        levels = [Level.FLOAT] + ([Level.FAKEQUANT] if self.inputs == "quantized" else [])
        runtimes = {level: get_runtime(self.runtime, level=level) for level in levels}
        parts: list[tuple[list, list]] = [([], []) for _ in batch]
        for i, sample in enumerate(samples):
            feed = check_feeds(ir, sample)
            got = {level: rt.run(ir, feed, capture=values) for level, rt in runtimes.items()}
            for j, layer in enumerate(batch):
                x = layer.op.inputs[0]
                xf = rows(layer, np.asarray(got[Level.FLOAT][x]), per_sample, self._rng(layer, i))
                xq = rows(layer, np.asarray(got[levels[-1]][x]), per_sample, self._rng(layer, i))
                parts[j][0].append(xq)
                parts[j][1].append(apply_rows(layer.gemm(layer.weight), xf))
        return [(np.concatenate(q), np.concatenate(t)) for q, t in parts]

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

    def _apply(self, ir: QIR, layer: Layer, choice: Choice, report: RepairReport) -> None:
        detail = {"method": choice.method, "mse_nearest": choice.mse_nearest, "mse_after": choice.mse_chosen,
                  **choice.detail}
        if not choice.better:
            report.skipped.append(Skipped(layer.op.name, f"unchanged: {choice.method} did not beat rounding to "
                                                         f"nearest on its rows ({choice.mse_chosen:.3g} vs "
                                                         f"{choice.mse_nearest:.3g})"))
            return
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


def _to_json(choice: Choice) -> dict[str, Any]:
    return {"method": choice.method, "mse_nearest": choice.mse_nearest, "mse_chosen": choice.mse_chosen,
            "up": None if choice.up is None else encode_up(choice.up), "factors": choice.factors,
            "detail": choice.detail}
