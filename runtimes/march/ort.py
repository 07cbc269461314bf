"""The ``ort`` profile: onnxruntime's CPU integer kernels, the integer level's proof of machinery.

A model quantized by onnxruntime's ``quantize_static`` (QDQ) runs in onnxruntime's default session
as fused integer kernels (QLinearConv, QLinearMatMul, QLinearAdd, QLinearMul, QLinearSigmoid,
QLinearConcat, QLinearGlobalAveragePool, ...); every other quantized op runs as
DequantizeLinear -> float op -> QuantizeLinear. This profile states that arithmetic, so qir's
integer level on such a model reproduces onnxruntime's integer codes. Values are documented by
onnxruntime's source (MLAS: ``MlasRequantizeOutput``, ``qladd``, ``qlmul``, the QLinear lookup
tables) and by the ops onnxruntime 1.32's QDQ fusion produced on YOLOv8n, PP-OCRv4 det and cls.

Exactness of onnxruntime itself: its u8s8 GEMM on x86 CPUs without VNNI sums pairs of products in
saturating 16-bit lanes, so the reference is only exact with weights that cannot saturate:
quantize with ``reduce_range=True`` (7-bit weights) or uint8 weights.
"""
from __future__ import annotations

from qir.runtimes.march.generic import GENERIC
from qir.runtimes.march.profile import A, D, S, derive_profile

__all__ = ["ORT"]

_MLAS = "onnxruntime MLAS source"
#: Op types onnxruntime's CPU provider runs on integer codes after its QDQ fusion: QLinear*
#: kernels and the data-movement ops it runs on uint8/int8 directly.
ORT_INTEGER_OPS = (
    "Conv", "MatMul", "Gemm", "Add", "Mul", "Sigmoid", "LeakyRelu", "AveragePool", "GlobalAveragePool",
    "Concat", "Softmax", "MaxPool", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Split", "Slice",
    "Gather", "Resize", "Identity", "DepthToSpace", "SpaceToDepth",
)

ORT = derive_profile(
    GENERIC,
    name=S("ort", D, "onnxruntime's CPU execution provider, default session (QDQ fused into QLinear* kernels)"),
    aliases=S(("onnxruntime",), D, ""),
    symmetric=S(False, D, "quantize_static: uint8 activations with zero points (int8 weights symmetric)"),
    quant_round=S("half_to_even", D, "ONNX QuantizeLinear; MLAS rounds with the float magic-number trick"),
    requant_mode=S("float", D, _MLAS + ": MlasRequantizeOutput multiplies f32(acc) by f32(s_x*s_w/s_y) "
                                       "and rounds half to even"),
    high_precision_qpp=S(True, D, "onnxruntime requantizes in float32"),
    acc_bits=S(32, D, "int32 accumulators"),
    acc_overflow=S("wrap", D, "int32 arithmetic wraps; exact for reduce_range or uint8 weights"),
    bias_round=S("half_to_even", D, "quantize_static stores an int32 bias at s_x*s_w"),
    lut_mode=S("float", D, "QLinearSigmoid/LeakyRelu build a table by evaluating f on every input code"),
    softmax_mode=S("exp_table", D, "QLinearSoftmax: a float table of exp((q - max)·s + shift), a float32 sum "
                                    "per row and y = rint(e · floor(1/s_y) / sum) + zp (contrib qlinear_softmax.cc)"),
    fusions=S((), D, "QDQ Conv+Relu is folded by the quantizer (the range clips); no Conv+Add fusion"),
    integer_ops=S(ORT_INTEGER_OPS, D, "QLinear* kernels and uint8 data-movement ops seen in the optimized "
                                      "graphs of onnxruntime 1.32; others run DQ -> float -> Q",
                  items={"Resize": (A, "nearest Resize on codes; onnxruntime keeps Q/DQ around it when "
                                       "scales differ, which the rescale at the next node reproduces")}),
    peak_tops=S({"int8 x int8": 0.5, "int16 x int8": 0.25, "int16 x int16": 0.25, "fp16": 0.1, "float": 0.25}, A,
                "a few x86/Arm CPU cores running MLAS kernels, our guess; measure yours (--latency-table)"),
    memory_gbps=S(20.0, A, "a desktop CPU's sustained DRAM bandwidth, our guess"),
    op_overhead_us=S(5.0, A, "onnxruntime's per-kernel dispatch, our guess"),
)
