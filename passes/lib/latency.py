"""The latency model: what a configuration costs on the march, counting bytes and fusions.

For each group the march runs as one (:mod:`qir.passes.lib.latency_groups`: a Conv with its
Add and Relu, or a lone op) at precision ``P`` (input ``a``, weight ``w``, output ``o``)::

    compute = FLOPs / (peak_tops[rate_key(a, w)] · 1e12)
    bytes   = inputs·|a| + outputs·|o| + weights·|w| + bias·4 + consts·|a|
    memory  = bytes / (memory_gbps · 1e9)
    time    = max(compute, memory) + op_overhead_us

``|d|`` is the element size of precision ``d`` (int8 1, int16 2, fp16 2, float 4); inputs are
those not produced inside the group and outputs those leaving it, so a value passed inside a
fused group costs no bytes. The group is *compute-bound* when ``compute ≥ memory``, else
*memory-bound*. A lone view op (``free_ops``) costs nothing. A latency table
(:mod:`qir.passes.lib.latency_table`) replaces ``time`` for the groups it lists (*measured*).
The model's time is the sum over groups: ops run one after another.

:class:`LatencyModel` builds the groups once and prices any configuration
(:meth:`LatencyModel.estimate`): the precision of each op (``qir tune`` passes the ones of the
configuration it weighs), one :class:`Precision` for every op, or the IR's own.
"""
from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Mapping

from qir.graph import QIR
from qir.passes.lib.latency_groups import Group, Precision, PrecisionPlan, build_groups
from qir.passes.lib.latency_table import LatencyEntry, LatencyTable
from qir.runtimes.march import MarchProfile
from qir.runtimes.march.rates import element_bytes, widest

__all__ = ["Bound", "Precision", "GroupCost", "ModelCost", "LatencyModel", "UNIFORM", "estimate_time"]

logger = logging.getLogger(__name__)

#: Every op at one precision: ``int16`` is int16 activations with int8 weights (the nash default
#: for a raised activation), ``fp16`` fp16 activations and weights.
UNIFORM: dict[str, Precision] = {
    "int8": Precision("int8", "int8", "int8"), "int16": Precision("int16", "int8", "int16"),
    "fp16": Precision("fp16", "fp16", "fp16"), "float": Precision("float", "float", "float")}


class Bound(str, enum.Enum):
    """What limits a group's time."""

    COMPUTE = "compute"    # arithmetic at the peak rate takes longer than the bytes
    MEMORY = "memory"      # the bytes take longer than the arithmetic
    FREE = "free"          # a view op: nothing moves
    MEASURED = "measured"  # the latency table's time


@dataclass(frozen=True)
class GroupCost:
    """One group's estimate at one precision (times in µs)."""

    group: Group
    precision: Precision
    bytes: int
    compute_us: float
    memory_us: float
    overhead_us: float
    time_us: float
    bound: Bound
    measured: LatencyEntry | None = None  # the latency-table row that gave the time

    @property
    def name(self) -> str:
        return self.group.name

    @property
    def flops(self) -> int:
        return self.group.flops


@dataclass(frozen=True)
class ModelCost:
    """A configuration's estimate: one :class:`GroupCost` per group, in op order."""

    march: str
    groups: tuple[GroupCost, ...]

    @property
    def total_us(self) -> float:
        return sum(g.time_us for g in self.groups)

    @property
    def total_ms(self) -> float:
        return self.total_us / 1000.0

    @property
    def flops(self) -> int:
        return sum(g.flops for g in self.groups)

    @property
    def bytes(self) -> int:
        return sum(g.bytes for g in self.groups)

    def count(self, bound: Bound) -> int:
        """How many groups ``bound`` limits."""
        return sum(g.bound is bound for g in self.groups)

    def time_of(self, bound: Bound) -> float:
        """µs spent in the groups ``bound`` limits."""
        return sum(g.time_us for g in self.groups if g.bound is bound)


class LatencyModel:
    """The latency model of ``ir`` on ``profile`` (see the module docstring); ``table``: measured
    times that override the model."""

    def __init__(self, ir: QIR, profile: MarchProfile, *, table: LatencyTable | None = None) -> None:
        self.ir, self.profile, self.table = ir, profile, table
        self.groups = build_groups(ir, profile)
        #: Where each op's precision comes from (walked once: :meth:`PrecisionPlan.precisions` of any configuration).
        self.plan = PrecisionPlan(ir)
        self.own = self.plan.precisions()
        self._times: dict[tuple[int, Precision], float] = {}  # (group index, precision) -> µs

    def group_precision(self, group: Group, precisions: Mapping[str, Precision]) -> Precision:
        """A group's precision from its ops': the widest input, the head's weight (none when the
        group reads no weight) and the last op's output."""
        ps = [precisions.get(name) or self.own[name] for name in group.ops]
        weight = ps[0].weight if group.weights else None
        if group.weights and weight is None:
            weight = ps[0].input if ps[0].input in ("fp16", "float") else "int8"
        return Precision(widest([p.input for p in ps]), weight, ps[-1].output)

    def price(self, group: Group, p: Precision) -> GroupCost:
        """``group`` at precision ``p``: the model's time, or the latency table's."""
        if group.free:
            return GroupCost(group, p, 0, 0.0, 0.0, 0.0, 0.0, Bound.FREE)
        size_in = element_bytes(p.input)
        nbytes = (group.inputs * size_in + group.outputs * element_bytes(p.output)
                  + group.weights * element_bytes(p.weight or p.input) + group.bias * element_bytes("int32")
                  + group.consts * size_in)
        compute = group.flops / self.profile.peak_ops_per_s(p.input, p.weight if group.gemm else None) * 1e6
        memory = nbytes / (self.profile.memory_gbps * 1e9) * 1e6
        overhead = self.profile.op_overhead_us
        entry = self._measured(group, p)
        if entry is not None:
            return GroupCost(group, p, nbytes, compute, memory, overhead, entry.time_us, Bound.MEASURED, entry)
        bound = Bound.COMPUTE if compute >= memory else Bound.MEMORY
        return GroupCost(group, p, nbytes, compute, memory, overhead, max(compute, memory) + overhead, bound)

    def _measured(self, group: Group, p: Precision) -> LatencyEntry | None:
        if self.table is None:
            return None
        head_type = group.op_type.split("+")[0]
        keys = (*group.ops, group.op_type) + ((head_type,) if head_type != group.op_type else ())
        return self.table.lookup(keys, p.input, p.weight)

    def requantize_us(self, requantizes: list[tuple[int, str, str]]) -> float:
        """The time of requantizes ``(elements, from, to)`` (a split value's conversions,
        :meth:`~qir.passes.lib.latency_groups.PrecisionPlan.requantizes`): each reads the value at
        ``from`` and writes it at ``to``, memory-bound, plus the per-op overhead."""
        gbps = self.profile.memory_gbps * 1e9
        return sum(n * (element_bytes(a) + element_bytes(b)) / gbps * 1e6 + self.profile.op_overhead_us
                   for n, a, b in requantizes)

    def time_us(self, precisions: Mapping[str, Precision]) -> float:
        """``estimate(precisions).total_us``, each group's time at each precision computed once
        (what a search that prices thousands of configurations needs)."""
        total = 0.0
        for i, group in enumerate(self.groups):
            key = (i, self.group_precision(group, precisions))
            time = self._times.get(key)
            if time is None:
                time = self._times[key] = self.price(group, key[1]).time_us
            total += time
        return total

    def estimate(self, precisions: Precision | str | Mapping[str, Precision] | None = None) -> ModelCost:
        """The estimate of one configuration.

        ``precisions``: op name -> :class:`Precision` (ops left out keep the IR's own, see
        :func:`~qir.passes.lib.latency_groups.precisions_of`); or one Precision, or a key of
        :data:`UNIFORM`, for every op; None: the IR's own precisions.
        """
        if isinstance(precisions, str):
            precisions = UNIFORM[precisions]
        if isinstance(precisions, Precision):
            precisions = {name: precisions for name in self.own}
        chosen = precisions or {}
        costs = tuple(self.price(g, self.group_precision(g, chosen)) for g in self.groups)
        return ModelCost(self.profile.name, costs)


def estimate_time(ir: QIR, profile: MarchProfile,
                  precisions: Precision | str | Mapping[str, Precision] | None = None, *,
                  table: LatencyTable | None = None) -> ModelCost:
    """:meth:`LatencyModel.estimate` of one configuration (build a :class:`LatencyModel` once to
    price many)."""
    return LatencyModel(ir, profile, table=table).estimate(precisions)
