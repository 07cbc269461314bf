"""Batched variants on onnxruntime: activation-only variants run as rows of segment sessions
whose changed calibration nodes are switches (qir.runtimes.ort.switches). Their results equal the
plain "clone, set the modes, run the whole model" evaluation and the step-by-step path, at any
batch size; variants the switches cannot run, and parts that fail their check, go step by step."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import qir
from qir.runtimes.engine import Engine, Variant, evaluate_plainly
from qir.runtimes.engine import rows as rows_module
from qir.runtimes.ort.switches import is_rows_input, make_batch_capable


@pytest.fixture(scope="module")
def calibrated(digits_calibrated):
    return digits_calibrated


@pytest.fixture(scope="module")
def samples(digits_samples):
    return digits_samples[:2]


def one_at_a_time(ir, mode):
    acts = [c.name for c in ir.calibrations("activation")]
    return [Variant(a, {a: mode}) for a in acts] + [Variant("pair", {acts[1]: mode, acts[-2]: mode})]


def outputs_of(engine, variants, sample):
    engine._reference(0, sample, steps=False)
    return {v.name: engine.run_variant(v) for v in variants}


@pytest.mark.parametrize("reference,mode", [("float", "int8"), ("quantized", "float"), ("quantized", "int16")])
def test_rows_equal_the_plain_evaluation_at_every_batch_size(calibrated, samples, reference, mode):
    ir = calibrated
    variants = one_at_a_time(ir, mode)
    results = {}
    for batch in (1, 4):
        engine = Engine(ir, samples, reference=reference, baseline="reference", metrics=["mse"],
                        segments=3, batch=batch, threads=2, progress=False)
        results[batch] = engine.evaluate(variants)
        assert engine.batch == batch
        assert engine.stats["steps_run"] == 0  # every variant ran as a row
    assert results[1].rows == results[4].rows  # batching changes nothing, bit for bit
    engine = Engine(ir, samples, reference=reference, segments=3, batch=4, progress=False)
    engine.rows.route(variants)
    for s, sample in enumerate(samples):
        engine._reference(s, sample, steps=False)
        base = evaluate_plainly(ir, sample, {}, reference=reference, threads=1, optimization=engine.optimization)
        for v in variants:
            plain = evaluate_plainly(ir, sample, v.changes, reference=reference, threads=1,
                                     optimization=engine.optimization)
            got = engine._run_rows([engine.variant_records.changes(v)])[0]
            out = ir.outputs[0]
            assert np.abs(got[out] - plain[out]).max() <= 1e-6 * np.abs(plain[out]).max(), v.name
            row = next(r for r in results[4].rows if r["variant"] == v.name and r["sample"] == s)
            expected = float(np.mean((plain[out].astype(np.float64) - base[out]) ** 2))
            assert row["values"][out]["mse"] == pytest.approx(expected, rel=1e-4, abs=1e-12)


def test_a_batch_of_rows_equals_the_rows_one_by_one(calibrated, samples):
    ir = calibrated
    variants = one_at_a_time(ir, "int8")
    engine = Engine(ir, samples[:1], segments=3, batch=8, progress=False)
    engine.rows.route(variants)
    engine._reference(0, samples[0], steps=False)
    changes = [engine.variant_records.changes(v) for v in variants]
    together = engine._run_rows(changes)
    for ch, got in zip(changes, together):
        alone = engine._run_rows([ch])[0]
        for name in engine.compare:
            assert np.array_equal(got[name], alone[name])


def test_variants_the_switches_cannot_run_go_step_by_step(calibrated, samples):
    ir = calibrated
    acts = [c.name for c in ir.calibrations("activation")]
    weight = ir.calibrations("weight")[0].name
    variants = [Variant("a", {acts[2]: "int8"}), Variant("b", {acts[2]: "int8", acts[4]: "int8"}),
                Variant("c", {acts[4]: "int16"}),  # acts[4] is a switch to int8: c runs step by step
                Variant("w", {weight: "int8"}),      # a weight: step by step
                Variant("none", {acts[0]: "float"})]  # no change from the float reference
    engine = Engine(ir, samples[:1], segments=3, metrics=["mse"], progress=False)
    batched, single = engine.rows.route(variants)
    assert [v.name for v, _ in batched] == ["a", "b", "none"]
    assert [v.name for v in single] == ["c", "w"]
    result = engine.evaluate(variants)
    assert engine.stats["steps_run"] > 0
    table = result.per_variant()
    assert table["none"]["mse"] == 0.0
    for v in variants:
        plain = evaluate_plainly(ir, samples[0], v.changes, threads=1, optimization=engine.optimization)
        base = evaluate_plainly(ir, samples[0], {}, reference="float", threads=1)
        out = ir.outputs[0]
        expected = float(np.mean((plain[out].astype(np.float64) - base[out]) ** 2))
        assert table[v.name]["mse"] == pytest.approx(expected, rel=1e-4, abs=1e-12), v.name


def test_only_activation_variants_never_run_a_step(calibrated, samples):
    engine = Engine(calibrated, samples, segments=3, progress=False)
    engine.evaluate(one_at_a_time(calibrated, "int8"))
    assert engine.stats["steps_run"] == 0 and engine.stats["segments_run"] > 0
    assert engine.runner.sessions == 3 + 3  # each segment as the reference, and with its switches


def test_a_part_failing_its_check_sends_its_variants_step_by_step(calibrated, samples, monkeypatch):
    ir = calibrated
    variants = one_at_a_time(ir, "int8")
    expected = Engine(ir, samples, segments=3, progress=False).evaluate(variants).per_variant()
    monkeypatch.setattr(rows_module, "_close", lambda got, expect, rtol=1e-6: False)
    engine = Engine(ir, samples, segments=3, progress=False)
    result = engine.evaluate(variants)
    assert engine.rows.distrusted == {0, 1, 2} and engine.stats["steps_run"] > 0
    for name, metrics in result.per_variant().items():
        assert metrics["cosine-similarity"] == pytest.approx(expected[name]["cosine-similarity"], abs=1e-6)


def test_a_batch_differing_from_single_runs_falls_back_to_one_per_call(calibrated, samples, monkeypatch):
    ir = calibrated
    variants = one_at_a_time(ir, "int8")
    expected = Engine(ir, samples, segments=3, batch=1, progress=False).evaluate(variants)
    monkeypatch.setattr(rows_module, "_equal", lambda got, expect: False)
    engine = Engine(ir, samples, segments=3, batch=4, progress=False)
    result = engine.evaluate(variants)
    assert engine.batch == 1 and engine.stats["steps_run"] == 0
    assert result.rows == expected.rows


def test_a_part_refusing_a_batch_falls_back_to_one_per_call(calibrated, samples, monkeypatch):
    from qir.errors import ExecutionError
    from qir.runtimes.engine.runners import OrtSteps

    ir = calibrated
    variants = one_at_a_time(ir, "int8")
    expected = Engine(ir, samples, segments=3, batch=1, progress=False).evaluate(variants)
    run = OrtSteps.run

    def refuse_batches(session, outputs, feeds):  # as onnxruntime does for a batch-1 Reshape
        if any(a.shape[:1] == (2,) for n, a in feeds.items() if not is_rows_input(n)):
            raise ExecutionError("Reshape: the input has 2x the elements the shape asks for")
        return run(session, outputs, feeds)

    monkeypatch.setattr(OrtSteps, "run", staticmethod(refuse_batches))
    engine = Engine(ir, samples, segments=3, batch=4, progress=False)
    result = engine.evaluate(variants)
    assert engine.batch == 1 and result.rows == expected.rows


def test_batch_must_be_positive(calibrated, samples):
    with pytest.raises(qir.errors.InputError, match="batch"):
        Engine(calibrated, samples, batch=0)


# ------------------------------------------------------------------ batch-capable export
def _reshape_model(shape_constant, allowzero=0, leading=1):
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [leading, 4, 2])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [leading, 8])
    node = helper.make_node("Reshape", ["x", "shape"], ["y"], allowzero=allowzero)
    graph = helper.make_graph([node], "g", [x], [y], [numpy_helper.from_array(np.array(shape_constant, np.int64),
                                                                           "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


class _Shapes:
    """Stands in for the IR: the batch-1 shape of every value."""

    def __init__(self, **shapes):
        self.shapes = shapes

    def has_value(self, name):
        return name in self.shapes

    def value(self, name):
        return type("V", (), {"shape": self.shapes[name]})


def test_batch_capable_reshape_copies_the_leading_dimension():
    import onnxruntime as ort

    model = _reshape_model([1, 8])
    assert make_batch_capable(model, _Shapes(x=(1, 4, 2)))
    assert numpy_helper.to_array(model.graph.initializer[0]).tolist() == [0, 8]
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.arange(3 * 8, dtype=np.float32).reshape(3, 4, 2)
    assert np.array_equal(session.run(None, {"x": x})[0], x.reshape(3, 8))


def test_batch_capable_leaves_what_it_cannot_rewrite():
    model = _reshape_model([1, 8], allowzero=1)  # 0 would mean a zero-sized dimension
    assert make_batch_capable(model, _Shapes(x=(1, 4, 2)))
    assert numpy_helper.to_array(model.graph.initializer[0]).tolist() == [1, 8]
    model = _reshape_model([2, 8], leading=2)  # a boundary value without a leading 1
    before = model.SerializeToString()
    assert not make_batch_capable(model, _Shapes(x=(2, 4, 2)))
    assert model.SerializeToString() == before
