"""atomic_file: the final name holds either the old file or the whole new one, never a part."""
from __future__ import annotations

import os
import stat
import time

import numpy as np
import pytest

from digital_human.atomic_file import atomic_path, write_bytes_atomic, write_text_atomic


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_success_replaces_the_file_with_ordinary_permissions(tmp_path):
    target = tmp_path / "sub" / "model.onnx"
    with atomic_path(target) as tmp:
        assert tmp.parent == target.parent and tmp.suffix == ".onnx" and tmp.name.startswith(".")
        assert not target.exists()  # nothing under the final name while writing
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~_current_umask()  # as a plain open() would give
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


def test_an_empty_result_does_not_replace_the_file(tmp_path):
    target = write_text_atomic(tmp_path / "voice.npz", "old")
    with pytest.raises(OSError, match="nothing was written"):
        with atomic_path(target) as tmp:
            np.savez(str(tmp.with_name("elsewhere")), a=np.arange(3))  # a writer that picked its own name
    assert target.read_text() == "old"


def test_temporaries_of_a_killed_writer_are_swept_up(tmp_path):
    target = tmp_path / "engine.plan"
    dead = tmp_path / ".engine.abc123.partial.plan"
    fresh = tmp_path / ".engine.def456.partial.plan"  # another process writing right now
    dead.write_bytes(b"x" * 10)
    fresh.write_bytes(b"y")
    old = time.time() - 7200
    os.utime(dead, (old, old))
    write_bytes_atomic(target, b"plan")
    assert sorted(p.name for p in tmp_path.iterdir()) == [fresh.name, target.name]


def test_sweeping_takes_names_literally(tmp_path):
    """Glob characters in a user's file name neither hide its own stale temporaries nor match others'."""
    target = tmp_path / "a[1].npz"
    dead = tmp_path / ".a[1].abc123.partial.npz"
    other = tmp_path / ".a1.abc123.partial.npz"  # what an unescaped "a[1]" pattern would match
    old = time.time() - 7200
    for p in (dead, other):
        p.write_bytes(b"x")
        os.utime(p, (old, old))
    write_bytes_atomic(target, b"data")
    assert sorted(p.name for p in tmp_path.iterdir()) == [other.name, target.name]
