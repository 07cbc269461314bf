"""The registry of built-in march profiles: lookup by name or alias, case-insensitive.

Names are normalized (lower case, ``_`` -> ``-``) so ``nash-e``, ``NASH_E``, ``J6E`` and
``s100`` find the same profile; an unknown name raises :class:`UnknownProfileError` naming the
known profiles and the closest matches.
"""
from __future__ import annotations

import difflib
from typing import Mapping

from qir.errors import QirError
from qir.runtimes.march.generic import GENERIC
from qir.runtimes.march.nash_e import NASH_E
from qir.runtimes.march.nash_m import NASH_M
from qir.runtimes.march.nash_p import NASH_P
from qir.runtimes.march.ort import ORT
from qir.runtimes.march.profile import FrozenMap, MarchProfile

__all__ = ["PROFILES", "UnknownProfileError", "get_profile", "profile_names"]

#: The built-in profiles by canonical name.
PROFILES: Mapping[str, MarchProfile] = FrozenMap(
    (p.name, p) for p in (NASH_E, NASH_M, NASH_P, GENERIC, ORT))


class UnknownProfileError(QirError, ValueError):
    """A march profile name that is neither a profile nor an alias."""


def _norm_name(name: str) -> str:
    return str(name).strip().lower().replace("_", "-")


def _name_index() -> dict[str, tuple[str, str]]:
    """normalized name or alias -> (canonical profile name, display spelling)."""
    index: dict[str, tuple[str, str]] = {}
    for p in PROFILES.values():
        for n in (p.name, *p.aliases):
            index[_norm_name(n)] = (p.name, n)
    return index


def profile_names() -> tuple[str, ...]:
    """Canonical names of the built-in profiles."""
    return tuple(PROFILES)


def get_profile(name: str | MarchProfile) -> MarchProfile:
    """A profile by name or alias, case-insensitive (``nash-e``, ``J6E``, ``s100``, ``NASH_P``).

    A :class:`MarchProfile` is returned as is, so APIs can take either.

    Raises:
        UnknownProfileError: (a ``ValueError``) naming the known profiles and the closest match.
    """
    if isinstance(name, MarchProfile):
        return name
    index = _name_index()
    hit = index.get(_norm_name(name))
    if hit is not None:
        return PROFILES[hit[0]]
    # did_you_mean's wording, but matching normalized names and suggesting display spellings
    # (closest first; on a tie a profile name before an alias, then table order)
    norm = _norm_name(name)
    scored = []
    for order, (key, (canon, display)) in enumerate(index.items()):
        ratio = difflib.SequenceMatcher(None, norm, key).ratio()
        if ratio >= 0.5:
            scored.append((-ratio, display != canon, order, display))
    suggestions = [s[3] for s in sorted(scored)[:3]]
    hint = f"; did you mean {', '.join(repr(s) for s in suggestions)}?" if suggestions else ""
    known = ", ".join(f"{p.name} ({', '.join(p.aliases)})" if p.aliases else p.name
                      for p in PROFILES.values())
    raise UnknownProfileError(f"no march profile named {name!r}{hint} (known profiles: {known})")
