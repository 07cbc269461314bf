"""Op classes: which kind of hardware unit an op type runs on, for the march dtype and fp16 rules.

Every op type qir knows is in exactly one class (:data:`OP_CLASS_TABLE`). An op type qir does not
know gets :data:`UNKNOWN_OP_CLASS`, never an error, and the first lookup of each such op type is
logged so the guess does not go unnoticed.
"""
from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Mapping

__all__ = ["OpClass", "OP_CLASS_TABLE", "UNKNOWN_OP_CLASS", "OpClassification", "classify", "op_class",
           "is_known_op", "ops_in_class"]

logger = logging.getLogger(__name__)


class OpClass(str, enum.Enum):
    """What kind of hardware unit an op type runs on, for dtype and fp16 rules.

    ``gemm`` is hmct's "TAE" category (the inputs of Conv/ConvTranspose/MatMul/Gemm);
    ``elementwise``, ``lut``, ``pool_resize``, ``reduce`` and ``norm`` split hmct's "VAE"
    (vector) category; ``shape`` is hmct's "TRANS" (data movement, no arithmetic).
    """

    GEMM = "gemm"
    ELEMENTWISE = "elementwise"
    LUT = "lut"
    POOL_RESIZE = "pool_resize"
    SHAPE = "shape"
    REDUCE = "reduce"
    NORM = "norm"


_CLASS_MEMBERS: dict[OpClass, tuple[str, ...]] = {
    OpClass.GEMM: (
        "Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "Linear",
        "ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul",
        "FusedConv", "FusedGemm", "FusedMatMul",
    ),
    OpClass.ELEMENTWISE: (
        "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Min", "Max", "Clip",
        "Relu", "LeakyRelu", "PRelu", "ThresholdedRelu", "Shrink",
        "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Where",
        "And", "Or", "Xor", "Not", "BitShift",
        "Sum", "Mean", "Ceil", "Floor", "Round", "Sign", "Mod", "IsInf", "IsNaN",
    ),
    OpClass.LUT: (
        "Sigmoid", "Tanh", "Exp", "Log", "Reciprocal", "Sqrt", "Rsqrt", "Erf", "Gelu",
        "FastGelu", "QuickGelu", "BiasGelu", "HardSigmoid", "HardSwish", "Softplus", "Softsign",
        "Elu", "Selu", "Celu", "Mish", "Swish", "Softmax", "LogSoftmax", "Pow",
        "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh",
        "LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
        "RMSNormalization", "LpNormalization",
    ),
    OpClass.POOL_RESIZE: (
        "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "GlobalLpPool",
        "MaxRoiPool", "MaxUnpool", "Resize", "Upsample", "GridSample", "RoiAlign",
    ),
    OpClass.SHAPE: (
        "Reshape", "Transpose", "Concat", "Split", "Slice", "Squeeze", "Unsqueeze", "Flatten",
        "Gather", "GatherElements", "GatherND", "Expand", "Tile", "Pad", "Identity", "Dropout",
        "DepthToSpace", "SpaceToDepth", "Shape", "Size", "Cast", "CastLike", "Constant",
        "ConstantOfShape", "Range", "NonZero", "Scatter", "ScatterElements", "ScatterND",
        "Trilu", "OneHot", "EyeLike", "ReverseSequence", "Compress", "Col2Im",
    ),
    OpClass.REDUCE: (
        "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
        "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
        "ArgMax", "ArgMin", "TopK", "CumSum", "Hardmax",
    ),
    OpClass.NORM: ("BatchNormalization", "InstanceNormalization", "GroupNormalization"),
}

#: op type -> op class, for every op type qir knows how to classify.
OP_CLASS_TABLE: Mapping[str, OpClass] = {
    op: cls for cls, ops in _CLASS_MEMBERS.items() for op in ops
}
assert len(OP_CLASS_TABLE) == sum(len(v) for v in _CLASS_MEMBERS.values()), "op in two classes"

#: The class of an op type qir does not know. ``elementwise`` (a generic vector-unit op): its
#: dtype rules (int8/int16 on nash-e/m, + fp16 on nash-p) are the least surprising guess, and
#: every lookup of an unknown op type is logged once so the guess does not go unnoticed.
UNKNOWN_OP_CLASS = OpClass.ELEMENTWISE

_warned_unknown: set[str] = set()


@dataclass(frozen=True)
class OpClassification:
    """The op class of an op type, and whether it came from the table (``known``) or is the
    :data:`UNKNOWN_OP_CLASS` default."""

    op_type: str
    op_class: OpClass
    known: bool


def classify(op_type: str) -> OpClassification:
    """The op class of ``op_type`` plus a ``known`` flag; never raises for an unknown op type."""
    cls = OP_CLASS_TABLE.get(op_type)
    if cls is not None:
        return OpClassification(op_type, cls, True)
    if op_type not in _warned_unknown:
        _warned_unknown.add(op_type)
        logger.warning("op type %r has no op class; treating it as %r", op_type,
                       UNKNOWN_OP_CLASS.value)
    return OpClassification(op_type, UNKNOWN_OP_CLASS, False)


def op_class(op_type: str) -> OpClass:
    """The :class:`OpClass` of ``op_type``; unknown op types get :data:`UNKNOWN_OP_CLASS`
    (logged once per op type; use :func:`classify` or :func:`is_known_op` to tell)."""
    return classify(op_type).op_class


def is_known_op(op_type: str) -> bool:
    """Whether ``op_type`` is in :data:`OP_CLASS_TABLE` (otherwise it gets the default class)."""
    return op_type in OP_CLASS_TABLE


def ops_in_class(cls: OpClass | str) -> tuple[str, ...]:
    """The op types of one class, in table order."""
    return _CLASS_MEMBERS[OpClass(cls)]
