"""The engine under ``torchrun --nproc_per_node=2`` (gloo on CPU): ``qir evaluate``, ``qir sensitivity``,
``qir compare`` and ``qir bad-case --cluster torch`` write what the local executor writes, printed once; a
rank that dies ends the job with one clear error and a results file that ``--resume`` completes; a real
model (slow)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import qir
from qir.runtimes.engine import RESULTS_FILE
from qir.tools.cli import main

from ...conftest import DIGITS_DATA, NEEDS_TORCH, calibrated_real
from .cluster_cases import saved_rows

pytestmark = pytest.mark.torch
pytest.importorskip("torch.distributed", reason=NEEDS_TORCH)

DATA = str(DIGITS_DATA)


DYING_RANK = Path(__file__).with_name("dying_rank.py")  # qir with a rank that dies (cluster_cases.dying)


def torchrun(args: list[str], env: dict | None = None, ranks: int = 2,
             program: list[str] = ("-m", "qir")) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node=RANKS PROGRAM ARGS --cluster torch`` (a free port of
    its own; PROGRAM ``-m qir``, or a script)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
               *program, *args, "--cluster", "torch"]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def calibrated_file(digits_calibrated_file):
    return digits_calibrated_file


def _untimed(text: str) -> str:
    return re.sub(r"in [0-9.]+ s \(peak RSS [0-9]+ MB\)", "in - s", text)


def _keyed(rows):
    return sorted(rows, key=lambda r: (r["variant"], r["sample"]))


def test_torchrun_writes_what_the_local_executor_writes(calibrated_file, tmp_path, capsys):
    evaluate = ["evaluate", calibrated_file, DATA, "--data-num", "4", "--each", "all", "--quiet", "-o"]
    sensitivity = ["sensitivity", calibrated_file, DATA, "-d", "4", "-m", "cosine-similarity,mse", "-o"]
    compare = ["compare", calibrated_file, calibrated_file, DATA, "-n", "6", "-o"]
    bad_case = ["bad-case", calibrated_file, DATA, "-n", "9", "-o"]
    for name, args in (("ev", evaluate), ("ns", sensitivity), ("qa", compare), ("bc", bad_case)):
        assert main([*args, str(tmp_path / f"{name}_here")]) == 0
        here = capsys.readouterr().out
        done = torchrun([*args, str(tmp_path / f"{name}_torch")])
        assert done.returncode == 0, done.stderr[-3000:]
        # rank 0 prints, the other rank does not (times and memory aside)
        assert _untimed(done.stdout.replace(f"{name}_torch", f"{name}_here")) == _untimed(here)
    assert _keyed(saved_rows(tmp_path / "ev_torch" / RESULTS_FILE)) == _keyed(saved_rows(tmp_path / "ev_here" / RESULTS_FILE))
    for name in ("ev_{}/variants.csv", "ns_{}/node_sensitivity.csv", "qa_{}/badcase.json", "qa_{}/sensitive_ops.json",
                 "bc_{}/badcase.json", "bc_{}/badcase.txt"):
        assert (tmp_path / name.format("torch")).read_text() == (tmp_path / name.format("here")).read_text()


def test_a_dead_rank_ends_the_job_with_a_clear_error_and_resume_completes_it(calibrated_file, tmp_path, capsys):
    args = ["evaluate", calibrated_file, DATA, "--data-num", "4", "--each", "all", "--quiet", "--reference", "quantized"]
    assert main([*args, "-o", str(tmp_path / "here")]) == 0
    capsys.readouterr()
    marker = tmp_path / "a_rank_died"
    done = torchrun([*args, "-o", str(tmp_path / "torch")], env={"QIR_TEST_DYING_MARKER": str(marker)},
                    program=[str(DYING_RANK)])
    assert done.returncode != 0 and marker.exists()
    errors = [line for line in done.stderr.splitlines() if line.startswith("qir: error:")]
    assert len(errors) == 1, done.stderr[-3000:]
    assert "torchrun" in errors[0] and "--resume" in errors[0] and RESULTS_FILE in errors[0]
    kept = saved_rows(tmp_path / "torch" / RESULTS_FILE)
    expected = saved_rows(tmp_path / "here" / RESULTS_FILE)
    assert 0 < len(kept) < len(expected)
    done = torchrun([*args, "-o", str(tmp_path / "torch"), "--resume"])
    assert done.returncode == 0, done.stderr[-3000:]
    rows = saved_rows(tmp_path / "torch" / RESULTS_FILE)
    assert _keyed(rows) == _keyed(expected)  # none missing, none twice
    assert (tmp_path / "torch" / "variants.csv").read_text() == (tmp_path / "here" / "variants.csv").read_text()


def test_sigterm_while_rank_0_handles_a_message_ends_in_the_clear_error():
    """torchrun stops every rank with SIGTERM when one dies; the signal may come while rank 0 is busy
    with a message, outside the loop that waits for them: the loop still raises the clear error."""
    import queue
    import signal

    from qir.errors import ExecutionError
    from qir.runtimes.engine.torch_cluster import TorchExecutor

    before = signal.getsignal(signal.SIGTERM)
    messages = queue.Queue()
    messages.put((1, ("rows", [])))
    follow = TorchExecutor._follow(TorchExecutor.__new__(TorchExecutor), messages, 2)
    assert next(follow) == (1, ("rows", []))
    os.kill(os.getpid(), signal.SIGTERM)  # (while this test, the consumer, runs)
    with pytest.raises(ExecutionError, match="torchrun job was stopped"):
        next(follow)
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is given back


@pytest.mark.slow
def test_torchrun_gives_the_local_results_on_a_real_model(tmp_path, capsys):
    ir, samples = calibrated_real("ppocr_cls", [1, 3, 48, 192])
    model = tmp_path / "cls.onnx"
    qir.save(ir, model)
    data = tmp_path / "data.npz"
    np.savez(data, **{f"{name}/{i}": s[name] for i, s in enumerate(samples) for name in s})
    args = ["evaluate", str(model), str(data), "--reference", "quantized", "--each", "all", "--quiet"]
    assert main([*args, "-o", str(tmp_path / "here")]) == 0
    capsys.readouterr()
    done = torchrun([*args, "-o", str(tmp_path / "torch")])
    assert done.returncode == 0, done.stderr[-3000:]
    assert _keyed(saved_rows(tmp_path / "torch" / RESULTS_FILE)) == _keyed(saved_rows(tmp_path / "here" / RESULTS_FILE))
