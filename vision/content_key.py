"""Content keys of a reference's frames, for caches that outlive one request ("avatar preparation").

A talking-head service is asked again and again to lip-sync new speech onto the same reference video; the
face track and each reference frame's network inputs depend only on the frames' content (and the settings),
so they can be kept between requests under a key of that content - never under a path or an object id
alone, which would serve stale results after a file is replaced.

- A video decoded on demand (media.frame_source.VideoFrames): BLAKE2b of the file's bytes (a 10-s 512x512
  H.264 clip is ~0.6 MB: about a millisecond) and the decoded geometry (frames, height, width: the
  max_frames / max_side the frames were read with).
- Anything else (an in-memory array, a torch tensor, a custom frame source): None, so nothing is cached for
  it. Hashing an in-memory clip would cost ~0.8 ms a 512x512 frame on every first request, a quarter of
  the GPU face track it would save, and ComfyUI already skips a node whose inputs did not change.

Keys are memoised per frames object (weakly: they go with the object).
"""
from __future__ import annotations

import hashlib
import threading
import weakref
from typing import Any

import numpy as np

from ..media.frame_source import file_digest

_MEMO: dict[int, tuple[Any, str]] = {}  # id(frames) -> (weak reference, key)
_LOCK = threading.Lock()


def _compute(frames: Any) -> str | None:
    path = getattr(frames, "path", None)
    shape = getattr(frames, "shape", None)
    if path is None or shape is None or not callable(getattr(frames, "frame", None)):
        return None
    try:  # VideoFrames hashes its file once (its kept decoded frames use the same digest)
        own = getattr(frames, "content_digest", None)
        digest = own() if callable(own) else file_digest(path)
    except OSError:
        return None
    return f"video:{digest}:{tuple(int(s) for s in shape)}"


def frames_key(frames: Any) -> str | None:
    """A key of `frames`' content (None: not keyable; then callers cache nothing)."""
    with _LOCK:
        hit = _MEMO.get(id(frames))
        if hit is not None and hit[0]() is frames:
            return hit[1]
    key = _compute(frames)
    if key is None:
        return None
    try:
        ref = weakref.ref(frames, lambda _r, i=id(frames): _MEMO.pop(i, None))
    except TypeError:  # not weakly referenceable: not memoised
        return key
    with _LOCK:
        _MEMO[id(frames)] = (ref, key)
    return key


def digest(*parts: Any, size: int = 20) -> str:
    """BLAKE2b of arrays (dtype, shape and bytes) and other values (their repr), in order."""
    h = hashlib.blake2b(digest_size=size)
    for part in parts:
        if isinstance(part, np.ndarray):
            a = np.ascontiguousarray(part)
            h.update(repr((a.dtype.str, a.shape)).encode())
            h.update(a.data)
        else:
            h.update(repr(part).encode())
        h.update(b"|")
    return h.hexdigest()


def frame_key(frames_key_: str, t: int, *arrays: np.ndarray) -> str:
    """A key of one reference frame t of a keyed video together with per-frame data that shapes what is
    made from it (its crop transform, its landmarks): equal keys, equal inputs."""
    return f"{frames_key_}#{int(t)}:{digest(*(np.asarray(a) for a in arrays), size=16)}"
