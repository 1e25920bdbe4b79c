"""MuseTalk 1.5's generation step on 256x256 face crops: one UNet pass at timestep 0, no sampling loop.

Reference crop (RGB uint8 [256, 256, 3]) -> two VAE encodings: the crop with its lower half blanked
(pixels 0 before normalising, so -1 after) and the whole crop; each latent is drawn from the VAE's
posterior (mean + std x noise) and scaled by the VAE's scaling factor; concatenated they are the
UNet's 8-channel input. The UNet, conditioned on the frame's whisper window (+ position code),
predicts the lower face's latent; the VAE decodes it to the generated crop.

The posterior noise comes from a generator seeded per reference frame (masked draw first, then the
reference), the same numbers the reference code draws after torch.manual_seed(seed): results are
reproducible, and each reference frame's latents are computed once and cached. cached_pipeline keeps one
pipeline per networks, seed and mode for the process, so its cache (keyed by the renderer with content keys,
vision.content_key) outlives a request: a repeat request on the same reference video encodes nothing.

Speed on CUDA (benchmarks/gpu_musetalk.py, RESULTS.md): the crops are quantised to uint8 on the device
(the same float32 x 255, round-half-to-even ops as before, so the CPU stays bit-identical; a half to a
quarter of the bytes cross to the host, and the host does no per-pixel work), and `compile=True` runs the whole
step (UNet + decode + uint8) through torch.compile, channels-last, for a fixed batch (the first one;
shorter batches are padded so there is no second compilation): 1.6x eager half precision on an H200
(4.6x eager FP32 batch 8); the VAE encoder is compiled too (batch ENCODE_BATCH, channels-last: 22 ms vs 44 ms
eager per 32 crops). Compiling costs 60-75 s once per process (step + encoder; a new pipeline of the same
networks would be traced again, 0.4-0.6 s, hence cached_pipeline), so it is an option (or
DIGITAL_HUMAN_MUSETALK_COMPILE=1); a failure to compile is logged and the pipeline runs eager.

CUDA graphs (`graphs=True`; by default on when compiling, DIGITAL_HUMAN_MUSETALK_GRAPHS=1/0 forces them on or
off, eager too): the step and the encoder are captured once per pipeline at their fixed batch (the compiled
function, or the eager one) and each batch is one graph replay instead of launching a thousand-odd kernels from
Python - on an H200 a compiled batch's launching took longer than its GPU work (RESULTS.md). The replays and the
work around them run on the pipeline's own CUDA stream (`stream_scope`), so the video path's paste-back, crop
warps and copies on the default stream neither wait behind a batch nor hold it up. The graphs are
torch.cuda.CUDAGraph objects, not torch.compile's per-thread cudagraph trees: captured on whichever thread makes
the first batch, replayed from any (a video renders on a new thread per request). A capture that fails is logged
and the pipeline goes on without that graph (compiled or eager, the same results).
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .audio import position_table

CROP = 256  # MuseTalk's face crop size (latent 32x32)
COMPILE_ENV = "DIGITAL_HUMAN_MUSETALK_COMPILE"  # "1": compile=None means compile on CUDA
GRAPHS_ENV = "DIGITAL_HUMAN_MUSETALK_GRAPHS"  # "1"/"0": graphs=None means on/off (unset: on when compiling)
log = logging.getLogger("digital_human.musetalk")


def upload(x: Any, device: Any, dtype: Any = None) -> Any:
    """A CPU tensor on `device` (and in `dtype`, converted there: the same values as converting first), the copy
    only queued on the current stream. From pageable memory CUDA waits for everything queued on the stream
    before it copies, so a renderer that queues its next batch behind the one the GPU is running would wait for
    that one at every upload (crops, noise, audio windows); through pinned memory it does not (torch's pinned
    allocator keeps the block until the copy is done)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and x.device.type == "cpu":
        x = x.pin_memory().to(device, non_blocking=True)
    else:
        x = x.to(device)
    return x if dtype is None else x.to(dtype)


def _quantise(image: Any) -> Any:
    """uint8 [B, H, W, 3] on image's device from float [B, 3, H, W] in 0..1: float32 x 255, then round half
    to even (torch.round, as numpy's), the reference's arithmetic in the same order."""
    import torch

    return (image.float() * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()


ENCODE_BATCH = 32  # the compiled encoder's one batch size (a renderer's batch of misses is at most this on CUDA)
SHARED_LATENTS = 8192  # reference latents a kept pipeline holds: 16 KB each in FP16 ([8, 32, 32]), 128 MB


class LatentCache:
    """Reference latents [1, 8, 32, 32] by key, least recently used dropped past `capacity` (thread-safe:
    the shared one may be read by two renderers at once)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self._items: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Any) -> bool:
        return key in self._items

    def get(self, key: Any) -> Any:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
            return hit

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)

    def trim(self) -> None:
        """Drop the least recently used past capacity (after a batch: a batch's own keys are never dropped
        before it has read them)."""
        with self._lock:
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


def _capture_cuda_graph(fn: Callable[..., Any], inputs: tuple, stream: Any) -> tuple[Any, tuple]:
    """(graph, outputs): fn(*inputs) captured into a torch.cuda.CUDAGraph on `stream`, after one warm-up call
    there (lazy cuBLAS/cuDNN set-up and workspaces happen outside the capture). Other threads may use the GPU
    meanwhile: the capture is thread-local (their calls neither break it nor end up in it)."""
    import torch

    current = torch.cuda.current_stream(stream.device)
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        fn(*inputs)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        out = fn(*inputs)
    current.wait_stream(stream)
    return graph, (out if isinstance(out, tuple) else (out,))


class GraphReplay:
    """fn at fixed input shapes as one captured graph: the inputs are copied into the graph's own (static) input
    tensors, the graph replayed, its outputs cloned (the next replay overwrites them). Thread-safe: a call
    enqueues copy-in, replay and clone on `stream` under a lock, so two callers' replays never interleave;
    the caller's current stream is made to wait for the result."""

    def __init__(self, fn: Callable[..., Any], example: tuple, stream: Any,
                 capture: Callable[..., tuple[Any, tuple]] | None = None) -> None:
        self.inputs = tuple(x.clone() for x in example)  # same shapes, dtypes and strides (memory format)
        self.stream = stream
        self._lock = threading.Lock()
        self.graph, self.outputs = (capture or _capture_cuda_graph)(fn, self.inputs, stream)

    def __call__(self, *args: Any) -> tuple:
        import torch

        if len(args) != len(self.inputs) or any(a.shape != x.shape for a, x in zip(args, self.inputs)):
            raise ValueError("a graph replays only the shapes it was captured with")
        cuda = self.stream is not None
        current = torch.cuda.current_stream(self.stream.device) if cuda else None
        scope = torch.cuda.stream(self.stream) if cuda else contextlib.nullcontext()
        with self._lock, scope:
            if cuda:
                self.stream.wait_stream(current)  # the inputs were made on the caller's stream
            for dst, src in zip(self.inputs, args):
                dst.copy_(src)
            self.graph.replay()
            out = tuple(o.clone() for o in self.outputs)
        if cuda and current != self.stream:
            current.wait_stream(self.stream)
            for o in out:
                o.record_stream(current)
        return out


class MuseTalkPipeline:
    """The networks on one device and precision, with a cache of reference-frame latents."""

    def __init__(self, networks: Any, seed: int = 0, cache_size: int = 512, compile: bool | None = None,
                 channels_last: bool | None = None, graphs: bool | None = None) -> None:
        """compile: torch.compile the generation step and the VAE encoder (CUDA only; None = the
        DIGITAL_HUMAN_MUSETALK_COMPILE variable). channels_last: the UNet and VAE decoder in NHWC (None = when
        compiling; CUDA only: the CPU keeps NCHW, the layout its parity was proven in). cache_size: reference
        latents kept (cached_pipeline's pipelines keep SHARED_LATENTS, under content keys). graphs: replay the
        step and the encoder from CUDA graphs at a fixed batch, on the pipeline's own stream (CUDA only; None =
        the DIGITAL_HUMAN_MUSETALK_GRAPHS variable, unset = when compiling)."""
        import torch

        self.net = networks
        param = next(networks.unet.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.seed = int(seed)
        self.scaling = networks.scaling_factor
        self.positions = position_table().to(self.device)
        self.timestep = torch.tensor([0], device=self.device)
        self._latents = LatentCache(cache_size)
        cuda = self.device.type == "cuda"
        self.compile_note: str | None = None
        self.compile_seconds: float | None = None
        self._compiled: Any = None
        self._compiled_batch: int | None = None
        self._compiled_encode: Any = None
        self.encode_compile_seconds: float | None = None
        if compile is None:
            compile = os.environ.get(COMPILE_ENV, "").strip() == "1"
        graphs = resolve_graphs(graphs, bool(compile))
        # CUDA graphs: one GraphReplay per function once captured; a failed capture is not tried again
        self.graphs = bool(graphs) and cuda
        self.graphs_note: str | None = None
        self.graph_capture_seconds: dict[str, float] = {}
        self._graph: dict[str, GraphReplay] = {}
        self._graph_failed: set[str] = set()
        self._batcher: Any = None  # share_batches: concurrent threads' steps as one batch
        self._stream: Any = None
        if self.graphs:  # its graphs are captured on it: a cuBLAS workspace of their own (cuda_streams.capture_stream)
            from ..cuda_streams import capture_stream

            self._stream = capture_stream(self.device)
        if graphs and not cuda:
            self.graphs_note = "MuseTalk CUDA graphs are for CUDA only; running without them on the CPU"
            log.warning("[digital_human] %s", self.graphs_note)
        self.channels_last = False
        if cuda:
            # NHWC only pays compiled: eager, the VAE decoder's group norms are slower channels-last
            # (H200 BF16 batch 64: decode 229 ms vs 161 ms NCHW); compiled, inductor fuses them.
            self._set_layout(bool(compile) if channels_last is None else bool(channels_last))
        if compile and not cuda:
            self.compile_note = "MuseTalk compile is for CUDA only; running eager on the CPU"
            log.warning("[digital_human] %s", self.compile_note)
        elif compile:
            # dynamic=False: one static graph for one batch size (see _run_static); inductor fuses the
            # group norms, SiLUs, residual adds and the uint8 conversion around cuDNN's convolutions
            self._compiled = torch.compile(self._forward, dynamic=False)
            # the encoder likewise (H200 FP16 batch 32, channels-last: 22 ms compiled vs 44 ms eager; eager
            # the group norms dominate, and NHWC eager is slower still: 58 ms)
            self._compiled_encode = torch.compile(self._encode_moments, dynamic=False)
            self._set_layout(self.channels_last)

    def _set_layout(self, channels_last: bool) -> None:
        """The UNet and VAE decoder's weights in NHWC or NCHW. The encoder is NHWC only compiled (eager NHWC
        is slower; on the CPU a channels-last encoder differs by ~1e-3, see _pixels)."""
        import torch

        fmt = torch.channels_last if channels_last else torch.contiguous_format
        for module in (self.net.unet, self.net.vae.decoder, self.net.vae.post_quant_conv):
            if module is not None:
                module.to(memory_format=fmt)
        enc = torch.channels_last if self._compiled_encode is not None else torch.contiguous_format
        for module in (self.net.vae.encoder, self.net.vae.quant_conv):
            if module is not None:
                module.to(memory_format=enc)
        self.channels_last = channels_last

    def claim_layout(self) -> None:
        """Put the shared networks back into this pipeline's layout (another pipeline of the same networks,
        eager or compiled, may have changed it since; a no-op when it is already so)."""
        if self.device.type == "cuda":
            self._set_layout(self.channels_last)

    @contextlib.contextmanager
    def stream_scope(self) -> Iterator[None]:
        """The caller's device work inside runs on the pipeline's own CUDA stream (with graphs; otherwise
        nothing changes), after what the caller's stream had queued: a renderer that uploads, generates and
        copies its crops back inside it waits for none of the other threads' work on the default stream.
        Tensors made inside and used outside must be synchronised by the caller (the renderer takes only host
        arrays out)."""
        if self._stream is None:
            yield
            return
        import torch

        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            yield

    @contextlib.contextmanager
    def _on_stream(self) -> Iterator[None]:
        """stream_scope for the pipeline's own calls: their results are then ordered before the caller's
        stream's next work (a caller outside stream_scope may use them at once)."""
        if self._stream is None:
            yield
            return
        import torch

        current = torch.cuda.current_stream(self.device)
        with self.stream_scope():
            yield
        if current != self._stream:
            current.wait_stream(self._stream)

    def _static_call(self, name: str, fn: Callable[..., Any], args: tuple) -> tuple:
        """fn(*args) at its fixed batch: replayed from its CUDA graph when there is one; else called, and with
        graphs on, captured after this call (a failed capture is logged and not tried again)."""
        graph = self._graph.get(name)
        if graph is not None:
            return graph(*args)
        out = fn(*args)
        out = out if isinstance(out, tuple) else (out,)
        if self.graphs and name not in self._graph_failed:
            t0 = time.perf_counter()
            try:
                self._graph[name] = GraphReplay(fn, args, self._stream, _capture)
                self.graph_capture_seconds[name] = round(time.perf_counter() - t0, 3)
                log.info("[digital_human] MuseTalk %s captured as a CUDA graph (batch %d, %.2f s)", name,
                         len(args[0]), time.perf_counter() - t0)
            except Exception as exc:  # noqa: BLE001 - any capture failure: announced, then run without the graph
                self._graph_failed.add(name)
                note = (f"MuseTalk CUDA graph of the {name} failed ({type(exc).__name__}: {exc}"[:300]
                        + "); running it without a graph")
                self.graphs_note = note if self.graphs_note is None else self.graphs_note + "; " + note
                log.warning("[digital_human] %s", note)
        return out

    # --- reference latents ------------------------------------------------------------------------
    def _pixels(self, crops: Any, half_mask: bool) -> Any:
        """float32 NCHW in -1..1 from uint8 NHWC crops: a numpy array (converted on the host), or a uint8
        tensor on the device (the same float64 / 255 then float32 steps there: on an H200 host the
        host conversion of a 10-s clip's crops took longer than encoding them)."""
        import torch

        if isinstance(crops, torch.Tensor):
            x = crops.double().div(255.0).float().permute(0, 3, 1, 2).contiguous()
        else:
            # contiguous NCHW: a permuted (channels-last) view sends the convolutions down another
            # kernel path whose results differ by ~1e-3 after the VAE encoder
            x = torch.from_numpy(np.asarray(crops, np.float64) / 255.0).float().permute(0, 3, 1, 2).contiguous()
        if half_mask:
            x[:, :, CROP // 2:, :] = 0.0
        return x.sub(0.5).div(0.5)

    def encode_references(self, crops: np.ndarray) -> Any:
        """[B, 8, 32, 32] UNet input latents (masked ++ reference) for RGB uint8 crops [B, 256, 256, 3]."""
        import torch

        crops = np.asarray(crops)
        if crops.ndim != 4 or crops.shape[1:] != (CROP, CROP, 3):
            raise ValueError(f"MuseTalk crops must be [B, {CROP}, {CROP}, 3] RGB, got {crops.shape}")
        with torch.inference_mode(), self._on_stream():
            if self.device.type == "cuda":  # one upload of the uint8 crops; the float conversion there
                crops = upload(torch.from_numpy(np.ascontiguousarray(crops)), self.device)
            out = [self._moments(self._pixels(crops, half).to(self.device, self.dtype)) for half in (True, False)]
            noise_m, noise_r = [], []
            for _ in range(len(crops)):
                g = torch.Generator().manual_seed(self.seed)
                noise_m.append(torch.randn(out[0][0].shape[1:], generator=g, dtype=torch.float32))
                noise_r.append(torch.randn(out[1][0].shape[1:], generator=g, dtype=torch.float32))
            lat = []
            for (mean, std), noise in zip(out, (noise_m, noise_r)):
                sample = mean + std * upload(torch.stack(noise), self.device, mean.dtype)
                lat.append(self.scaling * sample)
            return torch.cat(lat, dim=1)

    def _encode_moments(self, x: Any) -> tuple[Any, Any]:
        """The VAE posterior's (mean, std) of pixels x [B, 3, 256, 256] (model dtype, on the device)."""
        dist = self.net.vae.encode(x).latent_dist
        return dist.mean, dist.std

    def _moments(self, x: Any) -> tuple[Any, Any]:
        """_encode_moments, compiled when compiling and replayed from a CUDA graph with graphs: in batches of
        ENCODE_BATCH, a shorter one padded with copies of its last row (a new shape would compile again), as
        _run_static."""
        import torch

        if self._compiled_encode is None and not self.graphs:
            return self._encode_moments(x)
        size = ENCODE_BATCH  # fixed: a repeat request's first call may have only a few misses to encode
        means, stds = [], []
        try:
            for s in range(0, len(x), size):
                part = x[s:s + size]
                k = len(part)
                if k < size:
                    part = torch.cat([part, part[-1:].expand(size - k, *part.shape[1:])])
                if self._compiled_encode is None:  # graphs of the eager encoder: NCHW, as eager
                    mean, std = self._static_call("encoder", self._encode_moments, (part.contiguous(),))
                    means.append(mean[:k])
                    stds.append(std[:k])
                    continue
                part = part.contiguous(memory_format=torch.channels_last)
                if self.encode_compile_seconds is None and self.device.type == "cuda":  # the first call compiles
                    t0 = time.perf_counter()
                    mean, std = self._compiled_encode(part)
                    torch.cuda.synchronize(self.device)
                    self.encode_compile_seconds = time.perf_counter() - t0
                    if self.graphs:  # captured on the next call (compiled and warmed up by now)
                        self._static_call("encoder", self._compiled_encode, (part,))
                else:
                    mean, std = self._static_call("encoder", self._compiled_encode, (part,))
                means.append(mean[:k])
                stds.append(std[:k])
        except Exception as exc:
            if means or self._compiled_encode is None:  # it ran compiled before, or eager: a real runtime error
                raise
            self._compiled_encode = None
            note = f"MuseTalk encoder compile failed ({type(exc).__name__}: {exc}"[:300] + "); eager"
            self.compile_note = note if self.compile_note is None else self.compile_note + "; " + note
            log.warning("[digital_human] %s", note)
            return self._encode_moments(x)
        return torch.cat(means), torch.cat(stds)

    def reference_latents(self, key: Any, crop: np.ndarray | Callable[[], np.ndarray]) -> Any:
        """encode_references of one crop [256, 256, 3] (or a function making it, called only on a cache
        miss), cached under `key` (e.g. the reference frame's index)."""
        hit = self._latents.get(key)
        if hit is None:
            image = crop() if callable(crop) else crop
            hit = self.encode_references(np.asarray(image)[None])
            self._latents.put(key, hit)
            self._latents.trim()
        return hit

    def uncached(self, keys: list, cache: LatentCache | None = None) -> list:
        """The keys (unique, in order) whose reference latents are not cached: the crops to make.
        cache: the cache to look in (default: this pipeline's)."""
        cache = self._latents if cache is None else cache
        return [k for k in dict.fromkeys(keys) if k not in cache]

    def reference_latents_batch(self, keys: list, make_crop: Callable[[Any], np.ndarray],
                                cache: LatentCache | None = None) -> Any:
        """reference_latents of several keys at once: the cache misses are encoded in one VAE batch
        (a video has a new reference frame for every output frame; one at a time, the encodes took a
        quarter of a 10-s clip's time on an H200). Same noise per crop as one at a time.
        cache: where the latents are kept (default: this pipeline's; a renderer whose frames have no content
        key passes one of its own, so its frame-index keys never meet another request's)."""
        import torch

        cache = self._latents if cache is None else cache
        have = {k: cache.get(k) for k in dict.fromkeys(keys)}
        misses = [k for k, v in have.items() if v is None]
        if misses:
            encoded = self.encode_references(np.stack([np.asarray(make_crop(k)) for k in misses]))
            for k, latent in zip(misses, encoded):
                have[k] = latent[None]
                cache.put(k, have[k])
        out = torch.cat([have[k] for k in keys])
        cache.trim()
        return out

    # --- generation ---------------------------------------------------------------------------------
    def _unet(self, latents: Any, audio: Any) -> Any:
        audio = audio + self.positions[:, :audio.shape[1], :].to(audio.dtype)
        return self.net.unet(latents, self.timestep, encoder_hidden_states=audio).sample

    def _decode(self, latents: Any) -> Any:
        image = self.net.vae.decode((1 / self.scaling) * latents).sample
        return (image / 2 + 0.5).clamp(0, 1)

    def _forward(self, latents: Any, audio: Any) -> Any:
        """The whole step on device tensors (model dtype): uint8 crops [B, 256, 256, 3], still on the device."""
        return _quantise(self._decode(self._unet(latents, audio)))

    def _inputs(self, latents: Any, windows: Any) -> tuple[Any, Any]:
        import torch

        latents = upload(latents, self.device, self.dtype)
        if self.channels_last:
            latents = latents.contiguous(memory_format=torch.channels_last)
        return latents, upload(windows, self.device, self.dtype)

    def unet_step(self, latents: Any, windows: Any) -> Any:
        """Predicted latents [B, 4, 32, 32] from input latents [B, 8, 32, 32] and windows [B, L, 384]."""
        import torch

        with torch.inference_mode():
            return self._unet(*self._inputs(latents, windows))

    def decode(self, latents: Any) -> Any:
        """float [B, 3, 256, 256] in 0..1 (before quantisation)."""
        import torch

        with torch.inference_mode():
            return self._decode(latents.to(self.dtype))

    @staticmethod
    def to_uint8(image: Any) -> np.ndarray:
        """RGB uint8 [B, 256, 256, 3] from decode()'s output (round half to even, as the reference),
        quantised where the image is (on a GPU only the uint8 bytes are copied to the host)."""
        return _quantise(image.detach()).cpu().numpy()

    def _run_static(self, latents: Any, audio: Any) -> Any:
        """The compiled (or graphed) step in batches of the first batch's size; a shorter batch (a clip's
        last) is padded with copies of its last row, since a new shape would be compiled (a minute or more) or
        captured again."""
        import torch

        size = self._compiled_batch = self._compiled_batch or len(latents)
        fn = self._compiled if self._compiled is not None else self._forward
        out = []
        for s in range(0, len(latents), size):
            lat, aud = latents[s:s + size], audio[s:s + size]
            k = len(lat)
            if k < size:
                lat = torch.cat([lat, lat[-1:].expand(size - k, *lat.shape[1:])])
                aud = torch.cat([aud, aud[-1:].expand(size - k, *aud.shape[1:])])
            if self._compiled is not None and self.compile_seconds is None:  # the first call compiles
                t0 = time.perf_counter()
                res = self._compiled(lat, aud)
                torch.cuda.synchronize(self.device)
                self.compile_seconds = time.perf_counter() - t0
            else:
                res = self._static_call("step", fn, (lat, aud))[0]
            out.append(res[:k])
        return out[0] if len(out) == 1 else torch.cat(out)

    def generate(self, latents: Any, windows: Any) -> np.ndarray:
        """Generated RGB uint8 crops [B, 256, 256, 3]."""
        return self.generate_device(latents, windows).cpu().numpy()

    def share_batches(self, window_s: float = 0.004, max_rows: int = 64, quantum: int = 4) -> None:
        """From now on, generate_device calls made at the same time by several threads (the live server's
        sessions, 4 frames each) run as one batched step (engines/call_batcher.py): each caller gets its own
        rows. A row's result does not depend on the others (the UNet and decoder are per sample); every step is
        padded to a multiple of `quantum` rows, since on the CPU a convolution may round a row differently at
        another batch size (1-3 or 5 rows vs 4 or 8: tests/test_live_batching.py compares). On CUDA the batcher's
        thread queues the steps on a stream of its own at the talking head's priority (engines/cuda_streams.py):
        not behind other threads' work on the default stream (with graphs the step itself runs on the pipeline's
        stream, as before)."""
        from ..call_batcher import CallBatcher
        from ..cuda_streams import FACE_PRIORITY

        if self._batcher is None:
            self._batcher = CallBatcher(self._generate_now, window_s=window_s, max_rows=max_rows,
                                        quantum=quantum, name="musetalk-batcher", stream_priority=FACE_PRIORITY)

    @property
    def batcher(self) -> Any:
        return self._batcher

    def generate_device(self, latents: Any, windows: Any) -> Any:
        """generate's crops as a uint8 tensor on the pipeline's device, the work only queued there (on CUDA the
        call returns once it is launched: a caller can time launching and waiting apart). After share_batches,
        concurrent callers' rows run in one step."""
        if self._batcher is not None:
            latents, windows = self._inputs(latents, windows)
            return self._batcher(latents, windows)
        return self._generate_now(latents, windows)

    def _generate_now(self, latents: Any, windows: Any) -> Any:
        import torch

        with torch.inference_mode(), self._on_stream():
            latents, audio = self._inputs(latents, windows)
            if self._compiled is not None:
                try:
                    return self._run_static(latents, audio)
                except Exception as exc:
                    if self.compile_seconds is not None:  # it ran compiled before: a real runtime error
                        raise
                    self._compiled = None
                    self._compiled_batch = None
                    self.compile_note = f"MuseTalk compile failed ({type(exc).__name__}: {exc}"[:300] + "); eager"
                    log.warning("[digital_human] %s", self.compile_note)
                    self._set_layout(False)
                    latents = latents.contiguous()
            if self.graphs:
                return self._run_static(latents, audio)
            return self._forward(latents, audio)


_capture = _capture_cuda_graph  # GraphReplay's capture (tests replace it: the CPU has no CUDA graphs)


def resolve_graphs(graphs: bool | None, compile: bool) -> bool:
    """Whether a pipeline uses CUDA graphs: `graphs` when given, else DIGITAL_HUMAN_MUSETALK_GRAPHS ("1" on,
    "0" off), else when compiling (graphs replay the compiled step; eager they need no compilation, but an
    eager batch is mostly GPU time, not launching)."""
    if graphs is not None:
        return bool(graphs)
    env = os.environ.get(GRAPHS_ENV, "").strip()
    return env == "1" if env in ("0", "1") else bool(compile)


# --- one pipeline per networks, seed and mode, kept for the process ------------------------------------
# The pipelines live on their networks object (a reference cycle, freed with the networks when the loader drops
# them: a module-level map keyed by the networks would keep their GPU memory alive forever); this weak set only
# finds them for clear_latent_caches.
_PIPELINES: "weakref.WeakSet[MuseTalkPipeline]" = weakref.WeakSet()
_PIPELINES_LOCK = threading.Lock()


def cached_pipeline(networks: Any, seed: int = 0, compile: bool | None = None,
                    graphs: bool | None = None) -> MuseTalkPipeline:
    """The process's MuseTalkPipeline of `networks`, seed, compile and graphs mode (kept with the networks).
    Kept rather than made per request because (1) a new pipeline's compiled step is traced again by dynamo
    (its guards see a new `self`: 0.4-0.6 s per request on an H200, a third of the 1.5-s budget for a 10-s
    clip) and its CUDA graphs captured again, and (2) its reference-latent cache (SHARED_LATENTS entries) then
    outlives a request: callers key it by content (vision.content_key), so a repeat request on the same
    reference video encodes nothing."""
    if compile is None:
        compile = os.environ.get(COMPILE_ENV, "").strip() == "1"
    graphs = resolve_graphs(graphs, bool(compile))
    key = (int(seed), bool(compile), bool(graphs))
    with _PIPELINES_LOCK:
        kept = networks.__dict__.setdefault("_pipelines", {})
        pipe = kept.get(key)
        if pipe is None:
            pipe = kept[key] = MuseTalkPipeline(networks, seed=seed, cache_size=SHARED_LATENTS, compile=compile,
                                                graphs=graphs)
            _PIPELINES.add(pipe)
            if _SHARED_BATCHES is not None:
                pipe.share_batches(**_SHARED_BATCHES)
    pipe.claim_layout()
    return pipe


_SHARED_BATCHES: dict[str, Any] | None = None  # share_batches_in_process's settings, for pipelines made later


def share_batches_in_process(window_s: float = 0.004, max_rows: int = 64, quantum: int = 4) -> None:
    """Every kept pipeline of this process, and every one made later, batches concurrent threads' steps
    (MuseTalkPipeline.share_batches): the live server's sessions share one step."""
    global _SHARED_BATCHES
    with _PIPELINES_LOCK:
        _SHARED_BATCHES = {"window_s": window_s, "max_rows": max_rows, "quantum": quantum}
        pipes = list(_PIPELINES)
    for pipe in pipes:
        pipe.share_batches(**_SHARED_BATCHES)


def clear_latent_caches() -> None:
    """Forget the reference latents of every kept pipeline (benchmarks measure a first request with this)."""
    with _PIPELINES_LOCK:
        pipes = list(_PIPELINES)
    for pipe in pipes:
        pipe._latents.clear()
