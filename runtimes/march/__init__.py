"""NPU march profiles as data: what a Horizon-style BPU accepts, and how it rounds.

A march profile is a frozen :class:`MarchProfile` of plain values, every one with its provenance
(``documented`` / ``source`` / ``assumed`` / ``override``). Passes and kernels ask the profile
(``profile.allows_gemm("int16", "int8")``, ``profile.allowed_act_dtypes("Sigmoid")``) instead of
branching on the march name; look a profile up with :func:`get_profile` (name or alias,
case-insensitive). Import everything from this package; its modules each do one job:

* :mod:`~qir.runtimes.march.op_classes`: op type -> :class:`OpClass` (the unit it runs on);
* :mod:`~qir.runtimes.march.profile`: the :class:`MarchProfile` type, provenance, LUT types,
  dtype spellings and the allowed modes;
* :mod:`~qir.runtimes.march.nash_e`, :mod:`~qir.runtimes.march.nash_m`,
  :mod:`~qir.runtimes.march.nash_p`, :mod:`~qir.runtimes.march.generic`: the march tables;
* :mod:`~qir.runtimes.march.registry`: the built-in profiles by name, :func:`get_profile`;
* :mod:`~qir.runtimes.march.text`: the ``qir profiles`` text (:func:`format_profiles`) and
  :func:`profile_to_dict`.
"""
from __future__ import annotations

from qir.runtimes.march.generic import GENERIC
from qir.runtimes.march.nash_e import NASH_E
from qir.runtimes.march.nash_m import NASH_M
from qir.runtimes.march.nash_p import NASH_P
from qir.runtimes.march.op_classes import (
    OP_CLASS_TABLE,
    UNKNOWN_OP_CLASS,
    OpClass,
    OpClassification,
    classify,
    is_known_op,
    op_class,
    ops_in_class,
)
from qir.runtimes.march.profile import (
    ACC_OVERFLOW,
    DTYPES,
    FP16_LEVELS,
    LUT_MODES,
    PARAM_FIELDS,
    QRANGES,
    REQUANT_MODES,
    ROUND_MODES,
    SCALE_DIVISORS,
    SHIFT_ROUND_MODES,
    FrozenMap,
    ItemProvenance,
    LutInt8,
    LutInt16,
    MarchProfile,
    Provenance,
    Status,
    normalize_dtype,
    rounding_function,
)
from qir.runtimes.march.registry import PROFILES, UnknownProfileError, get_profile, profile_names
from qir.runtimes.march.text import LEGEND, format_profiles, profile_to_dict

__all__ = [
    "OpClass", "OP_CLASS_TABLE", "UNKNOWN_OP_CLASS", "OpClassification", "classify", "op_class",
    "is_known_op", "ops_in_class",
    "Status", "Provenance", "ItemProvenance", "FrozenMap", "LutInt8", "LutInt16",
    "MarchProfile", "PARAM_FIELDS", "PROFILES", "UnknownProfileError",
    "get_profile", "profile_names", "format_profiles", "profile_to_dict", "LEGEND",
    "normalize_dtype", "rounding_function",
    "ROUND_MODES", "SHIFT_ROUND_MODES", "SCALE_DIVISORS", "REQUANT_MODES", "ACC_OVERFLOW",
    "FP16_LEVELS", "LUT_MODES", "DTYPES", "QRANGES",
    "NASH_E", "NASH_M", "NASH_P", "GENERIC",
]
