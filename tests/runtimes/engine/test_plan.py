"""Steps, segments and cones checked against networkx reachability on the IR graph."""
from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

import qir
from qir.graph import value_key
from qir.passes import PassManager
from qir.records import OpRecord
from qir.runtimes.engine.cost import cone_fraction, op_flops, step_flops
from qir.runtimes.engine.plan import build_plan, split_segments

from ...conftest import REPO, model_from_text

RESIDUAL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,4,8,8] x) => (float[1,4,8,8] y, float[1,4,8,8] z) {
    a = Conv <pads=[1,1,1,1]> (x, w1)
    r = Relu (a)
    b = Conv <pads=[1,1,1,1]> (r, w2)
    s = Sigmoid (a)
    m = Mul (a, s)
    c = Add (b, m)
    y = Relu (c)
    z = Tanh (m)
}
"""


def _ir(text=RESIDUAL):
    model = model_from_text(text, {"w1": (4, 4, 3, 3), "w2": (4, 4, 3, 3)})
    ir = qir.import_onnx(model)
    PassManager("insert-calibration{march=nash-e}").run(ir)
    return ir


@pytest.mark.parametrize("source", ["residual", "digits"])
def test_steps_are_convex_ordered_and_cover_every_node(source):
    ir = _ir() if source == "residual" else qir.load(REPO / "qir/examples/digits/model.onnx")
    if source == "digits":
        PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(ir)
    plan = build_plan(ir)
    weight_cals = {c.name for c in ir.calibrations() if ir.value(c.input).kind.value == "weight"}
    covered = [r.name for s in plan.steps for r in s.records]
    assert sorted(covered) == sorted(r.name for r in ir.runnables() if r.name not in weight_cals)
    g = ir.graph
    produced = {}
    for s in plan.steps:
        for r in s.records:
            for o in r.outputs:
                produced[o] = s.index
        for v in s.inputs:  # inputs come from earlier steps (or are graph inputs)
            assert v in ir.inputs or produced[v] < s.index
        members = {r.name for r in s.records} | {value_key(o) for r in s.records for o in r.outputs
                                                  if o not in s.outputs}
        # convex: no path leaves the step and comes back
        outside = set(g.nodes) - members
        for m in members:
            for d in nx.descendants(g, m) & outside:
                assert not (nx.descendants(g, d) & members), (s.name, d)


def test_cone_is_exactly_what_is_downstream():
    ir = _ir()
    plan = build_plan(ir)
    g = ir.graph
    for cal in ir.calibrations():
        cone = plan.cone(plan.start_steps([cal.name]))
        below = nx.descendants(g, cal.name)
        for s in plan.steps:
            hit = any(r.name in below or r.name == cal.name for r in s.records)
            assert bool(cone[s.index]) == hit, (cal.name, s.name)


def test_segments_partition_by_cost_and_flops_fractions():
    assert split_segments([1, 1, 1, 1], 2) == [(0, 2), (2, 4)]
    assert split_segments([10, 1, 1, 1, 1], 2) == [(0, 1), (1, 5)]
    assert split_segments([1, 2], 5) == [(0, 1), (1, 2)]
    ir = _ir()
    plan = build_plan(ir)
    flops = step_flops(ir, plan)
    conv = next(r for r in ir.ops("Conv"))
    assert op_flops(ir, conv) == 2 * (4 * 8 * 8) * (4 * 3 * 3)
    assert op_flops(ir, ir.ops("Relu")[0]) == 4 * 8 * 8
    assert cone_fraction(plan, flops, [ir.calibrations("activation")[0].name]) == pytest.approx(1.0)
    for cal in ir.calibrations("activation"):
        below = nx.descendants(ir.graph, cal.name)
        expected = sum(op_flops(ir, r) for r in ir.ops() if r.name in below) / flops.sum()
        assert cone_fraction(plan, flops, [cal.name]) == pytest.approx(expected)
    assert np.isclose(flops.sum(), sum(op_flops(ir, r) for r in ir.ops()))
    assert all(isinstance(r, OpRecord) for s in plan.steps if s.calib is None for r in s.records)
