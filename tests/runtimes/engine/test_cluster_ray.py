"""The engine and the bad-case search on a local Ray cluster (``ray.init(num_cpus=2)``): the same
results as the local executor, a worker killed mid-run (its shard re-run by Ray, no row missing
or twice), ``--cluster`` on the command line; a real model (slow). Skipped without Ray."""
from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import qir
from qir.passes.bad_case import find_bad_cases
from qir.runtimes.engine import RESULTS_FILE, Engine, Variant, distributed
from qir.tools.cli import main

from ...conftest import DIGITS_DATA, NEEDS_RAY, calibrated_real
from .cluster_cases import cluster_variants, dying, saved_rows

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray", reason=NEEDS_RAY)


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray cluster of two CPUs."""
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def calibrated_file(digits_calibrated_file):
    return Path(digits_calibrated_file)


def test_ray_gives_the_local_results(local_ray, calibrated_file, digits_calibrated, tmp_path):
    options = dict(metrics=["cosine-similarity", "mse"], data_num=4, progress=False)
    for ir in (qir.load(calibrated_file), digits_calibrated):  # sent as its file, and pickled
        variants = cluster_variants(ir)
        local = Engine(ir, DIGITS_DATA, **options).evaluate(variants)
        remote = Engine(ir, DIGITS_DATA, **options, cluster="ray").evaluate(variants, tmp_path / ir.name, force=True)
        assert remote.rows == local.rows
        assert remote.stats.shards == 2
        assert len(saved_rows(tmp_path / ir.name / RESULTS_FILE)) == len(local.rows)


def test_a_killed_worker_has_its_shard_rerun_without_a_row_missing_or_twice(local_ray, calibrated_file, tmp_path,
                                                                             monkeypatch):
    ir = qir.load(calibrated_file)
    variants = cluster_variants(ir)
    options = dict(metrics=["mse"], data_num=4, progress=False, reference="quantized")
    local = Engine(ir, DIGITS_DATA, **options).evaluate(variants)
    marker = tmp_path / "a_worker_died"
    # the first Ray worker (a process other than this one) to send rows dies; the fault travels by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[dying.__module__])
    monkeypatch.setattr(distributed, "engine_shard",
                        dying(distributed.engine_shard, marker, lambda driver=os.getpid(): os.getpid() != driver))
    remote = Engine(ir, DIGITS_DATA, **options, cluster="ray").evaluate(variants, tmp_path)
    assert marker.exists()  # a worker did die after sending rows
    assert remote.rows == local.rows
    rows = saved_rows(tmp_path / RESULTS_FILE)
    assert len(rows) == len({(r["variant"], r["sample"]) for r in rows}) == len(variants) * 4


def test_bad_case_search_on_ray(local_ray, calibrated_file):
    local = find_bad_cases(calibrated_file, None, DIGITS_DATA, num_steps=9)
    remote = find_bad_cases(calibrated_file, None, DIGITS_DATA, num_steps=9, cluster="ray")
    assert remote["values"] == local["values"] and remote["bad_case"] == local["bad_case"]


def test_cli_sensitivity_and_evaluate_with_cluster_ray(local_ray, calibrated_file, tmp_path, capsys):
    data = str(DIGITS_DATA)
    for where in ("here", "ray"):
        cluster = ["--cluster", "ray"] if where == "ray" else []
        assert main(["sensitivity", str(calibrated_file), data, "-d", "3", "-o", str(tmp_path / f"ns_{where}")]
                    + cluster) == 0
        assert main(["evaluate", str(calibrated_file), data, "--data-num", "3", "--each", "all", "--quiet",
                     "-o", str(tmp_path / f"ev_{where}")] + cluster) == 0
    capsys.readouterr()
    for name in ("ns_{}/node_sensitivity.csv", "ev_{}/variants.csv"):
        assert (tmp_path / name.format("ray")).read_text() == (tmp_path / name.format("here")).read_text()


def _written(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (its own path in them as ``OUT``); index.html without its time cell."""
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes().replace(str(folder).encode(), b"OUT")
        if path.name == "index.html":
            data = re.sub(rb"<th>time</th><td><code>[^<]*</code>", b"", data)
        out[str(path.relative_to(folder))] = data
    return out


def test_cli_bad_case_and_runall_with_cluster_ray(local_ray, calibrated_file, tmp_path, capsys):
    data = str(DIGITS_DATA)
    printed = {}
    for where in ("here", "ray"):
        cluster = ["--cluster", "ray"] if where == "ray" else []
        assert main(["bad-case", str(calibrated_file), data, "-n", "9", "-o", str(tmp_path / "bc" / where)]
                    + cluster) == 0
        assert main(["runall", str(calibrated_file), data, "-dn", "3", "-s", str(tmp_path / "ra" / where)]
                    + cluster) == 0
        printed[where] = capsys.readouterr().out.replace(where, "WHERE")
    assert printed["ray"] == printed["here"]
    for command in ("bc", "ra"):
        here, ray = _written(tmp_path / command / "here"), _written(tmp_path / command / "ray")
        assert ray.keys() == here.keys() and len(here) > 2
        assert [name for name in here if ray[name] != here[name] and not name.endswith(".npz")
                and name != "runall_state.json"] == []  # (resume bookkeeping: each run's own times)
    with np.load(tmp_path / "bc" / "here" / "badcase.npz") as a, np.load(tmp_path / "bc" / "ray" / "badcase.npz") as b:
        assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)


@pytest.mark.slow
def test_ray_gives_the_local_results_on_a_real_model(local_ray, tmp_path):
    ir, samples = calibrated_real("ppocr_cls", [1, 3, 48, 192])
    acts = [c.name for c in ir.calibrations("activation")]
    weights = [c.name for c in ir.calibrations("weight")]
    variants = [Variant(a, {a: "float"}) for a in acts[::3]] + [Variant(w, {w: "float"}) for w in weights[::6]]
    options = dict(reference="quantized", metrics=["cosine-similarity", "mse"], progress=False)
    local = Engine(ir, samples, **options).evaluate(variants)
    remote = Engine(ir, samples, **options, cluster="ray").evaluate(variants, tmp_path)
    assert remote.rows == local.rows
