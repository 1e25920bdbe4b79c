"""Writing files so that nobody ever sees half of one: every model, avatar, voice, track and preview
the pack saves goes to a unique temporary name in the target folder and is renamed onto the final
name in one step when the writer has finished (atomic on one file system). If the writer fails, the
temporary file is removed and the previous file, if any, stays as it was; temporaries that a killed
process left behind are swept up by the next write of the same file.
"""
from __future__ import annotations

import glob
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

STALE_SECONDS = 3600.0  # a temporary this old belongs to a dead process (writes take seconds)


def _umask() -> int:
    """The process umask, read without changing it where Linux allows (os.umask is a global swap)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _sweep_stale(path: Path) -> None:
    now = time.time()
    # escaped: user-chosen names (avatars, save names) may hold [ ] * ?
    for old in path.parent.glob(f".{glob.escape(path.stem)}.*.partial{glob.escape(path.suffix)}"):
        try:
            if now - old.stat().st_mtime > STALE_SECONDS:
                old.unlink()
        except OSError:
            pass  # another process got there first, or we may not delete it: not our file to fix


@contextmanager
def atomic_path(path: str | Path, allow_empty: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside `path` for a writer to fill; on success it replaces `path`.

    The temporary name keeps `path`'s extension (np.savez, soundfile and PIL look at it), is unique
    (parallel processes writing the same file do not collide) and starts with a dot. The final file
    gets the permissions a plain open() would give (0666 less the umask; mkstemp makes 0600). A
    writer that left the temporary empty (e.g. wrote to another name) is an error unless
    `allow_empty`: the real file is not replaced by nothing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=f".partial{path.suffix}")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if not allow_empty and tmp.stat().st_size == 0:
            raise OSError(f"nothing was written for {path} (the writer left its temporary file empty)")
        try:
            tmp.chmod(0o666 & ~_umask())
        except OSError:  # file systems without Unix permissions (vfat, some network shares)
            pass
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    with atomic_path(path, allow_empty=not data) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text_atomic(path: str | Path, text: str) -> Path:
    with atomic_path(path, allow_empty=not text) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)
