"""CosyVoice 2's HiFT vocoder replayed from CUDA graphs, one per mel length (live mode's pieces).

Why: HiFT runs eagerly, many small kernels (Snake activations, convolutions, the STFT head; not counted) launched
from Python for every streamed piece (~26 ms for a first piece on an H200, 2026-12-03); with 8 live sessions their launches queue
behind the other threads' for the interpreter lock (benchmarks/RESULTS_live.md, 21:57: HiFT's Python frames show in
the samples of the one TTS lane that could not keep up). Replayed from a graph a piece is one launch: on the H200
(2026-12-04, benchmarks/RESULTS_live.md) 16 frames 18-22 -> 6 ms, 48 frames 29 -> 13 ms, 108 frames 43 -> 26-27 ms,
the waveform as far from an FP32 run (TF32 off) as eager's.

Live pieces have few lengths (HIFT_CONTEXT_FRAMES of left context + twice the hop's tokens; a chunk's last piece
anything up to a hop and the lookahead), so `prepare` captures those at warm-up (engine.live_piece_frames: every
length up to 114 frames); another length runs eagerly. What a graph cannot hold is worked around, with the same numbers:
- the sine source's random numbers are drawn on the host beforehand (hift.draw_source, the same values and
  generator state as the inline draws) and copied into the graph's inputs;
- torch.istft checks its window's overlap on the host (a device sync, not allowed while capturing), so the graphs
  use overlap_add_istft, the same inverse written as a DFT matrix product and an overlap-add; and the forward STFT
  is framed_stft, a DFT matrix product over the frames (equal to rounding: FP32 matrix products, TF32 off by
  default). Why no cuFFT inside a graph: a captured FFT keeps using its plan's workspace, and torch's plan cache
  (4,096 plans, least recently used out first) may destroy that plan while the graph lives - replays never touch
  it, and the live talking head's log-mel makes a plan per piece length.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .hift import HiFT, SourceDraws

log = logging.getLogger("digital_human.cosyvoice")


_BASES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _dft_bases(n_fft: int, window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(analysis [2 * bins, n_fft]: windowed cos and -sin rows, as torch.stft's real and imaginary parts;
    synthesis [n_fft, 2 * bins]: irfft's weights on the real and imaginary parts, DC and Nyquist once, the others
    twice, over n_fft), made in float64 and kept per window tensor: made on a graph's warm-up call, read by its
    capture (a host-to-device copy cannot be captured)."""
    key = (int(n_fft), window.device, window.dtype, window.data_ptr())
    if key not in _BASES:
        n = torch.arange(n_fft, dtype=torch.float64)
        bins = n_fft // 2 + 1
        angle = 2 * np.pi * torch.arange(bins, dtype=torch.float64)[:, None] * n[None, :] / n_fft  # [bins, n_fft]
        w = window.detach().to("cpu", torch.float64)
        analysis = torch.cat([torch.cos(angle) * w, -torch.sin(angle) * w])
        weight = torch.full((bins, 1), 2.0, dtype=torch.float64)
        weight[0] = 1.0
        if n_fft % 2 == 0:
            weight[-1] = 1.0
        synthesis = torch.cat([weight * torch.cos(angle), -weight * torch.sin(angle)]).T / n_fft
        _BASES[key] = (analysis.to(window.device, window.dtype), synthesis.to(window.device, window.dtype))
    return _BASES[key]


def framed_stft(signal: torch.Tensor, n_fft: int, hop: int, window: torch.Tensor) -> torch.Tensor:
    """torch.stft(signal [B, L], n_fft, hop, n_fft, window, center=True, reflect padding) as [B, 2 * bins, frames]:
    the real parts' rows, then the imaginary parts' (HiFT's s_stft layout)."""
    analysis, _ = _dft_bases(n_fft, window)
    padded = F.pad(signal[:, None], (n_fft // 2, n_fft // 2), mode="reflect")[:, 0]
    frames = padded.unfold(-1, n_fft, hop)  # [B, frames, n_fft]
    return torch.matmul(frames, analysis.T).transpose(1, 2)


def overlap_add_istft(spec: torch.Tensor, n_fft: int, hop: int, n_fft_win: int, window: torch.Tensor) -> torch.Tensor:
    """torch.istft(spec, n_fft, hop, n_fft_win, window=window) for a onesided complex spec [B, n_fft//2+1, frames]
    with center=True, without its host-side check: frames by the inverse DFT's matrix, windowed, overlapped and added
    (F.fold), divided by the summed squared window, the centre padding cut. Signature as HiFT._decode calls it."""
    if n_fft_win != n_fft or window.numel() != n_fft:
        raise ValueError("overlap_add_istft takes a window as long as n_fft")
    frames = spec.shape[-1]
    _, synthesis = _dft_bases(n_fft, window)
    parts = torch.cat([spec.real, spec.imag], dim=1)  # [B, 2 * bins, frames]
    chunks = torch.matmul(synthesis, parts) * window.view(1, -1, 1)  # [B, n_fft, frames]
    length = n_fft + hop * (frames - 1)
    fold = lambda x: F.fold(x, output_size=(1, length), kernel_size=(1, n_fft), stride=(1, hop))  # noqa: E731
    wave = fold(chunks).reshape(spec.shape[0], length)
    envelope = fold((window * window).view(1, -1, 1).expand(1, n_fft, frames)).reshape(1, length)
    half = n_fft // 2
    return wave[:, half:length - half] / envelope[:, half:length - half]


def _capture(run: Callable[[], torch.Tensor], device: torch.device, pool: Any = None,
             stream: Any = None) -> tuple[Callable[[], None], torch.Tensor]:
    """flow.capture_graph (tests replace this: the CPU has no CUDA graphs)."""
    from .flow import capture_graph

    return capture_graph(run, device, pool=pool, stream=stream)


class HiftGraphs:
    """HiFT(mel, draws) from a captured graph per mel length (see the module's docstring); eager where none is."""

    def __init__(self, hift: HiFT, cuda_graph: bool | None = None) -> None:
        self.hift = hift
        self.device = next(hift.parameters()).device
        self.use_graph = self.device.type == "cuda" if cuda_graph is None else bool(cuda_graph)
        self.cfg = hift.cfg
        self.samples_per_frame = int(np.prod(self.cfg.upsample_rates)) * self.cfg.hop_len
        self.graphs: dict[int, tuple[Callable[[], None], dict[str, torch.Tensor], torch.Tensor]] = {}
        self.prepared: set[int] = set()  # the mel lengths prepare() captured
        self.replays = 0   # pieces served from a graph
        self.eager = 0     # pieces run eagerly (a length not prepared)
        self._pool: Any = None
        self._stream: Any = None
        from ..cuda_streams import ReplayOrder

        self._order = ReplayOrder()  # one replay at a time: the graphs share their memory pool and inputs

    def _run(self, mel: torch.Tensor, start: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """HiFT.inference's work with given source draws and the graph-safe iSTFT: wave [B, frames * 480]."""
        hift = self.hift
        f0 = hift.f0_predictor(mel)
        f0_audio = F.interpolate(f0[:, None], scale_factor=float(hift.upsample_total), mode="nearest").transpose(1, 2)
        source = hift.m_source(f0_audio, None, SourceDraws(start=start, noise=noise)).transpose(1, 2)
        return hift._decode(mel, source, istft=overlap_add_istft, stft=framed_stft)

    def _static(self, frames: int) -> dict[str, torch.Tensor]:
        channels, samples = self.cfg.nb_harmonics + 1, frames * self.samples_per_frame
        return {"mel": torch.zeros(1, self.cfg.in_channels, frames, device=self.device),
                "start": torch.zeros(1, channels, device=self.device),
                # laid out as the excitation (draw_source's layout): the source checks it
                "noise": torch.zeros(1, channels, samples, device=self.device).transpose(1, 2)}

    def _graph(self, frames: int):
        if frames not in self.graphs:
            static = self._static(frames)
            if self._pool is None and self.device.type == "cuda":
                self._pool = torch.cuda.graph_pool_handle()
            if self._stream is None and self.device.type == "cuda":
                from ..cuda_streams import capture_stream

                self._stream = capture_stream(self.device)
            replay, out = _capture(lambda: self._run(static["mel"], static["start"], static["noise"]), self.device,
                                   pool=self._pool, stream=self._stream)
            self.graphs[frames] = (replay, static, out)
        return self.graphs[frames]

    @torch.inference_mode()
    def prepare(self, lengths: Iterable[int]) -> int:
        """Capture the graph of every mel length in `lengths` now (longest first: the shared pool is sized by the
        first); returns how many exist. Nothing without graphs. Why not every length up to the longest piece: each
        capture costs a warm-up call and torch.cuda.graph's own gc.collect and empty_cache (server start time)."""
        if not self.use_graph:
            return 0
        for frames in sorted({int(n) for n in lengths}, reverse=True):
            self._graph(frames)
            self.prepared.add(frames)
        return len(self.graphs)

    def covers(self, frames: int) -> bool:
        """Whether a mel of `frames` frames replays a graph prepare() captured."""
        return frames in self.prepared

    @torch.inference_mode()
    def __call__(self, mel: torch.Tensor, draws: SourceDraws) -> torch.Tensor:
        """wave [1, frames * 480] of mel [1, 80, frames] with the source's draws (draw_source for `frames`)."""
        frames = int(mel.shape[2])
        if mel.shape[0] != 1:
            raise ValueError(f"HiftGraphs vocodes one mel at a time, got a batch of {mel.shape[0]}")
        graph = self.graphs.get(frames) if self.use_graph else None
        if graph is None:
            self.eager += 1
            return self._run(mel, draws.start.to(self.device), draws.noise.to(self.device))
        replay, static, out = graph
        with self._order.turn(self.device):
            static["mel"].copy_(mel)
            static["start"].copy_(draws.start, non_blocking=draws.start.is_pinned())
            static["noise"].copy_(draws.noise, non_blocking=draws.noise.is_pinned())
            replay()
            result = out.clone()
            self.replays += 1
        return result
