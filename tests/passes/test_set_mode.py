"""set-mode: selection by name, op, module path, op type, role, glob, file; clear errors."""
from __future__ import annotations

import pytest

import qir
from qir.errors import InputError, NotFoundError
from qir.passes import PassManager, get_pass
from qir.passes.lib.selection import select_calibrations

from ..conftest import REPO

DIGITS = REPO / "qir" / "examples" / "digits" / "model.onnx"


@pytest.fixture
def ir():
    ir = qir.load(DIGITS)
    PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(ir)
    return ir


def names(cals):
    return sorted(c.name for c in cals)


def test_selection_criteria(ir, tmp_path):
    assert names(select_calibrations(ir, ["conv2"])) == ["conv2.weight_calib", "relu1_out_calib"]
    assert names(select_calibrations(ir, ["conv2"], role="weight")) == ["conv2.weight_calib"]
    assert names(select_calibrations(ir, ["relu1_out_calib"])) == ["relu1_out_calib"]
    assert len(select_calibrations(ir, op_types=["Conv"], role="weight")) == 5
    assert names(select_calibrations(ir, ["conv*.weight_calib"])) == [
        "conv1.weight_calib", "conv2.weight_calib", "conv5.weight_calib"]
    ir.op("fc").module = "head.fc"
    assert names(select_calibrations(ir, ["head.fc"])) == ["fc.weight_calib", "flatten_out_calib"]
    listing = tmp_path / "nodes.txt"
    listing.write_text("# sensitive nodes\nconv1\n\npool4_out_calib  # the pooled map\n")
    result = get_pass("set-mode", from_file=str(listing), mode="int16")(ir)
    assert sorted(result.report["changed"]) == ["conv1.weight_calib", "input_calib", "pool4_out_calib"]


def test_modes_and_fixed_thresholds(ir):
    get_pass("set-mode", role="activation", mode="float")(ir)
    assert {c.mode.value for c in ir.calibrations("activation")} == {"float"}
    r = get_pass("set-mode", nodes="pool4_out_calib", threshold=3.5)(ir)
    cal = ir.calibration("pool4_out_calib")
    assert r.report["changed"] == ["pool4_out_calib"] and cal.fixed and float(cal.threshold) == 3.5
    assert get_pass("set-mode", mode="float", nodes="pool4_out_calib")(ir).modified is False


def test_errors(ir):
    with pytest.raises(NotFoundError, match="did you mean 'conv2'"):
        select_calibrations(ir, ["conv22"])
    with pytest.raises(NotFoundError, match="did you mean 'Conv'"):
        select_calibrations(ir, op_types=["Cnv"])
    with pytest.raises(InputError, match="unknown mode 'int4'"):
        get_pass("set-mode", mode="int4")
    with pytest.raises(InputError, match="needs a mode"):
        get_pass("set-mode", nodes="conv1")
    with pytest.raises(InputError, match="finite number > 0"):
        get_pass("set-mode", threshold=0.0)


def test_a_selector_that_selects_nothing_is_an_error(ir):
    before = {c.name: c.mode for c in ir.calibrations()}
    with pytest.raises(NotFoundError, match=r"no calibration node, op or module path matches '/model.99/\*'"):
        select_calibrations(ir, ["conv2", "/model.99/*"])  # one glob of the list matches nothing
    with pytest.raises(NotFoundError, match="matches 'zzz\\*'"):
        get_pass("set-mode", nodes="zzz*", mode="int16")(ir)
    assert {c.name: c.mode for c in ir.calibrations()} == before
    # each criterion matches something, but no calibration node meets both
    fc_weight_only = get_pass("set-mode", nodes="fc.weight_calib", role="activation", mode="int16")
    with pytest.raises(InputError, match="selects no calibration node"):
        fc_weight_only(ir)


def test_every_node_takes_all(ir, tmp_path):
    with pytest.raises(InputError, match="--all for every one"):
        get_pass("set-mode", mode="int16")
    with pytest.raises(InputError, match="give it without"):
        get_pass("set-mode", mode="int16", role="weight", all=True)
    empty = tmp_path / "none.txt"
    empty.write_text("# nothing chosen yet\n")
    with pytest.raises(InputError, match="lists no node names"):
        get_pass("set-mode", from_file=str(empty), mode="int16")
    result = get_pass("set-mode", mode="int16", all=True)(ir)
    assert sorted(result.report["changed"]) == sorted(c.name for c in ir.calibrations())
    assert {c.mode.value for c in ir.calibrations()} == {"int16"}
    assert PassManager("set-mode{all=True,mode=float}").run(ir).modified
