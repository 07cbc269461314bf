"""``set-mode``: choose calibration nodes and set their mode or a fixed threshold."""
from __future__ import annotations

import fnmatch
import logging
from pathlib import Path
from typing import Iterable

import numpy as np

from qir.errors import InputError, NotFoundError, did_you_mean
from qir.graph import QIR
from qir.kinds import CalibMode, CalibRole
from qir.records import CalibRecord

from ..runtimes.numerics import set_mode
from .base import Pass, PassResult, register_pass

__all__ = ["SetModePass", "select_calibrations", "as_name_list"]

logger = logging.getLogger(__name__)

_GLOB = set("*?[")


def as_name_list(value: str | Iterable[str] | None) -> list[str]:
    """Names from a comma-separated string or a list (None → [])."""
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value]


def _names_from_file(path: str | Path) -> list[str]:
    p = Path(path)
    if not p.exists():
        raise InputError(f"node list file not found: {p}")
    lines = (line.split("#", 1)[0].strip() for line in p.read_text().splitlines())
    return [line for line in lines if line]


def select_calibrations(ir: QIR, nodes: Iterable[str] = (), op_types: Iterable[str] = (),
                        role: str | None = None) -> list[CalibRecord]:
    """Calibration nodes chosen by every criterion given (criteria combine with AND).

    ``nodes``: names or globs, each matching calibration nodes by their own name, or the
    calibration nodes that feed a general node matched by name or module path. ``op_types``:
    the calibration nodes feeding ops of those types. ``role``: ``weight`` or ``activation``.
    A plain name that matches nothing is an error with suggestions.
    """
    chosen = ir.calibrations()
    nodes, op_types = list(nodes), list(op_types)
    if nodes:
        picked: dict[str, CalibRecord] = {}
        ops = ir.ops()
        for pattern in nodes:
            is_glob = bool(_GLOB & set(pattern))
            match = (lambda n, p=pattern: fnmatch.fnmatchcase(n, p)) if is_glob else (lambda n, p=pattern: n == p)
            targets = {o.name for o in ops if match(o.name) or (o.module and match(o.module))}
            hits = [c for c in chosen if match(c.name) or targets & set(c.feeds)]
            if not hits and not is_glob:
                names = [c.name for c in chosen] + [o.name for o in ops]
                raise NotFoundError(did_you_mean(pattern, names, "calibration node or op"))
            picked.update((c.name, c) for c in hits)
        chosen = [c for c in chosen if c.name in picked]
    if op_types:
        known = {o.op_type for o in ir.ops()}
        for t in op_types:
            if t not in known:
                raise NotFoundError(did_you_mean(t, known, "op type in this model"))
        feeding = {o.name for o in ir.ops() if o.op_type in op_types}
        chosen = [c for c in chosen if feeding & set(c.feeds)]
    if role is not None:
        r = CalibRole(role)
        chosen = [c for c in chosen if c.role is r]
    return chosen


@register_pass
class SetModePass(Pass):
    """Set the mode (int8/int16/fp16/float) or a fixed threshold of selected calibration nodes.

    Selection: ``nodes`` (names/globs of calibration nodes, general nodes or module paths;
    comma-separated or a list), ``from_file`` (one name per line, ``#`` comments), ``op_types``,
    ``role``; ``sensitive`` (a ``sensitive_ops.json`` from op-sensitivity / ``qir compare``) with
    ``top_k`` or ``ratio``: the calibration nodes of its most sensitive rows. No criterion selects
    every calibration node. ``threshold`` sets a per-tensor
    threshold, marks it ``fixed`` (calibration will not change it) and drops any imported scale.
    """

    name = "set-mode"

    def __init__(self, mode: str | None = None, nodes: str | list[str] | None = None,
                 op_types: str | list[str] | None = None, role: str | None = None,
                 from_file: str | None = None, threshold: float | None = None, sensitive: str | None = None,
                 top_k: int | None = None, ratio: float | None = None) -> None:
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
            from .op_sensitivity import load_report, select_sensitive

            self.nodes += select_sensitive(load_report(sensitive), top_k, ratio)
        elif top_k is not None or ratio is not None:
            raise InputError("--top-k / --ratio choose rows of a sensitivity report: give --sensitive "
                             "sensitive_ops.json (sensitive=... in Python)")
        self.op_types, self.role, self.threshold = as_name_list(op_types), role, threshold
        self.options = {k: v for k, v in (("mode", mode), ("nodes", self.nodes or None),
                                          ("op_types", self.op_types or None), ("role", role),
                                          ("threshold", threshold)) if v is not None}

    def run(self, ir: QIR) -> PassResult:
        chosen = select_calibrations(ir, self.nodes, self.op_types, self.role)
        changed = []
        for cal in chosen:
            touched = False
            if self.mode is not None and cal.mode is not self.mode:
                set_mode(cal, self.mode)  # imported scales are converted between int8 and int16
                touched = True
            if self.threshold is not None:
                cal.threshold = np.float32(self.threshold)
                cal.axis, cal.scale, cal.zero_point, cal.fixed = None, None, None, True
                touched = True
            if touched:
                changed.append(cal.name)
        if changed:
            ir.touch()
        logger.info("set-mode: %d of %d selected calibration node(s) changed", len(changed), len(chosen))
        return PassResult(ir, bool(changed), {"selected": [c.name for c in chosen], "changed": changed})
