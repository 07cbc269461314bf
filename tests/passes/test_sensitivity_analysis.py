"""sensitivity-analysis: picked nodes, single and cumulative values against the definition."""
from __future__ import annotations

import json

import numpy as np
import pytest

import qir
from qir import metrics as M
from qir.errors import InputError
from qir.tools.compat.hmct import get_sensitivity_of_nodes, sensitivity_analysis

from ..conftest import REPO

DIGITS = REPO / "qir" / "examples" / "digits"
DATA = DIGITS / "calibration_data"


@pytest.fixture(scope="module")
def faulty(digits_calibrated):
    """The digits model with two quantizers given far too small thresholds."""
    ir = digits_calibrated.clone()
    for name, factor in (("relu3_out_calib", 40), ("relu1_out_calib", 8)):
        c = ir.calibration(name)
        c.threshold = np.float32(float(c.threshold) / factor)
    ir.touch()
    return ir


def test_picks_sensitive_nodes_and_recovers(faulty, tmp_path):
    ir = faulty
    ns = get_sensitivity_of_nodes(ir, DATA, progress=False, runtime="numpy")
    result = sensitivity_analysis(ir, DATA, pick_threshold=0.999, save_dir=tmp_path, runtime="numpy", progress=False)
    expected = [n for n, v in ns.items() if v["cosine-similarity"] <= 0.999]
    assert list(result) == expected and len(expected) >= 2
    for node, values in result.items():
        assert values["single"] == pytest.approx(ns[node]["cosine-similarity"])
    # cumulative k: the calibrated model with nodes 1..k back to float, computed plainly
    sample = qir.data.model_samples(ir, DATA, 1)[0]
    float_out = qir.run(qir.runtimes.engine.configured_clone(ir, "float", {}), sample)[ir.outputs[0]]
    raised: set[str] = set()
    for node, values in result.items():
        raised |= {c.name for c in ir.calibrations() if node in c.feeds}
        clone = ir.clone()
        for c in clone.calibrations():
            if c.name in raised:
                c.mode = qir.CalibMode.FLOAT
        clone.touch()
        got = qir.run(clone, sample)[ir.outputs[0]]
        assert values["cumulative"] == pytest.approx(M.cosine_similarity(float_out, got), abs=1e-9)
    cumulative = [v["cumulative"] for v in result.values()]
    assert cumulative[-1] > cumulative[0]  # raising the sensitive nodes recovers accuracy
    doc = json.loads((tmp_path / "sensitivity_analysis.json").read_text())
    assert doc["nodes"] == expected and len(doc["cumulative"]) == len(expected) + 1
    assert (tmp_path / "partial_quantization.png").stat().st_size > 10_000


def test_given_nodes_qtype_and_errors(faulty, tmp_path):
    ir = faulty
    result = sensitivity_analysis(ir, DATA, sensitive_nodes=["dw3", "conv2"], qtype="int16", save_dir=tmp_path,
                                  runtime="numpy", progress=False)
    assert list(result) == ["dw3", "conv2"]
    with pytest.raises(InputError, match="qtype"):
        sensitivity_analysis(ir, DATA, qtype="int4", save_dir=tmp_path, progress=False)
