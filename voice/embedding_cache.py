"""Speaker profiles cached by the content hash of the prepared reference audio.

Two levels: an in-memory dict (ComfyUI re-runs a graph many times in one process) and `.npz` files
under `cache_dir("speakers")` (survive restarts). Entries are handed out as copies so a caller that
fills in `style` or renames the speaker never changes what the next caller gets.
"""
from __future__ import annotations

import logging
import re
from collections import OrderedDict
from pathlib import Path

from ..paths import cache_dir
from .speaker import SpeakerProfile

log = logging.getLogger(__name__)

_KEY_RE = re.compile(r"^[0-9a-f]{64}$")  # sha256 hex: also keeps keys safe as file names


class EmbeddingCache:
    """get(content_hash) -> SpeakerProfile | None; put(profile). Counts hits and misses."""

    def __init__(self, directory: Path | None = None, max_items: int = 128, disk: bool = True) -> None:
        self._directory = Path(directory) if directory is not None else None
        self.disk = disk
        self.max_items = max_items
        self._memory: OrderedDict[str, SpeakerProfile] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.disk_hits = 0

    @property
    def directory(self) -> Path:
        # Resolved lazily so DIGITAL_HUMAN_MODELS set after import (tests, CLI flags) is honoured.
        if self._directory is None:
            self._directory = cache_dir("speakers")
        return self._directory

    def _path(self, key: str) -> Path:
        if not _KEY_RE.match(key):
            raise ValueError(f"cache key must be a sha256 hex digest, got {key!r}")
        return self.directory / f"{key}.npz"

    def get(self, key: str) -> SpeakerProfile | None:
        path = self._path(key)
        profile = self._memory.get(key)
        if profile is not None:
            self._memory.move_to_end(key)
            self.hits += 1
            return profile.copy()
        if self.disk and path.is_file():
            try:
                profile = SpeakerProfile.load_npz(path)
            except (ValueError, KeyError, OSError) as exc:  # stale format or damaged file: recompute
                log.warning("ignoring unreadable speaker cache file %s: %s", path, exc)
                path.unlink(missing_ok=True)
            else:
                if profile.content_hash == key:
                    self._remember(key, profile)
                    self.hits += 1
                    self.disk_hits += 1
                    return profile.copy()
                log.warning("speaker cache file %s holds hash %s; ignoring it", path, profile.content_hash)
        self.misses += 1
        return None

    def put(self, profile: SpeakerProfile) -> None:
        key = profile.content_hash
        path = self._path(key)
        self._remember(key, profile.copy())
        if self.disk:
            try:
                profile.save_npz(path)
            except OSError as exc:  # a read-only models folder must not break extraction
                log.warning("could not write speaker cache file %s: %s", path, exc)

    def _remember(self, key: str, profile: SpeakerProfile) -> None:
        self._memory[key] = profile
        self._memory.move_to_end(key)
        while len(self._memory) > self.max_items:
            self._memory.popitem(last=False)

    def clear_memory(self) -> None:
        self._memory.clear()

    def __len__(self) -> int:
        return len(self._memory)


_DEFAULT: dict[str, EmbeddingCache] = {}


def default_cache() -> EmbeddingCache:
    """The process-wide cache for the current models root (one per root, so tests stay isolated)."""
    directory = cache_dir("speakers")
    key = str(directory)
    if key not in _DEFAULT:
        _DEFAULT[key] = EmbeddingCache(directory)
    return _DEFAULT[key]
