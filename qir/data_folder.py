"""Making a data folder (``DIR/<input>/<i>.npy``, the layout :mod:`qir.data` reads) from what
users have: image files, or arrays in an ``.npz`` / ``.npy``. ``qir data`` is the command.

Images become one float32 sample each, in this order (each step optional but the first):

1. read with Pillow (every format it knows; matplotlib, a dependency of qir, requires it too),
   as RGB values 0..255: grayscale images get three equal channels, an alpha channel is dropped;
2. ``size=(H, W)``: bilinear resize with half-pixel centres and no antialiasing (the result of
   ``cv2.resize(..., INTER_LINEAR)`` and of ``torch.nn.functional.interpolate(...,
   mode="bilinear", align_corners=False)``);
3. ``channels``: ``rgb`` (as read), ``bgr`` (reversed, for OpenCV-trained models) or ``gray``
   (one channel, ``0.299 R + 0.587 G + 0.114 B``);
4. ``x * scale`` (default ``1/255``), then ``(x - mean) / std`` per channel (one number, or one
   per channel in the order of step 3);
5. ``layout``: ``NCHW`` (default), ``NHWC``, ``CHW`` or ``HWC`` (a leading ``N`` adds the batch
   axis of size 1 that most exported models take).

Samples are numbered ``0, 1, ...`` in the natural order of the file names (``img2`` before
``img10``). An ``.npz`` is split as :func:`qir.data.load_samples` reads one (keys ``<input>/<i>``,
or ``<input>`` holding a stack along its first axis); an ``.npy`` is a stack for one input.

Writing follows qir's rule for outputs: every file is checked before any is written, existing
files are replaced only with ``overwrite=True`` (``--force``), each is written atomically, and a
folder ``DIR/<input>`` that already holds other samples (``.npy`` files this call would not
write) is refused even with ``overwrite``: they would silently join the data.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from qir.errors import InputError
from qir.files import atomic_write, check_outputs

__all__ = ["IMAGE_SUFFIXES", "LAYOUTS", "read_image", "resize", "preprocess", "image_files", "write_samples",
           "images_to_folder", "arrays_to_folder"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
LAYOUTS = ("NCHW", "NHWC", "CHW", "HWC")
_GRAY = np.array([0.299, 0.587, 0.114], np.float32)


def _natural(name: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def read_image(path: str | Path) -> np.ndarray:
    """The image at ``path`` as an ``H x W x 3`` float32 array of 0..255 values (see step 1)."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            return np.asarray(img.convert("RGB"), np.float32)
    except Exception as exc:  # the reader's own message says what is wrong with the file
        raise InputError(f"cannot read the image {path}: {type(exc).__name__}: {exc}") from None


def resize(image: np.ndarray, size: Sequence[int]) -> np.ndarray:
    """``image`` (``H x W x C``) resized to ``size = (height, width)``: bilinear, half-pixel
    centres, edges clamped, no antialiasing (step 2)."""
    out_h, out_w = (int(s) for s in size)
    if out_h < 1 or out_w < 1:
        raise InputError(f"the size must be positive, got {out_h}x{out_w}")
    in_h, in_w = image.shape[:2]

    def taps(n_out: int, n_in: int):
        src = np.clip((np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5, 0, n_in - 1)
        lo = np.floor(src).astype(np.intp)
        hi = np.minimum(lo + 1, n_in - 1)
        return lo, hi, (src - lo).astype(np.float32)

    y0, y1, fy = taps(out_h, in_h)
    x0, x1, fx = taps(out_w, in_w)
    rows = image[y0] * (1 - fy)[:, None, None] + image[y1] * fy[:, None, None]
    return (rows[:, x0] * (1 - fx)[None, :, None] + rows[:, x1] * fx[None, :, None]).astype(np.float32)


def _per_channel(values: float | Sequence[float], channels: int, what: str) -> np.ndarray:
    arr = np.atleast_1d(np.asarray(values, np.float32))
    if arr.size not in (1, channels):
        raise InputError(f"{what} has {arr.size} values for {channels} channel(s); give one, or one per channel")
    return arr


def preprocess(image: np.ndarray, *, size: Sequence[int] | None = None, channels: str = "rgb",
               scale: float = 1 / 255, mean: float | Sequence[float] = 0.0, std: float | Sequence[float] = 1.0,
               layout: str = "NCHW") -> np.ndarray:
    """One ``H x W x 3`` image (0..255, as :func:`read_image` gives it) as a model input: steps
    2-5 of the module docstring. Returns float32. ``scale``, ``mean`` and ``std`` must be finite and
    ``std`` non-zero (an InputError: NaN or Inf would make every sample NaN)."""
    layout = layout.upper()
    if layout not in LAYOUTS:
        raise InputError(f"unknown layout {layout!r}; choose {', '.join(LAYOUTS)}")
    x = resize(image, size) if size is not None else np.asarray(image, np.float32)
    if channels == "bgr":
        x = x[:, :, ::-1]
    elif channels == "gray":
        x = (x @ _GRAY)[:, :, None]
    elif channels != "rgb":
        raise InputError(f"unknown channel order {channels!r}; choose rgb, bgr or gray")
    c = x.shape[2]
    std_, mean_ = _per_channel(std, c, "std"), _per_channel(mean, c, "mean")
    for what, value in (("scale", scale), ("mean", mean_), ("std", std_)):
        if not np.all(np.isfinite(np.asarray(value, np.float64))):  # NaN/Inf would make every sample garbage
            raise InputError(f"{what} must be finite, got {np.asarray(value).tolist()}")
    if np.any(std_ == 0):
        raise InputError("std must not be 0")
    x = (x * np.float32(scale) - mean_) / std_
    if "C" in layout and layout.index("C") < layout.index("H"):
        x = x.transpose(2, 0, 1)
    if layout.startswith("N"):
        x = x[None]
    return np.ascontiguousarray(x, np.float32)


def image_files(sources: Iterable[str | Path]) -> list[Path]:
    """The image files named in ``sources``, a folder standing for the images directly in it
    (natural order of their names); any other file, or no image at all, is an InputError."""
    found: list[Path] = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            found += sorted((p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES),
                            key=lambda p: _natural(p.name))
        elif not path.exists():
            raise InputError(f"no such file or folder: {path}")
        elif path.suffix.lower() not in IMAGE_SUFFIXES:
            raise InputError(f"{path} is not an image ({', '.join(IMAGE_SUFFIXES)}); an .npz or .npy goes alone")
        else:
            found.append(path)
    if not found:
        raise InputError(f"no images in {', '.join(str(s) for s in sources)} ({', '.join(IMAGE_SUFFIXES)})")
    return found


def write_samples(samples: Sequence[Mapping[str, np.ndarray]], folder: str | Path, *,
                  overwrite: bool = False) -> list[Path]:
    """``samples[i][input]`` as ``folder/<input>/<i>.npy``, under the rule of the module docstring
    (everything checked before anything is written). Returns the files written."""
    folder = Path(folder)
    if not samples:
        raise InputError("there are no samples to write")
    names = list(samples[0])
    planned = [folder / n / f"{i}.npy" for i in range(len(samples)) for n in names]
    for n in names:
        others = sorted({p.name for p in (folder / n).glob("*.npy")} - {p.name for p in planned},
                        key=_natural) if (folder / n).is_dir() else []
        if others:
            raise InputError(f"{folder / n} already holds other samples ({', '.join(others[:3])}"
                             f"{', ...' if len(others) > 3 else ''}), which would join this data; "
                             "choose an empty folder or remove them")
    check_outputs(planned, overwrite=overwrite)
    written = []
    for i, sample in enumerate(samples):
        for n in names:
            path = folder / n / f"{i}.npy"
            path.parent.mkdir(parents=True, exist_ok=True)
            written.append(atomic_write(path, lambda tmp, a=np.asarray(sample[n]): np.save(tmp, a, allow_pickle=False)))
    return written


def images_to_folder(sources: Iterable[str | Path], folder: str | Path, input_name: str, *,
                     overwrite: bool = False, **options) -> list[Path]:
    """Every image of ``sources`` (:func:`image_files`) through :func:`preprocess` (``options``)
    into ``folder/<input_name>/<i>.npy``; returns the files written."""
    files = image_files(sources)
    preprocess(np.zeros((2, 2, 3), np.float32), **options)  # bad options fail before any image is read
    samples = [{input_name: preprocess(read_image(f), **options)} for f in files]
    shapes = {s[input_name].shape for s in samples}
    if len(shapes) > 1:
        raise InputError(f"the images give samples of {len(shapes)} different shapes {sorted(shapes)[:3]}; "
                         "give a size (--size H,W) so they all fit the model")
    return write_samples(samples, folder, overwrite=overwrite)


def arrays_to_folder(path: str | Path, folder: str | Path, *, input_names: Sequence[str] | None = None,
                     ranks: Mapping[str, int | None] | None = None, overwrite: bool = False) -> list[Path]:
    """The samples of an ``.npz`` or ``.npy`` into ``folder/<input>/<i>.npy``, split exactly as
    :func:`qir.data.load_samples` reads that file for a model with ``input_names`` (default: the
    ``.npz``'s own key prefixes) and input ``ranks`` (without them a stack is split along its
    first axis); returns the files written."""
    from qir.data import load_samples

    path = Path(path)
    names = list(input_names or ())
    if path.suffix == ".npz" and not names:
        try:
            with np.load(path, allow_pickle=False) as npz:
                names = list(dict.fromkeys(k.split("/", 1)[0] for k in npz.keys()))
        except Exception as exc:
            raise InputError(f"cannot read {path}: {type(exc).__name__}: {exc}") from None
    elif path.suffix == ".npy" and len(names) != 1:
        raise InputError(f"{path} holds the samples of one input: name it (--input NAME, or --model MODEL)")
    elif path.suffix not in (".npz", ".npy"):
        raise InputError(f"{path} is neither an .npz nor an .npy")
    return write_samples(list(load_samples(path, names, ranks)), folder, overwrite=overwrite)
