"""The bad-input corpus shared by ``test_bad_inputs.py`` and ``test_bad_inputs_flags.py``: the
files (corrupt models, broken data folders, pickle payloads, NaN samples), each command's argv,
and the check every case ends in: one clear ``qir: error:`` line (argparse's usage lines aside),
exit code 2, no traceback, no internal error."""
from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from qir.tools.cli import main

from ..conftest import DIGITS, DIGITS_DATA

MODEL = str(DIGITS / "model.onnx")
DATA = str(DIGITS_DATA)
PRECIOUS = b"the user's own file, not written by qir"


class Payload:
    """Unpickling this writes the file ``MARKER`` names: a data file holding it must never be unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "unpickled"))


def make_models(folder: Path) -> dict[str, Path]:
    """Model files that are not (readable) ONNX models, by kind."""
    folder.mkdir(parents=True, exist_ok=True)
    good = Path(MODEL).read_bytes()
    files = {"empty": b"", "garbage": b"\x00\x01garbage" * 10, "truncated": good[: len(good) // 2],
             "text": b"ir_version: 8\nthis is not a model\n"}
    paths = {}
    for kind, content in files.items():
        paths[kind] = folder / f"{kind}.onnx"
        paths[kind].write_bytes(content)
    paths["directory"] = folder / "folder.onnx"
    paths["directory"].mkdir()
    paths["missing"] = folder / "missing.onnx"
    return paths


def _folder(root: Path, name: str, arrays: list[np.ndarray], sub: str = "input") -> Path:
    (root / name / sub).mkdir(parents=True)
    for i, a in enumerate(arrays):
        np.save(root / name / sub / f"{i}.npy", a, allow_pickle=a.dtype == object)
    return root / name


def make_data(root: Path) -> tuple[dict[str, tuple[Path, str]], Path]:
    """Data the digits model cannot use, by kind: ``{kind: (path, what the error must say)}``, and
    the marker file a pickle payload would create."""
    root.mkdir(parents=True, exist_ok=True)
    x = np.load(DIGITS_DATA / "input" / "0.npy")
    marker = root / "UNPICKLED"
    payload = np.array([Payload(marker)], dtype=object)
    raw = (DIGITS_DATA / "input" / "0.npy").read_bytes()
    cases = {
        "missing": (root / "nowhere", "data not found"),
        "empty folder": (root / "empty", "holds no .npy files"),
        "no input sub-folder": (_folder(root, "other_input", [x, x], sub="images"), "no sub-folder for model input 'input'"),
        "empty input sub-folder": (_folder(root, "no_samples", []), "holds no .npy files"),
        "wrong shape": (_folder(root, "shape", [np.zeros((1, 1, 9, 9), np.float32)]), "expects shape [1,1,8,8]"),
        "wrong rank": (_folder(root, "rank", [np.zeros((8, 8), np.float32)]), "expects shape [1,1,8,8] (rank 4)"),
        "int64 dtype": (_folder(root, "ints", [x.astype(np.int64)]), "expects float32, got int64"),
        "string dtype": (_folder(root, "strings", [np.full((1, 1, 8, 8), "a")]), "expects float32, got str"),
        "pickle in a folder": (_folder(root, "pickled", [payload]), "Python objects (pickled data)"),
        "pickle .npy": (root / "pickled.npy", "Python objects (pickled data)"),
        "pickle .npz": (root / "pickled.npz", "Python objects (pickled data)"),
        "corrupt .npy": (root / "corrupt", "not a valid .npy array file"),
        "truncated .npy": (root / "truncated", "not a valid .npy array file"),
        "text as .npy": (root / "text", "not a valid .npy array file"),
        "corrupt .npz": (root / "corrupt.npz", "cannot read"),
        "empty .npz": (root / "empty.npz", "cannot read"),
        "no input in .npz": (root / "nothing.npz", "has no entry for model input 'input'"),
        "a model as data": (Path(MODEL), "unsupported data file"),
    }
    (root / "empty").mkdir()
    np.save(root / "pickled.npy", payload, allow_pickle=True)
    np.savez(root / "pickled.npz", input=payload)
    for name, content in (("corrupt", b"\x93NUMPY garbage"), ("truncated", raw[:100]), ("text", b"1,2,3\n")):
        (root / name / "input").mkdir(parents=True)
        (root / name / "input" / "0.npy").write_bytes(content)
    (root / "corrupt.npz").write_bytes(b"PK\x03\x04garbage")
    (root / "empty.npz").write_bytes(b"")
    np.savez(root / "nothing.npz")
    pickle.loads(pickle.dumps(Payload(root / "probe")))  # what loading the payload would do
    assert (root / "probe").exists()
    (root / "probe").unlink()
    return cases, marker


def nan_data(root: Path, count: int = 3, bad: tuple[int, ...] = (1,), everywhere: bool = False) -> Path:
    """A data folder of ``count`` digits samples; those in ``bad`` hold one NaN pixel (every pixel
    NaN with ``everywhere``)."""
    samples = [np.load(DIGITS_DATA / "input" / f"{i}.npy") for i in range(count)]
    for i in bad:
        samples[i] = samples[i].copy()
        if everywhere:
            samples[i][...] = np.nan
        else:
            samples[i].flat[3] = np.nan
    shutil.rmtree(root, ignore_errors=True)
    return _folder(root.parent, root.name, samples)


# command -> argv for a model, data and an output location (a fresh folder)
COMMANDS = {
    "dump": lambda m, d, o: ["dump", m, "-o", f"{o}/m.qir.txt"],
    "run": lambda m, d, o: ["run", m, d, "-o", f"{o}/o.npz"],
    "calibrate": lambda m, d, o: ["calibrate", m, d, "-o", f"{o}/c.onnx"],
    "pipeline": lambda m, d, o: ["pipeline", m, "fold-bn,fuse,insert-calibration,calibrate", "--data", d, "-o",
                                 f"{o}/p.onnx"],
    "set-mode": lambda m, d, o: ["set-mode", m, "-o", f"{o}/s.onnx", "--nodes", "conv2", "--mode", "int16"],
    "emit": lambda m, d, o: ["emit", m, "-o", f"{o}/e.onnx", "--float", "fc"],
    "evaluate": lambda m, d, o: ["evaluate", m, d, "-o", o, "--data-num", "3", "--quiet"],
    "sensitivity": lambda m, d, o: ["sensitivity", m, d, "-d", "3", "-s", o],
    "acc-error": lambda m, d, o: ["acc-error", m, d, "-q", "weight", "-d", "3", "-s", o],
    "distribution": lambda m, d, o: ["distribution", m, d, "--nodes-list", "conv2", "-d", "3", "-s", o],
    "channelwise": lambda m, d, o: ["channelwise", m, d, "--nodes-list", "relu1_out_calib", "-d", "3", "-s", o],
    "sensitivity-analysis": lambda m, d, o: ["sensitivity-analysis", m, d, "-sn", "['conv2']", "-d", "3", "-s", o],
    "runall": lambda m, d, o: ["runall", m, d, "-dn", "3", "-i", "['conv2']", "-dnl", "['conv2']", "-cn",
                               "['relu1_out_calib']", "-qn", "['conv2']", "-sn", "['conv2']", "-s", o],
    "check": lambda m, d, o: ["check", m, "-s", o],
    "consistency": lambda m, d, o: ["consistency", m, d, "-n", "3", "-s", o],
    "profile": lambda m, d, o: ["profile", m, d, "-d", "3", "-t", "Gemm", "-s", o],
    "bad-case": lambda m, d, o: ["bad-case", m, d, "-n", "3", "-o", o],
    "compare": lambda m, d, o: ["compare", m, m, d, "-n", "3", "--no-sensitivity", "-o", o],
    "numeric-suite": lambda m, d, o: ["numeric-suite", m, m, d, "-n", "3", "-o", o],
}
TAKES_DATA = [c for c in COMMANDS if c not in ("dump", "set-mode", "emit", "check")]
FLOAT_MODEL = ("dump", "run", "calibrate", "pipeline")  # the others read a calibrated model


def argv(command: str, model, data, out) -> list[str]:
    return [str(a) for a in COMMANDS[command](str(model), str(data), str(out))]


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """``qir ARGS`` in this process: (exit code, stdout, stderr); argparse's exit is a code too."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def one_clear_error(code: int, err: str, *says: str) -> str:
    """Assert the case ended in exit code 2 and exactly one ``qir: error:`` line (argparse's
    usage lines aside) holding every one of ``says``, with no traceback and no internal error;
    returns that line."""
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith("qir: error: ")]
    assert code == 2 and len(errors) == 1, (code, err)
    assert all(line.startswith(("usage:", " ", "qir: error: ")) for line in lines), err
    assert "Traceback" not in err and "internal error" not in err, err
    for text in says:
        assert text in errors[0], (text, errors[0])
    return errors[0]


def files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (nothing if it does not exist)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def skip_if_writable(folder: Path) -> None:
    """Skip when permissions do not stop writes (running as root)."""
    import os

    if os.access(folder, os.W_OK):
        pytest.skip("chmod does not deny writes here (running as root)")
