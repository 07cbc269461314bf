"""The executor seam without a cluster: cluster addresses, shards run one after the other in this
process (``Cluster("serial")``, the path a Ray worker takes: an engine built from what is sent),
resume across executors, what is sent to workers, and the workers' warnings logged once."""
from __future__ import annotations

import json
import logging
import pickle
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import qir
from qir.errors import InputError
from qir.passes.bad_case import find_bad_cases
from qir.runtimes.engine import RESULTS_FILE, Engine, Variant, one_at_a_time
from qir.runtimes.engine.cluster import Cluster, current_cluster, parse_cluster, use_cluster
from qir.runtimes.engine.distributed import load_model, model_payload

from ...conftest import DIGITS_DATA, HAS_TORCH, NEEDS_TORCH, calibrate_for_nash_e
from .cluster_cases import cluster_variants, saved_rows


@pytest.fixture(scope="module")
def calibrated_file(digits_calibrated_file):
    return Path(digits_calibrated_file)


@pytest.mark.parametrize("text,expected", [
    (None, None), ("local", None), ("", None), ("torch", Cluster("torch")), ("auto", Cluster("ray", "auto")),
    ("ray", Cluster("ray")), ("ray://10.0.0.5:10001", Cluster("ray", "ray://10.0.0.5:10001")),
    ("ray://head-node:1", Cluster("ray", "ray://head-node:1"))])
def test_cluster_addresses(text, expected):
    assert parse_cluster(text) == expected


@pytest.mark.parametrize("text,words", [("ray://host", "ray://HOST:PORT"), ("ray://host:0", "1..65535"),
                                        ("ray://host:99999", "1..65535"), ("ray://:10001", "ray://HOST:PORT"),
                                        ("slurm", "unknown cluster"), ("http://host:8265", "unknown cluster")])
def test_a_bad_cluster_address_is_one_clear_error(text, words):
    with pytest.raises(InputError) as err:
        parse_cluster(text)
    message = str(err.value)
    assert words in message and "\n" not in message and repr(text) in message


@pytest.mark.parametrize("reference,mode", [("float", "int8"), ("quantized", "float")])
def test_shards_give_the_local_results(digits_calibrated, reference, mode):
    ir = digits_calibrated
    variants = one_at_a_time(ir, mode, "all") + [Variant("pair", {ir.calibrations("activation")[1].name: "int16"})]
    options = dict(reference=reference, metrics=["cosine-similarity", "mse"], data_num=4, progress=False)
    local = Engine(ir, DIGITS_DATA, **options).evaluate(variants)
    sharded = Engine(ir, DIGITS_DATA, **options, cluster=Cluster("serial", shards=3)).evaluate(variants)
    assert sharded.rows == local.rows  # every number, bit for bit
    assert sharded.stats.shards == 3 and sharded.stats.cluster == "serial"


def test_resume_continues_any_executors_file_without_duplicates(digits_calibrated, tmp_path):
    ir = digits_calibrated
    variants = cluster_variants(ir)
    options = dict(metrics=["mse"], data_num=4, progress=False)
    local = Engine(ir, DIGITS_DATA, **options).evaluate(variants, tmp_path / "local")
    # an interrupted sharded run: its header and some rows, the last line half written
    Engine(ir, DIGITS_DATA, **options, cluster=Cluster("serial", shards=2)).evaluate(variants, tmp_path / "mixed")
    path = tmp_path / "mixed" / RESULTS_FILE
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:25]) + "\n" + lines[25][:17])
    # resumed here, then again on shards: nothing to do the second time
    resumed = Engine(ir, DIGITS_DATA, **options).evaluate(variants, tmp_path / "mixed", resume=True)
    again = Engine(ir, DIGITS_DATA, **options, cluster=Cluster("serial", shards=2)).evaluate(
        variants, tmp_path / "mixed", resume=True)
    assert resumed.rows == again.rows == local.rows
    rows = saved_rows(path)
    assert len(rows) == len({(r["variant"], r["sample"]) for r in rows}) == len(variants) * 4
    # and a local file resumed on shards after losing rows
    path = tmp_path / "local" / RESULTS_FILE
    path.write_text("\n".join(path.read_text().splitlines()[:9]) + "\n")
    sharded = Engine(ir, DIGITS_DATA, **options, cluster=Cluster("serial", shards=3)).evaluate(
        variants, tmp_path / "local", resume=True)
    assert sharded.rows == local.rows
    assert sorted(map(json.dumps, saved_rows(path))) == sorted(map(json.dumps, saved_rows(tmp_path / "mixed" / RESULTS_FILE)))


def test_the_model_is_sent_as_its_path_while_it_is_what_the_file_holds(calibrated_file, tmp_path):
    ir = qir.load(calibrated_file)
    payload = model_payload(ir)
    assert payload.path == str(calibrated_file.resolve()) and payload.pickle is None
    assert str(load_model(payload)) == str(ir)
    ir.set_calibration(ir.calibrations("activation")[0].name, mode="int16")  # changed: the IR itself is sent
    payload = model_payload(ir)
    assert payload.path is None and str(pickle.loads(payload.pickle)) == str(ir)
    assert model_payload(qir.load(calibrated_file).clone()).pickle is not None


def test_a_worker_refuses_a_model_file_other_than_the_drivers(calibrated_file, tmp_path):
    payload = model_payload(qir.load(calibrated_file))
    with pytest.raises(InputError, match="differs from the driver's"):
        load_model(replace(payload, sha1="0" * 40))
    with pytest.raises(InputError, match="is not on this worker"):
        load_model(replace(payload, path=str(tmp_path / "elsewhere.onnx")))


def test_an_engine_built_from_other_data_refuses_the_shard(calibrated_file, tmp_path):
    # a worker whose data path holds other samples than the driver's: the analysis fingerprint differs
    from qir.runtimes.engine.distributed import DataPayload, EngineCommon, EngineShard, engine_shard, engine_spec

    ir = qir.load(calibrated_file)
    engine = Engine(ir, DIGITS_DATA, data_num=2, progress=False)
    variants = one_at_a_time(ir, "int8")
    spec = engine_spec(engine, variants)
    other = tmp_path / "other.npy"
    np.save(other, np.zeros((2, 1, 1, 8, 8), np.float32))
    spec.data = DataPayload(path=str(other))
    shard = EngineShard(engine.fingerprint(variants, engine.data_digest()), [variants[0].name], [])
    with pytest.raises(InputError, match="analysis differs from the driver's"):
        list(engine_shard(EngineCommon(spec=spec), shard))


def test_workers_warnings_are_logged_once(digits_calibrated, digits_samples, caplog):
    samples = [digits_samples[0], {"input": np.full_like(digits_samples[1]["input"], np.nan)}, digits_samples[2]]
    variants = one_at_a_time(digits_calibrated, "int8")
    with caplog.at_level(logging.WARNING, logger="qir"):
        result = Engine(digits_calibrated, samples, progress=False, cluster=Cluster("serial", shards=3)).evaluate(variants)
    left_out = [r for r in caplog.records if "is left out" in r.getMessage()]
    assert len(left_out) == 1 and "sample 1" in left_out[0].getMessage()  # three shards each saw it
    assert result.left_out.keys() == {1} and {r["sample"] for r in result.rows} == {0, 2}


def test_use_cluster_sets_the_default_and_bad_case_search_shards_samples(digits_calibrated):
    ir = digits_calibrated
    assert current_cluster() is None
    local = find_bad_cases(ir, None, DIGITS_DATA, num_steps=7, runtime="numpy")
    with use_cluster(Cluster("serial", shards=3)) as cluster:
        assert current_cluster() is cluster
        sharded = find_bad_cases(ir, None, DIGITS_DATA, num_steps=7, runtime="numpy")
    assert current_cluster() is None
    assert sharded["values"] == local["values"] and sharded["bad_case"] == local["bad_case"]
    assert sharded["chosen"] == local["chosen"]


def test_the_engine_takes_a_cluster_from_use_cluster_unless_told(digits_calibrated):
    with use_cluster(Cluster("serial", shards=2)):
        assert Engine(digits_calibrated, DIGITS_DATA, data_num=1, progress=False).cluster == Cluster("serial", shards=2)
        assert Engine(digits_calibrated, DIGITS_DATA, data_num=1, progress=False, cluster="local").cluster is None


@pytest.mark.torch
def test_cluster_torch_outside_torchrun_is_one_clear_error(monkeypatch, digits_calibrated):
    pytest.importorskip("torch.distributed", reason=NEEDS_TORCH)
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(InputError, match="runs inside a torchrun job.*torchrun --nproc_per_node"):
        with use_cluster("torch"):
            pass


def test_an_ir_never_saved_is_sent_pickled():
    # an analysis of a freshly calibrated IR (never saved): the IR itself goes to the workers, pickled
    ir = calibrate_for_nash_e(qir.load(DIGITS_DATA.parent / "model.onnx"), DIGITS_DATA)
    assert model_payload(ir).path is None and model_payload(ir).pickle is not None


@pytest.mark.parametrize("cluster,words", [("ray://x", "ray://HOST:PORT"), ("slurm", "unknown cluster"),
                                           pytest.param("torch", "runs inside a torchrun job", marks=[
                                               pytest.mark.torch, pytest.mark.skipif(not HAS_TORCH, reason=NEEDS_TORCH)]),
                                           ("auto", "needs Ray: pip install")])
def test_cli_cluster_errors_are_one_line_before_any_work(cluster, words, calibrated_file, tmp_path, monkeypatch, capsys):
    from qir.tools.cli import main

    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(sys.modules, "ray", None)  # Ray not installed
    for command in (["sensitivity", str(calibrated_file), str(DIGITS_DATA), "-o"],
                    ["evaluate", str(calibrated_file), str(DIGITS_DATA), "-o"],
                    ["compare", str(calibrated_file), str(calibrated_file), str(DIGITS_DATA), "-o"]):
        out = tmp_path / command[0]
        assert main([*command, str(out), "--cluster", cluster]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("qir: error:") and words in err and "\n" not in err
        assert not out.exists()
