"""Clipping fixes for ``qir tune``: where a quantizer's range does not cover its data, the fixed
threshold that would (the advisor's rule, :func:`qir.passes.layer_compare.advise`), and at which
precision it is worth it.

On the calibration data, with the model in float, each integer-mode activation calibration node
of a unit sees its input ``x``. With ``T`` its threshold and ``A = max |x|`` (the *covering
threshold*):

- the *clipping SQNR* is ``10·log10(Σx² / Σ(x − clip(x))²)``, the input's power over the power
  its range clips away; a node below ``limit_db`` (the advisor's 40 dB: above that, a few values
  past the range cost nothing) is a candidate;
- at a precision with largest code ``Q``, its own error is estimated as the clipped-away power
  plus uniform rounding noise ``n·(T/Q)²/12`` over its ``n`` non-zero values (zeros quantize
  exactly), against ``n·(A/Q)²/12`` with the covering threshold. The fix is *better* at ``Q`` when
  the second is smaller. A threshold a calibration method chose for int8 (mse, percentile, kl)
  trades clipping for rounding at 127 codes; at int16's 32767 the same clipping is nearly all of
  the error, so the fix that is not worth it at int8 usually is at int16.

``qir tune`` *measures* the fixes on the evaluation data before using them: at int8, each one
alone on the start configuration (kept where it helps, before any precision is raised: a
threshold costs nothing at run time, int16 does); at int16, all of them together on the all-int16
configuration.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from qir.calibration import QRANGE, calib_scale
from qir.errors import InputError
from qir.execution import Level, Runtime
from qir.graph import QIR
from qir.kinds import CalibMode
from qir.runtimes.base import check_feeds, get_runtime
from qir.runtimes.engine import configured_clone
from qir.runtimes.progress import track

__all__ = ["clipping_fixes"]


class _Stats:
    """Streaming sums of one node's input: power, clipped-away power, non-zero count, max |x|."""

    def __init__(self, lo: float, hi: float) -> None:
        self.lo, self.hi = lo, hi
        self.signal = self.lost = 0.0
        self.nonzero = 0
        self.amax = 0.0

    def update(self, x: np.ndarray) -> None:
        x = x.ravel()
        if not x.size:
            return
        top, bottom = float(x.max()), float(x.min())
        if not (math.isfinite(top) and math.isfinite(bottom)):  # (non-finite values are left out)
            x = x[np.isfinite(x)]
            if not x.size:
                return
            top, bottom = float(x.max()), float(x.min())
        self.signal += float(np.square(x).sum(dtype=np.float64))  # (no BLAS: its threads would fight the runtime's)
        if top > self.hi:  # (the range clips: most do not, and their masks are not built)
            self.lost += float(np.sum(np.square(x[x > self.hi] - self.hi, dtype=np.float64)))
        if bottom < self.lo:
            self.lost += float(np.sum(np.square(x[x < self.lo] - self.lo, dtype=np.float64)))
        self.nonzero += int(np.count_nonzero(x != 0))  # (on the mask: several times faster than on floats)
        self.amax = max(self.amax, top, -bottom)


def _better(stats: _Stats, threshold: float, qmax: int) -> bool:
    """Whether the covering threshold gives the node a smaller own error at ``qmax`` codes."""
    now = stats.lost + stats.nonzero * (threshold / qmax) ** 2 / 12
    return stats.nonzero * (stats.amax / qmax) ** 2 / 12 < now


def clipping_fixes(ir: QIR, names: Sequence[str], samples: Any, *, limit_db: float, runtime: str = Runtime.ORT,
                   progress: bool = True) -> list[dict]:
    """``{"node", "clip_sqnr_db", "threshold", "old_threshold", "better": {mode: bool}}`` for each
    calibration node of ``names`` (in ``ir``'s modes) whose clipping SQNR on ``samples`` is below
    ``limit_db``, worst first (see the module docstring)."""
    cals = [ir.calibration(n) for n in names
            if ir.calibration(n).mode in QRANGE and np.ndim(calib_scale(ir.calibration(n))) == 0]
    if not cals:
        return []
    float_ir = configured_clone(ir, "float", {})
    rt = get_runtime(runtime, level=Level.FAKEQUANT)
    stats = {}
    for c in cals:
        qmin, qmax = QRANGE[c.mode]
        scale = float(calib_scale(c))
        stats[c.name] = _Stats(qmin * scale, qmax * scale)
    values = list(dict.fromkeys(c.input for c in cals))
    for i, sample in enumerate(track(samples, "tune: clipping", unit="samples", enabled=progress)):
        try:
            feeds = check_feeds(ir, sample)
        except InputError as exc:
            raise InputError(f"calibration sample {i}: {exc}") from None
        got = rt.run(float_ir, feeds, capture=values)
        for c in cals:
            stats[c.name].update(np.asarray(got[c.input]))
    found = []
    for c in cals:
        s = stats[c.name]
        if not s.lost:
            continue
        sqnr = 10 * math.log10(s.signal / s.lost)
        if sqnr < limit_db:
            threshold = float(calib_scale(c)) * QRANGE[c.mode][1]
            found.append({"node": c.name, "clip_sqnr_db": sqnr, "threshold": s.amax, "old_threshold": threshold,
                          "better": {m.value: _better(s, threshold, QRANGE[m][1]) for m in (CalibMode.INT8, CalibMode.INT16)}})
    return sorted(found, key=lambda f: f["clip_sqnr_db"])
