"""Elementwise kernels with numpy broadcasting (ONNX multidirectional broadcast).

Arithmetic keeps the input dtype (ONNX requires both operands to share it). Comparisons and
logical ops return bool. Floating-point warnings (overflow, invalid, divide by zero) are
silenced: ONNX defines the IEEE result (inf / nan), not an error.
"""
from __future__ import annotations

import numpy as np

from qir.runtimes.numpy_ref.kernels import _parallel
from qir.runtimes.numpy_ref.registry import kernel

# --------------------------------------------------------------------------------------
# binary arithmetic
# --------------------------------------------------------------------------------------


def _same_dtype(result: np.ndarray, like: np.ndarray) -> np.ndarray:
    result = np.asarray(result)
    return result if result.dtype == like.dtype else result.astype(like.dtype)


# ONNX ops that are exactly one numpy ufunc (numpy broadcasting is ONNX's multidirectional
# broadcast; arithmetic keeps the operands' dtype, comparisons and logic give bool)
_UFUNC_OPS = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply,
    "Equal": np.equal, "Greater": np.greater, "Less": np.less,
    "GreaterOrEqual": np.greater_equal, "LessOrEqual": np.less_equal,
    "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor,
    "Not": np.logical_not, "IsNaN": np.isnan,
}
for _name, _ufunc in _UFUNC_OPS.items():
    kernel(_name)(_ufunc)


@kernel("Div")
def div(a, b):
    """a / b. Integer division truncates toward zero (C semantics, as onnxruntime does:
    -7 / 2 = -3), unlike numpy's floor division."""
    a = np.asarray(a)
    b = np.asarray(b)
    if np.issubdtype(a.dtype, np.integer):
        if np.issubdtype(a.dtype, np.unsignedinteger):
            return np.floor_divide(a, b)
        # a - fmod(a, b) is an exact multiple of b, so the floor division below is exact.
        return np.floor_divide(a - np.fmod(a, b), b)
    with np.errstate(all="ignore"):
        return np.divide(a, b)


@kernel("Mod")
def mod(a, b, *, fmod=0):
    """fmod=0: the remainder takes the divisor's sign (Python/numpy ``%``, integers only);
    fmod=1: C fmod, the remainder takes the dividend's sign."""
    with np.errstate(all="ignore"):
        if fmod:
            return np.fmod(a, b)
        return np.mod(a, b)


@kernel("Pow")
def pow_(x, y):
    """x ** y; the output has x's dtype (the exponent may be of another numeric type)."""
    x = np.asarray(x)
    y = np.asarray(y)
    with np.errstate(all="ignore"):
        if np.issubdtype(x.dtype, np.floating):
            if y.dtype != x.dtype:
                y = y.astype(x.dtype) if np.issubdtype(y.dtype, np.integer) else y
            if y.ndim == 0 and y == 2:
                return np.square(x)
            return _same_dtype(np.power(x, y), x)
        # integer base: compute in float64 when the exponent is float or negative, then truncate
        if np.issubdtype(y.dtype, np.floating) or (np.asarray(y) < 0).any():
            return _same_dtype(np.trunc(np.power(x.astype(np.float64), y.astype(np.float64))), x)
        return _same_dtype(np.power(x, y.astype(x.dtype)), x)


def _fold(ufunc, xs):
    """ufunc applied left to right over any number of broadcastable inputs (a copy for one)."""
    out = xs[0]
    for x in xs[1:]:
        out = ufunc(out, x)
    return np.array(out, copy=True) if len(xs) == 1 else out


@kernel("Min")
def min_(*xs):
    """Elementwise minimum of any number of broadcastable inputs (NaN propagates)."""
    return _fold(np.minimum, xs)


@kernel("Max")
def max_(*xs):
    """Elementwise maximum of any number of broadcastable inputs (NaN propagates)."""
    return _fold(np.maximum, xs)


@kernel("Sum")
def sum_(*xs):
    return _fold(np.add, xs)


@kernel("Mean")
def mean_(*xs):
    out = sum_(*xs)
    return _same_dtype(out / np.asarray(len(xs), dtype=out.dtype), out)


# --------------------------------------------------------------------------------------
# unary math
# --------------------------------------------------------------------------------------


def _unary(name: str, fn):
    def k(x):
        with np.errstate(all="ignore"):
            return _same_dtype(fn(x), np.asarray(x))

    k.__name__ = name.lower()
    k.__doc__ = f"ONNX {name}: elementwise, same dtype as the input."
    kernel(name)(k)
    return k


@kernel("Exp")
def exp(x):
    """exp(x); large inputs are split across threads (numpy's float32 exp is scalar code)."""
    x = np.asarray(x)

    def into(src, dst):
        with np.errstate(all="ignore"):
            np.exp(src, out=dst)

    return _parallel.unary(into, x) if np.issubdtype(x.dtype, np.floating) else _same_dtype(np.exp(x), x)


for _name, _fn in {
    "Sqrt": np.sqrt,
    "Log": np.log,
    "Neg": np.negative,
    "Abs": np.abs,
    "Reciprocal": np.reciprocal,
    "Floor": np.floor,
    "Ceil": np.ceil,
    "Round": np.round,  # half to even, as ONNX specifies
    "Sign": np.sign,
    "Sin": np.sin,
    "Cos": np.cos,
    "Tan": np.tan,
    "Asin": np.arcsin,
    "Acos": np.arccos,
    "Atan": np.arctan,
    "Sinh": np.sinh,
    "Cosh": np.cosh,
    "Asinh": np.arcsinh,
    "Acosh": np.arccosh,
    "Atanh": np.arctanh,
}.items():
    _unary(_name, _fn)


# Cody's rational Chebyshev approximations (W. J. Cody, "Rational Chebyshev approximations for
# the error function", Math. Comp. 1969; the CALERF routine). Relative error < 1e-15 in float64.
_ERF_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02,
          3.20937758913846947e03, 1.85777706184603153e-1)
_ERF_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
          2.84423683343917062e03)
_ERF_C = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
          2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03,
          2.05107837782607147e03, 1.23033935479799725e03, 2.15311535474403846e-8)
_ERF_D = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
          1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
          3.43936767414372164e03, 1.23033935480374942e03)
_ERF_P = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1,
          1.60837851487422766e-2, 6.58749161529837803e-4, 1.63153871373020978e-2)
_ERF_Q = (2.56852019228982242e00, 1.87295284992346725e00, 5.27905102951428412e-1,
          6.05183413124413191e-2, 2.33520497626869185e-3)
_INV_SQRT_PI = 5.6418958354775628695e-1


def _exp_minus_square(t: np.ndarray) -> np.ndarray:
    """exp(-t*t) computed as exp(-s*s) * exp(-(t-s)(t+s)) with s = t rounded down to 1/16
    (Cody's trick: avoids the cancellation error of forming t*t)."""
    s = np.trunc(t * 16.0) / 16.0
    return np.exp(-s * s) * np.exp(-(t - s) * (t + s))


def erf_array(x: np.ndarray) -> np.ndarray:
    """erf(x) in float64 with Cody's three-interval rational approximations:

    * |x| <= 0.46875: erf = x * P(x^2) / Q(x^2);
    * 0.46875 < |x| <= 4: erfc = exp(-x^2) * P(|x|) / Q(|x|), erf = 1 - erfc;
    * |x| > 4: erfc = exp(-x^2) / |x| * (1/sqrt(pi) + P(1/x^2) / (x^2 Q(1/x^2))).

    The sign is restored with copysign (erf is odd); NaN stays NaN.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.abs(x)
    out = np.empty_like(y)
    small = y <= 0.46875
    large = y > 4.0
    mid = ~(small | large)  # also holds NaN, which propagates through the arithmetic
    with np.errstate(all="ignore"):
        if small.any():
            t = y[small]
            z = t * t
            num = _ERF_A[4] * z
            den = z
            for i in range(3):
                num = (num + _ERF_A[i]) * z
                den = (den + _ERF_B[i]) * z
            out[small] = t * (num + _ERF_A[3]) / (den + _ERF_B[3])
        if mid.any():
            t = y[mid]
            num = _ERF_C[8] * t
            den = t
            for i in range(7):
                num = (num + _ERF_C[i]) * t
                den = (den + _ERF_D[i]) * t
            out[mid] = 1.0 - _exp_minus_square(t) * (num + _ERF_C[7]) / (den + _ERF_D[7])
        if large.any():
            t = y[large]
            z = 1.0 / (t * t)
            num = _ERF_P[5] * z
            den = z
            for i in range(4):
                num = (num + _ERF_P[i]) * z
                den = (den + _ERF_Q[i]) * z
            r = (_INV_SQRT_PI - z * (num + _ERF_P[4]) / (den + _ERF_Q[4])) / t
            erfc = np.nan_to_num(_exp_minus_square(t) * r, nan=0.0)  # inf -> 0
            out[large] = 1.0 - erfc
    return np.copysign(out, x)


@kernel("Erf")
def erf(x):
    """Gauss error function, evaluated in float64 (Cody's rational approximations, relative
    error < 1e-15) and rounded to the input dtype."""
    x = np.asarray(x)
    return _same_dtype(erf_array(x), x)


# --------------------------------------------------------------------------------------
# comparisons, logic, selection
# --------------------------------------------------------------------------------------


@kernel("IsInf")
def isinf(x, *, detect_negative=1, detect_positive=1):
    x = np.asarray(x)
    return (np.isposinf(x) & bool(detect_positive)) | (np.isneginf(x) & bool(detect_negative))


@kernel("Where")
def where(condition, x, y):
    """condition ? x : y with three-way broadcasting."""
    return np.where(np.asarray(condition, dtype=bool), x, y)


# --------------------------------------------------------------------------------------
# identity-like and type conversion
# --------------------------------------------------------------------------------------


@kernel("Identity")
def identity(x):
    return x


@kernel("Dropout", context=("_num_outputs",))
def dropout(data, ratio=None, training_mode=None, *, seed=None, _num_outputs=1, **_legacy):
    """Inference Dropout: the identity; the optional mask output is all True.
    (``is_test``/``ratio`` attributes of opsets < 12 are accepted and ignored.)"""
    if training_mode is not None and bool(np.asarray(training_mode)):
        raise NotImplementedError("Dropout with training_mode=True is random; only inference is supported")
    if _num_outputs > 1:
        return data, np.ones(np.shape(data), dtype=bool)
    return data


@kernel("Cast")
def cast(x, *, to, saturate=1, round_mode="up"):
    """Convert to the ONNX TensorProto element type ``to``. float -> int truncates toward zero;
    number -> bool is ``x != 0``; to float8, out-of-range values saturate to the largest finite
    value (``saturate``, the default) and float8e8m0 rounds by ``round_mode``, as ONNX's
    reference does (:func:`_cast_to`)."""
    from onnx.helper import tensor_dtype_to_np_dtype

    return _cast_to(np.asarray(x), np.dtype(tensor_dtype_to_np_dtype(int(to))), saturate, round_mode)


@kernel("CastLike")
def cast_like(x, target, *, saturate=1, round_mode="up"):
    """Cast to ``target``'s element type (as Cast)."""
    return _cast_to(np.asarray(x), np.asarray(target).dtype, saturate, round_mode)


_FLOAT8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")


def _cast_to(x: np.ndarray, dtype: np.dtype, saturate, round_mode: str) -> np.ndarray:
    """``x`` as ``dtype`` with ONNX's Cast rules (the float8 formats and float8e8m0 through
    onnx.numpy_helper, as ONNX's reference casts them)."""
    from onnx import numpy_helper

    if dtype == np.bool_:
        return x != 0
    if x.dtype == dtype:
        return x
    with np.errstate(all="ignore"):
        if dtype.name in _FLOAT8 and saturate:
            return numpy_helper.saturate_cast(x, dtype)
        if dtype.name == "float8_e8m0fnu":
            return numpy_helper.to_float8e8m0(x, bool(saturate), round_mode).astype(dtype)
        return x.astype(dtype)
