"""The IR as JSON: a documented, versioned schema for tools that read dumps.

Schema ``qir.ir`` version 1 (``to_json(ir)`` returns it as a dict; ``qir dump --format json``
writes it)::

    {
      "schema": "qir.ir", "version": 1,
      "name": str, "opset_imports": {domain: int},     # "" is the default ONNX domain
      "inputs": [value name], "outputs": [value name],
      "values": [                                      # sorted by name
        {"name", "kind": "activation"|"weight", "dtype": str|null,
         "shape": [int|str|null]|null,                 # str = symbolic dim, null = unknown
         "stats": {"numel", "min", "max", "mean", "abs_max"},   # weights only
         "data": [...]}                                # weights with <= 8 elements only
      ],
      "nodes": [                                       # deterministic topological order
        {"index": int, "name": str, "kind": "general", "op_type": str, "domain": str,
         "inputs": [value name | ""], "outputs": [value name],
         "attrs": {name: JSON value},                  # tensors: {"dtype","shape","data"?}
         "module": str|null},
        {"index": int, "name": str, "kind": "calibration", "role": "weight"|"activation",
         "mode": "int8"|"int16"|"fp16"|"float", "inputs": [str], "outputs": [str],
         "threshold": float|[float]|null, "scale": float|[float]|null,
         "zero_point": float|[float]|null, "implied_clip": [lo, hi]|null, "axis": int|null,
         "fixed": bool, "feeds": [op name]}
      ]
    }

Non-finite numbers are written as the strings ``"inf"``, ``"-inf"`` and ``"nan"`` (strict JSON
has no such numbers). Adding keys keeps the version; removing or changing the meaning of one
bumps it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence, Union

import numpy as np

from qir.files import write_text
from qir.printer import MAX_INLINE
from qir.records import CalibRecord

__all__ = ["SCHEMA", "SCHEMA_VERSION", "to_json", "jsonable", "finite", "json_text", "write_json", "JsonValue",
           "JsonReport"]

SCHEMA = "qir.ir"
SCHEMA_VERSION = 1

# A JSON document's values (numbers, strings, lists, objects keyed by names from the data).
JsonValue = Union[None, bool, int, float, str, Sequence["JsonValue"], Mapping[str, "JsonValue"]]


class JsonReport(Protocol):
    """A typed report written as JSON: its dataclass says what it holds, ``to_json()`` the
    document (without ``schema``/``version``, which the writer adds)."""

    def to_json(self) -> dict[str, Any]: ...


def finite(v: Any) -> Any:
    """Non-finite floats as the strings "inf", "-inf", "nan" (strict JSON has no such numbers),
    inside lists, tuples and dicts too; a typed record in them (a :class:`JsonReport`) as its
    ``to_json()`` document."""
    if hasattr(v, "to_json") and not isinstance(v, (dict, list, tuple, str)):
        return finite(v.to_json())
    if isinstance(v, float) and not np.isfinite(v):
        return "nan" if np.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, (list, tuple)):
        return [finite(x) for x in v]
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    return v


def json_text(schema: str, doc: JsonReport | Mapping[str, JsonValue], version: int = 1) -> str:
    """``{"schema", "version", **doc}`` as strict JSON text (non-finite numbers as strings): the
    file format of every analysis report. ``doc``: a :class:`JsonReport` (its ``to_json()``) or
    the document itself."""
    return json.dumps({"schema": schema, "version": version, **finite(doc)}, indent=1, allow_nan=False) + "\n"


def write_json(path: str | Path, schema: str, doc: JsonReport | Mapping[str, JsonValue], version: int = 1) -> Path:
    """:func:`json_text` written to ``path`` atomically (:func:`qir.files.write_text`)."""
    return write_text(path, json_text(schema, doc, version))


def jsonable(value: Any) -> Any:
    """Attribute/state values as plain JSON types (tensors summarized when large)."""
    if isinstance(value, np.ndarray):
        out: dict[str, Any] = {"dtype": value.dtype.name, "shape": list(value.shape)}
        if value.size <= MAX_INLINE:
            out["data"] = finite(value.reshape(-1).tolist())
        return out
    if isinstance(value, np.generic):
        return finite(value.item())
    if isinstance(value, float):
        return finite(value)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def _vector(v: Any) -> Any:
    if v is None:
        return None
    arr = np.asarray(v, dtype=np.float64)
    return finite(float(arr)) if arr.ndim == 0 else finite(arr.reshape(-1).tolist())


def to_json(ir: Any) -> dict[str, Any]:
    """The schema-1 dict of ``ir``."""
    values = []
    for rec in sorted(ir.values(), key=lambda r: r.name):
        item: dict[str, Any] = {"name": rec.name, "kind": rec.kind.value, "dtype": rec.dtype,
                                "shape": None if rec.shape is None else list(rec.shape)}
        if rec.data is not None:
            data = rec.data
            numeric = data.size and data.dtype.kind in "biuf"
            f = data.astype(np.float64) if numeric else None
            item["stats"] = {"numel": int(data.size),
                             "min": finite(float(f.min())) if numeric else None,
                             "max": finite(float(f.max())) if numeric else None,
                             "mean": finite(float(f.mean())) if numeric else None,
                             "abs_max": finite(float(np.abs(f).max())) if numeric else None}
            if data.size <= MAX_INLINE:
                item["data"] = finite(data.reshape(-1).tolist())
        values.append(item)
    nodes = []
    for i, rec in enumerate(ir.runnables()):
        if isinstance(rec, CalibRecord):
            nodes.append({"index": i, "name": rec.name, "kind": "calibration",
                          "role": rec.role.value, "mode": rec.mode.value,
                          "inputs": [rec.input], "outputs": [rec.output],
                          "threshold": _vector(rec.threshold), "scale": _vector(rec.scale),
                          "zero_point": _vector(rec.zero_point),
                          "implied_clip": _vector(rec.implied_clip),
                          "axis": rec.axis, "fixed": rec.fixed, "feeds": list(rec.feeds)})
        else:
            nodes.append({"index": i, "name": rec.name, "kind": "general", "op_type": rec.op_type,
                          "domain": rec.domain, "inputs": list(rec.inputs),
                          "outputs": list(rec.outputs),
                          "attrs": {k: jsonable(rec.attrs[k]) for k in sorted(rec.attrs)},
                          "module": rec.module})
    return {"schema": SCHEMA, "version": SCHEMA_VERSION, "name": ir.name,
            "opset_imports": dict(sorted(ir.opset_imports.items())),
            "inputs": list(ir.inputs), "outputs": list(ir.outputs),
            "values": values, "nodes": nodes}
