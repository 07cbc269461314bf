"""The :class:`MarchProfile` type: a march's rules as a frozen dataclass of plain values, each with
its provenance.

A profile holds dtypes, dtype pairs, rounding modes, accumulator width, LUT parameters, fusion
patterns ... Profiles are *data*, never subclasses: a pass or a kernel asks the profile
(``profile.allows_gemm("int16", "int8")``, ``profile.allowed_act_dtypes("Sigmoid")``,
``profile.round_fn()``) instead of branching on the march name. The march tables themselves live
in :mod:`qir.runtimes.march.nash_e` & co.; this module only defines their type and the helpers
that declare them (``S(value, status, note, items)`` per field, :func:`make_profile`,
:func:`derive_profile`).

Provenance
----------
Horizon does not publish bit-exact nash semantics, so every parameter says where its value comes
from:

* ``documented``: stated in public Horizon / D-Robotics docs (for ``generic``: the ONNX spec).
  Values seen in a Horizon page whose address was not kept count as documented and say so in
  their note.
* ``source``: seen in a public copy of Horizon Python source (may be stale).
* ``assumed``: our choice where nothing public exists, including our readings of
  the public facts. Assumed parameters are printed ``[ASSUMED]`` by ``qir profiles``; override them with
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

Rounding and integer ranges have one source each: the rounding functions are
:data:`qir.runtimes.numerics.ROUNDING`, the int8/int16 ranges :data:`qir.calibration.QRANGE`.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from qir.calibration import QRANGE
from qir.errors import did_you_mean
from qir.runtimes.march.op_classes import OpClass, op_class
from qir.runtimes.march.rates import check_rates, rate_key
from qir.runtimes.numerics import ROUNDING

__all__ = [
    "Status", "Provenance", "ItemProvenance", "FrozenMap", "LutInt8", "LutInt16",
    "MarchProfile", "PARAM_FIELDS", "PAIR_FIELDS", "PATTERN_FIELDS", "COMPOSITE_KINDS",
    "normalize_dtype", "rounding_function",
    "ROUND_MODES", "SHIFT_ROUND_MODES", "SCALE_DIVISORS", "REQUANT_MODES", "ACC_OVERFLOW",
    "FP16_LEVELS", "LUT_MODES", "DTYPES", "QRANGES", "TUNE_LEVELS",
    "D", "SRC", "A", "I8_I16", "S", "make_profile", "derive_profile",
]


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
#: (qmin, qmax) of each integer profile dtype: int8/int16 are :data:`qir.calibration.QRANGE`
#: (the one table of calibration-mode ranges); int32 (accumulators, bias) is added here.
QRANGES: dict[str, tuple[int, int]] = {
    **{mode.value: qrange for mode, qrange in QRANGE.items()}, "int32": (-2**31, 2**31 - 1)}

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


#: float -> int rounding modes: the keys of :data:`qir.runtimes.numerics.ROUNDING`, the one table
#: of rounding functions (the runtimes' fake quantization uses the same functions).
ROUND_MODES: tuple[str, ...] = tuple(ROUNDING)
#: Rounding of integer right shifts in requantization; ``truncate`` is bernoulli2's.
SHIFT_ROUND_MODES = ROUND_MODES + ("truncate",)
SCALE_DIVISORS = ("qmax", "half_range", "neg_qmin")
REQUANT_MODES = ("float", "fixed16", "fixed32")
ACC_OVERFLOW = ("warn", "saturate", "wrap", "ignore")
FP16_LEVELS = ("none", "limited", "full")
LUT_MODES = ("float", "segment")
SOFTMAX_MODES = ("float", "exp_table")
_FP16_COMPUTE = ("fp32", "fp16")


def rounding_function(mode: str) -> Callable:
    """The numpy rounding function of a float->int rounding mode (see :data:`ROUND_MODES`): the
    entry of :data:`qir.runtimes.numerics.ROUNDING`, so it takes a numpy array or scalar."""
    try:
        return ROUNDING[mode]
    except KeyError:
        raise ValueError(f"unknown rounding mode {mode!r}; expected one of {ROUND_MODES}") from None


# --------------------------------------------------------------------------------------------
# The profile
# --------------------------------------------------------------------------------------------

#: Parameters whose items are (dtype, dtype) pairs, and those whose items are op-type patterns.
PAIR_FIELDS = ("gemm_dtype_pairs", "matmul_act_act_pairs")
_DTYPE_TUPLE_FIELDS = ("int_dtypes", "gemm_output", "elementwise_dtypes")
PATTERN_FIELDS = ("fusions", "int8_only_fusions")
#: Ops an exporter spells out op by op that a march may run as one unit (``composites``; found by
#: :mod:`qir.passes.lib.composites`): a LayerNorm (ReduceMean, Sub, Pow, ..., Div, [Mul, Add]), an
#: erf-form GELU, a HardSwish (Add, Clip, Mul, Div; or HardSigmoid, Mul) and a SiLU (Sigmoid, Mul).
COMPOSITE_KINDS = ("LayerNorm", "Gelu", "HardSwish", "Silu")


@dataclass(frozen=True)
class MarchProfile:
    """One march's quantization rules and arithmetic, with the provenance of every value.

    Build variants with :meth:`with_overrides` (marks the changed fields ``override``) or, in
    the march tables, with :func:`derive_profile` (``dataclasses.replace`` plus matching
    provenance entries).
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
    composites: tuple[str, ...]          # spelled-out ops run as one unit (COMPOSITE_KINDS)
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
    softmax_mode: str                    # "float" (dequantize, compute, requantize) | "exp_table"
    dynamic_quant_linear: bool           # per-row dynamic activation scales for Linear
    # the integer level
    integer_ops: tuple[str, ...] | None  # op types computed in integer (None: every op qir has an
    #                                      integer kernel for); the rest run in float (CPU fallback)
    # accuracy tuning (qir tune): the march's mixed-precision pipeline, as data
    tune_ladder: FrozenMap               # "gemm" | "other" -> precision levels, cheapest first (TUNE_LEVELS)
    tune_costs: FrozenMap                # level -> cost per FLOP relative to int8 (GEMM keys "A x W")
    # the latency model (qir profile --cost; runtimes/march/rates.py)
    peak_tops: FrozenMap                 # rate key ("int8 x int8" ... "fp16", "float") -> tera-ops/s
    memory_gbps: float                   # bandwidth of the memory feature maps and weights cross, GB/s
    op_overhead_us: float                # fixed time per op the march runs (a fused group once), µs
    free_ops: tuple[str, ...]            # op types that move no data (views): they cost nothing
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
        for f in PAIR_FIELDS:
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
        put("tune_ladder", FrozenMap({str(k): tuple(str(v) for v in levels) for k, levels in dict(self.tune_ladder).items()}))
        put("tune_costs", FrozenMap({str(k): float(v) for k, v in dict(self.tune_costs).items()}))
        put("peak_tops", FrozenMap({str(k): float(v) for k, v in dict(self.peak_tops).items()}))
        put("memory_gbps", float(self.memory_gbps))
        put("op_overhead_us", float(self.op_overhead_us))
        put("free_ops", tuple(str(o) for o in self.free_ops))
        for f in ("int8_only_inputs", "int8_only_outputs", "fp16_documented_ops", "composites"):
            put(f, tuple(str(o) for o in getattr(self, f)))
        if self.integer_ops is not None:
            put("integer_ops", tuple(str(o) for o in self.integer_ops))
        for f in PATTERN_FIELDS:
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
            "lut_mode": LUT_MODES, "fp16_compute": _FP16_COMPUTE, "softmax_mode": SOFTMAX_MODES,
            "act_granularity": ("per_tensor",), "weight_granularity": ("per_channel", "per_tensor"),
        }
        for f, allowed in choices.items():
            if getattr(self, f) not in allowed:
                raise ValueError(f"{self.name}: {f}={getattr(self, f)!r}; expected one of {allowed}")
        _check_tune(self)
        _check_composites(self)
        check_rates(self)
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

    def computes_in_integer(self, op_type: str) -> bool:
        """Whether the integer level computes ``op_type`` in integer arithmetic on this march
        (given qir has an integer kernel for it); otherwise it runs in float, as a CPU would."""
        return self.integer_ops is None or op_type in self.integer_ops

    def peak_ops_per_s(self, input_dtype: Any, weight_dtype: Any = None) -> float:
        """Operations per second of an op at this (input, weight) precision: ``peak_tops`` at
        :func:`~qir.runtimes.march.rates.rate_key` × 1e12."""
        weight = normalize_dtype(weight_dtype) if weight_dtype is not None else None
        return self.peak_tops[rate_key(normalize_dtype(input_dtype), weight)] * 1e12

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


#: The precision levels of ``tune_ladder``: level -> (activation mode, mode of the weights of the
#: GEMMs that activation feeds; None: left as they are). ``int16+w16`` is dual int16 (int16 input
#: and weight); ``float`` (not quantized, the CPU) is never in a ladder: ``qir tune --allow float``
#: appends it, costed by ``tune_costs["float"]`` / ``["float x float"]``.
TUNE_LEVELS: dict[str, tuple[str, str | None]] = {
    "int8": ("int8", "int8"), "int16": ("int16", "int8"), "int16+w16": ("int16", "int16"),
    "fp16": ("fp16", None), "float": ("float", "float")}


def _check_tune(p: "MarchProfile") -> None:
    """``tune_ladder`` has a ``gemm`` and an ``other`` ladder of known levels; ``tune_costs`` prices
    every level a ladder holds, and float."""
    if set(p.tune_ladder) != {"gemm", "other"}:
        raise ValueError(f"{p.name}: tune_ladder needs exactly the keys 'gemm' and 'other', got {sorted(p.tune_ladder)}")
    for key, levels in p.tune_ladder.items():
        bad = [lv for lv in levels if lv not in TUNE_LEVELS or lv == "float"]
        if not levels or bad:
            raise ValueError(f"{p.name}: tune_ladder[{key!r}] must list levels of {sorted(set(TUNE_LEVELS) - {'float'})}, "
                             f"got {levels}")
    needed = {"float", "float x float", *p.tune_ladder["other"]}
    needed |= {f"{a} x {w}" for a, w in (TUNE_LEVELS[lv] for lv in p.tune_ladder["gemm"])}
    missing = sorted(needed - set(p.tune_costs))
    if missing:
        raise ValueError(f"{p.name}: tune_costs has no cost for {missing}")


PARAM_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(MarchProfile)
                                      if f.name != "provenance")


def _check_composites(profile: MarchProfile) -> None:
    unknown = [c for c in profile.composites if c not in COMPOSITE_KINDS]
    if unknown:
        raise ValueError(f"{profile.name}: composites {unknown} are not known; expected some of {COMPOSITE_KINDS}")


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
#: The integer activation dtypes of the march tables.
I8_I16 = ("int8", "int16")


@dataclass(frozen=True)
class _S:
    value: Any
    prov: Provenance


def S(value: Any, status: Status, note: str = "", items: Mapping | None = None) -> _S:  # noqa: N802
    """A parameter value with its provenance, for the march tables."""
    return _S(value, Provenance(status, note, FrozenMap(items or {})))


def make_profile(**params: _S) -> MarchProfile:
    """A profile from one ``S(...)`` per parameter (values and their provenance)."""
    return MarchProfile(**{k: v.value for k, v in params.items()},
                        provenance=FrozenMap({k: v.prov for k, v in params.items()}))


def derive_profile(base: MarchProfile, **params: _S) -> MarchProfile:
    """``<<: base`` then the given fields (values and provenance) - dataclasses.replace."""
    prov = dict(base.provenance)
    prov.update({k: v.prov for k, v in params.items()})
    return dataclasses.replace(base, **{k: v.value for k, v in params.items()},
                               provenance=FrozenMap(prov))

