"""The emit metadata: calibration state that qir's emit pass stores in a QDQ model, read back
(:mod:`qir.io.qdq_import`).

**Emitted models.** A model written by qir's emit pass carries its calibration state as JSON
in the metadata ``qir.calibrations``; it restores names, thresholds, ``fixed``, ``feeds``,
implied clips and the fp16/float nodes (which the emitted model holds as Cast pairs / nothing),
each entry only when the model still matches it.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Mapping

import numpy as np
import onnx

from qir.io.qdq_graph import QdqGraph
from qir.json_dump import JsonValue
from qir.kinds import CalibMode, CalibRole, read_kind
from qir.records import CalibRecord, QuantizerState

__all__ = ["EMIT_METADATA_KEY", "EmitRestore", "entry_state", "consistent"]

logger = logging.getLogger(__name__)

EMIT_METADATA_KEY = "qir.calibrations"


def entry_state(entry: Mapping[str, JsonValue], where: str = f"an entry of the {EMIT_METADATA_KEY} metadata") -> QuantizerState:
    """The quantizer of one emit-metadata entry (:mod:`qir.io.qdq_export` writes them); a mode
    qir does not know is an ImportError_ naming ``where``."""
    axis = entry.get("axis")

    def values(key: str, dtype: type) -> Any:
        v = entry.get(key)
        if v is None:
            return None
        a = np.asarray(v, dtype=dtype)
        if axis is not None:
            return a
        return int(a.reshape(-1)[0]) if dtype is np.int64 else dtype(a.reshape(-1)[0])

    clip = entry.get("implied_clip")
    if clip is not None:  # JSON has no infinities: null marks an open end
        clip = (-np.inf if clip[0] is None else float(clip[0]), np.inf if clip[1] is None else float(clip[1]))
    return QuantizerState(mode=read_kind(CalibMode, entry["mode"], where), threshold=values("threshold", np.float32),
                          scale=values("scale", np.float32), zero_point=values("zero_point", np.int64),
                          axis=axis, fixed=bool(entry.get("fixed", False)), feeds=tuple(entry.get("feeds", ())),
                          implied_clip=clip, unsigned=bool(entry.get("unsigned")))


def consistent(state: QuantizerState, found: QuantizerState) -> bool:
    """Does the quantizer found in the file compute what the metadata entry says?"""
    from qir.calibration import calib_scale

    if state.mode is not found.mode:
        return False
    if None not in (state.axis, found.axis) and state.axis != found.axis:
        return False
    probe = CalibRecord("probe", "x", "y", mode=state.mode, threshold=state.threshold, scale=state.scale, axis=state.axis)
    try:
        scale = calib_scale(probe)
    except Exception:
        return False
    pairs = [(scale, found.scale), (state.zero_point, found.zero_point)]
    try:
        for a, b in pairs:
            a = np.zeros((), np.int64) if a is None else np.asarray(a)
            b = np.zeros((), np.int64) if b is None else np.asarray(b)
            a, b = np.broadcast_arrays(a, b)
            if not np.array_equal(a, b):
                return False
    except ValueError:  # shapes that do not broadcast
        return False
    return True


class EmitRestore:
    """The metadata half of the QDQ rewrite (:class:`qir.io.qdq_rewrite.QdqRewrite` derives from
    it): reads the entries, lays them over the int quantizers found in the file, and restores the
    fp16/float nodes the emitted model holds as Cast pairs / nothing."""

    proto: onnx.ModelProto
    where: str
    g: QdqGraph
    entries: dict[str, dict[str, Any]]
    replace: dict[int, list[onnx.NodeProto]]
    explicit_feeds: set[str]
    report: dict[str, int]

    def _add_calibration(self, node: onnx.NodeProto, name: str, x: str, y: str, role: CalibRole,
                         state: QuantizerState, *, before: bool = False) -> None:
        raise NotImplementedError  # the rewrite writes the node

    def _read_metadata(self) -> None:
        props = self.proto.metadata_props
        keep = [p for p in props if p.key != EMIT_METADATA_KEY]
        for p in props:
            if p.key == EMIT_METADATA_KEY:
                try:
                    data = json.loads(p.value)
                    self.entries = {e["name"]: e for e in data["calibrations"]}
                except Exception as exc:  # a broken note is no reason to refuse the model
                    logger.warning("%s: ignoring unreadable %s metadata (%s)", self.where, EMIT_METADATA_KEY, exc)
        if len(keep) != len(props):
            del props[:]
            props.extend(keep)

    def _overlay(self, name: str, found: QuantizerState, role: CalibRole) -> tuple[str | None, QuantizerState]:
        """Metadata entry ``name`` (an emitted int node) over the state found in the file."""
        entry = self.entries.get(name)
        if entry is None:
            return None, found
        where = f"{self.where}: the {EMIT_METADATA_KEY} metadata of calibration node {name!r}"
        state = entry_state(entry, where)
        if read_kind(CalibRole, entry.get("role", role.value), where) is not role or not consistent(state, found):
            logger.warning("%s: calibration %r no longer matches the emit metadata; using the file's "
                           "quantizer as stored", self.where, name)
            return None, found
        self.report["restored"] += 1
        self.g.node_names.add(name)
        if state.feeds:
            self.explicit_feeds.add(name)
        return name, state

    # ---- emitted fp16 / float nodes
    def _restore_emitted(self, nodes: list[onnx.NodeProto]) -> None:
        by_name = {n.name: n for n in nodes if n.name}
        for name, entry in self.entries.items():
            mode = entry.get("mode")
            if mode not in (CalibMode.FP16.value, CalibMode.FLOAT.value):
                continue
            try:
                ok = self._restore_one(name, entry, by_name, nodes)
            except (KeyError, ValueError, TypeError):
                ok = False
            if not ok:
                logger.warning("%s: calibration %r (%s) of the emit metadata is not in the model as "
                               "written by qir emit; skipped", self.where, name, mode)

    def _restore_one(self, name: str, entry: dict[str, Any], by_name: dict[str, onnx.NodeProto],
                     nodes: list[onnx.NodeProto]) -> bool:
        x, y = entry["input"], entry["output"]
        role = CalibRole(entry.get("role", "activation"))
        state = entry_state(entry)
        chain: list[onnx.NodeProto] = []
        last = by_name.get(name)
        if last is not None:  # Cast pair (fp16), Relu/Clip (implied clip) or Identity (graph output)
            if list(last.output) != [y] or last.op_type not in ("Cast", "Relu", "Clip", "Identity"):
                return False
            cur = last
            chain.append(cur)
            for prefix in ("/to_fp16", "/clip"):
                prev = by_name.get(name + prefix)
                if prev is not None and cur.input[0] == prev.output[0]:
                    chain.append(prev)
                    cur = prev
            if cur.input[0] != x or any(id(n) in self.replace for n in chain):
                return False
            if any(len(self.g.readers.get(n.output[0], [])) != 1 for n in chain[1:]):
                return False
            first = chain[-1]
            for n in chain[:-1]:
                self.replace[id(n)] = []
            self._add_calibration(first, name, x, y, role, state)
        else:  # a float node emitted as nothing: its readers read x; point them back at y
            if state.mode is not CalibMode.FLOAT or y in self.g.names:
                return False
            targets = []
            for reader, slot in entry.get("uses", []):
                node = by_name.get(reader)
                if node is None or slot >= len(node.input) or node.input[slot] != x:
                    return False
                targets.append((node, slot))
            if not targets:
                return False
            for node, slot in targets:
                node.input[slot] = y
            self.g.names.add(y)
            position = {id(n): i for i, n in enumerate(nodes)}
            first_reader = min((t[0] for t in targets), key=lambda n: position[id(n)])
            self._add_calibration(first_reader, name, x, y, role, state, before=True)
        self.g.node_names.add(name)
        if state.feeds:
            self.explicit_feeds.add(name)
        self.report["restored"] += 1
        self.report[role.value] += 1
        return True
