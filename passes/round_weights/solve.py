"""How ``round-weights`` chooses one layer's int8 weights from rows of its input (see
:mod:`.layers`): AdaRound with torch, an output-MSE per-channel threshold search without.

Both minimise the layer's output error ``|W_g · x̂ - W_g^float · x|²`` over the rows (``x̂``: the
quantized model's input rows or the float ones, ``x``: the float ones; the bias cancels), and a
choice is kept only where it beats rounding to nearest on all the rows.
"""
from __future__ import annotations

import base64
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qir.passes.round_weights.layers import Layer

__all__ = ["Choice", "nearest_codes", "output_mse", "adaround", "threshold_search", "load_torch", "apply_rows",
           "encode_up", "decode_up", "chosen_threshold", "QMIN", "QMAX"]

logger = logging.getLogger(__name__)

QMIN, QMAX = -128, 127
ZETA, GAMMA = 1.1, -0.1  # the rectified sigmoid's stretch (Nagel et al. 2020, eq. 23)


@dataclass
class Choice:
    """What was chosen for a layer: ``method``, the output MSE with nearest rounding and with the
    choice, and the choice itself: ``up`` (AdaRound: codes are ``floor(w/s) + up``) or
    ``factors`` (threshold search: the new threshold is ``factor · threshold`` per channel)."""

    method: str
    mse_nearest: float
    mse_chosen: float
    up: np.ndarray | None = None
    factors: list[float] | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def better(self) -> bool:
        return self.mse_chosen < self.mse_nearest


def load_torch():
    """torch, or None when it is not installed (then the threshold search runs)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def nearest_codes(w: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The codes the fake-quant runtimes give: ``clip(rint(w / s))`` in float32."""
    return np.clip(np.rint(w.astype(np.float32) / scale), QMIN, QMAX)


def output_mse(layer: Layer, w: np.ndarray, xq: np.ndarray, target: np.ndarray, axis_mean: bool = True):
    """Mean squared output error of weight ``w`` on rows ``xq`` against ``target``
    ``(R, groups, out/groups)``: a float, or per output channel ``(groups, out/groups)``."""
    err = (apply_rows(layer.gemm(w), xq) - target) ** 2
    return float(err.mean(dtype=np.float64)) if axis_mean else err.mean(axis=0, dtype=np.float64)


def apply_rows(w_gemm: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``(R, groups, out/groups)`` outputs of the GEMM view ``(groups, out/groups, K)`` on rows
    ``(R, groups, K)``, by float32 matrix products (BLAS)."""
    out = np.matmul(x.astype(np.float32).transpose(1, 0, 2), w_gemm.astype(np.float32).transpose(0, 2, 1))
    return out.transpose(1, 0, 2)


def encode_up(up: np.ndarray) -> str:
    return base64.b64encode(np.packbits(up.astype(bool).ravel()).tobytes()).decode("ascii")


def decode_up(text: str, shape: tuple[int, ...]) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(base64.b64decode(text), np.uint8))[: int(np.prod(shape))]
    return bits.reshape(shape).astype(np.float32)


def threshold_search(layer: Layer, xq: np.ndarray, target: np.ndarray, factors: np.ndarray) -> Choice:
    """Per output channel (the weight calibration node's axis, which must be the output-channel
    axis; one factor for all when it is per tensor), the factor of the threshold whose rounding
    gives the least output MSE (output channel c depends on weight channel c alone). ``factors``
    holds 1.0, which wins ties."""
    w = layer.weight
    nearest = output_mse(layer, nearest_codes(w, layer.scale) * layer.scale, xq, target)
    table = []
    for f in factors:
        sf = layer.scale_for(layer.threshold * np.float32(f))
        err = output_mse(layer, nearest_codes(w, sf) * sf, xq, target, axis_mean=False)
        table.append(err.reshape(-1) if layer.cal.axis is not None else np.array([err.mean()]))
    table = np.stack(table)  # (factors, channels)
    chosen = np.asarray(factors, np.float64)[np.argmin(table, axis=0)]
    one = list(factors).index(1.0)
    chosen[table.min(axis=0) >= table[one]] = 1.0
    sf = layer.scale_for(chosen_threshold(layer, chosen))
    after = output_mse(layer, nearest_codes(w, sf) * sf, xq, target)
    return Choice("threshold", nearest, after, factors=[float(f) for f in chosen],
                  detail={"channels_shrunk": int(np.sum(chosen < 1.0))})


def chosen_threshold(layer: Layer, factors) -> np.ndarray:
    """The calibration threshold ``factor · threshold`` (per channel, or one factor)."""
    f = np.asarray(factors, np.float32)
    return (layer.threshold * (f if layer.threshold.ndim else f[0])).astype(np.float32)


def adaround(torch, layer: Layer, xq: np.ndarray, target: np.ndarray, *, iterations: int, batch: int,
             reg: float, lr: float, seed: int, deadline: float | None = None) -> Choice | None:
    """AdaRound (Nagel et al. 2020) on one layer: a soft rounding variable ``V`` per weight,
    ``h(V) = clip(sigmoid(V)·(ζ-γ)+γ, 0, 1)``, weights ``s·clip(floor(w/s) + h(V))``, Adam on the
    rows' squared output error (summed over channels, mean over rows) plus
    ``reg · Σ(1 - |2h-1|^β)`` with β annealed from 20 to 2 after a warm-up of a fifth of the
    iterations; the rounding is then ``h ≥ 0.5``. None when ``deadline`` passes first. A small
    layer (under 2^24 multiply-adds a step) runs on one thread: more only wait on each other."""
    threads = torch.get_num_threads()
    g, o, k = layer.row_size
    if min(batch, len(xq)) * g * o * k < 1 << 24:
        torch.set_num_threads(1)
    try:
        return _adaround(torch, layer, xq, target, iterations=iterations, batch=batch, reg=reg, lr=lr, seed=seed,
                         deadline=deadline)
    finally:
        torch.set_num_threads(threads)


def _adaround(torch, layer: Layer, xq: np.ndarray, target: np.ndarray, *, iterations: int, batch: int,
              reg: float, lr: float, seed: int, deadline: float | None) -> Choice | None:
    gen = torch.Generator().manual_seed(seed)
    w, s = torch.tensor(layer.weight), torch.tensor(layer.scale)
    floor = torch.floor(w / s)
    rest = torch.clamp(w / s - floor, 0.01, 0.99)
    v = (-torch.log((ZETA - GAMMA) / (rest - GAMMA) - 1)).requires_grad_(True)
    x, t = torch.tensor(xq), torch.tensor(target, dtype=torch.float32)
    # the output error is scaled to the target's mean energy per row, so ``reg`` weighs the same on any layer
    norm = float((t ** 2).sum(dim=(1, 2)).mean()) or 1.0
    opt = torch.optim.Adam([v], lr=lr)
    warm = iterations // 5
    for it in range(iterations):
        if deadline is not None and it % 25 == 0 and time.monotonic() > deadline:
            return None
        pick = torch.randint(0, len(x), (min(batch, len(x)),), generator=gen)
        h = torch.clamp(torch.sigmoid(v) * (ZETA - GAMMA) + GAMMA, 0, 1)
        wt = s * torch.clamp(floor + h, QMIN, QMAX)
        out = torch.einsum("rgk,gok->rgo", x[pick], layer.gemm(wt))
        loss = ((out - t[pick]) ** 2).sum(dim=(1, 2)).mean() / norm
        if it >= warm:
            beta = 2 + (20 - 2) * (1 - (it - warm) / max(1, iterations - warm))
            loss = loss + reg * (1 - (2 * h - 1).abs().pow(beta)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        up = (torch.sigmoid(v) * (ZETA - GAMMA) + GAMMA >= 0.5).numpy().astype(np.float32)
    codes = np.clip(floor.numpy() + up, QMIN, QMAX)
    nearest = nearest_codes(layer.weight, layer.scale)
    return Choice("adaround", output_mse(layer, nearest * layer.scale, xq, target),
                  output_mse(layer, codes * layer.scale, xq, target), up=up,
                  detail={"flipped": int(np.sum(codes != nearest)), "iterations": iterations})
