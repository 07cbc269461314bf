"""What ``qir tune`` chooses from: one *unit* per activation calibration node, its precision
ladder from the march profile, configurations of all units, and their estimated time (and FLOP-weighted cost).

**Units.** Each activation calibration node is a unit. A unit that feeds a GEMM (Conv,
ConvTranspose, Gemm, MatMul) at input 0 carries those GEMMs' weight calibration nodes with it:
its ``int16+w16`` level raises them to int16 too, ``float`` leaves them unquantized (the op runs
on the CPU); every other level keeps them at int8. Where a repair fitted those GEMMs to their
weights' quantization (``bias-correct``, ``round-weights``: :data:`~qir.passes.lib.repair.WEIGHT_TIED`,
read from the IR's notes), the unit keeps them at the mode they were fitted at: the levels that
would move them are not offered (:attr:`Space.tied`), since a bias corrected for int8 weights is
wrong by that correction next to int16 ones.

**Ladders.** ``profile.tune_ladder["gemm"]`` for a unit that feeds any GEMM, else
``["other"]`` (levels cheapest first; :data:`~qir.runtimes.march.profile.TUNE_LEVELS`), keeping
only the levels the march allows for every op the unit feeds: an integer dtype must be in
``profile.allowed_act_dtypes`` (so a MaxPool's data input stays int8 on nash-e), fp16 must be
native there or a documented fp16 form (``fp16_documented_ops``), and a GEMM's (input, weight)
pair must be one ``profile.allows_gemm`` accepts. ``allow_float`` appends ``float``. The first
level is the start configuration; the last integer level is the upper bound checked first.

**Configurations** (:class:`Config`): a level per unit and optional fixed thresholds (a
clipping fix: the node keeps its level with that threshold). :meth:`Space.move` sets levels and,
with them, each moved unit's threshold as :attr:`Space.policy` says for the new level's mode (the
clipping fixes chosen for int8 and for int16; no entry: the calibrated threshold), so every
search step carries the right threshold along. :meth:`Space.changes` turns a configuration into
calibration-node changes (``"int16"``, ``"int8@2.5"``) relative to the plain start (every unit at
its first level, calibrated thresholds), the engine's reference.

**Cost** (:meth:`Space.cost`): the configuration's estimated time on the march, in µs, by the
latency model (:mod:`qir.passes.lib.latency`: per fused group, the larger of its arithmetic at
the precision pair's peak rate and the bytes that cross memory, plus a per-op overhead; a
latency table's measured times where given), with each op's precision from the calibration
nodes it reads (:class:`~qir.passes.lib.latency_groups.PrecisionPlan`). An int16 Add over a wide
feature map moves twice the bytes, so it costs what the NPU pays for it, where a FLOP count
would call it free. :meth:`Space.flop_cost` keeps the tuning guide's proxy as a second figure:
Σ over ops of FLOPs (:func:`qir.runtimes.engine.cost.op_flops`) × the profile's ``tune_costs``
for the op's precision, a GEMM by its ``"input x weight"`` pair (``"int16 x int8"``), another op
by the costliest mode of its quantized inputs. In both, ops that read no calibration node run in
float: the same in every configuration of one model, they make a model quantized elsewhere
(fewer ops quantized) comparable with the search's.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

import numpy as np

from qir.calibration import QRANGE
from qir.errors import InputError
from qir.graph import QIR
from qir.kinds import CalibMode
from qir.passes.lib.latency import LatencyModel, ModelCost
from qir.passes.lib.latency_table import LatencyTable
from qir.passes.lib.repair import weight_tied_ops
from qir.records import CalibRecord, OpRecord
from qir.runtimes.engine.cost import op_flops
from qir.runtimes.march import MarchProfile, OpClass, op_class
from qir.runtimes.march.profile import TUNE_LEVELS

__all__ = ["Unit", "Config", "Space", "TUNE_LEVELS", "PRICES", "DEFAULT_PRICE", "constrained_splits"]

#: What the search may minimise: the latency model's estimated time, or the FLOP-weighted cost
#: (the tuning guide's proxy).
PRICES = ("latency", "flops")
#: The default price: the latency model's estimated time (issue 33), what an NPU pays. Priced by
#: time, the search leaves more elementwise quantizers at int8, whose integer arithmetic departs
#: from fake quantization; step 7's search at the integer level (:mod:`.integer_repair`) makes that
#: up: the time-priced results verified on PP-OCRv4 det with a floor (12.5 ms against 14.6 ms
#: priced by FLOPs, unseen images 0.9959 / 0.9904 against 0.9961 / 0.9907), on YOLOv8n (1.28 ms
#: against 1.63 ms) and on the ViT-S (all-int8 after its transforms, now that its LayerNorms and
#: GELUs run as units). It was not the default while a time-priced ViT-S result (259 int16
#: elementwise units) parted from the emitted model's score by 1.35e-4: a residual stream with
#: massive channels, quantized per tensor, amplifies the last-bit differences of two runtimes'
#: float arithmetic (onnxruntime against numpy at the same configuration: up to 0.004 cosine).
#: ``"flops"`` is the tuning guide's proxy.
DEFAULT_PRICE = "latency"


@dataclass(frozen=True)
class Unit:
    """One activation calibration node and the weight calibration nodes that go with it."""

    name: str
    weights: tuple[str, ...]
    levels: tuple[str, ...]
    gemm: bool


@dataclass(frozen=True)
class Config:
    """A level index per unit (in :attr:`Space.units` order) and fixed thresholds
    (``(unit name, threshold)`` pairs, sorted)."""

    levels: tuple[int, ...]
    thresholds: tuple[tuple[str, float], ...] = field(default=())

    def with_levels(self, changes: Mapping[int, int]) -> Config:
        levels = list(self.levels)
        for i, level in changes.items():
            levels[i] = level
        return replace(self, levels=tuple(levels))

    def with_thresholds(self, thresholds: Mapping[str, float | None]) -> Config:
        merged = dict(self.thresholds)
        for name, value in thresholds.items():
            if value is None:
                merged.pop(name, None)
            else:
                merged[name] = float(value)
        return replace(self, thresholds=tuple(sorted(merged.items())))


def constrained_splits(ir: QIR, profile: MarchProfile) -> dict[str, list[list[str]]]:
    """Activation calibration nodes that one reader keeps from int16 while another could take it
    (an int8-only pooling input beside a Mul) -> their readers in two groups, the int8-only ones
    first (:func:`qir.split.split_calibration`'s groups). A precision per consumer: split so, the
    others are free to go to int16 (a requantize on the NPU), where unsplit no reader could."""
    out = {}
    for cal in ir.calibrations("activation"):
        readers = [(op, slot) for op, slot in ir.uses(cal.output) if isinstance(op, OpRecord)]
        if len(readers) < 2 or cal.output in ir.outputs:
            continue
        stuck: list[str] = []
        free: list[str] = []
        for op, slot in readers:
            group = free if "int16" in profile.allowed_act_dtypes(op.op_type, slot) else stuck
            if op.name not in group:
                group.append(op.name)
        if stuck and free and not set(stuck) & set(free):
            out[cal.name] = [stuck, free]
    return out


class Space:
    """The units of a calibrated IR under a march profile (see the module docstring)."""

    def __init__(self, ir: QIR, profile: MarchProfile, *, allow_float: bool = False,
                 latency_table: LatencyTable | None = None, price: str = DEFAULT_PRICE) -> None:
        if price not in PRICES:
            raise InputError(f"unknown price {price!r}; choose one of {', '.join(PRICES)}")
        self.ir, self.profile, self.allow_float, self.price = ir, profile, allow_float, price
        self._tied_ops = weight_tied_ops(ir)
        #: unit -> the weight mode its GEMMs' weights keep (a repair fitted them there): the
        #: levels that would move them (``int16+w16``, ``float``) are not offered
        self.tied: dict[str, str] = {}
        self.units = [u for c in ir.calibrations("activation") if (u := self._unit(c)) is not None]
        self.index = {u.name: i for i, u in enumerate(self.units)}
        self._ops = [(op, op_flops(ir, op), op_class(op.op_type) is OpClass.GEMM, self._quantizers(op))
                     for op in ir.ops()]
        self.policy: dict[tuple[str, str], float] = {}  # (unit, mode) -> the fixed threshold it takes there
        self.start_modes = self.modes(self.plain_start())  # the IR's own (a node's change back to it)
        self.latency = LatencyModel(ir, profile, table=latency_table)
        self._plan = self.latency.plan
        #: What no precision changes in :meth:`cost`: the per-op overheads of every group (none in FLOPs).
        self.overhead_us = sum(g.overhead_us for g in self.latency.estimate().groups) if price == "latency" else 0.0
        self._times: dict[tuple[int, ...], float] = {}  # levels -> µs (a threshold does not change the time)

    # ------------------------------------------------------------------ units
    def _unit(self, cal: CalibRecord) -> Unit | None:
        readers = [(op, slot) for op, slot in self.ir.uses(cal.output) if isinstance(op, OpRecord)]
        if not readers:
            return None
        gemms = [op for op, slot in readers if op_class(op.op_type) is OpClass.GEMM and slot == 0]
        weights = tuple(w.name for op in gemms if len(op.inputs) > 1
                        and isinstance(w := self.ir.producer(op.inputs[1]), CalibRecord) and w.role.value == "weight")
        gemm = any(op_class(op.op_type) is OpClass.GEMM for op, _ in readers)
        ladder = self.profile.tune_ladder["gemm" if gemm else "other"] + (("float",) if self.allow_float else ())
        allowed = [lv for lv in ladder if lv == "float" or self._allowed(lv, readers, bool(weights))]
        tied = self._tied_mode(gemms)
        levels = tuple(lv for lv in allowed if tied is None or TUNE_LEVELS[lv][1] in (None, tied))
        if len(levels) < len(allowed):  # (the tie left some out)
            self.tied[cal.name] = tied
        return Unit(cal.name, weights, levels, gemm) if levels else None

    def _tied_mode(self, gemms: list[OpRecord]) -> str | None:
        """The weight mode a repair fitted these GEMMs' weights at (:data:`~qir.passes.lib.repair.WEIGHT_TIED`;
        the first one's where several were), or None when none was fitted."""
        return next((self._tied_ops[op.name] for op in gemms if op.name in self._tied_ops), None)

    def _allowed(self, level: str, readers: list[tuple[OpRecord, int]], has_weights: bool) -> bool:
        act, weight = TUNE_LEVELS[level]
        p = self.profile
        for op, slot in readers:
            if act == "fp16":
                if p.fp16_support(op.op_type) != "native" and op.op_type not in p.fp16_documented_ops:
                    return False
            elif act not in p.allowed_act_dtypes(op.op_type, slot):
                return False
            if op_class(op.op_type) is OpClass.GEMM and slot == 0 and has_weights and weight is not None:
                if not p.allows_gemm(act, weight):
                    return False
        return not (weight == "int16" and not has_weights)  # dual int16 needs a weight to raise

    def searchable(self) -> list[int]:
        """Units with more than one level."""
        return [i for i, u in enumerate(self.units) if len(u.levels) > 1]

    # ------------------------------------------------------------------ configurations
    def plain_start(self) -> Config:
        """Every unit at its first level with its calibrated threshold."""
        return Config(tuple(0 for _ in self.units))

    def move(self, config: Config, levels: Mapping[int, int]) -> Config:
        """``config`` with units ``i`` at ``levels[i]``, each moved unit's threshold as
        :attr:`policy` says for its new mode (none there: the calibrated one)."""
        thresholds = {}
        for i, k in levels.items():
            u = self.units[i]
            thresholds[u.name] = self.policy.get((u.name, TUNE_LEVELS[u.levels[k]][0]))
        return config.with_levels(levels).with_thresholds(thresholds)

    def start(self) -> Config:
        """Every unit at its first level, with the thresholds of :attr:`policy`."""
        return self.move(self.plain_start(), {i: 0 for i in range(len(self.units))})

    def top_integer(self, i: int) -> int:
        """Unit ``i``'s last integer level (its level in the upper-bound configuration)."""
        levels = self.units[i].levels
        ints = [k for k, lv in enumerate(levels) if TUNE_LEVELS[lv][0] in ("int8", "int16")]
        return ints[-1] if ints else 0

    def upper(self) -> Config:
        """Every unit at its last integer level: the upper bound the guide checks first."""
        return self.move(self.start(), {i: self.top_integer(i) for i in range(len(self.units))})

    def ceiling(self) -> Config:
        """Every unit at its last level (fp16, float with ``allow_float``): the most this search can try."""
        return self.move(self.start(), {i: len(u.levels) - 1 for i, u in enumerate(self.units)})

    def cheap(self, base: Config, step: Config, share: float) -> list[int]:
        """Units whose raise from ``base`` to their level in ``step`` adds less than ``share`` of
        ``base``'s estimated time: ops whose bytes and arithmetic are next to nothing beside the
        rest (a squeeze-excite branch's 1x1 convolution on a 1x1 map, an Add the march fuses into
        the convolution before it); a wide elementwise op is not (its bytes double at int16)."""
        raised = [i for i in self.searchable() if step.levels[i] > base.levels[i]]
        added = self.added_costs(base, {i: step.levels[i] for i in raised})
        return [i for i in raised if added[i] < share * (self.cost(base) - self.overhead_us)]

    def level_named(self, config: Config, name: str) -> Config:
        """``config`` with every unit that has level ``name`` raised to it (none lowered)."""
        changes = {i: u.levels.index(name) for i, u in enumerate(self.units)
                   if name in u.levels and u.levels.index(name) > config.levels[i]}
        return self.move(config, changes)

    def modes(self, config: Config) -> dict[str, str]:
        """Activation and weight calibration nodes -> mode under ``config`` (units' nodes only)."""
        out: dict[str, str] = {}
        for u, k in zip(self.units, config.levels):
            act, weight = TUNE_LEVELS[u.levels[k]]
            out[u.name] = act
            for w in u.weights:
                out[w] = weight if weight is not None else "int8"
        return out

    def changes(self, config: Config) -> dict[str, str]:
        """Engine changes (modes, ``mode@threshold``) of ``config`` relative to :meth:`plain_start`."""
        start, modes = self.start_modes, self.modes(config)
        out = {n: m for n, m in modes.items() if m != start[n]}
        for name, threshold in config.thresholds:
            if CalibMode(modes[name]) in QRANGE:  # an fp16 or float node has no threshold
                out[name] = f"{modes[name]}@{threshold!r}"
        return out

    def apply(self, ir: QIR, config: Config) -> QIR:
        """``ir`` (changed in place) with every unit's nodes set to ``config``; returns it."""
        modes = self.modes(config)
        for name, mode in modes.items():
            ir.set_calibration(name, mode=CalibMode(mode))
        for name, threshold in config.thresholds:
            if CalibMode(modes[name]) in QRANGE:
                ir.set_calibration(name, threshold=np.float32(threshold), axis=None, fixed=True)
        return ir

    # ------------------------------------------------------------------ cost
    def _quantizers(self, op: OpRecord) -> tuple[str | None, ...]:
        """The calibration node read at each input of ``op`` (None: none there)."""
        names = tuple(rec.name if isinstance(rec := self.ir.producer(v), CalibRecord) else None
                      for v in op.inputs if v)
        return names if any(names) else ()

    def cost(self, config: Config) -> float:
        """What the search minimises: :meth:`time_us`, or :meth:`flop_cost` with ``price="flops"``."""
        return self.time_us(config) if self.price == "latency" else self.flop_cost(config)

    def time_us(self, config: Config) -> float:
        """The estimated time of ``config`` on the march, in µs (see the module docstring)."""
        time = self._times.get(config.levels)
        if time is None:
            modes = self.modes(config)
            time = self._times[config.levels] = (self.latency.time_us(self._plan.precisions(modes))
                                                 + self.latency.requantize_us(self._plan.requantizes(modes)))
        return time

    def estimate(self, config: Config) -> ModelCost:
        """The latency model's per-group estimate of ``config`` (what :meth:`cost` sums)."""
        return self.latency.estimate(self._plan.precisions(self.modes(config)))

    def cost_of_ir(self) -> float:
        """The estimated time of the IR as it is (its own calibration modes), in µs: how a model
        quantized elsewhere, imported, compares with the configurations of the search."""
        return self.latency.time_us(self._plan.precisions()) + self.latency.requantize_us(self._plan.requantizes())


    def flop_cost(self, config: Config) -> float:
        """The FLOP-weighted cost of ``config`` (the guide's proxy; see the module docstring)."""
        return self._flop_cost(self.modes(config))

    def flop_cost_of_ir(self) -> float:
        """The FLOP-weighted cost of the IR as it is (its own calibration modes)."""
        return self._flop_cost({})

    def added_costs(self, config: Config, levels: Mapping[int, int]) -> dict[int, float]:
        """Unit ``i`` -> the cost ``config`` gains when that unit alone moves to ``levels[i]``
        (negative: the cost it saves)."""
        cost = self.cost(config)
        return {i: self.cost(self.move(config, {i: k})) - cost for i, k in levels.items()}

    def _flop_cost(self, modes: Mapping[str, str]) -> float:
        costs = self.profile.tune_costs
        total = 0.0
        for op, flops, gemm, cals in self._ops:
            if not cals:  # nothing quantized: the op runs in float
                total += flops * costs["float x float" if gemm else "float"]
                continue
            got = [(modes.get(c) or self.ir.calibration(c).mode.value) if c else "float" for c in cals]
            if gemm and len(got) > 1:
                key = f"{got[0]} x {got[1]}"
                per = costs.get(key, max(costs.get(got[0], costs["float"]), costs.get(got[1], costs["float"])))
            else:
                per = max(costs.get(m, costs["float"]) for m, c in zip(got, cals) if c)
            total += flops * per
        return total

    def describe(self, config: Config) -> dict[str, int]:
        """How many units sit at each level."""
        counts: dict[str, int] = {}
        for u, k in zip(self.units, config.levels):
            counts[u.levels[k]] = counts.get(u.levels[k], 0) + 1
        return counts

    def raised(self, config: Config, than: Config | None = None) -> list[int]:
        """Units above their level in ``than`` (default: the start)."""
        than = than or self.plain_start()
        return [i for i, (a, b) in enumerate(zip(config.levels, than.levels)) if a > b]

    def names(self, indices: Iterable[int]) -> list[str]:
        return [self.units[i].name for i in indices]
