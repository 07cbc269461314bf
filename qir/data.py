"""Input data: read samples (one ``{input name: array}`` dict each) from the formats users have.

Accepted sources:

* a folder in the hmct layout ``DIR/<input_name>/<i>.npy`` — one sub-folder per model input,
  files matched across inputs by their index ``i`` (natural order: 2 before 10);
* for a single-input model, a folder of ``.npy`` files directly (``DIR/<i>.npy``);
* an ``.npz`` whose keys are ``<input_name>/<i>`` (one sample per key) or ``<input_name>``
  (a stack: leading axis = samples, or one sample when the rank equals the input's rank);
* for a single-input model, an ``.npy`` holding one sample or a stack of samples;
* in Python, any iterable of ``{input_name: array}`` dicts, or of arrays (a single-input model)
  or tuples/lists of arrays bound to the inputs in order: a ``torch.utils.data.DataLoader`` of
  tensors works as it is (tensors are read as numpy arrays). An iterable is read only up to the
  samples asked for (:func:`model_samples`' ``limit``).

Samples are loaded lazily, one at a time, so a large calibration folder never sits in memory.
"""
from __future__ import annotations

import itertools
import logging
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from qir import once
from qir.errors import InputError, did_you_mean
from qir.files import atomic_write

__all__ = ["Samples", "load_samples", "model_samples", "check_fit", "check_shape",
           "shape_misfit", "save_outputs", "save_npz", "forget_warnings"]

logger = logging.getLogger(__name__)


def _natural_key(path: Path) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.stem))


def _load_npy(path: Path) -> np.ndarray:
    return _read_array(lambda: np.load(path, allow_pickle=False), str(path), ".npy array file")


def _read_array(load: Callable[[], np.ndarray], where: str, what: str) -> np.ndarray:
    """``load()`` (an ``np.load`` with ``allow_pickle=False``, or an ``.npz`` entry), any failure
    an InputError naming ``where``; an array of Python objects (pickled data) is never loaded."""
    try:
        return load()
    except Exception as exc:
        if isinstance(exc, ValueError) and "Object arrays" in str(exc):
            raise InputError(f"cannot read {where}: it holds Python objects (pickled data), which qir never loads; "
                             "save a numeric array (np.save(path, array.astype(np.float32)))") from exc
        raise InputError(f"cannot read {where}: not a valid {what} ({type(exc).__name__})") from exc


_PYTHON = "python iterable"  # the source of samples given in Python
_NONFINITE = "data: non-finite samples"  # :mod:`qir.once` topic: (file or folder, sample) named in a NaN/Inf warning


def forget_warnings() -> None:
    """Warn again about every sample with NaN or Inf inputs (see :class:`Samples`)."""
    once.forget(_NONFINITE)


class Samples(Sequence[dict]):
    """A lazily loaded sequence of samples; ``samples[i]`` is ``{input name: array}``.

    A sample whose floating-point inputs hold NaN or ±Inf is named in a warning the first time
    it is read: every result on it is suspect, and the analyses that compare outputs leave it out
    (their own warning says so). Once per sample of a file or folder (until
    :func:`forget_warnings`, which the command line calls per command), however many times the
    steps of an analysis load it; once per ``Samples`` object for samples given in Python."""

    def __init__(self, loaders: list[dict[str, Any]], source: str, *, _indices: list[int] | None = None,
                 _warned: set[tuple[str, int]] | None = None) -> None:
        self._loaders = loaders
        self.source = source
        self._indices = list(range(len(loaders))) if _indices is None else _indices  # index in the whole source
        if _warned is None:
            _warned = set() if source == _PYTHON else once.said(_NONFINITE)
        self._warned = _warned  # (source, index) of the samples warned about; shared with slices

    def __len__(self) -> int:
        return len(self._loaders)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return Samples(self._loaders[i], self.source, _indices=self._indices[i], _warned=self._warned)
        sample = {name: (get() if callable(get) else get) for name, get in self._loaders[i].items()}
        index = self._indices[i]
        if (self.source, index) not in self._warned:
            bad = {name: n for name, a in sample.items() if (n := _nonfinite(a))}
            if bad:
                self._warned.add((self.source, index))
                logger.warning("sample %d of %s holds NaN or Inf in its inputs (%s): results on it mean nothing; "
                               "fix or remove it", index, self.source,
                               ", ".join(f"{name!r} {n} of {np.size(sample[name])} values" for name, n in bad.items()))
        return sample

    def __iter__(self) -> Iterator[dict]:
        for i in range(len(self)):
            yield self[i]

    def __repr__(self) -> str:
        return f"Samples({len(self)} from {self.source})"


def _nonfinite(array: Any) -> int:
    """How many elements of a floating-point (or complex) array are NaN or ±Inf; 0 for others."""
    a = np.asarray(array)
    return int(a.size - np.count_nonzero(np.isfinite(a))) if a.dtype.kind in "fc" else 0


def _split_stack(arr: np.ndarray, rank: int | None, what: str) -> list[np.ndarray]:
    if rank is None or arr.ndim == rank + 1:
        return list(arr)
    if arr.ndim == rank:
        return [arr]
    raise InputError(f"{what} has shape {list(arr.shape)}; expected one sample of rank {rank} "
                     f"or a stack of samples of rank {rank + 1}")


def model_samples(ir, source: Any, limit: int | None = None) -> Samples:
    """:func:`load_samples` for the inputs of ``ir`` (ranks from their shapes), at most ``limit``
    samples; no sample at all is an InputError."""
    ranks = {n: (len(ir.value(n).shape) if ir.value(n).shape is not None else None) for n in ir.inputs}
    samples = load_samples(source, ir.inputs, ranks, limit)
    if limit:
        samples = samples[:limit]
    if not len(samples):
        raise InputError("the data holds no samples")
    check_fit(ir, samples)
    return samples


def load_samples(source: Any, input_names: Sequence[str],
                 input_ranks: Mapping[str, int | None] | None = None, limit: int | None = None) -> Samples:
    """Samples for a model with ``input_names`` from ``source`` (see the module docstring); of
    an iterable given in Python, the first ``limit`` items (all when None).

    Raises:
        InputError: the source is missing, unreadable, or does not match the inputs.
    """
    ranks = dict(input_ranks or {})
    names = list(input_names)
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.exists():
            raise InputError(f"data not found: {path}")
        if path.is_dir():
            return _from_folder(path, names)
        if path.suffix == ".npz":
            return _from_npz(path, names, ranks)
        if path.suffix == ".npy":
            if len(names) != 1:
                raise InputError(f"{path} is one .npy file but the model has {len(names)} inputs "
                                 f"{names}; use a folder DIR/<input_name>/<i>.npy or an .npz")
            stack = _split_stack(_load_npy(path), ranks.get(names[0]), str(path))
            return Samples([{names[0]: a} for a in stack], str(path))
        raise InputError(f"unsupported data file {path}: give a folder, an .npz or an .npy")
    if isinstance(source, Mapping):
        source = [source]
    try:
        items = list(itertools.islice(source, limit) if limit else source)
    except TypeError:
        raise InputError(f"data must be a path or an iterable of {{input name: array}} dicts, "
                         f"got {type(source).__name__}") from None
    return Samples([_bound(item, i, names) for i, item in enumerate(items)], _PYTHON)


def _array(value: Any) -> Any:
    """A tensor (anything with ``detach``: torch, on any device) as a numpy array; other values as they are."""
    return value.detach().cpu().numpy() if hasattr(value, "detach") and hasattr(value, "cpu") else value


def _bound(item: Any, i: int, names: list[str]) -> dict:
    """Sample ``i`` as ``{input name: array}``: a dict as it is, an array the only input's, a
    tuple or list of arrays the inputs' in order (one per input); one clear error otherwise."""
    if isinstance(item, Mapping):
        return {k: _array(v) for k, v in item.items()}
    if hasattr(item, "shape") and hasattr(item, "dtype"):
        if len(names) == 1:
            return {names[0]: _array(item)}
        raise InputError(f"sample {i} is one array but the model has {len(names)} inputs {names}; give a tuple of "
                         "arrays in that order, or a dict {input name: array}")
    if isinstance(item, (tuple, list)) and all(hasattr(v, "shape") for v in item):
        if len(item) == len(names):
            return {name: _array(v) for name, v in zip(names, item)}
        raise InputError(f"sample {i} holds {len(item)} arrays but the model has {len(names)} inputs {names}; "
                         "give one array per input (leave labels out), or a dict {input name: array}")
    raise InputError(f"sample {i} is a {type(item).__name__}, expected a dict of {{input name: array}}, an array "
                     "(one input) or a tuple of arrays (one per input)")


def _from_folder(path: Path, names: list[str]) -> Samples:
    subdirs = {p.name: p for p in path.iterdir() if p.is_dir()}
    if not subdirs and len(names) == 1:
        files = sorted(path.glob("*.npy"), key=_natural_key)
        if not files:
            raise InputError(f"{path} holds no .npy files")
        return Samples([{names[0]: (lambda f=f: _load_npy(f))} for f in files], str(path))
    missing = [n for n in names if n not in subdirs]
    if missing:
        hint = did_you_mean(missing[0], subdirs, "sub-folder")
        raise InputError(f"{path} has no sub-folder for model input {missing[0]!r} ({hint}); "
                         f"expected the layout {path}/<input_name>/<i>.npy for inputs {names}")
    per_input: dict[str, dict[str, Path]] = {}
    for n in names:
        files = sorted(subdirs[n].glob("*.npy"), key=_natural_key)
        if not files:
            raise InputError(f"{subdirs[n]} holds no .npy files")
        per_input[n] = {f.stem: f for f in files}
    # samples are matched by file name (the index i of <i>.npy), never by position
    keys = list(per_input[names[0]])
    for n in names[1:]:
        if set(per_input[n]) != set(keys):
            odd = sorted(set(per_input[n]) ^ set(keys), key=lambda k: _natural_key(Path(k)))
            raise InputError(f"{path}: inputs {names[0]!r} and {n!r} do not have the same sample "
                             f"files (e.g. {odd[0]}.npy is in one folder only)")
    loaders = [{n: (lambda f=per_input[n][k]: _load_npy(f)) for n in names} for k in keys]
    return Samples(loaders, str(path))


def _from_npz(path: Path, names: list[str], ranks: Mapping[str, int | None]) -> Samples:
    try:
        npz = np.load(path, allow_pickle=False)
        keys = list(npz.keys())
    except Exception as exc:
        raise InputError(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc
    per_input: dict[str, list] = {}
    for n in names:
        indexed = sorted((k for k in keys if k.startswith(n + "/") and k[len(n) + 1:].isdigit()),
                         key=lambda k: int(k[len(n) + 1:]))
        if indexed:
            per_input[n] = [(lambda k=k: _read_array(lambda: npz[k], f"{path}[{k}]", ".npz entry")) for k in indexed]
        elif n in keys or (len(names) == 1 and len(keys) == 1):
            key = n if n in keys else keys[0]
            per_input[n] = _split_stack(_read_array(lambda: npz[key], f"{path}[{key}]", ".npz entry"), ranks.get(n),
                                        f"{path}[{key}]")
        else:
            raise InputError(f"{path} has no entry for model input {n!r} (keys: {keys[:6]}); "
                             f"use keys '{n}' (stacked) or '{n}/<i>' (one per sample)")
    counts = {n: len(v) for n, v in per_input.items()}
    if len(set(counts.values())) > 1:
        raise InputError(f"{path}: inputs have different numbers of samples {counts}")
    loaders = [{n: per_input[n][i] for n in names} for i in range(counts[names[0]])]
    return Samples(loaders, str(path))


def save_outputs(path: str | Path, results: Iterable[Mapping[str, np.ndarray]]) -> Path:
    """Write per-sample results to an ``.npz`` with one entry ``<name>/<i>`` per value per sample."""
    arrays = {f"{name}/{i}": np.asarray(value)
              for i, result in enumerate(results) for name, value in result.items()}
    return save_npz(path, arrays)


def save_npz(path: str | Path, arrays: Mapping[str, np.ndarray]) -> Path:
    """``{name: array}`` as an uncompressed ``.npz`` readable with ``np.load(allow_pickle=False)``,
    written atomically (:func:`qir.files.atomic_write`). Like ``np.savez``, but any name works
    (``np.savez`` rejects ``file`` and ``allow_pickle``)."""
    import zipfile

    def write(tmp: Path) -> None:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
            for name, array in arrays.items():
                with z.open(f"{name}.npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, np.asarray(array), allow_pickle=False)

    return atomic_write(path, write)


# ------------------------------------------------------------------------------ data vs model
_DYNAMIC_FIXED = "data: dynamic dimensions fixed"  # :mod:`qir.once` topic: (source, input) already said


def check_fit(ir, samples: Samples) -> None:
    """Before any work: the first sample against every model input (:func:`check_shape`)."""
    first = samples[0]
    for name in ir.inputs:
        rec = ir.value(name)
        if rec.shape is not None and name in first:
            check_shape(name, list(rec.shape), tuple(np.shape(first[name])), samples.source)


def check_shape(name: str, expected: Sequence, found: Sequence[int], source: str) -> None:
    """One clear error when a sample of shape ``found`` cannot fit input ``name`` of shape
    ``expected`` (:func:`shape_misfit`, said of sample 0). Else one log line, once per input and
    data ``source``, naming the dynamic dimensions the data fixes."""
    why = shape_misfit(name, expected, found)
    if why is not None:
        raise InputError(f"sample 0: {why}")
    fixed = [f"{d}={f}" for d, f in zip(expected, found) if not isinstance(d, int)]
    if fixed and once.first_time(_DYNAMIC_FIXED, (source, name)):
        logger.info("input %r %s: the data fixes %s", name, _dims_text(expected), ", ".join(fixed))


def shape_misfit(name: str, expected: Sequence, found: Sequence[int]) -> str | None:
    """Why an array of shape ``found`` cannot be input ``name`` of shape ``expected`` (ints, or
    names / None for dynamic dimensions), or None when it fits: the rank or the first static
    dimension that differs, the shape expected and found, and the ``qir data`` flag that makes it
    fit where one explains the difference."""
    expected, found = list(expected), tuple(int(f) for f in found)
    if len(found) != len(expected):
        return (f"input {name!r} expects shape {_dims_text(expected)} (rank {len(expected)}), got {list(found)}"
                + _fix_hint(expected, found))
    bad = [i for i, (d, f) in enumerate(zip(expected, found)) if isinstance(d, int) and d != f]
    if bad:
        return (f"input {name!r} expects shape {_dims_text(expected)}, got {list(found)} (dimension {bad[0]} differs)"
                + _fix_hint(expected, found))
    return None


def _dims_text(shape) -> str:
    return "[" + ",".join(str(d) if d is not None else "?" for d in shape) + "]"


def _fix_hint(expected: list, found: tuple) -> str:
    """What ``qir data`` flag turns ``found`` into ``expected``: the layout (channels first, a
    batch axis) or the size, where one of them explains the difference."""
    if len(expected) == 4 and len(found) == 3:
        return "; the samples have no batch axis: make the folder with `qir data ... --layout NCHW` (a batch axis of 1)"
    if len(expected) == 4 and len(found) == 4:
        channels = expected[1]
        if isinstance(channels, int) and found[3] == channels and found[1] != channels:
            return ("; the samples are channels-last (NHWC) and the model reads channels first: make the folder "
                    "with `qir data ... --layout NCHW`")
        if isinstance(channels, int) and found[1] != channels:
            return (f"; the model reads {channels} channel(s): make the folder with `qir data ... --channels "
                    f"{'gray' if channels == 1 else 'rgb'}`")
        if all(isinstance(d, int) for d in expected[2:]):
            return f"; make the folder with `qir data ... --size {expected[2]},{expected[3]}`"
    return ""
