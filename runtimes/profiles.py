"""NPU march profiles as data: what a Horizon-style BPU accepts, and how it rounds.

A :class:`MarchProfile` is a frozen dataclass of plain values (dtypes, dtype pairs, rounding
modes, accumulator width, LUT parameters, fusion patterns ...). Profiles are *data*, never
subclasses: a pass or a kernel asks the profile (``profile.allows_gemm("int16", "int8")``,
``profile.allowed_act_dtypes("Sigmoid")``, ``profile.round_fn()``) instead of branching on the
march name.

Provenance
----------
Horizon does not publish bit-exact nash semantics, so every parameter says where its value comes
from (``../shared/reference/horizon-semantics.md`` §5):

* ``documented``: stated in public Horizon / D-Robotics docs (for ``generic``: the ONNX spec).
  Values the reference marks *DOC-summary* (seen in a Horizon page whose URL was not kept) count
  as documented and say so in their note.
* ``source``: seen in a public copy of Horizon Python source (may be stale).
* ``assumed``: our choice where nothing public exists, including the reference's *INFERENCE*
  items. Assumed parameters are printed ``[ASSUMED]`` by ``qir profiles``; override them with
  :meth:`MarchProfile.with_overrides` when you know better.
* ``override``: set by the user through :meth:`MarchProfile.with_overrides`.

``profile.provenance[field]`` is a :class:`Provenance` (status, note, and per-item statuses for
collection fields where items differ: e.g. on ``nash-e`` the gemm pair ``(int16, int16)`` is
assumed while the other pairs are documented). A profile cannot be built with a field that has no
provenance entry.

Dtype spellings
---------------
Profile dtypes use the calibration-mode vocabulary of :class:`qir.kinds.CalibMode` plus ``int32``:
``int8``, ``int16``, ``int32``, ``fp16``, ``float`` (= fp32). ``qint8``, ``float16``,
``torch.float16``, numpy dtypes and ``CalibMode`` members are accepted wherever a dtype is asked
for. ``float`` in an activation position means "not quantized" (CPU fallback on a real NPU); it is
always *possible* in qir and never listed as a native activation dtype.
"""
from __future__ import annotations

import dataclasses
import difflib
import enum
import logging
import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from qir.errors import QirError, did_you_mean

__all__ = [
    "OpClass", "OP_CLASS_TABLE", "UNKNOWN_OP_CLASS", "OpClassification", "classify", "op_class",
    "is_known_op", "ops_in_class",
    "Status", "Provenance", "ItemProvenance", "FrozenMap", "LutInt8", "LutInt16",
    "MarchProfile", "PARAM_FIELDS", "PROFILES", "UnknownProfileError",
    "get_profile", "profile_names", "format_profiles", "profile_to_dict",
    "normalize_dtype", "rounding_function", "round_half_up", "round_half_away",
    "ROUND_MODES", "SHIFT_ROUND_MODES", "SCALE_DIVISORS", "REQUANT_MODES", "ACC_OVERFLOW",
    "FP16_LEVELS", "LUT_MODES", "DTYPES", "QRANGES",
    "NASH_E", "NASH_M", "NASH_P", "GENERIC",
]

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Op classes
# --------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------
# Small value types
# --------------------------------------------------------------------------------------------

class FrozenMap(Mapping):
    """A read-only, hashable, picklable mapping (keeps profiles hashable and frozen)."""

    def __init__(self, data: Mapping | Iterable = ()) -> None:
        self._d = dict(data)

    def __getitem__(self, key):
        return self._d[key]

    def __iter__(self) -> Iterator:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __hash__(self) -> int:
        return hash(frozenset(self._d.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({self._d!r})"


class Status(str, enum.Enum):
    """Where a parameter value comes from (see the module docstring)."""

    DOCUMENTED = "documented"
    SOURCE = "source"
    ASSUMED = "assumed"
    OVERRIDE = "override"

    @property
    def marker(self) -> str:
        return _MARKERS[self]


_MARKERS = {Status.DOCUMENTED: "[documented]", Status.SOURCE: "[source]",
            Status.ASSUMED: "[ASSUMED]", Status.OVERRIDE: "[override]"}


@dataclass(frozen=True)
class ItemProvenance:
    """The status of one item of a collection parameter, when it differs from the field's."""

    status: Status
    note: str = ""


@dataclass(frozen=True)
class Provenance:
    """Where one profile parameter comes from.

    ``items`` maps an item of a collection value (a dtype pair, an op class, a fusion pattern,
    a LUT sub-parameter name, an alias) to its own status when that differs from ``status``.
    """

    status: Status
    note: str = ""
    items: FrozenMap = field(default_factory=FrozenMap)

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))
        items = {}
        for k, v in dict(self.items).items():
            if isinstance(v, ItemProvenance):
                items[k] = v
            elif isinstance(v, (str, Status)):
                items[k] = ItemProvenance(Status(v))
            else:
                items[k] = ItemProvenance(Status(v[0]), v[1] if len(v) > 1 else "")
        object.__setattr__(self, "items", FrozenMap(items))

    def status_of(self, item: Any = None) -> Status:
        """The status of ``item`` (the field's own status when the item has none)."""
        if item is not None and item in self.items:
            return self.items[item].status
        return self.status

    def note_of(self, item: Any = None) -> str:
        if item is not None and item in self.items:
            return self.items[item].note
        return self.note

    @property
    def statuses(self) -> frozenset[Status]:
        """Every status that occurs in this field (its own and its items')."""
        return frozenset({self.status, *(p.status for p in self.items.values())})

    @property
    def assumed(self) -> bool:
        """Whether the field, or any item of it, is our assumption."""
        return Status.ASSUMED in self.statuses


@dataclass(frozen=True)
class LutInt8:
    """int8-input lookup table: ``T[i] = quant_out(f(dequant_in(i - index_offset)))``."""

    entries: int = 256
    index_offset: int = 128  # index = x + 128
    out_dtypes: tuple[str, ...] = ("int8",)  # the table has the input's type


@dataclass(frozen=True)
class LutInt16:
    """Segmented LUT used for int16 input (and int8 -> int16): tables + linear end segments."""

    max_segments: int = 64          # documented bound on N (range [N+2, 4], entries [N, 64])
    entries_per_segment: int = 64
    table_segments: int = 6         # the plugin's generator
    linear_end_segments: int = 2
    boundaries: int = 8
    index_frac_bits: int = 8
    divide_strategy: str = "evenly"  # or "curvature"
    interp: str = "linear"           # between neighbouring entries, rounded half up
    out_dtypes: tuple[str, ...] = ("int8", "int16")


# --------------------------------------------------------------------------------------------
# dtypes and rounding
# --------------------------------------------------------------------------------------------

DTYPES = ("int8", "int16", "int32", "fp16", "float")
QRANGES = {"int8": (-128, 127), "int16": (-32768, 32767), "int32": (-2**31, 2**31 - 1)}

_DTYPE_ALIASES = {
    "int8": "int8", "qint8": "int8", "i8": "int8", "s8": "int8",
    "int16": "int16", "qint16": "int16", "i16": "int16", "s16": "int16",
    "int32": "int32", "qint32": "int32", "i32": "int32", "s32": "int32",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "f16": "fp16",
    "float": "float", "float32": "float", "fp32": "float", "f32": "float",
}


def normalize_dtype(dtype: Any) -> str:
    """A dtype in profile spelling (``int8 int16 int32 fp16 float``).

    Accepts those spellings, ``qint8``/``float16``/``fp32``..., ``torch.*`` names, numpy
    dtypes and enum members (``CalibMode.INT8``). Raises ``ValueError`` for anything else.
    """
    if isinstance(dtype, enum.Enum):
        dtype = dtype.value
    if isinstance(dtype, np.dtype) or (isinstance(dtype, type) and issubclass(dtype, np.generic)):
        dtype = np.dtype(dtype).name
    text = str(dtype).strip().lower()
    for prefix in ("torch.", "np.", "numpy."):
        if text.startswith(prefix):
            text = text[len(prefix):]
    try:
        return _DTYPE_ALIASES[text]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {DTYPES}") from None


def round_half_up(x):
    """Round half up: ``floor(x + 0.5)`` (the plugin's ``bpu_round``); -2.5 -> -2, 2.5 -> 3."""
    return np.floor(np.asarray(x) + 0.5)


def round_half_away(x):
    """Round half away from zero (C++ ``std::round``): -2.5 -> -3, 2.5 -> 3."""
    x = np.asarray(x)
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


ROUND_MODES = ("half_to_even", "half_up", "half_away")
#: Rounding of integer right shifts in requantization; ``truncate`` is bernoulli2's.
SHIFT_ROUND_MODES = ROUND_MODES + ("truncate",)
SCALE_DIVISORS = ("qmax", "half_range", "neg_qmin")
REQUANT_MODES = ("float", "fixed16", "fixed32")
ACC_OVERFLOW = ("warn", "saturate", "wrap", "ignore")
FP16_LEVELS = ("none", "limited", "full")
LUT_MODES = ("float", "segment")
_FP16_COMPUTE = ("fp32", "fp16")
_ROUND_FUNCS: dict[str, Callable] = {
    "half_to_even": np.rint, "half_up": round_half_up, "half_away": round_half_away,
}


def rounding_function(mode: str) -> Callable:
    """The numpy rounding function of a float->int rounding mode (see :data:`ROUND_MODES`)."""
    try:
        return _ROUND_FUNCS[mode]
    except KeyError:
        raise ValueError(f"unknown rounding mode {mode!r}; expected one of {ROUND_MODES}") from None


# --------------------------------------------------------------------------------------------
# The profile
# --------------------------------------------------------------------------------------------

_PAIR_FIELDS = ("gemm_dtype_pairs", "matmul_act_act_pairs")
_DTYPE_TUPLE_FIELDS = ("int_dtypes", "gemm_output", "elementwise_dtypes")
_PATTERN_FIELDS = ("fusions", "int8_only_fusions")
_LUT_FIELDS = ("lut_int8", "lut_int16")


@dataclass(frozen=True)
class MarchProfile:
    """One march's quantization rules and arithmetic, with the provenance of every value.

    Build variants with :meth:`with_overrides` (marks the changed fields ``override``) or, inside
    this module, with ``dataclasses.replace`` plus matching provenance entries.
    """

    # identity
    name: str
    aliases: tuple[str, ...]
    # dtypes and granularity
    int_dtypes: tuple[str, ...]
    symmetric: bool                      # zero point always 0
    act_granularity: str                 # "per_tensor"
    weight_granularity: str              # "per_channel"
    default_act_dtype: str               # activations feeding a GEMM (and the general default)
    default_non_gemm_act_dtype: str      # activations feeding any other op class
    default_weight_dtype: str
    act_dtypes: FrozenMap                # OpClass -> native activation dtypes a calib node may be
    # GEMM
    gemm_dtype_pairs: tuple[tuple[str, str], ...]      # allowed (input, weight)
    matmul_act_act_pairs: tuple[tuple[str, str], ...]  # MatMul of two activations (A, B)
    gemm_output: tuple[str, ...]         # int32 = high-precision output (model output/fused Add)
    gemm_float_output: bool              # float high-precision GEMM output exists
    # vector ops
    elementwise_dtypes: tuple[str, ...]  # operand dtypes (both operands share one)
    int8_only_inputs: tuple[str, ...]    # op types whose data input (input 0) must be int8
    int8_only_outputs: tuple[str, ...]   # op types whose output must be int8
    int8_only_fusions: tuple[tuple[str, ...], ...]  # fused groups whose inputs must be int8
    fp16_ops: str                        # "none" | "limited" | "full" (full: every non-GEMM op)
    fp16_documented_ops: tuple[str, ...]  # with "limited": op types with documented fp16 forms
    fp16_compute: str                    # internal precision of fp16 ops ("fp32" | "fp16")
    fp16_saturate: bool                  # overflow to +-65504 instead of +-inf
    fusions: tuple[tuple[str, ...], ...]  # fusion patterns, longest first per head op
    # quantize / requantize arithmetic
    quant_round: str                     # float -> int rounding (see ROUND_MODES)
    scale_divisor: str                   # scale = threshold / divisor when *we* calibrate
    consistency_level: int               # >= 1: power-of-two activation scales (2: weights too)
    requant_mode: str                    # "float" | "fixed16" | "fixed32" (integer level)
    requant_multiplier_bits: int         # fixed-point multiplier width for "fixed16"
    requant_shift_round: str             # rounding of the requant right shift
    high_precision_qpp: bool             # keep "float" requant even at the integer level
    fuse_requant: bool                   # collapse consecutive requant steps
    intermediate_sat16: bool             # bayes-style sat16 after the accumulator shift
    acc_bits: int
    acc_overflow: str                    # "warn" | "saturate" | "wrap" | "ignore"
    bias_dtype: str
    bias_round: str
    saturate: bool                       # saturate (never wrap) to the target dtype range
    # nonlinear ops
    lut_mode: str                        # "float" (evaluate f, quantize) | "segment" (tables)
    lut_int8: LutInt8
    lut_int16: LutInt16
    dynamic_quant_linear: bool           # per-row dynamic activation scales for Linear
    # every field above -> Provenance
    provenance: FrozenMap = field(repr=False, compare=True)

    # -- validation / normalization ------------------------------------------------------
    def __post_init__(self) -> None:
        def put(name, value):
            object.__setattr__(self, name, value)

        put("name", str(self.name))
        put("aliases", tuple(str(a) for a in self.aliases))
        for f in _DTYPE_TUPLE_FIELDS:
            put(f, tuple(normalize_dtype(d) for d in getattr(self, f)))
        for f in _PAIR_FIELDS:
            pairs = tuple(tuple(normalize_dtype(d) for d in p) for p in getattr(self, f))
            bad = [p for p in pairs if len(p) != 2]
            if bad:
                raise ValueError(f"{self.name}: {f} entries must be (dtype, dtype) pairs, got {bad}")
            put(f, pairs)
        for f in ("default_act_dtype", "default_non_gemm_act_dtype", "default_weight_dtype",
                  "bias_dtype"):
            put(f, normalize_dtype(getattr(self, f)))
        act = {}
        for k, v in dict(self.act_dtypes).items():
            act[OpClass(k)] = tuple(normalize_dtype(d) for d in ((v,) if isinstance(v, str) else v))
        missing = [c.value for c in OpClass if c not in act]
        if missing:
            raise ValueError(f"{self.name}: act_dtypes has no entry for op classes {missing}")
        put("act_dtypes", FrozenMap(act))
        for f in ("int8_only_inputs", "int8_only_outputs", "fp16_documented_ops"):
            put(f, tuple(str(o) for o in getattr(self, f)))
        for f in _PATTERN_FIELDS:
            put(f, tuple(tuple(str(o) for o in p) for p in getattr(self, f)))
        for f, cls in (("lut_int8", LutInt8), ("lut_int16", LutInt16)):
            v = getattr(self, f)
            if isinstance(v, Mapping):
                v = cls(**v)
            if not isinstance(v, cls):
                raise ValueError(f"{self.name}: {f} must be a {cls.__name__}, got {v!r}")
            put(f, dataclasses.replace(v, out_dtypes=tuple(normalize_dtype(d) for d in v.out_dtypes)))

        choices = {
            "quant_round": ROUND_MODES, "bias_round": ROUND_MODES,
            "requant_shift_round": SHIFT_ROUND_MODES, "scale_divisor": SCALE_DIVISORS,
            "requant_mode": REQUANT_MODES, "acc_overflow": ACC_OVERFLOW, "fp16_ops": FP16_LEVELS,
            "lut_mode": LUT_MODES, "fp16_compute": _FP16_COMPUTE,
            "act_granularity": ("per_tensor",), "weight_granularity": ("per_channel", "per_tensor"),
        }
        for f, allowed in choices.items():
            if getattr(self, f) not in allowed:
                raise ValueError(f"{self.name}: {f}={getattr(self, f)!r}; expected one of {allowed}")
        if self.lut_int16.divide_strategy not in ("evenly", "curvature"):
            raise ValueError(f"{self.name}: lut_int16.divide_strategy must be 'evenly' or 'curvature'")
        if self.consistency_level not in (0, 1, 2):
            raise ValueError(f"{self.name}: consistency_level must be 0, 1 or 2")
        if not 8 <= int(self.acc_bits) <= 64:
            raise ValueError(f"{self.name}: acc_bits={self.acc_bits} is outside 8..64")

        prov = {}
        for k, v in dict(self.provenance).items():
            prov[k] = v if isinstance(v, Provenance) else Provenance(*v)
        names = set(PARAM_FIELDS)
        missing = sorted(names - set(prov))
        extra = sorted(set(prov) - names)
        if missing or extra:
            raise ValueError(f"profile {self.name!r}: every parameter needs a provenance entry; "
                             f"missing {missing}, unknown {extra}")
        for f, p in prov.items():
            valid = set(_item_keys(f, getattr(self, f)))
            stale = [k for k in p.items if k not in valid]
            if stale:
                raise ValueError(f"profile {self.name!r}: provenance of {f} names items {stale} "
                                 f"that are not in its value")
        put("provenance", FrozenMap(prov))

    # -- queries the passes use ----------------------------------------------------------
    def allows_gemm(self, input_dtype: Any, weight_dtype: Any) -> bool:
        """Whether a GEMM (Conv/ConvTranspose/Gemm, MatMul with a constant B) may take this
        (activation input, weight) dtype pair."""
        return (normalize_dtype(input_dtype), normalize_dtype(weight_dtype)) in self.gemm_dtype_pairs

    def allows_matmul(self, a_dtype: Any, b_dtype: Any) -> bool:
        """Whether a MatMul of two activations may take dtypes (A, B)."""
        return (normalize_dtype(a_dtype), normalize_dtype(b_dtype)) in self.matmul_act_act_pairs

    def allowed_act_dtypes(self, op_type: str, input_index: int = 0) -> tuple[str, ...]:
        """Native dtypes a calibration node feeding input ``input_index`` of ``op_type`` may have.

        The op class's ``act_dtypes``, minus int16 on the data input (index 0) of an
        ``int8_only_inputs`` op (other inputs, e.g. GridSample's grid, keep the class dtypes).
        ``float`` (not quantized) is never listed: qir allows it anywhere, as a CPU fallback.
        """
        dtypes = self.act_dtypes[op_class(op_type)]
        if input_index == 0 and op_type in self.int8_only_inputs:
            dtypes = tuple(d for d in dtypes if d not in ("int16", "int32"))
        return dtypes

    def fp16_support(self, op_type: str) -> str:
        """``native`` (fp16 is a native input dtype of this op), ``limited`` (qir emulates it,
        but the march does not guarantee it: warn) or ``none`` (the march has no fp16)."""
        if "fp16" in self.allowed_act_dtypes(op_type):
            return "native"
        return "none" if self.fp16_ops == "none" else "limited"

    def default_act_dtype_for(self, op_type: str) -> str:
        """The activation dtype the march's default qconfig gives an input of ``op_type``."""
        if op_class(op_type) is OpClass.GEMM:
            return self.default_act_dtype
        return self.default_non_gemm_act_dtype

    def round_fn(self) -> Callable:
        """The numpy rounding function of ``quant_round`` (float -> int quantization)."""
        return rounding_function(self.quant_round)

    def qrange(self, dtype: Any) -> tuple[int, int]:
        """(qmin, qmax) of an integer dtype."""
        d = normalize_dtype(dtype)
        if d not in QRANGES:
            raise ValueError(f"{dtype!r} is not an integer dtype")
        return QRANGES[d]

    def scale_divisor_for(self, dtype: Any) -> float:
        """``threshold / scale`` under ``scale_divisor``: qmax (127), half_range (127.5) or
        neg_qmin (128) for int8; likewise for int16."""
        qmin, qmax = self.qrange(dtype)
        return {"qmax": float(qmax), "half_range": (qmax - qmin) / 2.0,
                "neg_qmin": float(-qmin)}[self.scale_divisor]

    def status_of(self, field_name: str, item: Any = None) -> Status:
        """The provenance status of a parameter (or of one item of a collection parameter)."""
        return self.provenance[field_name].status_of(item)

    def assumed_fields(self) -> tuple[str, ...]:
        """Parameters that are (wholly or partly) our assumption."""
        return tuple(f for f in PARAM_FIELDS if self.provenance[f].assumed)

    def with_overrides(self, **changes: Any) -> "MarchProfile":
        """A copy with some parameters changed by the user; those become status ``override``.

        Raises:
            ValueError: an unknown parameter or an invalid value.
        """
        unknown = [k for k in changes if k not in PARAM_FIELDS]
        if unknown:
            raise ValueError(did_you_mean(unknown[0], PARAM_FIELDS, "profile parameter"))
        prov = dict(self.provenance)
        for k, v in changes.items():
            old = self.provenance[k]
            prov[k] = Provenance(Status.OVERRIDE,
                                 f"set by the user (profile value {getattr(self, k)!r}, {old.status.value})")
        return dataclasses.replace(self, **changes, provenance=FrozenMap(prov))


PARAM_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(MarchProfile)
                                      if f.name != "provenance")


def _item_keys(field_name: str, value: Any) -> list:
    """The items of a parameter value that per-item provenance may refer to."""
    if isinstance(value, (LutInt8, LutInt16)):
        return [f.name for f in dataclasses.fields(value)]
    if isinstance(value, Mapping):
        return list(value)
    if isinstance(value, tuple):
        return list(value)
    return []


# --------------------------------------------------------------------------------------------
# Declaring profiles: S(value, status, note, items) per field
# --------------------------------------------------------------------------------------------

D, SRC, A = Status.DOCUMENTED, Status.SOURCE, Status.ASSUMED


@dataclass(frozen=True)
class _S:
    value: Any
    prov: Provenance


def S(value: Any, status: Status, note: str = "", items: Mapping | None = None) -> _S:  # noqa: N802
    """A parameter value with its provenance, for the profile tables below."""
    return _S(value, Provenance(status, note, FrozenMap(items or {})))


def _profile(**params: _S) -> MarchProfile:
    return MarchProfile(**{k: v.value for k, v in params.items()},
                        provenance=FrozenMap({k: v.prov for k, v in params.items()}))


def _derive(base: MarchProfile, **params: _S) -> MarchProfile:
    """``<<: base`` then the given fields (values and provenance) - dataclasses.replace."""
    prov = dict(base.provenance)
    prov.update({k: v.prov for k, v in params.items()})
    return dataclasses.replace(base, **{k: v.value for k, v in params.items()},
                               provenance=FrozenMap(prov))


_REF = "horizon-semantics.md"
_SUMMARY = "doc summary (Horizon page seen, URL not kept; re-verify)"

_I8_I16 = ("int8", "int16")
_INT8_ONLY_IN = ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool",
                 "GlobalLpPool", "Resize", "Upsample", "GridSample", "RoiAlign",
                 "DetectionPostProcess")
_INT8_ONLY_OUT = ("MaxPool", "GlobalMaxPool", "Resize", "Upsample", "GridSample", "RoiAlign")

_NASH_FUSIONS = (
    ("Conv", "Add", "Relu"), ("Conv", "Add"), ("Conv", "Relu"), ("Conv", "Clip"),
    ("ConvTranspose", "Relu"), ("Gemm", "Add"), ("Gemm", "Relu"),
)
_NASH_FUSION_ITEMS = {
    ("Conv", "Add", "Relu"): (A, "Conv+Add+ReLU: plugin fused variant not in the reference; assumed"),
    ("Conv", "Add"): (D, "int32 Add 'must be fusible into a Conv' (J6E/M torch constraints); "
                        "fused Conv+Add in the plugin canonicalizer [source]"),
    ("Conv", "Relu"): (SRC, "plugin GEMM_MODULE lists fused conv variants; ReLU clamps in the "
                            "integer domain before saturation (assumed)"),
    ("Conv", "Clip"): (A, "ReLU6-style Clip after Conv: not in the reference"),
    ("ConvTranspose", "Relu"): (A, "not in the reference"),
    ("Gemm", "Add"): (SRC, "Linear+Add fusion in the plugin canonicalizer"),
    ("Gemm", "Relu"): (SRC, "plugin GEMM_MODULE lists fused Linear variants"),
}

NASH_E = _profile(
    name=S("nash-e", D, "hmct / horizon_plugin_pytorch march name (J6E)"),
    aliases=S(("J6E", "S100"), D, "S100 OE terminology: J6E = nash-e",
              items={"S100": (A, "S100 = nash-e and S100P = nash-m is our inference from page "
                                 "titles listing 'S100/S100P' for J6E/M")}),
    int_dtypes=S(_I8_I16, D, "qint8 [-128,127], qint16 [-32768,32767]; int32 for accumulators, "
                             "bias and high-precision GEMM output"),
    symmetric=S(True, D, "'BPU only supports symmetric quantization'; zero point always 0"),
    act_granularity=S("per_tensor", SRC, "hmct calibration nodes / plugin observers"),
    weight_granularity=S("per_channel", SRC, "axis 0 (Conv/Gemm), ONNX axis 1 (ConvTranspose); "
                                             "MatMul-with-constant axis is inference"),
    default_act_dtype=S("int8", D, "J6E/M default route: full int8, then int8/int16 mix"),
    default_non_gemm_act_dtype=S("int8", D, "J6E/M default route: full int8"),
    default_weight_dtype=S("int8", D, "weights int8 per channel"),
    act_dtypes=S(
        {OpClass.GEMM: _I8_I16, OpClass.ELEMENTWISE: _I8_I16, OpClass.LUT: _I8_I16,
         OpClass.POOL_RESIZE: _I8_I16, OpClass.SHAPE: _I8_I16, OpClass.REDUCE: _I8_I16,
         OpClass.NORM: _I8_I16},
        D, "J6E/M operator constraint lists (int8/int16; fp16 not native, see fp16_ops)",
        items={
            OpClass.POOL_RESIZE: (SRC, "data input int8-only per int8_only_inputs (plugin "
                                       "canonicalizer); int16 for other inputs, e.g. the GridSample "
                                       "grid (GEMMToGridSampleGridInt16Template)"),
            OpClass.SHAPE: (A, "TRANS ops move data without arithmetic; any integer dtype passes"),
            OpClass.REDUCE: (A, "same vector unit as elementwise (inference)"),
            OpClass.NORM: (A, "BatchNorm is normally folded; standalone it is a per-channel "
                              "mul/add (inference)"),
        }),
    gemm_dtype_pairs=S(
        (("int8", "int8"), ("int16", "int8"), ("int16", "int16")),
        D, "input x weight; (int8, int16) is not documented (disallowed); int16-ec unsupported",
        items={("int16", "int16"): (A, "dual-int16 on nash-e: documented for J6M/J6P, and hmct "
                                       "documents dual-int16 without a march restriction; hbdk4 "
                                       "acceptance on nash-e unknown")}),
    matmul_act_act_pairs=S(
        (("int8", "int8"), ("int16", "int8"), ("int8", "int16"), ("int16", "int16")),
        D, "MatMul of two activations",
        items={("int16", "int8"): (A, "int8/int16 mixes documented in an LLM case (likely nash-p)"),
               ("int8", "int16"): (A, "int8/int16 mixes documented in an LLM case (likely nash-p)"),
               ("int16", "int16"): (A, "dual-int16 matmul: documented on J6P; the old plugin "
                                       "canonicalizer forced one input to int8 [source]")}),
    gemm_output=S(("int8", "int16", "int32"), D,
                  "int32 = high-precision output, only for a GEMM feeding a model output / "
                  "DeQuantStub or an Add fused into the conv",
                  items={"int32": (D, "high-precision int32 output: " + _SUMMARY)}),
    gemm_float_output=S(False, D, _SUMMARY + "; the per-march int32-vs-float split is inference"),
    elementwise_dtypes=S(("int8", "int16", "int32"), D,
                         "Add: int8/int16, int32 only when fusible into a Conv (J6E/M torch list); "
                         "the ONNX list also shows fp16/fp32 Add (see fp16_ops)"),
    int8_only_inputs=S(_INT8_ONLY_IN, SRC, "plugin qconfig canonicalizer (identical for nash-e/m/p; "
                                           "may be outdated): pooling, interpolate, GridSample "
                                           "input, ROIAlign, DetectionPostProcess; a warning, "
                                           "not an error"),
    int8_only_outputs=S(_INT8_ONLY_OUT, SRC, "plugin canonicalizer: max-pool, interpolate, "
                                             "grid-sample, ROIAlign (and MultiheadAttention)"),
    int8_only_fusions=S((("Conv", "Add"), ("Gemm", "Add")), SRC,
                        "plugin canonicalizer: fused Conv+Add / Linear+Add take int8 on both inputs"),
    fp16_ops=S("limited", D, "J6E/M ONNX constraints list fp16 Add/Abs; fp16 recommended only "
                             "sparingly (LayerNorm); qir emulates fp16 anywhere with a warning"),
    fp16_documented_ops=S(("Add", "Abs", "LayerNormalization"), D,
                          "fp16 forms in the J6E/M ONNX list (Add, Abs) and the deployment guide "
                          "(LayerNorm)"),
    fp16_compute=S("fp32", A, "cast inputs to fp16, compute in fp32, round the result to fp16"),
    fp16_saturate=S(False, A, "fp16 overflow goes to +-inf (IEEE); saturation to +-65504 unknown"),
    fusions=S(_NASH_FUSIONS, D, "", items=_NASH_FUSION_ITEMS),
    quant_round=S("half_to_even", A, "plugin default QuantRoundMode.HALF_TO_EVEN [source]; that "
                                     "nash hardware rounds float->int this way is assumed"),
    scale_divisor=S("qmax", A, "options qmax (T/127, hmct [source]), half_range (T/127.5, plugin "
                               "observers), neg_qmin (T/128, plugin fixed scale); default chosen "
                               "for the PTQ import path"),
    consistency_level=S(0, D, "ConsistencyStrategy level 0: statistical (non power-of-two) scales"),
    requant_mode=S("float", A, "debugging default: requant in float64 with half-to-even rounding; "
                               "fixed16 = bayes hbdk3 multiplier [source for bayes], fixed32 = "
                               "gemmlowp Q31"),
    requant_multiplier_bits=S(16, A, "16-bit multiplier, 15 fractional bits: bayes hbdk3 builder "
                                     "[source]; nash width unknown"),
    requant_shift_round=S("half_up", A, "(x + 2^(n-1)) >> n; bayes rounds shifts [source], nash "
                                        "unknown"),
    high_precision_qpp=S(True, D, "ConsistencyStrategy level 0 = high-precision QPP; modelling it "
                                  "as float requant is inference"),
    fuse_requant=S(False, D, "ConsistencyStrategy level 0 = no requantize fusion; the fused "
                             "arithmetic is assumed"),
    intermediate_sat16=S(False, A, "bayes-era kernels saturate to 16 bits after accu_rshift "
                                   "[source]; not known for nash"),
    acc_bits=S(32, A, "int32 accumulation documented for bayes (J5) int16 conv; for nash, "
                      "standard practice (inference)"),
    acc_overflow=S("warn", A, "dual-int16 overflow behaviour unknown: qir accumulates exactly and "
                              "warns when the sum leaves acc_bits"),
    bias_dtype=S("int32", D, "int32 bias (integer dtypes list)"),
    bias_round=S("half_to_even", A, "b_q = round(b / (s_x * s_w)); bayes uses a shifted int bias "
                                    "[source]"),
    saturate=S(True, A, "documented for J6P/H Add ('overflow saturates to the result dtype's "
                        "min/max'); generalized to every op and to nash-e/m"),
    lut_mode=S("float", A, "debugging default: evaluate f exactly, then quantize (plugin before "
                           "pre_export); 'segment' emulates the tables"),
    lut_int8=S(LutInt8(), D, "int8: one 256-entry table of the input's type",
               items={"index_offset": (SRC, "index = x + 128 (plugin)")}),
    lut_int16=S(LutInt16(), SRC, "plugin SegmentLUT generator",
                items={"max_segments": (D, "ONNX constraint: range int16 [N+2, 4], N <= 64"),
                       "entries_per_segment": (D, "ONNX constraint: entry int16 [N, 64]"),
                       "interp": (A, "bpu_segment_lut is closed: linear interpolation on the Q8 "
                                     "index, rounded half up"),
                       "out_dtypes": (D, "int16 -> int8 | int16")}),
    dynamic_quant_linear=S(False, D, "dynamic quant (per-row Linear activations) is nash-p only"),
)

NASH_M = _derive(
    NASH_E,
    name=S("nash-m", D, "hmct / horizon_plugin_pytorch march name (J6M)"),
    aliases=S(("J6M", "S100P"), D, "S100 OE terminology: J6M = nash-m",
              items={"S100P": (A, "S100P = nash-m is our inference from page titles listing "
                                  "'S100/S100P' for J6E/M")}),
    gemm_dtype_pairs=S((("int8", "int8"), ("int16", "int8"), ("int16", "int16")), D,
                       "input x weight; (int8, int16) is not documented (disallowed)",
                       items={("int16", "int16"): (D, "dual-int16 example on J6M: " + _SUMMARY)}),
)

_P_ALL = ("int8", "int16", "fp16")
_P_NOTE = "J6P: non-GEMM ops default to float16; nonlinear ops int8->int8, int16->int8|int16, fp16"
NASH_P = _derive(
    NASH_E,
    name=S("nash-p", D, "hmct / horizon_plugin_pytorch march name (J6P)"),
    aliases=S(("J6P", "nash-h", "J6H"), D, "product mapping: J6P = nash-p",
              items={"nash-h": (A, "nash-h (J6H) is its own march; it shares the J6P/H constraint "
                                   "list, so qir maps it onto nash-p"),
                     "J6H": (A, "J6H = nash-h, mapped onto nash-p (shared J6P/H constraint list)")}),
    act_dtypes=S({OpClass.GEMM: _I8_I16, OpClass.ELEMENTWISE: _P_ALL, OpClass.LUT: _P_ALL,
                  OpClass.POOL_RESIZE: _P_ALL, OpClass.SHAPE: _P_ALL, OpClass.REDUCE: _P_ALL,
                  OpClass.NORM: _P_ALL},
                 D, _P_NOTE,
                 items={OpClass.GEMM: (D, "J6P GEMM int8/int16"),
                        OpClass.POOL_RESIZE: (SRC, "fp16 per the J6P non-GEMM default; the data "
                                                   "input is int8-only when quantized "
                                                   "(int8_only_inputs, plugin canonicalizer)"),
                        OpClass.SHAPE: (A, "int16 through TRANS ops: no arithmetic (inference)"),
                        OpClass.REDUCE: (A, "int16 reductions: same vector unit as elementwise "
                                            "(inference); fp16 documented (non-GEMM default)"),
                        OpClass.NORM: (A, "int16 BatchNorm/InstanceNorm (inference); fp16 "
                                          "documented (non-GEMM default)")}),
    default_non_gemm_act_dtype=S("fp16", D, "J6P standard config 'fp16 + int8': non-GEMM fp16"),
    gemm_dtype_pairs=S((("int8", "int8"), ("int16", "int8"), ("int16", "int16")), D,
                       "ConvDtypeTemplate(qint16, qint16) on J6P (j6-plugin-precision-tuning)"),
    matmul_act_act_pairs=S(
        (("int8", "int8"), ("int16", "int8"), ("int8", "int16"), ("int16", "int16")), D,
        "MatmulDtypeTemplate(input_dtypes=qint16) on J6P; [qint8, qint16] / [qint16, qint8] in "
        "the LLM case study"),
    gemm_float_output=S(True, D, "float high-precision GEMM output on J6B/H/P: " + _SUMMARY),
    elementwise_dtypes=S(("int8", "int16", "int32", "fp16", "float"), D,
                         "J6P/H add: int8/int16/int32/float16/float32, both operands one type"),
    fp16_ops=S("full", D, "J6P: fp16 for every non-GEMM op, the default route"),
    fp16_documented_ops=S((), D, "not needed with fp16_ops = full"),
    consistency_level=S(0, A, "ConsistencyStrategy is documented for J6E/M; assumed the same here"),
    high_precision_qpp=S(True, A, "ConsistencyStrategy level 0 (documented for J6E/M) assumed "
                                  "for J6P"),
    fuse_requant=S(False, A, "ConsistencyStrategy level 0 (documented for J6E/M) assumed for J6P"),
    saturate=S(True, D, "J6P/H add: 'when inputs are integer/quantized, overflow saturates to the "
                        "result dtype's min/max'; generalized to every op (assumed)"),
    dynamic_quant_linear=S(True, D, "SetDynamicQuantTemplate (nash-p LLM); not emulated in v1"),
)

_G_ALL = ("int8", "int16", "fp16")
_ONNX = "ONNX QuantizeLinear / ConvInteger spec"
GENERIC = _profile(
    name=S("generic", A, "plain int8/int16/fp16 everywhere, ONNX rounding; no march restrictions"),
    aliases=S((), A, ""),
    int_dtypes=S(_I8_I16, D, "ONNX QuantizeLinear int8/int16 (opset 21)"),
    symmetric=S(True, A, "qir's calibration nodes are symmetric (zero point 0)"),
    act_granularity=S("per_tensor", A, "qir default"),
    weight_granularity=S("per_channel", A, "qir default (per output channel)"),
    default_act_dtype=S("int8", A, "qir default"),
    default_non_gemm_act_dtype=S("int8", A, "qir default"),
    default_weight_dtype=S("int8", A, "qir default"),
    act_dtypes=S({c: _G_ALL for c in OpClass}, A, "no restriction"),
    gemm_dtype_pairs=S((("int8", "int8"), ("int16", "int8"), ("int8", "int16"), ("int16", "int16"),
                        ("fp16", "fp16")), A, "no restriction"),
    matmul_act_act_pairs=S((("int8", "int8"), ("int16", "int8"), ("int8", "int16"),
                            ("int16", "int16"), ("fp16", "fp16")), A, "no restriction"),
    gemm_output=S(("int8", "int16", "int32", "fp16", "float"), A, "no restriction"),
    gemm_float_output=S(True, A, "no restriction"),
    elementwise_dtypes=S(("int8", "int16", "int32", "fp16", "float"), A, "no restriction"),
    int8_only_inputs=S((), A, "no restriction"),
    int8_only_outputs=S((), A, "no restriction"),
    int8_only_fusions=S((), A, "no restriction"),
    fp16_ops=S("full", A, "no restriction"),
    fp16_documented_ops=S((), A, "not needed with fp16_ops = full"),
    fp16_compute=S("fp32", A, "cast inputs to fp16, compute in fp32, round the result to fp16"),
    fp16_saturate=S(False, D, "IEEE binary16: overflow to +-inf"),
    fusions=S((("Conv", "Relu"), ("Conv", "Clip"), ("ConvTranspose", "Relu"),
               ("Gemm", "Relu"), ("Gemm", "Clip"), ("MatMul", "Relu")), A,
              "activations folded into the quantized range, as onnxruntime's quantizer does"),
    quant_round=S("half_to_even", D, _ONNX),
    scale_divisor=S("qmax", A, "T/127, T/32767 (hmct convention)"),
    consistency_level=S(0, A, "no power-of-two scales"),
    requant_mode=S("float", A, "float64 requant, half-to-even"),
    requant_multiplier_bits=S(16, A, "only used with requant_mode fixed16"),
    requant_shift_round=S("half_up", A, "only used with fixed-point requant"),
    high_precision_qpp=S(True, A, "float requant"),
    fuse_requant=S(False, A, "no requant fusion"),
    intermediate_sat16=S(False, A, "no intermediate saturation"),
    acc_bits=S(32, D, _ONNX + ": int32 accumulation"),
    acc_overflow=S("warn", A, "qir accumulates exactly and warns past acc_bits"),
    bias_dtype=S("int32", D, _ONNX),
    bias_round=S("half_to_even", D, _ONNX),
    saturate=S(True, D, _ONNX + ": saturate to the target range"),
    lut_mode=S("float", A, "evaluate f exactly, then quantize"),
    lut_int8=S(LutInt8(), A, "only used with lut_mode = segment"),
    lut_int16=S(LutInt16(), A, "only used with lut_mode = segment"),
    dynamic_quant_linear=S(False, A, "static quantization"),
)

#: The built-in profiles by canonical name.
PROFILES: Mapping[str, MarchProfile] = FrozenMap(
    (p.name, p) for p in (NASH_E, NASH_M, NASH_P, GENERIC))


# --------------------------------------------------------------------------------------------
# Lookup
# --------------------------------------------------------------------------------------------

class UnknownProfileError(QirError, ValueError):
    """A march profile name that is neither a profile nor an alias."""


def _norm_name(name: str) -> str:
    return str(name).strip().lower().replace("_", "-")


def _name_index() -> dict[str, tuple[str, str]]:
    """normalized name or alias -> (canonical profile name, display spelling)."""
    index: dict[str, tuple[str, str]] = {}
    for p in PROFILES.values():
        for n in (p.name, *p.aliases):
            index[_norm_name(n)] = (p.name, n)
    return index


def profile_names() -> tuple[str, ...]:
    """Canonical names of the built-in profiles."""
    return tuple(PROFILES)


def get_profile(name: str | MarchProfile) -> MarchProfile:
    """A profile by name or alias, case-insensitive (``nash-e``, ``J6E``, ``s100``, ``NASH_P``).

    A :class:`MarchProfile` is returned as is, so APIs can take either.

    Raises:
        UnknownProfileError: (a ``ValueError``) naming the known profiles and the closest match.
    """
    if isinstance(name, MarchProfile):
        return name
    index = _name_index()
    hit = index.get(_norm_name(name))
    if hit is not None:
        return PROFILES[hit[0]]
    # did_you_mean's wording, but matching normalized names and suggesting display spellings
    # (closest first; on a tie a profile name before an alias, then table order)
    norm = _norm_name(name)
    scored = []
    for order, (key, (canon, display)) in enumerate(index.items()):
        ratio = difflib.SequenceMatcher(None, norm, key).ratio()
        if ratio >= 0.5:
            scored.append((-ratio, display != canon, order, display))
    suggestions = [s[3] for s in sorted(scored)[:3]]
    hint = f"; did you mean {', '.join(repr(s) for s in suggestions)}?" if suggestions else ""
    known = ", ".join(f"{p.name} ({', '.join(p.aliases)})" if p.aliases else p.name
                      for p in PROFILES.values())
    raise UnknownProfileError(f"no march profile named {name!r}{hint} (known profiles: {known})")


# --------------------------------------------------------------------------------------------
# Text and dict forms (qir profiles)
# --------------------------------------------------------------------------------------------

_NAME_W = 27
_VALUE_W = 40
_NOTE_W = 100

LEGEND = (
    "Legend: [documented] public Horizon/D-Robotics docs (generic: the ONNX spec)\n"
    "        [source]     seen in a public copy of Horizon source (may be stale)\n"
    "        [ASSUMED]    our assumption: nothing public; override it if you know better\n"
    "        [override]   set by you\n"
    "        Indented lines: entries of a table, and items whose status differs from their\n"
    "        parameter's (a parameter marked 'partly ASSUMED' has assumed items)."
)


def _item_text(field_name: str, item: Any, value: Any = None) -> str:
    if field_name in _PAIR_FIELDS:
        return f"{item[0]} x {item[1]}"
    if field_name in _PATTERN_FIELDS:
        return "+".join(item)
    if isinstance(item, enum.Enum):
        return str(item.value)
    return str(item)


def _value_text(field_name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, tuple):
        return ", ".join(_item_text(field_name, v) for v in value) if value else "-"
    return str(value)


def _sub_value_text(value: Any) -> str:
    if isinstance(value, tuple):
        return ", ".join(str(v) for v in value) if value else "-"
    return str(value)


def _marker(prov: Provenance) -> str:
    others = sorted(prov.statuses - {prov.status}, key=list(Status).index)
    if not others:
        return prov.status.marker
    return f"[{prov.status.value}, partly " + ", ".join(
        s.value.upper() if s is Status.ASSUMED else s.value for s in others) + "]"


def _line(name: str, value: str, marker: str, indent: int = 2) -> str:
    """``name  value  marker`` in aligned columns; a long value wraps inside its column."""
    name_w = _NAME_W - (indent - 2)
    chunks = textwrap.wrap(value, _VALUE_W, break_on_hyphens=False) or [""]
    lines = [f"{' ' * indent}{name:<{name_w}} {chunks[0]:<{_VALUE_W}} {marker}"]
    lines += [f"{' ' * (_NAME_W + 3)}{c}" for c in chunks[1:]]
    return "\n".join(lines)


def _format_profile(p: MarchProfile, notes: bool) -> list[str]:
    head = f"{p.name}" + (f"  (aliases: {', '.join(p.aliases)})" if p.aliases else "")
    lines = [head]

    def note_line(text: str, indent: int) -> None:
        if notes and text:
            pad = " " * (indent + 2)
            lines.extend(textwrap.wrap(text, _NOTE_W, initial_indent=pad + "- ",
                                       subsequent_indent=pad + "  ", break_on_hyphens=False))

    for f in PARAM_FIELDS:
        value = getattr(p, f)
        prov = p.provenance[f]
        if isinstance(value, (Mapping, LutInt8, LutInt16)):
            lines.append(f"  {f:<{_NAME_W}} {'':<{_VALUE_W}} {_marker(prov)}")
            note_line(prov.note, 2)
            subs = (list(value.items()) if isinstance(value, Mapping)
                    else [(x.name, getattr(value, x.name)) for x in dataclasses.fields(value)])
            for key, sub in subs:
                key_text = _item_text(f, key)
                item_prov = prov.items.get(key)
                status = item_prov.status if item_prov else prov.status
                lines.append(_line(key_text, _sub_value_text(sub), status.marker, indent=4))
                if item_prov:
                    note_line(item_prov.note, 4)
            continue
        lines.append(_line(f, _value_text(f, value), _marker(prov)))
        note_line(prov.note, 2)
        for item, item_prov in prov.items.items():
            if item_prov.status is not prov.status:
                lines.append(_line(_item_text(f, item), "", item_prov.status.marker, indent=4))
                note_line(item_prov.note, 4)
    return lines


def format_profiles(names: Iterable[str] | None = None, *, notes: bool = False) -> str:
    """The text of ``qir profiles``: a legend, then one block per profile with one line per
    parameter (value and ``[documented]`` / ``[source]`` / ``[ASSUMED]`` / ``[override]``).

    ``names`` are profile names or aliases (default: every built-in profile) or profiles;
    ``notes=True`` adds the reason behind each value under its line.
    """
    profiles = [get_profile(n) for n in names] if names is not None else list(PROFILES.values())
    blocks = [LEGEND]
    for p in profiles:
        blocks.append("\n".join(_format_profile(p, notes)))
    assumed = {p.name: p.assumed_fields() for p in profiles}
    summary = ["Assumed parameters (wholly or partly):"]
    for name, fields in assumed.items():
        summary.extend(textwrap.wrap(f"{name}: " + (", ".join(fields) if fields else "none"),
                                     _NOTE_W, initial_indent="  ", subsequent_indent="    "))
    blocks.append("\n".join(summary))
    return "\n\n".join(blocks) + "\n"


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (LutInt8, LutInt16)):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(_jsonable(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


def profile_to_dict(profile: str | MarchProfile) -> dict[str, Any]:
    """A JSON-ready dict: ``{"name", "params": {field: {"value", "status", "note", "items"}}}``;
    ``items`` lists per-item statuses that differ from the field's."""
    p = get_profile(profile)
    params = {}
    for f in PARAM_FIELDS:
        prov = p.provenance[f]
        params[f] = {
            "value": _jsonable(getattr(p, f)),
            "status": prov.status.value,
            "note": prov.note,
            "items": [{"item": _item_text(f, k) if f in _PAIR_FIELDS + _PATTERN_FIELDS
                       else _jsonable(k), "status": ip.status.value, "note": ip.note}
                      for k, ip in prov.items.items()],
        }
    return {"name": p.name, "aliases": list(p.aliases), "params": params}
