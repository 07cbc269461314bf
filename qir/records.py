"""The typed records stored on the IR's graph nodes (one record per node, key ``"rec"``).

Records hold the semantic state of a node. Structure (which value feeds which slot) lives both
in the op records' ordered ``inputs``/``outputs`` and in the graph's edges; only the sanctioned
``QIR`` mutators change either, so the two never disagree (``verify`` checks it).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from qir.kinds import CalibMode, CalibRole, NodeKind

if TYPE_CHECKING:
    import onnx

__all__ = ["AttrValue", "Dim", "Shape", "ValueRecord", "OpRecord", "CalibRecord", "QuantizerState", "Record"]

Dim = Union[int, str, None]  # a static size, a symbolic name, or unknown
Shape = Union[tuple[Dim, ...], None]  # None: rank unknown
# an op attribute's value as ONNX attributes decode (qir.io.onnx_import.decode_attribute); keyed by attribute name
AttrValue = Union[int, float, str, bytes, np.ndarray, list, tuple, "onnx.GraphProto"]


@dataclass
class ValueRecord:
    """A tensor: a graph input, an op or calibration output (ACTIVATION), or a constant (WEIGHT).

    A weight's ``data`` is a read-only numpy array shared between clones; to change a weight,
    give the record a new array.
    """

    name: str
    kind: NodeKind
    dtype: str | None = None
    shape: Shape = None
    data: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def is_weight(self) -> bool:
        return self.kind is NodeKind.WEIGHT


@dataclass
class OpRecord:
    """A GENERAL node: one operator with ONNX semantics.

    ``inputs`` may contain ``""`` for an omitted optional input (no edge exists for it).
    ``attr_types`` keeps each attribute's ONNX type so export is exact (empty lists, floats
    that look like ints). ``module`` is the source-framework path (e.g. a PyTorch module path).
    """

    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    attr_types: dict[str, int] = field(default_factory=dict)
    domain: str = ""
    module: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    kind = NodeKind.GENERAL


@dataclass
class CalibRecord:
    """A CALIBRATION node: a quantizer with exactly one value in and one value out.

    ``mode`` chooses int8/int16 fake-quant, fp16 round trip, or float pass-through. The scale is
    derived from ``threshold`` (``threshold / qmax``, symmetric, zero point 0) unless ``scale``
    holds an imported scale, which is then used as stored. ``threshold``/``scale`` are scalars
    (per tensor) or vectors along ``axis`` (per channel). ``zero_point`` is only set for imported
    asymmetric quantizers (e.g. onnxruntime's uint8 activations, stored in the int8 frame as
    ``zp - 128``); qir's own calibration is symmetric. ``fixed`` thresholds are never changed by
    calibration. ``feeds`` names the general node(s) this calibration node serves.
    ``implied_clip`` = ``(lo, hi)`` (``±inf`` for an open end) records an activation that an
    imported quantizer's range stands in for (onnxruntime's quantizer deletes a Relu/Clip after
    an op and lets the range clip, :mod:`qir.io.qdq_clips`): the ``float`` and ``fp16`` modes clip
    ``x`` to it, so de-quantizing the node keeps the function; integer modes clip by their range.
    """

    name: str
    input: str
    output: str
    role: CalibRole = CalibRole.ACTIVATION
    mode: CalibMode = CalibMode.INT8
    threshold: np.ndarray | float | None = None
    scale: np.ndarray | float | None = None
    zero_point: np.ndarray | int | None = None
    axis: int | None = None
    fixed: bool = False
    feeds: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)
    implied_clip: tuple[float, float] | None = None

    kind = NodeKind.CALIBRATION

    @property
    def quantizes(self) -> bool:
        """True unless the node passes its input through (mode ``float``)."""
        return self.mode is not CalibMode.FLOAT

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.input,)

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.output,)


@dataclass
class QuantizerState:
    """One quantizer as a file describes it (a ``qir::Calibration`` node, an emit-metadata entry, a
    QuantizeLinear's parameters): the :class:`CalibRecord` fields other than its name and values.
    ``role`` None leaves it to the reader (the importer's, or weight/activation by the input)."""

    mode: CalibMode
    role: CalibRole | None = None
    threshold: np.ndarray | float | None = None
    scale: np.ndarray | float | None = None
    zero_point: np.ndarray | int | None = None
    axis: int | None = None
    fixed: bool = False
    feeds: tuple[str, ...] = ()
    implied_clip: tuple[float, float] | None = None
    unsigned: bool = False  # imported from a uint8/uint16 quantizer (the integer level's frame)

    def record(self, name: str, input: str, output: str, role: CalibRole | None = None) -> CalibRecord:
        """The calibration node ``name`` (``input`` → ``output``) of this quantizer; ``role``
        when the state has none (activation by default)."""
        return CalibRecord(name, input, output, role=self.role or role or CalibRole.ACTIVATION, mode=self.mode,
                           threshold=self.threshold, scale=self.scale, zero_point=self.zero_point, axis=self.axis,
                           fixed=self.fixed, feeds=tuple(self.feeds), implied_clip=self.implied_clip,
                           meta={"unsigned": True} if self.unsigned else {})


Record = Union[ValueRecord, OpRecord, CalibRecord]


def copy_record(rec: Record) -> Record:
    """A copy with fresh containers: ``attrs``, calibration arrays (small) and ``meta`` (one
    level: objects stored in meta, e.g. histograms, are shared). Weight arrays are shared
    read-only."""
    changes: dict[str, Any] = {"meta": dict(rec.meta)}
    if isinstance(rec, OpRecord):
        changes["attrs"] = dict(rec.attrs)
        changes["attr_types"] = dict(rec.attr_types)
    elif isinstance(rec, CalibRecord):
        for f in ("threshold", "scale", "zero_point"):
            value = getattr(rec, f)
            if isinstance(value, np.ndarray):
                changes[f] = value.copy()
    return dataclasses.replace(rec, **changes)
