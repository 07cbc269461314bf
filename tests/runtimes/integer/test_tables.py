"""Tables and checked fast paths over code domains (qir.runtimes.integer.tables) give the codes
the exact kernels give, on every element."""
from __future__ import annotations

import numpy as np
import pytest

from qir.kinds import CalibMode
from qir.runtimes.integer import tables
from qir.runtimes.integer.arithmetic import Arithmetic
from qir.runtimes.integer.qtensor import QParams, QTensor
from qir.runtimes.integer.requant import requantize_pair
from qir.runtimes.march import get_profile

INT8 = (-128, 127)


def _codes(rng, shape, lo=-128, hi=127):
    return rng.integers(lo, hi + 1, shape).astype(np.float32)


def _pair(ra, rb, zp=0, zp_a=0, zp_b=0, fused=True):
    return lambda x, y: requantize_pair(x, ra, y, rb, mode="float", qmin=-128, qmax=127, zero_point=zp, zp_a=zp_a,
                                        zp_b=zp_b, fused=fused)


@pytest.mark.parametrize("b_shape", [(2, 8, 64, 64), (1, 8, 1, 1), (1,), ()])
def test_pair_table_equals_the_kernel(b_shape):
    rng = np.random.default_rng(1)
    a, b = _codes(rng, (2, 8, 64, 64)), _codes(rng, b_shape)
    fn = _pair(0.37, 1.91, zp=3, zp_a=-5, zp_b=7)
    got = tables.pair(("test-pair", b_shape), fn, a, INT8, b, INT8)
    assert got is not None
    want = fn(a, b)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_pair_table_not_used_where_it_does_not_pay():
    rng = np.random.default_rng(2)
    a, b = _codes(rng, (4, 4)), _codes(rng, (4, 4))
    assert tables.pair(("small",), _pair(0.5, 0.5), a, INT8, b, INT8) is None
    big = _codes(rng, (300,), -32768, 32767)
    assert tables.pair(("int16 pair",), _pair(0.5, 0.5), big, (-32768, 32767), big, (-32768, 32767)) is None


def test_checked_pair_equals_the_fused_kernel_whether_or_not_the_check_passes():
    """Over many ratio pairs both outcomes of the check occur, and every result is the fused one."""
    rng = np.random.default_rng(3)
    a, b = _codes(rng, (1, 16, 48, 48)), _codes(rng, (1, 16, 48, 48))
    outcomes = set()
    for k in range(60):
        ra, rb = (float(np.float32(v)) for v in rng.uniform(0.05, 3.0, 2))
        zp, zp_a, zp_b = (int(v) for v in rng.integers(-5, 5, 3))  # zero points: a constant term
        exact, fast = _pair(ra, rb, zp, zp_a, zp_b), _pair(ra, rb, zp, zp_a, zp_b, fused=False)
        got = tables.checked_pair(("checked", k, ra, rb, zp, zp_a, zp_b), exact, fast, a, INT8, b, INT8)
        np.testing.assert_array_equal(got, exact(a, b))
        ga, gb = np.arange(-128, 128, dtype=np.float32)[:, None], np.arange(-128, 128, dtype=np.float32)[None, :]
        outcomes.add(bool(np.array_equal(exact(ga, gb), fast(ga, gb))))
    assert outcomes == {True, False}


@pytest.mark.parametrize("frame,subtract", [(0, False), (128, False), (0, True)])
def test_arithmetic_requant_pair_equals_the_fused_kernel(frame, subtract):
    """Arithmetic.requant_pair (checked fast path, tables) against requantize_pair called directly,
    with a tensor, a broadcast and a scalar second operand."""
    rng = np.random.default_rng(4)
    arith = Arithmetic(get_profile("ort"))

    def params(scale, zp):
        return QParams(CalibMode.INT8, np.asarray(np.float32(scale)), np.asarray(zp, np.int64), frame=frame)

    pa, pb, py = params(0.031, -3 if frame else 0), params(0.057, 5 if frame else 0), params(0.049, -1 if frame else 0)
    a = QTensor(_codes(rng, (1, 8, 40, 40)), pa)
    for shape in [(1, 8, 40, 40), (1, 8, 1, 1), (1,)]:
        b = QTensor(_codes(rng, shape), pb)
        got = arith.requant_pair(a, b, py, subtract=subtract)
        sign, f = (-1, 0) if subtract else (1, frame)
        s = np.float32(py.scale)
        want = requantize_pair(a.codes + f, float(np.float32(pa.scale) / s), sign * b.codes + f,
                               float(np.float32(pb.scale) / s), mode="float", qmin=-128 + f, qmax=127 + f,
                               zero_point=int(py.zero_point) + f, zp_a=int(pa.zero_point) + f,
                               zp_b=sign * int(pb.zero_point) + f) - f
        np.testing.assert_array_equal(got.codes, want)


def test_unary_table_indexes_negative_codes_from_the_end():
    rng = np.random.default_rng(5)
    x = _codes(rng, (3, 500))
    got = tables.unary(("square",), lambda c: c * c + 1, x, INT8)
    np.testing.assert_array_equal(got, x * x + 1)
    assert tables.unary(("square",), lambda c: c * c + 1, x[:, :10], INT8) is None
    np.testing.assert_array_equal(tables.unary(("square",), lambda c: c * c + 1, x[:, :10], INT8, always=True),
                                  x[:, :10] ** 2 + 1)


def test_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(tables, "CACHE_BYTES", 4096)
    rng = np.random.default_rng(6)
    x = _codes(rng, (1000,))
    for k in range(20):
        tables.unary(("bounded", k), lambda c, k=k: c + k, x, INT8)
    assert sum(t.nbytes for t in tables._tables.values()) <= 4096 or len(tables._tables) == 1


@pytest.mark.parametrize("zp_in,zp_out", [(0, 0), (-3, 5)])
def test_rescale_equals_quantizing_the_dequantized_codes(zp_in, zp_out):
    """Arithmetic.rescale (float mode, a checked one-rounding formula) against quantize(dequantize)
    over scale pairs, both outcomes of the check among them (a ratio of 3/2 puts codes on ties)."""
    rng = np.random.default_rng(7)
    arith = Arithmetic(get_profile("nash-e"))
    codes = _codes(rng, (2, 6, 30, 30))
    outcomes = set()
    pairs = [(np.float32(0.3), np.float32(0.2))] + [tuple(np.float32(v) for v in rng.uniform(0.01, 0.5, 2))
                                                    for _ in range(10)]
    for s_in, s_out in pairs:
        src = QParams(CalibMode.INT8, np.asarray(s_in), np.asarray(zp_in, np.int64))
        dst = QParams(CalibMode.INT8, np.asarray(s_out), np.asarray(zp_out, np.int64))
        got = arith.rescale(QTensor(codes, src), dst)
        np.testing.assert_array_equal(got.codes, arith.quantize(QTensor(codes, src).dequantize(), dst).codes)
        every = np.arange(-128, 128, dtype=np.float32)
        outcomes.add(bool(np.array_equal(arith.quantize(QTensor(every, src).dequantize(), dst).codes,
                                         np.clip(np.rint((every - zp_in) * np.float32(s_in / s_out)) + zp_out,
                                                 -128, 127))))
    assert outcomes == {True, False}
