"""`qir data`: images or arrays -> a data folder the other commands read."""
from __future__ import annotations

import numpy as np
import pytest

from qir.tools.cli import main

from ..conftest import DIGITS

PIL = pytest.importorskip("PIL.Image")
MODEL = str(DIGITS / "model.onnx")


def test_images_to_a_data_folder_the_model_runs_on(tmp_path, capsys):
    rng = np.random.default_rng(0)
    for i in range(3):
        PIL.fromarray(rng.integers(0, 256, (16, 12, 3), dtype=np.uint8)).save(tmp_path / f"digit{i}.jpg")
    out = tmp_path / "data"
    args = ["data", str(tmp_path), "-o", str(out), "--model", MODEL, "--channels", "gray", "--size", "8",
            "--scale", "1/16"]
    assert main(args) == 0
    assert "wrote 3 sample(s) of input 'input' (1x1x8x8 float32)" in capsys.readouterr().out
    assert sorted(p.name for p in (out / "input").iterdir()) == ["0.npy", "1.npy", "2.npy"]
    assert main(["run", MODEL, str(out), "--runtime", "ort"]) == 0
    assert main(args) == 2 and "already exist" in capsys.readouterr().err
    assert main(args + ["--force"]) == 0


def test_arrays_and_the_errors(tmp_path, capsys):
    stack = np.random.default_rng(1).standard_normal((5, 1, 1, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "digits.npz", input=stack)
    assert main(["data", str(tmp_path / "digits.npz"), "-o", str(tmp_path / "data"), "--model", MODEL]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "data" / "input" / "4.npy"), stack[4])
    assert main(["data", str(tmp_path / "digits.npz"), "-o", str(tmp_path / "x"), "--size", "8"]) == 2
    assert "--size: options for images" in capsys.readouterr().err
    assert main(["data", str(tmp_path), "-o", str(tmp_path / "x")]) == 2  # images for which input?
    assert "--input NAME" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["data", str(tmp_path / "digits.npz"), "-o", str(tmp_path / "x"), "--scale", "1/0"])
    assert exit_.value.code == 2 and "a fraction such as 1/255" in capsys.readouterr().err
