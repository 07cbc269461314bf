"""Progress shown to a person: tqdm bars on a terminal, log lines (shown by the command line)
otherwise."""
from __future__ import annotations

import io
import logging
import sys

import qir
from qir.passes.bad_case import find_bad_cases
from qir.runtimes import progress as library_progress
from qir.tools import progress
from qir.tools.cli import main

from ..conftest import DIGITS_DATA


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_tqdm_bar(digits_calibrated, monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(progress, "DELAY", 0.0)
    progress.install()  # (what importing qir.tools does)
    find_bad_cases(digits_calibrated, None, DIGITS_DATA, num_steps=3, runtime="numpy")
    shown = terminal.getvalue()
    assert "bad-case search:" in shown and "/3 [" in shown and "samples/s" in shown  # a tqdm bar: count, rate


def test_the_command_line_off_a_terminal_logs_progress_lines(digits_calibrated, tmp_path, monkeypatch, caplog):
    model = tmp_path / "calibrated.onnx"
    qir.save(digits_calibrated, model)
    monkeypatch.setattr(library_progress, "DELAY", 0.0)
    caplog.set_level(logging.WARNING)  # the root logger at the command line's level ...
    caplog.handler.setLevel(logging.INFO)  # ... and the capture open to whatever gets through
    assert main(["sensitivity", str(model), str(DIGITS_DATA), "--node-type", "activation", "--save-dir",
                 str(tmp_path / "ns"), "--runtime", "numpy"]) == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "qir.progress"]
    assert any(line.startswith("node sensitivity (activation): ") and "ETA" in line for line in lines)
    assert not isinstance(sys.stderr, _Terminal)


def test_drawing_the_plots_reports_progress(digits_calibrated, tmp_path, monkeypatch, caplog):
    from qir.passes import get_pass
    from qir.tools.reports import channelwise, distribution

    monkeypatch.setattr(library_progress, "DELAY", 0.0)
    nodes = [c.name for c in digits_calibrated.calibrations("activation")][:2]
    with library_progress.use_reporter(library_progress.LogProgress), caplog.at_level(logging.INFO, "qir.progress"):
        distribution.write_report(get_pass("distribution", data=DIGITS_DATA, nodes_list=nodes, runtime="numpy")(
            digits_calibrated), tmp_path / "d")
        channelwise.write_report(get_pass("channelwise", data=DIGITS_DATA, nodes_list=nodes, runtime="numpy")(
            digits_calibrated), tmp_path / "c")
    lines = [r.getMessage() for r in caplog.records if r.name == "qir.progress"]
    assert any(line.startswith("plot distributions: 1/2 plots") for line in lines)
    assert any(line.startswith("channel box plots: 1/2 plots") for line in lines)
