"""The latency model on hand-computed cases: a compute-bound Conv, a memory-bound Add (int16 moves
twice the bytes of int8), a fused Conv+Add+Relu whose inner tensors never cross memory, a
calibrated model's own precisions, and measured times from a latency table."""
from __future__ import annotations

import pytest

import qir
from qir.errors import InputError
from qir.passes.lib.latency import UNIFORM, Bound, LatencyModel, Precision, estimate_time
from qir.passes.lib.latency_groups import precisions_of
from qir.passes.lib.latency_table import read_latency_table
from qir.runtimes.march import NASH_E, Status

from ...conftest import model_from_text

# 1 TOPS at int8 x int8 (1e6 FLOPs per µs), 100 GB/s (1e5 bytes per µs), 1 µs per group
PROFILE = NASH_E.with_overrides(
    peak_tops={"int8 x int8": 1, "int16 x int8": 0.5, "int16 x int16": 0.25, "fp16": 0.125, "float": 0.0625},
    memory_gbps=100, op_overhead_us=1)

CONV = """<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 16, 8, 8] x) => (float[1, 32, 8, 8] y) {
    y = Conv <pads = [1, 1, 1, 1]> (x, w, b)
}"""
ADD = """<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 32, 8, 8] a, float[1, 32, 8, 8] b) => (float[1, 32, 8, 8] y) {
    y = Add(a, b)
}"""
FUSED = """<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 16, 8, 8] x, float[1, 32, 8, 8] s) => (float[1, 32, 8, 8] y) {
    c = Conv <pads = [1, 1, 1, 1]> (x, w)
    t = Add(c, s)
    y = Relu(t)
}"""


def _load(text, weights=None):
    return qir.load(model_from_text(text, weights or {}))


def test_the_profiles_carry_the_latency_parameters_with_provenance():
    assert NASH_E.status_of("peak_tops", "int8 x int8") is Status.DOCUMENTED
    assert NASH_E.status_of("peak_tops", "int16 x int8") is Status.ASSUMED
    assert NASH_E.peak_ops_per_s("int16", "int8") == NASH_E.peak_tops["int16 x int8"] * 1e12
    assert NASH_E.peak_ops_per_s("int8", "int16") == NASH_E.peak_tops["int16 x int8"] * 1e12  # wider first
    assert PROFILE.status_of("memory_gbps") is Status.OVERRIDE
    with pytest.raises(ValueError, match="peak_tops needs exactly the keys"):
        NASH_E.with_overrides(peak_tops={"int8 x int8": 1})
    with pytest.raises(ValueError, match="memory_gbps must be positive"):
        NASH_E.with_overrides(memory_gbps=0)


def test_a_wide_conv_is_compute_bound():
    cost = estimate_time(_load(CONV, {"w": (32, 16, 3, 3), "b": (32,)}), PROFILE, "int8").groups[0]
    flops = 2 * (32 * 8 * 8) * (16 * 3 * 3)                  # 589 824
    nbytes = 16 * 64 + 32 * 64 + 32 * 16 * 9 + 32 * 4           # x + y + w (int8) + bias (int32) = 7 808
    assert (cost.flops, cost.bytes) == (flops, nbytes)
    assert cost.compute_us == pytest.approx(flops / 1e6)
    assert cost.memory_us == pytest.approx(nbytes / 1e5)
    assert cost.bound is Bound.COMPUTE
    assert cost.time_us == pytest.approx(flops / 1e6 + 1)
    int16 = estimate_time(_load(CONV, {"w": (32, 16, 3, 3), "b": (32,)}), PROFILE, "int16").groups[0]
    assert int16.compute_us == pytest.approx(2 * flops / 1e6)   # int16 x int8 at half the rate
    assert int16.bytes == 2 * (16 * 64 + 32 * 64) + 32 * 16 * 9 + 32 * 4


def test_an_add_is_memory_bound_and_costs_twice_as_much_at_int16():
    ir = _load(ADD)
    model = LatencyModel(ir, PROFILE)
    int8, int16 = model.estimate("int8").groups[0], model.estimate("int16").groups[0]
    assert int8.bytes == 3 * 2048 and int16.bytes == 2 * 3 * 2048
    assert int8.bound is int16.bound is Bound.MEMORY
    assert int8.time_us == pytest.approx(3 * 2048 / 1e5 + 1)
    assert (int16.time_us - 1) == pytest.approx(2 * (int8.time_us - 1))
    no_overhead = LatencyModel(ir, PROFILE.with_overrides(op_overhead_us=0))
    assert no_overhead.estimate("int16").total_us == pytest.approx(2 * no_overhead.estimate("int8").total_us)


def test_a_fused_conv_add_relu_moves_only_what_enters_and_leaves_it():
    ir = _load(FUSED, {"w": (32, 16, 3, 3)})
    model = LatencyModel(ir, PROFILE)
    [group] = model.estimate("int8").groups
    assert group.group.op_type == "Conv+Add+Relu" and len(group.group.ops) == 3
    assert group.bytes == 16 * 64 + 32 * 64 + 32 * 64 + 32 * 16 * 9  # x, s, y, w: not c or t
    assert group.time_us == pytest.approx(max(group.flops / 1e6, group.bytes / 1e5) + 1)  # one overhead
    # without the fusion the Conv's and the Add's outputs cross memory twice each
    unfused = LatencyModel(ir, PROFILE.with_overrides(fusions=()))
    apart = unfused.estimate("int8")
    assert len(apart.groups) == 3
    assert apart.bytes == group.bytes + 2 * (2 * 32 * 64)
    assert apart.total_us > model.estimate("int8").total_us + 2


AFFINE = """<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 16, 8, 8] x) => (float[1, 32, 8, 8] y) {
    c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
    m = Mul(c, s)
    a = Add(m, t)
    y = Relu(a)
}"""


def test_a_per_channel_mul_and_add_after_a_conv_are_priced_as_folded_unless_a_quantizer_sits_between():
    """A compiler folds a learnable affine block (Conv, then Mul and Add by constants) into the
    Conv: in a model that leaves it unfolded and unquantized it moves no bytes of its own and
    launches nothing; where a quantizer sits between, the model asked for that value and pays."""
    weights = {"w": (32, 16, 3, 3), "b": (32,), "s": (1,), "t": (1, 32, 1, 1)}
    ir = _load(AFFINE, weights)
    groups = LatencyModel(ir, PROFILE).estimate("int8").groups
    assert [g.group.op_type for g in groups] == ["Conv+Mul+Add", "Relu"]
    assert groups[0].bytes == 16 * 64 + 32 * 64 + 32 * 16 * 9 + 32 * 4 + 1 + 32  # x, a, w, bias, s, t: not c or m
    calibrated = _load(AFFINE, weights)
    qir.passes.get_pass("insert-calibration", march="nash-e")(calibrated)
    apart = LatencyModel(calibrated, PROFILE).estimate("int8")
    assert [g.group.op_type for g in apart.groups] == ["Conv", "Mul", "Add", "Relu"]
    assert apart.total_us > LatencyModel(ir, PROFILE).estimate("int8").total_us + 2


def test_a_calibrated_model_is_priced_at_its_own_precisions(digits_calibrated):
    ir = digits_calibrated.clone()
    own = precisions_of(ir)
    assert own["conv1"] == Precision("int8", "int8", "int8")
    assert own["flatten"].input == "int8"  # straight from the pool, whose output is int8
    model = LatencyModel(ir, NASH_E)
    assert model.estimate().total_us == pytest.approx(model.estimate("int8").total_us)
    raised = model.estimate({"conv2": Precision("int16", "int8", "int16")})
    assert raised.total_us > model.estimate().total_us
    ir.set_calibration("relu1_out_calib", mode="int16")  # conv2's input
    assert precisions_of(ir)["conv2"].input == "int16"
    assert LatencyModel(ir, NASH_E).estimate().groups[1].bytes > model.estimate().groups[1].bytes


def test_a_view_op_is_free_and_a_float_op_runs_at_the_float_rate():
    ir = _load("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 32, 8, 8] a) => (float[1, 2048] y) { y = Flatten(a) }""")
    [cost] = estimate_time(ir, PROFILE, "int8").groups
    assert (cost.bound, cost.time_us, cost.bytes) == (Bound.FREE, 0.0, 0)
    add = estimate_time(_load(ADD), PROFILE).groups[0]  # a float model: its own precision is float
    assert add.precision == Precision("float", None, "float") and add.bound is Bound.MEMORY
    assert estimate_time(_load(ADD), PROFILE, UNIFORM["fp16"]).groups[0].bytes == 2 * 3 * 2048
    assert add.bytes == 4 * 3 * 2048


def _table(tmp_path, text):
    path = tmp_path / "lat.csv"
    path.write_text(text)
    return read_latency_table(path)


def test_measured_times_override_the_model_for_the_ops_they_list(tmp_path):
    table = _table(tmp_path, "op,input,weight,time_us\n# board A\n\nConv+Add+Relu,int8,int8,5.5\nAdd,int16,-,9\n")
    fused = LatencyModel(_load(FUSED, {"w": (32, 16, 3, 3)}), PROFILE, table=table)
    [g] = fused.estimate("int8").groups
    assert (g.time_us, g.bound, g.measured.line) == (5.5, Bound.MEASURED, 4)
    assert fused.estimate("int16").groups[0].measured is None  # no int16 row: the model's estimate
    add = LatencyModel(_load(ADD), PROFILE, table=table)
    assert add.estimate("int16").groups[0].time_us == 9.0
    assert add.estimate("int8").groups[0].bound is Bound.MEMORY
    by_name = _table(tmp_path, "Add,int16,none,9\nAdd_0,*,*,0.25\n")  # an op name (any member), any precision
    assert LatencyModel(_load(FUSED, {"w": (32, 16, 3, 3)}), PROFILE, table=by_name).estimate("int16").total_us == 0.25
    ms = _table(tmp_path, "op,input,weight,time_ms\nAdd,int8,,2\n")
    assert ms.entries[0].time_us == 2000.0


@pytest.mark.parametrize("text, message", [
    ("Conv,int8,int8\n", r"line 1: expected 4 fields .* found 3"),
    ("op,input,weight,time_us\nConv,int4,int8,1\n", r"line 2: input precision 'int4' is not one of"),
    ("Conv,int8,int9,1\n", r"line 1: weight precision 'int9'"),
    ("Conv,int8,int8,fast\n", r"line 1: time 'fast' is not a number"),
    ("Conv,int8,int8,-1\n", r"line 1: time '-1' must be"),
    ("Conv,int8,int8,1\nConv,int8,int8,2\n", r"line 2: Conv,int8,int8 is also on line 1; keep one"),
    (",int8,int8,1\n", r"line 1: the op name or type is empty"),
    ("op,input,weight,seconds\nConv,int8,int8,1\n", r"line 1: header .* must be op,input,weight,time_us"),
    ("# nothing\n\n", r"has no rows"),
])
def test_a_malformed_latency_table_says_what_where_and_how_to_fix_it(tmp_path, text, message):
    with pytest.raises(InputError, match=message) as err:
        _table(tmp_path, text)
    assert "lat.csv" in str(err.value) and "e.g. Conv,int8,int8,12.5" in str(err.value)


def test_a_missing_latency_table_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="cannot read latency table"):
        read_latency_table(tmp_path / "none.csv")


@pytest.mark.slow
def test_raising_the_elementwise_quantizers_of_ppocr_det_is_not_cheap():
    """The issue's case: on PP-OCRv4 det the FLOP price calls int16 on every Add/Mul/Div/Clip input
    under 1%; by the latency model those ops move twice the bytes and the model slows by a third or
    more."""
    from qir.passes.tune.space import Space
    from qir.records import OpRecord

    from ...conftest import calibrated_real

    ir, _ = calibrated_real("ppocrv4_det", [1, 3, 640, 640], count=1)
    before, flop_before = LatencyModel(ir, NASH_E).estimate(), Space(ir, NASH_E).flop_cost_of_ir()
    assert before.total_us == pytest.approx(LatencyModel(ir, NASH_E).estimate("int8").total_us)
    raised = 0
    for cal in ir.calibrations("activation"):
        readers = [op for op, _ in ir.uses(cal.output) if isinstance(op, OpRecord)]
        if readers and all(op.op_type in ("Add", "Mul", "Div", "Clip") for op in readers):
            ir.set_calibration(cal.name, mode="int16")
            raised += 1
    after, flop_after = LatencyModel(ir, NASH_E).estimate(), Space(ir, NASH_E).flop_cost_of_ir()
    assert raised >= 40  # (48: the rest folded into the Convs or inside HardSwish units)
    assert flop_after / flop_before < 1.05  # (measured 1.007)
    assert after.total_us / before.total_us > 1.3  # (measured 1.39)
    assert all(g.bound is Bound.MEMORY for g in after.groups if g.group.op_type in ("Add", "Mul"))
