"""Size and render time of a report with the graph panel, in headless Chromium.

    python benchmarks/graph_report.py REPORT.html [REPORT.html ...] [--loads 5]

Per report: its size, the graph panel's share of it, the number of ops drawn, and over
``--loads`` loads in one browser the wall time from ``get`` until the panel has drawn every op
and the page's ``load`` event time (Navigation Timing), median and worst. Needs Chromium,
chromedriver and Selenium (the ``viz`` extra); runall's report of a model makes the input.
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "tools"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--loads", type=int, default=5)
    args = parser.parse_args()
    from browser import chromium, panel_state

    driver = chromium()
    try:
        for report in args.reports:
            text = report.read_text(encoding="utf-8")
            blob = re.search(r"<div class='qg'.*?class='qg-data'>.*?</script></div><script>.*?</script>", text, re.S)
            walls, loads, drawn = [], [], 0
            for _ in range(args.loads):
                started = time.perf_counter()
                driver.get(report.resolve().as_uri())
                drawn = int(panel_state(driver)["drawn"])
                walls.append(time.perf_counter() - started)
                loads.append(driver.execute_script("return performance.getEntriesByType('navigation')[0].loadEventEnd"))
            print(f"{report}: {report.stat().st_size / 1e6:.2f} MB (panel {len(blob.group(0)) / 1e6 if blob else 0:.2f} MB), "
                  f"{drawn} ops drawn; wall to drawn: median {statistics.median(walls):.2f} s, worst {max(walls):.2f} s; "
                  f"load event: median {statistics.median(loads):.0f} ms, worst {max(loads):.0f} ms")
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
