"""``qir demo``: the main job on the bundled digits example, end to end, offline.

1. Load the model, verify and print the IR, run the 200 evaluation images on each runtime and
   report accuracy, time per sample and the agreement between runtimes.
2. Calibrate it for nash-e with every method on its 32 calibration images; report each int8
   model's accuracy and output cosine against float.
3. Debug the least accurate one: ``runall`` (every analysis and ``debug_result/index.html``).
4. Repair it: the sensitivity analysis's most sensitive nodes, just enough of them to reach the
   pick threshold, go back to float in an emitted ONNX model (``repaired.onnx``), whose
   accuracy is measured on the same images.
5. Check deployment: the most accurate int8 model at nash-e's integer level (what the NPU
   computes) on the same images, and fake quantization vs integer value by value
   (``consistency/consistency_result.{txt,json}``).

Files go to the output folder (``-o``), else to a new temporary folder whose path is printed.
Every file the demo writes is checked before it starts (:func:`plan_files`): none may exist
unless ``overwrite`` (``--force``); other files in the folder are left alone.
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

from qir.execution import Level, Runtime
from qir.graph import QIR

__all__ = ["run_demo", "example_dir", "plan_files", "Calibrated"]


class Calibrated(NamedTuple):
    """A model the demo calibrated, and its int8 accuracy on the evaluation samples."""

    model: QIR
    accuracy: float

METHODS = ("max", "percentile", "kl", "mse", "mix")


def example_dir() -> Path:
    """Folder of the bundled digits example (model, calibration and evaluation data)."""
    import qir.examples.digits as digits

    return Path(digits.__file__).resolve().parent


def plan_files(files, base, runtimes: list[str], *, saved: bool):
    """Plan on ``files`` (an :class:`~qir.tools.reports.output.Outputs`) every file the demo writes
    for the prepared model ``base``; ``saved``: the folder is the user's (``-o``), so the outputs,
    dumps and picture are written too. Returns ``files``."""
    from qir.tools.reports.consistency import FILES as CONSISTENCY_FILES
    from qir.tools.runall import plan_files as plan_runall

    files.plan(*(f"calibrated_{m}.onnx" for m in METHODS), "repaired.onnx")
    if saved:
        files.plan(*(f"outputs_{rt}.npz" for rt in runtimes), "model.qir.txt", "model.qir.json", "model.dot")
    plan_runall(files.sub("debug_result"), base, ["weight", "activation"])
    files.sub("consistency").plan(*CONSISTENCY_FILES)
    return files


def run_demo(out: Path | None, runtimes: list[str], *, overwrite: bool = False) -> int:
    import qir
    from qir.data import save_outputs
    from qir.passes import PassManager
    from qir.tools.progress import run_samples
    from qir.tools.reports.output import Outputs
    from qir.verify import verify

    root = example_dir()
    ir = qir.load(root / "model.onnx")
    base = ir.clone()
    PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(base)
    work = out if out is not None else Path(tempfile.mkdtemp(prefix="qir-demo-"))
    files = plan_files(Outputs(work, overwrite=overwrite), base, runtimes, saved=out is not None).check()
    problems = verify(ir)
    print(f"model   {root / 'model.onnx'}")
    print(f"ir      {ir!r}; verify: {'ok' if not problems else problems}")
    dump = str(ir).splitlines()
    shown = [line for line in dump if not line.startswith("  weight ")]
    print(f"dump    (weights omitted; the full text goes to {files.path('model.qir.txt')})" if out is not None
          else "dump    (weights omitted; with -o the full text goes to model.qir.txt)")
    print("\n".join("        " + line for line in shown))
    images = np.load(root / "eval_images.npy")
    labels = np.load(root / "eval_labels.npy")
    samples = [{"input": x} for x in images]
    logits = {}
    for rt in runtimes:
        start = time.perf_counter()
        results = run_samples(ir, samples, rt, desc=rt)
        per = (time.perf_counter() - start) / len(samples) * 1e3
        logits[rt] = np.concatenate([r["logits"] for r in results])
        acc = float((logits[rt].argmax(1) == labels).mean())
        print(f"{rt:<7} accuracy {acc:.4f} on {len(labels)} evaluation images, {per:.2f} ms/sample")
        if out is not None:
            files.write(f"outputs_{rt}.npz", lambda tmp, r=results: save_outputs(tmp, r))
    if len(logits) == 2:
        a, b = logits.values()
        rel = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))
        print(f"agree   numpy vs ort: max |diff| / max |ort| = {rel:.2e}")
    calibrated = calibrate_all(base, root, samples, labels, files)
    debug_and_repair(calibrated, root, samples, labels, files)
    check_deployment(calibrated, root, samples, labels, files)
    if out is not None:
        files.write_text("model.qir.txt", str(ir))
        files.write_text("model.qir.json", json.dumps(ir.to_json(), indent=1, allow_nan=False) + "\n")
        files.write_text("model.dot", ir.to_dot())
    print(f"wrote   {work}/ ({', '.join(written_entries(files))})")
    return 0


def written_entries(files) -> list[str]:
    """What the demo wrote in its folder, one entry per file or folder at its top (``debug_result/``)."""
    top = {p.relative_to(files.folder).parts[0] + ("/" if len(p.relative_to(files.folder).parts) > 1 else "")
           for p in files.written}
    return sorted(top, key=lambda e: (e.endswith("/"), e))


def debug_and_repair(calibrated: dict[str, Calibrated], root: Path, samples: list, labels: np.ndarray, files) -> None:
    """Steps 3 and 4 of the module docstring on the least accurate calibrated model."""
    import qir
    from qir.passes.sensitivity_analysis import SensitivityAnalysisReport
    from qir.tools.emit import emit_model
    from qir.tools.progress import run_samples
    from qir.tools.runall import runall

    method, (model, acc) = min(calibrated.items(), key=lambda kv: kv[1][1])
    print(f"debug   the {method} model ({acc:.4f}): runall")
    start = time.perf_counter()
    report = runall(model, root / "calibration_data", save_dir=files.sub("debug_result"), progress=False,
                    log=lambda line: print("        " + line), model_path=str(files.path(f"calibrated_{method}.onnx")))
    print(f"        {time.perf_counter() - start:.1f} s")
    sa = SensitivityAnalysisReport.from_json(report.sensitivity_analysis)
    nodes, cumulative = sa.nodes, sa.cumulative
    if not nodes:
        print("repair  nothing to repair: no node is below the pick threshold")
        return
    k = next((i for i, v in enumerate(cumulative[1:], 1) if v >= sa.pick_threshold), len(nodes))
    path = files.path("repaired.onnx")
    emit_model(model, "repaired.onnx", float=nodes[:k], outputs=files)
    repaired = qir.load(path)
    logits = np.concatenate([r["logits"] for r in run_samples(repaired, samples, Runtime.ORT, desc="repaired")])
    fixed = float((logits.argmax(1) == labels).mean())
    print(f"repair  {path.name}: the float fallback, the sensitivity analysis's ops {', '.join(nodes[:k])} back to "
          f"float (an emitted ONNX model): accuracy {acc:.4f} -> {fixed:.4f}")
    if report.advice:
        best = report.advice[0]
        print(f"        not runall's best measured fix, which is {best.cause}: {best.fix} (output cosine "
              f"{best.before:.5f} -> {best.after:.5f}; its command above writes {Path(best.output).name})")


def check_deployment(calibrated: dict[str, Calibrated], root: Path, samples: list, labels: np.ndarray, files) -> None:
    """Step 5 of the module docstring on the most accurate calibrated model."""
    from qir.tools.consistency import check_consistency
    from qir.tools.progress import run_samples

    method, (model, acc) = max(calibrated.items(), key=lambda kv: kv[1][1])
    logits = np.concatenate([r["logits"] for r in run_samples(model, samples, Runtime.NUMPY, desc=Level.INTEGER,
                                                               level=Level.INTEGER, march="nash-e")])
    integer = float((logits.argmax(1) == labels).mean())
    print(f"deploy  the {method} model at nash-e's integer level (what the NPU computes): accuracy {integer:.4f} "
          f"(fake quantization {acc:.4f})")
    report = check_consistency(model, root / "calibration_data", "nash-e", num=8, save_dir=files.sub("consistency"))
    print(f"        {report.summary}")
    print(f"        value by value: {files.path('consistency/consistency_result.txt')}")


def calibrate_all(base, root: Path, samples: list, labels: np.ndarray, files) -> dict[str, Calibrated]:
    """Calibrate a copy of ``base`` (folded, fused, with calibration nodes) with each method and
    write it to ``files``; print int8 accuracy and cosine vs float. Returns ``{method:
    Calibrated}``."""
    import qir
    from qir.passes import PassManager, PipelineContext
    from qir.tools.progress import run_samples

    reference = np.concatenate([r["logits"] for r in run_samples(base, samples, Runtime.ORT, desc="float",
                                                                  level="float")])
    results: dict[str, Calibrated] = {}
    print(f"calib   nash-e int8, {len(base.calibrations())} calibration nodes, "
          f"data {root / 'calibration_data'}")
    for method in METHODS:
        model = base.clone()
        PassManager(f"calibrate{{method={method},progress=False}}",
                    context=PipelineContext(data=root / "calibration_data")).run(model)
        logits = np.concatenate([r["logits"] for r in run_samples(model, samples, Runtime.ORT, desc=method)])
        acc = float((logits.argmax(1) == labels).mean())
        a, b = logits.reshape(-1).astype(np.float64), reference.reshape(-1).astype(np.float64)
        cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
        print(f"  {method:<11} int8 accuracy {acc:.4f}  logits cosine vs float {cos:.6f}")
        files.write(f"calibrated_{method}.onnx", lambda tmp, m=model: qir.save(m, tmp))
        results[method] = Calibrated(model, acc)
    return results
