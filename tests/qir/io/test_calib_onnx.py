"""Reading calibration state from files: a hand-edited mode or role that qir does not know is a
clear error naming the file, the node and the accepted values (not an internal error)."""
from __future__ import annotations

import json

import onnx
import pytest

import qir
from qir.errors import ImportError_
from qir.tools.cli import main
from qir.tools.emit import emit_model


def _edited_calibration(model: onnx.ModelProto, key: str, value: str) -> str:
    """The name of the first qir::Calibration node, whose attribute ``key`` is set to ``value``."""
    node = next(n for n in model.graph.node if n.op_type == "Calibration")
    attr = next(a for a in node.attribute if a.name == key)
    attr.s = value.encode()
    return node.name


@pytest.mark.parametrize("key, value, accepted", [("mode", "int9", "int8, int16, fp16, float"),
                                                 ("role", "bias", "weight, activation")])
def test_a_hand_edited_calibration_attribute_is_a_clear_error(digits_calibrated, tmp_path, capsys, key, value,
                                                              accepted):
    model = onnx.load(str(qir.save(digits_calibrated, tmp_path / "cal.onnx")))
    name = _edited_calibration(model, key, value)
    path = tmp_path / "edited.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ImportError_) as err:
        qir.load(path)
    assert str(err.value) == (f"{path}: calibration node {name!r}: {key} {value!r} is not one of {accepted}; "
                              "fix the file, or make it again with qir (calibrate, set-mode)")
    assert main(["dump", str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"qir: error: {path}: calibration node {name!r}: {key} {value!r}")


def test_a_hand_edited_mode_in_the_emit_metadata_is_a_clear_error(digits_calibrated, tmp_path):
    path = tmp_path / "partial.onnx"
    emit_model(digits_calibrated, path)
    model = onnx.load(str(path))
    prop = next(p for p in model.metadata_props if p.key == "qir.calibrations")
    doc = json.loads(prop.value)
    entry = next(e for e in doc["calibrations"] if e["mode"] == "int8")
    entry["mode"] = "int9"
    prop.value = json.dumps(doc)
    onnx.save(model, str(path))
    with pytest.raises(ImportError_, match=f"{path}: the qir.calibrations metadata of calibration node "
                                           f"'{entry['name']}': mode 'int9' is not one of int8, int16, fp16, float"):
        qir.load(path)
