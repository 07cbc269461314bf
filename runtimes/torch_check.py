"""Checking a PyTorch import: the module (torch, the reference) against the imported IR on a runtime."""
from __future__ import annotations

import numpy as np

from qir.errors import InputError
from qir.execution import Runtime
from qir.io.torch_import import split_inputs, torch_outputs
from qir.runtimes.base import get_runtime

__all__ = ["check_against_torch"]


def check_against_torch(ir, module, example_inputs, runtime: str = Runtime.ORT) -> dict[str, float]:
    """Run ``module`` (torch, the reference) and ``ir`` (``runtime``) on the example inputs;
    ``{output: max |qir - torch| / max |torch|}``. An import is trusted at ≤ 1e-4."""
    ref = torch_outputs(module, example_inputs)
    args, kwargs = split_inputs(example_inputs)
    feeds = dict(zip(ir.inputs, [t.detach().cpu().numpy() for t in list(args) + list(kwargs.values())]))
    got = get_runtime(runtime, level="float").run(ir, feeds)
    out = {}
    for name, want in ref.items():
        if name not in got:
            raise InputError(f"torch output {name!r} is not an output of the IR ({list(ir.outputs)})")
        scale = max(float(np.abs(want).max()), 1e-12)
        out[name] = float(np.abs(got[name].astype(np.float64) - want).max()) / scale
    return out
