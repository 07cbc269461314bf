"""Writing files: atomic replacement (a failed write keeps the old file and leaves no temporary
file), the up-front check of planned outputs, and ``qir.save`` refusing an existing path."""
from __future__ import annotations

import errno
import os
import stat

import numpy as np
import onnx
import pytest

import qir
from qir.data import save_npz
from qir.errors import OutputError
from qir.files import atomic_write, check_outputs, write_text
from qir.json_dump import write_json

from ..conftest import DIGITS


def _full_disk_after(nbytes: int):
    """A writer that writes ``nbytes`` of garbage to the path it is given, then fails as a full disk does."""
    def write(path):
        with open(path, "wb") as f:
            f.write(b"x" * nbytes)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return write


def _only(folder):
    return sorted(p.name for p in folder.iterdir())


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("the good old content")
    with pytest.raises(OutputError, match=f"cannot write {target}: No space left on device"):
        atomic_write(target, _full_disk_after(53_000))
    assert target.read_text() == "the good old content"
    assert _only(tmp_path) == ["report.json"]


def test_any_error_of_the_writer_removes_the_temporary_file(tmp_path):
    def broken(path):
        path.write_text("half")
        raise ValueError("a bug")
    with pytest.raises(ValueError, match="a bug"):
        atomic_write(tmp_path / "x.txt", broken)
    assert _only(tmp_path) == []


def test_writers_of_qir_files_are_atomic(tmp_path, monkeypatch):
    """JSON reports and .npz files go through the primitive too: a full disk keeps the old file."""
    write_json(tmp_path / "r.json", "qir.test", {"a": 1})
    save_npz(tmp_path / "a.npz", {"x": np.ones(3)})
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    real_write_text = type(tmp_path).write_text

    def full(self, *args, **kwargs):
        real_write_text(self, "{")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(type(tmp_path), "write_text", full)
    with pytest.raises(OutputError, match="r.json: No space left on device"):
        write_json(tmp_path / "r.json", "qir.test", {"a": 2})
    monkeypatch.undo()

    def full_npz(f, *args, **kwargs):
        f.write(b"\x93NUMPY")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(np.lib.format, "write_array", full_npz)
    with pytest.raises(OutputError, match="a.npz: No space left on device"):
        save_npz(tmp_path / "a.npz", {"x": np.zeros(3)})
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_check_outputs_lists_every_existing_file_in_one_error(tmp_path):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text("mine")
    planned = [tmp_path / n for n in ("a.txt", "new.txt", "b.txt")]
    with pytest.raises(OutputError) as err:
        check_outputs(planned)
    message = str(err.value)
    assert message.startswith("2 files already exist:") and "a.txt" in message and "b.txt" in message
    assert "new.txt" not in message and "--force" in message
    check_outputs(planned, overwrite=True)
    check_outputs(planned, replaceable={tmp_path / "a.txt", tmp_path / "b.txt"})
    assert _only(tmp_path) == ["a.txt", "b.txt"]


def test_check_outputs_refuses_a_folder_and_a_file_in_the_way(tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("")
    with pytest.raises(OutputError, match="dir is a directory, not a file"):
        check_outputs([tmp_path / "dir"], overwrite=True)
    with pytest.raises(OutputError, match="file is a file, so .* cannot be created"):
        check_outputs([tmp_path / "file" / "sub" / "x.txt"])


def _read_only(folder):
    """``folder`` made read-only; skips when that does not stop writes (running as root)."""
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        (folder / ".probe").write_text("")
    except PermissionError:
        return folder
    (folder / ".probe").unlink()
    folder.chmod(stat.S_IRWXU)
    pytest.skip("chmod does not deny writes here (running as root)")


def test_a_read_only_folder_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "ro").mkdir()
    folder = _read_only(tmp_path / "ro")
    try:
        with pytest.raises(OutputError, match="cannot write in .*ro \\(permission denied\\)"):
            check_outputs([folder / "sub" / "report.txt"])
        with pytest.raises(OutputError, match="permission denied"):
            qir.save(qir.load(DIGITS / "model.onnx"), folder / "m.onnx")
        with pytest.raises(OutputError, match="cannot write .*x.txt: Permission denied"):
            write_text(folder / "x.txt", "text")
    finally:
        folder.chmod(stat.S_IRWXU)
    assert _only(folder) == []


def test_save_refuses_an_existing_path_even_its_own_input(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes((DIGITS / "model.onnx").read_bytes())
    ir = qir.load(path)
    before = path.read_bytes()
    with pytest.raises(OutputError, match="model.onnx already exists.*overwrite=True"):
        qir.save(ir, path)
    assert path.read_bytes() == before
    renamed = ir.clone()
    renamed.name = "changed"
    qir.save(renamed, path, overwrite=True)
    assert onnx.load(str(path)).graph.name == "changed"
    assert _only(tmp_path) == ["model.onnx"]


def test_save_on_a_full_disk_keeps_the_previous_model(tmp_path, monkeypatch):
    path = tmp_path / "model.onnx"
    path.write_bytes((DIGITS / "model.onnx").read_bytes())
    before = path.read_bytes()
    ir = qir.load(path)
    monkeypatch.setattr(onnx, "save", lambda model, f, *a, **k: _full_disk_after(53_000)(f))
    with pytest.raises(OutputError, match=f"cannot write {path}: No space left on device"):
        qir.save(ir, path, overwrite=True)
    assert path.read_bytes() == before and _only(tmp_path) == ["model.onnx"]
