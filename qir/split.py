"""A precision per consumer: one calibration node split into one per group of its readers.

A value has one calibration node, so every op that reads it reads it at one precision. Where
readers have different constraints (an int8-only pooling input and a Mul that needs int16), the
node can be split: each group of readers gets a node of its own on the same input value, with
the same state (mode, threshold, scale, axis, ...) to begin with, so a split model computes what
the unsplit one computes until a copy's mode changes. On an NPU the copies are one quantized
value and a requantize to the other precision (the latency model prices it:
:mod:`qir.passes.lib.latency_groups`). The copies are ordinary calibration nodes: the printer,
emit (a Q/DQ pair per copy), ``qir.load`` and every runtime need nothing else.

:func:`merge_calibrations` undoes a split where the copies ended in the same state.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from qir.errors import InputError
from qir.graph import QIR
from qir.records import CalibRecord

__all__ = ["split_calibration", "merge_calibrations", "siblings"]


def split_calibration(ir: QIR, name: str, groups: Sequence[Sequence[str]]) -> list[CalibRecord]:
    """Split calibration node ``name`` of ``ir`` (changed in place) by its readers: the first of
    ``groups`` (op names that read the node's output) keeps the node, each other group gets a copy
    named ``<name>@<k>`` reading the same input. Every reader must be in exactly one group.
    Returns the nodes in group order."""
    cal = ir.calibration(name)
    uses = ir.uses(cal.output)
    readers = {rec.name for rec, _ in uses}
    listed = [op for group in groups for op in group]
    if sorted(listed) != sorted(readers) or len(set(listed)) != len(listed) or any(not g for g in groups):
        raise InputError(f"split of {name!r}: the groups must hold each of its readers ({', '.join(sorted(readers))}) "
                         f"once, got {[list(g) for g in groups]}")
    if cal.output in ir.outputs and len(groups) > 1:
        raise InputError(f"split of {name!r}: its output {cal.output!r} is a graph output; it cannot be split")
    out = [cal]
    for k, group in enumerate(groups[1:], 1):
        copy_name = f"{name}@{k}"
        members = set(group)
        moved = [(rec.name, slot) for rec, slot in uses if rec.name in members]
        for node, slot in moved:
            ir.set_input(node, slot, cal.input)
        state = {f: _copied(getattr(cal, f)) for f in ("threshold", "scale", "zero_point", "axis", "fixed",
                                                       "implied_clip")}
        rec = ir.insert_calibration(cal.input, copy_name, role=cal.role, mode=cal.mode, output=f"{cal.output}@{k}",
                                    uses=moved, feeds=tuple(dict.fromkeys(group)), **state)
        rec.meta.update({k2: v for k2, v in cal.meta.items() if k2 in ("calibration", "histogram")})
        out.append(rec)
    cal.feeds = tuple(dict.fromkeys(groups[0]))
    ir.touch()
    return out


def siblings(ir: QIR) -> dict[str, list[str]]:
    """Split nodes: the first calibration node on a value (in graph order) -> the names of the
    other activation calibration nodes on the same value (a split's copies; found from the
    graph alone, so a split model loaded back from a file is seen as split too)."""
    by_value: dict[str, list[str]] = {}
    for c in ir.calibrations():
        by_value.setdefault(c.input, []).append(c.name)
    return {names[0]: names[1:] for names in by_value.values() if len(names) > 1}


def merge_calibrations(ir: QIR) -> list[str]:
    """Merge each split copy back into its node where both hold the same state (mode,
    threshold, scale, zero point, axis): its readers read the node again. Returns the merged
    copies' names."""
    merged = []
    for parent, copies in siblings(ir).items():
        base = ir.calibration(parent)
        for name in copies:
            copy = ir.calibration(name)
            if not _same_state(base, copy):
                continue
            readers = [(rec.name, slot) for rec, slot in ir.uses(copy.output)]
            for node, slot in readers:
                ir.set_input(node, slot, base.output)
            ir.remove_node(name)
            base.feeds = tuple(dict.fromkeys((*base.feeds, *copy.feeds)))
            merged.append(name)
    if merged:
        ir.touch()
    return merged


def _same_state(a: CalibRecord, b: CalibRecord) -> bool:
    if a.mode is not b.mode or a.axis != b.axis:
        return False
    return all(_equal(getattr(a, f), getattr(b, f)) for f in ("threshold", "scale", "zero_point"))


def _equal(x, y) -> bool:
    if x is None or y is None:
        return x is None and y is None
    return bool(np.array_equal(np.asarray(x), np.asarray(y)))


def _copied(value):
    return value.copy() if isinstance(value, np.ndarray) else value
