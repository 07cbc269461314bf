"""March profiles: lookup, dtype rules, fp16 availability, rounding, provenance and their text."""
from __future__ import annotations

import dataclasses
import json
import pickle

import numpy as np
import pytest

from qir.errors import QirError
from qir.kinds import CalibMode
from qir.runtimes import march as P
from qir.runtimes.march import (
    GENERIC,
    NASH_E,
    NASH_M,
    NASH_P,
    PARAM_FIELDS,
    PROFILES,
    OpClass,
    Status,
    UnknownProfileError,
    format_profiles,
    get_profile,
    op_class,
)
from qir.runtimes.march.ort import ORT
from qir.runtimes.numpy_ref.registry import registered_op_types

NASH = (NASH_E, NASH_M, NASH_P)
#: one op type per class, for per-class checks
REPRESENTATIVE = {OpClass.GEMM: "Conv", OpClass.ELEMENTWISE: "Add", OpClass.LUT: "Sigmoid",
                  OpClass.POOL_RESIZE: "Resize", OpClass.SHAPE: "Transpose",
                  OpClass.REDUCE: "ReduceMean", OpClass.NORM: "BatchNormalization"}


# ---------------------------------------------------------------------------- lookup

@pytest.mark.parametrize("name, canonical", [
    ("nash-e", "nash-e"), ("NASH-E", "nash-e"), ("nash_e", "nash-e"), (" J6E ", "nash-e"),
    ("j6e", "nash-e"), ("S100", "nash-e"), ("s100", "nash-e"),
    ("nash-m", "nash-m"), ("J6M", "nash-m"), ("s100p", "nash-m"),
    ("nash-p", "nash-p"), ("J6P", "nash-p"), ("nash-h", "nash-p"), ("j6h", "nash-p"),
    ("generic", "generic"), ("GENERIC", "generic"),
])
def test_names_and_aliases_resolve_case_insensitively(name, canonical):
    assert get_profile(name).name == canonical


def test_get_profile_passes_a_profile_through():
    custom = NASH_E.with_overrides(quant_round="half_up")
    assert get_profile(custom) is custom


def test_unknown_profile_names_suggestions_and_the_known_profiles():
    with pytest.raises(UnknownProfileError) as err:
        get_profile("nash-x")
    msg = str(err.value)
    assert isinstance(err.value, ValueError) and isinstance(err.value, QirError)
    assert "'nash-x'" in msg and "did you mean" in msg and "'nash-e'" in msg
    for name in PROFILES:
        assert name in msg
    with pytest.raises(ValueError, match=r"did you mean 'J6[EMP]'"):
        get_profile("J6Q")  # suggestions keep the alias spelling
    with pytest.raises(ValueError) as err:
        get_profile("xyzzy")
    assert "did you mean" not in str(err.value) and "nash-p" in str(err.value)


# ---------------------------------------------------------------------------- dtype rules

def test_nash_p_has_native_fp16_on_every_non_gemm_class_and_nash_e_m_only_limited():
    for cls, op in REPRESENTATIVE.items():
        expected_p = "limited" if cls is OpClass.GEMM else "native"
        assert NASH_P.fp16_support(op) == expected_p, (cls, op)
        assert ("fp16" in NASH_P.allowed_act_dtypes(op)) == (cls is not OpClass.GEMM)
        for prof in (NASH_E, NASH_M):
            assert prof.fp16_support(op) == "limited", (prof.name, op)
            assert "fp16" not in prof.allowed_act_dtypes(op)
        assert GENERIC.fp16_support(op) == "native"
    assert NASH_P.fp16_ops == "full" and NASH_E.fp16_ops == NASH_M.fp16_ops == "limited"
    assert NASH_E.with_overrides(fp16_ops="none").fp16_support("Add") == "none"


def test_dual_int16_gemm_is_allowed_and_marked_assumed_only_on_nash_e():
    pair = ("int16", "int16")
    for prof in NASH + (GENERIC,):
        assert prof.allows_gemm("int16", "int16")
        assert prof.allows_gemm("int8", "int8") and prof.allows_gemm("int16", "int8")
    assert NASH_E.status_of("gemm_dtype_pairs", pair) is Status.ASSUMED
    assert NASH_M.status_of("gemm_dtype_pairs", pair) is Status.DOCUMENTED
    assert NASH_P.status_of("gemm_dtype_pairs", pair) is Status.DOCUMENTED
    assert NASH_E.status_of("gemm_dtype_pairs", ("int16", "int8")) is Status.DOCUMENTED
    assert NASH_E.provenance["gemm_dtype_pairs"].assumed
    assert not NASH_M.provenance["gemm_dtype_pairs"].assumed
    # int8 activation x int16 weight is undocumented: refused on nash, fine on generic
    for prof in NASH:
        assert not prof.allows_gemm("int8", "int16")
        assert not prof.allows_gemm("fp16", "int8")
    assert GENERIC.allows_gemm("int8", "int16")


def test_dtype_spellings_are_normalized():
    assert NASH_E.allows_gemm(CalibMode.INT16, "qint8")
    assert NASH_E.allows_gemm("torch.qint16", "INT16")
    assert NASH_P.allows_matmul("int8", np.dtype("int16"))
    assert P.normalize_dtype("float16") == "fp16" and P.normalize_dtype("float32") == "float"
    with pytest.raises(ValueError, match="unknown dtype"):
        NASH_E.allows_gemm("int7", "int8")


def test_int8_only_inputs_restrict_the_data_input_only():
    assert NASH_E.allowed_act_dtypes("MaxPool") == ("int8",)
    assert NASH_E.allowed_act_dtypes("GridSample", input_index=0) == ("int8",)
    assert NASH_E.allowed_act_dtypes("GridSample", input_index=1) == ("int8", "int16")
    assert NASH_P.allowed_act_dtypes("Resize") == ("int8", "fp16")
    assert NASH_E.allowed_act_dtypes("Conv") == ("int8", "int16")
    assert NASH_E.allowed_act_dtypes("Sigmoid") == ("int8", "int16")
    assert GENERIC.allowed_act_dtypes("MaxPool") == ("int8", "int16", "fp16")


def test_default_activation_dtypes_follow_the_documented_routes():
    assert NASH_E.default_act_dtype_for("Add") == "int8"
    assert NASH_P.default_act_dtype_for("Add") == "fp16"
    assert NASH_P.default_act_dtype_for("MatMul") == "int8"
    assert NASH_P.default_weight_dtype == "int8"


def test_fusions_are_op_type_tuples_longest_first_with_their_status():
    fus = NASH_E.fusions
    assert ("Conv", "Relu") in fus and ("Conv", "Add") in fus and ("Conv", "Clip") in fus
    assert fus.index(("Conv", "Add", "Relu")) < fus.index(("Conv", "Add"))
    assert NASH_E.status_of("fusions", ("Conv", "Add")) is Status.DOCUMENTED
    assert NASH_E.status_of("fusions", ("Conv", "Add", "Relu")) is Status.ASSUMED


def test_nash_m_and_p_are_nash_e_plus_their_documented_differences():
    def diff(a, b):
        return {f for f in PARAM_FIELDS if getattr(a, f) != getattr(b, f)}

    assert diff(NASH_E, NASH_M) == {"name", "aliases", "peak_tops"}  # J6M's public int8 peak
    assert NASH_M.provenance["gemm_dtype_pairs"] != NASH_E.provenance["gemm_dtype_pairs"]
    assert diff(NASH_E, NASH_P) == {
        "name", "aliases", "act_dtypes", "default_non_gemm_act_dtype", "gemm_float_output",
        "elementwise_dtypes", "fp16_ops", "fp16_documented_ops", "dynamic_quant_linear", "tune_ladder", "tune_costs",
        "peak_tops", "memory_gbps"}
    assert NASH_P.gemm_float_output and not NASH_E.gemm_float_output


# ---------------------------------------------------------------------------- rounding

TIES = np.array([-2.5, -0.5, 0.5, 1.5, 2.5])


@pytest.mark.parametrize("mode, expected", [
    ("half_to_even", [-2.0, -0.0, 0.0, 2.0, 2.0]),
    ("half_up", [-2.0, 0.0, 1.0, 2.0, 3.0]),
    ("half_away", [-3.0, -1.0, 1.0, 2.0, 3.0]),
])
def test_rounding_functions_on_ties(mode, expected):
    fn = NASH_E.with_overrides(quant_round=mode).round_fn()
    np.testing.assert_array_equal(fn(TIES), expected)
    np.testing.assert_array_equal(fn(np.array([-1.4, 1.6])), [-1.0, 2.0])  # non-ties agree


def test_profiles_default_to_half_to_even_and_reject_unknown_modes():
    for prof in PROFILES.values():
        assert prof.quant_round == "half_to_even" and prof.round_fn() is np.rint
    with pytest.raises(ValueError, match="quant_round"):
        NASH_E.with_overrides(quant_round="stochastic")
    with pytest.raises(ValueError, match="did you mean 'quant_round'"):
        NASH_E.with_overrides(quant_rnd="half_up")


def test_scale_divisor_conventions():
    assert NASH_E.scale_divisor_for("int8") == 127.0
    assert NASH_E.scale_divisor_for("int16") == 32767.0
    assert NASH_E.with_overrides(scale_divisor="half_range").scale_divisor_for("int8") == 127.5
    assert NASH_E.with_overrides(scale_divisor="neg_qmin").scale_divisor_for("int16") == 32768.0


# ---------------------------------------------------------------------------- provenance

def test_every_field_of_every_profile_has_provenance():
    declared = {f.name for f in dataclasses.fields(P.MarchProfile)} - {"provenance"}
    assert set(PARAM_FIELDS) == declared
    for prof in PROFILES.values():
        assert set(prof.provenance) == declared, prof.name
        for f, prov in prof.provenance.items():
            assert isinstance(prov, P.Provenance) and prov.status in set(Status), (prof.name, f)


def test_a_profile_without_provenance_for_a_field_cannot_be_built():
    prov = dict(NASH_E.provenance)
    del prov["acc_bits"]
    with pytest.raises(ValueError, match="acc_bits"):
        dataclasses.replace(NASH_E, provenance=prov)
    # per-item provenance must name items that exist
    prov = dict(NASH_E.provenance)
    prov["gemm_dtype_pairs"] = P.Provenance(Status.DOCUMENTED, "", {("int4", "int8"): "assumed"})
    with pytest.raises(ValueError, match="gemm_dtype_pairs"):
        dataclasses.replace(NASH_E, provenance=prov)


def test_nash_assumptions_include_the_known_unknowns():
    for prof in NASH:
        assumed = set(prof.assumed_fields())
        assert {"requant_shift_round", "acc_overflow", "scale_divisor", "quant_round",
                "lut_int16", "requant_mode"} <= assumed, prof.name
        assert "int_dtypes" not in assumed and "fp16_ops" not in assumed
    assert NASH_E.status_of("lut_int16", "interp") is Status.ASSUMED
    assert NASH_E.status_of("lut_int16", "table_segments") is Status.SOURCE
    assert NASH_E.status_of("saturate") is Status.ASSUMED
    assert NASH_P.status_of("saturate") is Status.DOCUMENTED


def _blocks(text):
    blocks = {}
    for block in text.split("\n\n"):
        head = block.splitlines()[0]
        name = head.split()[0]
        if name in PROFILES:
            blocks[name] = block.splitlines()[1:]
    return blocks


def _field_line(lines, name):
    hits = [ln for ln in lines if ln.startswith(f"  {name} ")]
    assert len(hits) == 1, (name, hits)
    return hits[0]


def test_format_profiles_marks_every_assumed_field_and_only_those():
    text = format_profiles()
    assert "[documented]" in text and "[source]" in text and "Legend" in text
    blocks = _blocks(text)
    assert set(blocks) == set(PROFILES)
    for prof in PROFILES.values():
        lines = blocks[prof.name]
        for f in PARAM_FIELDS:
            line = _field_line(lines, f)
            assert ("ASSUMED" in line) == prof.provenance[f].assumed, (prof.name, line)
    nash_e = blocks["nash-e"]
    i = nash_e.index(_field_line(nash_e, "gemm_dtype_pairs"))
    assert nash_e[i + 1].split() == ["int16", "x", "int16", "[ASSUMED]"]
    m = blocks["nash-m"]
    assert "ASSUMED" not in _field_line(m, "gemm_dtype_pairs")


def test_format_profiles_selected_names_notes_and_overrides():
    text = format_profiles(["J6E"], notes=True)
    assert "nash-e" in text and "\nnash-p" not in text
    assert "bpu_segment_lut is closed" in text  # the note behind an assumed item
    custom = NASH_E.with_overrides(acc_overflow="saturate")
    line = _field_line(_blocks(format_profiles([custom]))["nash-e"], "acc_overflow")
    assert "saturate" in line and "[override]" in line
    assert custom.status_of("acc_overflow") is Status.OVERRIDE
    with pytest.raises(UnknownProfileError):
        format_profiles(["nash-z"])


def test_profiles_are_hashable_picklable_and_dump_to_json():
    for prof in PROFILES.values():
        hash(prof)
        assert pickle.loads(pickle.dumps(prof)) == prof
        d = P.profile_to_dict(prof)
        json.dumps(d)
        assert set(d["params"]) == set(PARAM_FIELDS)
    items = P.profile_to_dict("nash-e")["params"]["gemm_dtype_pairs"]["items"]
    assert {"item": "int16 x int16", "status": "assumed"}.items() <= items[0].items()


# ---------------------------------------------------------------------------- op classes

def test_every_numpy_kernel_op_type_has_an_op_class():
    ops = registered_op_types()
    assert len(ops) > 50
    unknown = [op for op in ops if not P.is_known_op(op)]
    assert not unknown, f"op types with a numpy kernel but no op class: {unknown}"
    for op in ops:
        assert isinstance(op_class(op), OpClass)
        for prof in PROFILES.values():
            prof.allowed_act_dtypes(op)
            assert prof.fp16_support(op) in ("native", "limited", "none")


@pytest.mark.parametrize("op, cls", [
    ("Conv", "gemm"), ("ConvTranspose", "gemm"), ("MatMul", "gemm"), ("Gemm", "gemm"),
    ("Add", "elementwise"), ("Div", "elementwise"), ("Clip", "elementwise"),
    ("PRelu", "elementwise"), ("Where", "elementwise"), ("Mean", "elementwise"),
    ("Sigmoid", "lut"), ("Gelu", "lut"), ("HardSwish", "lut"), ("Softmax", "lut"),
    ("Pow", "lut"), ("Cos", "lut"), ("LayerNormalization", "lut"),
    ("MaxPool", "pool_resize"), ("GlobalAveragePool", "pool_resize"), ("Resize", "pool_resize"),
    ("GridSample", "pool_resize"), ("RoiAlign", "pool_resize"),
    ("Reshape", "shape"), ("Concat", "shape"), ("Gather", "shape"), ("Pad", "shape"),
    ("Cast", "shape"), ("DepthToSpace", "shape"),
    ("ReduceMean", "reduce"), ("ArgMax", "reduce"), ("TopK", "reduce"),
    ("BatchNormalization", "norm"), ("InstanceNormalization", "norm"),
])
def test_op_classes_follow_the_reference(op, cls):
    assert op_class(op) == OpClass(cls)


def test_unknown_op_types_get_the_default_class_and_a_flag(caplog):
    with caplog.at_level("WARNING", logger=P.__name__):
        c = P.classify("HzMysteryOp")
        P.classify("HzMysteryOp")
    assert c.op_class is P.UNKNOWN_OP_CLASS and not c.known
    assert [r.getMessage() for r in caplog.records].count(
        "op type 'HzMysteryOp' has no op class; treating it as 'elementwise'") == 1
    assert op_class("HzMysteryOp") is P.UNKNOWN_OP_CLASS
    assert NASH_E.allowed_act_dtypes("HzMysteryOp") == ("int8", "int16")
    assert P.classify("Conv").known


def test_the_assumed_parameters_are_pinned():
    """Changing what is assumed must be a deliberate edit of this list (and of the reference)."""
    nash_common = {"aliases", "act_dtypes", "matmul_act_act_pairs", "fp16_compute",
                   "fp16_saturate", "fusions", "quant_round", "scale_divisor", "requant_mode",
                   "requant_multiplier_bits", "requant_shift_round", "intermediate_sat16",
                   "acc_bits", "acc_overflow", "bias_round", "lut_mode", "lut_int16", "softmax_mode",
                   "integer_ops", "tune_costs", "peak_tops", "memory_gbps", "op_overhead_us", "free_ops",
                   "composites"}
    assert set(NASH_E.assumed_fields()) == nash_common | {"gemm_dtype_pairs", "saturate", "tune_ladder"}
    assert set(NASH_M.assumed_fields()) == nash_common | {"saturate"}
    assert set(NASH_P.assumed_fields()) == (nash_common - {"matmul_act_act_pairs"}) | {
        "consistency_level", "high_precision_qpp", "fuse_requant"}
    assert set(GENERIC.assumed_fields()) >= {"name", "gemm_dtype_pairs", "scale_divisor"}
    assert not {"quant_round", "saturate", "acc_bits"} & set(GENERIC.assumed_fields())
    # the ort profile is onnxruntime's documented arithmetic, but for nearest Resize on codes
    assert set(ORT.assumed_fields()) == set(GENERIC.assumed_fields()) - {
        "name", "aliases", "symmetric", "requant_mode", "high_precision_qpp", "acc_overflow", "lut_mode",
        "softmax_mode", "fusions"}


def test_the_integer_level_parameters_print_readably():
    text = format_profiles(["nash-e", "ort"])
    assert "every op with an integer kernel" in _field_line(_blocks(text)["nash-e"], "integer_ops")
    assert "QLinearSoftmax" in format_profiles(["ort"], notes=True)
    assert "Conv, MatMul" in _field_line(_blocks(text)["ort"], "integer_ops")


def test_the_tuning_pipeline_is_profile_data():
    """qir tune reads its pipeline from the profile: nash-e/m start all-int8 and go to int16, fp16 only
    beyond int16; nash-p starts GEMM inputs at int8 with every other op at fp16 (seed 002)."""
    for prof in (NASH_E, NASH_M):
        assert prof.tune_ladder["gemm"][0] == prof.tune_ladder["other"][0] == "int8"
        assert prof.tune_ladder["other"].index("fp16") > prof.tune_ladder["other"].index("int16")
    assert NASH_P.tune_ladder["other"] == ("fp16",) and NASH_P.tune_ladder["gemm"][0] == "int8"
    # dual int16 is a ladder step only where the profile allows the (int16, int16) GEMM pair
    for prof in PROFILES.values():
        assert ("int16+w16" in prof.tune_ladder["gemm"]) <= prof.allows_gemm("int16", "int16")
    assert NASH_E.status_of("tune_ladder", "gemm") is Status.ASSUMED  # its (int16, int16) pair is
    assert NASH_M.status_of("tune_ladder", "gemm") is Status.DOCUMENTED
    assert NASH_E.tune_costs["int16 x int16"] > NASH_E.tune_costs["int16 x int8"] > NASH_E.tune_costs["int8 x int8"]
    with pytest.raises(ValueError, match="tune_ladder"):
        NASH_E.with_overrides(tune_ladder={"gemm": ("int8", "int4"), "other": ("int8",)})
    with pytest.raises(ValueError, match="tune_costs has no cost"):
        NASH_E.with_overrides(tune_costs={"int8": 1})
    line = _field_line(_blocks(format_profiles(["nash-p"]))["nash-p"], "tune_costs")
    assert "[ASSUMED]" in line


def test_the_latency_model_parameters_print_with_their_provenance():
    """``qir profiles`` shows the latency model's parameters; only the int8 peak of a nash march is public."""
    text = format_profiles(["nash-e", "nash-p"])
    blocks = _blocks(text)
    for name in ("nash-e", "nash-p"):
        lines = blocks[name]
        assert "[ASSUMED, partly documented]" in _field_line(lines, "peak_tops")
        i = lines.index(_field_line(lines, "peak_tops"))
        assert lines[i + 1].split()[:4] == ["int8", "x", "int8", str(PROFILES[name].peak_tops["int8 x int8"])]
        assert lines[i + 1].split()[-1] == "[documented]" and lines[i + 2].split()[-1] == "[ASSUMED]"
        assert "[ASSUMED]" in _field_line(lines, "memory_gbps") and "[ASSUMED]" in _field_line(lines, "op_overhead_us")
    assert NASH_P.peak_tops["int8 x int8"] > NASH_M.peak_tops["int8 x int8"] > NASH_E.peak_tops["int8 x int8"]
    fast = NASH_E.with_overrides(memory_gbps=400)
    assert "[override]" in _field_line(_blocks(format_profiles([fast]))["nash-e"], "memory_gbps")
