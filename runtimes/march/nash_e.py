"""The ``nash-e`` march (J6E, S100): the base of the nash tables (``nash-m`` and ``nash-p`` derive
from it and list only their differences).

Every value carries its provenance (see :mod:`qir.runtimes.march.profile`); the notes cite the
public Horizon / D-Robotics material behind it (OpenExplorer and D-Robotics toolchain docs).
"""
from __future__ import annotations

from qir.runtimes.march.op_classes import OpClass
from qir.runtimes.march.profile import I8_I16, SRC, A, D, LutInt8, LutInt16, S, Status, make_profile
from qir.runtimes.march.rates import VIEW_OPS

__all__ = ["NASH_E", "DOC_SUMMARY", "TUNE_COST_NOTE", "nash_rates"]

#: The note of a value the reference marks *DOC-summary* (it counts as documented).
DOC_SUMMARY = "doc summary (Horizon page seen, URL not kept; re-verify)"

_INT8_ONLY_IN = ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool",
                 "GlobalLpPool", "Resize", "Upsample", "GridSample", "RoiAlign",
                 "DetectionPostProcess")
_INT8_ONLY_OUT = ("MaxPool", "GlobalMaxPool", "Resize", "Upsample", "GridSample", "RoiAlign")

_NASH_FUSIONS = (
    ("Conv", "Add", "Relu"), ("Conv", "Add"), ("Conv", "Relu"), ("Conv", "Clip"),
    ("ConvTranspose", "Relu"), ("Gemm", "Add"), ("Gemm", "Relu"),
)
_NASH_FUSION_ITEMS = {
    ("Conv", "Add", "Relu"): (A, "Conv+Add+ReLU: plugin fused variant not in the reference; assumed"),
    ("Conv", "Add"): (D, "int32 Add 'must be fusible into a Conv' (J6E/M torch constraints); "
                        "fused Conv+Add in the plugin canonicalizer [source]"),
    ("Conv", "Relu"): (SRC, "plugin GEMM_MODULE lists fused conv variants; ReLU clamps in the "
                            "integer domain before saturation (assumed)"),
    ("Conv", "Clip"): (A, "ReLU6-style Clip after Conv: not in the reference"),
    ("ConvTranspose", "Relu"): (A, "not in the reference"),
    ("Gemm", "Add"): (SRC, "Linear+Add fusion in the plugin canonicalizer"),
    ("Gemm", "Relu"): (SRC, "plugin GEMM_MODULE lists fused Linear variants"),
}

#: Relative cost per FLOP of each tuning level (GEMMs by their "input x weight" pair): our assumption.
_NASH_COSTS = {"int8": 1, "int16": 2, "fp16": 4, "float": 16,
               "int8 x int8": 1, "int16 x int8": 2, "int16 x int16": 4, "float x float": 32}
TUNE_COST_NOTE = ("cost per FLOP relative to int8, our assumption: an int16 value moves twice the data of an int8 "
                  "one and an int16 x int8 MAC takes two int8 MACs (int16 x int16 four); fp16 runs on a small float "
                  "unit; float is the CPU. The guide says only that cost tracks FLOPs and that int16 and fp16 cost "
                  "more than int8; only the ratios matter")



def nash_rates(int8_tops: float, march: str) -> tuple[dict[str, float], dict[str, tuple[Status, str]]]:
    """``peak_tops`` (rate key -> TOPS) and its per-item provenance for a nash march whose int8 peak is public.

    Only the int8 figure is published (a chip's headline TOPS: peak, not sustained); the other
    rates are our ratios to it, the ones ``tune_costs`` assumes: an int16 x int8 MAC takes two int8
    MACs, int16 x int16 four; fp16 runs on a small float unit (1/16 of int8), float on the CPU.
    """
    rates = {"int8 x int8": int8_tops, "int16 x int8": int8_tops / 2, "int16 x int16": int8_tops / 4,
             "fp16": int8_tops / 16, "float": 0.2}
    items = {"int8 x int8": (D, f"{march}: {int8_tops:g} TOPS int8, the chip's public headline figure (Horizon "
                                "Robotics' Journey 6 product announcement, April 2024; D-Robotics RDK S100 "
                                "product pages; address not kept, re-verify)"),
             "float": (A, "the CPU: about 0.2 TFLOPS fp32 for a few Cortex-A cores, our guess")}
    return rates, items


_RATES_NOTE = ("TOPS, operations as qir counts FLOPs (a MAC is two); int16 rates are half / a quarter of "
               "int8, fp16 a sixteenth: our assumption")
_MEMORY_NOTE = ("not published: a 64-bit LPDDR5-6400 interface (51.2 GB/s) is our guess; the model sends "
                "every tensor that leaves a fused group through this memory (no reuse in on-chip SRAM)")
_OVERHEAD_NOTE = "time to launch one op (a fused group once): not published, our guess"
_FREE_NOTE = "reshape-like ops are views: no data moves (our assumption)"
_E_RATES = nash_rates(80, "J6E")

NASH_E = make_profile(
    name=S("nash-e", D, "hmct / horizon_plugin_pytorch march name (J6E)"),
    aliases=S(("J6E", "S100"), D, "S100 OE terminology: J6E = nash-e",
              items={"S100": (A, "S100 = nash-e and S100P = nash-m is our inference from page "
                                 "titles listing 'S100/S100P' for J6E/M")}),
    int_dtypes=S(I8_I16, D, "qint8 [-128,127], qint16 [-32768,32767]; int32 for accumulators, "
                             "bias and high-precision GEMM output"),
    symmetric=S(True, D, "'BPU only supports symmetric quantization'; zero point always 0"),
    act_granularity=S("per_tensor", SRC, "hmct calibration nodes / plugin observers"),
    weight_granularity=S("per_channel", SRC, "axis 0 (Conv/Gemm), ONNX axis 1 (ConvTranspose); "
                                             "MatMul-with-constant axis is inference"),
    default_act_dtype=S("int8", D, "J6E/M default route: full int8, then int8/int16 mix"),
    default_non_gemm_act_dtype=S("int8", D, "J6E/M default route: full int8"),
    default_weight_dtype=S("int8", D, "weights int8 per channel"),
    act_dtypes=S(
        {OpClass.GEMM: I8_I16, OpClass.ELEMENTWISE: I8_I16, OpClass.LUT: I8_I16,
         OpClass.POOL_RESIZE: I8_I16, OpClass.SHAPE: I8_I16, OpClass.REDUCE: I8_I16,
         OpClass.NORM: I8_I16},
        D, "J6E/M operator constraint lists (int8/int16; fp16 not native, see fp16_ops)",
        items={
            OpClass.POOL_RESIZE: (SRC, "data input int8-only per int8_only_inputs (plugin "
                                       "canonicalizer); int16 for other inputs, e.g. the GridSample "
                                       "grid (GEMMToGridSampleGridInt16Template)"),
            OpClass.SHAPE: (A, "TRANS ops move data without arithmetic; any integer dtype passes"),
            OpClass.REDUCE: (A, "same vector unit as elementwise (inference)"),
            OpClass.NORM: (A, "BatchNorm is normally folded; standalone it is a per-channel "
                              "mul/add (inference)"),
        }),
    gemm_dtype_pairs=S(
        (("int8", "int8"), ("int16", "int8"), ("int16", "int16")),
        D, "input x weight; (int8, int16) is not documented (disallowed); int16-ec unsupported",
        items={("int16", "int16"): (A, "dual-int16 on nash-e: documented for J6M/J6P, and hmct "
                                       "documents dual-int16 without a march restriction; hbdk4 "
                                       "acceptance on nash-e unknown")}),
    matmul_act_act_pairs=S(
        (("int8", "int8"), ("int16", "int8"), ("int8", "int16"), ("int16", "int16")),
        D, "MatMul of two activations",
        items={("int16", "int8"): (A, "int8/int16 mixes documented in an LLM case (likely nash-p)"),
               ("int8", "int16"): (A, "int8/int16 mixes documented in an LLM case (likely nash-p)"),
               ("int16", "int16"): (A, "dual-int16 matmul: documented on J6P; the old plugin "
                                       "canonicalizer forced one input to int8 [source]")}),
    gemm_output=S(("int8", "int16", "int32"), D,
                  "int32 = high-precision output, only for a GEMM feeding a model output / "
                  "DeQuantStub or an Add fused into the conv",
                  items={"int32": (D, "high-precision int32 output: " + DOC_SUMMARY)}),
    gemm_float_output=S(False, D, DOC_SUMMARY + "; the per-march int32-vs-float split is inference"),
    elementwise_dtypes=S(("int8", "int16", "int32"), D,
                         "Add: int8/int16, int32 only when fusible into a Conv (J6E/M torch list); "
                         "the ONNX list also shows fp16/fp32 Add (see fp16_ops)"),
    int8_only_inputs=S(_INT8_ONLY_IN, SRC, "plugin qconfig canonicalizer (identical for nash-e/m/p; "
                                           "may be outdated): pooling, interpolate, GridSample "
                                           "input, ROIAlign, DetectionPostProcess; a warning, "
                                           "not an error"),
    int8_only_outputs=S(_INT8_ONLY_OUT, SRC, "plugin canonicalizer: max-pool, interpolate, "
                                             "grid-sample, ROIAlign (and MultiheadAttention)"),
    int8_only_fusions=S((("Conv", "Add"), ("Gemm", "Add")), SRC,
                        "plugin canonicalizer: fused Conv+Add / Linear+Add take int8 on both inputs"),
    fp16_ops=S("limited", D, "J6E/M ONNX constraints list fp16 Add/Abs; fp16 recommended only "
                             "sparingly (LayerNorm); qir emulates fp16 anywhere with a warning"),
    fp16_documented_ops=S(("Add", "Abs", "LayerNormalization"), D,
                          "fp16 forms in the J6E/M ONNX list (Add, Abs) and the deployment guide "
                          "(LayerNorm)"),
    fp16_compute=S("fp32", A, "cast inputs to fp16, compute in fp32, round the result to fp16"),
    fp16_saturate=S(False, A, "fp16 overflow goes to +-inf (IEEE); saturation to +-65504 unknown"),
    fusions=S(_NASH_FUSIONS, D, "", items=_NASH_FUSION_ITEMS),
    composites=S(("LayerNorm", "Gelu", "HardSwish", "Silu"), D,
                 "LayerNorm, Softmax and GELU run as composites of int16 lookup tables and integer ops, "
                 "not op by op (horizon-semantics 2.4; the plugin's default GEMMToLayerNormInt16Template); "
                 "that the compiler maps an ONNX graph's spelled-out LayerNorm/GELU/HardSwish/SiLU to them is assumed",
                 items={"LayerNorm": (D, "LayerNorm built from int16 lookups [doc]"),
                        "Gelu": (A, "GELU is a lookup-table op [doc]; its erf form mapped to it (assumed)"),
                        "HardSwish": (A, "HardSwish is a lookup-table op (a function of one input); its "
                                         "x*clip(x+3,0,6)/6 and x*HardSigmoid(x) forms mapped to it (assumed; OpenVINO's "
                                         "HSwishFusion and onnxruntime's QNN EP fuse the same forms)"),
                        "Silu": (A, "SiLU (x*sigmoid(x), a function of one input) as one lookup-table op, as "
                                    "Sigmoid is (assumed)")}),
    quant_round=S("half_to_even", A, "plugin default QuantRoundMode.HALF_TO_EVEN [source]; that "
                                     "nash hardware rounds float->int this way is assumed"),
    scale_divisor=S("qmax", A, "options qmax (T/127, hmct [source]), half_range (T/127.5, plugin "
                               "observers), neg_qmin (T/128, plugin fixed scale); default chosen "
                               "for the PTQ import path"),
    consistency_level=S(0, D, "ConsistencyStrategy level 0: statistical (non power-of-two) scales"),
    requant_mode=S("float", A, "debugging default: multiply by s_x*s_w/s_y in float32, round half to even; "
                               "fixed16 = bayes hbdk3 multiplier [source for bayes], fixed32 = "
                               "gemmlowp Q31"),
    requant_multiplier_bits=S(16, A, "16-bit multiplier, 15 fractional bits: bayes hbdk3 builder "
                                     "[source]; nash width unknown"),
    requant_shift_round=S("half_up", A, "(x + 2^(n-1)) >> n; bayes rounds shifts [source], nash "
                                        "unknown"),
    high_precision_qpp=S(True, D, "ConsistencyStrategy level 0 = high-precision QPP; modelling it "
                                  "as float requant is inference"),
    fuse_requant=S(False, D, "ConsistencyStrategy level 0 = no requantize fusion; the fused "
                             "arithmetic is assumed"),
    intermediate_sat16=S(False, A, "bayes-era kernels saturate to 16 bits after accu_rshift "
                                   "[source]; not known for nash"),
    acc_bits=S(32, A, "int32 accumulation documented for bayes (J5) int16 conv; for nash, "
                      "standard practice (inference)"),
    acc_overflow=S("warn", A, "dual-int16 overflow behaviour unknown: qir accumulates exactly and "
                              "warns when the sum leaves acc_bits"),
    bias_dtype=S("int32", D, "int32 bias (integer dtypes list)"),
    bias_round=S("half_to_even", A, "b_q = round(b / (s_x * s_w)); bayes uses a shifted int bias "
                                    "[source]"),
    saturate=S(True, A, "documented for J6P/H Add ('overflow saturates to the result dtype's "
                        "min/max'); generalized to every op and to nash-e/m"),
    lut_mode=S("float", A, "debugging default: evaluate f exactly, then quantize (plugin before "
                           "pre_export); 'segment' emulates the tables"),
    lut_int8=S(LutInt8(), D, "int8: one 256-entry table of the input's type",
               items={"index_offset": (SRC, "index = x + 128 (plugin)")}),
    lut_int16=S(LutInt16(), SRC, "plugin SegmentLUT generator",
                items={"max_segments": (D, "ONNX constraint: range int16 [N+2, 4], N <= 64"),
                       "entries_per_segment": (D, "ONNX constraint: entry int16 [N, 64]"),
                       "interp": (A, "bpu_segment_lut is closed: linear interpolation on the Q8 "
                                     "index, rounded half up"),
                       "out_dtypes": (D, "int16 -> int8 | int16")}),
    dynamic_quant_linear=S(False, D, "dynamic quant (per-row Linear activations) is nash-p only"),
    softmax_mode=S("float", A, "a BPU Softmax is a composite of int16 LUTs and integer ops (SegmentLUTSoftmax, "
                               "plugin [source]); its decomposition is not public: qir computes it in float"),
    integer_ops=S(None, A, "every op qir has an integer kernel for runs in integer; the BPU's "
                           "exact op coverage per march is not public"),
    tune_ladder=S({"gemm": ("int8", "int16", "int16+w16"), "other": ("int8", "int16", "fp16")}, D,
                  "accuracy tuning guide, J6E/M mixed precision: all-int16 first (the upper bound), then all-int8 "
                  "with int16 raised by sensitivity (binary search on the int16 ratio); fp16 only where int16 "
                  "cannot reach the target (J6M has little float compute)",
                  items={"gemm": (A, "int16+w16 (dual int16) rests on the assumed (int16, int16) GEMM pair")}),
    tune_costs=S(_NASH_COSTS, A, TUNE_COST_NOTE),
    peak_tops=S(_E_RATES[0], A, _RATES_NOTE, items=_E_RATES[1]),
    memory_gbps=S(51.2, A, _MEMORY_NOTE),
    op_overhead_us=S(2.0, A, _OVERHEAD_NOTE),
    free_ops=S(VIEW_OPS, A, _FREE_NOTE),
)
