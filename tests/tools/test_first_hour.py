"""Issue 32, a newcomer's first hour, items 3, 7, 8 and 9: side files and suggested outputs named
after the output chosen and the tool, runall's sample default and --resume, compare's layers/
opt-in and HTML report, Ctrl-C not logged as done, the demo's lines true. On YOLOv8n where the
issue met them (``slow``)."""
from __future__ import annotations

import json
import logging
import re

import numpy as np
import pytest

from qir.tools.cli import main

from ..conftest import real_models

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def yolo(tmp_path_factory):
    """YOLOv8n, 2 real photos as data (npz), calibrated with max by the CLI: (folder, float model,
    data, calibrated model)."""
    rm = real_models()
    folder = tmp_path_factory.mktemp("yolo")
    data = folder / "calib.npz"
    np.savez(data, images=np.stack([rm.yolov8n_input(img) for img in rm.images(rm.CALIB)[:2]]))
    assert main(["calibrate", str(rm.model("yolov8n_320")), str(data), "-o", str(folder / "yolo_max.onnx")]) == 0
    return folder, rm.model("yolov8n_320"), data, folder / "yolo_max.onnx"


def test_a_second_calibration_in_the_same_folder_keeps_its_own_check(yolo, capsys):
    """Item 3: the model check is named after the model written, not model_check_result.*."""
    folder, model, data, _ = yolo
    assert main(["calibrate", str(model), str(data), "-o", str(folder / "yolo_max2.onnx")]) == 0
    assert f"{folder / 'yolo_max2.check.txt'}" in capsys.readouterr().out
    for stem in ("yolo_max", "yolo_max2"):
        assert json.loads((folder / f"{stem}.check.json").read_text())["schema"] == "qir.model_check"
    assert not (folder / "model_check_result.txt").exists()


def test_compare_names_its_fixes_in_order_bounds_layers_and_writes_a_report(yolo, capsys):
    """Items 3, 7, 9: fixes <stem>_compare_fix<k>.onnx numbered best first as printed; layers/ not
    written unless asked, its size said; index.html with headline, contents and the fixes first;
    compare_per_layer_out.txt at most 160 characters wide."""
    folder, model, data, calibrated = yolo
    out = folder / "cmp"
    assert main(["compare", str(model), str(calibrated), str(data), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    listed = printed[printed.index("fixes that help"):]
    names = re.findall(r"-o (\S+_compare_fix(\d+)\.onnx)", listed)
    assert names and [int(k) for _, k in names] == list(range(1, len(names) + 1)), listed
    gains = [float(g) for g in re.findall(r"\(([+-]\d\.\d+)\): qir", listed)]
    assert gains == sorted(gains, reverse=True)
    assert not (out / "layers").exists()
    size = re.search(r"per-layer values not kept \((\d+(?:\.\d+)?) MB; --layers", printed)
    assert size and float(size.group(1)) > 50, printed  # YOLOv8n at 320x320: ~119 MB
    assert max(len(line) for line in (out / "compare_per_layer_out.txt").read_text().splitlines()) <= 160
    page = (out / "index.html").read_text()
    assert page.index('id="headline"') < page.index('class="toc"') < page.index('id="fixes"') < page.index('id="findings"')
    assert "output cosine on the bad case" in page[:page.index('class="toc"')]
    assert all(name in page for name, _ in names)


def test_runall_takes_the_samples_that_fit_and_resumes_an_interrupted_run(yolo, capsys, monkeypatch):
    """Items 3, 7: without -dn, the first line says how many samples fit the time budget; a run
    stopped in step 4 leaves files a plain rerun refuses with a word on --resume, and --resume
    reads steps 1-3 back and finishes; its fixes are named <stem>_runall_fix<k>.onnx."""
    from qir.tools import runall as runall_module

    folder, _, data, calibrated = yolo
    out = folder / "ra"
    argv = ["runall", str(calibrated), str(data), "-s", str(out), "--time-budget", "1"]

    def interrupted(self, results):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(runall_module._Steps, "_acc_error", interrupted)
        assert main(argv) == 130  # Ctrl-C in step 4
    first = capsys.readouterr().out.splitlines()[0]
    assert re.match(r"runall: analysing 1 of 2 sample\(s\): as many as fit the time budget of 1 s", first), first
    assert main(argv) == 2
    assert "--resume continues it" in capsys.readouterr().err
    assert main([*argv, "--resume"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("read back from runall_state.json") == 3 and "[4/5] accumulated error" in printed
    advice = json.loads((out / "advice.json").read_text())["advice"]
    assert [a["output"] for a in advice] == [str(folder / f"yolo_max_runall_fix{k}.onnx")
                                             for k in range(1, len(advice) + 1)]
    page = (out / "index.html").read_text()
    assert page.index('id="headline"') < page.index('class="toc"') < page.index('id="fixes"')


def test_ctrl_c_during_calibration_is_not_logged_as_done(yolo, monkeypatch, caplog):
    """Item 8: a calibration stopped by Ctrl-C logs "stopped after", never "done"."""
    import qir
    from qir.passes import PassManager, get_pass
    from qir.runtimes import progress

    _, model, data, _ = yolo
    ir = qir.load(model, input_shapes={"images": [1, 3, 320, 320]})
    PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(ir)
    calls = []
    real = qir.passes.calibrate.check_feeds

    def feeds(ir, sample):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(ir, sample)

    monkeypatch.setattr(qir.passes.calibrate, "check_feeds", feeds)
    caplog.set_level(logging.INFO, "qir.progress")
    with progress.use_reporter(progress.log_reporter(delay=0)), pytest.raises(KeyboardInterrupt):
        get_pass("calibrate", data=data, method="max")(ir)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("calibrate (max)")]
    assert lines and not any("done" in line for line in lines), lines
    assert "calibrate (max): stopped after 1/2 samples" in lines[-1]


# ------------------------------------------------------------------ item 9 on the demo's case (digits, kl)
def test_runall_distributions_lead_with_the_clipping_and_agree_with_the_advice(tmp_path):
    """The clipped activation comes before the weight histograms; its plot's max |x| (calibrated
    and float input) is the advice's; a ReLU's values are drawn from 0."""
    import qir
    from qir.passes import PassManager, get_pass
    from qir.tools.reports.distribution import plot_overlay
    from qir.tools.runall import runall

    from ..conftest import DIGITS, DIGITS_DATA

    ir = qir.load(DIGITS / "model.onnx")
    PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(ir)
    get_pass("calibrate", data=DIGITS_DATA, method="kl", progress=False)(ir)
    model = tmp_path / "calibrated_kl.onnx"
    qir.save(ir, model)
    report = runall(str(model), str(DIGITS_DATA), save_dir=tmp_path / "ra", progress=False, log=lambda line: None)
    page = (tmp_path / "ra" / "index.html").read_text()
    dist = page[page.index('<section id="distributions">'):page.index('<section id="channelwise">')]
    titles = re.findall(r"<h3[^>]*>([^<(]+)", dist)
    kinds = [report["distribution"][t.strip()]["type"] for t in titles]
    clipped = [report["distribution"][t.strip()].get("clipped_fraction") or 0 for t in titles]
    assert kinds[0] == "activation" and clipped[0] == max(clipped) > 0.01 and "weight" not in kinds[:kinds.count("activation")]
    entry = report["distribution"]["relu2_out_calib"]
    legend = max(entry["input"]["abs_max"], entry["float_input"]["abs_max"])
    advice = next(f for f in report["advice"] if list(f["changes"] or {}) == ["relu2_out_calib"])
    assert f"max |x| {legend:.4g}" in advice["why"], (legend, advice["why"])
    fig = plot_overlay("relu", {"x": np.abs(np.random.default_rng(0).standard_normal(1000))}, 1.5, "x")
    assert fig.axes[0].get_xlim()[0] > -0.5  # from 0, not a symmetric axis half empty (about -4 before)


def test_compare_scores_a_named_branch_first_and_measures_fixes_on_it(yolo, capsys):
    """Item 6: YOLOv8n's one output hides its class scores. --values scores that branch beside
    the output, in the headline (worst first) and in every measured fix; a name the models lack is
    one error before any work."""
    folder, model, data, calibrated = yolo
    scores = "/model.22/Sigmoid_output_0"
    out = folder / "cmp_values"
    assert main(["compare", str(model), str(calibrated), str(data), "-o", str(out), "--no-sensitivity",
                 "--values", scores]) == 0
    printed = capsys.readouterr().out.splitlines()
    head = printed[0]
    assert head.startswith(f"outputs, worst first: {scores} cosine mean") and "output0 cosine mean" in head
    branch, whole = (float(re.search(rf"{re.escape(name)} cosine mean ([0-9.]+)", head).group(1))
                     for name in (scores, "output0"))
    assert branch < whole  # the branch scores worse than the output that concatenates it
    fixes = [line for line in printed if line.lstrip().startswith(("fix ", "tried "))]
    assert fixes and all(f"cosine of the outputs and {scores} on the bad case" in line for line in fixes)
    assert main(["compare", str(model), str(calibrated), str(data), "-o", str(folder / "x"), "--values",
                 "/model.22/Sigmoid_outpt_0"]) == 2
    err = capsys.readouterr().err
    assert "no value in the baseline named '/model.22/Sigmoid_outpt_0'; did you mean" in err
    assert not (folder / "x" / "badcase.txt").exists()
