"""The reports' graph panel in a real browser (headless Chromium): every op drawn with a colour,
the worst node the planted fault, a click on it lands on its table row."""
from __future__ import annotations

import time

import numpy as np
import pytest

import qir
from qir.passes import PassManager, get_pass
from qir.tools.reports.graph_panel import NO_VALUE, ModelGraph
from qir.tools.runall import runall

from ..conftest import REPO
from .browser import chromium, click_node, panel_state

pytestmark = pytest.mark.browser

DIGITS = REPO / "qir" / "examples" / "digits"


@pytest.fixture(scope="module")
def browser():
    driver = chromium()
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def faulty_digits_report(tmp_path_factory):
    """runall on the digits model with relu3's quantizer clipping hard (its threshold / 40)."""
    ir = qir.load(DIGITS / "model.onnx")
    PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(ir)
    data = DIGITS / "calibration_data"
    get_pass("calibrate", data=data, method="max", progress=False)(ir)
    victim = ir.calibration("relu3_out_calib")
    victim.threshold = np.float32(float(victim.threshold) / 40)
    ir.touch()
    out = tmp_path_factory.mktemp("runall")
    runall(ir, data, save_dir=out, progress=False, log=lambda line: None)
    return out / "index.html", ir, set(victim.feeds)


def test_every_op_is_drawn_coloured_and_the_worst_click_finds_its_row(browser, faulty_digits_report):
    page, ir, readers = faulty_digits_report
    started = time.perf_counter()
    browser.get(page.resolve().as_uri())
    state = panel_state(browser)
    assert time.perf_counter() - started < 3.0
    assert browser.get_log("browser") == []  # no script error
    ops = [o.name for o in ir.ops()]
    assert int(state["drawn"]) == len(ops) and [n["name"] for n in state["nodes"]] == ops
    assert all(n["fill"] and n["fill"].startswith("#") for n in state["nodes"])
    coloured = [n for n in state["nodes"] if n["fill"] != NO_VALUE]
    assert coloured and all(n["t"] is not None for n in coloured)
    worst = max(coloured, key=lambda n: n["t"])
    assert worst["name"] in readers  # the op the clipping quantizer feeds
    click_node(browser, worst["name"])
    rows = browser.execute_script("return Array.from(document.querySelectorAll('tr.qg-row')).map(function (tr) "
                                  "{ return [tr.getAttribute('data-node'), tr.getBoundingClientRect().top]; })")
    keys = {worst["name"], *next(n.quantizers for n in ModelGraph.from_ir(ir).nodes if n.name == worst["name"])}
    assert "relu3_out_calib" in keys and {r[0] for r in rows} >= {worst["name"], "relu3_out_calib"}
    assert all(r[0] in keys for r in rows)
    height = browser.execute_script("return window.innerHeight")
    assert any(0 <= top <= height for _, top in rows)  # scrolled to it
    assert worst["name"] in browser.find_element("css selector", ".qg .info").text
