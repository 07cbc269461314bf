"""Enumerations of the IR: node kinds, calibration modes and roles, and dtype spellings."""
from __future__ import annotations

import enum
from typing import Any, TypeVar

import numpy as np

from qir.errors import ImportError_

__all__ = ["NodeKind", "CalibMode", "CalibRole", "DTYPE_SHORT", "short_dtype", "read_kind"]


class NodeKind(str, enum.Enum):
    """The four kinds of graph node (docs/architecture.md, "The IR").

    ``GENERAL`` and ``CALIBRATION`` nodes run; ``WEIGHT`` and ``ACTIVATION`` nodes hold values.
    Every edge joins a value node and a running node.
    """

    GENERAL = "general"
    CALIBRATION = "calibration"
    WEIGHT = "weight"
    ACTIVATION = "activation"


class CalibMode(str, enum.Enum):
    """What a calibration node does to the value passing through it."""

    INT8 = "int8"
    INT16 = "int16"
    FP16 = "fp16"
    FLOAT = "float"  # pass-through: "not quantized"


class CalibRole(str, enum.Enum):
    """Whether a calibration node quantizes a constant weight or a runtime activation."""

    WEIGHT = "weight"
    ACTIVATION = "activation"


_Kind = TypeVar("_Kind", NodeKind, CalibMode, CalibRole)
_WHAT = {CalibMode: "mode", CalibRole: "role", NodeKind: "kind"}


def read_kind(kind: type[_Kind], value: Any, where: str) -> _Kind:
    """``value`` read from a file as a member of ``kind`` (``CalibMode``, ``CalibRole``,
    ``NodeKind``). Any other value (a hand-edited ``int9``) is one :class:`~qir.errors.ImportError_`
    that names ``where`` (the file and the node), the value and the values accepted."""
    try:
        return kind(value)
    except ValueError:
        accepted = ", ".join(m.value for m in kind)
        raise ImportError_(f"{where}: {_WHAT[kind]} {value!r} is not one of {accepted}; fix the file, or make it "
                           "again with qir (calibrate, set-mode)") from None


# numpy dtype name -> the short spelling used in dumps (f32[1,3,8,8]).
DTYPE_SHORT = {
    "float32": "f32", "float16": "f16", "float64": "f64", "bfloat16": "bf16",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
    "bool": "bool", "str": "str", "object": "str",
}


def short_dtype(dtype: str | np.dtype | None) -> str:
    """Short dump spelling of a dtype (``"?"`` when unknown)."""
    if dtype is None:
        return "?"
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    return DTYPE_SHORT.get(name, name)
