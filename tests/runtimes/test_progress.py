"""Progress of long work in the library: log lines with count, elapsed time and ETA (the default
reporter, what a run without a terminal shows), nothing for short tasks, and every long step of
the analyses reporting."""
from __future__ import annotations

import logging

import pytest

from qir.passes import get_pass
from qir.passes.bad_case import find_bad_cases
from qir.runtimes import progress as P

from ..conftest import DIGITS_DATA


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "qir.progress"]


def test_log_lines_come_after_the_delay_then_every_interval(monkeypatch, caplog):
    clock = [100.0]
    monkeypatch.setattr(P.time, "perf_counter", lambda: clock[0])
    with caplog.at_level(logging.INFO, logger="qir.progress"):
        with P.LogProgress("work", 10, "items", delay=2, interval=5) as t:
            for step, n in ((1.0, 1), (1.5, 1), (1.0, 1), (4.5, 2)):
                clock[0] += step
                t.update(n)
        with P.LogProgress("quick", 3, "items", delay=2, interval=5) as t:
            clock[0] += 1.0
            t.update(3)  # done within the delay: says nothing
    # 2 done after 2.5 s: 8 more at 1.25 s each; then 5 done after 8 s: 5 more at 1.6 s each; closed at
    # 5 of 10: stopped, not done (issue 32 item 8)
    assert _lines(caplog) == ["work: 2/10 items (20%), 2.5 s, ETA 10 s", "work: 5/10 items (50%), 8.0 s, ETA 8 s",
                              "work: stopped after 5/10 items in 8.0 s"]


def test_every_long_step_reports_progress(digits_calibrated, digits_samples, monkeypatch, caplog):
    ir = digits_calibrated
    monkeypatch.setattr(P, "DELAY", 0.0)
    monkeypatch.setattr(P, "INTERVAL", 0.0)
    with P.use_reporter(P.LogProgress), caplog.at_level(logging.INFO, logger="qir.progress"):
        get_pass("calibrate", data=DIGITS_DATA, method="max", limit=3)(ir.clone())
        get_pass("node-sensitivity", data=DIGITS_DATA, data_num=2, node_type="activation", runtime="numpy")(ir)
        get_pass("distribution", data=DIGITS_DATA, nodes_list=["conv2"], data_num=2, runtime="numpy")(ir)
        find_bad_cases(ir, None, DIGITS_DATA, num_steps=3, runtime="numpy")
        get_pass("layer-compare", sample=digits_samples[0], runtime="numpy")(ir)
    lines = _lines(caplog)
    steps = {line.split(":")[0] for line in lines}
    assert {"calibrate (max)", "node sensitivity (activation)", "capture calibrated", "capture float",
            "bad-case search", "layer shadows", "layer comparison"} <= steps
    runs = len(ir.calibrations("activation")) * 2
    assert f"node sensitivity (activation): {runs}/{runs} runs (100%)" in " ".join(lines)
    assert any("ETA" in line for line in lines)


def test_progress_off_is_silent(digits_calibrated, monkeypatch, caplog):
    monkeypatch.setattr(P, "DELAY", 0.0)
    with P.use_reporter(P.LogProgress), caplog.at_level(logging.INFO, logger="qir.progress"):
        get_pass("node-sensitivity", data=DIGITS_DATA, node_type="activation", runtime="numpy",
                 progress=False)(digits_calibrated)
    assert _lines(caplog) == []


@pytest.mark.parametrize("total", [None, 4])
def test_track_counts_every_item(total, monkeypatch, caplog):
    monkeypatch.setattr(P, "DELAY", 0.0)
    with P.use_reporter(P.LogProgress), caplog.at_level(logging.INFO, logger="qir.progress"):
        assert list(P.track(iter(range(4)), "items", total=total)) == [0, 1, 2, 3]
    assert _lines(caplog)[-1].startswith("items: done, 4 it")
