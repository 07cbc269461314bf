"""The int16 segmented LUT (runtimes/integer/segment_lut.py): its generated parameters against
the formulas of horizon-semantics.md §2.7 recomputed here, its evaluation against the step-by-step
rule of §5.2 (hypothesis, random codes and scales), its accuracy against ``quantize(f(x))`` within
a bound derived below, and the integer level with ``lut_mode="segment"`` on a small model."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import qir
from qir.errors import InputError
from qir.kinds import CalibMode
from qir.runtimes.integer.arithmetic import Arithmetic
from qir.runtimes.integer.qtensor import QParams, QTensor, params_of
from qir.runtimes.integer.segment_lut import evaluate, segment_params, segment_table
from qir.runtimes.march import get_profile
from qir.runtimes.numpy_ref.kernels.activation import gelu, sigmoid, tanh
from qir.runtimes.numpy_ref.kernels.elementwise import exp

from ...conftest import calibrate_for_nash_e, model_from_text

LUT16 = get_profile("nash-e").lut_int16
CODES = np.arange(-32768, 32768)
FUNCTIONS = {"sigmoid": sigmoid, "tanh": tanh, "exp": exp, "gelu": gelu}
ODD = {"tanh"}


def _params(mode: str, scale: float) -> QParams:
    return QParams(CalibMode(mode), np.asarray(scale, np.float32), np.asarray(0, np.int64))


def _lut(name: str, s_in: float, s_out: float, out: str = "int16", strategy: str = "evenly"):
    return segment_params(FUNCTIONS[name], _params("int16", s_in), _params(out, s_out),
                          replace(LUT16, divide_strategy=strategy))


def _reference(fn, x: np.ndarray, s_out: float, out: str) -> np.ndarray:
    """quantize(f(x)): round half to even, saturate."""
    with np.errstate(over="ignore"):
        q = np.rint(np.asarray(fn(np.asarray(x, np.float32)), np.float32) / np.float32(s_out))
    lo, hi = (-128, 127) if out == "int8" else (-32768, 32767)
    return np.clip(q, lo, hi).astype(np.int64)


# ------------------------------------------------------------------- generation, per §2.7
def _expected_boundaries(name: str, s_in: float, s_out: float, out: str, strategy: str):
    """§2.7 recomputed with plain Python: the range narrowed to where quantize(f) is not constant
    at the ends (lower bound 0 for a centrosymmetric f), 6 evenly spaced steps plus one past the
    top, or 256 sub-steps whose cumulative |f''| is cut in 6 equal shares; snapped to codes."""
    fn, s = FUNCTIONS[name], float(np.float32(s_in))
    ref = _reference(fn, CODES.astype(np.float32) * np.float32(s_in), s_out, out)
    first, last = 0, len(ref) - 1
    while ref[first + 1] == ref[0]:
        first += 1
    while ref[last - 1] == ref[-1]:
        last -= 1
    lo, hi = (0 if name in ODD else first - 32768) * s, (last - 32768) * s
    points = [lo + k * (hi - lo) / 6 for k in range(7)] + [hi + (hi - lo) / 6]
    if strategy == "curvature":
        bottom, top = ((-128, 127) if out == "int8" else (-32768, 32767))
        z = [lo + m * (hi - lo) / 256 for m in range(257)]
        with np.errstate(over="ignore"):  # f clipped to the output's real range
            g = [min(max(float(v), bottom * float(np.float32(s_out))), top * float(np.float32(s_out)))
                 for v in fn(np.asarray(z, np.float64).astype(np.float32))]
        running, total = [0.0], 0.0
        for m in range(1, 256):
            total += abs(g[m + 1] - 2 * g[m] + g[m - 1])
            running.append(total)
        for k in range(1, 6):
            points[k] = z[next(m for m, c in enumerate(running) if c >= total * k / 6)]
    snapped = [min(max(round(p / s), -32768), 32767) for p in points]
    snapped[-1] = 32767
    return points, snapped


CASES = [("sigmoid", 16 / 32767, 1 / 32767, "int16"), ("sigmoid", 6 / 32767, 1 / 127, "int8"),
         ("tanh", 5 / 32767, 1 / 32767, "int16"), ("exp", 8 / 32767, 400 / 32767, "int16"),
         ("exp", 3 / 32767, 21 / 127, "int8")]


@pytest.mark.parametrize("strategy", ["evenly", "curvature"])
@pytest.mark.parametrize("name, s_in, s_out, out", CASES)
def test_dividing_points_follow_the_plugin_formulas(name, s_in, s_out, out, strategy):
    lut = _lut(name, s_in, s_out, out, strategy)
    points, snapped = _expected_boundaries(name, s_in, s_out, out, strategy)
    assert lut.boundaries.tolist() == snapped
    assert np.allclose(lut.dividing_points, points, rtol=0, atol=1e-9)
    assert lut.centrosymmetric == (name in ODD)
    if strategy == "curvature":  # the curvature split differs from the even one
        assert snapped != _expected_boundaries(name, s_in, s_out, out, "evenly")[1]


def test_narrowing_lands_where_the_inverse_function_says():
    """The plugin narrows by f⁻¹ at the output's saturation (exp: log(qmax·s_out)); here the first
    code whose output rounds to the end code: f⁻¹((qmax - 0.5)·s_out), within a code."""
    s_in, s_out = 8 / 32767, 400 / 32767
    lut = _lut("exp", s_in, s_out)
    assert abs(lut.boundaries[6] - math.log(32766.5 * s_out) / s_in) <= 1.5
    lut = _lut("sigmoid", 8 / 32767, 1 / 127, "int8")
    logit = lambda p: math.log(p / (1 - p))  # noqa: E731
    assert abs(lut.boundaries[6] - logit(126.5 / 127) / (8 / 32767)) <= 1.5
    assert abs(lut.boundaries[0] - logit(0.5 / 127) / (8 / 32767)) <= 1.5


@pytest.mark.parametrize("name, s_in, s_out, out", CASES)
def test_tables_hold_f_quantized_at_64_equally_spaced_points(name, s_in, s_out, out):
    lut = _lut(name, s_in, s_out, out, "curvature")
    assert lut.tables.shape == (6, 64)
    for k in range(1, 7):
        x = np.linspace(lut.boundaries[k - 1], lut.boundaries[k], 64) * float(np.float32(s_in))
        assert np.array_equal(lut.tables[k - 1], _reference(FUNCTIONS[name], x, s_out, out)), k


@pytest.mark.parametrize("name, s_in, s_out, out", CASES)
def test_segment_lines_are_int16_fixed_point(name, s_in, s_out, out):
    """Table segments map their first code to index 0 and their last to 63·2^8 (Q8); end segments
    are the chord of f in output codes; alpha/beta int16, beta << ls inside int31, rs maximal."""
    lut = _lut(name, s_in, s_out, out)
    s, so = float(np.float32(s_in)), float(np.float32(s_out))
    for k in range(8):
        alpha, beta, ls, rs = (int(v[k]) for v in (lut.alpha, lut.beta, lut.left_shift, lut.right_shift))
        assert abs(alpha) <= 32767 and abs(beta) <= 32767 and abs(beta << ls) < 2 ** 31 and 0 <= rs <= 31
        start = (0 if lut.centrosymmetric else -32768) if k == 0 else int(lut.boundaries[k - 1])
        end = int(lut.boundaries[k])
        if end <= start:
            continue
        if k in (0, 7):  # the chord of f, clipped to the output range, in output codes
            ends = np.clip(np.float64(FUNCTIONS[name](np.float32([start * s, end * s]))) / so, *lut.out_range)
        else:
            ends = np.array([0.0, 63 * 256.0])
        slope = (ends[1] - ends[0]) / (end - start)
        intercept, center = ends[0] - slope * start, (start + end) / 2
        assert abs(alpha / 2 ** rs - slope) <= 0.5 / 2 ** rs
        assert rs == 31 or abs(round(slope * 2 ** (rs + 1))) > 32767 \
            or abs(intercept) * 2 ** (rs + 1) + abs(center) > 2 ** 31 - 1  # the largest right shift
        tol = 0.5 * 2.0 ** (ls - rs) + abs(alpha / 2 ** rs - slope) * (end - start) / 2 + 1e-6
        line = (np.array([start, end]) * alpha + (beta << ls)) / 2 ** rs
        assert np.all(np.abs(line - ends) <= tol + 0.5 * abs(ends[1] - ends[0]) * 1e-6), k


# --------------------------------------------------------------------- evaluation, per §5.2
def _step_by_step(lut, x: int) -> int:
    """§5.2's five steps on one code, in Python integers."""
    lo, hi = lut.out_range
    negative = lut.centrosymmetric and x < 0
    if negative:
        x = min(-x, 32767)
    k = next(k for k, top in enumerate(lut.boundaries.tolist()) if x <= top)            # 1. the segment
    alpha, beta, ls, rs = (int(v[k]) for v in (lut.alpha, lut.beta, lut.left_shift, lut.right_shift))
    v = x * alpha + (beta << ls)
    t = (v + (1 << (rs - 1))) >> rs if rs else v                                          # >> half up
    if k in (0, 7):
        y = t                                                                             # 2. end segment
    else:                                                                                 # 3. table
        table = lut.tables[k - 1].tolist()
        i, f = t >> 8, t & 255
        if i < 0:
            i, f = 0, 0          # before the first entry: entry 0
        elif i > 62:
            i, f = 62, 256       # the segment's last code (t = 63·256) and past it: entry 63
        y = table[i] + (((table[i + 1] - table[i]) * f + 128) >> 8)
    y = max(lo, min(hi, y))                                                               # 4. saturate
    return max(lo, min(hi, -y)) if negative else y                                        # 5. mirror


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(FUNCTIONS)), s_in=st.floats(1e-5, 3e-3), s_out=st.floats(1e-5, 0.5),
       out=st.sampled_from(["int8", "int16"]), strategy=st.sampled_from(["evenly", "curvature"]),
       codes=st.lists(st.integers(-32768, 32767), min_size=1, max_size=64))
def test_evaluation_is_the_step_by_step_rule(name, s_in, s_out, out, strategy, codes):
    lut = _lut(name, s_in, s_out, out, strategy)
    edges = [int(b) + d for b in lut.boundaries for d in (-1, 0, 1) if -32768 <= int(b) + d <= 32767]
    x = np.array(codes + edges + [-32768, 32767])
    assert evaluate(lut, x).tolist() == [_step_by_step(lut, int(v)) for v in x]


# ------------------------------------------------------------------------------- accuracy
def _error_bound(lut, fn, s_in: float, s_out: float) -> float:
    """A bound on |y - quantize(f(x))| in output steps. End segments cover a run where
    quantize(f) is constant, or one code: 1. A table segment of width w codes (entry spacing
    h = w·s_in/63): 0.5 + c (entries: rounding, and c = how far a saturated entry was clipped
    past that, at most one input code's change of f since the range ends at the first saturated
    code) + 0.5 (interpolation rounding) + 0.5 (the reference's rounding) + h²/8·max|f''|/s_out
    (linear interpolation) + δ/256·(h·max|f'|/s_out + 1) for a Q8 index off by at most
    δ = 0.5 (its rounding) + 2^(ls-rs)/2 (beta's) + |alpha/2^rs - K|·w/2 (alpha's, the line being
    exact mid-segment), K = 63·256/w. Saturating y and the reference only brings them closer."""
    s, so = float(np.float32(s_in)), float(np.float32(s_out))
    worst = 1.0
    for k in range(1, 7):
        start, end = int(lut.boundaries[k - 1]), int(lut.boundaries[k])
        if end <= start:
            continue
        z = np.linspace(start * s, end * s, 4097)
        with np.errstate(over="ignore"):
            y = np.asarray(fn(z), np.float64)
        d1 = np.gradient(y, z[1] - z[0])
        d2 = np.abs(np.gradient(d1, z[1] - z[0])).max()
        h, slope = (end - start) * s / 63, 63 * 256 / (end - start)
        with np.errstate(over="ignore"):
            exact = np.float64(fn(np.linspace(start, end, 64) * s)) / so
        clipped = max(0.0, float(np.abs(exact - lut.tables[k - 1]).max()) - 0.5)
        delta = 0.5 + 0.5 * 2.0 ** (int(lut.left_shift[k]) - int(lut.right_shift[k])) \
            + abs(int(lut.alpha[k]) / 2.0 ** int(lut.right_shift[k]) - slope) * (end - start) / 2
        worst = max(worst, 1.5 + clipped + h * h / 8 * d2 / so + delta / 256 * (h * np.abs(d1).max() / so + 1))
    return worst


def _max_error(name, s_in, s_out, out, strategy) -> tuple[int, float]:
    lut = _lut(name, s_in, s_out, out, strategy)
    x = QTensor(CODES.astype(np.int32), _params("int16", s_in)).dequantize()
    err = int(np.abs(evaluate(lut, CODES) - _reference(FUNCTIONS[name], x, s_out, out)).max())
    return err, _error_bound(lut, FUNCTIONS[name], s_in, s_out)


@pytest.mark.parametrize("strategy", ["evenly", "curvature"])
@pytest.mark.parametrize("name, s_in, s_out, out, few", [
    ("sigmoid", 8 / 32767, 1 / 32767, "int16", 10), ("sigmoid", 8 / 32767, 1 / 127, "int8", 2),
    ("tanh", 4 / 32767, 1 / 32767, "int16", 10), ("tanh", 4 / 32767, 1 / 127, "int8", 2),
    ("exp", 4 / 32767, 60 / 32767, "int16", 10), ("exp", 4 / 32767, 60 / 127, "int8", 2),
    ("gelu", 6 / 32767, 6 / 32767, "int16", 10), ("gelu", 6 / 32767, 6 / 127, "int8", 2)])
def test_accuracy_is_a_few_output_steps(name, s_in, s_out, out, strategy, few):
    """Typical calibrated ranges: the error stays within the derived bound, which is a few steps
    (int8 outputs: the entries' and the result's rounding only)."""
    err, bound = _max_error(name, s_in, s_out, out, strategy)
    assert err <= bound <= few


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(FUNCTIONS)), s_in=st.floats(3e-5, 3e-3), s_out=st.floats(1e-5, 0.3),
       out=st.sampled_from(["int8", "int16"]), strategy=st.sampled_from(["evenly", "curvature"]))
def test_error_stays_within_the_bound_for_random_scales(name, s_in, s_out, out, strategy):
    err, bound = _max_error(name, s_in, s_out, out, strategy)
    assert err <= bound


def test_centrosymmetric_functions_mirror():
    lut = _lut("tanh", 6 / 32767, 1 / 32767)
    y = evaluate(lut, CODES)
    assert lut.centrosymmetric and lut.boundaries[0] == 0
    assert np.array_equal(y[CODES < 0][1:], -y[CODES > 0][::-1])
    assert not _lut("sigmoid", 6 / 32767, 1 / 32767).centrosymmetric


# ---------------------------------------------------------------------- in the integer level
def test_arithmetic_uses_the_segment_lut_for_int16_inputs_only():
    arith = Arithmetic(get_profile("nash-e").with_overrides(lut_mode="segment"))
    out = _params("int16", 1 / 32767)
    domain = QTensor(CODES.astype(np.int32), _params("int16", 8 / 32767))
    table = arith.lut(domain, sigmoid, out)
    assert np.array_equal(table, segment_table(domain, sigmoid, out, LUT16))
    assert not np.array_equal(table, Arithmetic(get_profile("nash-e")).lut(domain, sigmoid, out))
    small = QTensor(np.arange(-128, 128, dtype=np.int32), _params("int8", 8 / 127))
    assert np.array_equal(arith.lut(small, sigmoid, out), _reference(sigmoid, small.dequantize(), 1 / 32767,
                                                                         "int16"))


def test_profile_settings_the_lut_cannot_follow_are_one_clear_error():
    domain, out = _params("int16", 1e-3), _params("int16", 1e-4)
    with pytest.raises(InputError, match="boundaries.*table_segments"):
        segment_params(sigmoid, domain, out, replace(LUT16, boundaries=9))
    with pytest.raises(InputError, match="interp"):
        segment_params(sigmoid, domain, out, replace(LUT16, interp="cubic"))
    with pytest.raises(InputError, match="int16 input"):
        segment_params(sigmoid, _params("int8", 1e-2), out, LUT16)


SIGMOID_MODEL = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 4, 8, 8] x) => (float[1, 4, 8, 8] y) {
        h = Conv(x, w1)
        s = Sigmoid(h)
        y = Conv(s, w2)
    }"""


def test_integer_level_with_segment_luts_stays_close_to_float_luts():
    """A Sigmoid between int16 quantized values: the segment LUT moves the Sigmoid's codes by no
    more than the derived bound, and the output by far less than quantization itself does."""
    rng = np.random.default_rng(1)
    samples = [{"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32)} for _ in range(4)]
    ir = calibrate_for_nash_e(qir.load(model_from_text(SIGMOID_MODEL, {"w1": (8, 4, 3, 3), "w2": (4, 8, 1, 1)})),
                              samples)
    for c in ir.calibrations():
        if c.role.value == "activation":
            ir.set_calibration(c.name, mode="int16")
    s_in, s_out = (float(params_of(ir.calibration(n)).scale) for n in ("h_calib", "s_calib"))
    bound = _error_bound(segment_params(sigmoid, _params("int16", s_in), _params("int16", s_out), LUT16),
                         sigmoid, s_in, s_out)
    profile = get_profile("nash-e")
    seg_profile = profile.with_overrides(lut_mode="segment")
    moved = False
    for feed in samples:
        ref = qir.run(ir, feed, level="float")["y"]
        table = qir.run(ir, feed, level="integer", march=profile, capture=["s~q"])
        seg = qir.run(ir, feed, level="integer", march=seg_profile, capture=["s~q"])
        codes = np.abs(seg["s~q"] - table["s~q"]) / np.float32(s_out)
        assert codes.max() <= bound
        moved |= bool(codes.max() > 0.5)
        assert np.abs(seg["y"] - table["y"]).max() < 0.1 * np.abs(table["y"] - ref).max()
    assert moved  # the segment LUT did run
