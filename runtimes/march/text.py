"""Text and dict forms of march profiles (``qir profiles``): one aligned line per parameter with
its value and provenance marker (``[documented]`` / ``[source]`` / ``[ASSUMED]`` / ``[override]``),
and a JSON-ready dict of values, statuses and notes."""
from __future__ import annotations

import dataclasses
import enum
import textwrap
from typing import Any, Iterable, Mapping

from qir.json_dump import JsonValue
from qir.runtimes.march.profile import (
    PAIR_FIELDS,
    PARAM_FIELDS,
    PATTERN_FIELDS,
    LutInt8,
    LutInt16,
    MarchProfile,
    Provenance,
    Status,
)
from qir.runtimes.march.registry import PROFILES, get_profile

__all__ = ["LEGEND", "format_profiles", "profile_to_dict"]

_NAME_W = 27
_VALUE_W = 40
_NOTE_W = 100

LEGEND = (
    "Legend: [documented] public Horizon/D-Robotics docs (generic: the ONNX spec)\n"
    "        [source]     seen in a public copy of Horizon source (may be stale)\n"
    "        [ASSUMED]    our assumption: nothing public; override it if you know better\n"
    "        [override]   set by you\n"
    "        Indented lines: entries of a table, and items whose status differs from their\n"
    "        parameter's (a parameter marked 'partly ASSUMED' has assumed items)."
)


def _item_text(field_name: str, item: Any, value: Any = None) -> str:
    if field_name in PAIR_FIELDS:
        return f"{item[0]} x {item[1]}"
    if field_name in PATTERN_FIELDS:
        return "+".join(item)
    if isinstance(item, enum.Enum):
        return str(item.value)
    return str(item)


def _value_text(field_name: str, value: Any) -> str:
    if field_name == "integer_ops" and value is None:
        return "every op with an integer kernel"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, tuple):
        return ", ".join(_item_text(field_name, v) for v in value) if value else "-"
    return str(value)


def _sub_value_text(value: Any) -> str:
    if isinstance(value, tuple):
        return ", ".join(str(v) for v in value) if value else "-"
    return str(value)


def _marker(prov: Provenance) -> str:
    others = sorted(prov.statuses - {prov.status}, key=list(Status).index)
    if not others:
        return prov.status.marker
    own = prov.status.value.upper() if prov.status is Status.ASSUMED else prov.status.value
    return f"[{own}, partly " + ", ".join(
        s.value.upper() if s is Status.ASSUMED else s.value for s in others) + "]"


def _line(name: str, value: str, marker: str, indent: int = 2) -> str:
    """``name  value  marker`` in aligned columns; a long value wraps inside its column."""
    name_w = _NAME_W - (indent - 2)
    chunks = textwrap.wrap(value, _VALUE_W, break_on_hyphens=False) or [""]
    lines = [f"{' ' * indent}{name:<{name_w}} {chunks[0]:<{_VALUE_W}} {marker}"]
    lines += [f"{' ' * (_NAME_W + 3)}{c}" for c in chunks[1:]]
    return "\n".join(lines)


def _format_profile(p: MarchProfile, notes: bool) -> list[str]:
    head = f"{p.name}" + (f"  (aliases: {', '.join(p.aliases)})" if p.aliases else "")
    lines = [head]

    def note_line(text: str, indent: int) -> None:
        if notes and text:
            pad = " " * (indent + 2)
            lines.extend(textwrap.wrap(text, _NOTE_W, initial_indent=pad + "- ",
                                       subsequent_indent=pad + "  ", break_on_hyphens=False))

    for f in PARAM_FIELDS:
        value = getattr(p, f)
        prov = p.provenance[f]
        if isinstance(value, (Mapping, LutInt8, LutInt16)):
            lines.append(f"  {f:<{_NAME_W}} {'':<{_VALUE_W}} {_marker(prov)}")
            note_line(prov.note, 2)
            subs = (list(value.items()) if isinstance(value, Mapping)
                    else [(x.name, getattr(value, x.name)) for x in dataclasses.fields(value)])
            for key, sub in subs:
                key_text = _item_text(f, key)
                item_prov = prov.items.get(key)
                status = item_prov.status if item_prov else prov.status
                lines.append(_line(key_text, _sub_value_text(sub), status.marker, indent=4))
                if item_prov:
                    note_line(item_prov.note, 4)
            continue
        lines.append(_line(f, _value_text(f, value), _marker(prov)))
        note_line(prov.note, 2)
        for item, item_prov in prov.items.items():
            if item_prov.status is not prov.status:
                lines.append(_line(_item_text(f, item), "", item_prov.status.marker, indent=4))
                note_line(item_prov.note, 4)
    return lines


def format_profiles(names: Iterable[str] | None = None, *, notes: bool = False) -> str:
    """The text of ``qir profiles``: a legend, then one block per profile with one line per
    parameter (value and ``[documented]`` / ``[source]`` / ``[ASSUMED]`` / ``[override]``).

    ``names`` are profile names or aliases (default: every built-in profile) or profiles;
    ``notes=True`` adds the reason behind each value under its line.
    """
    profiles = [get_profile(n) for n in names] if names is not None else list(PROFILES.values())
    blocks = [LEGEND]
    for p in profiles:
        blocks.append("\n".join(_format_profile(p, notes)))
    assumed = {p.name: p.assumed_fields() for p in profiles}
    summary = ["Assumed parameters (wholly or partly):"]
    for name, fields in assumed.items():
        summary.extend(textwrap.wrap(f"{name}: " + (", ".join(fields) if fields else "none"),
                                     _NOTE_W, initial_indent="  ", subsequent_indent="    "))
    blocks.append("\n".join(summary))
    return "\n\n".join(blocks) + "\n"


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (LutInt8, LutInt16)):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(_jsonable(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


def profile_to_dict(profile: str | MarchProfile) -> dict[str, JsonValue]:
    """A JSON-ready dict: ``{"name", "params": {field: {"value", "status", "note", "items"}}}``;
    ``items`` lists per-item statuses that differ from the field's."""
    p = get_profile(profile)
    params = {}
    for f in PARAM_FIELDS:
        prov = p.provenance[f]
        params[f] = {
            "value": _jsonable(getattr(p, f)),
            "status": prov.status.value,
            "note": prov.note,
            "items": [{"item": _item_text(f, k) if f in PAIR_FIELDS + PATTERN_FIELDS
                       else _jsonable(k), "status": ip.status.value, "note": ip.note}
                      for k, ip in prov.items.items()],
        }
    return {"name": p.name, "aliases": list(p.aliases), "params": params}
