"""``tune``: from an accuracy target to the cheapest verified int8 / int16 / fp16 configuration a
march allows (the mixed-precision pipelines of Horizon's Quantization Accuracy Tuning Guide, automated).

The pipeline is the march profile's data (``tune_ladder``: the levels each activation
calibration node may take, cheapest first; ``tune_costs``: their cost per FLOP), never a branch
on the march name; the pieces are in the modules of this package. The target (``"cosine>=0.99"``, a
metric against the float model, or a task metric; :mod:`.target`) is met by the *mean*
over the **evaluation** samples, never the calibration ones; the worst sample is reported too.

1. **Bounds.** One engine call scores the start configuration (every unit at its first level:
   all-int8 on nash-e/m; GEMM inputs int8 and every other op fp16 on nash-p) and the upper bound
   (every unit at its last integer level: all-int16, dual int16 where the profile allows it),
   each also with every clipping fix, and the start with each clipping fix alone; the ceiling
   (every unit at its last level: fp16, float with ``allow_float``) only when the upper bound
   misses the target (it is then the reference, step 3; the report shows it where measured).
2. **Clipping** (:mod:`.clip`): a fixed threshold covering the data, where the
   calibrated range clips it (the advisor's rule), is kept where it measurably helps, before any
   precision is raised. If the start then meets the target, nothing is raised. If neither the
   upper bound nor the ceiling meets it, the target is unreachable: the pass stops with the best
   configuration found and says so (``reached`` false).
3. **Reference**: the configuration the search works down from, the upper bound when it meets
   the target (so a unit may be raised to any integer level, dual int16 included), else the
   ceiling. **Cheap units**: a unit whose raise to its reference level adds less than
   :data:`CHEAP_SHARE` of the start's cost (an Add or a Mul beside the convolutions, a
   squeeze-excite branch's 1x1 convolution) is raised with no search: no ranking or search
   step could save anything worth its time there (on PP-OCRv4 det under the latency price, 38
   units, 0.4% of the start's cost together; none on the ViT-S). The start with them raised is
   the floor of steps 4 and 5; pruning (step 6) measures them as it does every raise and takes
   back those the target does not need (on PP-OCRv4 det, with step 7's retry pruned too: 66 -> 50
   units raised, 109 -> 76 calibration nodes at 16 bit, 3.934 -> 3.898 ms).
   **Sensitivity**: each other unit is lowered alone from the reference to its start level; the
   loss, each sample's change counted as a loss (step 6 says why: a unit whose lowering happens
   to help the bad cases must not rank last), on every evaluation sample (or, with
   ``sensitivity_samples``, on the few the reference scores worst: a ranking only orders a
   search, which measures every step on all samples; ``"auto"``: in rounds,
   :func:`.ranking.rank_in_rounds`, on the four the reference scores worst, and on the others
   too only when the units the search likely needs, :func:`.ranking.needed`, are not a settled
   set there; on PP-OCRv4 det they are not, and the second round makes it cost more).
4. **Ratio search** (:func:`.search.ratio_search`): the guide's binary search on the
   share of units raised to their reference level, from the floor, in order of loss per cost
   added (:func:`.search.by_loss_per_cost`, AIMET's Pareto order: a large convolution
   that loses a little more than a small one is raised after it). Steps 4 to 6 judge every
   configuration below the reference by the reference's score less each sample's change.
5. **Greedy refinement with lazy re-scoring** (:func:`.search.greedy`): from the largest
   failing configuration of the ratio search, the moves (one unit one level up, to at most its
   reference level) with the best gain per cost, re-measured a few at a time. That configuration
   is one unit short of the one that meets, so :data:`GREEDY_ROUNDS_PAST_RATIO` rounds look for
   a cheaper way past it.
6. **Backward pruning** (:func:`.search.prune`): each raised unit back down while the
   target holds, a lowered configuration counting each sample's change, up or down, as a loss
   (:func:`.search.changes_as_losses`: a lowering that improves a sample does so by
   chance, and chance of that size can as well lower an unseen image; luck on a few samples must
   not pay for losses elsewhere).
   Unknown and stale single losses are estimated on the bad cases first (the screen), on every sample
   only when that proves too hopeful.
7. **Verification** (:mod:`.verify`): the result emitted, re-imported and run in
   onnxruntime on the evaluation data, and at the march's integer level (``integer``); it must
   meet the target in both and agree with the search. When only the integer level misses, the
   result with one unit of pruning's last step raised back (:data:`BACKTRACK_SINGLES`), then the
   configurations pruning went through just before the result (:data:`BACKTRACK_STEPS`) are
   verified first, and the cheapest that passes is the result (the result's integer level and
   theirs run the samples fake quantization scores worst first and stop at the first that misses
   a floor, which settles it; the result's runs in full once nothing replaces it); failing that,
   the ratio search goes on from the result, on the units it left lower (then pruning, down to
   the result at most), for the target tightened by the gap between the two
   (:data:`INTEGER_GAP_FACTOR`; the mean's threshold by the mean's gap, a floor by the worst
   sample's), at most :data:`INTEGER_RETRIES` times; the report names that ``search_target``;
   failing that (a tightened target beyond the bounds, or no retry that passes), or first when the
   start met the target (no search order: a retry would raise units in graph order), a search at
   the integer level itself from the first result (:mod:`.integer_repair`:
   the units it left below their reference level, ranked and raised by what they gain there),
   verified the same way. The retries come first because they are cheap (a fake-quant search
   from the result) where the search at the integer level runs every unit there: on PP-OCRv4 det
   the repair took about 65 CPU s and found nothing the retry did not. A result that misses in
   onnxruntime by a hair (the search met the target; :func:`.integer_repair.onnxruntime_gaps`) is
   raised further the same way.
8. **Attribution**: each change of the verified result undone alone (the cheap units together),
   on the evaluation samples it scores worst; the loss is its measured gain. Each change's reason is
   ``clipping`` (a fixed threshold), ``cheap``, ``rounding`` (raised by the ratio search),
   ``interaction`` (added by the greedy refinement: its single sensitivity did not rank it) or
   ``integer level`` (raised by the search at the integer level, step 7).

The pass sets the IR's calibration nodes to the result (a transform) and reports everything:
the target, the bounds, every configuration tried (stage, FLOP-weighted cost, mean, worst
sample), the changes with their reasons and gains, the cost against all-int8 and all-int16, the
verification, and the emitted ``model`` (a ``ModelProto``; :mod:`qir.tools.tune` writes the files).
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import replace
from typing import Any, MutableMapping, Sequence

from qir.data import model_samples
from qir.errors import InputError
from qir.execution import Level, Runtime
from qir.graph import QIR
from qir.passes.base import Pass, PassResult, register_pass
from qir.passes.layer_compare import CLIP_SQNR_DB
from qir.passes.lib.latency_table import LatencyTable
from qir.passes.tune.clip import clipping_fixes
from qir.passes.tune.evaluator import Evaluator
from qir.passes.tune.integer_repair import integer_gaps, integer_repair, onnxruntime_gaps
from qir.passes.tune.ranking import rank_in_rounds, rank_units
from qir.passes.tune.report import summarize
from qir.passes.tune.samples import checked_samples
from qir.passes.tune.search import by_loss_per_cost, changes_as_losses, greedy, per_image_loss, prune, ratio_search
from qir.passes.tune.space import DEFAULT_PRICE, PRICES, Config, Space, constrained_splits
from qir.passes.tune.state import TuneState
from qir.passes.tune.target import Score, parse_target
from qir.passes.tune.transforms import DEFAULT_TRANSFORMS, choose_transforms
from qir.passes.tune.verify import Verification, check_unseen, float_outputs, verify
from qir.runtimes.march import get_profile
from qir.runtimes.ort.backend import thread_limit
from qir.runtimes.progress import task
from qir.split import merge_calibrations, siblings, split_calibration

__all__ = ["TunePass", "checked_samples"]

logger = logging.getLogger(__name__)

#: Searches again, for a target tightened by the gap, when only the integer level misses it.
INTEGER_RETRIES = 2
#: The target is tightened by this many times the integer level's gap. The gap is measured on one
#: configuration and moves with the next (on PP-OCRv4 det nash-p, 0.0008 lower, then 0.0001
#: higher); each retry only goes on from the result, so another one is cheap, and more than the
#: gap (1.5x) raised 13 more GEMM inputs to dual int16 there.
INTEGER_GAP_FACTOR = 1.0
#: A unit whose raise to its reference level adds less than this share of the start's cost is
#: cheap: raised with no search (step 3).
CHEAP_SHARE = 1e-3
#: The report's gains are measured on this many evaluation samples, those the result scores worst
#: (a report, not a search step: on every sample they would take as long as the sensitivity).
ATTRIBUTION_SAMPLES = 2
#: Pruning estimates single losses on this many of the samples a configuration scores worst
#: first (its screen), when the ranking ran on every sample.
SCREEN_SAMPLES = 2
#: When the result misses only at the integer level, this many configurations pruning went
#: through before it are verified first (cheapest first), before any search for a tighter target.
#: The integer level's gap moves from one configuration to the next (on PP-OCRv4 det with a floor
#: of 0.98, the configurations one pruning run met the target with, in order: the worst image at
#: the integer level fails, fails, passes, passes, fails, passes, passes, fails at the result).
#: There one step back met the target at 0.665x all-int16 (unseen images: mean 0.9951, worst
#: 0.9899), where raising further for the tightened target had ended at 0.714x.
BACKTRACK_STEPS = 2
#: Before those, the result with one of the units pruning's last step lowered raised back alone:
#: the this-many that leave it cheapest, each verified only if it meets the target as pruning
#: counts a configuration lowered from the one before the step. A step lowers several units at
#: once, and the integer level's miss may come from one: on PP-OCRv4 det with a floor of 0.98, the
#: last step lowered two; with one of them back the result passed at 0.662x all-int16 (unseen
#: images: mean 0.9948, worst 0.9895), where the whole step back cost 0.665x.
BACKTRACK_SINGLES = 2
#: Greedy rounds past the ratio search's last failing configuration, when the next one meets.
GREEDY_ROUNDS_PAST_RATIO = 1

STAGES = ("bounds", "reference", "sensitivity", "ratio search", "greedy", "pruning", "verification")


@register_pass
class TunePass(Pass):
    """Tune the calibrated IR to the cheapest configuration that meets ``target`` on ``eval_data``
    (see the module docstring).

    Options: ``calib_data`` (where the clipping fixes are looked for; none without it),
    ``march``, ``allow_float`` (float32, the CPU, as the last level), ``eval_num`` (use at most
    that many evaluation samples), ``runtime`` / ``threads`` (the engine's), ``points`` (ratio
    values per search call, default 1: a bisection; they run whole, one after another, so more per
    call only measures ratios the next bracket drops: on PP-OCRv4 det 2 a call took 7 whole runs
    to the ratio 1 found in 6), ``batch`` (moves re-measured per greedy round: past the ratio
    search, the cheapest that meets was among the best four on PP-OCRv4 det), ``max_rounds`` (of
    the greedy refinement and of pruning each: they refine a configuration the ratio search found),
    ``sensitivity_samples`` (the ranking runs on that many of the worst evaluation samples, as
    hmct ranks on one sample and QuantAnalysis on a bad case; None, the default: all of them;
    ``"auto"``: in rounds, step 3. On PP-OCRv4 det a ranking on the 2 worst left the stem's
    output at int8, which cost an unseen image 0.06),
    ``verify``, ``integer`` (also run the result at the march's integer level), ``check_data``
    (samples the search never sees: the verified result is run on them too and the report says
    whether it holds there, :func:`.verify.check_unseen`), ``store`` (a
    mapping keeping every score, for resuming), ``progress``, ``latency_table`` (measured times
    that replace the latency model's where they match: :mod:`qir.passes.lib.latency_table`),
    ``transforms`` (the repair transforms tried first, :mod:`.transforms`; None: none), ``split``
    (a precision per consumer: a calibration node one reader keeps at int8 while another could go
    to int16 is split for the search, :func:`.space.constrained_splits`; copies that end where
    their node does are merged back, so the result keeps only the requantizes it needs), ``price``
    (what the search minimises: ``"latency"``, the estimated time, the default, or ``"flops"``, the
    FLOP-weighted cost: :data:`.space.DEFAULT_PRICE` says why; the report gives both).
    """

    name = "tune"

    def __init__(self, target: Any, eval_data: Any, *, calib_data: Any = None, march: str = "nash-e",
                 allow_float: bool = False, eval_num: int | None = None, runtime: str = Runtime.ORT,
                 threads: int | None = None, points: int = 1, batch: int = 4, max_rounds: int = 12,
                 sensitivity_samples: int | str | None = None, verify: bool = True, integer: bool = True,
                 check_data: Any = None, store: MutableMapping[str, Any] | None = None, progress: bool = True,
                 latency_table: LatencyTable | None = None,
                 transforms: Sequence[str] | None = DEFAULT_TRANSFORMS, split: bool = True,
                 price: str = DEFAULT_PRICE) -> None:
        self.target = parse_target(target)
        self.profile = get_profile(march)
        if sensitivity_samples not in (None, "auto") and not (isinstance(sensitivity_samples, int) and sensitivity_samples > 0):
            raise InputError(f"sensitivity_samples must be a positive number or 'auto', got {sensitivity_samples!r}")
        if points < 1 or batch < 1 or max_rounds < 1:
            raise InputError("points, batch and max_rounds must each be at least 1")
        self.eval_data, self.calib_data, self.allow_float, self.eval_num = eval_data, calib_data, allow_float, eval_num
        self.runtime, self.threads, self.points, self.batch, self.max_rounds = runtime, threads, points, batch, max_rounds
        self.verify, self.integer, self.store, self.progress = verify, integer, store, progress
        self.sensitivity_samples, self.check_data, self.latency_table = sensitivity_samples, check_data, latency_table
        self.transforms = tuple(transforms or ())
        self.split, self.price = split, price
        if price not in PRICES:
            raise InputError(f"unknown price {price!r}; choose one of {', '.join(PRICES)}")
        self.options = {"target": self.target.text, "march": self.profile.name, "allow_float": allow_float}
        self._floats: list[dict] | None = None  # the float model's outputs on the evaluation data, once verified
        self._original: QIR | None = None  # the model as given, when the transforms replaced it (the float reference)
        self.transformed: QIR | None = None

    # ------------------------------------------------------------------ run
    def run(self, ir: QIR) -> PassResult:
        with thread_limit(self.threads):  # (``threads`` for every session, the transforms' and calibration's too)
            return self._run(ir)

    def _run(self, ir: QIR) -> PassResult:
        start = time.perf_counter()
        if not ir.calibrations():
            raise InputError(f"{ir.name!r} has no calibration nodes; calibrate it first (qir calibrate), or give "
                             "qir tune the float model and calibration data")
        self.target.compared(ir)  # (a value the target names that the model lacks: one error before any work)
        samples = checked_samples(ir, self.eval_data, self.eval_num)
        self._floats = None
        stage, reference, splits = self._prepare(ir, samples)
        space = self._space(ir)
        base = space.apply(ir.clone(), space.start())
        self._original = reference
        ev = Evaluator(base, space, self.target, samples, store=self.store, progress=self.progress,
                       runtime=self.runtime, threads=self.threads, reference=reference)
        found = checked = None
        first: TuneState | None = None  # (the first result, when it missed at the integer level only)
        try:
            for attempt in range(1 + INTEGER_RETRIES):
                stages = task("tune", len(STAGES) if not attempt else 2, unit="stages", enabled=self.progress)
                previous = (found, checked)
                found = self._search(ev, space, base, stages) if not attempt else self._raise_further(ev, space, found)
                found.search_target = ev.target
                if attempt and not found.reached:  # the tightened target is out of reach: keep what was verified
                    stages.close()
                    found, checked = previous
                    break
                if attempt:
                    stages.update(1)
                found.score, checked = self._verified(ev, space, ir, samples, found.final, quick=not attempt)
                stages.update(1)
                stages.close()
                back = None  # (gaps: it missed at the integer level only; their size needs every sample)
                if found.reached and not attempt and integer_gaps(self.target, checked) is not None:
                    first, back = found, self._backtrack(ev, space, ir, samples, found)
                if back is not None:
                    found, checked = back
                    break
                if checked and checked.get(Level.INTEGER) and not checked[Level.INTEGER]["complete"]:  # (stopped early)
                    found.score, checked = self._verified(ev, space, ir, samples, found.final)
                gaps = integer_gaps(self.target, checked)
                where = f"at {self.profile.name}'s integer level"
                if gaps is None and (gaps := onnxruntime_gaps(self.target, checked, found.score)) is not None:
                    where = "in onnxruntime"
                if first is not None and first.integer_repair is None and found.order is None:  # (no order to retry in)
                    found, checked = self._integer_repair(ev, space, ir, samples, first, (found, checked))
                    gaps = None if checked["agrees"] else gaps
                if not found.reached or gaps is None or attempt == INTEGER_RETRIES:
                    break
                tighter = ev.target.tightened(*(INTEGER_GAP_FACTOR * g for g in gaps))
                if not tighter.met(ev.memo[found.upper]):
                    ev.score([found.ceiling], "bounds")  # (not needed until now)
                if not any(tighter.met(ev.memo[c]) for c in (found.upper, found.ceiling)):
                    break  # beyond every bound: the integer level loses more than any configuration can make up
                logger.info("tune: the result meets %s in the search but not %s (%.6g lower on the mean, %.6g on the "
                            "worst sample): raising it further for %s", ev.target.text, where, *gaps, tighter.text)
                ev.target = tighter
            ev.target = self.target
            if first is not None and first.integer_repair is None and integer_gaps(self.target, checked) is not None:
                found, checked = self._integer_repair(ev, space, ir, samples, first, (found, checked))  # (no retry did)
            self._attribute(ev, space, found)
        finally:
            ev.close()
        space.apply(ir, found.final)
        merged = merge_calibrations(ir)  # (copies that ended where their node did need no requantize)
        report = self._report(ev, found, checked, ir, reference, stage, splits, merged)
        report.seconds = round(time.perf_counter() - start, 2)
        return PassResult(ir, True, report)

    def _report(self, ev: Evaluator, found: TuneState, checked: Verification | None, ir: QIR, reference: QIR | None,
                stage, splits: dict, merged: list[str]):
        """The pass's report of ``found`` (``ir``: the result; ``reference``: the model as given,
        when a transform replaced it), with what the stages and the verification recorded."""
        report = summarize(ev, found, self.profile, self.allow_float)
        if stage is not None:
            report.transforms = stage.to_json()
        if splits:
            report.split = {"values": sorted(splits), "kept": sorted(siblings(ir)), "merged_back": sorted(merged)}
        if found.search_target != self.target:
            report.search_target = found.search_target.text
        if found.backtracked:
            report.backtracked = found.backtracked
        if found.integer_repair is not None:
            report.integer_repair = found.integer_repair.to_json(self.target)
        if checked is not None:
            report.verification = checked
            if self.check_data is not None:
                unseen = checked_samples(ir, self.check_data, what="the check data")
                report.unseen = check_unseen(reference or ir, checked.model, unseen, self.target, threads=self.threads)
        return report

    def _prepare(self, ir: QIR, samples: list[dict]):
        """Step 0 on ``ir`` (changed in place): the transforms stage (:mod:`.transforms`), then the
        splits per consumer. Returns ``(stage or None, the model as given when a transform was
        kept: the float reference, or None, {split node: its reader groups})``."""
        stage = reference = None
        if self.transforms and self.calib_data is not None:  # better int8 before any precision
            model, stage = choose_transforms(ir, self.calib_data, samples, self.target, march=self.profile.name,
                                             space_of=self._space, candidates=self.transforms, runtime=self.runtime,
                                             progress=self.progress)
            if model is not ir:
                reference = ir.clone()  # (scores stay against the float model as given)
                ir.assign(model)  # (the search, and the result, are the transformed model)
            self._floats = stage.floats  # (the model as given, run as float: what verification compares with)
        splits = constrained_splits(ir, self.profile) if self.split else {}
        for name, groups in splits.items():  # a precision per consumer where a reader's constraint binds the rest
            split_calibration(ir, name, groups)
        #: The model the precision search started from, when it is not the one given (a transform
        #: kept, or a value split); None otherwise.
        self.transformed = ir.clone() if (stage is not None and stage.chosen) or splits else None
        return stage, reference, splits

    def _space(self, ir: QIR) -> Space:
        return Space(ir, self.profile, allow_float=self.allow_float, latency_table=self.latency_table, price=self.price)

    # ------------------------------------------------------------------ the stages
    def _search(self, ev: Evaluator, space: Space, base: QIR, stages) -> TuneState:
        found = self._bounds(ev, space, base)
        stages.update(1)
        if found.reached is not None:  # the start meets the target, or nothing can
            stages.update(5)
            if found.reached:
                self._trim_thresholds(ev, space, found)
            return found
        reference = found.reference = self._reference(ev, found)
        cheap = space.cheap(found.start, reference, CHEAP_SHARE)
        floor = space.move(found.start, {i: reference.levels[i] for i in cheap})
        found.cheap = cheap
        stages.update(1)
        loss = self._sensitivity(ev, space, reference, found)
        stages.update(1)
        order = by_loss_per_cost(space, floor, reference.levels, loss)
        counted = self._counted(ev, reference)
        if ev.target.met(counted(ev.score([floor], "ratio search")[0])):
            met = below = floor  # the cheap raises alone meet it
        else:
            met, below, _ = ratio_search(ev, floor, order, {i: reference.levels[i] for i in order},
                                         points=self.points, counted=counted, parent=ev.memo[reference])
        found.order, found.loss, found.ratio_config = order, loss, (met if met is not None else below)
        stages.update(1)
        # a cheaper way past the last failing ratio, with moves up to the level each unit has in the reference;
        # that ratio is one unit short of the one that meets, so a cheaper way is one move: more rounds only cost
        # time (each measures `batch` moves on every sample; on PP-OCRv4 det a second round found nothing in 17 s)
        rounds = min(self.max_rounds, GREEDY_ROUNDS_PAST_RATIO) if met is not None else self.max_rounds
        refined = greedy(ev, below, loss, batch=self.batch, max_rounds=rounds, counted=counted,
                         allowed=lambda i, k: k <= reference.levels[i], budget=space.cost(met) if met else math.inf)
        meeting = [c for c in (met, refined) if c is not None and ev.target.met(counted(ev.memo[c]))]
        stages.update(1)
        if not meeting:  # the greedy refinement did not get there (it stops at its rounds)
            meeting = [reference]
        best = min(meeting, key=space.cost)
        # a unit's sensitivity is its loss down to the start level: an estimate of its loss one level down
        # only where that is the start level (dual int16 goes down to int16 first, and loses far less)
        prior = {i: v for i, v in loss.items() if best.levels[i] - 1 == floor.levels[i]}
        found.path = [(best, counted(ev.memo[best]))]  # what pruning went through, each meeting the target as it counts
        found.final = prune(ev, best, found.start, prior=prior, counted=counted, max_rounds=self.max_rounds,
                               screen=self._screen(ev), path=found.path)
        found.reached = True
        stages.update(1)
        self._trim_thresholds(ev, space, found)
        return found

    def _verified(self, ev: Evaluator, space: Space, ir: QIR, samples: list[dict], config: Config,
                  quick: bool = False) -> tuple[Score, Verification | None]:
        """``config``'s score in the search and its verification (step 7; None without ``verify``);
        ``quick``: the integer level stops at the first sample that misses the floor (what
        backtracking needs to know; the numbers over every sample then need another call)."""
        score = ev.score([config], "verification")[0]
        if not self.verify:
            return score, None
        tuned = space.apply(ir.clone(), config)
        merge_calibrations(tuned)
        if self._floats is None:  # (the float model's outputs: the same for every configuration verified)
            self._floats = float_outputs(self._original or tuned, samples, self.target.values)
        checked = verify(tuned, samples, self.target, score.mean, threads=self.threads, floats=self._floats,
                         march=self.profile.name if self.integer else None, stop_at_floor=quick)
        return score, checked

    def _backtrack(self, ev: Evaluator, space: Space, ir: QIR, samples: list[dict],
                   found: TuneState) -> tuple[TuneState, Verification] | None:
        """Step 7's first answer to a miss at the integer level only: configurations between the
        result and those pruning went through before it, each meeting the target in fake
        quantization, verified as the result was, cheapest first; the first that passes both
        levels, as ``(found, verification)`` (``found.backtracked``: ``steps`` back along
        pruning's path, the units ``raised_back`` to where that step found them); None when none
        does. First the result with one unit of pruning's last step raised back (the
        :data:`BACKTRACK_SINGLES` cheapest), then the last :data:`BACKTRACK_STEPS` configurations
        of the path."""
        final = found.final
        previous = [(c, now) for c, now in reversed(found.path[:-1]) if c != final][:BACKTRACK_STEPS]
        tried = [(f"the configuration pruning reached {k} step(s) before it", c, {"steps": k, "raised_back": []})
                 for k, (c, _) in enumerate(previous, 1)]
        if previous:
            last, counted = previous[0]  # (the last step lowered `moved` from there)
            moved = [i for i, (a, b) in enumerate(zip(final.levels, last.levels)) if a != b]
            singles = sorted(((space.move(final, {i: last.levels[i]}), space.units[i].name) for i in moved),
                             key=lambda x: space.cost(x[0]))[:BACKTRACK_SINGLES] if len(moved) > 1 else []
            tried[:0] = [(f"the result with {name} raised back", c, {"steps": 0, "raised_back": [name]})
                         for c, name in singles]
        for what, config, backtracked in tried:
            if backtracked["raised_back"] and not ev.target.met(
                    changes_as_losses(ev.target, ev.memo[last], ev.score([config], "backtracking", final)[0], counted)):
                continue  # (lowered from `last`, it misses the target as pruning counts: not tried)
            score, checked = self._verified(ev, space, ir, samples, config, quick=True)
            if checked["agrees"]:
                logger.info("tune: the result misses %s at %s's integer level; %s meets it there", self.target.text,
                            self.profile.name, what)
                return replace(found, final=config, score=score, backtracked=backtracked), checked
        return None

    def _integer_repair(self, ev: Evaluator, space: Space, ir: QIR, samples: list[dict], found: TuneState,
                        kept: tuple[TuneState, Verification]) -> tuple[TuneState, Verification]:
        """Step 7's last answer (:mod:`.integer_repair`): the cheapest raise from ``found`` (the
        first result) that meets the target searched at the integer level, verified; ``kept``
        (what the retries ended with, the repair's record added) when none is found or it fails
        verification."""
        repair = integer_repair(ev, space, found, march=self.profile.name, progress=self.progress)
        if repair.config is not None and repair.config != found.final:
            score, checked = self._verified(ev, space, ir, samples, repair.config)
            if checked["agrees"]:
                found.integer_repair = repair
                return replace(found, final=repair.config, score=score), checked
            integer = checked.get(Level.INTEGER) or {}  # (what the report says of the raises that did not hold)
            repair = replace(repair, failed_verification={"onnxruntime": (checked["mean"], checked["worst"]),
                                                          Level.INTEGER: (integer.get("mean"), integer.get("worst"))})
        found.integer_repair = kept[0].integer_repair = repair
        return kept

    def _raise_further(self, ev: Evaluator, space: Space, found: TuneState) -> TuneState:
        """Step 7's retry: the ratio search again, from the result that missed at the integer level,
        on the units it left below their reference level (the cheap units pruning lowered first,
        as raising them back costs almost nothing; then the search's order), for the tightened
        target (``ev.target``), from one raise upward (the gap is small: few raises likely make it
        up), then pruned towards that result (it raises a prefix of its order: on PP-OCRv4 det 29 units,
        pruned to 4; 76 calibration nodes at 16 bit instead of 109); ``reached`` false when all miss."""
        found = replace(found)
        reference = found.reference or self._reference(ev, found)
        final = found.final
        below = [i for i in found.cheap if final.levels[i] < reference.levels[i]]
        order = below + [i for i in found.order or space.searchable()
                         if final.levels[i] < reference.levels[i] and i not in below]
        counted = self._counted(ev, reference)
        met, _, _ = ratio_search(ev, final, order, {i: reference.levels[i] for i in order}, points=self.points,
                                 counted=counted, upward=True, parent=ev.memo[reference]) \
            if order else (None, None, None)
        if met is not None:  # (the search raised a prefix of the order: those it does not need go back,
            pruned = prune(ev, met, final, counted=counted, max_rounds=self.max_rounds, screen=self._screen(ev))
            met = pruned if space.raised(pruned, final) else met  # but not all: the result itself missed)
        found.reached = met is not None
        found.final = met if met is not None else final
        return found

    def _counted(self, ev: Evaluator, reference: Config):
        """How a configuration below ``reference`` counts against the target: the reference's score
        less each sample's change (:func:`.search.changes_as_losses`)."""
        def counted(score: Score) -> Score:
            return changes_as_losses(ev.target, ev.memo[reference], score)
        return counted

    def _bounds(self, ev: Evaluator, space: Space, base: QIR) -> TuneState:
        """Steps 1 and 2 of the module docstring: the clipping fixes, measured, and the bounds."""
        fixes = []
        if self.calib_data is not None:
            fixes = clipping_fixes(base, [u.name for u in space.units], model_samples(base, self.calib_data),
                                   limit_db=CLIP_SQNR_DB, progress=self.progress)
        at16 = {f["node"]: f["threshold"] for f in fixes if f["better"]["int16"]}
        at8 = {f["node"]: f["threshold"] for f in fixes if f["better"]["int8"]}
        plain = space.plain_start()
        int16_plain = space.level_named(plain, "int16")
        space.policy = {(n, "int16"): t for n, t in at16.items()}
        singles = [plain.with_thresholds({n: t}) for n, t in at8.items()]
        tried = [plain, int16_plain, space.level_named(plain, "int16"), plain.with_thresholds(at8)]
        ev.score(tried + singles, ["bounds"] * len(tried) + ["clipping"] * len(singles))
        if ev.target.gain(ev.memo[tried[2]], ev.memo[int16_plain]) < 0:
            space.policy = {}  # the covering thresholds do not help at int16 after all
        helped = {n: t for (n, t), x in zip(at8.items(), singles) if ev.target.gain(ev.memo[x], ev.memo[plain]) > 0}
        options = [plain, plain.with_thresholds(helped), plain.with_thresholds(at8)]
        ev.score(options, "clipping")
        chosen = max(options, key=lambda x: (ev.target.gain(ev.memo[x], ev.memo[plain]), -len(x.thresholds)))
        space.policy.update({(n, "int8"): t for n, t in chosen.thresholds})
        start, int16, upper, ceiling = space.start(), space.level_named(space.start(), "int16"), space.upper(), space.ceiling()
        ev.score([start, int16, upper], "bounds")
        bound = max((int16, upper), key=lambda x: ev.target.standing(ev.memo[x]))
        if not ev.met(bound):  # the ceiling matters only where no integer level reaches the target
            ev.score([ceiling], "bounds")
        for f in fixes:
            f["kept"] = [m for m in ("int8", "int16") if (f["node"], m) in space.policy]
        reached = True if ev.met(start) else (None if ev.met(bound) or ev.met(ceiling) else False)
        best = max(ev.memo, key=lambda x: ev.target.standing(ev.memo[x]))
        shown = [ev.target.shown(ev.memo[x]) if x in ev.memo else "not needed" for x in (start, int16, upper, ceiling)]
        logger.info("tune: start %s %s, all-int16 %s, upper bound %s, ceiling %s; clipping fixes kept: %d at "
                    "int8, %d at int16, of %d", ev.target.text, *shown, len(chosen.thresholds),
                    sum(m == "int16" for _, m in space.policy), len(fixes))
        return TuneState(start=start, plain_start=plain, int16=int16, upper=bound, ceiling=ceiling, fixes=fixes,
                         reached=reached, final=start if reached else best)

    @staticmethod
    def _reference(ev: Evaluator, found: TuneState) -> Config:
        """Step 3's reference: the upper bound when it meets the target (the search may then raise a
        unit to any integer level, dual int16 included), else the ceiling."""
        return found.upper if ev.met(found.upper) else found.ceiling

    @staticmethod
    def _bad_cases(ev: Evaluator, config: Config, n: int | None) -> list[int]:
        """The ``n`` evaluation samples that ``config`` scores worst (all when None)."""
        return ev.target.bad_cases(ev.memo[config].samples, n)

    def _sensitivity(self, ev: Evaluator, space: Space, reference: Config, found: TuneState) -> dict[int, float]:
        """Unit -> the loss when it alone goes back to its start level from ``reference``, each
        sample's change counted as a loss, for every unit not cheap, measured on the
        ``sensitivity_samples`` samples that ``reference`` scores worst (the bad cases; all samples
        when None; in rounds when ``"auto"``, step 3)."""
        units = [i for i in space.searchable() if reference.levels[i] > 0 and i not in found.cheap]
        lowered = [space.move(reference, {i: 0}) for i in units]
        if self.sensitivity_samples == "auto":  # (in rounds: :func:`.ranking.rank_in_rounds`)
            scores, found.sensitivity_samples, found.ranking = rank_in_rounds(
                ev, reference, lowered, units, space.names(units), lambda a, b: per_image_loss(ev.target, a, b))
            return {i: per_image_loss(ev.target, scores[0], s) for i, s in zip(units, scores[1:])}
        found.sensitivity_samples = picked = self._bad_cases(ev, reference, self.sensitivity_samples)
        scores = ev.on_samples(picked, [reference] + lowered, "sensitivity", around=reference)
        loss = {i: per_image_loss(ev.target, scores[0], s) for i, s in zip(units, scores[1:])}
        found.ranking = rank_units(scores[0], scores[1:], units, space.names(units), [loss[i] for i in units])
        return loss

    def _screen(self, ev: Evaluator):
        """Pruning's screen (:func:`.search.prune`): single losses estimated on the
        ``sensitivity_samples`` samples the configuration scores worst (:data:`SCREEN_SAMPLES` when
        the ranking used every sample; None, no screen, when that is all of them)."""
        n = self.sensitivity_samples if isinstance(self.sensitivity_samples, int) else SCREEN_SAMPLES
        if n >= len(ev.samples):
            return None

        def screen(current: Config, configs: list[Config]) -> tuple[Score, list[Score]]:
            scores = ev.on_samples(self._bad_cases(ev, current, n), [current, *configs], "pruning", current)
            return scores[0], scores[1:]
        return screen

    def _trim_thresholds(self, ev: Evaluator, space: Space, found: TuneState) -> None:
        """Fixed thresholds of units left at their start level that gain nothing are dropped
        together, when that keeps the result meeting the target (a threshold that comes with a
        raise is the policy's, measured with the bounds)."""
        final, start = found.final, found.plain_start
        alone = [name for name, _ in final.thresholds if final.levels[space.index[name]] == start.levels[space.index[name]]]
        if not alone:
            return
        configs = [final] + [final.with_thresholds({name: None}) for name in alone]
        picked = self._bad_cases(ev, final, ATTRIBUTION_SAMPLES)
        scores = ev.on_samples(picked, configs, "attribution", around=final)
        useless = {name: None for name, s in zip(alone, scores[1:]) if ev.target.gain(scores[0], s) <= 0}
        if useless:
            trimmed = final.with_thresholds(useless)
            if ev.target.met(ev.score([trimmed], "attribution", final)[0]):
                found.final = trimmed

    def _attribute(self, ev: Evaluator, space: Space, found: TuneState) -> None:
        """Step 8: the measured gain of each change of the result, the loss when it alone is undone
        (the cheap units together, their fixed thresholds with them), on the
        :data:`ATTRIBUTION_SAMPLES` evaluation samples the result scores worst (its bad cases): as
        measured (``gains``), and per image (``per_image``,
        :func:`.search.per_image_loss`, as the search counts a change). Keys:
        ``("unit", i)``, ``("threshold", name)``, ``("cheap", None)``."""
        final, start = found.final, found.plain_start
        cheap = found.cheap_raised()
        raised = [i for i in space.raised(final, start) if i not in cheap]
        fixed = [name for name, _ in final.thresholds if space.index[name] not in cheap]  # (the cheap ones: with them)
        undo = [space.move(final, {i: start.levels[i]}) for i in raised]
        undo += [final.with_thresholds({name: None}) for name in fixed]
        keys = [("unit", i) for i in raised] + [("threshold", name) for name in fixed]
        if cheap:
            undo.append(space.move(final, {i: start.levels[i] for i in cheap}))
            keys.append(("cheap", None))
        found.attribution_samples = picked = self._bad_cases(ev, final, ATTRIBUTION_SAMPLES)
        scores = ev.on_samples(picked, [final] + undo, "attribution", around=final)
        found.gains = {k: ev.target.gain(scores[0], s) for k, s in zip(keys, scores[1:])}
        found.per_image = {k: per_image_loss(ev.target, scores[0], s) for k, s in zip(keys, scores[1:])}
