"""Data is checked against the model before any work (issue: a newcomer's first hour, item 4): one
line names the dynamic dimensions the data fixes; data that cannot fit is one error naming the
input, the shape found, the shape expected and the `qir data` flag that makes it fit."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from qir.data import check_shape
from qir.errors import InputError
from qir.tools.cli import main

from ..conftest import real_models

EXPECTED = ["batch", 3, "height", "width"]  # YOLOv8n's input, as its file declares it


@pytest.mark.parametrize("found, hint", [((1, 320, 320, 3), "--layout NCHW"), ((3, 320, 320), "no batch axis"),
                                         ((1, 1, 320, 320), "--channels rgb")])
def test_data_that_cannot_fit_names_the_input_the_shapes_and_the_flag(found, hint):
    with pytest.raises(InputError) as err:
        check_shape("images", EXPECTED, found, "a folder")
    text = str(err.value)
    assert "input 'images' expects shape [batch,3,height,width]" in text and f"got {list(found)}" in text
    assert hint in text


def test_a_static_size_that_differs_suggests_the_size_flag():
    with pytest.raises(InputError, match=r"--size 224,224"):
        check_shape("x", [1, 3, 224, 224], (1, 3, 640, 640), "a folder")


def test_the_dynamic_dimensions_the_data_fixes_are_said_once(caplog):
    caplog.set_level(logging.INFO, logger="qir.data")
    for _ in range(3):
        check_shape("images", EXPECTED, (1, 3, 640, 480), "once-test-folder")
    said = [r.getMessage() for r in caplog.records if "the data fixes" in r.getMessage()]
    assert said == ["input 'images' [batch,3,height,width]: the data fixes batch=1, height=640, width=480"]


def _folder(path, shape):
    (path / "images").mkdir(parents=True)
    for i in range(2):
        np.save(path / "images" / f"{i}.npy", np.random.default_rng(i).random(shape, dtype=np.float32))
    return str(path)


@pytest.mark.slow
def test_yolov8n_on_channels_last_data_fails_before_any_work(tmp_path, capsys):
    model = str(real_models().model("yolov8n_320"))
    nhwc = _folder(tmp_path / "nhwc", (1, 320, 320, 3))
    assert main(["calibrate", model, nhwc, "-o", str(tmp_path / "y.onnx")]) == 2
    err = capsys.readouterr().err
    assert "input 'images' expects shape [batch,3,height,width], got [1, 320, 320, 3]" in err and "--layout NCHW" in err
    assert "onnxruntime" not in err and not (tmp_path / "y.onnx").exists()  # refused before any pass ran


@pytest.mark.slow
def test_yolov8n_says_which_dynamic_dimensions_the_data_fixed(tmp_path, caplog):
    model = str(real_models().model("yolov8n_320"))
    data = _folder(tmp_path / "nchw", (1, 3, 320, 320))
    assert main(["run", model, data, "-d", "1"]) == 0
    said = [r.getMessage() for r in caplog.records if r.name == "qir.data"]
    assert said == ["input 'images' [batch,3,height,width]: the data fixes batch=1, height=320, width=320"]
