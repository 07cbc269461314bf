"""The requantization modes against exact rational references (Python integers and fractions),
over random scales and accumulators (hypothesis)."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qir.runtimes.integer.requant import fixed_multiplier, requantize, requantize_pair, round_shift

ratios = st.floats(min_value=1e-7, max_value=60.0, allow_nan=False, allow_infinity=False)
accs = st.integers(min_value=-(2 ** 31), max_value=2 ** 31 - 1)


def _round(value: Fraction, mode: str) -> int:
    """``value`` rounded to an integer by ``mode``, exactly."""
    floor = math.floor(value)
    rem = value - floor
    if mode == "truncate":
        return floor
    if rem != Fraction(1, 2):
        return floor + (rem > Fraction(1, 2))
    return {"half_up": floor + 1, "half_away": floor + (value > 0), "half_to_even": floor + (floor % 2)}[mode]


@settings(max_examples=300, deadline=None)
@given(x=st.integers(min_value=-(2 ** 46), max_value=2 ** 46), n=st.integers(min_value=0, max_value=40),
       mode=st.sampled_from(["truncate", "half_up", "half_away", "half_to_even"]))
def test_round_shift_is_exact_division_rounded(x, n, mode):
    assert int(round_shift(np.array([x]), n, mode)[0]) == _round(Fraction(x, 2 ** n), mode)


@settings(max_examples=300, deadline=None)
@given(ratio=ratios, bits=st.sampled_from([8, 16, 24, 32]))
def test_fixed_multiplier_is_the_nearest_bits_wide_mantissa(ratio, bits):
    mult, e = fixed_multiplier(ratio, bits)
    mult, e = int(mult), int(e)
    assert 2 ** (bits - 2) <= mult <= 2 ** (bits - 1)
    approx = Fraction(mult) * Fraction(2) ** (e - (bits - 1))
    # the nearest multiple of the multiplier's unit: error at most half a unit of the mantissa
    assert abs(approx - Fraction(ratio)) <= Fraction(2) ** (e - (bits - 1)) / 2


@settings(max_examples=300, deadline=None)
@given(acc=accs, ratio=ratios, zp=st.integers(-20, 20), shift_round=st.sampled_from(["half_up", "half_to_even",
                                                                                      "truncate"]))
def test_fixed16_is_acc_times_the_16bit_multiplier_shifted(acc, ratio, zp, shift_round):
    """fixed16 = round_shift(acc · M, 15 - e) + zp, saturated, with M the rounded 16-bit mantissa
    of the ratio (horizon-semantics.md §2.7)."""
    m, e = math.frexp(ratio)
    mult = math.floor(m * 2 ** 15 + 0.5)
    if mult == 2 ** 15:
        mult, e = 2 ** 14, e + 1
    want = _round(Fraction(acc * mult) / Fraction(2) ** (15 - e), shift_round) + zp
    got = requantize(np.array([acc]), ratio, mode="fixed16", qmin=-32768, qmax=32767, zero_point=zp,
                     shift_round=shift_round)[0]
    assert int(got) == min(max(want, -32768), 32767)


@settings(max_examples=300, deadline=None)
@given(acc=accs, ratio=st.floats(min_value=1e-7, max_value=0.99, allow_nan=False))
def test_fixed32_matches_gemmlowp_reference(acc, ratio):
    """fixed32 = RoundingDivideByPOT(SRDHM(acc, M0), -e) with the Q31 multiplier (TFLite)."""
    m, e = math.frexp(ratio)
    m0 = round(m * 2 ** 31)
    if m0 == 2 ** 31:
        m0, e = 2 ** 30, e + 1
    ab = acc * m0
    nudge = 2 ** 30 if ab >= 0 else 1 - 2 ** 30
    total = ab + nudge
    high = -((-total) // 2 ** 31) if total < 0 else total // 2 ** 31  # C division truncates toward 0
    want = _round(Fraction(high, 2 ** -e), "half_away")
    got = requantize(np.array([acc]), ratio, mode="fixed32", qmin=-(2 ** 31), qmax=2 ** 31 - 1)[0]
    assert int(got) == want


@settings(max_examples=300, deadline=None)
@given(acc=st.integers(-(2 ** 24), 2 ** 24), ratio=ratios, zp=st.integers(-128, 127))
def test_float_mode_is_float32_product_rounded_half_to_even(acc, ratio, zp):
    value = float(np.float32(np.float32(acc) * np.float32(ratio)))
    want = min(max(_round(Fraction(min(max(value, -128 - zp), 127 - zp)), "half_to_even") + zp, -128), 127)
    got = requantize(np.array([acc]), ratio, mode="float", qmin=-128, qmax=127, zero_point=zp)[0]
    assert int(got) == want


@pytest.mark.parametrize("mode", ["float", "fixed16", "fixed32"])
def test_every_mode_is_within_one_step_of_the_real_product(mode, rng):
    acc = rng.integers(-(2 ** 20), 2 ** 20, size=5000)
    ratio = rng.uniform(1e-5, 1e-2, size=5000)
    got = requantize(acc, ratio, mode=mode, qmin=-32768, qmax=32767)
    exact = np.clip(acc * ratio, -32768, 32767)
    relative = {"float": 2.0 ** -22, "fixed16": 2.0 ** -14, "fixed32": 2.0 ** -29}[mode]  # multiplier precision
    # gemmlowp rounds twice (the high multiply, then the divide by 2^-e <= 2·ratio): half a step more
    double = ratio if mode == "fixed32" else 0.0
    assert np.all(np.abs(got - exact) <= 0.5 + double + np.abs(exact) * relative)


@pytest.mark.parametrize("mode", ["float", "fixed16", "fixed32"])
def test_pair_is_the_rounded_weighted_sum(mode, rng):
    a = rng.integers(-128, 128, size=4000)
    b = rng.integers(-128, 128, size=4000)
    ra, rb = 0.731, 0.0417
    got = requantize_pair(a, ra, b, rb, mode=mode, qmin=-128, qmax=127)
    exact = np.clip(a * ra + b * rb, -128, 127)
    assert np.abs(got - exact).max() <= 0.5 + 1e-4 + (mode == "fixed16") * 2.0 ** -14 * 128
    assert np.mean(got == np.clip(np.rint(a * ra + b * rb), -128, 127)) > 0.99
    # zero points: the same sums with the codes shifted
    shifted = requantize_pair(a + 5, ra, b - 7, rb, mode=mode, qmin=-128, qmax=127, zp_a=5, zp_b=-7, zero_point=3)
    assert np.mean(shifted == np.clip(got + 3, -128, 127)) > 0.99


def test_float_pair_broadcasts_a_smaller_first_operand():
    """``a`` a vector, ``b`` a batch of rows (a bias Add whose bias is the first input): the sum
    broadcasts as onnxruntime's QLinearAdd does, and equals adding the broadcast arrays."""
    from qir.runtimes.integer.requant import requantize_pair

    rng = np.random.default_rng(3)
    a, b = rng.integers(-128, 128, 8).astype(np.float32), rng.integers(-128, 128, (2, 5, 8)).astype(np.float32)
    kwargs = dict(mode="float", qmin=-128, qmax=127, zero_point=3, zp_a=1, zp_b=-2)
    got = requantize_pair(a, 0.37, b, 0.81, **kwargs)
    np.testing.assert_array_equal(got, requantize_pair(np.broadcast_to(a, b.shape), 0.37, b, 0.81, **kwargs))
