"""Per-frame rows of a long video's face track kept in a temporary file instead of in memory.

A video's mesh landmarks are 468 x 3 float32 = 5.6 KB a frame: 50 MB for 5 minutes at 30 fps,
which alone would grow `align`'s peak resident memory by more than 10 % of a 10-s clip's (issue
13: memory flat in the length). `RowSpool` looks like a float32 array [N, *row] (len, shape,
dtype, indexing by an int, a slice, an index array or a boolean mask, optionally followed by
per-row indices) and keeps the rows in an unlinked temporary file read and written with
pread/pwrite: the process holds only the rows it is using, the rest lives in the kernel's page
cache (reclaimable) or on disk. Used where frames are decoded on demand (media.frame_source.
VideoFrames); an in-memory clip keeps its plain ndarray.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np

FILL_CHUNK_BYTES = 1 << 20  # rows written at a time when the file is first filled


class RowSpool:
    """A [N, *row_shape] array of fixed-size rows in a temporary file (see the module docstring)."""

    def __init__(self, n: int, row_shape: tuple[int, ...], dtype: Any = np.float32, fill: float | None = np.nan):
        self._n, self._row_shape, self._dtype = int(n), tuple(int(d) for d in row_shape), np.dtype(dtype)
        self._row_bytes = int(np.prod(self._row_shape, dtype=np.int64)) * self._dtype.itemsize
        # unlinked at once (nothing is left behind on a crash); open for the spool's life, closed by close()
        self._file = tempfile.TemporaryFile(prefix="dh-rows-")  # noqa: SIM115
        self._fd = self._file.fileno()
        if fill is None:
            os.ftruncate(self._fd, self._n * self._row_bytes)  # zeros (a sparse file)
        else:
            step = max(1, FILL_CHUNK_BYTES // max(self._row_bytes, 1))
            block = np.full((step, *self._row_shape), fill, self._dtype)
            for start in range(0, self._n, step):
                self._write(start, block[:min(step, self._n - start)])

    # --- array protocol ------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    @property
    def shape(self) -> tuple[int, ...]:
        return (self._n, *self._row_shape)

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def ndim(self) -> int:
        return 1 + len(self._row_shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the whole array (as an ndarray's nbytes; they are in the file, not in memory)."""
        return self._n * self._row_bytes

    def __getitem__(self, key) -> np.ndarray:
        rows, rest = _split(key)
        if isinstance(rows, (int, np.integer)):
            out = self._read(self._index(rows), 1)[0]
        else:
            idx = self._indices(rows)
            out = self._gather(idx)
            rest = (slice(None), *rest)
        return out[rest] if rest else out

    def __setitem__(self, key, value) -> None:
        rows, rest = _split(key)
        if rest:
            raise IndexError("RowSpool writes whole rows: index the rows only")
        if isinstance(rows, (int, np.integer)):
            self._write(self._index(rows), np.broadcast_to(np.asarray(value, self._dtype), (1, *self._row_shape)))
            return
        idx = self._indices(rows)
        values = np.broadcast_to(np.asarray(value, self._dtype), (len(idx), *self._row_shape))
        i = 0
        for start, stop in runs(idx):  # consecutive rows are written with one call
            self._write(start, values[i:i + stop - start])
            i += stop - start

    def __array__(self, dtype=None, copy=None) -> np.ndarray:  # np.asarray(spool): the whole array, only when asked for
        arr = self._read(0, self._n)
        return arr if dtype is None else arr.astype(dtype)

    def blocks(self, rows: int = 1024) -> Iterator[tuple[int, int]]:
        """(start, stop) ranges of at most `rows` rows covering the array, for work done a block at a time."""
        for start in range(0, self._n, max(1, int(rows))):
            yield start, min(self._n, start + max(1, int(rows)))

    def copy(self) -> RowSpool:
        """An independent spool with the same rows (copied a block at a time)."""
        other = RowSpool(self._n, self._row_shape, self._dtype, fill=None)
        for start, stop in self.blocks():
            other._write(start, self._read(start, stop - start))
        return other

    def close(self) -> None:
        self._file.close()

    # --- file access ---------------------------------------------------------------------------
    def _index(self, t: int) -> int:
        t = int(t) + (self._n if t < 0 else 0)
        if not 0 <= t < self._n:
            raise IndexError(f"row {t} out of range for {self._n} rows")
        return t

    def _indices(self, rows) -> np.ndarray:
        if isinstance(rows, slice):
            return np.arange(self._n)[rows]
        idx = np.asarray(rows)
        if idx.dtype == bool:
            if idx.shape != (self._n,):
                raise IndexError(f"boolean index of shape {idx.shape} for {self._n} rows")
            return np.flatnonzero(idx)
        idx = idx.astype(np.int64).reshape(-1)
        idx = np.where(idx < 0, idx + self._n, idx)
        if idx.size and (idx.min() < 0 or idx.max() >= self._n):
            raise IndexError(f"row index out of range for {self._n} rows")
        return idx

    def _gather(self, idx: np.ndarray) -> np.ndarray:
        out = np.empty((len(idx), *self._row_shape), self._dtype)
        i = 0
        for start, stop in runs(idx):  # consecutive rows are read with one call
            out[i:i + stop - start] = self._read(start, stop - start)
            i += stop - start
        return out

    def _read(self, start: int, count: int) -> np.ndarray:
        out = np.empty((count, *self._row_shape), self._dtype)
        view, done, offset = memoryview(out.reshape(-1).view(np.uint8)), 0, start * self._row_bytes
        while done < len(view):
            got = os.preadv(self._fd, [view[done:]], offset + done)
            if got <= 0:
                raise OSError(f"reading rows {start}..{start + count} of a track spool file failed")
            done += got
        return out

    def _write(self, start: int, rows: np.ndarray) -> None:
        data, done, offset = np.ascontiguousarray(rows, self._dtype).tobytes(), 0, start * self._row_bytes
        while done < len(data):
            done += os.pwrite(self._fd, data[done:], offset + done)


def _split(key) -> tuple[Any, tuple]:
    """(row index, per-row index) of an indexing key."""
    if isinstance(key, tuple):
        if key and key[0] is Ellipsis:  # spool[..., :2]: every row, then the rest
            return slice(None), key
        return (key[0], key[1:]) if key else (slice(None), ())
    if key is Ellipsis:
        return slice(None), ()
    return key, ()


def runs(idx: np.ndarray) -> Iterator[tuple[int, int]]:
    """[start, stop) runs of consecutive values in `idx`, in order (an unordered index gives runs of one)."""
    if not idx.size:
        return
    breaks = np.flatnonzero(np.diff(idx) != 1) + 1
    for a, b in zip(np.r_[0, breaks], np.r_[breaks, idx.size]):
        yield int(idx[a]), int(idx[b - 1]) + 1
