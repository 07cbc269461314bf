"""The ``nash-p`` march (J6P; nash-h / J6H map onto it): ``nash-e`` plus its documented
differences, chiefly native fp16 on every non-GEMM op."""
from __future__ import annotations

from qir.runtimes.march.nash_e import DOC_SUMMARY, NASH_E, TUNE_COST_NOTE, nash_rates
from qir.runtimes.march.op_classes import OpClass
from qir.runtimes.march.profile import I8_I16, SRC, A, D, S, derive_profile

__all__ = ["NASH_P"]

_P_ALL = ("int8", "int16", "fp16")
_P_RATES = nash_rates(560, "J6P")
_P_NOTE = "J6P: non-GEMM ops default to float16; nonlinear ops int8->int8, int16->int8|int16, fp16"
NASH_P = derive_profile(
    NASH_E,
    name=S("nash-p", D, "hmct / horizon_plugin_pytorch march name (J6P)"),
    aliases=S(("J6P", "nash-h", "J6H"), D, "product mapping: J6P = nash-p",
              items={"nash-h": (A, "nash-h (J6H) is its own march; it shares the J6P/H constraint "
                                   "list, so qir maps it onto nash-p"),
                     "J6H": (A, "J6H = nash-h, mapped onto nash-p (shared J6P/H constraint list)")}),
    act_dtypes=S({OpClass.GEMM: I8_I16, OpClass.ELEMENTWISE: _P_ALL, OpClass.LUT: _P_ALL,
                  OpClass.POOL_RESIZE: _P_ALL, OpClass.SHAPE: _P_ALL, OpClass.REDUCE: _P_ALL,
                  OpClass.NORM: _P_ALL},
                 D, _P_NOTE,
                 items={OpClass.GEMM: (D, "J6P GEMM int8/int16"),
                        OpClass.POOL_RESIZE: (SRC, "fp16 per the J6P non-GEMM default; the data "
                                                   "input is int8-only when quantized "
                                                   "(int8_only_inputs, plugin canonicalizer)"),
                        OpClass.SHAPE: (A, "int16 through TRANS ops: no arithmetic (inference)"),
                        OpClass.REDUCE: (A, "int16 reductions: same vector unit as elementwise "
                                            "(inference); fp16 documented (non-GEMM default)"),
                        OpClass.NORM: (A, "int16 BatchNorm/InstanceNorm (inference); fp16 "
                                          "documented (non-GEMM default)")}),
    default_non_gemm_act_dtype=S("fp16", D, "J6P standard config 'fp16 + int8': non-GEMM fp16"),
    gemm_dtype_pairs=S((("int8", "int8"), ("int16", "int8"), ("int16", "int16")), D,
                       "ConvDtypeTemplate(qint16, qint16) on J6P (j6-plugin-precision-tuning)"),
    matmul_act_act_pairs=S(
        (("int8", "int8"), ("int16", "int8"), ("int8", "int16"), ("int16", "int16")), D,
        "MatmulDtypeTemplate(input_dtypes=qint16) on J6P; [qint8, qint16] / [qint16, qint8] in "
        "the LLM case study"),
    gemm_float_output=S(True, D, "float high-precision GEMM output on J6B/H/P: " + DOC_SUMMARY),
    elementwise_dtypes=S(("int8", "int16", "int32", "fp16", "float"), D,
                         "J6P/H add: int8/int16/int32/float16/float32, both operands one type"),
    fp16_ops=S("full", D, "J6P: fp16 for every non-GEMM op, the default route"),
    fp16_documented_ops=S((), D, "not needed with fp16_ops = full"),
    consistency_level=S(0, A, "ConsistencyStrategy is documented for J6E/M; assumed the same here"),
    high_precision_qpp=S(True, A, "ConsistencyStrategy level 0 (documented for J6E/M) assumed "
                                  "for J6P"),
    fuse_requant=S(False, A, "ConsistencyStrategy level 0 (documented for J6E/M) assumed for J6P"),
    saturate=S(True, D, "J6P/H add: 'when inputs are integer/quantized, overflow saturates to the "
                        "result dtype's min/max'; generalized to every op (assumed)"),
    dynamic_quant_linear=S(True, D, "SetDynamicQuantTemplate (nash-p LLM); not emulated in v1"),
    tune_ladder=S({"gemm": ("int8", "int16", "int16+w16"), "other": ("fp16",)}, D,
                  "accuracy tuning guide, J6P: GEMM inputs dual int16 and every other op fp16 first (the upper "
                  "bound), then GEMM inputs int8 with int16 raised by sensitivity; other ops stay fp16"),
    tune_costs=S({**NASH_E.tune_costs, "fp16": 2}, A, TUNE_COST_NOTE + "; fp16 is native on every non-GEMM op of "
                                                                        "J6P, costed as int16"),
    peak_tops=S({**_P_RATES[0], "fp16": 560 / 4}, A, NASH_E.provenance["peak_tops"].note
                + "; J6P: fp16 native on every non-GEMM op, a quarter of int8 (our guess)", items=_P_RATES[1]),
    memory_gbps=S(102.4, A, "not published: a 128-bit LPDDR5-6400 interface (102.4 GB/s) is our guess for the "
                            "larger chip; every tensor leaving a fused group goes through it"),
)
