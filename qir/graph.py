"""``QIR``: the quantized IR, a bipartite ``networkx.MultiDiGraph`` behind sanctioned mutators.

Graph layout (docs/architecture.md, "The IR"):

* running nodes (GENERAL ops and CALIBRATION nodes) are keyed by their name;
* value nodes (ACTIVATION and WEIGHT) are keyed by ``"%" + name`` so an op and a value may
  share a name, as they often do in exported models;
* an edge value → op has ``key = slot = input index``; an edge op → value has
  ``key = slot = output index``. ``Mul(x, x)`` is two edges with keys 0 and 1.

Every node carries its record (``"rec"``) and an ordinal (``"ord"``, a tuple) that makes the
topological order deterministic: the order of the source model, with inserted nodes placed
next to what they were inserted beside. Passes change the graph only through the methods here;
they keep records and edges in sync and bump ``version`` (used to cache derived data).
"""
from __future__ import annotations

import heapq
import logging
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import networkx as nx
import numpy as np

from qir.calibration import set_mode as set_calibration_mode
from qir.errors import NotFoundError, QirError, did_you_mean
from qir.kinds import CalibMode, CalibRole, NodeKind
from qir.records import AttrValue, CalibRecord, OpRecord, Record, Shape, ValueRecord, copy_record

__all__ = ["QIR", "value_key"]

logger = logging.getLogger(__name__)


_KEEP = object()  # set_calibration: leave this field as it is
_MAX_CACHED = 16  # plans/sessions kept per IR version (one per capture set)


def value_key(name: str) -> str:
    """Graph key of the value called ``name``."""
    return "%" + name


def _topological_keys(graph: nx.MultiDiGraph) -> list[str]:
    """Graph keys in topological order, ties broken by the smallest ``ord`` first: the order
    ``nx.lexicographical_topological_sort(graph, key=ord)`` gives, computed on the adjacency
    dicts directly (3x faster; it runs once per IR version and analyses wait on it)."""
    ranks = {k: (d["ord"], i) for i, (k, d) in enumerate(graph.nodes(data=True))}  # ties: insertion order
    succ, pred = graph._succ, graph._pred
    indegree = {k: len(pred[k]) for k in ranks}  # distinct predecessors (parallel edges once)
    heap = [(ranks[k], k) for k, n in indegree.items() if n == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, k = heapq.heappop(heap)
        out.append(k)
        for child in succ[k]:
            indegree[child] -= 1
            if not indegree[child]:
                heapq.heappush(heap, (ranks[child], child))
    if len(out) != len(ranks):
        raise QirError("the graph has a cycle")
    return out


def _frozen(array: np.ndarray) -> np.ndarray:
    """A read-only array with the same contents; copies only when the input is writeable."""
    arr = np.asarray(array)
    if arr.flags.writeable:
        arr = np.array(arr, copy=True)
        arr.setflags(write=False)
    return arr


class QIR:
    """A model: ops, calibration nodes, weights and activations in one graph.

    Attributes:
        name: model name (from the source model's graph name).
        opset_imports: domain → opset version; ``""`` is the default ONNX domain.
        inputs / outputs: ordered value names of the graph inputs and outputs.
        meta: scratch data for analyses (not serialized).
        metadata_props: string key/values that are serialized with the model.
    """

    def __init__(self, name: str = "main", opset: int = 17,
                 opset_imports: Mapping[str, int] | None = None) -> None:
        self.graph = nx.MultiDiGraph()
        self.name = name
        self.opset_imports: dict[str, int] = dict(opset_imports or {"": opset})
        self.opset_imports.setdefault("", opset)
        self._inputs: tuple[str, ...] = ()
        self._outputs: tuple[str, ...] = ()
        self.meta: dict[str, Any] = {}
        self.metadata_props: dict[str, str] = {}
        self._ord_counter = 0
        self._version = 0
        self._cache: dict[str, Any] = {}

    # ------------------------------------------------------------------ basic properties
    @property
    def inputs(self) -> tuple[str, ...]:
        """Graph input names, in order (change with add_input/remove_value)."""
        return self._inputs

    @property
    def outputs(self) -> tuple[str, ...]:
        """Graph output names, in order (change with set_outputs)."""
        return self._outputs

    @property
    def opset(self) -> int:
        """The default-domain opset version."""
        return self.opset_imports[""]

    @property
    def version(self) -> int:
        """Incremented by every structural or state change made through the mutators."""
        return self._version

    def touch(self) -> None:
        """Record a change made to a record in place (e.g. a calibration node's mode)."""
        self._version += 1
        self._cache.clear()

    def cached(self, key: Any, build: Callable[[], Any]) -> Any:
        """A value derived from the IR, built once per ``version`` (runtimes keep plans here)."""
        if key not in self._cache:
            if len(self._cache) >= _MAX_CACHED:  # forget the oldest derived entry
                oldest = next(k for k in self._cache if k not in ("topo",))
                del self._cache[oldest]
            self._cache[key] = build()
        return self._cache[key]

    def __str__(self) -> str:
        from qir.printer import format_ir
        return format_ir(self)

    def __repr__(self) -> str:
        from qir.printer import summary
        return summary(self)

    # ------------------------------------------------------------------ lookups
    def has_node(self, name: str) -> bool:
        """True if a running node (op or calibration) is called ``name``."""
        return name in self.graph and self.graph.nodes[name]["rec"].kind in (
            NodeKind.GENERAL, NodeKind.CALIBRATION)

    def has_value(self, name: str) -> bool:
        return value_key(name) in self.graph

    def node(self, name: str) -> OpRecord | CalibRecord:
        """The op or calibration node called ``name``, or one whose module path is ``name``.

        Raises:
            NotFoundError: with the closest names as suggestions.
        """
        if self.has_node(name):
            return self.graph.nodes[name]["rec"]
        by_module = [r for r in self.ops() if r.module == name]
        if len(by_module) == 1:
            return by_module[0]
        names = [r.name for r in self.runnables()]
        names += [r.module for r in self.ops() if r.module]
        raise NotFoundError(did_you_mean(name, names, "node"))

    def op(self, name: str) -> OpRecord:
        rec = self.node(name)
        if not isinstance(rec, OpRecord):
            raise NotFoundError(f"{name!r} is a calibration node, not an op")
        return rec

    def calibration(self, name: str) -> CalibRecord:
        rec = self.node(name)
        if not isinstance(rec, CalibRecord):
            raise NotFoundError(f"{name!r} is an op, not a calibration node")
        return rec

    def value(self, name: str) -> ValueRecord:
        """The activation or weight called ``name``."""
        key = value_key(name)
        if key in self.graph:
            return self.graph.nodes[key]["rec"]
        raise NotFoundError(did_you_mean(name, [v.name for v in self.values()], "value"))

    def values(self, kind: NodeKind | None = None) -> list[ValueRecord]:
        """Value records (optionally of one kind) in insertion order."""
        recs = [d["rec"] for _, d in self.graph.nodes(data=True)
                if isinstance(d["rec"], ValueRecord) and (kind is None or d["rec"].kind is kind)]
        return recs

    def weights(self) -> list[ValueRecord]:
        return self.values(NodeKind.WEIGHT)

    def activations(self) -> list[ValueRecord]:
        return self.values(NodeKind.ACTIVATION)

    def runnables(self) -> list[OpRecord | CalibRecord]:
        """Ops and calibration nodes in deterministic topological order (cached)."""
        order = self._cache.get("topo")
        if order is None:
            nodes = self.graph.nodes
            order = [nodes[k]["rec"] for k in _topological_keys(self.graph)
                     if not isinstance(nodes[k]["rec"], ValueRecord)]
            self._cache["topo"] = order
        return list(order)

    def ops(self, op_type: str | None = None) -> list[OpRecord]:
        """General nodes in topological order, optionally only of ``op_type``."""
        return [r for r in self.runnables() if isinstance(r, OpRecord)
                and (op_type is None or r.op_type == op_type)]

    def calibrations(self, role: CalibRole | str | None = None) -> list[CalibRecord]:
        """Calibration nodes in topological order, optionally only of one role."""
        role = CalibRole(role) if role is not None else None
        return [r for r in self.runnables() if isinstance(r, CalibRecord)
                and (role is None or r.role is role)]

    def producer(self, value: str) -> OpRecord | CalibRecord | None:
        """The node that produces ``value`` (None for graph inputs and weights)."""
        preds = list(self.graph.predecessors(self._vkey(value)))
        return self.graph.nodes[preds[0]]["rec"] if preds else None

    def uses(self, value: str) -> list[tuple[OpRecord | CalibRecord, int]]:
        """``(node, input slot)`` pairs reading ``value``, in deterministic (source) order."""
        key = self._vkey(value)
        nodes = self.graph.nodes
        edges = sorted(self.graph.out_edges(key, keys=True), key=lambda e: (nodes[e[1]]["ord"], e[2]))
        return [(nodes[dst]["rec"], slot) for _, dst, slot in edges]

    def consumers(self, value: str) -> list[OpRecord | CalibRecord]:
        """Distinct nodes reading ``value``, in deterministic (source) order."""
        seen: dict[str, OpRecord | CalibRecord] = {}
        for rec, _ in self.uses(value):
            seen.setdefault(rec.name, rec)
        return list(seen.values())

    def weight_array(self, name: str) -> np.ndarray:
        rec = self.value(name)
        if rec.data is None:
            raise NotFoundError(f"{name!r} is not a weight")
        return rec.data

    def counts(self) -> dict[str, int]:
        """How many nodes of each kind."""
        counts = {k.value: 0 for k in NodeKind}
        for _, d in self.graph.nodes(data=True):
            counts[d["rec"].kind.value] += 1
        return counts

    # ------------------------------------------------------------------ mutators
    def add_input(self, name: str, dtype: str | None, shape: Shape) -> ValueRecord:
        """Add a graph input (an activation with no producer)."""
        rec = self._add_value(ValueRecord(name, NodeKind.ACTIVATION, dtype, _shape(shape)), (-1,))
        self._inputs += (name,)
        return rec

    def add_weight(self, name: str, array: np.ndarray) -> ValueRecord:
        """Add a constant; the array is frozen (read-only) and shared by clones."""
        arr = _frozen(array)
        rec = ValueRecord(name, NodeKind.WEIGHT, arr.dtype.name, tuple(arr.shape), arr)
        return self._add_value(rec, (-1,))

    def set_weight(self, name: str, array: np.ndarray) -> None:
        """Give a weight new contents (copy-on-write: clones keep the old array)."""
        rec = self.value(name)
        if rec.kind is not NodeKind.WEIGHT:
            raise QirError(f"{name!r} is an activation, not a weight")
        arr = _frozen(array)
        rec.data, rec.dtype, rec.shape = arr, arr.dtype.name, tuple(arr.shape)
        self.touch()

    def set_calibration(self, name: str, *, mode: CalibMode | str | None = None,
                        threshold: np.ndarray | float | None = None, axis: int | None | object = _KEEP,
                        fixed: bool | None = None) -> bool:
        """Change the state of calibration node ``name``: the one way to do it, so ``version``
        moves whenever a node's state does. Returns True when something changed.

        * ``mode``: the new mode; a node holding an imported scale keeps its real range across
          int8/int16 (:func:`qir.calibration.set_mode`).
        * ``threshold``: a scalar (per tensor) or a vector along ``axis``; the node's scale then
          derives from it (an imported scale and zero point are dropped).
        * ``axis``: the channel axis of the new threshold (default: the node's own).
        * ``fixed``: True marks the threshold as the user's (calibration keeps it).
        """
        rec = self.calibration(name)
        before = (rec.mode, rec.threshold, rec.scale, rec.zero_point, rec.axis, rec.fixed)
        if mode is not None:
            set_calibration_mode(rec, mode)
        if threshold is not None:
            rec.threshold = threshold
            rec.scale = rec.zero_point = None
        if axis is not _KEEP:
            rec.axis = axis
        if fixed is not None:
            rec.fixed = bool(fixed)
        after = (rec.mode, rec.threshold, rec.scale, rec.zero_point, rec.axis, rec.fixed)
        # the mode by ==: numpy reads a str enum as its str() cut to the value's length ("Calib" for
        # both int16 and float), so np.array_equal would call int16 -> float no change
        changed = before[0] != after[0] or any(a is not b and not np.array_equal(a, b)
                                               for a, b in zip(before[1:], after[1:]))
        if changed:
            self.touch()
        return changed

    def add_op(self, name: str, op_type: str, inputs: Sequence[str], outputs: Sequence[str], *,
               attrs: Mapping[str, AttrValue] | None = None, attr_types: Mapping[str, int] | None = None,
               domain: str = "", module: str | None = None,
               output_info: Mapping[str, tuple[str | None, Shape]] | None = None,
               after: str | None = None) -> OpRecord:
        """Add a general node; its output values are created (they must not exist yet).

        Args:
            inputs: value names by slot; ``""`` marks an omitted optional input.
            output_info: optional ``{output: (dtype, shape)}``.
            after: place the node right after this node in the deterministic order
                (default: at the end).
        """
        self._check_new_node(name)
        for v in inputs:
            if v:
                self._vkey(v)
        self._check_new_values([v for v in outputs if v])
        rec = OpRecord(name, op_type, tuple(inputs), tuple(outputs), dict(attrs or {}),
                       dict(attr_types or {}), domain, module)
        ordinal = self._ord_after(after) if after else (self._next_ordinal(),)
        self.graph.add_node(name, rec=rec, ord=ordinal)
        for slot, v in enumerate(inputs):
            if v:
                self.graph.add_edge(value_key(v), name, key=slot, slot=slot)
        info = output_info or {}
        for idx, v in enumerate(outputs):
            if not v:  # an omitted optional output: no value, no edge
                continue
            dtype, shape = info.get(v, (None, None))
            self._add_value(ValueRecord(v, NodeKind.ACTIVATION, dtype, _shape(shape)), ordinal + (idx,))
            self.graph.add_edge(name, value_key(v), key=idx, slot=idx)
        self.touch()
        return rec

    def insert_calibration(self, value: str, name: str, *, role: CalibRole | str | None = None,
                           mode: CalibMode | str = CalibMode.INT8, output: str | None = None,
                           uses: Iterable[tuple[str, int]] | None = None,
                           rewire_outputs: bool = False, **state: Any) -> CalibRecord:
        """Put a calibration node on ``value``: ``value → name → output → (chosen uses)``.

        Args:
            value: the activation or weight to quantize.
            name: the calibration node's name (unique among running nodes).
            role: ``weight`` or ``activation``; default from the value's kind.
            output: name of the new value (default ``value + "~q"``).
            uses: the ``(node name, slot)`` reads to rewire; default all of them.
            rewire_outputs: also make the graph output read the quantized value.
            state: further :class:`CalibRecord` fields (threshold, scale, axis, fixed, ...).
        """
        self._check_new_node(name)
        out = output or value + "~q"
        self._check_new_values([out])
        if uses is None:
            chosen = [(r.name, s) for r, s in self.uses(value)]
        else:
            chosen = list(uses)
            for node, slot in chosen:
                reads = self.node(node).inputs
                if slot >= len(reads) or reads[slot] != value:
                    raise QirError(f"cannot rewire {node!r} input {slot}: it reads "
                                   f"{reads[slot] if slot < len(reads) else 'nothing'!r}, not {value!r}")
        state.setdefault("feeds", tuple(dict.fromkeys(n for n, _ in chosen)))
        producer = self.producer(value)
        if producer is not None:
            ordinal = self._ord_after(producer.name)
        elif chosen:
            first = min((self.graph.nodes[n]["ord"] for n, _ in chosen))
            ordinal = first[:-1] + (first[-1] - 0.5, self._next_ordinal())
        else:
            ordinal = (-1, self._next_ordinal())
        rec = self._new_calibration(name, value, out, role, mode, ordinal, state)
        for node, slot in chosen:
            self.set_input(node, slot, out)
        if rewire_outputs:
            self._outputs = tuple(out if o == value else o for o in self._outputs)
        self.touch()
        return rec

    def add_calibration(self, name: str, input: str, output: str, *,
                        role: CalibRole | str | None = None, mode: CalibMode | str = CalibMode.INT8,
                        after: str | None = None, **state: Any) -> CalibRecord:
        """Add a calibration node reading ``input`` and producing the new value ``output``
        (importers use this; passes usually want :meth:`insert_calibration`, which rewires)."""
        ordinal = self._ord_after(after) if after else (self._next_ordinal(),)
        return self._new_calibration(name, input, output, role, mode, ordinal, state)

    def set_input(self, node: str, slot: int, value: str) -> None:
        """Make input ``slot`` of ``node`` read ``value``."""
        rec = self.node(node)
        if value:
            self._vkey(value)
        if isinstance(rec, CalibRecord):
            if slot != 0 or not value:
                raise QirError(f"calibration node {node!r} has exactly one input (slot 0)")
            old = rec.input
            rec.input = value
        else:
            inputs = list(rec.inputs)
            if slot >= len(inputs):
                inputs += [""] * (slot + 1 - len(inputs))
            old = inputs[slot]
            inputs[slot] = value
            while inputs and not inputs[-1]:
                inputs.pop()
            rec.inputs = tuple(inputs)
        if old:
            self.graph.remove_edge(value_key(old), node, key=slot)
        if value:
            self.graph.add_edge(value_key(value), node, key=slot, slot=slot)
        self.touch()

    def replace_uses(self, old: str, new: str, *, outputs: bool = True,
                     skip: Iterable[str] = ()) -> int:
        """Make every reader of ``old`` read ``new`` (and graph outputs if ``outputs``).

        ``skip`` names readers to leave alone, e.g. the node just inserted after ``old``.
        Returns how many reads were rewired.
        """
        count = 0
        skipped = set(skip)
        for rec, slot in self.uses(old):
            if rec.name in skipped:
                continue
            self.set_input(rec.name, slot, new)
            count += 1
        if outputs and old in self.outputs:
            self._outputs = tuple(new if o == old else o for o in self._outputs)
            count += 1
        self.touch()
        return count

    def remove_node(self, name: str) -> None:
        """Remove an op or calibration node and its output values (which must be unused)."""
        rec = self.node(name)
        outs = [o for o in rec.outputs if o]
        for out in outs:
            if self.uses(out) or out in self.outputs:
                raise QirError(f"cannot remove {name!r}: its output {out!r} is still used; "
                               "replace_uses() first")
        for out in outs:
            self.graph.remove_node(value_key(out))
        self.graph.remove_node(name)
        self.touch()

    def remove_value(self, name: str) -> None:
        """Remove an unused weight or graph input."""
        key = self._vkey(name)
        if self.graph.out_degree(key) or name in self.outputs:
            raise QirError(f"cannot remove value {name!r}: it is still used")
        if self.graph.in_degree(key):
            raise QirError(f"cannot remove value {name!r}: remove its producer instead")
        self.graph.remove_node(key)
        if name in self._inputs:
            self._inputs = tuple(i for i in self._inputs if i != name)
        self.touch()

    def set_outputs(self, names: Sequence[str]) -> None:
        for n in names:
            self._vkey(n)
        self._outputs = tuple(names)
        self.touch()

    def prune(self) -> int:
        """Remove nodes that cannot reach a graph output, and unused weights. Returns count."""
        alive = set()
        for out in self.outputs:
            key = value_key(out)
            alive.add(key)
            alive |= nx.ancestors(self.graph, key)
        for key in list(alive):  # a surviving node keeps all its outputs, used or not
            if not key.startswith("%"):
                alive.update(self.graph.successors(key))
        dead = [k for k in self.graph if k not in alive and
                not (k.startswith("%") and k[1:] in self.inputs)]
        self.graph.remove_nodes_from(dead)
        if dead:
            self.touch()
        return len(dead)

    # ------------------------------------------------------------------ copies and dumps
    def clone(self) -> "QIR":
        """An independent copy: new graph and records; weight arrays shared read-only."""
        new = QIR.__new__(QIR)
        new.graph = self.graph.copy()
        for _, data in new.graph.nodes(data=True):
            data["rec"] = copy_record(data["rec"])
        new.name = self.name
        new.opset_imports = dict(self.opset_imports)
        new._inputs, new._outputs = self._inputs, self._outputs
        new.meta = dict(self.meta)
        new.metadata_props = dict(self.metadata_props)
        new._ord_counter = self._ord_counter
        new._version = 0
        new._cache = {}
        order = self._cache.get("topo")
        if order is not None:  # the same graph: the same order, of the copied records
            nodes = new.graph.nodes
            new._cache["topo"] = [nodes[rec.name]["rec"] for rec in order]
        return new

    def assign(self, other: "QIR") -> None:
        """Make this IR hold ``other``'s model (an independent copy of its graph, records and
        metadata): how a transform that rebuilt the model from scratch (``tune``'s transforms)
        still returns the IR it was given. Cached values are dropped; the version moves on."""
        copy = other.clone()
        self.graph, self.name, self.opset_imports = copy.graph, copy.name, copy.opset_imports
        self._inputs, self._outputs = copy._inputs, copy._outputs
        self.meta, self.metadata_props = copy.meta, copy.metadata_props
        self._ord_counter = copy._ord_counter
        self.touch()

    def to_json(self) -> dict[str, Any]:
        """The JSON-able dump (schema in :mod:`qir.json_dump`)."""
        from qir.json_dump import to_json
        return to_json(self)

    def to_dot(self, **kwargs: Any) -> str:
        """Graphviz DOT text of the model (see :func:`qir.dot.to_dot`)."""
        from qir.dot import to_dot
        return to_dot(self, **kwargs)

    # ------------------------------------------------------------------ internals
    def _vkey(self, name: str) -> str:
        key = value_key(name)
        if key not in self.graph:
            raise NotFoundError(did_you_mean(name, [v.name for v in self.values()], "value"))
        return key

    def _check_new_node(self, name: str) -> None:
        if not name:
            raise QirError("a node needs a non-empty name")
        if name in self.graph:
            raise QirError(f"a node named {name!r} already exists")

    def _check_new_values(self, names: list[str]) -> None:
        """Raise before any change if a new value name is taken or repeated (keeps mutators atomic)."""
        if len(set(names)) != len(names):
            raise QirError(f"output names repeat: {names}")
        for n in names:
            if value_key(n) in self.graph:
                raise QirError(f"a value named {n!r} already exists (values are SSA)")

    def _add_value(self, rec: ValueRecord, ordinal: tuple) -> ValueRecord:
        key = value_key(rec.name)
        if key in self.graph:
            raise QirError(f"a value named {rec.name!r} already exists (values are SSA)")
        self.graph.add_node(key, rec=rec, ord=ordinal)
        self.touch()
        return rec

    def _new_calibration(self, name: str, input: str, output: str, role: CalibRole | str | None,
                         mode: CalibMode | str, ordinal: tuple, state: dict[str, Any]) -> CalibRecord:
        self._check_new_node(name)
        self._check_new_values([output])
        src = self.value(input)
        role = CalibRole(role) if role else (
            CalibRole.WEIGHT if src.kind is NodeKind.WEIGHT else CalibRole.ACTIVATION)
        rec = CalibRecord(name, input, output, role, CalibMode(mode), **state)
        self.graph.add_node(name, rec=rec, ord=ordinal)
        self.graph.add_edge(value_key(input), name, key=0, slot=0)
        self._add_value(ValueRecord(output, NodeKind.ACTIVATION, src.dtype, src.shape), ordinal + (0,))
        self.graph.add_edge(name, value_key(output), key=0, slot=0)
        self.touch()
        return rec

    def _next_ordinal(self) -> int:
        self._ord_counter += 1
        return self._ord_counter

    def _ord_after(self, name: str) -> tuple:
        return self.graph.nodes[name]["ord"] + (self._next_ordinal(),)

    def __iter__(self) -> Iterator[Record]:
        return iter(self.runnables())


def _shape(shape: Shape | Sequence[Any]) -> Shape:
    return None if shape is None else tuple(shape)
