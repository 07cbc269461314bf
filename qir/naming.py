"""Deterministic fresh names: the one rule every importer and pass uses to avoid collisions."""
from __future__ import annotations

from typing import Container

__all__ = ["fresh_name"]


def fresh_name(base: str, taken: Container[str], sep: str = "_") -> str:
    """``base`` if it is free, else ``base<sep>1``, ``base<sep>2``, ... — the first name not in
    ``taken`` (any container: a set, or an object answering ``in``). Nothing is reserved; a
    caller that keeps a set of names adds the result itself."""
    name, n = base, 1
    while name in taken:
        name, n = f"{base}{sep}{n}", n + 1
    return name
