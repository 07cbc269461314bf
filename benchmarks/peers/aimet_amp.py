"""AIMET-ONNX automatic mixed precision: ``aimet_onnx.mixed_precision.choose_mixed_precision``
(phase 1: each quantizer group's accuracy at each lower candidate; phase 2: binary search on
the Pareto curve of accuracy vs bit-ops), run by ``benchmarks/tune_peers.py`` under the peers'
virtualenv.

    python aimet_amp.py --model M.onnx --calib DIR --eval DIR --out DIR [--max-drop 0.01] [--eval-num N]
                        [--candidates a8w8,a16w8] [--quant-scheme min_max] [--phase1-num N]
                        [--full] [--adaround-iterations 1000] [--adaround-layers N]

Settings: batch norms folded into the convolutions first (AIMET's advice), AIMET's per-channel
default config (``default_config_per_channel.json``: per-channel weights for Conv/ConvTranspose/
Gemm/MatMul, as the others get), AIMET's default quant scheme (``min_max``) unless
``--quant-scheme``, candidates as ``a<activation bits>w<weight bits>`` (integer; default int8 and
int16 activations with int8 weights, ``a16w16`` adds dual int16), both eval callbacks = the mean
cosine vs the float outputs over the tuning samples (phase 1 over the first ``--phase1-num`` of
them), ``allowed_accuracy_drop`` absolute from the float model's 1.0, binary search, encodings
from the calibration samples. The chosen configuration is exported with ``sim.to_onnx_qdq()``
(opset raised to 21 where 16-bit quantizers need it).

``--full``: AIMET's whole post-training pipeline before AMP, as its user guide orders it:
cross-layer equalization (``aimet_onnx.cross_layer_equalization.equalize_model``: batch-norm
folding, ReLU6 replaced by ReLU, cross-layer scaling, high-bias folding) on the float model, then
the QuantizationSimModel, then AdaRound (``aimet_onnx.apply_adaround`` on the calibration samples,
``--adaround-iterations`` per layer, default 1000 against AIMET's recommended 10000 for 8-bit
weights: the machine is shared; the weight encodings are frozen after it, so AMP's candidates keep
int8 weights as rounded), then AMP as above. Bias correction is not in the pipeline:
aimet-onnx 2.42 has none (it is in aimet-torch only); AdaRound minimises each layer's output
error, which includes the bias shift.
"""
from __future__ import annotations

import tempfile
import time
from collections import Counter

import onnx
from common import Timer, arguments, cosines, one_thread, outputs, samples, session, write_result


def candidates(text: str):
    """``"a8w8,a16w8"`` -> AIMET's ``[((8, int), (8, int)), ((16, int), (8, int))]`` (activation, param)."""
    from aimet_onnx.common.defs import QuantizationDataType

    out = []
    for item in text.split(","):
        act, weight = item.strip().lstrip("a").split("w")
        out.append(((int(act), QuantizationDataType.int), (int(weight), QuantizationDataType.int)))
    return out


def sim_model(model, scheme: str):
    """A one-thread CPU QuantizationSimModel of ``model`` with AIMET's per-channel default config."""
    from importlib.resources import files

    from aimet_onnx.quantsim import QuantizationSimModel

    config = files("aimet_onnx.common.quantsim_config") / "default_config_per_channel.json"
    return QuantizationSimModel(model, quant_scheme=scheme, config_file=str(config), providers=["CPUExecutionProvider"],
                                session_options_kwargs={"intra_op_num_threads": 1, "inter_op_num_threads": 1})


def prepare(model) -> dict:
    """Cross-layer equalization of ``model`` in place (``--full``); what it changed and its time."""
    from aimet_onnx.cross_layer_equalization import equalize_model

    before = Counter(n.op_type for n in model.graph.node)
    start = time.perf_counter()
    equalize_model(model)
    after = Counter(n.op_type for n in model.graph.node)
    return {"cle_s": round(time.perf_counter() - start, 2), "ops_before_cle": dict(before), "ops_after_cle": dict(after)}


def main() -> None:
    p = arguments(__doc__.splitlines()[0])
    p.add_argument("--candidates", default="a8w8,a16w8", help="AMP candidates (default: %(default)s)")
    p.add_argument("--quant-scheme", default="min_max", help="AIMET quant scheme (default: %(default)s)")
    p.add_argument("--phase1-num", type=int, default=None, help="phase 1 (sensitivity) on the first N tuning samples")
    p.add_argument("--full", action="store_true", help="CLE and AdaRound before AMP (see above)")
    p.add_argument("--adaround-iterations", type=int, default=1000, help="AdaRound steps per layer (default: %(default)s)")
    p.add_argument("--adaround-layers", type=int, default=None, help="AdaRound on the first N GEMMs only (cheap runs)")
    args = p.parse_args()
    one_thread()
    import aimet_onnx
    from aimet_onnx.batch_norm_fold import fold_all_batch_norms_to_weight
    from aimet_onnx.common.amp.utils import AMPSearchAlgo
    from aimet_onnx.common.defs import CallbackFunc
    from aimet_onnx.mixed_precision import choose_mixed_precision

    model = onnx.load(args.model)
    calib, tuning = samples(args.calib), samples(args.eval, args.eval_num)
    phase1 = tuning[:args.phase1_num]
    name = model.graph.input[0].name
    timer = Timer()
    refs = outputs(session(model), tuning)

    def score(sess, count: int) -> float:
        values = cosines(refs[:count], outputs(sess, tuning[:count]))
        return sum(values) / len(values)

    def calibrate(sess, _args) -> None:
        for x in calib:
            sess.run(None, {name: x})

    steps = {}
    if args.full:
        steps = prepare(model)
    else:
        fold_all_batch_norms_to_weight(model)  # AIMET's advice before a QuantizationSimModel
    sim = sim_model(model, args.quant_scheme)
    if args.full:
        start = time.perf_counter()
        gemms = [n.name for n in model.graph.node if n.op_type in ("Conv", "ConvTranspose", "MatMul", "Gemm")]
        include = gemms[:args.adaround_layers] if args.adaround_layers is not None else None
        aimet_onnx.apply_adaround(sim, [{name: x} for x in calib], num_iterations=args.adaround_iterations,
                                  nodes_to_include=include)
        steps["adaround_s"] = round(time.perf_counter() - start, 2)
    with tempfile.TemporaryDirectory() as results:
        choose_mixed_precision(sim, candidates(args.candidates), lambda s: score(s, len(phase1)),
                               lambda s: score(s, len(tuning)), args.max_drop, results, True, CallbackFunc(calibrate),
                               amp_search_algo=AMPSearchAlgo.Binary)
        quantized = sim.to_onnx_qdq()
    timer.stop()
    bits = [q.bitwidth for q in sim.qc_quantize_op_dict.values() if q.enabled]
    tuned = score(sim.session, len(tuning))
    write_result(args.out, quantized, timer, tool="aimet", version=aimet_onnx.__version__, tuning_mean_cosine=tuned,
                 quantizers={"enabled": len(bits), "above_8_bit": sum(b > 8 for b in bits)},
                 settings={"max_drop": args.max_drop, "candidates": args.candidates, "quant_scheme": args.quant_scheme,
                           "config": "default_config_per_channel.json", "search": "binary",
                           "eval_samples": len(tuning), "phase1_samples": len(phase1), "full": args.full,
                           "adaround_iterations": args.adaround_iterations if args.full else None,
                           "adaround_layers": args.adaround_layers},
                 steps=steps)


if __name__ == "__main__":
    main()
