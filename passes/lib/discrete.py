"""Discrete ops replay float results: sort/top-k/arg-max indices taken from the baseline run.

An index output (TopK's indices, ArgMax, ArgMin, NonZero, NonMaxSuppression) flips when a
quantized score crosses its neighbour, and one flip can move a whole gathered row: the output
error then measures which item won, not how well the values were quantized. Seed 002's tool
replays the float results of such ops; bad-case search and sensitivity here do the same by
default (``replay_discrete=True``):

1. :func:`replayed` makes a copy of the analysis model in which each index output is a graph
   input of the same name (TopK keeps its values output as ``GatherElements(X, indices, axis)``,
   so the values still carry the quantized scores, in the float order).
2. :func:`with_replay` adds to each sample the index values of the baseline model's run on it.

A model without such ops is used as it is.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping

import numpy as np

from qir.execution import Runtime
from qir.graph import QIR
from qir.records import OpRecord

__all__ = ["DISCRETE", "index_values", "replayed", "with_replay"]

logger = logging.getLogger(__name__)

# op type -> its index outputs (by position)
DISCRETE = {"TopK": (1,), "ArgMax": (0,), "ArgMin": (0,), "NonZero": (0,), "NonMaxSuppression": (0,)}


def index_values(ir: QIR) -> list[str]:
    """The index outputs of the discrete ops in ``ir`` that something reads."""
    return [op.outputs[k] for op in ir.ops() if op.op_type in DISCRETE and not op.domain
            for k in DISCRETE[op.op_type] if k < len(op.outputs) and op.outputs[k]
            and (ir.uses(op.outputs[k]) or op.outputs[k] in ir.outputs)]


def replayed(ir: QIR) -> QIR | None:
    """A copy of ``ir`` whose discrete index outputs are graph inputs (module docstring), or
    None when it has none."""
    names = set(index_values(ir))
    if not names:
        return None
    new = ir.clone()
    for op in [o for o in new.ops() if names & set(o.outputs)]:
        _replace(new, op)
    new.prune()
    logger.info("replaying float indices for %d discrete op output(s)", len(names))
    return new


def _replace(ir: QIR, op: OpRecord) -> None:
    """Turn ``op``'s index outputs into graph inputs of the same names (TopK's values into a
    GatherElements on them): readers move to temporary inputs, the op goes, the names come back."""
    temps = {o: ir.add_input(f"{o}.qir_replay", ir.value(o).dtype, ir.value(o).shape) for o in op.outputs if o}
    for o, temp in temps.items():
        ir.replace_uses(o, temp.name)
    ir.remove_node(op.name)
    for k in DISCRETE[op.op_type]:
        if k < len(op.outputs) and op.outputs[k]:
            ir.add_input(op.outputs[k], "int64", temps[op.outputs[k]].shape)
    if op.op_type == "TopK" and op.outputs[0]:
        values = temps[op.outputs[0]]
        ir.add_op(f"{op.name}.replay", "GatherElements", [op.inputs[0], op.outputs[1]], [op.outputs[0]],
                  attrs={"axis": int(op.attrs.get("axis", -1))},
                  output_info={op.outputs[0]: (values.dtype, values.shape)})
    for o, temp in temps.items():
        if ir.has_value(o):
            ir.replace_uses(temp.name, o)
        ir.remove_value(temp.name)


def with_replay(baseline: QIR, level: str, samples: list[Mapping[str, Any]], values: list[str],
                runtime: str = Runtime.ORT) -> list[dict[str, np.ndarray]]:
    """``samples`` with the baseline's ``values`` (run at ``level``) added to each."""
    from qir.runtimes.base import get_runtime

    rt = get_runtime(runtime, level=level)
    out = []
    for sample in samples:
        got = rt.run(baseline, sample, capture=values)
        out.append({**sample, **{v: np.asarray(got[v]) for v in values}})
    return out
