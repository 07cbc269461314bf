"""The one rule for written files (qir.tools.reports.output.Outputs), command by command: a user's
file named like an output is refused before any long work, with one clear error, and left as it
was; ``--force`` replaces it and nothing else; a full disk keeps the old file; nothing is created
before the inputs are read."""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

import qir
from qir.errors import OutputError
from qir.runtimes import base as runtime_base
from qir.tools.cli import main
from qir.tools.reports.output import Outputs

from ..conftest import DIGITS, DIGITS_DATA, NEEDS_TORCH

MODEL = str(DIGITS / "model.onnx")
DATA = str(DIGITS_DATA)
PRECIOUS = b"the user's own file, not written by qir"


@pytest.fixture(scope="module")
def calibrated(digits_calibrated_file) -> str:
    return digits_calibrated_file


@pytest.fixture(scope="module")
def torch_module(tmp_path_factory) -> str:
    pytest.importorskip("torch", reason=NEEDS_TORCH)
    path = tmp_path_factory.mktemp("module") / "net.py"
    path.write_text("import torch\n\ndef build():\n    return torch.nn.Sequential(torch.nn.Linear(4, 2))\n")
    return f"{path}:build"


# command -> (argv for an output location `out` (a folder), the planted file inside `out`)
COMMANDS = {
    "dump": (lambda out, cal: ["dump", MODEL, "-o", f"{out}/m.qir.txt"], "m.qir.txt"),
    "run": (lambda out, cal: ["run", MODEL, DATA, "--limit", "2", "-o", f"{out}/o.npz"], "o.npz"),
    "calibrate": (lambda out, cal: ["calibrate", MODEL, DATA, "-o", f"{out}/c.onnx"], "c.onnx"),
    "calibrate model check": (lambda out, cal: ["calibrate", MODEL, DATA, "-o", f"{out}/c.onnx"],
                              "c.check.txt"),
    "calibrate --dump-dir": (lambda out, cal: ["calibrate", MODEL, DATA, "-o", f"{out}/c.onnx", "--dump-dir",
                                               f"{out}/dumps"], "dumps/002_fuse.qir.txt"),
    "pipeline": (lambda out, cal: ["pipeline", cal, "set-mode{nodes='conv2',mode=int16}", "-o", f"{out}/p.onnx"],
                 "p.onnx"),
    "pipeline emit step": (lambda out, cal: ["pipeline", cal, f"emit{{path='{out}/q.onnx'}}", "-o",
                                             f"{out}/p.onnx"], "q.onnx"),
    "set-mode": (lambda out, cal: ["set-mode", cal, "-o", f"{out}/s.onnx", "--nodes", "conv2", "--mode", "int16"],
                 "s.onnx"),
    "emit": (lambda out, cal: ["emit", cal, "-o", f"{out}/e.onnx", "--float", "fc"], "e.onnx"),
    "evaluate": (lambda out, cal: ["evaluate", cal, DATA, "-o", str(out), "--data-num", "2", "--quiet",
                                   "--runtime", "numpy"], "variants.csv"),
    "sensitivity": (lambda out, cal: ["sensitivity", cal, DATA, "-s", str(out), "--runtime", "numpy"],
                    "node_sensitivity.csv"),
    "acc-error": (lambda out, cal: ["acc-error", cal, DATA, "-q", "['conv2']", "-s", str(out)], "acc_error.json"),
    "distribution": (lambda out, cal: ["distribution", cal, DATA, "--nodes-list", "conv2", "-s", str(out)], "conv2.png"),
    "channelwise": (lambda out, cal: ["channelwise", cal, DATA, "--nodes-list", "conv2.weight_calib", "-s", str(out)],
                    "channelwise.txt"),
    "sensitivity-analysis": (lambda out, cal: ["sensitivity-analysis", cal, DATA, "-sn", "['conv2']", "-s",
                                               str(out)], "sensitivity_analysis.csv"),
    "runall": (lambda out, cal: ["runall", cal, DATA, "-s", str(out), "--runtime", "numpy"],
               "accumulate_error/acc_error.csv"),
    "runall top node": (lambda out, cal: ["runall", cal, DATA, "-s", str(out), "--runtime", "numpy"],
                        "data_distribution/relu1_out_calib.png"),
    "check": (lambda out, cal: ["check", cal, "-s", str(out)], "model_check_result.json"),
    "profile": (lambda out, cal: ["profile", cal, DATA, "-s", str(out), "-t", "Gemm", "--histograms"], "histograms/fc.png"),
    "bad-case": (lambda out, cal: ["bad-case", cal, DATA, "-n", "4", "-o", str(out)], "badcase.npz"),
    "compare": (lambda out, cal: ["compare", MODEL, cal, DATA, "-n", "4", "-o", str(out)], "compare.json"),
    "compare layers": (lambda out, cal: ["compare", MODEL, cal, DATA, "-n", "4", "-o", str(out), "--layers"],
                       "layers/baseline/0.npy"),
    "numeric-suite": (lambda out, cal: ["numeric-suite", MODEL, cal, DATA, "-n", "2", "-o", str(out)],
                      "numeric_suite.txt"),
    "import-torch": (None, "t.onnx"),
    "demo": (lambda out, cal: ["demo", "--runtime", "ort", "-o", str(out)], "repaired.onnx"),
}
# files a command may write: runall plots its most sensitive nodes, known only after its first
# step, so a file named after any calibration node is refused; --force rewrites only the chosen ones
MAY_WRITE = {"runall top node"}


def _argv(case: str, out: Path, calibrated: str, request) -> list[str]:
    build, _ = COMMANDS[case]
    if case == "import-torch":
        module = request.getfixturevalue("torch_module")
        return ["import-torch", module, "--example-shape", "1,4", "-o", f"{out}/t.onnx"]
    return build(out, calibrated)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


class _NoRuntime:
    def __init__(self, **options) -> None:
        raise AssertionError("a model ran before the outputs were checked")


@pytest.fixture
def no_runtime(monkeypatch):
    """Any model run fails loudly: what is refused must be refused before the long work."""
    monkeypatch.setattr(runtime_base, "RUNTIMES", {n: (__name__, "_NoRuntime") for n in runtime_base.RUNTIMES})


def _cases(names) -> list:
    """The command cases, ``import-torch`` marked as needing torch."""
    return [pytest.param(c, marks=pytest.mark.torch) if c == "import-torch" else c for c in names]


@pytest.mark.parametrize("case", _cases(COMMANDS))
def test_a_file_named_like_an_output_is_refused_before_any_work(case, calibrated, tmp_path, capsys, request,
                                                                no_runtime):
    out = tmp_path / "out"
    planted = out / COMMANDS[case][1]
    planted.parent.mkdir(parents=True)
    planted.write_bytes(PRECIOUS)
    argv = _argv(case, out, calibrated, request)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("qir: error: ") and err.count("\n") == 1, err
    assert str(planted) in err and "already exist" in err and "--force" in err
    assert _files(out) == {COMMANDS[case][1]: PRECIOUS}  # nothing else written, no folder created


@pytest.mark.parametrize("case", _cases(c for c in COMMANDS if c not in MAY_WRITE))
def test_force_replaces_the_output_and_touches_nothing_else(case, calibrated, tmp_path, capsys, request):
    out = tmp_path / "out"
    planted = out / COMMANDS[case][1]
    planted.parent.mkdir(parents=True)
    planted.write_bytes(PRECIOUS)
    (out / "notes.txt").write_bytes(PRECIOUS)
    assert main(_argv(case, out, calibrated, request) + ["--force"]) == 0, capsys.readouterr().err
    assert planted.read_bytes() != PRECIOUS and planted.stat().st_size > 0
    assert (out / "notes.txt").read_bytes() == PRECIOUS
    assert not [p for p in out.rglob(".*") if ".tmp" in p.name]  # no temporary file left


def test_one_error_lists_every_existing_output(calibrated, tmp_path, capsys, no_runtime):
    for name in ("node_sensitivity.txt", "node_sensitivity.json"):
        (tmp_path / name).write_bytes(PRECIOUS)
    assert main(["sensitivity", calibrated, DATA, "-s", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "2 files already exist" in err and "node_sensitivity.txt" in err and "node_sensitivity.json" in err
    assert "node_sensitivity.csv" not in err


def test_compare_leaves_layer_files_of_an_earlier_run_alone(calibrated, tmp_path):
    stale = tmp_path / "layers" / "baseline" / "999.npy"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(PRECIOUS)
    assert main(["compare", MODEL, calibrated, DATA, "-n", "2", "-o", str(tmp_path), "--no-sensitivity", "--layers"]) == 0
    assert stale.read_bytes() == PRECIOUS and (tmp_path / "layers" / "baseline" / "0.npy").exists()


def _full_disk(monkeypatch):
    """Every text write writes a few bytes, then fails as a full disk does."""
    def write_text(self, *args, **kwargs):
        with open(self, "w") as f:
            f.write("{trunc")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(Path, "write_text", write_text)


def test_a_full_disk_keeps_the_previous_results(calibrated, tmp_path, capsys, monkeypatch):
    assert main(["sensitivity", calibrated, DATA, "-s", str(tmp_path), "--runtime", "numpy"]) == 0
    before = _files(tmp_path)
    _full_disk(monkeypatch)
    assert main(["sensitivity", calibrated, DATA, "-s", str(tmp_path), "--runtime", "numpy", "--force"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"qir: error: cannot write {tmp_path / 'node_sensitivity.txt'}: No space left on device"
    assert _files(tmp_path) == before  # the old files intact, no temporary file left


def test_a_full_disk_keeps_the_previous_model(tmp_path, capsys, monkeypatch):
    import onnx

    model = tmp_path / "c.onnx"
    assert main(["calibrate", MODEL, DATA, "-o", str(model)]) == 0
    before = _files(tmp_path)

    def save(proto, path, *args, **kwargs):
        Path(path).write_bytes(proto.SerializeToString()[:53_000 // 10])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(onnx, "save", save)
    assert main(["calibrate", MODEL, DATA, "-o", str(model), "--method", "kl", "--force"]) == 2
    assert capsys.readouterr().err.strip() == f"qir: error: cannot write {model}: No space left on device"
    assert _files(tmp_path) == before


def test_a_read_only_output_folder_is_refused_before_calibrating(tmp_path, capsys, no_runtime):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("chmod does not deny writes here (running as root)")
        assert main(["calibrate", MODEL, DATA, "-o", str(folder / "sub" / "c.onnx")]) == 2
        err = capsys.readouterr().err
        assert "qir: error: cannot write in" in err and "permission denied" in err
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(stat.S_IRWXU)


@pytest.mark.parametrize("argv", [
    ["runall", "{cal}", "{missing}", "-s", "{out}"],
    ["sensitivity", "{cal}", "{missing}", "-s", "{out}"],
    ["compare", MODEL, "{cal}", "{missing}", "-o", "{out}"],
    ["evaluate", "{cal}", "{missing}", "-o", "{out}"],
    ["calibrate", MODEL, "{missing}", "-o", "{out}/c.onnx", "--dump-dir", "{out}/dumps"],
])
def test_missing_data_creates_no_folder(argv, calibrated, tmp_path, capsys):
    out, missing = tmp_path / "out", tmp_path / "no_data"
    argv = [a.format(cal=calibrated, missing=missing, out=out) for a in argv]
    assert main(argv) == 2
    assert "no_data" in capsys.readouterr().err
    assert not out.exists()


def test_outputs_checks_unplanned_writes_and_rewrites_its_own(tmp_path):
    (tmp_path / "a.txt").write_text("mine")
    out = Outputs(tmp_path)
    with pytest.raises(OutputError, match="a.txt already exists"):
        out.write_text("a.txt", "x")  # not planned: checked when written
    out.plan("b.txt", "sub/c.txt").check()
    out.write_text("b.txt", "1")
    out.sub("sub").write_text("c.txt", "2")
    out.check()  # a file the plan wrote is its own
    out.write_text("b.txt", "3")
    assert (tmp_path / "b.txt").read_text() == "3" and (tmp_path / "sub" / "c.txt").read_text() == "2"
    assert (tmp_path / "a.txt").read_text() == "mine"
    Outputs(tmp_path).plan("a.txt", replace=True).check().write_text("a.txt", "replaced")
    assert (tmp_path / "a.txt").read_text() == "replaced"


def _api_cases():
    from qir.tools.compat import hmct
    from qir.tools.compat.quant_analysis import compare
    from qir.tools.emit import emit_model
    from qir.tools.model_check import check_model
    from qir.tools.profiler import profile_model
    from qir.tools.runall import runall

    return {  # name -> (call writing into folder d, a file it writes there)
        "get_sensitivity_of_nodes": (lambda cal, d, **kw: hmct.get_sensitivity_of_nodes(cal, DATA, save_dir=d, **kw),
                                     "node_sensitivity.json"),
        "plot_acc_error": (lambda cal, d, **kw: hmct.plot_acc_error(DATA, cal, ["conv2"], save_dir=d, **kw),
                           "acc_error.csv"),
        "plot_distribution": (lambda cal, d, **kw: hmct.plot_distribution(d, cal, DATA, ["conv2"], **kw), "conv2.png"),
        "get_channelwise_data_distribution": (
            lambda cal, d, **kw: hmct.get_channelwise_data_distribution(d, cal, DATA, ["conv2.weight_calib"], **kw),
            "channelwise.json"),
        "sensitivity_analysis": (lambda cal, d, **kw: hmct.sensitivity_analysis(cal, DATA, save_dir=d, **kw),
                                 "partial_quantization.png"),
        "runall": (lambda cal, d, **kw: runall(cal, DATA, save_dir=d, log=lambda line: None, **kw), "index.html"),
        "profile_model": (lambda cal, d, **kw: profile_model(cal, DATA, save_dir=d, **kw), "statistic.txt"),
        "check_model": (lambda cal, d, **kw: check_model(cal, save_dir=d, **kw), "model_check_result.txt"),
        "compare": (lambda cal, d, **kw: compare(MODEL, cal, DATA, d, num_steps=2, **kw), "badcase.txt"),
        "emit_model": (lambda cal, d, **kw: emit_model(qir.load(cal), d / "e.onnx", **kw), "e.onnx"),
    }


@pytest.mark.parametrize("name", ["get_sensitivity_of_nodes", "plot_acc_error", "plot_distribution",
                                  "get_channelwise_data_distribution", "sensitivity_analysis", "runall",
                                  "profile_model", "check_model", "compare", "emit_model"])
def test_python_facades_refuse_an_existing_file_unless_overwrite(name, calibrated, tmp_path, monkeypatch):
    call, written = _api_cases()[name]
    (tmp_path / written).write_bytes(PRECIOUS)
    with monkeypatch.context() as m:
        m.setattr(runtime_base, "RUNTIMES", {n: (__name__, "_NoRuntime") for n in runtime_base.RUNTIMES})
        with pytest.raises(OutputError, match=f"{written} already exists.*overwrite=True"):
            call(calibrated, tmp_path)
    assert (tmp_path / written).read_bytes() == PRECIOUS
    if name in ("get_sensitivity_of_nodes", "check_model", "emit_model"):  # the fast ones: overwrite replaces
        call(calibrated, tmp_path, overwrite=True)
        assert (tmp_path / written).read_bytes() != PRECIOUS
