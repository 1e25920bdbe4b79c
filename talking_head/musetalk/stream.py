"""MuseTalk on one photo, prepared once for many short speech pieces (live mode).

`musetalk_crops` sets a reference up for every call: the file checks, the networks' lookup, the log-mel
extractor, the photo's face box, paste mask and VAE reference latents. A live session calls it for every TTS
piece (~0.3-1 s of speech), so on an H200 that set-up stood between the first TTS piece and the first frame
(215 ms per piece with the first step, 2026-12-02). A photo never changes: `PhotoStream` makes all of it once
(at server start) and a piece then costs its whisper windows and its 4-frame steps only. The crops are made by
the same renderer code (`_MuseTalkRenderer`) with the same latents, so they equal musetalk_crops' crops of the
same photo and speech (tests/test_live_batching.py compares them).

Thread use: one renderer per calling thread (a live session's face stage), all sharing the photo's latents;
their model steps still meet in the pipeline's call batcher.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..driver import output_frame_count, validate_audio, validate_track


class PhotoStream:
    """photo track (one frame) -> `crops(wave, rate)`: its generated crops, a few frames a step."""

    def __init__(self, track: Any, fps: float, *, backend: str = "auto", precision: str = "auto",
                 models_root: Any = None, mask: str | None = None, seed: int = 0,
                 compile: bool | None = None) -> None:
        """compile: MuseTalk's compiled step replayed from CUDA graphs (CUDA only; None = the
        DIGITAL_HUMAN_MUSETALK_COMPILE variable; the variable, when 1 or 0, wins)."""
        from ...engines.musetalk.audio import feature_extractor
        from ...engines.musetalk.files import locate
        from ...engines.musetalk.networks import cached_networks
        from ...engines.musetalk.pipeline import LatentCache, cached_pipeline
        from ...fast_path import MUSETALK_COMPILE_ENV, switch
        from .crops import _MuseTalkRenderer, mask_note, resolve_mask, resolve_runtime

        files = locate(models_root)  # the clearest error first
        mask_source = resolve_mask(mask, files.face_parsing, files.root)
        validate_track(track)
        if len(track) != 1:
            raise ValueError(f"PhotoStream takes a photo's track (1 frame), got {len(track)} frames")
        device, prec, notes = resolve_runtime(backend, precision)
        self.net = cached_networks(device, prec, models_root)
        parser = None
        if mask_source == "face-parsing":
            from ...engines.musetalk.face_parsing import cached_parser

            parser = cached_parser(device, models_root)
        self.track, self.fps = track, float(fps)
        self.extractor = feature_extractor(self.net.files.whisper_dir)
        self.pipe = cached_pipeline(self.net, seed=seed, compile=switch(compile, MUSETALK_COMPILE_ENV))
        self.backend = f"torch-{device} {prec}"
        self.warnings = list(notes) + [mask_note(mask_source, files.face_parsing, files.root, mask)]
        self._parser = parser
        self._latents = LatentCache(4)
        self._renderer_type = _MuseTalkRenderer
        self._local = threading.local()
        t0 = time.perf_counter()
        first = self._renderer()
        self.mask = first.mask(0)  # crop-space paste mask [S, S] of the photo, made once
        first.pipe.reference_latents_batch([first.ref_key(0)], lambda _k: self._face(first), self._latents)
        self.prepare_seconds = time.perf_counter() - t0

    def _face(self, renderer: Any) -> np.ndarray:
        from .blend import crop_face

        crop = np.asarray(self.track.crops[0], np.uint8)
        return crop_face(crop, renderer.box(0))

    def _renderer(self) -> Any:
        """This thread's renderer over the photo (its batches' state is its own; the latents are shared)."""
        renderer = getattr(self._local, "renderer", None)
        if renderer is None:
            renderer = self._renderer_type(self.pipe, self.track, np.zeros(1, np.int64), None, 4, None,
                                           parser=self._parser)
            renderer.latents = self._latents  # frame-index key 0: the photo, the same in every renderer
            first = getattr(self, "mask", None)
            if first is not None:
                renderer._masks[0] = first
            self._local.renderer = renderer
        return renderer

    def crops(self, wave: np.ndarray, rate: int, *, first: int = 4, step: int = 4,
              max_audio_seconds: float = 600.0,
              should_stop: Callable[[], bool] | None = None) -> Iterator[np.ndarray]:
        """uint8 [k, S, S, 3] crops of speech `wave` (one per output frame at fps): `first` frames in the first
        step, then `step` a step. The first step is not pipelined with the next (its frame waits for no later
        launch); later steps queue the next one on the device before reading theirs back (on CUDA)."""
        from ...engines.musetalk.audio import audio_windows

        wave = validate_audio(wave, rate, max_audio_seconds)
        n = output_frame_count(len(wave) / float(rate), self.fps)
        windows = audio_windows(self.net.whisper, self.extractor, wave, int(rate), self.fps, n)
        renderer = self._renderer()
        renderer.idx, renderer.windows, renderer.should_stop = np.zeros(n, np.int64), windows, should_stop
        renderer._ahead, renderer._next = None, None
        pipelined = renderer.launch_ahead
        bounds = [0] + list(range(min(first, n), n, step)) + [n]
        try:
            for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
                if e <= s:
                    continue
                renderer.launch_ahead = pipelined and i > 0
                try:
                    crops, _ = renderer.render(s, e)
                except InterruptedError:
                    return
                yield crops
        finally:
            if renderer._next is not None:  # a launched batch nobody reads (stopped): let it finish
                renderer._next.wait()
            renderer._ahead, renderer._next, renderer.launch_ahead = None, None, pipelined
