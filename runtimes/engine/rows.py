"""The batched-rows path (onnxruntime): variants run as the rows of batched segment calls.

Consecutive steps form segments of about equal FLOPs, each one cached session. A variant that
changes only activation calibration nodes runs as a row of a batch: the segment holding its
first change runs as one session in which the changed nodes are *switches*
(:mod:`qir.runtimes.ort.switches`) that each row turns on for itself, later segments as
sessions in the reference configuration (switches again where a row changes more nodes),
segments outside the cone not at all. Variants whose first change lies in the same segment
share calls, up to ``batch`` rows per call. They read a reference kept segment by segment.

Each switch session is checked once against the reference (no row switched: equal within 1e-6
of each value's magnitude, :func:`_close`; onnxruntime may fold an Add into a Conv across a
pass-through calibration node of the reference, which a switch keeps apart), and batched calls
against single ones (equal bit for bit, :func:`_equal`); what fails runs step by step
(:mod:`.steps`), one per call.
"""
from __future__ import annotations

import logging
from collections import Counter
from typing import Mapping, Sequence

import numpy as np

from qir.errors import ExecutionError
from qir.records import CalibRecord
from qir.runtimes.engine.plan import Plan
from qir.runtimes.engine.reference import ReferenceCache
from qir.runtimes.engine.runners import OrtSteps, part_key
from qir.runtimes.engine.variants import Variant, VariantRecords
from qir.runtimes.ort.switches import is_rows_input, rows_input

__all__ = ["Rows"]

logger = logging.getLogger(__name__)

Changes = Mapping[str, CalibRecord]


def _equal(got: Mapping[str, np.ndarray], expect: Mapping[str, np.ndarray]) -> bool:
    return all(np.array_equal(got[v], expect[v], equal_nan=True) for v in expect)


def _close(got: Mapping[str, np.ndarray], expect: Mapping[str, np.ndarray], rtol: float = 1e-6) -> bool:
    """Same shapes and NaN/Inf places, finite values within ``rtol`` of the largest |expected|
    (the engine's promise against a plain run: a fused op rounds differently, nothing more)."""
    for v, want in expect.items():
        have = got[v]
        if have.shape != want.shape:
            return False
        if want.dtype.kind != "f":
            if not np.array_equal(have, want):
                return False
            continue
        finite = np.isfinite(want)
        if not np.array_equal(finite, np.isfinite(have)) or not np.array_equal(have[~finite], want[~finite],
                                                                              equal_nan=True):
            return False
        if finite.any():
            scale = float(np.abs(want[finite]).max())
            if float(np.abs(have[finite].astype(np.float64) - want[finite]).max()) > rtol * scale:
                return False
    return True


class Rows:
    """Which variants run as rows and how (see the module docstring): the switches chosen
    (``switches``: segment -> switch node -> its target record), the parts checked, the
    segments whose switches failed their check (``distrusted``), and ``batch``, the most rows
    per call (it falls to 1 when a part cannot take a batch or a batch computes other values).
    On the numpy runtime (no parts) every variant goes step by step."""

    def __init__(self, plan: Plan, runner, ref: ReferenceCache, records: VariantRecords,
                 compare: Sequence[str], batch: int) -> None:
        self.plan, self.runner, self.ref, self.records = plan, runner, ref, records
        self.compare, self.batch = tuple(compare), batch
        self.enabled = isinstance(runner, OrtSteps)
        n = len(plan.steps)
        self.segment_of = np.zeros(n, np.int64)
        for k, (lo, hi) in enumerate(plan.segments):
            self.segment_of[lo:hi] = k
        self.last_segment = {v: int(self.segment_of[i]) for v, i in plan.last_reader.items()}
        self.switches: dict[int, dict[str, CalibRecord]] = {}
        self.checked: set[tuple] = set()  # switch parts checked against the reference
        self.distrusted: set[int] = set()  # segments whose switches failed their check

    # ------------------------------------------------------------------ routing
    def route(self, variants: Sequence[Variant]) -> tuple[list[tuple[Variant, dict[str, CalibRecord]]], list[Variant]]:
        """Split ``variants`` into rows of batched calls and step-by-step ones, after choosing the
        switches: each activation calibration node that variants change is a switch to the change
        (mode, or mode and threshold) most of them give it (none in a segment whose switches
        failed their check). A variant runs as a row when each of its changes is a switch to it."""
        if not self.enabled:
            return [], list(variants)
        parsed = [(v, self.records.changes(v)) for v in variants]
        wanted: dict[str, Counter] = {}
        for v, changes in parsed:
            if all(n in self.plan.step_of for n in changes):
                for n, change in v.items():
                    if n in changes:
                        wanted.setdefault(n, Counter())[change] += 1
        switches: dict[int, dict[str, CalibRecord]] = {}
        for n, modes in wanted.items():
            k = int(self.segment_of[self.plan.step_of[n]])
            if k not in self.distrusted:
                switches.setdefault(k, {})[n] = self.records.record(n, modes.most_common(1)[0][0])
        self.switches = switches
        batched = [(v, ch) for v, ch in parsed if self.switchable(ch)]
        rows = {v.name for v, _ in batched}
        return batched, [v for v in variants if v.name not in rows]

    def switchable(self, changes: Changes) -> bool:
        """True when every change is a switch to that mode (the variant can run as a row)."""
        if not self.enabled:
            return False
        for n, rec in changes.items():
            i = self.plan.step_of.get(n)
            if i is None or self.switches.get(int(self.segment_of[i]), {}).get(n) is not rec:
                return False
        return True

    def first_segment(self, changes: Changes) -> int:
        """The segment of the first change (past the last segment when there is none)."""
        return min((int(self.segment_of[self.plan.step_of[n]]) for n in changes), default=len(self.plan.segments))

    def jobs(self, batched: list[tuple[Variant, dict]], single: list[Variant]) -> list[list[tuple]]:
        """The calls to make: batched variants grouped by the segment of their first change (the
        largest cones first), at most ``batch`` per call; then the step-by-step ones, one each
        (as ``(variant, None)``)."""
        groups: dict[int, list] = {}
        for v, changes in batched:
            groups.setdefault(self.first_segment(changes), []).append((v, changes))
        jobs = [g[i:i + self.batch] for _, g in sorted(groups.items()) for i in range(0, len(g), self.batch)]
        return jobs + [[(v, None)] for v in single]

    # ------------------------------------------------------------------ execution
    def run(self, rows: list[Changes]) -> tuple[list[dict[str, np.ndarray]], int]:
        """Compared values of variants given by their ``changes`` (each change a switch), run as
        the rows of one batch on a segment-level reference: from the segment of the first
        change on, each segment the cone reaches runs once for all rows, as a switch part where
        a row changes one of its nodes. Returns the values per row and the segment calls made."""
        plan, batch = self.plan, len(rows)
        read = self.ref.reader()
        overlay: dict[str, np.ndarray] = {}
        tiled: dict[str, np.ndarray] = {}  # reference values repeated for every row

        def feed(v: str) -> np.ndarray:
            if v in overlay:
                return overlay[v]
            if batch == 1:
                return read(v)
            if v not in tiled:
                tiled[v] = np.repeat(read(v), batch, axis=0)
            return tiled[v]

        runs = 0
        for k in range(min(map(self.first_segment, rows)), len(plan.segments)):
            switched: dict[str, list[int]] = {}
            for r, changes in enumerate(rows):
                for n in changes:
                    if self.segment_of[plan.step_of[n]] == k:
                        switched.setdefault(n, []).append(r)
            part = self.runner.part(k, self.switches[k] if switched else None)
            if not switched and not any(v in overlay for v in part.inputs):
                continue  # outside every row's cone: the reference values stand
            feeds = {v: feed(v) for v in part.inputs}
            for n in part.switches:
                feeds[rows_input(n)] = np.array(switched.get(n, ()), np.int64).reshape(-1, 1)
            overlay.update(self.runner.run(part.session, part.outputs, feeds))
            runs += 1
            for held in (overlay, tiled):  # free what no later segment reads
                for v in [v for v in held if self.last_segment.get(v, -1) <= k and v not in self.compare]:
                    del held[v]
        values = [{v: (overlay[v][r:r + 1] if batch > 1 else overlay[v]) if v in overlay else read(v)
                   for v in self.compare} for r in range(batch)]
        return values, runs

    # ------------------------------------------------------------------ parts
    def part_keys(self) -> list[tuple[int, dict[str, CalibRecord] | None]]:
        """``(segment, switches)`` of every part the batched variants use: each segment in the
        reference configuration, and each segment holding switches with them."""
        return [(k, None) for k in range(len(self.plan.segments))] + sorted(self.switches.items())

    def build_parts(self, pool) -> None:
        """Build every segment session the batched variants use (each segment in the reference
        configuration, and with its switches), ``threads`` at a time. When a segment cannot
        take a batch, ``batch`` falls to 1."""
        if not self.enabled:
            return
        keys = self.part_keys()
        parts = list(pool.map(lambda key: self.runner.part(*key), keys) if pool
                     else (self.runner.part(*key) for key in keys))
        if self.batch > 1 and not all(p.batched for p in parts):
            logger.info("a segment cannot take a batch (a value crossing it has no leading 1): "
                        "one variant per call")
            self.batch = 1

    def check_parts(self, pool) -> bool:
        """Check each part once, on the current sample's segment-level reference: a switch part
        with no row switched must compute the reference (:func:`_close`), and with batches every
        row of a run on two copies of the inputs must equal the single run bit for bit. A switch
        part that fails is not used (its segment's variants run step by step; returns True); a
        failed batch check sets ``batch`` to 1."""
        if not self.enabled:
            return False
        todo = [key for key in self.part_keys() if part_key(*key) not in self.checked]
        if not todo:
            return False
        check = self._checker()
        failed = False
        for (k, switches), (same, batch_ok) in zip(todo, pool.map(check, todo) if pool else map(check, todo)):
            self.checked.add(part_key(k, switches))
            if not same:
                logger.info("segment %d computes other values as one part; its variants run step by step", k)
                self.distrusted.add(k)
                failed = True
            if not batch_ok and self.batch > 1:
                logger.info("segment %d computes other values in a batch: one variant per call", k)
                self.batch = 1
        return failed

    def _checker(self):
        """``check((segment, switches))``: whether that part with no row switched computes the
        reference, and whether it computes the same in a batch (at the current ``batch``)."""
        read = self.ref.reader()
        batch = self.batch

        def check(key) -> tuple[bool, bool]:
            k, switches = key
            part = self.runner.part(k, switches)
            feeds = {v: read(v) for v in part.inputs}
            feeds |= {rows_input(n): np.zeros((0, 1), np.int64) for n in part.switches}
            if switches is None and batch == 1:
                return True, True  # the reference part: what the reference ran
            single = self.runner.run(part.session, part.outputs, feeds)
            same = switches is None or _close(single, {v: read(v) for v in part.outputs})
            if batch == 1:
                return same, True
            try:
                got = self.runner.run(part.session, part.outputs, {
                    v: a if is_rows_input(v) else np.repeat(a, 2, axis=0) for v, a in feeds.items()})
            except ExecutionError:
                return same, False
            return same, all(_equal({v: a[r:r + 1] for v, a in got.items()}, single) for r in (0, 1))

        return check
