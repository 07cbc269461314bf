"""The ONNX node suite's counts (``test_onnx_node_suite.py``): each case records
``("onnx_node_suite", (runtime, excluded family or None))`` in its ``user_properties``, and
``("onnx_node_suite_refused", message)`` when qir refused it; the terminal summary adds the
outcomes up per runtime, so they show with ``pytest -q`` (and under xdist, where the reports
carry the properties back)."""
from __future__ import annotations

from collections import Counter

KEY = "onnx_node_suite"
REFUSED = "onnx_node_suite_refused"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    counts: dict[str, Counter] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            props = dict(getattr(report, "user_properties", ()))
            if getattr(report, "when", None) != "call" or KEY not in props:
                continue
            runtime, excluded = props[KEY]
            outcome = "failed" if report.failed else "refused" if REFUSED in props else "passed"
            counts.setdefault(runtime, Counter())[outcome] += 1
            counts[runtime][f"excluded {outcome}"] += excluded is not None
    if not counts:
        return
    terminalreporter.write_sep("-", "ONNX node test suite through qir.backend")
    for runtime, c in sorted(counts.items()):
        total = c["passed"] + c["refused"] + c["failed"]
        terminalreporter.write_line(
            f"{runtime}: {total} cases, {c['passed']} pass, {c['refused']} refused by qir before running, "
            f"{c['failed']} failed (wrong answer or error); in the excluded families {c['excluded passed']} pass, "
            f"{c['excluded refused']} refused")
