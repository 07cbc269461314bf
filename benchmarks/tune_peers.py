"""``qir tune`` against its peers, AIMET-ONNX automatic mixed precision and NNCF accuracy control,
on PP-OCRv4 det (issue 20) or the ViT-S (issue 34): same data, same target, one thread each, every
result scored on the same unseen images and counted from the ONNX graph it emits.

    python benchmarks/tune_peers.py [--model ppocrv4_det|vit_s_focus] [--only qir,nncf,aimet,nncf-full,aimet-full]
                                    [--out DIR] [--reuse] [--time-limit S] [--data DIR] [--target-cosine 0.99] [--eval-num N]
                                    [--peers-python PATH] [--qir-args ..] [--nncf-args ..] [--aimet-args ..] [--check]

**Data** (built here, under ``--data``, default a temp dir; the ViT's under ``DATA/vit_s_focus``),
one ``.npy`` per sample, each through the model's own preprocessing:

- ``ppocrv4_det``: text images (``realmodels.text_images``, ``ppocr_det_input``): ``calib/`` 8
  (seed 11), ``eval/`` 8 (seed 12: the target is met there), ``held/`` 16 (seed 13: seen by no
  tool, the score).
- ``vit_s_focus``: photos (``realmodels.images``, ``vit_input``): ``calib/`` the 8
  ``realmodels.CALIB`` photos, ``eval/`` the 8 ``realmodels.EVAL`` ones, ``held/`` 8 photos in
  neither: cell, clock_motion, color, grass, gravel, logo, microaneurysms, phantom.

**Model.** The shipped model with its input fixed (det 1x3x640x640, ViT 1x3x224x224;
``float_static.onnx``, what qir gets) and, where its opset is below 13, that model converted to
opset 13 with ``onnx.version_converter`` (``float_op13.onnx``, what NNCF and AIMET get, so that
they can quantize weights per channel). The det model is at opset 11 and is converted; the ViT is
at 14 and all get ``float_static.onnx``. The score is the model's first output (det: its
probability map; ViT: its 1x1x224x224 sigmoid saliency map).

**Runs** (each a subprocess with ``OMP_NUM_THREADS=1`` and the BLAS thread variables at 1; each
script in ``benchmarks/peers/`` makes every onnxruntime session one-thread): ``qir`` (``qir.tune``
with ``cosine>=T``, march nash-e, mse calibration of the float model, its default transforms
stage), ``qir+float`` (the same with ``allow_float``), ``qir+worst`` (the same with a floor for
every eval image, ``cosine>=T,worst>=W``, ``--worst``, default the 0.98 hold line: what a user who
cares about the worst image asks for; the peers have no such option) and ``qir+worst+float``
(that with ``allow_float``) under this Python; ``nncf`` (``quantize_with_accuracy_control``,
``max_drop = 1 - T`` absolute: the like-for-like comparison for ``qir+float``) and ``aimet``
(AMP, int8/int16 candidates, ``allowed_accuracy_drop = 1 - T``, batch norms folded first) under
``--peers-python``, a virtualenv with ``nncf==3.4.0 onnx onnxruntime aimet-onnx==2.42.0
torch`` (torch 2.14.1 in the measured runs). The peers' full pipelines: ``nncf-full`` (NNCF's transformer pipeline,
``model_type=TRANSFORMER``: SmoothQuant, then PTQ with fast bias correction, then accuracy
control; on det, which has no transformer and where NNCF applies no SmoothQuant, it is the
``nncf`` run as it is: NNCF's defaults already include fast bias correction) and ``aimet-full``
(cross-layer equalization with batch-norm folding and high-bias folding, AdaRound with 1000
iterations per layer, then AMP as ``aimet``; aimet-onnx 2.42 has no bias correction: see
``peers/aimet_amp.py``). ``--only`` takes tool names (``qir`` is the four qir runs, ``nncf`` and
``aimet`` today's runs) or run names. Each run writes ``OUT/<run>/model.onnx`` and ``result.json``
(its wall and CPU time, measured inside the run from the loaded model to the quantized model);
``--reuse`` keeps a run whose files exist; ``--time-limit S`` stops a run after S seconds (its row
says so). ``--check`` runs no tool: it checks the counting and the
cost on models whose answer is known (:func:`self_check`).

**Columns**, per emitted model:

- held mean / worst: the cosine between the model's output and the float model's on each held
  image (onnxruntime, ``session.disable_quant_qdq``: the QDQ graph as written, as qir verifies);
  eval mean: the same on the eval images (the emitted model against the target), in brackets
  the tool's own measure of it (AIMET: its simulation, before export).
- GEMM ops (Conv, ConvTranspose, Gemm, MatMul) by precision: each input's precision is the type
  of the integer tensor its DequantizeLinear reads (int8/uint8: int8, int16/uint16: int16), a Cast
  through float16 (or a float16 value) is fp16, anything else float32; an op counts at its
  highest input precision (int8 < int16 < fp16 < float32), so the ops a tool leaves float by
  default are counted. The JSON has every ``input x weight`` pair.
- quantizers > 8 bit: distinct integer tensors read by DequantizeLinear nodes that are 16-bit
  (int16/uint16), of all of them but int32 biases (a quantized weight initializer counts like a
  QuantizeLinear output).
- est. ms: the latency model's estimated time on the march (``Space(ir, profile).cost_of_ir()``:
  bytes, fusions, peak rates, per-op overhead; :mod:`qir.passes.lib.latency`), also relative to
  all-int16.
- FLOP cost: qir's FLOP-weighted cost under the march's ``tune_costs``: ``qir.load`` of the emitted
  model gives a calibrated IR and ``Space(ir, profile).flop_cost_of_ir()`` prices every op: one that
  reads a quantizer at its precision, one that reads none (left float) as float (GEMM: ``float x
  float``). Shown relative to all-int8 and all-int16 (every unit that can be int16 is; weights
  int8: what qir's report calls all-int16) of that pipeline.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
HELD_PHOTOS = ["cell.png", "clock_motion.png", "color.png", "grass.png", "gravel.png", "logo.png", "microaneurysms.png",
               "phantom.png"]  # in neither realmodels.CALIB nor realmodels.EVAL
MODELS = {  # model -> (input, shape, preprocessing, sets: (folder, text_images seed or photo names, count), transformer)
    "ppocrv4_det": ("x", [1, 3, 640, 640], "ppocr_det_input", (("calib", 11, 8), ("eval", 12, 8), ("held", 13, 16)), False),
    "vit_s_focus": ("input_image", [1, 3, 224, 224], "vit_input",
                    (("calib", "CALIB", 8), ("eval", "EVAL", 8), ("held", HELD_PHOTOS, 8)), True),
    "ppocr_cls": ("x", [1, 3, 48, 192], "text_band_input", (("calib", 11, 8), ("eval", 12, 8), ("held", 13, 16)), False),
}
RUNS = {  # run -> (script, python: "qir" or "peers", extra options, model: "static" or "op13")
    "qir": ("qir_tune.py", "qir", [], "static"),
    "qir+float": ("qir_tune.py", "qir", ["--allow-float"], "static"),
    "qir+worst": ("qir_tune.py", "qir", [], "static"),  # (--worst W added from the command line)
    "qir+worst+float": ("qir_tune.py", "qir", ["--allow-float"], "static"),  # (and here)
    "nncf": ("nncf_ac.py", "peers", [], "op13"),
    "aimet": ("aimet_amp.py", "peers", [], "op13"),
    "nncf-full": ("nncf_ac.py", "peers", [], "op13"),  # (--model-type transformer added for a transformer)
    "aimet-full": ("aimet_amp.py", "peers", ["--full", "--adaround-iterations", "1000"], "op13"),
}
TOOLS = {"qir": ["qir", "qir+float", "qir+worst", "qir+worst+float"], "nncf": ["nncf"], "aimet": ["aimet"]}
GEMMS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
PRECISIONS = ("int8", "int16", "fp16", "float32")  # cheapest first: an op counts at its highest input
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


# ---------------------------------------------------------------------- data and models
def text_band_input(page: np.ndarray) -> np.ndarray:
    """The text-direction classifier's input from a text page (``realmodels.text_images``): the
    page's middle band, four times as wide as high (the classifier's 192x48 aspect; a few printed
    lines), through ``ppocr_cls_input``."""
    from real_cases import realmodels

    h, w = page.shape[:2]
    top = (h - w // 4) // 2
    return realmodels().ppocr_cls_input(page[top:top + w // 4])


def build_data(folder: Path, model: str) -> dict[str, Path]:
    """The calib / eval / held sample folders of ``model`` under ``folder`` (see the module
    docstring); kept when a previous build finished (``.complete``)."""
    from real_cases import realmodels

    _, _, prep, sets, _ = MODELS[model]
    paths = {name: folder / name for name, _, _ in sets}
    done = folder / ".complete"
    if done.exists() and done.read_text() == repr(sets):
        return paths
    rm = realmodels()
    for name, source, count in sets:
        paths[name].mkdir(parents=True, exist_ok=True)
        if isinstance(source, int):
            images = rm.text_images(count, seed=source)
        else:
            names = getattr(rm, source) if isinstance(source, str) else source
            images = rm.images(names)
            if len(images) != count:
                raise SystemExit(f"{model} {name}: {len(images)} of the {count} photos found under {rm.root() / 'images'}")
        for i, image in enumerate(images):
            fn = getattr(rm, prep, None) or globals()[prep]  # (realmodels' preprocessing, or one of this module)
            np.save(paths[name] / f"{i:03d}.npy", fn(image).astype(np.float32))
    done.write_text(repr(sets))
    return paths


def build_models(folder: Path, name: str) -> dict[str, Path]:
    """``float_static.onnx`` (input fixed) and ``float_op13.onnx`` (that at opset 13; the static
    model itself where its opset is 13 or more) under ``folder``."""
    import onnx
    from onnx import version_converter
    from real_cases import realmodels

    input_name, shape = MODELS[name][:2]
    static, op13 = folder / "float_static.onnx", folder / "float_op13.onnx"
    if not static.exists():
        model = onnx.load(str(realmodels().model(name)))
        (x,) = [i for i in model.graph.input if i.name == input_name]
        for dim, size in zip(x.type.tensor_type.shape.dim, shape):
            dim.ClearField("dim_param")
            dim.dim_value = size
        onnx.save(model, str(static))
    model = onnx.load(str(static))
    if next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 13:
        return {"static": static, "op13": static}
    if not op13.exists():
        converted = version_converter.convert_version(model, 13)
        onnx.checker.check_model(converted)
        onnx.save(converted, str(op13))
    return {"static": static, "op13": op13}


# ---------------------------------------------------------------------- runs
def run(name: str, models: dict[str, Path], data: dict[str, Path], out: Path, args) -> dict:
    """Run ``name`` (one of :data:`RUNS`) into ``out/name``; its ``result.json`` plus ``model``,
    or ``error`` with the end of its log."""
    script, python, extra, model = RUNS[name]
    folder = out / name
    result_file = folder / "result.json"
    if args.reuse and result_file.exists() and (folder / "model.onnx").exists():
        print(f"{name}: reusing {folder}", flush=True)
        return {**json.loads(result_file.read_text()), "model": str(folder / "model.onnx")}
    folder.mkdir(parents=True, exist_ok=True)
    result_file.unlink(missing_ok=True)
    command = [sys.executable if python == "qir" else args.peers_python, str(PEERS / script), "--model", str(models[model]),
               "--calib", str(data["calib"]), "--eval", str(data["eval"]), "--out", str(folder),
               "--max-drop", repr(round(1 - args.target_cosine, 12)), *extra]
    if args.eval_num:
        command += ["--eval-num", str(args.eval_num)]
    command += args.extra.get(name, [])
    print(f"{name}: {' '.join(command)}", flush=True)
    start = time.perf_counter()
    with open(folder / "log.txt", "w") as log:
        try:
            done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **ONE_THREAD}, cwd=PEERS,
                                  timeout=args.time_limit)
        except subprocess.TimeoutExpired:
            print(f"{name}: stopped at the time limit ({args.time_limit:.0f} s)", flush=True)
            return {"tool": name, "error": f"did not finish in the time limit ({args.time_limit:.0f} s wall)"}
    print(f"{name}: exit {done.returncode} after {time.perf_counter() - start:.0f} s (log: {folder / 'log.txt'})", flush=True)
    if done.returncode != 0 or not result_file.exists():
        tail = (folder / "log.txt").read_text(errors="replace").strip().splitlines()[-5:]
        return {"tool": name, "error": f"exit {done.returncode}: " + " | ".join(tail)}
    return {**json.loads(result_file.read_text()), "model": str(folder / "model.onnx")}


# ---------------------------------------------------------------------- scoring and counting
def held_outputs(model, xs: list[np.ndarray]) -> list[np.ndarray]:
    """The first output of ``model`` on each sample: onnxruntime, one thread, QDQ as written."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3  # no warnings about unused initializers
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    sess = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return [np.asarray(sess.run(None, {name: x})[0]) for x in xs]


def score(model, xs: list[np.ndarray], refs: list[np.ndarray]) -> dict[str, float]:
    """Mean and worst per-sample cosine of ``model``'s outputs against ``refs`` (qir's metric)."""
    from qir.metrics import cosine_similarity

    values = [cosine_similarity(r, o) for r, o in zip(refs, held_outputs(model, xs))]
    return {"mean": float(np.mean(values)), "worst": float(np.min(values))}


def _bits(elem_type: int) -> str:
    import onnx

    name = onnx.TensorProto.DataType.Name(elem_type).lower()  # "int8", "uint16", "float16"...
    return name[1:] if name in ("uint4", "uint8", "uint16", "uint32") else name


def graph_types(model) -> dict[str, int]:
    """Element type of every value ONNX shape inference (and the initializers) can tell."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.value_info, *g.input, *g.output]}
    types.update({t.name: t.data_type for t in g.initializer})
    return {k: v for k, v in types.items() if v}


def _integer_type(value: str, producers: dict, types: dict[str, int], initializers: dict) -> str:
    """The integer type of ``value``, the tensor a DequantizeLinear reads: its inferred or stored
    type, else its QuantizeLinear's ``output_dtype`` or zero point type (default uint8)."""
    import onnx

    if value in types:
        return _bits(types[value])
    q = producers.get(value)
    if q is not None and q.op_type == "QuantizeLinear":
        attrs = {a.name: a.i for a in q.attribute}
        if attrs.get("output_dtype"):
            return _bits(attrs["output_dtype"])
        if len(q.input) > 2 and q.input[2] in types:
            return _bits(types[q.input[2]])
        if len(q.input) > 2 and q.input[2] in initializers:
            return _bits(initializers[q.input[2]].data_type)
    return _bits(onnx.TensorProto.UINT8)


def input_precision(value: str, producers: dict, types: dict[str, int], initializers: dict) -> str:
    """``int8`` / ``int16`` (...) for a value a DequantizeLinear gives, ``fp16`` for a value cast
    through float16 (or float16 itself), else ``float32``."""
    import onnx

    if types.get(value) == onnx.TensorProto.FLOAT16:
        return "fp16"
    node = producers.get(value)
    while node is not None and node.op_type == "Cast":
        if any(a.name == "to" and a.i == onnx.TensorProto.FLOAT16 for a in node.attribute):
            return "fp16"
        node = producers.get(node.input[0])
    if node is not None and node.op_type == "DequantizeLinear":
        return _integer_type(node.input[0], producers, types, initializers)
    return "float32"


def count_graph(path) -> dict:
    """GEMM ops by precision and by ``input x weight`` pair, and the quantizers (see the module
    docstring) of the ONNX model at ``path``."""
    import onnx

    model = onnx.load(str(path))
    types, initializers = graph_types(model), {t.name: t for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    pairs, ops = Counter(), Counter()
    for node in model.graph.node:
        if node.op_type not in GEMMS:
            continue
        got = [input_precision(v, producers, types, initializers) for v in node.input[:2] if v]
        pairs[" x ".join(got)] += 1
        ops[max(got, key=lambda p: PRECISIONS.index(p) if p in PRECISIONS else 0)] += 1
    read = {n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    widths = [w for v in read if (w := _integer_type(v, producers, types, initializers)) != "int32"]  # not biases
    wide = widths.count("int16")
    return {"gemm": {p: ops.get(p, 0) for p in PRECISIONS} | {k: v for k, v in ops.items() if k not in PRECISIONS},
            "gemm_pairs": dict(pairs), "quantizers": len(widths), "quantizers_above_8_bit": wide}


# ---------------------------------------------------------------------- cost
class Costs:
    """qir's estimated time (the latency model) and FLOP-weighted cost of emitted models under
    ``march`` (see the module docstring)."""

    def __init__(self, float_model: Path, march: str) -> None:
        import qir
        from qir.passes import PassManager
        from qir.passes.tune.space import Space
        from qir.runtimes.march import get_profile

        self.profile = get_profile(march)
        ir = qir.load(str(float_model))
        PassManager(f"fold-bn,fuse{{march={march}}},insert-calibration{{march={march}}}").run(ir)
        self.reference = ir
        space = Space(ir, self.profile)
        start, int16 = space.plain_start(), space.level_named(space.plain_start(), "int16")
        self.int8, self.int16 = space.flop_cost(start), space.flop_cost(int16)
        self.int8_us, self.int16_us = space.time_us(start), space.time_us(int16)

    def of(self, path) -> dict[str, float]:
        """Cost of the emitted model at ``path``: the FLOP-weighted cost (absolute, and relative to
        all-int8 / all-int16) and the latency model's estimated time (ms, and relative to both)."""
        import qir
        from qir.passes.tune.space import Space

        space = Space(qir.load(str(path)), self.profile)
        total, us = space.flop_cost_of_ir(), space.cost_of_ir()
        return {"cost": total, "x_int8": total / self.int8, "x_int16": total / self.int16,
                "ms": us / 1000.0, "ms_x_int8": us / self.int8_us, "ms_x_int16": us / self.int16_us}


def _gemm_pairs(ir) -> dict[str, int]:
    """``input x weight`` modes of the GEMMs of a calibrated IR, named as :func:`count_graph` names them."""
    from qir.records import CalibRecord

    def mode(value: str) -> str:
        rec = ir.producer(value)
        return "float32" if not isinstance(rec, CalibRecord) or rec.mode.value == "float" else rec.mode.value

    return dict(Counter(" x ".join(mode(v) for v in op.inputs[:2]) for op in ir.ops() if op.op_type in GEMMS))


def self_check(models: dict[str, Path], data: dict[str, Path], costs: Costs, folder: Path, input_name: str) -> None:
    """Known answers for the counting and the cost (``--check``). The float model: every GEMM
    float32 x float32, no quantizer, every op's FLOPs at the float price. qir's own QDQ
    emit of its pipeline (max-calibrated on one sample) at all-int8, at the upper bound (every
    unit at its last integer level) and with one GEMM input at fp16: the GEMM pairs and the
    quantizers (16-bit ones too) its IR holds, and the cost ``Space.flop_cost`` gives the IR
    (and the estimated time ``Space.cost`` gives it, for the emitted model priced as imported)."""
    import onnx

    from qir.io.qdq_export import export_qdq
    from qir.kinds import CalibMode
    from qir.passes import get_pass
    from qir.passes.tune.space import Space

    ir = costs.reference.clone()
    get_pass("calibrate", data=[{input_name: np.load(sorted(data["calib"].glob("*.npy"))[0])}], method="max", progress=False)(ir)
    space = Space(ir, costs.profile, allow_float=True)
    gemms = [op for op in ir.ops() if op.op_type in GEMMS]
    n_gemm = len(gemms)
    failures = []

    def expect(name: str, path, pairs: dict, quantizers: int, wide: int, cost: float, ms: float | None = None) -> None:
        got, priced = count_graph(path), costs.of(path)
        want = {"gemm_pairs": pairs, "quantizers": quantizers, "quantizers_above_8_bit": wide}
        bad = {k: (got[k], v) for k, v in want.items() if got[k] != v}
        if not np.isclose(priced["cost"], cost, rtol=1e-9):
            bad["cost"] = (priced["cost"], cost)
        if ms is not None and not np.isclose(priced["ms"], ms, rtol=1e-6):
            bad["ms"] = (priced["ms"], ms)
        print(f"check {name}: " + ("ok" if not bad else f"FAILED (got, expected): {bad}"), flush=True)
        failures.extend([name] if bad else [])

    import qir
    from qir.runtimes.engine.cost import op_flops

    plain, prices = qir.load(str(models["static"])), costs.profile.tune_costs
    every_op_float = sum(op_flops(plain, op) * prices["float x float" if op.op_type in GEMMS else "float"]
                         for op in plain.ops())
    expect("float model", models["static"], {"float32 x float32": n_gemm}, 0, 0, every_op_float)
    conv = gemms[len(gemms) // 2]
    for name, config in (("qir all-int8", space.plain_start()), ("qir upper bound", space.upper()),
                         ("qir one fp16 GEMM input", space.plain_start())):
        emitted = space.apply(ir.clone(), config)
        cost = space.flop_cost(config)
        if "fp16" in name:
            emitted.set_calibration(emitted.producer(conv.inputs[0]).name, mode=CalibMode("fp16"))
            cost = Space(emitted, costs.profile).flop_cost_of_ir()
        modes = [c.mode.value for c in emitted.calibrations()]
        path = folder / f"check_{name.replace(' ', '_')}.onnx"
        onnx.save(export_qdq(emitted), str(path))
        ms = Space(emitted, costs.profile).cost_of_ir() / 1000.0  # (the IR as configured, before the emit round trip)
        expect(name, path, _gemm_pairs(emitted), sum(m in ("int8", "int16") for m in modes), modes.count("int16"), cost, ms)
    if failures:
        raise SystemExit(f"self-check failed: {', '.join(failures)}")


# ---------------------------------------------------------------------- report
def measure(row: dict, sets: dict[str, tuple[list, list]], costs: Costs) -> dict:
    """``row`` (a run's result) with the emitted model's score on each of ``sets`` (name ->
    (samples, float outputs)), the graph counts and the cost."""
    if "error" in row:
        return row
    scores = {name: score(row["model"], xs, refs) for name, (xs, refs) in sets.items()}
    return {**row, **scores, **count_graph(row["model"]), **costs.of(row["model"])}


def table(rows: list[dict]) -> str:
    """The markdown table of the measured rows."""
    head = ("| run | held mean | held worst | eval mean (own) | GEMM int8 | int16 | fp16 | float32 | quantizers > 8 bit "
            "| est. ms | ms x int16 | FLOP cost x int8 | x int16 | wall s | cpu s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['run']} | error: {r['error'][:200]} |")
            continue
        g, tuned = r["gemm"], r.get("tuning_mean_cosine")
        lines.append(f"| {r['run']} | {r['held']['mean']:.4f} | {r['held']['worst']:.4f} | {r['eval']['mean']:.4f} ("
                     + (f"{tuned:.4f}" if tuned is not None else "-") + ")"
                     + f" | {g['int8']} | {g['int16']} | {g['fp16']} | {g['float32']} | "
                     f"{r['quantizers_above_8_bit']} of {r['quantizers']} | {r['ms']:.2f} | {r['ms_x_int16']:.3f} | "
                     f"{r['x_int8']:.3f} | {r['x_int16']:.3f} | "
                     + " | ".join(f"{r[k]:.0f}" if r.get(k) is not None else "-" for k in ("wall_s", "cpu_s")) + " |")
    return "\n".join(lines)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="qir,nncf,aimet",
                   help="tools or runs to run: qir (the four qir runs), qir+float, qir+worst, qir+worst+float, "
                   "nncf, aimet, nncf-full, aimet-full")
    p.add_argument("--model", default="ppocrv4_det", choices=list(MODELS), help="the model (default: %(default)s)")
    p.add_argument("--out", default="tune_peers_out", help="output folder (default: %(default)s)")
    p.add_argument("--data", default=None, help="folder for the data and models (default: a temp dir)")
    p.add_argument("--reuse", action="store_true", help="skip a run whose model.onnx and result.json exist")
    p.add_argument("--time-limit", type=float, default=None, help="stop a run after S seconds (wall; its row says so)")
    p.add_argument("--check", action="store_true", help="only check the counting and the cost on known answers")
    p.add_argument("--target-cosine", type=float, default=0.99, help="mean cosine to reach on the eval images")
    p.add_argument("--eval-num", type=int, default=None, help="only the first N eval images (cheap runs)")
    p.add_argument("--march", default="nash-e", help="march of qir's runs and of the cost (default: %(default)s)")
    p.add_argument("--worst", type=float, default=0.98, help="the floor of qir+worst for every eval image "
                   "(default: %(default)s)")
    p.add_argument("--peers-python", default="/work/peers-venv/bin/python", help="Python with nncf and aimet-onnx")
    for name in RUNS:
        p.add_argument(f"--{name.replace('+', '-')}-args", default="", help=f"extra options for the {name} script")
    args = p.parse_args(argv)
    runs = [r for item in args.only.split(",") for r in TOOLS.get(item.strip(), [item.strip()])]
    unknown = [r for r in runs if r not in RUNS]
    if unknown:
        p.error(f"--only: unknown {', '.join(unknown)}; choose from {', '.join([*TOOLS, *RUNS])}")
    args.runs = list(dict.fromkeys(runs))
    args.extra = {name: getattr(args, f"{name.replace('+', '_').replace('-', '_')}_args").split() for name in RUNS}
    if MODELS[args.model][4]:  # a transformer: NNCF's full pipeline has SmoothQuant
        args.extra["nncf-full"] = ["--model-type", "transformer", *args.extra["nncf-full"]]
    for name in TOOLS["qir"]:
        args.extra[name] = [*args.extra[name], "--march", args.march]
        if "worst" in name:
            args.extra[name] += ["--worst", str(args.worst)]
    return args


def main(argv=None) -> None:
    args = parse(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.data or tmp) / ("" if args.model == "ppocrv4_det" else args.model)  # (det: as before)
        folder.mkdir(parents=True, exist_ok=True)
        data, models = build_data(folder, args.model), build_models(folder, args.model)
        if args.check:
            return self_check(models, data, Costs(models["static"], args.march), out, MODELS[args.model][0])
        sets = {}
        for name, limit in (("held", None), ("eval", args.eval_num)):
            xs = [np.load(p) for p in sorted(data[name].glob("*.npy"))[:limit]]
            sets[name] = (xs, held_outputs(models["static"], xs))
        rows = [{"run": "float", "model": str(models["static"]), "wall_s": None}]
        rows += [{**run(name, models, data, out, args), "run": name} for name in args.runs]
        costs = Costs(models["static"], args.march)
        rows = [measure(r, sets, costs) for r in rows]
    text = table(rows)
    print(text)
    (out / "tune_peers.md").write_text(text + "\n")
    summary = {"model": args.model, "target_cosine": args.target_cosine, "march": args.march, "rows": rows}
    (out / "tune_peers.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(f"written: {out / 'tune_peers.md'}, {out / 'tune_peers.json'}")


if __name__ == "__main__":
    main()
