"""QuantAnalysis' multi-machine example as written (``quant_analysis_spawn_example.py``: the user's
``mp.spawn``, ``dist.init_process_group`` without torchrun, a ``DistributedSampler`` DataLoader per
rank) with qir's QuantAnalysis, on 2 processes (gloo): the files rank 0 writes equal those of one
process searching all the data; the other rank writes nothing."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ..conftest import NEEDS_TORCH

pytestmark = pytest.mark.torch
pytest.importorskip("torch.distributed", reason=NEEDS_TORCH)

from torch.utils.data import DataLoader, Subset  # noqa: E402

from qir.tools.compat.quant_analysis import QuantAnalysis  # noqa: E402

from .quant_analysis_spawn_example import ExampleDataset, load_models, make_checkpoints  # noqa: E402

SCRIPT = Path(__file__).with_name("quant_analysis_spawn_example.py")
SIZE, STEPS, RANKS = 40, 12, 2  # each rank searches its first 12 of 20: the dataset's first 24 samples


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _files(folder: Path) -> dict[str, Path]:
    return {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_seed_multi_machine_example_finds_what_one_process_finds_on_all_the_data(tmp_path):
    config = {"float_ckpt": str(tmp_path / "float.pt"), "calib_ckpt": str(tmp_path / "calib.pt")}
    make_checkpoints(config["float_ckpt"], config["calib_ckpt"])
    spawned, temp = tmp_path / "spawned", tmp_path / "tmp"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT")}
    done = subprocess.run([sys.executable, str(SCRIPT), "--nproc_per_node", str(RANKS), "--master_port",
                           str(_free_port()), "--output_dir", str(spawned), "--float_ckpt", config["float_ckpt"],
                           "--calib_ckpt", config["calib_ckpt"], "--dataset_size", str(SIZE), "--num_steps",
                           str(STEPS)], capture_output=True, text=True, timeout=600, env={**env, "TMPDIR": str(temp)})
    assert done.returncode == 0, done.stderr[-3000:]

    # one process, the same models, every sample the two ranks searched, in the dataset's order
    float_net, calib_net = load_models(config)
    one = tmp_path / "one"
    qa = QuantAnalysis(float_net, calib_net, analysis_model_type="fake_quant", out_dir=one)
    qa.auto_find_bad_case(data_generator=DataLoader(Subset(ExampleDataset(SIZE), range(RANKS * STEPS)), batch_size=1),
                          metric="ATOL")
    qa.run()
    qa.compare_per_layer()
    qa.sensitivity(metric="ATOL")

    report = json.loads((spawned / "badcase.json").read_text())
    assert report["samples"] == RANKS * STEPS and report["metric"] == "ATOL"
    # the bad cases come from both ranks' shares (odd samples are rank 1's)
    assert {i % RANKS for per in report["bad_case"].values() for i in per.values()} == {0, 1}
    here, there = _files(one), _files(spawned)
    assert sorted(there) == sorted(here) and "sensitive_ops.json" in there and "layers/layers.json" in there
    for name, path in here.items():
        if name.endswith(".npz"):  # zip entries carry the time they were written
            with np.load(path) as a, np.load(there[name]) as b:
                assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files), name
        else:
            assert path.read_bytes() == there[name].read_bytes(), name
    assert not list(temp.glob("qir-rank-*"))  # rank 1's own folder is gone with it


def test_horizon_keyword_names_and_their_errors(tmp_path):
    """``analysis_model_type`` names the level (and must agree with ``level``); ``data_generator`` is
    the data, given once."""
    from qir.errors import InputError

    from ..conftest import DIGITS, DIGITS_DATA

    model = str(DIGITS / "model.onnx")
    assert QuantAnalysis(model, analysis_model_type="fake_quant", out_dir=tmp_path).level == "fakequant"
    assert QuantAnalysis(model, analysis_model_type="quantized", march="nash-e", out_dir=tmp_path).level == "integer"
    with pytest.raises(InputError, match="choose fake_quant or quantized"):
        QuantAnalysis(model, analysis_model_type="int8", out_dir=tmp_path)
    with pytest.raises(InputError, match="is level 'integer', not 'fakequant'"):
        QuantAnalysis(model, analysis_model_type="quantized", level="fakequant", out_dir=tmp_path)
    qa = QuantAnalysis(model, out_dir=tmp_path)
    for args, kwargs in (((), {}), ((DIGITS_DATA,), {"data_generator": DIGITS_DATA})):
        with pytest.raises(InputError, match="give the samples once"):
            qa.auto_find_bad_case(*args, **kwargs)
