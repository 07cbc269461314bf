"""Reading samples from folders (hmct layout), .npz and .npy, with clear errors."""
from __future__ import annotations

import numpy as np
import pytest

from qir.data import load_samples, save_outputs
from qir.errors import InputError

from ..conftest import NEEDS_TORCH


def write_folder(root, names, n, shape=(1, 3)):
    for name in names:
        (root / name).mkdir(parents=True)
        for i in range(n):
            np.save(root / name / f"{i}.npy", np.full(shape, i, np.float32))


def test_hmct_folder_layout_matches_files_by_natural_index(tmp_path):
    write_folder(tmp_path, ["a", "b"], 12)
    samples = load_samples(tmp_path, ["a", "b"])
    assert len(samples) == 12
    assert [float(s["a"][0, 0]) for s in samples] == list(range(12))  # 2 before 10
    assert set(samples[3]) == {"a", "b"}


def test_folder_errors(tmp_path):
    write_folder(tmp_path, ["a"], 2)
    with pytest.raises(InputError, match="no sub-folder for model input 'b'"):
        load_samples(tmp_path, ["a", "b"])
    (tmp_path / "b").mkdir()
    np.save(tmp_path / "b" / "0.npy", np.zeros(3))
    with pytest.raises(InputError, match="1.npy is in one folder only"):
        load_samples(tmp_path, ["a", "b"])
    with pytest.raises(InputError, match="not found"):
        load_samples(tmp_path / "nope", ["a"])


def test_flat_folder_for_a_single_input(tmp_path):
    for i in range(3):
        np.save(tmp_path / f"img_{i}.npy", np.full((2,), i, np.float32))
    assert [s["x"][0] for s in load_samples(tmp_path, ["x"])] == [0, 1, 2]


def test_npz_stacked_and_indexed(tmp_path):
    np.savez(tmp_path / "s.npz", x=np.zeros((5, 1, 3), np.float32))
    assert len(load_samples(tmp_path / "s.npz", ["x"], {"x": 2})) == 5
    assert len(load_samples(tmp_path / "s.npz", ["x"], {"x": 3})) == 1  # one sample of rank 3
    np.savez(tmp_path / "i.npz", **{"x/0": np.zeros(2), "x/1": np.ones(2), "y/0": np.ones(1), "y/1": np.ones(1)})
    samples = load_samples(tmp_path / "i.npz", ["x", "y"])
    assert len(samples) == 2 and samples[1]["x"].tolist() == [1, 1]
    with pytest.raises(InputError, match="no entry for model input 'z'"):
        load_samples(tmp_path / "i.npz", ["x", "z"])
    with pytest.raises(InputError, match="rank 4"):
        load_samples(tmp_path / "s.npz", ["x"], {"x": 4})


def test_npy_needs_a_single_input_model(tmp_path):
    np.save(tmp_path / "d.npy", np.zeros((4, 1, 2), np.float32))
    assert len(load_samples(tmp_path / "d.npy", ["x"], {"x": 2})) == 4
    with pytest.raises(InputError, match="2 inputs"):
        load_samples(tmp_path / "d.npy", ["x", "y"])
    (tmp_path / "bad.npy").write_bytes(b"nope")
    with pytest.raises(InputError, match="cannot read"):
        load_samples(tmp_path / "bad.npy", ["x"], {"x": 2})[0]


def test_python_iterables_and_save_outputs(tmp_path):
    samples = load_samples(({"x": np.full(2, i)} for i in range(3)), ["x"])
    assert len(samples) == 3
    with pytest.raises(InputError, match="expected a dict"):
        load_samples(["text"], ["x"])
    path = save_outputs(tmp_path / "o.npz", [{"y": np.ones(2)}, {"y": np.zeros(2)}])
    with np.load(path) as npz:
        assert sorted(npz.keys()) == ["y/0", "y/1"]


@pytest.mark.torch
def test_arrays_tensors_and_tuples_bind_to_the_inputs_and_an_iterable_is_read_up_to_the_limit():
    """A DataLoader's items (a tensor, or a tuple of tensors) are samples; a generator is read
    no further than ``limit`` items."""
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    one = load_samples([torch.full((1, 2), 3.0), np.ones(2)], ["x"])
    assert isinstance(one[0]["x"], np.ndarray) and one[0]["x"].tolist() == [[3.0, 3.0]] and one[1]["x"].tolist() == [1, 1]
    two = load_samples([(torch.zeros(1), np.ones(1))], ["a", "b"])
    assert {k: v.tolist() for k, v in two[0].items()} == {"a": [0.0], "b": [1.0]}
    with pytest.raises(InputError, match="one array but the model has 2 inputs"):
        load_samples([np.zeros(1)], ["a", "b"])
    with pytest.raises(InputError, match="holds 3 arrays but the model has 2 inputs"):
        load_samples([(np.zeros(1), np.zeros(1), np.zeros(1))], ["a", "b"])
    read = []

    def generator():
        for i in range(10):
            read.append(i)
            yield {"x": np.full(2, i)}

    assert len(load_samples(generator(), ["x"], limit=4)) == 4 and read == [0, 1, 2, 3]


def test_multi_input_folders_pair_samples_by_index_not_position(tmp_path):
    for name, idx in (("a", [0, 1, 2]), ("b", [0, 1, 3])):
        (tmp_path / name).mkdir()
        for i in idx:
            np.save(tmp_path / name / f"{i}.npy", np.full(2, i, np.float32))
    with pytest.raises(InputError, match="2.npy is in one folder only"):
        load_samples(tmp_path, ["a", "b"])


def test_save_npz_takes_any_name(tmp_path):
    from qir.data import save_npz

    arrays = {"file": np.arange(3), "allow_pickle": np.ones((2, 2), np.float32), "a/b": np.zeros(1)}
    path = save_npz(tmp_path / "x.npz", arrays)
    with np.load(path, allow_pickle=False) as z:
        assert set(z.files) == set(arrays)
        np.testing.assert_array_equal(z["file"], arrays["file"])


def test_pickled_arrays_are_refused_unread(tmp_path):
    """An object array (pickled data) in an .npz entry or an .npy is an InputError naming it."""
    objects = np.array([{"a": 1}], dtype=object)
    np.savez(tmp_path / "o.npz", x=objects)
    np.save(tmp_path / "o.npy", objects, allow_pickle=True)
    with pytest.raises(InputError, match=r"o\.npz\[x\]: it holds Python objects \(pickled data\)"):
        load_samples(tmp_path / "o.npz", ["x"])
    with pytest.raises(InputError, match=r"o\.npy: it holds Python objects"):
        load_samples(tmp_path / "o.npy", ["x"])


def test_a_sample_with_nan_inputs_is_named_once(tmp_path, caplog):
    from qir.data import forget_warnings

    write_folder(tmp_path, ["a"], 3)
    bad = np.load(tmp_path / "a" / "2.npy")
    bad[0, 1] = np.inf
    np.save(tmp_path / "a" / "2.npy", bad)
    forget_warnings()
    with caplog.at_level("WARNING", logger="qir.data"):
        for _ in range(2):  # read twice, through a slice too: one warning
            list(load_samples(tmp_path, ["a"])[1:])
    assert [r.getMessage() for r in caplog.records] == [
        f"sample 2 of {tmp_path} holds NaN or Inf in its inputs ('a' 1 of 3 values): results on it mean nothing; "
        "fix or remove it"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="qir.data"):
        given = load_samples([{"a": bad}, {"a": bad}], ["a"])
        list(given) + list(given)
    assert [r.getMessage()[:9] for r in caplog.records] == ["sample 0 ", "sample 1 "]  # once per sample given in Python
