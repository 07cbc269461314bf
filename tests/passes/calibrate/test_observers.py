"""Calibration observers and threshold methods, checked against their definitions.

References used here are independent of the implementation: ``np.histogram`` for the bins,
``np.percentile`` for percentiles, a literal per-candidate loop (MXNet/onnxruntime style, with
their smoothing) for KL, and real fake quantization of the sample for MSE.
"""
from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

from qir.passes.calibrate.observers import (
    ZERO_DATA_THRESHOLD,
    AbsHistogram,
    AbsMaxObserver,
    ObserverError,
    ObserverWarning,
    channel_abs_max,
)
from qir.passes.calibrate.thresholds import (
    METHODS,
    compute_threshold,
    expected_quant_mse,
    kl_divergence_curve,
    make_observer,
    threshold_kl,
    threshold_max,
    threshold_mse,
    threshold_percentile,
)

HIST_METHODS = ["max", "percentile", "kl", "mse"]


# ----------------------------------------------------------------------------- helpers

def fake_quant(x: np.ndarray, t: float, qmax: int) -> np.ndarray:
    s = t / qmax
    return np.clip(np.rint(x / s), -qmax - 1, qmax) * s


def quant_mse(x: np.ndarray, t: float, qmax: int) -> float:
    return float(np.mean((fake_quant(x, t, qmax) - x) ** 2))


def ref_histogram(x: np.ndarray, num_bins: int, rng_: float) -> np.ndarray:
    a = np.abs(np.asarray(x, dtype=np.float64).ravel())
    a = a[np.isfinite(a)]
    return np.histogram(a, bins=num_bins, range=(0.0, rng_))[0]


def _smooth(p: np.ndarray, eps: float = 1e-4):
    """MXNet / onnxruntime ``smooth_distribution``."""
    zeros = p == 0
    n_zeros = int(zeros.sum())
    n_nonzeros = p.size - n_zeros
    if n_nonzeros == 0:
        return None
    eps1 = eps * n_zeros / n_nonzeros
    out = p.astype(np.float64) + eps * zeros - eps1 * ~zeros
    assert (out > 0).all()
    return out


def ref_kl_curve(hist: np.ndarray, levels: int) -> dict[int, float]:
    """The TensorRT loop, literally: {candidate bin count i: KL(P||Q)} for i in [levels, n]."""
    n = int(np.flatnonzero(hist)[-1]) + 1
    hist = hist[:n].astype(np.float64)
    out = {}
    for i in range(levels, n + 1):
        sliced = hist[:i]
        p = sliced.copy()
        p[-1] += hist[i:].sum()
        nonzero = p != 0
        m = i // levels
        q = np.zeros(i)
        for j in range(levels):
            start = j * m
            stop = i if j == levels - 1 else start + m
            norm = nonzero[start:stop].sum()
            if norm:
                q[start:stop] = sliced[start:stop].sum() / norm
        q[~nonzero] = 0
        ps, qs = _smooth(p), _smooth(q)
        if ps is None or qs is None:
            out[i] = math.inf
            continue
        ps, qs = ps / ps.sum(), qs / qs.sum()
        out[i] = float(np.sum(ps * np.log(ps / qs)))
    return out


@pytest.fixture
def gauss(rng):
    return rng.standard_normal(200_000).astype(np.float32)


def _all_thresholds(h, qmax=127):
    return {m: compute_threshold(h, m, qmax) for m in HIST_METHODS}


# ----------------------------------------------------------------------------- histogram

@pytest.mark.parametrize("kind", ["absmax", "hist"])
def test_update_range_records_what_update_of_the_two_values_records(rng, kind):
    make = AbsMaxObserver if kind == "absmax" else (lambda: AbsHistogram(64))
    ranges = [(-1.5, 2.25), (0.0, 0.0), (0.0, 3.0), (-4.0, -0.5), (1e-3, 7.0), (-np.inf, 1.0), (np.nan, 2.0),
              (float(np.float64(0.1)), 0.3)]  # float64 bounds are seen as float32, like update's array
    by_range, by_array = make(), make()
    for lo, hi in ranges:
        by_range.update_range(lo, hi)
        by_array.update(np.array([lo, hi], np.float32))
    assert by_range.to_dict() == by_array.to_dict()


def test_bins_match_np_histogram_and_range_is_the_next_power_of_two(rng):
    x = (rng.standard_normal((4, 8, 16, 16)) * 0.7).astype(np.float32)
    x.flat[:4] = [0.0, -0.0, 2.0 ** -3, -(2.0 ** -2)]      # values sitting exactly on bin edges
    h = AbsHistogram(num_bins=512).update(x)
    amax = float(np.abs(x).max())
    assert h.range > amax >= h.range / 2
    np.testing.assert_array_equal(h.hist, ref_histogram(x, 512, h.range))
    assert h.count == x.size and h.hist.sum() == x.size
    assert h.zero_count == 2
    assert h.min == float(x.min()) and h.max == float(x.max())
    assert h.abs_max == amax


@pytest.mark.parametrize("kind", ["relu", "gauss", "constant"])
def test_bins_match_np_histogram_over_many_chunks(rng, kind):
    """Long tensors (several internal chunks, ragged end), incl. one dominant bin (ReLU zeros)."""
    x = rng.standard_normal(300_001).astype(np.float32)
    if kind == "relu":
        x = np.maximum(x, 0)
    elif kind == "constant":
        x[:] = -0.75
    h = AbsHistogram().update(x).update(x[:70_000])
    both = np.concatenate([x, x[:70_000]])
    np.testing.assert_array_equal(h.hist, ref_histogram(both, 2048, h.range))
    assert h.zero_count == int(np.count_nonzero(both == 0))


def test_power_of_two_max_gets_a_strictly_larger_range():
    h = AbsHistogram(num_bins=64).update(np.array([1.0, -0.5], np.float32))
    assert h.range == 2.0
    np.testing.assert_array_equal(h.hist, ref_histogram([1.0, 0.5], 64, 2.0))


@pytest.mark.parametrize("order", ["growing", "shrinking", "mixed"])
def test_streaming_equals_one_shot_also_when_the_range_grows(rng, order):
    chunks = [rng.standard_normal(5000).astype(np.float32) * scale
              for scale in (0.01, 0.3, 7.0, 150.0)]
    chunks[1][::7] = 0.0
    if order == "shrinking":
        chunks = chunks[::-1]
    elif order == "mixed":
        chunks = [chunks[2], chunks[0], chunks[3], chunks[1]]
    streamed = AbsHistogram(num_bins=1024)
    ranges = []
    for c in chunks:
        streamed.update(c)
        ranges.append(streamed.range)
    whole = np.concatenate(chunks)
    one = AbsHistogram(num_bins=1024).update(whole)
    if order == "growing":
        assert ranges == sorted(ranges) and len(set(ranges)) == 4      # it really grew mid-stream
    np.testing.assert_array_equal(streamed.hist, one.hist)
    np.testing.assert_array_equal(streamed.hist, ref_histogram(whole, 1024, one.range))
    for key in ("count", "zero_count", "abs_max", "min", "max", "range_exp", "nan_count"):
        assert getattr(streamed, key) == getattr(one, key), key
    assert _all_thresholds(streamed) == _all_thresholds(one)


def test_memory_is_bounded_while_the_range_grows(rng):
    h = AbsHistogram(num_bins=256)
    exps = []
    for k in range(60):
        h.update(rng.standard_normal((3, 50)).astype(np.float32) * 2.0 ** (k - 20))
        assert h.hist.shape == (256,) and h.hist.dtype == np.int64
        exps.append(h.range_exp)
    assert exps == sorted(exps) and exps[-1] - exps[0] >= 50
    assert int(h.hist.sum()) == h.count == 60 * 150
    assert len(h.__dict__) < 15      # no per-update state accumulates


def test_nan_and_inf_are_counted_and_ignored(rng):
    x = rng.standard_normal(1000).astype(np.float32)
    dirty = x.copy()
    dirty[[3, 10, 50]] = np.nan
    dirty[[7, 8]] = np.inf
    dirty[99] = -np.inf
    h = AbsHistogram(num_bins=256).update(dirty)
    clean = AbsHistogram(num_bins=256).update(np.delete(x, [3, 10, 50, 7, 8, 99]))
    assert (h.nan_count, h.inf_count, h.count) == (3, 3, 994)
    assert h.total == 1000
    np.testing.assert_array_equal(h.hist, clean.hist)
    assert h.abs_max == clean.abs_max == float(np.nanmax(np.abs(np.where(np.isinf(dirty), 0, dirty))))
    assert _all_thresholds(h) == _all_thresholds(clean)


def test_only_nonfinite_or_no_data_raises_a_clear_value_error():
    h = AbsHistogram().update(np.array([np.nan, np.inf, -np.inf, np.nan], np.float32))
    assert (h.count, h.nan_count, h.inf_count) == (0, 2, 2)
    for method in METHODS:
        with pytest.raises(ValueError, match="only non-finite values.*2 NaN, 2 Inf"):
            compute_threshold(h, method)
    with pytest.raises(ObserverError, match="saw no data"):
        compute_threshold(AbsHistogram().update(np.zeros((0, 3), np.float32)), "kl")


@pytest.mark.parametrize("method", HIST_METHODS)
@pytest.mark.parametrize("qmax", [127, 32767])
def test_all_zero_data_gets_the_guard_threshold_and_a_warning(method, qmax):
    h = AbsHistogram().update(np.zeros((2, 3, 4), np.float32)).update(-np.zeros(5, np.float32))
    assert h.all_zero and h.zero_count == 29 and h.hist[0] == 29
    with pytest.warns(ObserverWarning, match="exactly 0"):
        t = compute_threshold(h, method, qmax)
    assert t == ZERO_DATA_THRESHOLD
    scale = np.float32(t) / np.float32(qmax)
    assert np.isfinite(scale) and scale >= np.finfo(np.float32).tiny and np.isfinite(1 / scale)


def test_inputs_of_other_dtypes_and_layouts(rng):
    x = rng.standard_normal((8, 16)).astype(np.float32)
    ref = AbsHistogram(num_bins=128).update(x)
    np.testing.assert_array_equal(AbsHistogram(num_bins=128).update(x.T).hist, ref.hist)   # view
    np.testing.assert_array_equal(AbsHistogram(num_bins=128).update(x.astype(np.float64)).hist, ref.hist)
    half = x.astype(np.float16)
    np.testing.assert_array_equal(AbsHistogram(num_bins=128).update(half).hist,
                                  AbsHistogram(num_bins=128).update(half.astype(np.float32)).hist)
    ints = np.array([-128, 0, 5, 127], np.int8)
    hi = AbsHistogram(num_bins=64).update(ints)
    assert hi.abs_max == 128.0 and hi.zero_count == 1
    with pytest.raises(TypeError):
        AbsHistogram().update(np.array([1 + 2j]))
    with pytest.raises(ObserverError, match="power of two"):
        AbsHistogram(num_bins=1000)


def test_extreme_magnitudes_stay_finite(rng):
    for scale in (1e-38, 1e-30, 1e-3, 1e30, 3e38):
        x = (rng.uniform(-1, 1, 1000) * scale).astype(np.float32)
        h = AbsHistogram().update(x)
        assert int(h.hist.sum()) == h.count == 1000
        for method in HIST_METHODS:
            for qmax in (127, 32767):
                t = compute_threshold(h, method, qmax)
                assert math.isfinite(t) and 0 < t <= h.abs_max * (1 + 1e-12), (scale, method, t)


# ----------------------------------------------------------------------------- merge / save

def test_merge_equals_updating_with_both(rng):
    a_data = rng.standard_normal(3000).astype(np.float32) * 0.2
    b_data = rng.standard_normal(3000).astype(np.float32) * 40.0
    b_data[:5] = np.nan
    both = AbsHistogram(num_bins=512).update(a_data).update(b_data)
    for first, second in ((a_data, b_data), (b_data, a_data)):
        merged = AbsHistogram(num_bins=512).update(first).merge(AbsHistogram(num_bins=512).update(second))
        np.testing.assert_array_equal(merged.hist, both.hist)
        assert merged.to_dict() == both.to_dict()
    empty_merge = AbsHistogram(num_bins=512).merge(both)
    assert empty_merge.to_dict() == both.to_dict()
    assert AbsHistogram(num_bins=512).update(a_data).merge(AbsHistogram(num_bins=512)).count == 3000
    zeros_then = AbsHistogram(num_bins=512).update(np.zeros(7, np.float32)).merge(
        AbsHistogram(num_bins=512).update(a_data))
    np.testing.assert_array_equal(
        zeros_then.hist, AbsHistogram(num_bins=512).update(np.zeros(7, np.float32)).update(a_data).hist)
    with pytest.raises(ObserverError, match="512 and 256 bins"):
        AbsHistogram(num_bins=512).merge(AbsHistogram(num_bins=256))


def test_to_dict_from_dict_round_trip_through_json(rng):
    x = rng.standard_normal(10_000).astype(np.float32)
    x[:3] = [np.nan, np.inf, 0.0]
    h = AbsHistogram().update(x)
    d = json.loads(json.dumps(h.to_dict()))
    back = AbsHistogram.from_dict(d)
    np.testing.assert_array_equal(back.hist, h.hist)
    assert back.to_dict() == h.to_dict()
    assert _all_thresholds(back) == _all_thresholds(h)
    assert len(d["hist"]) <= h.num_bins                     # trailing empty bins are not stored
    assert isinstance(AbsMaxObserver.from_dict(d), AbsHistogram)
    m = AbsMaxObserver().update(x)
    assert AbsMaxObserver.from_dict(json.loads(json.dumps(m.to_dict()))).to_dict() == m.to_dict()
    bad = dict(d, count=d["count"] + 1)
    with pytest.raises(ObserverError, match="inconsistent"):
        AbsHistogram.from_dict(bad)
    with pytest.raises(ObserverError, match="not an observer"):
        AbsHistogram.from_dict({"hist": []})


def test_absmax_observer_has_the_same_scalars(rng):
    x = rng.standard_normal((4, 100)).astype(np.float32)
    x[0, :10] = 0
    x[1, 0] = np.nan
    h = AbsHistogram().update(x)
    m = AbsMaxObserver().update(x)
    for key in ("count", "nan_count", "inf_count", "zero_count", "abs_max", "min", "max"):
        assert getattr(m, key) == getattr(h, key), key
    assert compute_threshold(m, "max") == compute_threshold(h, "max")
    with pytest.raises(ObserverError, match="needs an AbsHistogram"):
        compute_threshold(m, "kl")
    assert type(make_observer("max")) is AbsMaxObserver
    assert isinstance(make_observer("mse", num_bins=256), AbsHistogram)
    assert isinstance(make_observer("mix"), AbsHistogram)
    with pytest.raises(ObserverError, match="did you mean 'percentile'"):
        make_observer("percentil")


# ----------------------------------------------------------------------------- max / percentile

def test_max_is_the_abs_max(rng):
    x = rng.standard_normal((2, 3, 17, 5)).astype(np.float32) * 3
    h = AbsHistogram().update(x[:1]).update(x[1:])
    assert threshold_max(h) == float(np.abs(x).max())


@pytest.mark.parametrize("data", ["gauss", "relu", "laplace"])
@pytest.mark.parametrize("p", [50.0, 90.0, 99.0, 99.9, 99.99, 100.0])
def test_percentile_matches_np_percentile_within_one_bin(rng, data, p):
    x = rng.standard_normal(400_000)
    if data == "relu":
        x = np.maximum(x, 0)
    elif data == "laplace":
        x = rng.laplace(size=400_000)
    x = x.astype(np.float32)
    a = np.abs(x).astype(np.float64)
    h = AbsHistogram().update(x)
    t = threshold_percentile(h, p)
    w = h.bin_width
    assert abs(t - np.percentile(a, p)) <= w
    v = np.percentile(a, p, method="inverted_cdf")        # smallest value with >= p% at or below
    assert 0 <= t - v <= w
    assert np.mean(a <= t) >= p / 100                     # the definition: covers p% of the mass
    if t < h.abs_max:
        assert np.mean(a < t - w) < p / 100                # and the edge below it does not


# ----------------------------------------------------------------------------- KL

@pytest.mark.parametrize("case", ["gauss_outliers", "laplace", "relu", "sparse", "uniform"])
@pytest.mark.parametrize("qmax", [127, 15])
def test_kl_matches_the_literal_tensorrt_loop(rng, case, qmax):
    n = 50_000
    if case == "gauss_outliers":
        x = np.concatenate([rng.standard_normal(n), [9.0, -12.0, 14.0]])
    elif case == "laplace":
        x = rng.laplace(size=n)
    elif case == "relu":
        x = np.maximum(rng.standard_normal(n), 0)
    elif case == "sparse":
        x = np.concatenate([rng.standard_normal(300), rng.uniform(-20, 20, 30)])
    else:
        x = rng.uniform(-1, 1, n)
    h = AbsHistogram(num_bins=512).update(x.astype(np.float32))
    curve = ref_kl_curve(h.hist, qmax + 1)
    best_i = min(curve, key=curve.get)
    ref_t = min(best_i * h.bin_width, h.abs_max)
    t = threshold_kl(h, qmax)
    i = int(round(t / h.bin_width)) if t < h.abs_max else max(curve)
    # same choice, or one whose reference KL ties the minimum (smoothing-level differences)
    assert t == ref_t or curve.get(i, math.inf) <= curve[best_i] + 1e-6, (t, ref_t)


@pytest.mark.parametrize("seed", range(4))
def test_kl_curve_equals_the_literal_loop_on_random_histograms(seed):
    """The closed form equals the loop at every candidate (up to the loop's 1e-4 smoothing)."""
    r = np.random.default_rng(seed)
    hist = r.integers(0, 400, 256) * (r.random(256) < 0.6)     # ~40% empty bins
    hist[r.integers(150, 256)] = 0
    hist[-1] = max(hist[-1], 3)
    d = AbsHistogram(num_bins=256).to_dict()
    d.update(hist=hist.tolist(), count=int(hist.sum()), range_exp=0, abs_max=0.999, min=-0.5, max=0.999)
    h = AbsHistogram.from_dict(d)
    for qmax in (15, 63):
        cands, kl = kl_divergence_curve(h, qmax)
        ref = ref_kl_curve(hist, qmax + 1)
        assert cands.tolist() == sorted(ref)
        got = dict(zip(cands.tolist(), kl.tolist()))
        for i, v in ref.items():
            if math.isinf(got[i]):
                assert v > min(ref.values()) + 1e-3       # smoothing made it finite but bad
            else:
                assert got[i] == pytest.approx(v, abs=2e-4), (qmax, i)


def test_kl_is_well_below_max_with_outliers_and_near_max_for_uniform(rng):
    x = rng.standard_normal(500_000).astype(np.float32)
    x[:8] = [15, -18, 20, -22, 25, 17, -16, 19]
    h = AbsHistogram().update(x)
    t = compute_threshold(h, "kl", 127)
    assert 2.5 < t < 0.5 * h.abs_max, t
    u = rng.uniform(-3, 3, 500_000).astype(np.float32)
    hu = AbsHistogram().update(u)
    assert compute_threshold(hu, "kl", 127) >= 0.95 * hu.abs_max
    # int16: more levels than bins, KL carries no information -> the max
    assert compute_threshold(h, "kl", 32767) == h.abs_max
    # stride trades resolution for speed but stays close
    assert abs(compute_threshold(h, "kl", 127, stride=8) - t) <= 8 * h.bin_width + 1e-12


# ----------------------------------------------------------------------------- MSE

def _laplace_with_outliers(rng, n=100_000):
    x = rng.laplace(size=n).astype(np.float32)
    x[:5] = [30, -35, 40, -28, 33]
    return x


@pytest.mark.parametrize("data", ["gauss", "laplace_outliers", "relu", "uniform", "int16_gauss", "spike"])
def test_mse_threshold_is_near_the_brute_force_optimum(rng, data):
    qmax = 127
    if data in ("gauss", "int16_gauss"):
        x = rng.standard_normal(100_000).astype(np.float32)
        qmax = 32767 if data == "int16_gauss" else 127
    elif data == "laplace_outliers":
        x = _laplace_with_outliers(rng)
    elif data == "relu":
        x = np.maximum(rng.standard_normal(100_000), 0).astype(np.float32)
    elif data == "spike":    # most values far below one step: rounding error is x^2, not s^2/12
        x = np.concatenate([rng.standard_normal(98_000) * 1e-3, rng.standard_normal(2_000)])
        x = x.astype(np.float32)
    else:
        x = rng.uniform(-2, 2, 100_000).astype(np.float32)
    x64 = x.astype(np.float64)
    h = AbsHistogram().update(x)
    t = threshold_mse(h, qmax)
    amax = float(np.abs(x64).max())
    grid = np.linspace(amax / 400, amax, 400)
    errs = np.array([quant_mse(x64, g, qmax) for g in grid])
    best = errs.min()
    got = quant_mse(x64, t, qmax)
    assert got <= 1.03 * best, (t, grid[errs.argmin()], got, best)
    # the model the search minimizes predicts the real error (the spike sits inside two bins,
    # where "uniform within a bin" is coarse)
    assert expected_quant_mse(h, qmax, [t])[0] == pytest.approx(got, rel=0.5 if data == "spike" else 0.1)
    if data == "laplace_outliers":                     # the test can tell a bad threshold
        assert quant_mse(x64, amax, qmax) > 1.3 * best


# ----------------------------------------------------------------------------- weights

def test_channel_abs_max_per_axis(rng):
    w = rng.standard_normal((6, 3, 3, 3)).astype(np.float32)
    for axis in (0, 1, -1):
        ax = axis % w.ndim
        ref = np.array([np.abs(np.take(w, c, axis=ax)).max() for c in range(w.shape[ax])], np.float32)
        got = channel_abs_max(w, axis)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(channel_abs_max(np.array([-3.0, 2.0]), 0), [3.0, 2.0])
    w[2] = 0
    with pytest.warns(ObserverWarning, match="1 of 6 weight channels are all zero"):
        guarded = channel_abs_max(w, 0)
    assert guarded[2] == np.float32(ZERO_DATA_THRESHOLD) and (guarded > 0).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert channel_abs_max(w, 0, guard=False)[2] == 0
    w[4, 0, 0, 1] = np.nan
    with pytest.raises(ObserverError, match=r"NaN/Inf in 1 of 6 channels.*\[4\]"):
        channel_abs_max(w, 0)
    with pytest.raises(ObserverError, match="axis 4 is out of range"):
        channel_abs_max(w, 4)


# ----------------------------------------------------------------------------- entry point

def test_compute_threshold_errors_and_options(gauss):
    h = AbsHistogram().update(gauss)
    with pytest.raises(ObserverError, match="did you mean 'kl'"):
        compute_threshold(h, "kll")
    with pytest.raises(ValueError, match="available: max, percentile, kl, mse"):
        compute_threshold(h, "entropy-ish")
    for bad in (0, -1, 100.5, float("nan"), "abc", True):
        with pytest.raises(ObserverError, match="percentile must be"):
            compute_threshold(h, "percentile", percentile=bad)
    assert compute_threshold(h, "percentile", percentile=100) == h.abs_max
    assert compute_threshold(h, "percentile", percentile="99.9") == threshold_percentile(h, 99.9)
    with pytest.raises(ObserverError, match="did you mean 'percentile'"):
        compute_threshold(h, "percentile", percentil=99.9)
    with pytest.raises(ObserverError, match="accepted: none"):
        compute_threshold(h, "max", stride=2)
    with pytest.raises(ObserverError, match="stride must be"):
        compute_threshold(h, "kl", stride=0)
    with pytest.raises(ObserverError, match="qmax"):
        compute_threshold(h, "kl", qmax=0)
    assert compute_threshold(h, "mse", 127, num_candidates="32", refine_rounds=1) > 0


def test_thresholds_are_always_finite_and_positive(rng):
    datasets = [
        np.array([1e-45], np.float32),                       # one denormal
        np.array([5.0], np.float32),                          # one value
        np.array([0.0, 0.0, 3.0], np.float32),
        np.full(1000, -2.5, np.float32),                      # constant
        rng.standard_normal(10) .astype(np.float32),
        np.concatenate([np.zeros(10_000), [1e6]]).astype(np.float32),
        rng.exponential(size=20_000).astype(np.float32) ** 4,
    ]
    for x in datasets:
        h = AbsHistogram().update(x)
        for method in HIST_METHODS:
            for qmax in (127, 32767):
                t = compute_threshold(h, method, qmax)
                assert math.isfinite(t) and 0 < t <= h.abs_max, (x[:3], method, qmax, t)


MONOTONE = """
<ir_version: 8, opset_import: ["" : 17]>
chain (float[1, 4, 6, 6] x) => (float[1, 8, 36] y, float[1, 8, 6, 6] z) {
    c = Conv(x, w)
    a = Add(c, three)
    k = Clip(a, zero, six)
    d = Div(k, six)
    m = Mul(c, d)
    n = Mul(m, minus)
    s = Sub(half, n)
    r = Relu(s)
    y = Reshape(r, shape)
    g = Sigmoid(c)
    u = Mul(c, g)
    t = Tanh(u)
    h = HardSigmoid <alpha = 0.3, beta = 0.4> (t)
    l = LeakyRelu <alpha = 0.1> (c)
    z = Add(h, l)
}
"""


def test_max_calibration_derives_monotone_ranges_exactly():
    """Values whose range follows from another observed value (Add/Sub/Mul/Div by constants,
    Clip, Relu, LeakyRelu, Reshape) get the same thresholds as observing every tensor; through
    Sigmoid, Tanh and HardSigmoid within onnxruntime's approximation of them (1e-6)."""
    import onnx
    import onnx.parser

    import qir
    from qir.passes import get_pass
    from qir.passes.calibrate.range_propagation import derivations
    from qir.runtimes.base import get_runtime

    model = onnx.parser.parse_model(MONOTONE)
    model.graph.initializer.append(onnx.numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((8, 4, 1, 1)).astype(np.float32), "w"))
    for name, value in (("three", 3.0), ("zero", 0.0), ("six", 6.0), ("minus", -0.7), ("half", 0.5)):
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(value, np.float32), name))
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([1, 8, 36], np.int64), "shape"))
    ir = qir.load(model)
    get_pass("insert-calibration")(ir)
    rng = np.random.default_rng(5)
    data = [{"x": (rng.standard_normal((1, 4, 6, 6)) * 3).astype(np.float32)} for _ in range(4)]
    values = list(dict.fromkeys(c.input for c in ir.calibrations("activation")))
    derived = derivations(ir, values)
    assert set(derived) >= {"g", "t", "h", "l"} and set(derived) <= {"a", "k", "d", "n", "s", "r", "g", "t", "h", "l"}
    get_pass("calibrate", data=data, method="max", progress=False)(ir)
    full = [get_runtime("ort", level="float").run(ir, s, capture=values) for s in data]
    for cal in ir.calibrations("activation"):
        want = max(float(np.max(np.abs(f[cal.input]))) for f in full)
        if cal.input in ("g", "t", "h"):  # through a transcendental kernel: onnxruntime's rounding
            assert float(cal.threshold) == pytest.approx(want, rel=1e-6), cal.name
        else:
            assert float(cal.threshold) == want, cal.name
