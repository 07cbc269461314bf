"""The PTQ debugger on real third-party models: a planted fault is found by every analysis and
named by runall's advice; the CLI and the API agree; numpy and onnxruntime agree."""
from __future__ import annotations

import json

import numpy as np
import pytest

import qir
from qir.passes.acc_error import AccErrorPass
from qir.tools.cli import main
from qir.tools.compat.hmct import get_channelwise_data_distribution, get_sensitivity_of_nodes, plot_distribution
from qir.tools.runall import runall

from ..conftest import calibrated_real

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def faulty_yolo():
    ir, images = calibrated_real("yolov8n_320", [1, 3, 320, 320])
    acts = ir.calibrations("activation")
    victim, healthy = acts[len(acts) // 2], acts[len(acts) // 2 + 7]
    victim.threshold = np.float32(float(victim.threshold) / 100)
    ir.touch()
    return ir, images[:1], victim.name, healthy.name


def test_every_analysis_finds_the_planted_fault(faulty_yolo, tmp_path):
    ir, data, victim, healthy = faulty_yolo
    readers = set(ir.calibration(victim).feeds)
    nodes = get_sensitivity_of_nodes(ir, data, node_type="node", threads=2, progress=False)
    assert next(iter(nodes)) in readers
    acc = AccErrorPass(data, [victim], progress=False)(ir).report
    curve, names = acc["curves"][victim], acc["nodes"]
    first_reader = min(names.index(r) for r in readers)
    assert curve[:first_reader] == pytest.approx([1.0] * first_reader, abs=1e-12)  # nothing before it changes
    assert curve[first_reader] < 0.99  # the drop is at the fault
    dist = plot_distribution(tmp_path / "d", ir, data, [victim, healthy])
    assert dist[victim]["clipped_fraction"] > 0.01 and dist[healthy]["clipped_fraction"] < 1e-3
    boxes = get_channelwise_data_distribution(tmp_path / "c", ir, data, [victim])
    assert boxes[victim]["clipped_fraction"] > 0.01
    report = runall(ir, data, save_dir=tmp_path / "runall", progress=False, log=lambda line: None)
    assert any(victim in tip["text"] and "clips" in tip["text"] and tip["after"] > tip["before"] for tip in report["advice"])
    page = (tmp_path / "runall" / "index.html").read_text()
    assert victim in page[page.index('<section id="fixes">'):page.index('<section id="about">')]  # the measured fixes


def _saved_cls(tmp_path):
    """The text-direction classifier calibrated on two text images, saved, and those images as .npz."""
    ir, images = calibrated_real("ppocr_cls", [1, 3, 48, 192], ["page.png", "text.png"])
    model, data = tmp_path / "cls.onnx", tmp_path / "data.npz"
    qir.save(ir, model)
    np.savez(data, x=np.stack([s["x"] for s in images]))  # one sample per entry
    return model, data


def test_cli_and_api_agree_and_runtimes_agree(tmp_path):
    model, _ = _saved_cls(tmp_path)
    by_rt = {rt: get_sensitivity_of_nodes(model, tmp_path / "data.npz", metrics=["cosine-similarity", "mse"],
                                          node_type="activation", runtime=rt, progress=False)
             for rt in ("numpy", "ort")}
    # the same top 10, in the same order up to ties closer than the runtimes' 1e-4 agreement
    # (several quantizers here see the same tensor and tie to 1e-9)
    top_numpy, top_ort = list(by_rt["numpy"])[:10], list(by_rt["ort"])[:10]
    assert set(top_numpy[:9]) <= set(list(by_rt["ort"])[:11])
    ort_cos = [by_rt["ort"][n]["cosine-similarity"] for n in top_numpy]
    assert all(a <= b + 1e-4 for a, b in zip(ort_cos, ort_cos[1:]))
    assert top_numpy[:2] == top_ort[:2]
    for node, values in by_rt["ort"].items():
        for m, v in values.items():
            assert by_rt["numpy"][node][m] == pytest.approx(v, abs=1e-4)
    assert main(["sensitivity", str(model), str(tmp_path / "data.npz"), "-m", "cosine-similarity,mse", "--node-type",
                 "activation", "-s", str(tmp_path / "ns")]) == 0
    rows = json.loads((tmp_path / "ns" / "node_sensitivity.json").read_text())["rows"]
    assert [r["node"] for r in rows] == list(by_rt["ort"])
    assert all(r["mse"] == pytest.approx(by_rt["ort"][r["node"]]["mse"], rel=1e-9) for r in rows)


def test_runall_from_the_command_line_writes_every_file(tmp_path):
    model, data = _saved_cls(tmp_path)
    out = tmp_path / "debug_result"
    assert main(["runall", str(model), str(data), "-s", str(out), "-pt", "0.9999"]) == 0
    expected = ["node_sensitivity/sensitivity_of_weight.txt", "node_sensitivity/sensitivity_of_weight.csv",
                "node_sensitivity/sensitivity_of_activation.json", "data_distribution/distribution.json",
                "channelwise_distribution/channelwise.txt", "channelwise_distribution/channelwise.json",
                "accumulate_error/acc_error_cosine-similarity.png", "accumulate_error/acc_error.json",
                "sensitivity_analysis/partial_quantization.png", "sensitivity_analysis/sensitivity_analysis.csv",
                "index.html"]
    for name in expected:
        assert (out / name).stat().st_size > 0, name
    assert len(list((out / "data_distribution").glob("*.png"))) == 10
