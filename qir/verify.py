"""``verify(ir)``: check the IR's invariants and return every problem found (empty = valid).

Invariants:

1. The graph is bipartite: every edge joins a value node and a running node.
2. Each op's ``inputs``/``outputs`` tuples match its edges slot for slot (``""`` = no edge).
3. A calibration node has exactly one input and one output value, and a known mode/role.
4. Every value has at most one producer; graph inputs and weights have none; every other
   activation has one. Weights hold an array whose dtype/shape match the record.
5. Graph inputs and outputs exist; the graph is acyclic; running-node names are unique
   (guaranteed by the graph) and value keys are ``"%" + record name``.
"""
from __future__ import annotations

from typing import Any

import networkx as nx

from qir.kinds import CalibMode, CalibRole, NodeKind
from qir.records import CalibRecord, OpRecord, ValueRecord

__all__ = ["verify"]


def verify(ir: Any) -> list[str]:
    """All invariant violations of ``ir`` as readable strings."""
    g = ir.graph
    problems: list[str] = []
    for key, data in g.nodes(data=True):
        rec = data.get("rec")
        if rec is None or "ord" not in data:
            problems.append(f"graph node {key!r} has no record or ordinal")
            continue
        if isinstance(rec, ValueRecord):
            problems += _check_value(ir, key, rec)
        elif isinstance(rec, (OpRecord, CalibRecord)):
            problems += _check_runnable(ir, key, rec)
        else:
            problems.append(f"graph node {key!r} has an unknown record type {type(rec).__name__}")
    for u, v in g.edges():
        if isinstance(g.nodes[u].get("rec"), ValueRecord) == isinstance(g.nodes[v].get("rec"), ValueRecord):
            problems.append(f"edge {u!r} -> {v!r} joins two nodes of the same side")
    for name in ir.inputs:
        if "%" + name not in g:
            problems.append(f"graph input {name!r} does not exist")
    for name in ir.outputs:
        if "%" + name not in g:
            problems.append(f"graph output {name!r} does not exist")
    if not nx.is_directed_acyclic_graph(g):
        cycle = nx.find_cycle(g)
        problems.append(f"the graph has a cycle through {cycle[0][0]!r}")
    return problems


def _check_value(ir: Any, key: str, rec: ValueRecord) -> list[str]:
    out: list[str] = []
    g = ir.graph
    if key != "%" + rec.name:
        out.append(f"value {rec.name!r} is stored under key {key!r}")
    producers = g.in_degree(key)
    if rec.kind is NodeKind.WEIGHT:
        if producers:
            out.append(f"weight {rec.name!r} has a producer")
        if rec.data is None:
            out.append(f"weight {rec.name!r} has no array")
        elif tuple(rec.data.shape) != tuple(rec.shape or ()) or rec.data.dtype.name != rec.dtype:
            out.append(f"weight {rec.name!r}: record says {rec.dtype}{list(rec.shape or [])}, "
                       f"array is {rec.data.dtype.name}{list(rec.data.shape)}")
        elif rec.data.flags.writeable:
            out.append(f"weight {rec.name!r} array is writeable (clones would share mutations)")
    elif rec.kind is NodeKind.ACTIVATION:
        if rec.name in ir.inputs:
            if producers:
                out.append(f"graph input {rec.name!r} has a producer")
        elif producers != 1:
            out.append(f"activation {rec.name!r} has {producers} producers (expected 1)")
    else:
        out.append(f"value {rec.name!r} has kind {rec.kind}")
    return out


def _check_runnable(ir: Any, key: str, rec: OpRecord | CalibRecord) -> list[str]:
    out: list[str] = []
    g = ir.graph
    if key != rec.name:
        out.append(f"node {rec.name!r} is stored under key {key!r}")
    in_edges = {slot: src for src, _, slot in g.in_edges(key, keys=True)}
    want_in = {slot: "%" + v for slot, v in enumerate(rec.inputs) if v}
    if in_edges != want_in:
        out.append(f"node {rec.name!r}: input edges {_names(in_edges)} do not match record "
                   f"inputs {_names(want_in)}")
    out_edges = {slot: dst for _, dst, slot in g.out_edges(key, keys=True)}
    want_out = {slot: "%" + v for slot, v in enumerate(rec.outputs) if v}
    if out_edges != want_out:
        out.append(f"node {rec.name!r}: output edges {_names(out_edges)} do not match record "
                   f"outputs {_names(want_out)}")
    if isinstance(rec, CalibRecord):
        if not isinstance(rec.mode, CalibMode) or not isinstance(rec.role, CalibRole):
            out.append(f"calibration node {rec.name!r} has mode {rec.mode!r} / role {rec.role!r}")
        if not rec.input or not rec.output:
            out.append(f"calibration node {rec.name!r} needs one input and one output")
    elif not rec.op_type:
        out.append(f"op {rec.name!r} has no op_type")
    return out


def _names(slots: dict[int, str]) -> dict[int, str]:
    return {k: v[1:] for k, v in sorted(slots.items())}
