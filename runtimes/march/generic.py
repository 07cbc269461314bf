"""The ``generic`` profile: plain int8/int16/fp16 everywhere with ONNX arithmetic and no march
restrictions (its documented values cite the ONNX spec)."""
from __future__ import annotations

from qir.runtimes.march.op_classes import OpClass
from qir.runtimes.march.profile import I8_I16, A, D, LutInt8, LutInt16, S, make_profile
from qir.runtimes.march.rates import VIEW_OPS

__all__ = ["GENERIC"]

_G_ALL = ("int8", "int16", "fp16")
_ONNX = "ONNX QuantizeLinear / ConvInteger spec"
GENERIC = make_profile(
    name=S("generic", A, "plain int8/int16/fp16 everywhere, ONNX rounding; no march restrictions"),
    aliases=S((), A, ""),
    int_dtypes=S(I8_I16, D, "ONNX QuantizeLinear int8/int16 (opset 21)"),
    symmetric=S(True, A, "qir's calibration nodes are symmetric (zero point 0)"),
    act_granularity=S("per_tensor", A, "qir default"),
    weight_granularity=S("per_channel", A, "qir default (per output channel)"),
    default_act_dtype=S("int8", A, "qir default"),
    default_non_gemm_act_dtype=S("int8", A, "qir default"),
    default_weight_dtype=S("int8", A, "qir default"),
    act_dtypes=S({c: _G_ALL for c in OpClass}, A, "no restriction"),
    gemm_dtype_pairs=S((("int8", "int8"), ("int16", "int8"), ("int8", "int16"), ("int16", "int16"),
                        ("fp16", "fp16")), A, "no restriction"),
    matmul_act_act_pairs=S((("int8", "int8"), ("int16", "int8"), ("int8", "int16"),
                            ("int16", "int16"), ("fp16", "fp16")), A, "no restriction"),
    gemm_output=S(("int8", "int16", "int32", "fp16", "float"), A, "no restriction"),
    gemm_float_output=S(True, A, "no restriction"),
    elementwise_dtypes=S(("int8", "int16", "int32", "fp16", "float"), A, "no restriction"),
    int8_only_inputs=S((), A, "no restriction"),
    int8_only_outputs=S((), A, "no restriction"),
    int8_only_fusions=S((), A, "no restriction"),
    fp16_ops=S("full", A, "no restriction"),
    fp16_documented_ops=S((), A, "not needed with fp16_ops = full"),
    fp16_compute=S("fp32", A, "cast inputs to fp16, compute in fp32, round the result to fp16"),
    fp16_saturate=S(False, D, "IEEE binary16: overflow to +-inf"),
    fusions=S((("Conv", "Relu"), ("Conv", "Clip"), ("ConvTranspose", "Relu"),
               ("Gemm", "Relu"), ("Gemm", "Clip"), ("MatMul", "Relu")), A,
              "activations folded into the quantized range, as onnxruntime's quantizer does"),
    composites=S((), A, "every op of a spelled-out LayerNorm or GELU quantized on its own, as the graph has it"),
    quant_round=S("half_to_even", D, _ONNX),
    scale_divisor=S("qmax", A, "T/127, T/32767 (hmct convention)"),
    consistency_level=S(0, A, "no power-of-two scales"),
    requant_mode=S("float", A, "float32 requant, half-to-even"),
    requant_multiplier_bits=S(16, A, "only used with requant_mode fixed16"),
    requant_shift_round=S("half_up", A, "only used with fixed-point requant"),
    high_precision_qpp=S(True, A, "float requant"),
    fuse_requant=S(False, A, "no requant fusion"),
    intermediate_sat16=S(False, A, "no intermediate saturation"),
    acc_bits=S(32, D, _ONNX + ": int32 accumulation"),
    acc_overflow=S("warn", A, "qir accumulates exactly and warns past acc_bits"),
    bias_dtype=S("int32", D, _ONNX),
    bias_round=S("half_to_even", D, _ONNX),
    saturate=S(True, D, _ONNX + ": saturate to the target range"),
    lut_mode=S("float", A, "evaluate f exactly, then quantize"),
    lut_int8=S(LutInt8(), A, "only used with lut_mode = segment"),
    lut_int16=S(LutInt16(), A, "only used with lut_mode = segment"),
    dynamic_quant_linear=S(False, A, "static quantization"),
    softmax_mode=S("float", A, "dequantize, compute, requantize"),
    integer_ops=S(None, A, "every op qir has an integer kernel for"),
    tune_ladder=S({"gemm": ("int8", "int16", "int16+w16"), "other": ("int8", "int16", "fp16")}, A,
                  "int8 first, then int16, dual int16 for GEMMs, fp16 for other ops"),
    tune_costs=S({"int8": 1, "int16": 2, "fp16": 2, "float": 4, "int8 x int8": 1, "int16 x int8": 2,
                  "int16 x int16": 4, "float x float": 4}, A, "cost per FLOP relative to int8: data size"),
    peak_tops=S({"int8 x int8": 10, "int16 x int8": 5, "int16 x int16": 2.5, "fp16": 5, "float": 2.5}, A,
                "a small NPU: 10 TOPS int8, rates halving with each doubled operand (our guess)"),
    memory_gbps=S(25.6, A, "a 32-bit LPDDR5-6400 interface, our guess"),
    op_overhead_us=S(1.0, A, "time to launch one op, our guess"),
    free_ops=S(VIEW_OPS, A, "reshape-like ops are views: no data moves (our assumption)"),
)
