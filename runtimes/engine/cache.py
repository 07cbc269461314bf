"""The reference-value cache: arrays kept in memory up to a byte budget, spilled to disk past it."""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["ValueCache", "MemoryTrim", "release_free_memory", "resident_bytes"]

logger = logging.getLogger(__name__)


def _trimmer():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to do
        return None


_MALLOC_TRIM = _trimmer()


def release_free_memory() -> None:
    """Hand memory the C allocator keeps after large frees back to the system (glibc
    ``malloc_trim``; a no-op elsewhere). onnxruntime and numpy free hundreds of MB of
    temporaries per model run; glibc's per-thread arenas would otherwise keep them as RSS."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """The process's resident memory now (Linux ``/proc/self/statm``; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


class MemoryTrim:
    """Freed C memory goes back to the system now (:func:`release_free_memory`), then at a call
    once the process grew ``growth`` bytes since the last time: a trim walks the whole heap, so
    trimming on every call costs (op sensitivity of PP-OCRv4 det: 9.5 -> 12.7 s)."""

    def __init__(self, growth: int = 256 << 20) -> None:
        self.growth = growth
        release_free_memory()
        self.floor = resident_bytes()

    def __call__(self) -> None:
        if resident_bytes() - self.floor > self.growth:
            release_free_memory()
            self.floor = resident_bytes()


class _Codes:
    """A fake-quantized tensor stored as its integer codes: ``value = codes · scale`` exactly."""

    __slots__ = ("codes", "scale")

    def __init__(self, codes: np.ndarray, scale: np.ndarray) -> None:
        self.codes, self.scale = codes, scale

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes

    def decode(self) -> np.ndarray:
        return self.codes.astype(self.scale.dtype) * self.scale


def encode(array: np.ndarray, scale: np.ndarray) -> _Codes | None:
    """``array`` as integer codes of ``scale`` (broadcastable), or None unless the round trip is
    exact (it is for every fake-quantized output: ``y = c · s`` with integer ``c`` in float32)."""
    scale = np.asarray(scale, array.dtype)
    c = np.rint(array / scale)
    if not c.size:
        return None
    lo, hi = float(c.min()), float(c.max())
    for dtype in (np.int8, np.int16, np.int32):
        info = np.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            codes = _Codes(c.astype(dtype), scale)
            return codes if np.array_equal(codes.decode(), array) else None
    return None


class ValueCache:
    """``name -> array``. Arrays are kept in memory while the total stays within ``budget``
    bytes; past it, new arrays are written to ``.npy`` files in a private temporary folder (under
    ``spill_dir`` when given) and read back on each access. An array given with its quantization
    ``scale`` is kept as integer codes (4x smaller for int8) and decoded on access, bit-exact,
    unless everything put since the last ``clear()`` fitted the budget as it was: the cache holds
    one sample at a time, and where a sample's values fit, encoding and decoding only cost time
    (on PP-OCRv4 det, 3 s of a 45-s tune sensitivity stage).
    One array stored under several names (a pass-through calibration node's input and output)
    is counted once. ``peak`` is the most bytes ever held in memory, ``spilled`` the bytes ever
    written to disk. ``clear()`` forgets everything."""

    def __init__(self, budget: int, spill_dir: str | Path | None = None) -> None:
        self.budget = int(budget)
        self._spill_root = spill_dir
        self._dir: Path | None = None
        self._mem: dict[str, np.ndarray | _Codes] = {}
        self._disk: dict[str, Path] = {}
        self._users: dict[int, int] = {}  # id of a held object -> names holding it
        self.held = self.peak = self.spilled = 0
        self._as_is = 0  # bytes put since the last clear(), counted as given
        self._fits = False  # whether the last fill fitted as given (then nothing is encoded)

    def __contains__(self, name: str) -> bool:
        return name in self._mem or name in self._disk

    def put(self, name: str, array: np.ndarray, scale: np.ndarray | None = None) -> None:
        array = np.asarray(array)
        if name in self:
            self.drop(name)
        item: np.ndarray | _Codes = array
        self._as_is += array.nbytes
        if scale is not None and array.dtype.kind == "f" and not self._fits:
            item = encode(array, scale) or array
        if id(item) in self._users:  # already held under another name
            self._users[id(item)] += 1
            self._mem[name] = item
            return
        if self.held + item.nbytes <= self.budget:
            self._mem[name] = item
            self._users[id(item)] = 1
            self.held += item.nbytes
            self.peak = max(self.peak, self.held)
            return
        if self._dir is None:
            root = self._spill_root
            if root is not None:
                Path(root).mkdir(parents=True, exist_ok=True)
            self._dir = Path(tempfile.mkdtemp(prefix="qir-cache-", dir=root))
            logger.info("reference cache over its %.0f MB budget: spilling to %s", self.budget / 2**20, self._dir)
        path = self._dir / f"{len(self._disk)}.npy"
        np.save(path, array)
        self._disk[name] = path
        self.spilled += array.nbytes

    def get(self, name: str) -> np.ndarray:
        item = self._mem.get(name)
        if item is None:
            return np.load(self._disk[name])
        return item.decode() if type(item) is _Codes else item

    def drop(self, name: str) -> None:
        if name in self._mem:
            item = self._mem.pop(name)
            self._users[id(item)] -= 1
            if not self._users[id(item)]:
                del self._users[id(item)]
                self.held -= item.nbytes
        elif name in self._disk:
            self._disk.pop(name).unlink(missing_ok=True)

    def clear(self) -> None:
        if self._as_is:
            self._fits, self._as_is = self._as_is <= self.budget, 0
        self._mem.clear()
        self._users.clear()
        self.held = 0
        for path in self._disk.values():
            path.unlink(missing_ok=True)
        self._disk.clear()

    def close(self) -> None:
        self.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
