"""``qir tune`` as ``benchmarks/tune_peers.py`` runs it (under qir's own Python, like a peer script:
same options, same result files, one thread).

    python qir_tune.py --model M.onnx --calib DIR --eval DIR --out DIR [--max-drop 0.01] [--eval-num N]
                       [--allow-float] [--march nash-e] [--method mse] [--worst W] [--transforms T ...]

Calls ``qir.tune(model, calib, eval, "cosine>=1-max_drop", march=..., method=..., allow_float=...,
save_dir=OUT/tune, threads=1)`` on the float model (its calibration included in the wall time,
as the peers' is; qir's report and model files are written inside the timed call) and copies the
emitted ``tuned_model_qdq.onnx`` to ``OUT/model.onnx``. ``--worst W`` adds a floor for every
evaluation image to the target (``cosine>=1-max_drop,worst>=W``), which the peers cannot express.
``--transforms``: the transforms tune tries first (pipeline spellings, one a word; default tune's).
"""
from __future__ import annotations

import logging

import onnx
from common import Timer, arguments, one_thread, write_result


def main() -> None:
    p = arguments(__doc__.splitlines()[0])
    p.add_argument("--allow-float", action="store_true", help="float32 as the last-resort candidate")
    p.add_argument("--march", default="nash-e")
    p.add_argument("--method", default="mse", help="calibration method of the float model (default: %(default)s)")
    p.add_argument("--worst", type=float, default=None, help="also a floor for every eval image: cosine>=T,worst>=W")
    p.add_argument("--transforms", nargs="+", default=None, help="transforms tune tries first (default: tune's)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("qir.runtimes", "qir.passes.calibrate"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    one_thread()
    import qir

    shapes = {i.name: [d.dim_value or 1 for d in i.type.tensor_type.shape.dim] for i in onnx.load(args.model).graph.input}
    target = f"cosine>={1 - args.max_drop:g}" + (f",worst>={args.worst:g}" if args.worst is not None else "")
    timer = Timer()
    report = qir.tune(args.model, args.calib, args.eval, target, march=args.march, method=args.method,
                      allow_float=args.allow_float, save_dir=f"{args.out}/tune", overwrite=True, threads=1,
                      input_shapes=shapes, eval_num=args.eval_num, progress=False,
                      **({"transforms": args.transforms} if args.transforms else {}))
    timer.stop()
    verification = report.get("verification") or {}
    write_result(args.out, onnx.load(f"{args.out}/tune/tuned_model_qdq.onnx"), timer, tool="qir", version=qir.__version__,
                 tuning_mean_cosine=verification.get("mean"), reached=report.get("reached"),
                 settings={"target": target, "march": args.march, "method": args.method, "allow_float": args.allow_float,
                           "eval_samples": args.eval_num, "threads": 1,
                           "transforms": args.transforms})


if __name__ == "__main__":
    main()
