"""qir.data_folder: images and arrays into DIR/<input>/<i>.npy, read back by qir.data."""
from __future__ import annotations

import numpy as np
import pytest

from qir.data import load_samples
from qir.data_folder import arrays_to_folder, images_to_folder, preprocess, read_image, resize, write_samples
from qir.errors import InputError

from ..conftest import NEEDS_TORCH

PIL = pytest.importorskip("PIL.Image")


def _png(path, array):
    PIL.fromarray(array).save(path)
    return path


@pytest.fixture
def photos(tmp_path):
    """Three RGB images whose names sort differently as text and as numbers (img2 < img10)."""
    rng = np.random.default_rng(0)
    arrays = {n: rng.integers(0, 256, (6, 8, 3), dtype=np.uint8) for n in ("img1", "img2", "img10")}
    folder = tmp_path / "photos"
    folder.mkdir()
    for name, array in arrays.items():
        _png(folder / f"{name}.png", array)
    (folder / "notes.txt").write_text("not an image")
    return folder, [arrays["img1"], arrays["img2"], arrays["img10"]]


@pytest.mark.torch
def test_resize_is_bilinear_with_half_pixel_centres():
    row = np.array([[[0.0], [1.0]]], np.float32)  # 1 x 2 x 1
    # source x of output x: (x + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25 -> clamped 0, 0.25, 0.75, 1
    np.testing.assert_allclose(resize(row, (1, 4))[0, :, 0], [0, 0.25, 0.75, 1])
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    image = np.random.default_rng(1).uniform(0, 255, (7, 9, 3)).astype(np.float32)
    for size in ((14, 5), (3, 4), (7, 9)):
        want = torch.nn.functional.interpolate(torch.from_numpy(image.transpose(2, 0, 1))[None], size=size,
                                               mode="bilinear", align_corners=False)[0].numpy().transpose(1, 2, 0)
        np.testing.assert_allclose(resize(image, size), want, rtol=1e-5, atol=1e-3)


def test_preprocess_steps_and_layouts():
    image = np.random.default_rng(2).integers(0, 256, (4, 5, 3)).astype(np.float32)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    bgr = (image[:, :, ::-1] / 255 - np.array(mean, np.float32)) / np.array(std, np.float32)
    out = preprocess(image, channels="bgr", mean=mean, std=std)
    assert out.shape == (1, 3, 4, 5) and out.dtype == np.float32
    np.testing.assert_allclose(out[0], bgr.transpose(2, 0, 1), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(preprocess(image, channels="bgr", mean=mean, std=std, layout="hwc"), bgr, rtol=1e-6, atol=1e-6)
    assert preprocess(image, layout="NHWC").shape == (1, 4, 5, 3) and preprocess(image, layout="CHW").shape == (3, 4, 5)
    gray = preprocess(image, channels="gray", scale=1.0)
    np.testing.assert_allclose(gray[0, 0], image @ np.array([0.299, 0.587, 0.114], np.float32), rtol=1e-6, atol=1e-6)
    with pytest.raises(InputError, match="2 values for 3 channel"):
        preprocess(image, mean=[0.5, 0.5])
    with pytest.raises(InputError, match="unknown layout"):
        preprocess(image, layout="NCWH")


def test_images_become_a_data_folder_qir_reads(photos, tmp_path):
    folder, arrays = photos
    out = tmp_path / "data"
    written = images_to_folder([folder], out, "images", mean=0.5, std=0.5)
    assert [p.name for p in written] == ["0.npy", "1.npy", "2.npy"]
    samples = load_samples(out, ["images"])
    assert len(samples) == 3
    for sample, array in zip(samples, arrays):  # natural order: img1, img2, img10
        want = ((array.astype(np.float32) / 255 - 0.5) / 0.5).transpose(2, 0, 1)[None]
        np.testing.assert_allclose(sample["images"], want, rtol=1e-6, atol=1e-6)
    assert images_to_folder([folder / "img10.png"], tmp_path / "one", "x", size=(3, 3))[0].exists()


def test_existing_files_need_force_and_other_samples_are_refused(photos, tmp_path):
    folder, arrays = photos
    out = tmp_path / "data"
    images_to_folder([folder], out, "images")
    before = np.load(out / "images" / "0.npy")
    with pytest.raises(InputError, match="3 files already exist"):
        images_to_folder([folder], out, "images", scale=1.0)
    np.testing.assert_array_equal(np.load(out / "images" / "0.npy"), before)  # nothing written
    images_to_folder([folder], out, "images", scale=1.0, overwrite=True)
    np.testing.assert_allclose(np.load(out / "images" / "0.npy")[0], arrays[0].transpose(2, 0, 1))
    with pytest.raises(InputError, match=r"already holds other samples \(1.npy, 2.npy\)"):
        images_to_folder([folder / "img1.png"], out, "images", overwrite=True)  # 1.npy, 2.npy would stay
    with pytest.raises(InputError, match="different shapes"):
        _png(folder / "wide.png", np.zeros((6, 9, 3), np.uint8))
        images_to_folder([folder], tmp_path / "mixed", "images")


def test_images_read_as_rgb_values(photos, tmp_path):
    folder, arrays = photos
    np.testing.assert_array_equal(read_image(folder / "img2.png"), arrays[1].astype(np.float32))
    gray = _png(tmp_path / "gray.png", arrays[0][:, :, 0])
    np.testing.assert_array_equal(read_image(gray), np.repeat(arrays[0][:, :, :1], 3, axis=2).astype(np.float32))
    with pytest.raises(InputError, match="cannot read the image"):
        read_image(folder / "notes.txt")


def test_arrays_are_split_as_qir_reads_them(tmp_path):
    rng = np.random.default_rng(3)
    stack = rng.standard_normal((4, 1, 3, 2, 2)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=stack, **{"m/0": stack[0, 0, :1], "m/1": stack[1, 0, :1]})
    with pytest.raises(InputError, match="different numbers of samples"):
        arrays_to_folder(tmp_path / "d.npz", tmp_path / "both")
    np.savez(tmp_path / "x.npz", x=stack)
    arrays_to_folder(tmp_path / "x.npz", tmp_path / "split")  # no ranks: split along the first axis
    np.testing.assert_array_equal(load_samples(tmp_path / "split", ["x"])[3]["x"], stack[3])
    np.save(tmp_path / "x.npy", stack[:, 0])  # (4, 3, 2, 2): for a rank-4 input that is one batch of 4
    arrays_to_folder(tmp_path / "x.npy", tmp_path / "batch", input_names=["x"], ranks={"x": 4})
    assert [s["x"].shape for s in load_samples(tmp_path / "batch", ["x"])] == [(4, 3, 2, 2)]
    with pytest.raises(InputError, match="name it"):
        arrays_to_folder(tmp_path / "x.npy", tmp_path / "nameless")
    with pytest.raises(InputError, match="no samples"):
        write_samples([], tmp_path / "empty")


@pytest.mark.parametrize("option", [{"scale": float("nan")}, {"mean": [0.0, float("inf"), 0.0]}, {"std": float("nan")}])
def test_preprocess_refuses_non_finite_normalization(option):
    with pytest.raises(InputError, match=f"{next(iter(option))} must be finite"):
        preprocess(np.zeros((4, 4, 3), np.float32), **option)
