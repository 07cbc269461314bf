"""runall: the five analyses in hmct's order, every output file, and an offline index.html
that points at a planted fault."""
from __future__ import annotations

import base64
import re

import numpy as np

import qir
from qir.passes import PassManager, get_pass
from qir.tools.cli import main

from ..conftest import REPO

DIGITS = REPO / "qir" / "examples" / "digits"
DATA = DIGITS / "calibration_data"


def test_runall_writes_everything_and_points_at_the_fault(tmp_path, capsys):
    ir = qir.load(DIGITS / "model.onnx")
    PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(ir)
    get_pass("calibrate", data=DATA, method="max", progress=False)(ir)
    victim = ir.calibration("relu3_out_calib")
    victim.threshold = np.float32(float(victim.threshold) / 40)
    ir.touch()
    model = tmp_path / "faulty.onnx"
    qir.save(ir, model)
    out = tmp_path / "debug_result"
    assert main(["runall", str(model), str(DATA), "-s", str(out), "--runtime", "numpy"]) == 0
    printed = capsys.readouterr().out
    assert [line[:5] for line in printed.splitlines()[:5]] == ["[1/5]", "[2/5]", "[3/5]", "[4/5]", "[5/5]"]
    for folder, files in {
        "node_sensitivity": ["sensitivity_of_weight.txt", "sensitivity_of_activation.json"],
        "data_distribution": ["relu3_out_calib.png"],
        "channelwise_distribution": ["relu3_out_calib_channelwise.png", "channelwise.txt"],
        "accumulate_error": ["acc_error_cosine-similarity.png", "acc_error.csv"],
        "sensitivity_analysis": ["partial_quantization.png", "sensitivity_analysis.json"],
    }.items():
        for name in files:
            assert (out / folder / name).stat().st_size > 0, (folder, name)
    page = (out / "index.html").read_text()
    assert not re.findall(r'(?:src|href)="(?!data:)', page)  # everything embedded: renders offline
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) >= 4 and all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in images)
    assert page.count("<table>") >= 3  # weight and activation sensitivity, sensitivity analysis
    advice = page[page.index("What to try next"):page.index("Node sensitivity")]
    assert "relu3_out_calib" in advice and "qir emit" in advice
    activation = page[page.index("Node sensitivity: activation"):]
    assert activation.index("relu3_out_calib") < activation.index("relu1_out_calib")
