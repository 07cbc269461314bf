"""The graph panel and Model Explorer's node data on a real model with a planted fault: YOLOv8n
with one channel of one Conv's output scaled by 300 and scaled back by a Mul after it (the same
function in float, an outlier channel for a per-tensor activation quantizer). The op reading the
outlier is the worst-coloured node of runall's graph panel, and ranks first in the node data;
``qir view`` serves the model with that overlay to a real browser."""
from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import qir
from qir.tools.reports import model_explorer
from qir.tools.runall import runall

from ..conftest import calibrate_for_nash_e, real_models
from .browser import chromium, click_node, panel_state

pytestmark = pytest.mark.slow

FACTOR = 300.0
PLANTED = "planted_conv"  # (the Conv that reads the widened channel: its output is where the error shows)


def plant_outlier_channel(model: onnx.ModelProto, factor: float = FACTOR) -> tuple[str, int]:
    """Widen one input channel (the one with the largest weights) of the middle Conv ``factor``
    times with a Mul just before it, and undo it in that Conv's weights: the same function, one
    channel of the Conv's quantized input ``factor`` times wider, so the Conv's other input
    channels lose their int8 resolution and its output (the Conv, renamed ``PLANTED``) is where the
    error shows. (The Mul follows a SiLU, which nothing folds it into; a Mul after the Conv would
    be folded into its weights by ``fold-bn``.) Returns the Conv's name and the channel."""
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    convs = [n for n in g.node if n.op_type == "Conv" and len(n.input) == 3 and int(
        next((a.i for a in n.attribute if a.name == "group"), 1)) == 1]
    conv = convs[len(convs) // 2]
    w = numpy_helper.to_array(inits[conv.input[1]]).copy()
    c = int(np.argmax(np.abs(w).transpose(1, 0, 2, 3).reshape(w.shape[1], -1).max(1)))
    w[:, c] /= factor
    inits[conv.input[1]].CopyFrom(numpy_helper.from_array(w, conv.input[1]))
    scale = np.ones((1, w.shape[1], 1, 1), np.float32)
    scale[0, c] = factor
    x = conv.input[0]
    conv.input[0] = x + "_planted"
    g.initializer.append(numpy_helper.from_array(scale, "planted_scale"))
    g.node.insert(list(g.node).index(conv), helper.make_node("Mul", [x, "planted_scale"], [x + "_planted"],
                                                               name="planted_scale_mul"))
    conv.name = PLANTED
    return conv.name, c


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory):
    """runall (one sample) on the planted YOLOv8n calibrated for nash-e on two images; its folder
    and the calibrated model saved there as ``model.onnx``."""
    rm = real_models()
    folder = tmp_path_factory.mktemp("planted")
    model = onnx.load(rm.model("yolov8n_320"))
    plant_outlier_channel(model)
    onnx.save(model, folder / "planted.onnx")
    samples = [{"images": rm.yolov8n_input(img)} for img in rm.images(rm.CALIB)][:2]
    import onnxruntime as ort

    float_out = [ort.InferenceSession(str(p)).run(None, samples[0])[0]
                 for p in (rm.model("yolov8n_320"), folder / "planted.onnx")]
    np.testing.assert_allclose(float_out[1], float_out[0], rtol=1e-3, atol=1e-3)  # the same function in float
    ir = calibrate_for_nash_e(qir.load(folder / "planted.onnx", input_shapes={"images": [1, 3, 320, 320]}), samples)
    qir.save(ir, folder / "model.onnx")
    runall(ir, samples[:1], save_dir=folder / "debug", progress=False, log=lambda line: None)
    return folder, ir


def _panel_data(page) -> dict:
    text = page.read_text(encoding="utf-8")
    blob = re.search(r"<script type='application/json' class='qg-data'>(.*?)</script>", text, re.S).group(1)
    return json.loads(blob.replace("<\\/", "</"))


def test_planted_channel_is_the_worst_node_of_runalls_graph_panel(planted_run):
    folder, ir = planted_run
    data = _panel_data(folder / "debug" / "index.html")
    assert len(data["nodes"]) == len(ir.ops())
    first = data["overlays"][0]
    assert first["name"].startswith("sensitivity: worst of any quantizer")
    worst = max((t, data["nodes"][i][0]) for i, t in enumerate(first["t"]) if t is not None)
    assert worst == (1.0, PLANTED)
    others = sorted(t for i, t in enumerate(first["t"]) if t is not None and data["nodes"][i][0] != PLANTED)
    assert others[-1] < 1.0


@pytest.mark.browser
@pytest.mark.skipif(not model_explorer.available(), reason=model_explorer.NEEDS_VIZ)
def test_planted_channel_ranks_first_in_model_explorer_node_data(planted_run):
    folder, _ = planted_run
    doc = json.loads((folder / "debug" / "model_explorer" / "sensitivity.json").read_text())
    (graph,) = doc.values()
    ranked = sorted(graph["results"], key=lambda n: graph["results"][n]["value"])  # cosine: lowest first
    assert ranked[0] == PLANTED
    from model_explorer_onnx.main import ONNXAdapter

    ids = {n.id for n in ONNXAdapter().convert(str(folder / "model.onnx"), {})["graphs"][0].nodes}
    files = sorted((folder / "debug" / "model_explorer").glob("*.json"))
    assert {f.stem for f in files} >= {"sensitivity", "sensitivity_weight", "sensitivity_activation", "clipping"}
    assert any(f.stem.startswith("acc_error_") for f in files)
    for f in files:  # every overlay keyed by the node ids Model Explorer shows
        (g,) = json.loads(f.read_text()).values()
        assert g["results"] and set(g["results"]) <= ids, f.name


@pytest.mark.browser
def test_planted_channel_is_drawn_worst_and_clicks_to_its_rows_in_chromium(planted_run):
    folder, ir = planted_run
    driver = chromium()
    try:
        started = time.perf_counter()
        driver.get((folder / "debug" / "index.html").resolve().as_uri())
        state = panel_state(driver)
        assert time.perf_counter() - started < 3.0
        assert int(state["drawn"]) == len(ir.ops()) and all(n["fill"].startswith("#") for n in state["nodes"])
        worst = max((n for n in state["nodes"] if n["t"] is not None), key=lambda n: n["t"])
        assert worst["name"] == PLANTED
        click_node(driver, PLANTED)
        rows = driver.execute_script("return Array.from(document.querySelectorAll('tr.qg-row'))"
                                     ".map(function (tr) { return tr.getAttribute('data-node'); })")
        assert PLANTED in rows
        from selenium.webdriver.support.ui import Select

        root = driver.find_element("css selector", ".qg")
        driver.execute_script("arguments[0].scrollIntoView()", root)
        Select(root.find_element("css selector", "select.view")).select_by_value("blocks")  # /model.K blocks
        blocks = driver.find_elements("css selector", ".qg svg.main g.n.block")
        assert 12 <= len(blocks) < len(ir.ops()) / 3
        worst = max(blocks, key=lambda g: float(g.get_attribute("data-t") or -1))
        assert worst.get_attribute("data-node") == PLANTED  # a block of its own (its name has no path)
        # a click on it (it may lie outside the view, so dispatched) opens the ops view on the block's worst op
        driver.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", worst)
        assert root.get_attribute("data-selected") == PLANTED
    finally:
        driver.quit()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.browser
@pytest.mark.skipif(not model_explorer.available(), reason=model_explorer.NEEDS_VIZ)
def test_qir_view_serves_yolo_with_the_sensitivity_overlay(planted_run):
    folder, _ = planted_run
    driver = chromium()  # skips before the server starts where there is no browser
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "qir", "view", str(folder / "model.onnx"), str(folder / "debug"),
                             "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        deadline = time.time() + 120
        while url is None and time.time() < deadline:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "qir view exited before it printed the URL"
            found = re.search(r"Model Explorer \(Ctrl-C stops it\): (http://\S+)", line)
            url = found.group(1) if found else None
        assert url and url.startswith(f"http://127.0.0.1:{port}/?data=")
        for _ in range(60):  # the server starts after the URL is printed
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(1)
        driver.get(url)
        text = ""
        for _ in range(90):
            text = driver.execute_script("return document.body.innerText")
            if "worst of any quantizer" in text:
                break
            time.sleep(1)
        assert "model.onnx" in text and "sensitivity: worst of any quantizer (cosine-similarity)" in text
    finally:
        driver.quit()
        proc.terminate()
        proc.wait(timeout=30)
