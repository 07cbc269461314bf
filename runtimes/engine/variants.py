"""Variants and the plain evaluation every engine result must equal.

A *variant* changes the mode of a few calibration nodes relative to a *reference
configuration*: ``float`` (every calibration node passes through; "only this node quantized"
analyses) or ``quantized`` (the IR's own modes; "only this node back to float"). A change is a
mode (``"int16"``) or a mode with a fixed per-tensor threshold, ``"int8@2.55"``; ``"@2.55"``
keeps the node's own mode (int8 where that is float): the fix a clipping node asks for
(:func:`parse_change`).

:func:`evaluate_plainly` is the slow, obvious way to evaluate one: clone the IR, set the modes,
run the whole model. The engine's results equal it on the same runtime. On onnxruntime both
write GlobalAveragePool as ReduceMean (``layout_stable``): onnxruntime picks that op's kernel by
the layout of its input, so a whole-model run and the engine's parts would otherwise average
differently.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from qir.calibration import set_mode
from qir.errors import InputError
from qir.execution import Level, Runtime
from qir.graph import QIR
from qir.kinds import CalibMode
from qir.records import CalibRecord, copy_record
from qir.runtimes.base import get_runtime

__all__ = ["Variant", "VariantRecords", "change_key", "parse_change", "canonical_change", "one_at_a_time", "load_variants",
           "check_variants", "effective", "configured", "configured_clone", "evaluate_plainly", "run_whole"]


@dataclass(frozen=True)
class Variant:
    """A named set of calibration-node mode changes, e.g. ``Variant("conv1", {"x_calib": "int8"})``."""

    name: str
    changes: Mapping[str, str]

    def items(self) -> list[tuple[str, str]]:
        """The changes as sorted ``(node, canonical change)`` pairs."""
        return sorted((n, canonical_change(m)) for n, m in self.changes.items())


def parse_change(change: str) -> tuple[CalibMode | None, float | None]:
    """``"MODE"``, ``"MODE@THRESHOLD"`` or ``"@THRESHOLD"`` as (mode or None, threshold or None).
    A threshold must be a finite number > 0; an unknown mode or a bad number is an InputError."""
    text, sep, value = str(change).partition("@")
    try:
        mode = CalibMode(text) if text else None
    except ValueError:
        raise InputError(f"unknown mode {text!r}; choose one of {', '.join(m.value for m in CalibMode)}") from None
    if not sep:
        return mode, None
    try:
        threshold = float(value)
    except ValueError:
        threshold = math.nan
    if not (math.isfinite(threshold) and threshold > 0):
        raise InputError(f"change {change!r}: the threshold after '@' must be a finite number > 0")
    if mode is CalibMode.FLOAT:
        raise InputError(f"change {change!r}: a float node has no threshold")
    return mode, threshold


def canonical_change(change: str) -> str:
    """One spelling per change: ``int16``, ``int8@2.55`` or ``@2.55`` (repr of the float)."""
    mode, threshold = parse_change(change)
    return (mode.value if mode else "") + ("" if threshold is None else f"@{threshold!r}")


def one_at_a_time(ir: QIR, mode: str, role: str = "activation") -> list[Variant]:
    """One variant per calibration node of ``role`` (``activation``, ``weight`` or ``all``),
    named after the node, setting just that node to ``mode``."""
    if role not in ("activation", "weight", "all"):
        raise InputError(f"unknown role {role!r}; choose activation, weight or all")
    return [Variant(c.name, {c.name: mode}) for c in ir.calibrations(None if role == "all" else role)]


def load_variants(path: str | Path) -> list[Variant]:
    """Variants from a JSON file: ``{"name": {"calibration node": "mode", ...}, ...}`` or a list
    of ``{"name": ..., "changes": {...}}`` objects."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"variants file not found: {path}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON: {exc}") from None
    if isinstance(data, dict):
        data = [{"name": k, "changes": v} for k, v in data.items()]
    if not isinstance(data, list) or not all(
            isinstance(d, dict) and isinstance(d.get("name"), str) and isinstance(d.get("changes"), dict)
            for d in data):
        raise InputError(f"{path}: expected {{name: {{node: mode}}}} or a list of "
                         "{\"name\": ..., \"changes\": {node: mode}} objects")
    return [Variant(d["name"], dict(d["changes"])) for d in data]


def check_variants(ir: QIR, variants: Sequence[Variant]) -> None:
    """Variants are :class:`Variant` objects with unique names, naming calibration nodes of
    ``ir`` and known modes; otherwise one clear error."""
    names: set[str] = set()
    for v in variants:
        if not isinstance(v, Variant):
            raise InputError(f"variants must be qir.runtimes.engine.Variant objects, got {type(v).__name__}")
        if v.name in names:
            raise InputError(f"two variants are named {v.name!r}; variant names must be unique")
        names.add(v.name)
        for node, change in v.changes.items():
            ir.calibration(node)  # NotFoundError with suggestions
            try:
                parse_change(change)
            except InputError as exc:
                raise InputError(f"variant {v.name!r}, node {node!r}: {exc}") from None


def _target(rec: CalibRecord, change: str) -> tuple[CalibMode, float | None]:
    """The mode and fixed threshold (or None) ``rec`` runs with under ``change``."""
    mode, threshold = parse_change(change)
    if mode is None:
        mode = CalibMode.INT8 if rec.mode is CalibMode.FLOAT else rec.mode
    return mode, threshold


def _fixed(threshold: float | None) -> dict:
    """The calibration state a change's threshold sets: per tensor, marked fixed (what
    ``qir set-mode --threshold`` leaves); nothing without a threshold."""
    return {} if threshold is None else {"threshold": np.float32(threshold), "axis": None, "fixed": True}


def is_no_change(rec: CalibRecord, change: str) -> bool:
    """``change`` leaves ``rec`` as it is (the same mode, no new threshold)."""
    mode, threshold = _target(rec, change)
    return threshold is None and mode is rec.mode


def effective(rec: CalibRecord, change: CalibMode | str) -> CalibRecord:
    """A copy of ``rec`` under ``change`` (imported int8/int16 scales converted, see ``set_mode``;
    a threshold replaces the scale, per tensor, as ``qir set-mode --threshold`` does)."""
    out = copy_record(rec)
    mode, threshold = _target(rec, CalibMode(change).value if isinstance(change, CalibMode) else change)
    set_mode(out, mode)
    for field, value in _fixed(threshold).items():
        setattr(out, field, value)
    if threshold is not None:  # the scale derives from the threshold (as set_calibration does)
        out.scale = out.zero_point = None
    return out


def change_key(rec: CalibRecord) -> tuple:
    """What a calibration record computes: its mode, threshold, scale, zero point and axis (a fixed
    threshold makes the same mode compute something else)."""
    def raw(v):
        return None if v is None else np.asarray(v, np.float64).tobytes()

    return rec.mode.value, raw(rec.threshold), raw(rec.scale), raw(rec.zero_point), rec.axis


def _change_in(rec: CalibRecord, reference: str, changes: Mapping[str, str]) -> str | None:
    """The change ``rec`` runs with under ``reference`` and ``changes`` (None: as it is)."""
    return changes.get(rec.name, CalibMode.FLOAT.value if reference == "float" else None)


def configured(ir: QIR, reference: str, changes: Mapping[str, str]) -> dict[str, CalibRecord]:
    """Every calibration node as it runs in ``reference`` with ``changes`` applied."""
    out = {}
    for c in ir.calibrations():
        change = _change_in(c, reference, changes)
        out[c.name] = c if change is None or is_no_change(c, change) else effective(c, change)
    return out


def configured_clone(ir: QIR, reference: str, changes: Mapping[str, str]) -> QIR:
    """A clone of ``ir`` whose calibration nodes run as in ``reference`` with ``changes``."""
    clone = ir.clone()
    for c in clone.calibrations():
        change = _change_in(c, reference, changes)
        if change is not None:
            mode, threshold = _target(c, change)
            clone.set_calibration(c.name, mode=mode, **_fixed(threshold))
    return clone


class VariantRecords:
    """Variants' changes as calibration records: a change applies to the IR's own record (as
    the reference's changes do), and a record that computes what the reference configuration
    ``records`` (node -> its record there) computes is the reference's own object. One record
    object per (node, change): identity tells a change from no change, and a variant's change
    from the switch that turns on the same mode."""

    def __init__(self, ir: QIR, records: Mapping[str, CalibRecord]) -> None:
        self.ir, self.records = ir, records
        self._memo: dict[tuple[str, str], CalibRecord] = {}

    def record(self, name: str, change: str) -> CalibRecord:
        """Calibration node ``name`` under ``change`` (a canonical change, see :func:`canonical_change`)."""
        key = (name, change)
        if key not in self._memo:
            ref = self.records[name]
            rec = effective(self.ir.calibration(name), change)
            self._memo[key] = ref if change_key(rec) == change_key(ref) else rec
        return self._memo[key]

    def changes(self, variant: Variant) -> dict[str, CalibRecord]:
        """``variant``'s calibration nodes whose record differs from the reference's."""
        changes = {n: self.record(n, m) for n, m in variant.items()}
        return {n: r for n, r in changes.items() if r is not self.records[n]}


def evaluate_plainly(ir: QIR, feeds: Mapping[str, np.ndarray], changes: Mapping[str, str], *,
                     reference: str = "float", compare: Sequence[str] | None = None,
                     runtime: str = Runtime.ORT, level: str = Level.FAKEQUANT, **runtime_options: Any) -> dict[str, np.ndarray]:
    """The slow, obvious way: clone ``ir``, set every calibration node's mode, run the whole
    model (a new session on onnxruntime, with the engine's ``layout_stable`` lowering; at
    ``level="integer"``, the numpy runtime's integer level with ``march=`` among the options).
    What every engine result must equal, and what the peers do per node."""
    if runtime == Runtime.ORT:
        runtime_options.setdefault("layout_stable", True)
    return run_whole(configured_clone(ir, reference, changes), feeds, list(compare or ir.outputs),
                     get_runtime(runtime, level=level, **runtime_options))


def run_whole(model: QIR, feeds: Mapping[str, np.ndarray], compare: Sequence[str], rt) -> dict[str, np.ndarray]:
    """``compare`` values of one whole-model run (graph outputs, the rest captured)."""
    got = rt.run(model, feeds, capture=[v for v in compare if v not in model.outputs])
    return {v: got[v] for v in compare}
