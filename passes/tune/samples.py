"""The evaluation and check samples of ``qir tune``, each checked against the model's inputs."""
from __future__ import annotations

from typing import Any

from qir.data import model_samples
from qir.errors import InputError
from qir.graph import QIR
from qir.runtimes.base import check_feeds

__all__ = ["checked_samples"]


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
