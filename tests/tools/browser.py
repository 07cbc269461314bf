"""Headless Chromium for the browser tests (marker ``browser``): Debian's ``chromium`` and
``chromium-driver`` driven by Selenium. :func:`chromium` skips with one clear line where any of
them is missing; .ci/run installs them where apt-get is available."""
from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

NEEDS_BROWSER = ("needs headless Chromium: apt-get install chromium chromium-driver, and selenium "
                 "(pip install -e '.[viz]')")


def _find(*names: str) -> str | None:
    return next((p for p in map(shutil.which, names) if p), None)


def chromium(width: int = 1400, height: int = 1000):
    """A headless Chromium WebDriver (the caller quits it), or skip. ``QIR_CHROMIUM`` and
    ``QIR_CHROMEDRIVER`` name the executables where they are not on the PATH."""
    binary = os.environ.get("QIR_CHROMIUM") or _find("chromium", "chromium-browser", "google-chrome")
    driver = os.environ.get("QIR_CHROMEDRIVER") or _find("chromedriver")
    if not (binary and driver and os.path.isfile(binary) and os.path.isfile(driver) and importlib.util.find_spec("selenium")):
        pytest.skip(NEEDS_BROWSER)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(driver))


PANEL_STATE = """
var root = document.querySelector('.qg');
var nodes = Array.from(root.querySelectorAll('svg.main g.n')).map(function (g) {
  return {name: g.getAttribute('data-node'), fill: g.querySelector('rect').getAttribute('fill'),
          t: g.getAttribute('data-t') === '' ? null : +g.getAttribute('data-t')};
});
return {drawn: root.getAttribute('data-drawn'), nodes: nodes, errors: window.__qgErrors || []};
"""


def panel_state(driver) -> dict:
    """The first graph panel as drawn: every node's name, fill and badness (0 best .. 1 worst)."""
    return driver.execute_script(PANEL_STATE)


def click_node(driver, name: str) -> None:
    """Click the node ``name`` in the first panel, found through the panel's search box (which
    centres the view on it), as a user would."""
    from selenium.webdriver.common.by import By

    root = driver.find_element(By.CSS_SELECTOR, ".qg")
    driver.execute_script("arguments[0].scrollIntoView()", root)
    box = root.find_element(By.CSS_SELECTOR, ".find")
    box.clear()
    box.send_keys(name)
    for g in root.find_elements(By.CSS_SELECTOR, "svg.main g.n"):
        if g.get_attribute("data-node") == name:
            g.click()
            return
    raise AssertionError(f"no node {name!r} drawn")
