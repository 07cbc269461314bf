"""``set-mode``: choose calibration nodes and set their mode or a fixed threshold."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from qir.errors import InputError
from qir.graph import QIR
from qir.kinds import CalibMode, CalibRole
from qir.passes.base import Pass, PassResult, register_pass
from qir.passes.lib.repair import weight_tied_ops
from qir.passes.lib.selection import as_name_list, select_calibrations

__all__ = ["SetModePass"]

logger = logging.getLogger(__name__)


def _names_from_file(path: str | Path) -> list[str]:
    p = Path(path)
    if not p.exists():
        raise InputError(f"node list file not found: {p}")
    lines = (line.split("#", 1)[0].strip() for line in p.read_text().splitlines())
    names = [line for line in lines if line]
    if not names:
        raise InputError(f"{p} lists no node names (one per line, # starts a comment)")
    return names


@register_pass
class SetModePass(Pass):
    """Set the mode (int8/int16/fp16/float) or a fixed threshold of selected calibration nodes.

    Selection: ``nodes`` (names/globs of calibration nodes, general nodes or module paths;
    comma-separated or a list), ``from_file`` (one name per line, ``#`` comments), ``op_types``,
    ``role``; ``sensitive`` (a ``sensitive_ops.json`` from op-sensitivity / ``qir compare``) with
    ``top_k`` or ``ratio``: the calibration nodes of its most sensitive rows; criteria combine
    with AND. Changing every calibration node takes ``all=True`` (``--all``): no criterion at all
    is an error, and so is a name or glob that matches nothing, or criteria whose intersection is
    empty (a selector that selects nothing is a mistake, not a request to change nothing).
    ``threshold`` sets a per-tensor threshold, marks it ``fixed`` (calibration will not change it)
    and drops any imported scale.
    """

    name = "set-mode"

    def __init__(self, mode: str | None = None, nodes: str | list[str] | None = None,
                 *, op_types: str | list[str] | None = None, role: str | None = None,
                 from_file: str | None = None, threshold: float | None = None, sensitive: str | None = None,
                 top_k: int | None = None, ratio: float | None = None, all: bool = False) -> None:  # noqa: A002
        if mode is None and threshold is None:
            raise InputError("set-mode needs a mode (int8, int16, fp16, float) or a threshold")
        try:
            self.mode = CalibMode(mode) if mode is not None else None
        except ValueError:
            raise InputError(f"unknown mode {mode!r}; choose int8, int16, fp16 or float") from None
        if threshold is not None and not (np.isfinite(threshold) and threshold > 0):
            raise InputError(f"threshold must be a finite number > 0, got {threshold!r}")
        if role is not None and role not in ("weight", "activation"):
            raise InputError(f"role must be 'weight' or 'activation', got {role!r}")
        self.nodes = as_name_list(nodes) + (_names_from_file(from_file) if from_file else [])
        if sensitive is not None:
            from qir.passes.set_mode.sensitivity_table import load_report, select_sensitive

            self.nodes += select_sensitive(load_report(sensitive), top_k, ratio)
        elif top_k is not None or ratio is not None:
            raise InputError("--top-k / --ratio choose rows of a sensitivity report: give --sensitive "
                             "sensitive_ops.json (sensitive=... in Python)")
        self.op_types, self.role, self.threshold = as_name_list(op_types), role, threshold
        criteria = "--nodes, --op-types, --role, --from-file or --sensitive"
        selected = bool(self.nodes or self.op_types or role)
        if not selected and not all:
            raise InputError(f"set-mode needs the calibration nodes to change: {criteria}, or --all for every "
                             "one (all=True in Python)")
        if selected and all:
            raise InputError(f"--all selects every calibration node; give it without {criteria}")
        self.all = bool(all)
        self.options = {k: v for k, v in (("mode", mode), ("nodes", self.nodes or None),
                                          ("op_types", self.op_types or None), ("role", role),
                                          ("threshold", threshold), ("all", self.all or None)) if v is not None}

    def run(self, ir: QIR) -> PassResult:
        if not ir.calibrations():  # before selecting: a name the model has would read as "no such node"
            raise InputError(f"set-mode: the model {ir.name!r} has no calibration nodes; calibrate it first "
                             "(qir calibrate)")
        chosen = select_calibrations(ir, self.nodes, self.op_types, self.role)
        if not chosen:
            what = ", ".join(f"{k}={v}" for k, v in self.options.items() if k not in ("mode", "threshold"))
            raise InputError(f"set-mode: {what} selects no calibration node of {ir.name!r}")
        fixed = {} if self.threshold is None else {"threshold": np.float32(self.threshold), "axis": None, "fixed": True}
        tied = _tied_weights(ir, chosen)  # (read before the change: a note may mean "the mode now")
        changed = [cal.name for cal in chosen if ir.set_calibration(cal.name, mode=self.mode, **fixed)]
        logger.info("set-mode: %d of %d selected calibration node(s) changed", len(changed), len(chosen))
        stale = _stale_repairs(ir, tied, changed)
        if stale:
            logger.warning("set-mode: %d layer(s) had their weights fitted by a repair at another mode (bias-correct, "
                           "round-weights): %s; its correction is stale next to these weights (run the repair again on "
                           "the model with the new modes, or leave these weights as they were)", len(stale),
                           ", ".join(f"{op} (fitted at {mode})" for op, mode in list(stale.items())[:4]))
        return PassResult(ir, bool(changed), {"selected": [c.name for c in chosen], "changed": changed,
                                              **({"stale_repairs": stale} if stale else {})})


def _tied_weights(ir: QIR, chosen) -> dict[str, str]:
    """:func:`qir.passes.lib.repair.weight_tied_ops` where a weight calibration node is among
    ``chosen`` (nothing to check otherwise); a note it cannot read is said, not fatal (the check
    is advice)."""
    if not any(cal.role is CalibRole.WEIGHT for cal in chosen):
        return {}
    try:
        return weight_tied_ops(ir)
    except InputError as exc:
        logger.warning("set-mode: cannot tell whether a repair fitted these weights: %s", exc)
        return {}


def _stale_repairs(ir: QIR, tied: dict[str, str], changed: list[str]) -> dict[str, str]:
    """Op -> the weight mode a repair fitted it at (``tied``), for each op whose weight
    calibration node ``changed`` now holds another mode."""
    stale: dict[str, str] = {}
    for cal in map(ir.calibration, changed):
        if cal.role is not CalibRole.WEIGHT:
            continue
        for op, _ in ir.uses(cal.output):
            fitted = tied.get(getattr(op, "name", ""))
            if fitted is not None and fitted != cal.mode.value:
                stale[op.name] = fitted
    return stale
