"""``qir profile --cost``: the latency model of a float or calibrated model on a march
(:mod:`qir.passes.lib.latency`), at every op in int8, int16 and fp16 and, for a calibrated model,
at its own precisions.

A float model is estimated as the march would run it after ``fold-bn`` (a BatchNormalization
after a Conv folds into it; a clone is folded, the model is left as it is); a calibrated model
has been folded already.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from qir.api import as_ir, load
from qir.errors import InputError
from qir.graph import QIR
from qir.passes import get_pass
from qir.passes.lib.latency import LatencyModel, ModelCost
from qir.passes.lib.latency_table import LatencyTable, read_latency_table
from qir.runtimes.march import MarchProfile, get_profile

__all__ = ["CostReport", "COLUMNS", "model_cost"]

logger = logging.getLogger(__name__)

#: The uniform precisions every report shows, in column order.
COLUMNS = ("int8", "int16", "fp16")


@dataclass(frozen=True)
class CostReport:
    """The estimates of one model: ``columns`` maps a column name (:data:`COLUMNS`, and
    ``calibrated`` for a calibrated model's own precisions) to its :class:`ModelCost`."""

    model: str
    march: MarchProfile
    columns: dict[str, ModelCost]
    table: LatencyTable | None
    unknown_shapes: tuple[str, ...]   # activations whose shape is not static (they count 0)

    @property
    def unused_rows(self) -> tuple[int, ...]:
        """Lines of the latency table that matched no group in any column."""
        if self.table is None:
            return ()
        used = {g.measured.line for c in self.columns.values() for g in c.groups if g.measured}
        return tuple(e.line for e in self.table.entries if e.line not in used)


def _dynamic(ir: QIR) -> tuple[str, ...]:
    return tuple(v.name for v in ir.activations()
                 if v.shape is None or not all(isinstance(d, int) and d >= 0 for d in v.shape))


def _check_inputs(ir: QIR, model: str) -> None:
    dynamic = [(n, ir.value(n).shape) for n in ir.inputs
               if ir.value(n).shape is None or not all(isinstance(d, int) for d in ir.value(n).shape)]
    if dynamic:
        shown = ", ".join(f"{n}: {','.join('?' if not isinstance(d, int) else str(d) for d in (s or ()))}"
                          for n, s in dynamic)
        raise InputError(f"{model} has dynamic input shapes ({shown}); the latency model counts bytes, so fix them: "
                         f"--input-shape {dynamic[0][0]}=1,3,640,640 with your sizes (input_shapes= in Python)")


def model_cost(model: str | Path | QIR, march: str | MarchProfile = "nash-e", *,
               input_shapes: Mapping[str, Sequence[int]] | Sequence[int] | None = None,
               latency_table: str | Path | None = None) -> CostReport:
    """The latency estimates of ``model`` on ``march`` (see the module docstring).

    Raises:
        InputError: a dynamic input shape without ``input_shapes``; a malformed latency table.
    """
    profile = get_profile(march)
    table = read_latency_table(latency_table) if latency_table is not None else None
    if isinstance(model, QIR):
        ir, name = model.clone(), model.name
    else:
        name = str(model)
        shapes = input_shapes
        if isinstance(shapes, (list, tuple)):
            probe = as_ir(model)
            shapes = {probe.inputs[0]: list(shapes)}
        ir = load(model, input_shapes=shapes) if shapes else as_ir(model)
    _check_inputs(ir, name)
    calibrated = bool(ir.calibrations())
    if not calibrated and ir.ops("BatchNormalization"):
        get_pass("fold-bn")(ir)
    latency = LatencyModel(ir, profile, table=table)
    columns = {c: latency.estimate(c) for c in COLUMNS}
    if calibrated:
        columns["calibrated"] = latency.estimate()
    unknown = _dynamic(ir)
    if unknown:
        logger.warning("%d value(s) have no static shape; their ops count 0 FLOPs and bytes (first: %s)",
                       len(unknown), unknown[0])
    return CostReport(name, profile, columns, table, unknown)
