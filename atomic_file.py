"""Writing files so that nobody ever sees half of one: every model, avatar, voice, track and preview
the pack saves goes to a unique temporary name in the target folder and is renamed onto the final
name in one step when the writer has finished (atomic on one file system). If the writer fails or the
process is interrupted, the temporary file is removed and the previous file, if any, stays as it was.
"""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_path(path: str | Path, mode: int = 0o644) -> Iterator[Path]:
    """Yield a temporary path beside `path` for a writer to fill; on success it replaces `path`.

    The temporary name keeps `path`'s extension (np.savez, soundfile and PIL look at it), is unique
    (parallel processes writing the same file do not collide) and starts with a dot. `mode`: the
    final file's permissions (mkstemp creates 0600; models and voices are shared, ordinary files)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=f".partial{path.suffix}")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        tmp.chmod(mode)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text_atomic(path: str | Path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)
