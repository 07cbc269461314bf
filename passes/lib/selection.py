"""Choosing calibration nodes: by name or glob (of the node, the op it serves or that op's module
path), by the op types they feed, by role. The one selector every pass and command uses."""
from __future__ import annotations

import fnmatch
from typing import Iterable

from qir.errors import InputError, NotFoundError, did_you_mean
from qir.graph import QIR
from qir.kinds import CalibRole
from qir.records import CalibRecord

_GLOB = set("*?[")


def as_name_list(value: str | Iterable[str] | None) -> list[str]:
    """Names from a comma-separated string or a list (None → [])."""
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value]


def select_calibrations(ir: QIR, nodes: Iterable[str] = (), op_types: Iterable[str] = (),
                        role: str | None = None) -> list[CalibRecord]:
    """Calibration nodes chosen by every criterion given (criteria combine with AND).

    ``nodes``: names or globs, each matching calibration nodes by their own name, or the
    calibration nodes that feed a general node matched by name or module path. ``op_types``:
    the calibration nodes feeding ops of those types. ``role``: ``weight`` or ``activation``.
    A name or glob that matches nothing is an error (a plain name's message suggests close names):
    a selector that selects nothing is a typo, never a request to change nothing.
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
            if not hits and is_glob:
                raise NotFoundError(f"no calibration node, op or module path matches {pattern!r}; "
                                    "`qir dump MODEL` lists the names")
            if not hits:
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


def calibrations_of(ir: QIR, name: str) -> list[CalibRecord]:
    """A calibration node itself, or the calibration nodes serving a general node (by name or
    module path)."""
    cals = select_calibrations(ir, [name])
    if not cals:
        raise InputError(f"node {name!r} has no calibration nodes")
    return cals
