"""How the engine cuts a calibrated IR into steps, groups steps into segments, and finds the
steps a variant must re-execute (its *cone*).

Rules:

1. **Steps.** Every activation calibration node is a step of its own (a variant changes the
   model exactly there). General nodes are grouped: walking the topological order backwards,
   an op joins the group of its consumers when *all* readers of *all* its outputs are ops of
   one group and none of its outputs is a graph output or a value the analysis compares;
   otherwise it starts a group. Only a group's last op has readers outside the group, so every
   group is convex (no path leaves it and comes back) and can run as one unit. Weight
   calibration nodes are not steps: their outputs are constants of the steps that read them.
2. **Order.** Steps are ordered by the topological position of their last node, which is a
   topological order of the steps.
3. **Segments.** Consecutive runs of steps, cut so that their costs are about equal. A contiguous
   range of a topological order is convex, so a segment also runs as one unit.
4. **Cone.** A variant changes some calibration nodes. Its start steps are the changed
   activation calibration nodes and the readers of changed weight calibration nodes; its cone
   is everything downstream of them. Nothing outside the cone can change.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from qir.graph import QIR
from qir.kinds import NodeKind
from qir.records import CalibRecord, OpRecord

__all__ = ["Step", "Plan", "build_plan", "split_segments", "weight_calibrations"]


@dataclass
class Step:
    """One unit of execution: a group of general nodes, or one activation calibration node."""

    index: int
    records: tuple[OpRecord | CalibRecord, ...]
    inputs: tuple[str, ...]   # activations read from outside the step (graph inputs included)
    outputs: tuple[str, ...]  # values read by later steps, graph outputs and compared values
    weight_calibs: tuple[str, ...] = ()  # weight calibration nodes whose outputs it reads

    @property
    def calib(self) -> CalibRecord | None:
        rec = self.records[0]
        return rec if isinstance(rec, CalibRecord) else None

    @property
    def name(self) -> str:
        return self.records[-1].name


@dataclass
class Plan:
    steps: list[Step]
    readers: list[tuple[int, ...]]          # step -> steps reading its outputs
    last_reader: dict[str, int]             # value -> last step reading it
    step_of: dict[str, int]                 # activation calibration node -> its step
    weight_readers: dict[str, tuple[int, ...]]  # weight calibration node -> steps reading it
    kept: frozenset[str] = frozenset()      # graph outputs and compared values
    segments: list[tuple[int, int]] = field(default_factory=list)  # [start, stop) step ranges

    def start_steps(self, changed: Iterable[str]) -> set[int]:
        """The steps a change of these calibration nodes affects first."""
        start: set[int] = set()
        for name in changed:
            if name in self.step_of:
                start.add(self.step_of[name])
            else:
                start.update(self.weight_readers.get(name, ()))
        return start

    def cone(self, start: Iterable[int]) -> np.ndarray:
        """Boolean mask of the steps downstream of (and including) ``start``."""
        mask = np.zeros(len(self.steps), bool)
        start = sorted(start)
        if not start:
            return mask
        mask[start] = True
        for i in range(start[0], len(self.steps)):
            if mask[i]:
                mask[list(self.readers[i])] = True
        return mask

    def segment_io(self, k: int) -> tuple[list[str], list[str]]:
        """Inputs and outputs of segment ``k`` as a unit."""
        lo, hi = self.segments[k]
        produced = {v for s in self.steps[lo:hi] for v in s.outputs}
        inputs = list(dict.fromkeys(v for s in self.steps[lo:hi] for v in s.inputs if v not in produced))
        outputs = [v for s in self.steps[lo:hi] for v in s.outputs
                   if self.last_reader.get(v, -1) >= hi or v in self.kept]
        return inputs, outputs


def weight_calibrations(ir: QIR) -> list[CalibRecord]:
    """Calibration nodes reading a weight (constant) value."""
    return [c for c in ir.calibrations() if ir.value(c.input).kind is NodeKind.WEIGHT]


def build_plan(ir: QIR, keep: Iterable[str] = ()) -> Plan:
    """Steps of ``ir`` (rule 1) with ``keep`` values (and graph outputs) produced as step outputs."""
    keep = frozenset(keep) | frozenset(ir.outputs)
    wcal = {c.output: c.name for c in weight_calibrations(ir)}
    order = ir.runnables()
    position = {rec.name: i for i, rec in enumerate(order)}
    group_of: dict[str, int] = {}
    groups: list[list[OpRecord]] = []
    for rec in reversed(order):
        if not isinstance(rec, OpRecord):
            continue
        readers = {c.name for o in rec.outputs if o for c in ir.consumers(o)}
        owners = {group_of.get(r) for r in readers}
        if (readers and len(owners) == 1 and None not in owners
                and not any(o in keep for o in rec.outputs)):
            g = owners.pop()
            groups[g].append(rec)
        else:
            g = len(groups)
            groups.append([rec])
        group_of[rec.name] = g
    units: list[tuple[int, tuple]] = [(position[g[0].name], tuple(reversed(g))) for g in groups]
    units += [(position[c.name], (c,)) for c in ir.calibrations() if c.output not in wcal]
    units.sort(key=lambda u: u[0])

    produced_by: dict[str, int] = {}
    raw: list[tuple[tuple, list[str], list[str], list[str]]] = []
    for i, (_, records) in enumerate(units):
        made = {o for r in records for o in r.outputs if o}
        reads = [v for r in records for v in r.inputs if v and v not in made]
        inputs = list(dict.fromkeys(v for v in reads if v not in wcal and ir.value(v).kind is not NodeKind.WEIGHT))
        wreads = list(dict.fromkeys(wcal[v] for v in reads if v in wcal))
        raw.append((records, inputs, wreads, sorted(made)))
        for o in made:
            produced_by[o] = i
    readers: list[set[int]] = [set() for _ in raw]
    last_reader: dict[str, int] = {}
    read_outside: set[str] = set()
    for i, (_, inputs, _, _) in enumerate(raw):
        for v in inputs:
            last_reader[v] = i
            if v in produced_by:
                readers[produced_by[v]].add(i)
                read_outside.add(v)
    steps = []
    for i, (records, inputs, wreads, made) in enumerate(raw):
        outputs = tuple(o for r in records for o in r.outputs if o and (o in read_outside or o in keep))
        steps.append(Step(i, records, tuple(inputs), outputs, tuple(wreads)))
    weight_readers: dict[str, list[int]] = {}
    for s in steps:
        for w in s.weight_calibs:
            weight_readers.setdefault(w, []).append(s.index)
    plan = Plan(steps, [tuple(sorted(r)) for r in readers], last_reader,
                {s.calib.name: s.index for s in steps if s.calib is not None},
                {w: tuple(v) for w, v in weight_readers.items()}, keep)
    return plan


def split_segments(costs: list[float], count: int) -> list[tuple[int, int]]:
    """At most ``count`` contiguous non-empty ranges of about equal total cost (rule 3): the
    k-th cut goes where the running cost is nearest to ``k/count`` of the total."""
    n = len(costs)
    count = max(1, min(count, n))
    cum = np.cumsum(np.asarray(costs, np.float64))
    total = float(cum[-1]) if n else 0.0
    cuts = [0]
    for k in range(1, count):
        target = total * k / count
        i = int(np.argmin(np.abs(cum - target))) + 1 if total > 0 else round(n * k / count)
        if cuts[-1] < i < n:
            cuts.append(i)
    cuts.append(n)
    return list(zip(cuts, cuts[1:]))
