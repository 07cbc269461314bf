"""``tune``: from an accuracy target to the cheapest verified int8 / int16 / fp16 configuration a
march allows (the mixed-precision pipelines of the accuracy tuning guide, seed 002, automated).

The pipeline is the march profile's data (``tune_ladder``: the levels each activation
calibration node may take, cheapest first; ``tune_costs``: their cost per FLOP), never a branch
on the march name; the pieces are in ``passes/lib/tune_*``. The target (``"cosine>=0.99"``, a
metric against the float model, or a task metric; :mod:`.lib.tune_target`) is met by the *mean*
over the **evaluation** samples, never the calibration ones; the worst sample is reported too.

1. **Bounds.** One engine call scores the start configuration (every unit at its first level:
   all-int8 on nash-e/m; GEMM inputs int8 and every other op fp16 on nash-p), the upper bound
   (every unit at its last integer level: all-int16, dual int16 where the profile allows it),
   the ceiling (every unit at its last level: fp16, float with ``allow_float``), each also with
   every clipping fix, and the start with each clipping fix alone.
2. **Clipping** (:mod:`.lib.tune_clip`): a fixed threshold covering the data, where the
   calibrated range clips it (the advisor's rule), is kept where it measurably helps, before any
   precision is raised. If the start then meets the target, nothing is raised. If neither the
   upper bound nor the ceiling meets it, the target is unreachable: the pass stops with the best
   configuration found and says so (``reached`` false).
3. **Reference**: the cheapest configuration known to meet the target that the search works
   down from: all-int16 when it meets; else all-int16 raised by the greedy refinement (step 5)
   toward the cheapest bound that meets (the upper bound, dual int16 on GEMM inputs where
   allowed; else the ceiling), when that meets for less than the bound (all-int16 often just
   misses, and int16 weights on a few GEMMs cost far less than on all); else that bound.
   **Sensitivity**: each unit is lowered alone from the reference to its start level; the loss
   ranks the units, each sample's change counted as a loss (step 6 says why: a unit whose
   lowering happens to help the bad cases must not rank last). Both rankings
   run on the few evaluation samples the configuration they start from scores worst (the bad
   cases; a ranking only orders a search, which measures every step on all samples).
4. **Ratio search** (:func:`.lib.tune_search.ratio_search`): the guide's binary search on the
   share of units raised to their reference level (int16 when all-int16 meets the target), in
   sensitivity order. Raising the few units that need dual int16 or fp16 straight there costs
   less than raising nearly all to int16 and adding them after. Steps 4 to 6 judge every
   configuration below the reference by the reference's score less each sample's change.
5. **Greedy refinement with lazy re-scoring** (:func:`.lib.tune_search.greedy`): from the largest
   failing configuration of the ratio search, the moves (one unit one level up, to at most its
   reference level) with the best gain per cost, re-measured a few at a time. That configuration
   is one unit short of the one that meets, so :data:`GREEDY_ROUNDS_PAST_RATIO` rounds look for
   a cheaper way past it.
6. **Backward pruning** (:func:`.lib.tune_search.prune`): each raised unit back down while the
   target holds, a lowered configuration counting each sample's change, up or down, as a loss
   (:func:`.lib.tune_search.changes_as_losses`: a lowering that improves a sample does so by
   chance, and chance of that size can as well lower an unseen image; luck on a few samples must
   not pay for losses elsewhere).
   Stale single losses are estimated again on the bad cases first (the screen), on every sample
   only when that proves too hopeful.
7. **Attribution**: each change of the result undone alone (on the sensitivity samples), the
   loss is its measured gain; each change's reason is ``clipping`` (a fixed threshold),
   ``rounding`` (raised by the ratio search, in sensitivity order) or ``interaction`` (added by
   the greedy refinement: its single sensitivity did not rank it).
8. **Verification** (:mod:`.lib.tune_verify`): the result emitted, re-imported and run in
   onnxruntime on the evaluation data, and at the march's integer level (``integer``); it must
   meet the target in both and agree with the search. When only the integer level misses, the
   search runs again (every score it has is reused) for the target tightened by 1.5 times the
   gap between the two, at most :data:`INTEGER_RETRIES` times; the report names that
   ``search_target``.

The pass sets the IR's calibration nodes to the result (a transform) and reports everything:
the target, the bounds, every configuration tried (stage, FLOP-weighted cost, mean, worst
sample), the changes with their reasons and gains, the cost against all-int8 and all-int16, the
verification, and the emitted ``model`` (a ``ModelProto``; :mod:`qir.tools.tune` writes the files).
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any, MutableMapping

from qir.data import model_samples
from qir.errors import InputError
from qir.graph import QIR
from qir.passes.base import Pass, PassResult, register_pass
from qir.passes.layer_compare import CLIP_SQNR_DB
from qir.passes.lib.tune_clip import clipping_fixes
from qir.passes.lib.tune_eval import Evaluator
from qir.passes.lib.tune_report import summarize
from qir.passes.lib.tune_search import changes_as_losses, greedy, per_image_loss, prune, ratio_search
from qir.passes.lib.tune_space import Config, Space
from qir.passes.lib.tune_target import Score, Target, parse_target
from qir.passes.lib.tune_verify import check_unseen, verify
from qir.runtimes.base import check_feeds
from qir.runtimes.march import get_profile
from qir.runtimes.progress import task

__all__ = ["TunePass", "checked_samples"]

logger = logging.getLogger(__name__)

#: Searches again, for a target tightened by the gap, when only the integer level misses it.
INTEGER_RETRIES = 2
#: Greedy rounds past the ratio search's last failing configuration, when the next one meets.
GREEDY_ROUNDS_PAST_RATIO = 2

STAGES = ("bounds", "reference", "sensitivity", "ratio search", "greedy", "pruning", "attribution", "verification")


def checked_samples(ir: QIR, data: Any, num: int | None = None, *, what: str = "the evaluation data") -> list[dict]:
    """The samples of ``data`` (at most ``num``), each checked against the model's inputs: data
    that does not fit the model is one clear error naming ``what`` and the sample."""
    try:
        samples = list(model_samples(ir, data, num))
        for i, sample in enumerate(samples):
            try:
                check_feeds(ir, sample)
            except InputError as exc:
                raise InputError(f"sample {i}: {exc}") from None
    except InputError as exc:
        raise InputError(f"{what} does not fit the model: {exc}") from None
    return samples


@register_pass
class TunePass(Pass):
    """Tune the calibrated IR to the cheapest configuration that meets ``target`` on ``eval_data``
    (see the module docstring).

    Options: ``calib_data`` (where the clipping fixes are looked for; none without it),
    ``march``, ``allow_float`` (float32, the CPU, as the last level), ``eval_num`` (use at most
    that many evaluation samples), ``runtime`` / ``threads`` (the engine's), ``points`` (ratio
    values per search call), ``batch`` (moves re-measured per greedy round), ``max_rounds`` (of the greedy
    refinement and of pruning each: they refine a configuration the ratio search found),
    ``sensitivity_samples`` (the ranking runs on that many of the worst evaluation samples, as
    hmct ranks on one sample and QuantAnalysis on a bad case; None: all of them),
    ``verify``, ``integer`` (also run the result at the march's integer level), ``check_data``
    (samples the search never sees: the verified result is run on them too and the report says
    whether it holds there, :func:`.lib.tune_verify.check_unseen`), ``store`` (a
    mapping keeping every score, for resuming), ``progress``.
    """

    name = "tune"

    def __init__(self, target: Any, eval_data: Any, *, calib_data: Any = None, march: str = "nash-e",
                 allow_float: bool = False, eval_num: int | None = None, runtime: str = "ort",
                 threads: int | None = None, points: int = 7, batch: int = 8, max_rounds: int = 12,
                 sensitivity_samples: int | None = 2, verify: bool = True, integer: bool = True,
                 check_data: Any = None, store: MutableMapping[str, Any] | None = None, progress: bool = True) -> None:
        self.target = parse_target(target)
        self.profile = get_profile(march)
        if points < 1 or batch < 1 or max_rounds < 1:
            raise InputError("points, batch and max_rounds must each be at least 1")
        self.eval_data, self.calib_data, self.allow_float, self.eval_num = eval_data, calib_data, allow_float, eval_num
        self.runtime, self.threads, self.points, self.batch, self.max_rounds = runtime, threads, points, batch, max_rounds
        self.verify, self.integer, self.store, self.progress = verify, integer, store, progress
        self.sensitivity_samples, self.check_data = sensitivity_samples, check_data
        self.options = {"target": self.target.text, "march": self.profile.name, "allow_float": allow_float}

    # ------------------------------------------------------------------ run
    def run(self, ir: QIR) -> PassResult:
        start = time.perf_counter()
        if not ir.calibrations():
            raise InputError(f"{ir.name!r} has no calibration nodes; calibrate it first (qir calibrate), or give "
                             "qir tune the float model and calibration data")
        samples = checked_samples(ir, self.eval_data, self.eval_num)
        space = Space(ir, self.profile, allow_float=self.allow_float)
        base = space.apply(ir.clone(), space.start())
        ev = Evaluator(base, space, self.target, samples, store=self.store, progress=self.progress,
                       runtime=self.runtime, threads=self.threads)
        found = checked = None
        try:
            for attempt in range(1 + INTEGER_RETRIES):
                stages = task("tune", len(STAGES), unit="stages", enabled=self.progress)
                previous, found = (found, checked), self._search(ev, space, base, stages)
                found["search_target"] = ev.target
                if attempt and not found["reached"]:  # the tightened target is out of reach: keep what was verified
                    stages.close()
                    found, checked = previous
                    break
                stages.update(1)
                tuned = space.apply(ir.clone(), found["final"])
                checked = verify(tuned, samples, self.target, found["score"].mean, threads=self.threads,
                                 march=self.profile.name if self.integer else None) if self.verify else None
                stages.update(1)
                stages.close()
                gap = _integer_gap(self.target, checked)
                if not found["reached"] or gap is None or attempt == INTEGER_RETRIES:
                    break
                tighter = ev.target.tightened(1.5 * gap)
                if not any(tighter.met(ev.memo[c]) for c in (found["upper"], found["ceiling"])):
                    break  # beyond every bound: the integer level loses more than any configuration can make up
                logger.info("tune: the result meets %s in fake quantization but not at %s's integer level (%.6g lower):"
                            " searching again for %s", ev.target.text, self.profile.name, gap, tighter.text)
                ev.target = tighter
        finally:
            ev.close()
        ev.target = self.target
        space.apply(ir, found["final"])
        report = summarize(ev, found, self.profile, self.allow_float)
        if found["search_target"] != self.target:
            report["search_target"] = found["search_target"].text
        if checked is not None:
            report["verification"] = checked
            if self.check_data is not None:
                unseen = checked_samples(ir, self.check_data, what="the check data")
                report["unseen"] = check_unseen(ir, checked["model"], unseen, self.target, threads=self.threads)
        report["seconds"] = round(time.perf_counter() - start, 2)
        return PassResult(ir, True, report)

    # ------------------------------------------------------------------ the stages
    def _search(self, ev: Evaluator, space: Space, base: QIR, stages) -> dict[str, Any]:
        found = self._bounds(ev, space, base)
        stages.update(1)
        if found["reached"] is not None:  # the start meets the target, or nothing can
            stages.update(5)
            return self._attribute(ev, space, found)
        reference = self._reference(ev, space, found)
        stages.update(1)
        loss = self._sensitivity(ev, space, reference, found)
        stages.update(1)
        order = sorted(loss, key=lambda i: -loss[i])

        def counted(score: Score) -> Score:  # a configuration below the reference: each sample's change a loss
            return changes_as_losses(ev.target, ev.memo[reference], score)
        met, below, _ = ratio_search(ev, found["start"], order, {i: reference.levels[i] for i in order},
                                     points=self.points, counted=counted)
        found.update(order=order, loss=loss, ratio_config=met if met is not None else below)
        stages.update(1)
        # a cheaper way past the last failing ratio, with moves up to the level each unit has in the reference;
        # that ratio is one unit short of the one that meets, so a cheaper way is one or two moves: more rounds
        # only cost time (each measures `batch` moves on every sample)
        rounds = min(self.max_rounds, GREEDY_ROUNDS_PAST_RATIO) if met is not None else self.max_rounds
        refined = greedy(ev, below, loss, batch=self.batch, max_rounds=rounds, counted=counted,
                         allowed=lambda i, k: k <= reference.levels[i], budget=space.cost(met) if met else math.inf)
        found["greedy_config"] = refined
        meeting = [c for c in (met, refined) if c is not None and ev.target.met(counted(ev.memo[c]))]
        meeting += [found["ceiling_met"]] if found["ceiling_met"] is not None else []
        stages.update(1)
        if not meeting:  # the ceiling met it but the refinement did not get there
            found["reached"] = False
            found["final"] = found["best"]
            stages.update(1)
            return self._attribute(ev, space, found)
        found["final"] = prune(ev, min(meeting, key=space.cost), found["start"], prior=loss, counted=counted,
                               max_rounds=self.max_rounds, screen=self._screen(ev, space))
        found["reached"] = True
        stages.update(1)
        return self._attribute(ev, space, found)

    def _bounds(self, ev: Evaluator, space: Space, base: QIR) -> dict[str, Any]:
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
        ev.score([start, int16, upper, ceiling], "bounds")
        for f in fixes:
            f["kept"] = [m for m in ("int8", "int16") if (f["node"], m) in space.policy]
        reachable = [x for x in (int16, upper, ceiling) if ev.met(x)]
        reached = True if ev.met(start) else (None if reachable else False)
        best = max(ev.memo, key=lambda x: ev.target.standing(ev.memo[x]))
        bound = max((int16, upper), key=lambda x: ev.target.standing(ev.memo[x]))
        shown = [ev.target.shown(ev.memo[x]) for x in (start, int16, upper, ceiling)]
        logger.info("tune: start %s %s, all-int16 %s, upper bound %s, ceiling %s; clipping fixes kept: %d at "
                    "int8, %d at int16, of %d", ev.target.text, *shown, len(chosen.thresholds),
                    sum(m == "int16" for _, m in space.policy), len(fixes))
        return {"start": start, "plain_start": plain, "int16": int16, "upper": bound, "ceiling": ceiling,
                "ceiling_met": min(reachable, key=space.cost) if reachable else None, "fixes": fixes, "best": best,
                "reached": reached, "final": start if reached else best}

    def _reference(self, ev: Evaluator, space: Space, found: dict[str, Any]) -> Config:
        """Step 3's reference: all-int16 when it meets the target; else all-int16 raised further by
        the greedy refinement, toward the cheapest bound that meets (the upper bound: int16
        weights; the ceiling: fp16), where that meets the target for less than the bound (when
        all-int16 just misses, a few GEMMs with int16 weights make it up: far cheaper than every
        GEMM so); else that bound. The moves are ranked by each one's gain alone from all-int16
        on the samples all-int16 scores worst."""
        bound, int16 = found["ceiling_met"], found["int16"]
        moves = [i for i in space.searchable() if bound.levels[i] > int16.levels[i]]
        if bound == int16 or not moves:
            return bound
        raised = [space.move(int16, {i: int16.levels[i] + 1}) for i in moves]
        scores = self._on_bad_cases(ev, space, self._bad_cases(ev, int16), [int16] + raised, "reference", int16)
        gain = {i: ev.target.gain(s, scores[0]) for i, s in zip(moves, scores[1:])}
        refined = greedy(ev, int16, gain, batch=self.batch, max_rounds=self.max_rounds, stage="reference",
                         allowed=lambda i, k: k <= bound.levels[i], budget=space.cost(bound))
        if ev.met(refined) and space.cost(refined) < space.cost(bound):
            found["reference"] = refined
            logger.info("tune: reference: all-int16 with %d unit(s) raised further meets %s (%s; the %s bound "
                        "costs %.3gx more)", len(space.raised(refined, int16)), ev.target.text, ev.target.shown(ev.memo[refined]),
                        "upper" if bound == found["upper"] else "ceiling", space.cost(bound) / space.cost(refined))
            return refined
        return bound

    def _bad_cases(self, ev: Evaluator, config: Config) -> list[int]:
        """The ``sensitivity_samples`` evaluation samples that ``config`` scores worst (all when None)."""
        values = ev.memo[config].samples
        worst_first = sorted((i for i, v in enumerate(values) if v == v),
                             key=lambda i: values[i] if ev.target.higher_is_better else -values[i])
        n = self.sensitivity_samples
        return sorted(worst_first[:n]) if n is not None and 0 < n < len(worst_first) else list(range(len(values)))

    def _sensitivity(self, ev: Evaluator, space: Space, reference: Config, found: dict[str, Any]) -> dict[int, float]:
        """Unit -> the loss when it alone goes back to its start level from ``reference`` (all-int16:
        activation changes only, which the engine batches), measured on the ``sensitivity_samples``
        samples that ``reference`` scores worst (the bad cases; all samples when None)."""
        units = [i for i in space.searchable() if reference.levels[i] > 0]
        lowered = [space.move(reference, {i: 0}) for i in units]
        found["sensitivity_samples"] = picked = self._bad_cases(ev, reference)
        scores = self._on_bad_cases(ev, space, picked, [reference] + lowered, "sensitivity", around=reference)
        return {i: per_image_loss(ev.target, scores[0], s) for i, s in zip(units, scores[1:])}

    def _screen(self, ev: Evaluator, space: Space):
        """Pruning's screen (:func:`.lib.tune_search.prune`): single losses estimated on the
        ``sensitivity_samples`` samples the configuration scores worst (None: on every sample)."""
        if self.sensitivity_samples is None or self.sensitivity_samples >= len(ev.samples):
            return None

        def screen(current: Config, configs: list[Config]) -> tuple[Score, list[Score]]:
            scores = self._on_bad_cases(ev, space, self._bad_cases(ev, current), [current, *configs], "pruning", current)
            return scores[0], scores[1:]
        return screen

    def _on_bad_cases(self, ev: Evaluator, space: Space, picked: list[int] | None, configs: list[Config],
                      stage: str, around: Config | None = None) -> list:
        """Scores of ``configs`` (near ``around``) on the evaluation samples ``picked`` (None: all)."""
        if picked is None or len(picked) == len(ev.samples):
            return ev.score(configs, stage, around)
        sub = Evaluator(ev.base, space, ev.target, [ev.samples[i] for i in picked], store=ev.store,
                        prefix=f"samples {picked}: ", progress=self.progress, **ev.engine_options)
        try:
            return sub.score(configs, stage, around)
        finally:
            sub.close()
            ev.calls += sub.calls

    def _attribute(self, ev: Evaluator, space: Space, found: dict[str, Any]) -> dict[str, Any]:
        """The measured gain of each change of the result: the loss when it alone is undone. Fixed
        thresholds that gain nothing there are dropped together first, when that keeps the result
        as good (meeting the target, or no worse when it is not reached); then every gain is
        measured on the result."""
        final = found["final"]
        gains, _ = self._gains(ev, space, final, found, units=False)
        useless = {name: None for name, _ in final.thresholds if gains[("threshold", name)] <= 0}
        if useless:
            trimmed = final.with_thresholds(useless)
            score = ev.score([trimmed], "attribution", final)[0]
            if ev.target.met(score) if found["reached"] else ev.target.gain(score, ev.memo[final]) >= 0:
                found["final"] = trimmed
        found["score"] = ev.score([found["final"]], "attribution")[0]
        found["gains"], found["per_image"] = self._gains(ev, space, found["final"], found)
        return found

    def _gains(self, ev: Evaluator, space: Space, final: Config, found: dict[str, Any],
               units: bool = True) -> tuple[dict, dict]:
        """``("unit", i)`` / ``("threshold", name)`` -> the gain of each change of ``final`` (only its
        thresholds unless ``units``), on the sensitivity samples (the bad cases) when they were
        chosen: as measured, and per image (:func:`.lib.tune_search.per_image_loss`, as the search
        counts a change)."""
        raised = space.raised(final, found["plain_start"]) if units else []
        undo = [space.move(final, {i: found["plain_start"].levels[i]}) for i in raised]
        unthreshold = [final.with_thresholds({name: None}) for name, _ in final.thresholds]
        scores = self._on_bad_cases(ev, space, found.get("sensitivity_samples"), [final] + undo + unthreshold,
                                    "attribution", around=final)
        keys = [("unit", i) for i in raised] + [("threshold", name) for name, _ in final.thresholds]
        return ({k: ev.target.gain(scores[0], s) for k, s in zip(keys, scores[1:])},
                {k: per_image_loss(ev.target, scores[0], s) for k, s in zip(keys, scores[1:])})


def _integer_gap(target: Target, checked: dict[str, Any] | None) -> float | None:
    """How much worse the integer level scores than fake quantization, when verification failed
    only there (None otherwise: it passed, or failed for another reason)."""
    integer = (checked or {}).get("integer")
    if not integer or integer["meets"] or not checked["onnxruntime_agrees"]:
        return None
    gap = checked["margin"] - integer["margin"]
    return gap if gap > 0 and math.isfinite(gap) else None
