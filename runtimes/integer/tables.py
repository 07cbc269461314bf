"""Elementwise integer arithmetic on small code domains: tables, and fast paths checked on every code.

An elementwise kernel whose output codes depend only on its operands' codes (the scales, zero
points and the march's rounding being fixed for the call) is a function on a small domain: 256
codes for an int8 operand, 65536 for an int16 one or for a pair of int8 operands. Two uses:

* :func:`checked_pair` / :func:`checked_unary`: a cheaper formula (float32 without the fused multiply-add a kernel
  emulates in float64) stands in for the exact one where both give the same codes on *every*
  code pair of the domain, checked once per key: then they agree on any value, elementwise.
  Where they differ somewhere, a table (below) or the exact formula serves.
* :func:`unary` / :func:`pair`: the kernel runs once on every code of the domain (the table, kept
  under the caller's key) and the value's codes index it: the same numbers, since the kernel
  itself fills the table (a LUT op's table is built once instead of once per run).

Equality is of values: a zero's sign is not kept (``-0.0`` codes, which a product of a negative
code and zero can give, index the entry of ``+0.0``, and a checked formula may sign a zero
otherwise).

A table is laid out so that a code indexes it directly, a negative code from the end (``T[c mod
n]`` for a domain of ``n`` codes; for a pair, ``T[(a·n_b + b) mod n_a·n_b]``): no offset pass.

The key must name everything the kernel reads besides the codes; :func:`params_key` and
:class:`ProfileKey` help build it. Tables and checks are kept process-wide, least recently used
dropped past :data:`CACHE_BYTES`, so that the runs of many variants of one model share them.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable

import numpy as np

from qir.runtimes.integer.qtensor import QParams

__all__ = ["ProfileKey", "profile_key", "params_key", "unary", "pair", "checked_pair", "checked_unary", "CACHE_BYTES"]

MAX_ENTRIES = 1 << 16  # the largest table: an int16 operand, or a pair of int8 operands
CACHE_BYTES = 64 << 20

_tables: OrderedDict[Hashable, np.ndarray] = OrderedDict()
_size = [0]
_lock = threading.Lock()


class ProfileKey:
    """A march profile as part of a table key: hashed once (a profile's own hash walks its fields)."""

    __slots__ = ("profile", "_hash")

    def __init__(self, profile) -> None:
        self.profile, self._hash = profile, hash(profile)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return isinstance(other, ProfileKey) and (self.profile is other.profile or self.profile == other.profile)


_profile_keys: dict[int, ProfileKey] = {}


def profile_key(profile) -> ProfileKey:
    """The :class:`ProfileKey` of ``profile``, made once per profile object (it holds the profile,
    so the id it is filed under stays that profile's)."""
    found = _profile_keys.get(id(profile))
    if found is None or found.profile is not profile:
        found = _profile_keys[id(profile)] = ProfileKey(profile)
    return found


def params_key(p: QParams | None) -> tuple | None:
    """Per-tensor parameters as a key (None for None)."""
    if p is None:
        return None
    return (p.mode, p.scale.tobytes(), p.zero_point.tobytes(), p.axis, p.frame)


def _table(key: Hashable, fill: Callable[[], np.ndarray]) -> np.ndarray:
    with _lock:
        table = _tables.get(key)
        if table is not None:
            _tables.move_to_end(key)
            return table
    table = fill()
    with _lock:
        if key not in _tables:
            _tables[key] = table
            _size[0] += table.nbytes
            while _size[0] > CACHE_BYTES and len(_tables) > 1:
                _size[0] -= _tables.popitem(last=False)[1].nbytes
    return table


_domains: dict[tuple, np.ndarray | None] = {}


def _codes(qrange: tuple[int, int], dtype) -> np.ndarray | None:
    """Every code of ``qrange`` at the position that code indexes (``c mod n``), or None when a
    code would not index a table of ``n`` entries (outside ``[-n, n)``); read-only, made once."""
    key = (qrange, np.dtype(dtype).str)
    if key not in _domains:
        lo, hi = qrange
        n = hi - lo + 1
        domain = None
        if lo >= -n and hi < n:
            domain = (lo + (np.arange(n) - lo) % n).astype(dtype)
            domain.flags.writeable = False
        _domains[key] = domain
    return _domains[key]


def unary(key: Hashable, fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray, qrange: tuple[int, int], *,
          always: bool = False) -> np.ndarray | None:
    """``fn(x)`` for codes ``x`` in ``qrange`` through a table (None where no table pays:
    fewer elements than entries unless ``always``, or a domain past :data:`MAX_ENTRIES`)."""
    n = qrange[1] - qrange[0] + 1
    if n > MAX_ENTRIES or (x.size < n and not always):
        return None
    domain = _codes(qrange, x.dtype)
    if domain is None:
        return None
    table = _table((key, x.dtype.str), lambda: np.ascontiguousarray(np.asarray(fn(domain)).reshape(n)))
    return table[x.astype(np.intp)]


def pair(key: Hashable, fn: Callable[[np.ndarray, np.ndarray], np.ndarray], a: np.ndarray, a_range: tuple[int, int],
         b: np.ndarray, b_range: tuple[int, int]) -> np.ndarray | None:
    """``fn(a, b)`` for broadcasting codes ``a`` in ``a_range``, ``b`` in ``b_range``, elementwise,
    through a table: over ``a`` alone when ``b`` has one element (its code joins the key), over ``b``
    alone when ``a`` has, else over both. ``fn`` runs on operands of the sizes class it would see
    (one element, or more), so a kernel that branches on an operand's size branches alike. None
    where no table pays (see :func:`unary`)."""
    shape = np.broadcast_shapes(a.shape, b.shape)
    if b.size == 1 and a.size > 1:
        got = unary((key, "b", b.dtype.str, b.shape, b.tobytes()), lambda d: fn(d, b), a, a_range)
        return None if got is None else got.reshape(shape)
    if a.size == 1 and b.size > 1:
        got = unary((key, "a", a.dtype.str, a.shape, a.tobytes()), lambda d: fn(a, d), b, b_range)
        return None if got is None else got.reshape(shape)
    if a.size == 1 or a.dtype != b.dtype:
        return None
    na, nb = a_range[1] - a_range[0] + 1, b_range[1] - b_range[0] + 1
    n = na * nb
    lo, hi = a_range[0] * nb + b_range[0], a_range[1] * nb + b_range[1]
    if n > MAX_ENTRIES or np.prod(shape) < n or lo < -n or hi >= n or (a.dtype.kind == "f" and n > 1 << 24):
        return None

    def fill() -> np.ndarray:
        da = np.arange(a_range[0], a_range[1] + 1).astype(a.dtype)[:, None]
        db = np.arange(b_range[0], b_range[1] + 1).astype(b.dtype)[None, :]
        values = np.asarray(fn(da, db))
        table = np.empty(n, values.dtype)
        table[(da.astype(np.int64) * nb + db.astype(np.int64)) % n] = values
        return table

    table = _table((key, "pair", a.dtype.str), fill)
    index = a * a.dtype.type(nb)
    index = np.add(index, b, out=index) if index.shape == shape else index + b
    return table[index.astype(np.intp)]


def _grids(a: np.ndarray, a_range: tuple[int, int], b: np.ndarray, b_range: tuple[int, int]):
    """Operands covering every code the values ``a`` and ``b`` can hold, of the same size class
    (one element, or more) as each, and the key part that tells them apart; None when past
    :data:`MAX_ENTRIES` or both have one element."""
    def every(r: tuple[int, int], like: np.ndarray) -> np.ndarray:
        return np.arange(r[0], r[1] + 1).astype(like.dtype)

    na, nb = a_range[1] - a_range[0] + 1, b_range[1] - b_range[0] + 1
    if b.size == 1 and a.size > 1 and na <= MAX_ENTRIES:
        return every(a_range, a), b, ("b", b.dtype.str, b.shape, b.tobytes(), a.dtype.str)
    if a.size == 1 and b.size > 1 and nb <= MAX_ENTRIES:
        return a, every(b_range, b), ("a", a.dtype.str, a.shape, a.tobytes(), b.dtype.str)
    if a.size > 1 and b.size > 1 and na * nb <= MAX_ENTRIES:
        return every(a_range, a)[:, None], every(b_range, b)[None, :], ("ab", a.dtype.str, b.dtype.str)
    return None


def checked_pair(key: Hashable, exact: Callable[[np.ndarray, np.ndarray], np.ndarray],
                 fast: Callable[[np.ndarray, np.ndarray], np.ndarray], a: np.ndarray, a_range: tuple[int, int],
                 b: np.ndarray, b_range: tuple[int, int]) -> np.ndarray:
    """``exact(a, b)`` (elementwise on broadcasting codes ``a`` in ``a_range``, ``b`` in
    ``b_range``), computed by ``fast`` where the two agree on every code pair the domains hold
    (checked once per key, on operands of the size classes ``a`` and ``b`` have, so that a formula
    that branches on an operand's size branches alike), else through :func:`pair`'s table where
    one pays, else by ``exact``."""
    grids = _grids(a, a_range, b, b_range)
    if grids is None:
        return exact(a, b)
    ga, gb, part = grids

    def check() -> np.ndarray:
        want, got = np.asarray(exact(ga, gb)), np.asarray(fast(ga, gb))
        return np.asarray(want.dtype == got.dtype and want.shape == got.shape and bool(np.array_equal(want, got)))

    if _table((key, "checked", part), check):
        return fast(a, b)
    found = pair(key, exact, a, a_range, b, b_range)
    return exact(a, b) if found is None else found


def checked_unary(key: Hashable, exact: Callable[[np.ndarray], np.ndarray], fast: Callable[[np.ndarray], np.ndarray],
                  x: np.ndarray, qrange: tuple[int, int]) -> np.ndarray:
    """``exact(x)`` (elementwise on codes ``x`` in ``qrange``), computed by ``fast`` where the two
    agree on every code of the domain (checked once per key), else by ``exact``."""
    n = qrange[1] - qrange[0] + 1
    if n > MAX_ENTRIES or x.size <= 1:
        return exact(x)

    def check() -> np.ndarray:
        domain = np.arange(qrange[0], qrange[1] + 1).astype(x.dtype)
        want, got = np.asarray(exact(domain)), np.asarray(fast(domain))
        return np.asarray(want.dtype == got.dtype and want.shape == got.shape and bool(np.array_equal(want, got)))

    return fast(x) if _table((key, "checked", x.dtype.str), check) else exact(x)
