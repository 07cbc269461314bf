"""Every analysis writes its graph overlays as Model Explorer node data beside its JSON (runall,
compare, tune, consistency against fake quantization and against onnxruntime), keyed by the node
ids Model Explorer's ONNX adapter shows, with the worst node first by the file's own colour scale,
and that node is the one the analysis's own JSON names worst; ``qir view`` finds every file. On
the digits model with one quantizer clipping hard (its threshold / 40). Without the viz extra
the same commands write the same reports and no node data."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import qir
from qir.passes import PassManager, get_pass
from qir.tools.cli import main
from qir.tools.reports import model_explorer
from qir.tools.reports.graph_panel import SCALE, ModelGraph
from qir.tools.runall import runall

from ..conftest import DIGITS, DIGITS_DATA

VICTIM = "relu3_out_calib"


def viz(test):
    """Needs the viz extra: marked ``browser``, which CI's second pass runs with the extra installed."""
    return pytest.mark.browser(pytest.mark.skipif(not model_explorer.available(), reason=model_explorer.NEEDS_VIZ)(test))


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    """The digits model calibrated for nash-e with ``VICTIM`` clipping hard, saved as ``cal.onnx``."""
    ir = qir.load(DIGITS / "model.onnx")
    PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(ir)
    get_pass("calibrate", data=DIGITS_DATA, method="max", progress=False)(ir)
    victim = ir.calibration(VICTIM)
    victim.threshold = np.float32(float(victim.threshold) / 40)
    ir.touch()
    folder = tmp_path_factory.mktemp("faulty")
    qir.save(ir, folder / "cal.onnx")
    return folder, ir


def ranked(path: Path) -> tuple[str, list[str], dict[str, float]]:
    """A node data file's overlay name, its nodes worst first by its own gradient (the dark end
    is the worst) and their values."""
    (graph,) = json.loads(path.read_text()).values()
    values = {n: r["value"] for n, r in graph["results"].items()}
    smallest_worst = graph["gradient"][0]["bgColor"] == SCALE[-1]
    order = sorted(values, key=lambda n: values[n] if smallest_worst else -values[n])
    return graph["name"], order, values


def adapter_ids(model: Path) -> set[str]:
    from model_explorer_onnx.main import ONNXAdapter

    return {n.id for n in ONNXAdapter().convert(str(model), {})["graphs"][0].nodes}


def written(folder: Path) -> set[str]:
    return {p.stem for p in (folder / model_explorer.FOLDER).glob("*.json")}


@pytest.fixture(scope="module")
def runall_dir(faulty):
    folder, ir = faulty
    runall(ir, DIGITS_DATA, save_dir=folder / "runall", progress=False, log=lambda line: None, data_num=2)
    return folder / "runall"


@viz
def test_runall_writes_every_overlay_and_the_clipping_quantizers_op_ranks_first(faulty, runall_dir):
    folder, ir = faulty
    acc = json.loads((runall_dir / "accumulate_error" / "acc_error.json").read_text())
    sa = json.loads((runall_dir / "sensitivity_analysis" / "sensitivity_analysis.json").read_text())
    expected = {"sensitivity", "sensitivity_weight", "sensitivity_activation", "clipping", "sensitivity_analysis",
                *(f"acc_error_{c}" for c in acc["curves"])}
    assert written(runall_dir) == expected
    readers = set(ir.calibration(VICTIM).feeds)
    ids = adapter_ids(folder / "cal.onnx")
    for key in expected:
        name, order, values = ranked(runall_dir / model_explorer.FOLDER / f"{key}.json")
        assert set(values) <= ids, key  # keyed by the node ids Model Explorer shows
    assert ranked(runall_dir / "model_explorer" / "sensitivity.json")[1][0] in readers
    assert ranked(runall_dir / "model_explorer" / "clipping.json")[1][0] in readers
    name, order, values = ranked(runall_dir / "model_explorer" / "sensitivity_analysis.json")
    assert values == pytest.approx(sa["single"]) and order[0] in readers  # each picked op alone
    for curve, points in acc["curves"].items():  # each curve's worst point, as acc_error.json has it
        name, order, values = ranked(runall_dir / "model_explorer" / f"acc_error_{curve}.json")
        worst = min(v for v in points if v is not None)
        assert values[order[0]] == pytest.approx(worst) and name == f"accumulated error: {curve}"


@viz
def test_compare_writes_its_layer_sensitivity_and_consistency_overlays(faulty):
    folder, ir = faulty
    out = folder / "compare"
    assert main(["compare", str(DIGITS / "model.onnx"), str(folder / "cal.onnx"), str(DIGITS_DATA), "-o", str(out),
                 "-d", "4", "-m", "cosine", "--consistency"]) == 0
    keys = {"layer_cosine", "layer_clipping", *(f"op_sensitivity_{o}" for o in ir.outputs), "consistency_step",
            "consistency_cosine"}
    assert written(out) == keys
    ids = adapter_ids(folder / "cal.onnx")
    rows = json.loads((out / "compare_per_layer_out.json").read_text())["rows"]
    name, order, values = ranked(out / "model_explorer" / "layer_cosine.json")
    assert set(values) <= ids and name == "layer output cosine"
    assert values[order[0]] == pytest.approx(min(r["Cosine"] for r in rows), rel=1e-6)  # compare's own worst layer
    sens = json.loads((out / "sensitive_ops.json").read_text())
    for output, srows in sens["outputs"].items():  # every op's sensitivity, not only the summary's top 10
        name, order, values = ranked(out / "model_explorer" / f"op_sensitivity_{output}.json")
        metric = next(k for k in srows[0] if k.lower().startswith("cos"))
        assert set(values) == {r["op_name"] for r in srows} & {o.name for o in ir.ops()}  # ("input": no op)
        assert values[order[0]] == pytest.approx(min(r[metric] for r in srows), rel=1e-6)


@viz
def test_consistency_writes_the_integer_deviation_with_its_largest_step_first(faulty):
    folder, ir = faulty
    out = folder / "consistency"
    assert main(["consistency", str(folder / "cal.onnx"), str(DIGITS_DATA), "-o", str(out), "-d", "2"]) == 0
    assert written(out) == {"consistency_step", "consistency_cosine"}
    rows = json.loads((out / "consistency_result.json").read_text())["rows"]
    name, order, values = ranked(out / "model_explorer" / "consistency_step.json")
    assert set(values) <= adapter_ids(folder / "cal.onnx")
    assert values[order[0]] == max(r["own_max_step"] for r in rows) > 0
    assert order[0] in {r["op"] for r in rows if r["own_max_step"] == values[order[0]]}
    name, order, values = ranked(out / "model_explorer" / "consistency_cosine.json")
    assert values[order[0]] == pytest.approx(min(r["cosine"] for r in rows))


@viz
def test_consistency_against_onnxruntime_writes_each_ops_departure(tmp_path):
    pytest.importorskip("onnxruntime.quantization")
    from ..qir.io.test_qdq_import import clip_model, clip_samples, quantize

    qdq = quantize(clip_model(tmp_path / "clip.onnx"), tmp_path / "clip_qdq.onnx", clip_samples(8), per_channel=False)
    data = tmp_path / "data" / "x"
    data.mkdir(parents=True)
    for i, sample in enumerate(clip_samples(2, seed=3)):
        np.save(data / f"{i}.npy", sample["x"])
    out = tmp_path / "out"
    assert main(["consistency", str(qdq), str(tmp_path / "data"), "--against", "ort", "-d", "2", "-o", str(out)]) == 0
    assert written(out) == {"ort_step"}
    saved = json.loads((out / "ort_consistency.json").read_text())
    name, order, values = ranked(out / "model_explorer" / "ort_step.json")
    assert set(values) <= adapter_ids(qdq) and set(values) == {v["op"] for v in saved["values"] if v["op"]}
    assert values[order[0]] == max(v["own_max_step"] for v in saved["values"])


@viz
def test_tune_writes_the_precision_it_chose_and_each_units_loss(tmp_path):
    evals = tmp_path / "eval" / "input"
    evals.mkdir(parents=True)
    for i, x in enumerate(np.load(DIGITS / "eval_images.npy")[:30]):
        np.save(evals / f"{i}.npy", x)
    out = tmp_path / "tuned"
    assert main(["tune", str(DIGITS / "model.onnx"), str(DIGITS_DATA), "--eval", str(evals.parent), "--target",
                 "cosine>=0.9999", "-s", str(out), "--method", "kl", "--quiet"]) == 0
    assert written(out) == {"precision", "tune_sensitivity"}
    report = json.loads((out / "tune_report.json").read_text())
    tuned = qir.load(out / "tuned_model.onnx")
    ids = adapter_ids(out / "tuned_model.onnx")
    (graph,) = json.loads((out / "model_explorer" / "precision.json").read_text()).values()
    colours = {}
    for op, r in graph["results"].items():  # one colour per precision
        colours.setdefault(r["value"], set()).add(r["bgColor"])
    assert set(graph["results"]) <= ids and all(len(c) == 1 for c in colours.values())
    modes = {c.name: c.mode.value for c in tuned.calibrations()}
    feeds = ModelGraph.from_ir(tuned).op_of()
    raised = {op for q, m in modes.items() if m != "int8" for op in feeds.get(q, [])}
    high = {op for op, r in graph["results"].items() if r["value"] > 0}  # int8 is category 0 where it is used
    assert raised and high == raised
    name, order, values = ranked(out / "model_explorer" / "tune_sensitivity.json")
    first = report["sensitivity"]["rows"][0]  # the most sensitive unit: its op first
    assert set(values) <= ids and order[0] in feeds[first["unit"]]
    assert values[order[0]] == pytest.approx(max(r["loss"] for r in report["sensitivity"]["rows"]))


@viz
def test_qir_view_finds_every_analysis_node_data_lead_overlay_first(faulty, runall_dir, capsys):
    from qir.tools.cli.commands.view import _matched

    folder, _ = faulty
    found = model_explorer.node_data_files([runall_dir])
    assert found[0].name == "sensitivity.json" and {f.stem for f in found} == written(runall_dir)
    lines = _matched(folder / "cal.onnx", found)
    assert len(lines) == len(found)
    for line in lines:  # every node of every overlay is in the model
        hit, total = (int(x) for x in line.split(": ")[-1].split(" nodes")[0].split(" of "))
        assert hit == total > 0, line


def test_without_the_viz_extra_the_reports_are_written_and_no_node_data(faulty, tmp_path, monkeypatch):
    folder, ir = faulty
    monkeypatch.setattr(model_explorer, "available", lambda: False)
    assert main(["consistency", str(folder / "cal.onnx"), str(DIGITS_DATA), "-o", str(tmp_path / "c"), "-d", "1"]) == 0
    assert (tmp_path / "c" / "consistency_result.html").is_file() and not (tmp_path / "c" / "model_explorer").exists()
    runall(ir, DIGITS_DATA, save_dir=tmp_path / "r", progress=False, log=lambda line: None, data_num=1)
    assert (tmp_path / "r" / "index.html").is_file() and not (tmp_path / "r" / "model_explorer").exists()


PLANTED = {  # command -> (argv for the output folder `out`, a node data file it writes)
    "runall": (lambda out, cal: ["runall", cal, str(DIGITS_DATA), "-s", str(out)],
               "acc_error_weight_activation_calibrated.json"),
    "compare": (lambda out, cal: ["compare", str(DIGITS / "model.onnx"), cal, str(DIGITS_DATA), "-o", str(out)],
                "op_sensitivity_logits.json"),
    "consistency": (lambda out, cal: ["consistency", cal, str(DIGITS_DATA), "-o", str(out)], "consistency_step.json"),
    "tune": (lambda out, cal: ["tune", str(DIGITS / "model.onnx"), str(DIGITS_DATA), "--eval", str(DIGITS_DATA),
                               "--target", "cosine>=0.99", "-s", str(out)], "tune_sensitivity.json"),
}


class _NoRuntime:
    def __init__(self, **options) -> None:
        raise AssertionError("a model ran before the outputs were checked")


@viz
@pytest.mark.parametrize("command", PLANTED)
def test_a_users_file_named_like_node_data_is_refused_before_any_work(command, faulty, tmp_path, capsys, monkeypatch):
    from qir.runtimes import base as runtime_base

    folder, ir = faulty
    assert "logits" in ir.outputs
    argv, name = PLANTED[command]
    planted = tmp_path / "out" / model_explorer.FOLDER / name
    planted.parent.mkdir(parents=True)
    planted.write_text("mine")
    monkeypatch.setattr(runtime_base, "RUNTIMES", {n: (__name__, "_NoRuntime") for n in runtime_base.RUNTIMES})
    assert main(argv(tmp_path / "out", str(folder / "cal.onnx"))) == 2
    err = capsys.readouterr().err
    assert str(planted) in err and "already exist" in err and "Traceback" not in err
    assert [p for p in (tmp_path / "out").rglob("*") if p.is_file()] == [planted] and planted.read_text() == "mine"
