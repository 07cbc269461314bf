"""Cost-balanced shards: LPT against brute force and Graham's 4/3 bound, the even split, a step's
predicted work counted by hand, and a variant's cost against the cone fractions of
:mod:`qir.runtimes.engine.cost`."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import qir
from qir.passes import PassManager
from qir.runtimes.engine.cost import cone_fraction, step_flops
from qir.runtimes.engine.plan import build_plan
from qir.runtimes.engine.shards import (
    CALL_WORK,
    ELEMENT_WORK,
    QUANTIZE_WORK,
    even_split,
    loads,
    lpt,
    makespan,
    step_costs,
    step_work,
    variant_costs,
)

from ...conftest import model_from_text

costs_lists = st.lists(st.integers(min_value=0, max_value=1000), min_size=0, max_size=7)


def best_makespan(costs: list[int], workers: int) -> float:
    """The optimal makespan, by trying every assignment."""
    if not costs:
        return 0.0
    best = float("inf")
    for assignment in itertools.product(range(workers), repeat=len(costs)):
        load = [0] * workers
        for c, w in zip(costs, assignment):
            load[w] += c
        best = min(best, max(load))
    return float(best)


@settings(max_examples=150, deadline=None)
@given(costs=costs_lists, workers=st.integers(min_value=1, max_value=3))
def test_lpt_is_a_partition_within_grahams_bound_of_the_best(costs, workers):
    shards = lpt(costs, workers)
    assert len(shards) == workers
    assert sorted(i for s in shards for i in s) == list(range(len(costs)))
    assert all(s == sorted(s) for s in shards)
    best = best_makespan(costs, workers)
    got = makespan(costs, shards)
    assert best <= got <= (4 / 3 - 1 / (3 * workers)) * best + 1e-9
    assert got >= max([*costs, 0]) and got * workers >= sum(costs) - 1e-9


@settings(max_examples=200, deadline=None)
@given(costs=st.lists(st.floats(min_value=0, max_value=1e6), max_size=60), workers=st.integers(1, 40))
def test_lpt_loads_differ_by_at_most_one_item(costs, workers):
    shards = lpt(costs, workers)
    assert sorted(i for s in shards for i in s) == list(range(len(costs)))
    # the last item a worker got went to the least-loaded worker then: loads differ by at most one item,
    # so the makespan is at most the mean load plus the largest item (list scheduling's bound)
    got = loads(costs, shards)
    assert max(got) - min(got) <= max(costs, default=0.0) * (1 + 1e-9) + 1e-6
    assert makespan(costs, shards) <= sum(costs) / workers + max(costs, default=0.0) * (1 + 1e-9) + 1e-6


@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("count,workers", [(0, 3), (2, 5), (10, 3), (128, 32), (7, 7)])
def test_even_split_has_equal_counts(count, workers, strided):
    shards = even_split(count, workers, strided=strided)
    assert len(shards) == workers
    assert sorted(i for s in shards for i in s) == list(range(count))
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1
    if not strided:  # contiguous runs in order
        assert [i for s in shards for i in s] == list(range(count))
    else:
        assert all(all(i % workers == w for i in s) for w, s in enumerate(shards))


def test_lpt_beats_the_even_split_when_costs_fall_along_the_graph():
    # cone costs fall from the first layer to the last: an even split gives one worker the heavy head
    costs = [100.0 / (i + 1) for i in range(32)]
    even = makespan(costs, even_split(len(costs), 4))
    balanced = makespan(costs, lpt(costs, 4))
    ideal = sum(costs) / 4
    assert balanced < even
    assert balanced <= max(max(costs), ideal) * 4 / 3


CONV_RELU = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,4,8,8] x) => (float[1,4,8,8] y) {
    a = Conv <pads=[1,1,1,1]> (x, w)
    y = Relu (a)
}
"""


def test_step_work_counts_gemm_flops_elements_quantized_values_and_calls():
    ir = qir.import_onnx(model_from_text(CONV_RELU, {"w": (4, 4, 3, 3)}))
    PassManager("insert-calibration{march=nash-e}").run(ir)
    plan = build_plan(ir)
    # steps: x_calib, Conv, a_calib, Relu; every value is 1x4x8x8 = 256 elements
    assert [s.name for s in plan.steps] == ["x_calib", "Conv_0", "a_calib", "Relu_0"]
    conv = 2 * 256 * 4 * 3 * 3  # multiply and add per output element and input tap
    expected = [QUANTIZE_WORK * 256, conv, QUANTIZE_WORK * 256, ELEMENT_WORK * 256]
    assert step_work(ir, plan).tolist() == [CALL_WORK + e for e in expected]


def test_step_costs_prefer_measured_times():
    work = np.array([0.0, 10.0, 30.0])
    assert step_costs(work).tolist() == [0.0, 10.0, 30.0]
    assert step_costs(work, np.array([0.5, 0.1, 0.2])).tolist() == [0.5, 0.1, 0.2]
    assert step_costs(work, np.array([0.5, 0.1])).tolist() == [0.0, 10.0, 30.0]  # not every step measured
    assert step_costs(work, np.array([0.5, np.nan, 0.2])).tolist() == [0.0, 10.0, 30.0]


def test_variant_cost_is_its_cone_share_of_the_flops(digits_calibrated):
    ir = digits_calibrated
    plan = build_plan(ir)
    flops = step_flops(ir, plan)
    changed = [[c.name] for c in ir.calibrations()] + [[c.name for c in ir.calibrations("activation")[-2:]]]
    got = variant_costs(plan, flops, changed)
    expected = [cone_fraction(plan, flops, names) * flops.sum() for names in changed]
    assert got.tolist() == pytest.approx(expected, rel=1e-12)
    first = ir.calibrations("activation")[0].name  # the input's quantizer: its cone is the whole model
    assert variant_costs(plan, flops, [[first]])[0] == pytest.approx(flops.sum())
    assert variant_costs(plan, flops, changed, whole=True).tolist() == [flops.sum()] * len(changed)
