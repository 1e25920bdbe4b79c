"""atomic_file: the final name holds either the old file or the whole new one, never a part."""
from __future__ import annotations

import stat

import numpy as np
import pytest

from digital_human.atomic_file import atomic_path, write_bytes_atomic, write_text_atomic


def test_success_replaces_the_file_with_ordinary_permissions(tmp_path):
    target = tmp_path / "sub" / "model.onnx"
    with atomic_path(target) as tmp:
        assert tmp.parent == target.parent and tmp.suffix == ".onnx" and tmp.name.startswith(".")
        assert not target.exists()  # nothing under the final name while writing
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in target.parent.iterdir()] == ["model.onnx"]


def test_failure_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = write_text_atomic(tmp_path / "avatar.json", "old")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["avatar.json"]


def test_writers_that_look_at_the_extension(tmp_path):
    target = tmp_path / "voice.npz"
    with atomic_path(target) as tmp:
        np.savez(str(tmp), a=np.arange(3))  # np.savez would append ".npz" to a name without it
    assert np.load(target)["a"].tolist() == [0, 1, 2]
    assert write_bytes_atomic(tmp_path / "e.plan", b"\x00\x01").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.plan", "voice.npz"]
