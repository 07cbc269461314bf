"""NNCF accuracy control on an ONNX model: ``nncf.quantize_with_accuracy_control`` (int8, then the
quantizer groups that cost the most accuracy reverted to float32, ranked by re-validating each
group), run by ``benchmarks/tune_peers.py`` under the peers' virtualenv.

    python nncf_ac.py --model M.onnx --calib DIR --eval DIR --out DIR [--max-drop 0.01] [--eval-num N]
                      [--max-iterations N] [--model-type transformer]

Settings: NNCF's defaults (preset, ignored patterns, target device ANY, fast bias correction),
``subset_size`` = the number of calibration samples, one ranking worker, ``max_drop`` absolute
from the float model's metric (mean cosine 1.0, so 0.01 means mean cosine >= 0.99 on the tuning
samples). ``validation_fn`` returns the mean cosine vs the float outputs and the per-sample
values (NNCF's metric mode), each call on a fresh one-thread session with
``session.disable_quant_qdq`` (the model NNCF passes is a ModelProto).

``--model-type transformer``: NNCF's pipeline for transformers (``model_type=nncf.ModelType.TRANSFORMER``):
SmoothQuant first (NNCF's default alphas: MatMul 0.95, convolutions off), the transformer ignored
patterns and the ``mixed`` preset (asymmetric activations); fast bias correction stays on as in
the default run. Without it NNCF runs no SmoothQuant (it has it for transformers only).
"""
from __future__ import annotations

import onnx
from common import Timer, arguments, cosines, one_thread, outputs, samples, session, write_result


def main() -> None:
    p = arguments(__doc__.splitlines()[0])
    p.add_argument("--max-iterations", type=int, default=None, help="at most N groups reverted (cheap runs)")
    p.add_argument("--model-type", choices=["transformer"], default=None, help="NNCF's model type (SmoothQuant)")
    args = p.parse_args()
    one_thread()
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters

    model = onnx.load(args.model)
    calib, tuning = samples(args.calib), samples(args.eval, args.eval_num)
    name = model.graph.input[0].name
    timer = Timer()
    refs = outputs(session(model), tuning)

    def validate(candidate, items) -> tuple[float, list[float]]:
        """Mean cosine vs the float outputs over ``items`` ((index, sample) pairs) and each value."""
        items = list(items)
        values = cosines([refs[i] for i, _ in items], outputs(session(candidate), [x for _, x in items]))
        return float(sum(values) / len(values)), values

    def feed(item) -> dict:
        return {name: item[1]}

    restorer = AdvancedAccuracyRestorerParameters(num_ranking_workers=1)
    if args.max_iterations is not None:
        restorer.max_num_iterations = args.max_iterations
    quantized = nncf.quantize_with_accuracy_control(
        model, nncf.Dataset(list(enumerate(calib)), feed), nncf.Dataset(list(enumerate(tuning)), feed), validate,
        max_drop=args.max_drop, drop_type=nncf.DropType.ABSOLUTE, subset_size=len(calib),
        advanced_accuracy_restorer_parameters=restorer,
        model_type=nncf.ModelType.TRANSFORMER if args.model_type == "transformer" else None)
    timer.stop()
    tuned, _ = validate(quantized, enumerate(tuning))
    write_result(args.out, quantized, timer, tool="nncf", version=nncf.__version__, tuning_mean_cosine=tuned,
                 settings={"max_drop": args.max_drop, "drop_type": "absolute", "subset_size": len(calib),
                           "eval_samples": len(tuning), "num_ranking_workers": 1,
                           "max_num_iterations": args.max_iterations, "model_type": args.model_type,
                           "fast_bias_correction": True})


if __name__ == "__main__":
    main()
