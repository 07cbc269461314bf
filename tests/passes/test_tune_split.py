"""A precision per consumer: a value read by an int8-only pool and by a Mul that needs int16 is
split for the search; split or not, at one precision it computes the same bits through emit,
qir.load, both runtimes and the integer level; tune reaches with the split a target it cannot
reach without it, and merges back the copies that ended where their node did."""
from __future__ import annotations

import numpy as np
import onnx

import qir
from qir.io.qdq_export import export_qdq
from qir.passes import get_pass
from qir.passes.tune.space import Space, constrained_splits
from qir.runtimes.base import get_runtime
from qir.runtimes.march import get_profile
from qir.split import merge_calibrations, siblings, split_calibration

from ..conftest import calibrate_for_nash_e, model_from_text

POOL_AND_MUL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,8,16,16] x) => (float[1,8,1,1] p, float[1,8,16,16] m) {
    c = Conv <pads=[1,1,1,1]> (x, w, b)
    a = Add (c, x)
    p = GlobalAveragePool (a)
    m = Mul (a, x)
}
"""
NASH_E = get_profile("nash-e")


def _model():
    """``a`` has one channel at ~60x the others' range: int8 per tensor leaves the others a few
    steps, which the Mul's output shows and the pool's average does not."""
    ir = qir.load(model_from_text(POOL_AND_MUL, {"w": (8, 8, 3, 3), "b": (8,)}, seed=1))
    w = ir.weight_array("w").copy() * 0.05
    w[0] *= 60.0
    ir.set_weight("w", w)
    return ir


def _data(n, seed):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 8, 16, 16)).astype(np.float32)} for _ in range(n)]


def test_a_pool_beside_a_mul_is_split_and_the_split_computes_the_same_bits_everywhere():
    ir = calibrate_for_nash_e(_model(), _data(3, 0))
    assert constrained_splits(ir, NASH_E) == {"a_calib": [["GlobalAveragePool_0"], ["Mul_0"]]}
    split = ir.clone()
    copies = split_calibration(split, "a_calib", [["GlobalAveragePool_0"], ["Mul_0"]])
    assert [c.name for c in copies] == ["a_calib", "a_calib@1"] and siblings(split) == {"a_calib": ["a_calib@1"]}
    assert "a_calib@1" in str(split)  # the printer shows the copy like any calibration node
    back = qir.load(export_qdq(split))
    assert siblings(back) == {"a_calib": ["a_calib@1"]}  # (a split survives emit and load)
    feed = _data(1, 5)[0]
    integer = get_runtime("numpy", level="integer", march="nash-e")
    for model in (split, back):
        for runtime in ("ort", "numpy"):
            want, got = qir.run(ir, feed, runtime=runtime), qir.run(model, feed, runtime=runtime)
            assert all(np.array_equal(want[k], got[k]) for k in want), runtime
        want, got = integer.run(ir, feed), integer.run(model, feed)
        assert all(np.array_equal(want[k], got[k]) for k in want)
    # QOperator emit carries it too (each copy its own quantized value)
    from qir.io.qoperator_export import to_qoperator

    qop = export_qdq(split)
    to_qoperator(qop)
    onnx.checker.check_model(qop)
    import onnxruntime as ort

    session = ort.InferenceSession(qop.SerializeToString(), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
    want = qir.run(split, feed)
    assert all(qir.metrics.cosine_similarity(want[k], got[k]) > 0.999 for k in want)
    # copies in one state merge back; a copy at another mode stays, and costs a requantize
    space = Space(split, NASH_E)
    same = space.cost_of_ir()
    split.set_calibration("a_calib@1", mode="int16")
    raised = Space(split, NASH_E)
    assert raised.cost_of_ir() > same
    assert merge_calibrations(split) == [] and siblings(split) == {"a_calib": ["a_calib@1"]}
    split.set_calibration("a_calib@1", mode="int8")
    assert merge_calibrations(split) == ["a_calib@1"] and siblings(split) == {}
    assert str(split) == str(ir)


def test_tune_reaches_with_the_split_a_floor_it_cannot_reach_without_it():
    calib, evaluation = _data(4, 0), _data(4, 1)
    ir = calibrate_for_nash_e(_model(), calib)

    def tuned(split):
        return get_pass("tune", target=TARGET, eval_data=evaluation, calib_data=calib, march="nash-e",
                        transforms=None, split=split, progress=False)(ir.clone())

    # the floor: above what every quantizer raised but `a` at int8 gives (the upper bound unsplit)
    unsplit = tuned(False)
    assert not unsplit.report["reached"] and unsplit.report["upper_bound"]["worst"] < 0.9999
    split = tuned(True)
    report = split.report
    assert report["reached"] and report["verification"]["agrees"]
    assert report["split"]["values"] == ["a_calib"] and report["split"]["kept"] == ["a_calib"]
    assert split.ir.calibration("a_calib").mode.value == "int8"  # the pool's input stays int8 ...
    assert split.ir.calibration("a_calib@1").mode.value == "int16"  # ... the Mul's goes to int16


TARGET = "cosine>=0.9999,worst>=0.9999@m"


def test_qir_tune_writes_a_split_result_and_commands_that_rebuild_it(tmp_path):
    import subprocess

    calib, evaluation = _data(4, 0), _data(4, 1)
    ir = calibrate_for_nash_e(_model(), calib)
    report = qir.tune(ir, calib, evaluation, TARGET, march="nash-e", transforms=None, save_dir=tmp_path / "t",
                      progress=False)
    assert report["reached"] and report["split"]["kept"] == ["a_calib"]
    commands = (tmp_path / "t" / "reproduce" / "commands.sh").read_text()
    assert "transformed_model.onnx" in commands and "qir calibrate" not in commands
    done = subprocess.run(["sh", str(tmp_path / "t" / "reproduce" / "commands.sh")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rebuilt = qir.load(str(tmp_path / "t" / "reproduce" / "tuned_model.onnx"))
    tuned = qir.load(str(tmp_path / "t" / "tuned_model.onnx"))
    assert {c.name: c.mode for c in rebuilt.calibrations()} == {c.name: c.mode for c in tuned.calibrations()}
