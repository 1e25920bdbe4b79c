"""CosyVoice 2 as a TTS engine (voice/engines.py): zero-shot voice cloning from the user's release folder.

prepare_speaker: prompt mel (24 kHz), speech tokens (speech_tokenizer_v2.onnx on Whisper log-mel at
16 kHz) and x-vector (campplus.onnx on Kaldi fbank), trimmed so mel frames = 2 x tokens, plus the
transcript's Qwen token ids; stored on DH_SPEAKER under "cosyvoice2/...".
synthesize: per sentence chunk, LM tokens -> flow mel -> HiFT waveform. With a transcript the LM is
prompted with the reference text and speech tokens (zero-shot mode); without one it is not
(cross-lingual mode); the flow always gets the prompt mel, tokens and x-vector.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from ..loader import get as get_runner
from ..spec import ModelSpec
from .features import kaldi_fbank, prompt_mel, whisper_log_mel
from .flow import FastCFM
from .hift import SourceDraws, draw_source, without_weight_norm
from .lm import StaticDecoder
from .files import default_folder
from .release import LICENSE, RELEASE_NAME, check_release, load_models

log = logging.getLogger("digital_human")
NAME = "cosyvoice2"
SAMPLE_RATE = 24000
MAX_PROMPT_SECONDS = 20.0  # the speech tokenizer takes at most 30 s; long prompts also slow the LM
CHUNK_TOKENS = 80          # text tokens per LM call (the reference splits paragraphs the same way)
MAX_LANES = 8              # live mode's lanes, at most: each holds CUDA graphs of its own (GPU memory)
SPECIAL_TOKENS = {
    "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
    "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|endofprompt|>", "[breath]", "<strong>",
                                  "</strong>", "[noise]", "[laughter]", "[cough]", "[clucking]", "[accent]",
                                  "[quick_breath]", "<laughter>", "</laughter>", "[hissing]", "[sigh]",
                                  "[vocalized-noise]", "[lipsmack]", "[mn]"]}


FAST_ENV = "DIGITAL_HUMAN_COSYVOICE_FAST"  # "1": the fast path on a CUDA device (FP32 eager otherwise)
FLOW_KERNELS_ENV = "DIGITAL_HUMAN_COSYVOICE_FLOW_KERNELS"  # e.g. "fused,encoder_graph": fast_path_from_env
FLOW_KERNEL_CHOICES = {"fused": "flow_fused", "compiled": "flow_compile", "encoder_graph": "flow_encoder_graph"}
HIFT_GRAPHS_ENV = "DIGITAL_HUMAN_COSYVOICE_HIFT_GRAPHS"  # "0": live pieces vocoded eagerly (FastPath.hift_graph off)
STREAM_HOP_TOKENS = 25  # tokens per streamed piece (1 s of speech; the reference streams 25-token hops)
FIRST_HOP_TOKENS = 8    # live mode's first piece (0.32 s of speech): its audio after 8 + pre_lookahead_len tokens
# live mode's later hops grow to this (8, 8, 16, 32, 50, 50, ... tokens). Why not STREAM_HOP_TOKENS: each piece
# re-runs the flow over every token so far and vocodes its part, ~90 ms on an H200 whatever the hop (2026-12-03:
# flow 66 + HiFT 26 ms for a first piece), so 25-token hops cost ~125 ms of one lane per second of speech and 8
# speaking sessions need all of it; 50-token hops ~80 ms. The first pieces, hence the latency, are unchanged, and
# by the 5th piece 2.6 s of speech are already sent, so a 2-s hop is never waited for.
LIVE_HOP_TOKENS = 50
HIFT_CONTEXT_FRAMES = 8  # mel frames of left context re-vocoded for each streamed piece (then dropped)


class _Pause:
    """What a deferred stream yields between pieces every PAUSE_TOKENS tokens (speak_stream): a point where its
    consumer may let another utterance use the LM. Recognised by its `is_pause` attribute."""

    is_pause = True

    def __repr__(self) -> str:
        return "PAUSE"


PAUSE = _Pause()
PAUSE_TOKENS = 16  # the device sampler's read-back block: the decoder's state is settled at least this often


def next_hop(sent: int, first: int, hop_tokens: int, growing: bool) -> int:
    """speak_stream's tokens before its next piece, `sent` mel frames already vocoded. After a short first piece
    (growing) the hops grow with the speech sent, up to hop_tokens: 8, 8, 16, 25, ... (live: 8, 8, 16, 32, 50, ...) -
    the second piece must come before the first has been played, and a whole hop_tokens after a 0.32-s first piece
    would leave the talking head waiting."""
    if not sent:
        return first
    return min(hop_tokens, max(first, sent // 2)) if growing else hop_tokens


SHORT_PIECE_FRAMES = 48  # HiFT graphs for every piece length up to this: a short utterance's one piece, early pieces


def live_piece_frames(first_hop: int = FIRST_HOP_TOKENS, hop_tokens: int = LIVE_HOP_TOKENS,
                      speech_tokens: int = 500, lookahead: int = 3) -> list[int]:
    """The mel lengths live pieces are vocoded at, for HiFT's graphs (hift_graph.HiftGraphs): every length up to the
    longest piece a chunk can end with, and the lengths of the later hops of a chunk of up to `speech_tokens` (a
    text's first chunk from `first_hop`, later chunks whole hops from the start; 2 frames a token, with
    HIFT_CONTEXT_FRAMES of left context). A chunk's last piece holds what is left after the last hop: fewer than a
    hop and the `lookahead` tokens (CosyVoice 2's pre_lookahead_len) more, so at most 2 * (hop_tokens + lookahead)
    frames and the context. Default: every length from 1 to 114, so no live piece is vocoded eagerly (a chunk's
    last piece over 48 frames was, ~865 torch calls from Python, until 2026-12-04)."""
    longest = max(SHORT_PIECE_FRAMES, HIFT_CONTEXT_FRAMES + 2 * (int(hop_tokens) + int(lookahead)))
    lengths = set(range(1, longest + 1))
    for first, growing in ((int(first_hop), True), (int(hop_tokens), False)):
        sent = 0
        while sent < 2 * speech_tokens:
            end = sent + 2 * next_hop(sent, first, int(hop_tokens), growing)
            lengths.add(end - max(0, sent - HIFT_CONTEXT_FRAMES))
            sent = end
    return sorted(lengths)


@dataclass(frozen=True)
class FastPath:
    """Speed-ups over the FP32 eager reference; each can be switched off on its own.

    lm_graph: the LM's one-token steps on a fixed-size KV cache, one CUDA graph per step (lm.StaticDecoder).
      Same weights and dtype as the reference: logits agree to rounding, so with the host sampler
      (lm_device_sampling=False) tokens match unless a draw falls on a rounding-sized boundary.
    lm_bf16: the LM's weights in bfloat16 (half the weight reads per token). Changes the logits, so the
      sampled tokens differ from FP32's after the first few steps; off by default.
    lm_compile: torch.compile (inductor) of that step before it is captured: fewer, fused kernels per
      token; costs a compile on first use per runtime (a failed compile is logged, the step runs uncompiled).
    flow_half: the flow estimator (the ODE's network) as an FP16 copy; the token encoder stays FP32.
    flow_graph: the whole 10-step ODE solve as one CUDA graph per padded length (flow.FastCFM).
    flow_fused: the estimator copy's self-attention q/k/v as one projection (flow_kernels.fuse_projections): the
      same products, 1,120 fewer matrix products per solve. Off until measured on a GPU (benchmarks/gpu_tts_pieces.py
      --sections flow_kernels).
    flow_compile: the estimator copy's transformer and ResNet blocks compiled by inductor (flow_kernels.compile_blocks;
      a failed compile is announced and the blocks run eagerly). Off until measured on a GPU, as flow_fused.
    flow_encoder_graph: the flow's token encoder replayed from CUDA graphs per padded token count
      (flow_encoder.FastEncoder; off CUDA the same padded call eagerly): the piece's last eager stage, ~530 torch calls.
      Captured by prepare_live (a failed capture is logged and reported, and the encoder runs eagerly). Off until
      measured on a GPU, as flow_fused.
    hift_half: HiFT's upsampler convolutions under FP16 autocast (F0 and sine source in FP32). Off by
      default: on the H200 it was not faster than FP32 (TF32) convolutions. Weight norm is always folded.
    lm_device_sampling: the top-p/top-k + repetition-aware draw as tensor ops on the device, inside the LM
      step's CUDA graph (lm.ras_sample_tensor), with tokens read back every lm_readback steps: no host sync
      per token. Same distribution as the reference sampler, but not the same tokens for a seed (its draws
      come from a device generator seeded from the seed): deterministic for a seed on the same device and
      software. Off = the host sampler, whose tokens equal the FP32 eager path's for a seed.
    lm_readback: tokens drawn between the host's reads (each read is one sync; a stop token is seen at the
      next read, the steps after it are discarded).
    lm_step: "fused" = the decode step with q/k/v and gate/up as one mat-vec each and grouped-query attention
      on the 2-head cache; "reference" = the first version (the modules' 7 projections, SDPA with the cache
      expanded to 14 heads by the compiler). Same math, results equal to FP32 rounding (lm.StaticDecoder).
    lm_gemv: the fused step's weight mat-vecs: "reduce" (inductor reduction kernels; on the H200 ~0.25 ms per
      step faster than cuBLAS' FP32 GEMVs, benchmarks/RESULTS.md) or "linear" (F.linear, cuBLAS).
    hift_prefetch: HiFT's sine-source random numbers (start phases and ~2 M normal draws per 10 s, a serial
      CPU loop of ~50 ms) drawn in a background thread while the GPU runs the flow, from the same generator
      in the same order (hift.draw_source): the same numbers, the generator left in the same state.
      `speak` only (streamed pieces draw as they go).
    hift_graph: live mode's pieces vocoded from CUDA graphs, one per mel length live pieces have (live_piece_frames:
      114), captured by prepare_live (hift_graph.HiftGraphs: source draws made on the host, STFT and iSTFT as DFT
      matrix products; within ~3e-4 of the eager waveform on the CPU); other lengths and hift_half run eagerly
      (offline `speak` too, unless prepare_live ran in the process and the mel has a live piece's length).
    """

    lm_graph: bool = True
    lm_bf16: bool = False
    lm_compile: bool = True
    flow_half: bool = True
    flow_graph: bool = True
    flow_fused: bool = False
    flow_compile: bool = False
    flow_encoder_graph: bool = False
    hift_half: bool = False
    lm_capacity: int = 2560  # KV-cache slots: prompt + generated tokens; longer calls fall back to eager
    lm_device_sampling: bool = True
    lm_readback: int = 16
    lm_step: str = "fused"
    lm_gemv: str = "reduce"
    hift_prefetch: bool = True
    hift_graph: bool = True


def fast_path_from_env() -> FastPath:
    """The serving FastPath with FLOW_KERNELS_ENV applied: a comma-separated list of FLOW_KERNEL_CHOICES ("fused":
    q/k/v as one projection, "compiled": the estimator's blocks compiled, "encoder_graph": the token encoder replayed
    from CUDA graphs) or "all"; unset or "" = the measured defaults (all off). Another word is refused, naming the
    variable and the choices."""
    raw = os.environ.get(FLOW_KERNELS_ENV, "").strip().lower()
    words = {w.strip() for w in raw.split(",") if w.strip()}
    if words == {"all"}:
        words = set(FLOW_KERNEL_CHOICES)
    unknown = sorted(words - set(FLOW_KERNEL_CHOICES))
    if unknown:
        raise ValueError(f"{FLOW_KERNELS_ENV}={raw!r}: {', '.join(unknown)} unknown; give a comma-separated list of "
                         f"{', '.join(FLOW_KERNEL_CHOICES)}, or all, or leave it unset")
    return FastPath(**{FLOW_KERNEL_CHOICES[w]: True for w in words})


def _prepared(kind: str, prepare: Any, fallback: str) -> dict[str, Any]:
    """prepare_live's report of one kind of graphs: `{kind}_graphs` (how many) and `{kind}_capture_s`, or, when the
    capture failed, 0 and `{kind}_graphs_error`, logged with what runs instead (`fallback`)."""
    start = time.perf_counter()
    try:
        count = prepare()
    except Exception as exc:  # noqa: BLE001 - any capture failure: the eager path still works
        log.warning("CosyVoice 2: %s CUDA graphs could not be captured (%s); %s", kind, exc, fallback)
        return {f"{kind}_graphs": 0, f"{kind}_graphs_error": f"{type(exc).__name__}: {exc}"[:300]}
    return {f"{kind}_graphs": count, f"{kind}_capture_s": round(time.perf_counter() - start, 2)}


def _resample(wave: np.ndarray, sr: int, target: int) -> np.ndarray:
    from ...audio.prepare import _resample as resample

    return resample(np.asarray(wave, np.float32), sr, target)


class CosyVoice2Runtime:
    """The loaded release: networks, tokenizer and the two ONNX front-end models."""

    hift_graphs_supported = True  # prepare_live may capture HiFT's graphs (hift_graph.HiftGraphs: this HiFT's source)

    def __init__(self, folder: str | Path, device: str = "cpu", fast: FastPath | None = None,
                 offload: bool = False) -> None:
        """fast: None = the FP32 eager reference path. offload: keep the three networks in CPU memory and
        move each to `device` only for its stage (peak GPU memory = the largest stage, not the sum; each
        call pays the copies, and the fast path's graphs are rebuilt every call)."""
        from transformers import AutoTokenizer

        self.folder = check_release(folder)
        self.device = torch.device(device)
        self.fast = fast
        self.offload = offload and self.device.type != "cpu"
        self.models = load_models(self.folder)
        if fast is not None and fast.lm_bf16:
            self.models.lm.to(torch.bfloat16)
        # HiFT with weight norm folded: a different module, same function (the reference keeps its own)
        self.hift = without_weight_norm(self.models.hift) if fast is not None else self.models.hift
        self._decoder: StaticDecoder | None = None
        self._solver: FastCFM | None = None
        self._encoder: Any = None       # flow_encoder.FastEncoder (FastPath.flow_encoder_graph), None, or False: failed
        self._flow_batcher: Any = None  # flow_batch.FlowRowBatcher over _solver (set_flow_rows), or None
        self._lm_batch: Any = None      # lm_batch.LMBatchLoop over _decoder (set_lm_rows), or None
        self._hift_graphs: Any = None   # hift_graph.HiftGraphs made by prepare_live (FastPath.hift_graph), or None
        self._drawer: ThreadPoolExecutor | None = None  # one worker: HiFT's source draws (hift_prefetch)
        self._weights_from: CosyVoice2Runtime | None = None  # a lane's first lane (lane())
        if not self.offload:
            for module in (self.models.lm, self.models.flow, self.hift):
                module.to(self.device)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.folder / "CosyVoice-BlankEN"))
        self.tokenizer.add_special_tokens(SPECIAL_TOKENS)
        # The reference runs both ONNX files with ONNX Runtime; so does the engine layer here.
        self.campplus = get_runner(ModelSpec(name=f"{NAME}-campplus", onnx_path=self.folder / "campplus.onnx"),
                                   backend="onnxruntime", precision="fp32", stage="voice")
        self.speech_tokenizer = get_runner(
            ModelSpec(name=f"{NAME}-speech-tokenizer", onnx_path=self.folder / "speech_tokenizer_v2.onnx"),
            backend="onnxruntime", precision="fp32", stage="voice")

    def lane(self) -> "CosyVoice2Runtime":
        """Another lane of this runtime (live mode's --tts-lanes): the same networks, tokenizer and front-end sessions
        - one copy of every weight, the fast path's fused LM weights and half-precision flow estimator included -
        with a decoder (KV cache, sampler state, CUDA graphs) and a flow solver (graphs and their memory pool) of its
        own. Why: with one of each, sessions' pieces ran one after another (a piece ~100 ms on an H200, 8 sessions
        need ~8 pieces a second: benchmarks/RESULTS_live.md); lanes run side by side, each session's stage on its
        own CUDA stream. What a lane costs is its graphs' memory and their capture at warm-up (the LM step's compiled
        code is reused: a second decoder on the CPU compiled in 0.17 s against the first's 20 s)."""
        if self.offload:
            raise ValueError("lanes share the networks on the device; create the runtime without offload")
        other = copy.copy(self)
        other._decoder, other._solver, other._drawer, other._flow_batcher = None, None, None, None
        other._hift_graphs, other._lm_batch, other._encoder = None, None, None
        other._weights_from = self._weights_from or self
        return other

    def text_ids(self, text: str) -> list[int]:
        return list(self.tokenizer([text], return_tensors="pt")["input_ids"][0].tolist())

    def speaker_state(self, wave: np.ndarray, sample_rate: int, transcript: str = "") -> dict[str, np.ndarray]:
        wave = np.asarray(wave, np.float32).reshape(-1)
        limit = int(MAX_PROMPT_SECONDS * sample_rate)
        if wave.size > limit:
            wave = wave[:limit]
        w24 = torch.from_numpy(_resample(wave, sample_rate, 24000))[None]
        w16 = torch.from_numpy(_resample(wave, sample_rate, 16000))[None]
        feat = prompt_mel(w24)[0]                                     # [frames, 80]
        mel128 = whisper_log_mel(w16)                                 # [1, 128, frames]
        names = self.speech_tokenizer.input_names()
        tokens = next(iter(self.speech_tokenizer.run({names[0]: mel128.numpy(),
                                                      names[1]: np.array([mel128.shape[2]], np.int32)}).values()))
        tokens = np.asarray(tokens).reshape(-1).astype(np.int32)
        n = min(feat.shape[0] // 2, tokens.size)  # the flow needs exactly 2 mel frames per token
        if n < 1:
            raise ValueError("the reference audio is too short for CosyVoice 2; give at least 1 s of speech")
        fbank = kaldi_fbank(w16)
        embedding = next(iter(self.campplus.run({self.campplus.input_names()[0]: fbank[None].numpy()}).values()))
        return {"prompt_feat": feat[: 2 * n].numpy().astype(np.float32), "prompt_token": tokens[:n],
                "embedding": np.asarray(embedding, np.float32).reshape(-1),
                "prompt_text_ids": np.array(self.text_ids(transcript) if transcript.strip() else [], np.int32)}

    @contextlib.contextmanager
    def _stage(self, name: str, module: torch.nn.Module, timings: dict[str, float] | None) -> Iterator[None]:
        """Time one stage (synchronizing the device when timings are asked for); with offload, bring its
        network to the device for the stage and send it back after (fast-path objects are dropped with it:
        a captured graph holds the device addresses of the weights it read)."""
        if self.offload:
            module.to(self.device)
        sync = timings is not None and self.device.type == "cuda"
        if sync:
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        try:
            yield
        finally:
            if sync:
                torch.cuda.synchronize(self.device)
            if timings is not None:
                timings[name] = timings.get(name, 0.0) + time.perf_counter() - start
            if self.offload:
                if module is self.models.lm:
                    self._decoder = None
                if module is self.models.flow:
                    self._solver = None
                    self._encoder = None
                module.to("cpu")
                torch.cuda.empty_cache()

    def _lm_decoder(self) -> StaticDecoder | None:
        if self.fast is None or not self.fast.lm_graph:
            return None
        if self._decoder is None:
            lm = self.models.lm
            first = self._weights_from._lm_decoder() if self._weights_from is not None else None
            self._decoder = StaticDecoder(lm, self.fast.lm_capacity, compile=self.fast.lm_compile,
                                          sampling=lm.sampling if self.fast.lm_device_sampling else None,
                                          readback=self.fast.lm_readback, step=self.fast.lm_step,
                                          gemv=self.fast.lm_gemv, weights_from=first)
        return self._decoder

    def _flow_encoder(self) -> Any:
        """The FastEncoder of FastPath.flow_encoder_graph (CosyVoice 2's conformer encoder only), or None."""
        from .flow import CausalFlow

        if self.fast is None or not self.fast.flow_encoder_graph or not isinstance(self.models.flow, CausalFlow):
            return None
        if self._encoder is None:
            from .flow_encoder import FastEncoder

            self._encoder = FastEncoder(self.models.flow, cuda_graph=self.device.type == "cuda" and not self.offload)
        return self._encoder or None

    def _flow_solver(self) -> FastCFM | None:
        if self.fast is None or not (self.fast.flow_half or self.fast.flow_graph):
            return None
        if self._solver is None:
            first = self._weights_from._flow_solver() if self._weights_from is not None else None
            self._solver = FastCFM(self.models.flow.decoder, torch.float16 if self.fast.flow_half else torch.float32,
                                   cuda_graph=self.fast.flow_graph and self.device.type == "cuda",
                                   estimator=first.estimator if first is not None else None,
                                   fused=self.fast.flow_fused, compiled=self.fast.flow_compile)
        return self._solver

    def set_flow_rows(self, rows: int) -> int:
        """Live mode's --tts-batch: up to `rows` flow solves of different threads (sessions) run as rows of one solve
        (flow_batch.FlowRowBatcher) from now on; returns the rows a solve may carry (1: each its own, as before;
        also without the fast path's solver, whose padded solves the rows need). Call before prepare_live."""
        if self._flow_batcher is not None:
            self._flow_batcher.close()
            self._flow_batcher = None
        solver = self._flow_solver()
        if int(rows) <= 1 or solver is None:
            return 1
        from ..cuda_streams import tts_priority
        from .flow_batch import FlowRowBatcher

        self._flow_batcher = FlowRowBatcher(solver, int(rows), self.models.flow.cfg.timesteps,
                                            stream_priority=tts_priority() if self.device.type == "cuda" else None)
        return self._flow_batcher.max_rows

    @torch.inference_mode()  # as prepare_live: the decoders compile their steps here (autograd on broke that)
    def set_lm_rows(self, rows: int) -> int:
        """Live mode's --tts-batch, the LM's half: up to `rows` generations (sessions) decode together, one step for
        all (lm_batch.LMBatchLoop over this runtime's StaticDecoder) from now on; returns the rows (1: off, as before;
        also without the fast path's device-sampled fused decoder, which the rows need). Call before prepare_live."""
        if self._lm_batch is not None:
            self._lm_batch.close()
            self._lm_batch = None
        decoder = self._lm_decoder()
        if int(rows) <= 1 or decoder is None or decoder.sampling is None or decoder.step_kind != "fused":
            return 1
        from .lm_batch import LMBatchLoop

        self._lm_batch = LMBatchLoop(decoder, int(rows), compile=bool(self.fast and self.fast.lm_compile))
        return self._lm_batch.rows

    @property
    def lm_batch(self) -> Any:
        """The LMBatchLoop of set_lm_rows, or None (its stats() say how many rows its steps carried)."""
        return self._lm_batch

    @property
    def flow_batcher(self) -> Any:
        """The FlowRowBatcher of set_flow_rows, or None (its calls, rows_run and largest say how rows were shared)."""
        return self._flow_batcher

    @torch.inference_mode()  # as serving: with autograd on, the LM step's compile failed on an H200 (2026-12-03,
    # "modified by an inplace operation": the KV cache's index_copy_) and fell back to the uncompiled step
    def prepare_live(self, state: dict[str, np.ndarray], max_speech_tokens: int) -> dict[str, Any]:
        """Capture now every CUDA graph that speaking up to `max_speech_tokens` per text chunk with this speaker's
        prompt needs (the LM step's, and the flow's for every length bucket), so that none is captured while
        live sessions use the GPU from other threads. No-op without the fast path's graphs."""
        out = {"flow_graphs": 0, "lm_graph": 0}
        solver = self._flow_solver()
        if solver is not None and solver.use_graph:
            frames = self.models.flow.cfg.token_mel_ratio * (int(np.asarray(state["prompt_token"]).size)
                                                               + int(max_speech_tokens))
            spk_dim = self.models.flow.spk_embed_affine_layer.out_features
            out["flow_graphs"] = (self._flow_batcher.prepare(frames, spk_dim) if self._flow_batcher is not None
                                  else solver.prepare(frames, self.models.flow.cfg.timesteps, spk_dim))
        encoder = self._flow_encoder()
        if encoder is not None and encoder.use_graph:
            out.update(self._prepare_encoder_graphs(encoder, int(np.asarray(state["prompt_token"]).size)
                                                    + int(max_speech_tokens)))
        decoder = self._lm_decoder()  # made (and on CUDA its step captured) now, if not yet
        out["lm_graph"] = int(decoder is not None and getattr(decoder, "graph", None) is not None)
        if self._lm_batch is not None:  # the batched step's graph (--tts-batch)
            out["lm_batch_graph"] = self._lm_batch.prepare()
        if decoder is not None:  # the static prefill's graphs (DIGITAL_HUMAN_COSYVOICE_STATIC_PREFILL=1), for
            # prompts of the speaker's prompt text and tokens plus a chunk's text (at least 2 speech tokens a text
            # token: the LM's min_token_text_ratio) and the LM's start and task tokens
            prompt = int(np.asarray(state.get("prompt_text_ids", ())).size) + int(np.asarray(state["prompt_token"]).size)
            out["prefill_graphs"] = decoder.prepare_prefill(prompt + 2 + int(max_speech_tokens) // 2)
        if self.hift_graphs_supported and self.fast is not None and self.fast.hift_graph and not self.fast.hift_half \
                and self.device.type == "cuda" and os.environ.get(HIFT_GRAPHS_ENV, "").strip() != "0":
            out.update(self._prepare_hift_graphs())
        if self.device.type == "cuda":  # what the graphs cost, for the live benchmark's report
            out["gpu_reserved_mib"] = int(torch.cuda.memory_reserved(self.device) // 2 ** 20)
        return out

    def _prepare_encoder_graphs(self, encoder: Any, max_tokens: int) -> dict[str, Any]:
        """The token encoder's graphs for every padded length up to `max_tokens`; after a failed capture the encoder
        runs eagerly from then on."""
        out = _prepared("encoder", lambda: encoder.prepare(max_tokens), "the flow encoder runs eagerly")
        if "encoder_graphs_error" in out:
            self._encoder = False
        return out

    def _prepare_hift_graphs(self) -> dict[str, Any]:
        """HiFT's graphs for every live piece length (FastPath.hift_graph); after a failed capture the pieces are
        vocoded eagerly as before (the capture worked on the H200, 2026-12-04)."""
        from .hift_graph import HiftGraphs

        graphs = self._hift_graphs or HiftGraphs(self.hift)
        lengths = live_piece_frames(lookahead=self.models.flow.cfg.pre_lookahead_len)
        out = _prepared("hift", lambda: graphs.prepare(lengths),
                        f"live pieces are vocoded eagerly ({HIFT_GRAPHS_ENV}=0 skips the attempt)")
        self._hift_graphs = None if "hift_graphs_error" in out else graphs
        return out

    def _inputs(self, text_ids: list[int], state: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        dev = self.device
        t = lambda a, dtype: torch.as_tensor(np.asarray(a), dtype=dtype, device=dev)[None]  # noqa: E731
        prompt_text = t(state["prompt_text_ids"], torch.int32)
        prompt_token = t(state["prompt_token"], torch.int32)
        zero_shot = prompt_text.shape[1] > 0
        return {"text": t(text_ids, torch.int32), "prompt_text": prompt_text, "prompt_token": prompt_token,
                "lm_prompt": prompt_token if zero_shot else prompt_token[:, :0],
                "prompt_feat": t(state["prompt_feat"], torch.float32), "embedding": t(state["embedding"], torch.float32)}

    def _tokens(self, x: dict[str, torch.Tensor], generator: torch.Generator, **limits: Any) -> Iterator[int]:
        return self.models.lm.generate(x["text"], x["prompt_text"], x["lm_prompt"], generator=generator,
                                       decoder=self._lm_batch or self._lm_decoder(), **limits)

    def _mel(self, tokens: list[int], x: dict[str, torch.Tensor]) -> torch.Tensor:
        token = torch.as_tensor(tokens, dtype=torch.int32, device=self.device)[None]
        encoder = self._flow_encoder()
        return self.models.flow.inference(token, x["prompt_token"], x["prompt_feat"], x["embedding"],
                                          solver=self._flow_batcher or self._flow_solver(),
                                          **({"encoder": encoder} if encoder is not None else {}))

    def _wave(self, mel: torch.Tensor, generator: torch.Generator, draws: SourceDraws | None = None) -> torch.Tensor:
        graphs = self._hift_graphs
        if graphs is not None and graphs.covers(int(mel.shape[2])):  # a live piece: replayed (prepare_live)
            if draws is None:
                cfg = self.hift.cfg
                draws = draw_source(generator, int(mel.shape[2]), 1, cfg.nb_harmonics, graphs.samples_per_frame,
                                    pin=self.device.type == "cuda")
            return graphs(mel, draws)
        return self.hift.inference(mel, generator=generator, half=self.fast is not None and self.fast.hift_half,
                                   draws=draws)

    def _prefetch_draws(self, generator: torch.Generator, frames: int) -> Future | None:
        """Start drawing HiFT's source randoms for `frames` mel frames (FastPath.hift_prefetch), or None.

        Safe only while nothing else draws from `generator` until the result is taken: in `speak` the
        flow, which runs meanwhile, uses no generator. torch's CPU draw releases the GIL, so the thread
        runs beside the main thread's flow launches."""
        if self.fast is None or not self.fast.hift_prefetch:
            return None
        if self._drawer is None:
            self._drawer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cosyvoice-hift-draws")
        cfg = self.hift.cfg
        samples = int(np.prod(cfg.upsample_rates)) * cfg.hop_len
        return self._drawer.submit(draw_source, generator, frames, 1, cfg.nb_harmonics, samples,
                                   self.device.type == "cuda")

    @torch.inference_mode()
    def speak(self, text_ids: list[int], state: dict[str, np.ndarray], generator: torch.Generator,
              speed: float = 1.0, timings: dict[str, float] | None = None,
              **limits: Any) -> tuple[np.ndarray, int]:
        """One chunk: (waveform, speech tokens generated). timings: filled with seconds per stage
        (lm_s, flow_s, hift_s). limits: min_tokens / max_tokens for the LM (benchmarks)."""
        x = self._inputs(text_ids, state)
        with self._stage("lm_s", self.models.lm, timings):
            tokens = list(self._tokens(x, generator, **limits))
        if not tokens:
            return np.zeros(0, np.float32), 0
        ratio = self.models.flow.cfg.token_mel_ratio
        frames = ratio * len(tokens) if speed == 1.0 else max(1, int(ratio * len(tokens) / speed))
        draws = self._prefetch_draws(generator, frames)
        with self._stage("flow_s", self.models.flow, timings):
            mel = self._mel(tokens, x)
            if speed != 1.0:
                mel = F.interpolate(mel, size=max(1, int(mel.shape[2] / speed)), mode="linear")
        with self._stage("hift_s", self.hift, timings):
            wave = self._wave(mel, generator, draws.result() if draws is not None else None)[0].float().cpu().numpy()
        return wave, len(tokens)

    @torch.inference_mode()
    def speak_stream(self, text_ids: list[int], state: dict[str, np.ndarray], generator: torch.Generator,
                     hift_generator: torch.Generator | None = None, hop_tokens: int = STREAM_HOP_TOKENS,
                     first_hop_tokens: int | None = None, deferred: bool = False, pausable: bool = False,
                     **limits: Any) -> Iterator[Any]:
        """One chunk as audio pieces while the LM is still generating (time to first audio ~ hop_tokens steps;
        first_hop_tokens: the first piece's, when smaller - live mode starts speaking sooner; the hops after it
        then grow from it to hop_tokens, doubling the speech sent).

        Each piece re-runs the (full-context, offline) flow on every token so far and vocodes the mel frames
        not yet sent, minus the last pre_lookahead_len tokens' frames (they change when the next tokens
        arrive), with HIFT_CONTEXT_FRAMES of left context. Not the reference's chunk-causal streaming: the
        pieces join to about, not exactly, `speak`'s waveform (the flow of a prefix differs a little from
        the flow of the whole). HiFT draws from `hift_generator` so that the LM's tokens are the same as
        `speak`'s for the same `generator`. Not with offload.

        deferred: yield each piece as a function that makes its audio (flow + HiFT), called by the consumer before it
        asks for the next piece: live mode's --tts-batch holds the LM's lock for the tokens only, and makes the audio
        outside it, so that other sessions' pieces reach the flow batcher at the same time. The same audio. A deferred
        stream also yields PAUSE after every PAUSE_TOKENS tokens without a piece: there its consumer may give the LM to
        an utterance whose first piece waits (LiveVoice does), instead of holding it for up to a whole hop (50 tokens);
        the decoder parks and restores this generation's state (StaticDecoder.claim). pausable: the same PAUSEs in a
        stream that is not deferred (live mode without --tts-batch: there the lock is held for a piece's tokens and its
        audio, and a waiting first piece took the lane only after a whole hop, up to 50 tokens and the audio)."""
        if self.offload:
            raise ValueError("speak_stream keeps every network on the device; create the runtime without offload")
        x = self._inputs(text_ids, state)
        hift_generator = hift_generator or torch.Generator().manual_seed(0)
        lookahead = self.models.flow.cfg.pre_lookahead_len
        tokens: list[int] = []
        sent = 0  # mel frames already vocoded

        ratio = self.models.flow.cfg.token_mel_ratio

        def piece(final: bool) -> Any:
            nonlocal sent
            until, done = list(tokens), sent  # this piece's tokens and the frames sent before it
            end = ratio * (len(until) if final else len(until) - lookahead)
            sent = end

            @torch.inference_mode()  # deferred, it runs outside this generator's inference mode
            def audio() -> np.ndarray:
                mel = self._mel(until, x)
                start = max(0, done - HIFT_CONTEXT_FRAMES)
                wave = self._wave(mel[:, :, start:end], hift_generator)[0]
                samples = wave.shape[0] // (end - start)  # samples per mel frame (480)
                return wave[(done - start) * samples:].float().cpu().numpy()

            return audio if deferred else audio()

        first = max(1, int(first_hop_tokens or hop_tokens))
        if first_hop_tokens:  # a device sampler reads its first block back as soon as the first piece can be made
            limits = {**limits, "first_readback": first + lookahead}

        def hop() -> int:
            return next_hop(sent, first, hop_tokens, bool(first_hop_tokens))

        quiet = 0  # tokens since the last piece or pause (deferred)
        for token in self._tokens(x, generator, **limits):
            tokens.append(token)
            quiet += 1
            if ratio * (len(tokens) - lookahead) - sent >= 2 * hop():
                quiet = 0
                yield piece(False)
            elif (deferred or pausable) and quiet >= PAUSE_TOKENS:
                quiet = 0
                yield PAUSE
        if tokens and ratio * len(tokens) > sent:
            yield piece(True)


class CosyVoice2Engine:
    """TTS engine entry (registry line in voice/engines.py)."""

    name = NAME
    sample_rate = SAMPLE_RATE
    description = f"CosyVoice 2 zero-shot voice cloning ({LICENSE}); needs the user's {RELEASE_NAME} folder."

    def __init__(self, folder: str | Path | None = None, device: str = "cpu", fast: bool | None = None) -> None:
        """fast: the FastPath speed-ups (CUDA only); None = on when DIGITAL_HUMAN_COSYVOICE_FAST=1."""
        self.folder = Path(folder) if folder else default_folder()
        self.device = device
        if fast is None:
            fast = os.environ.get(FAST_ENV, "") == "1"
        self.fast = bool(fast) and torch.device(device).type == "cuda"
        self._runtime: CosyVoice2Runtime | None = None
        self._lanes: list[CosyVoice2Runtime] = []  # lanes after the first (set_lanes)

    def check_files(self) -> None:
        """Raise one error naming every missing release file (and the missing extra)."""
        check_release(self.folder)
        from .lm import require_transformers

        require_transformers()

    def runtime(self, lane: int = 0) -> CosyVoice2Runtime:
        """The loaded release; lane > 0: that lane (set_lanes), which shares its networks."""
        if self._runtime is None:
            self._runtime = CosyVoice2Runtime(self.folder, self.device, fast_path_from_env() if self.fast else None)
        if lane <= 0:
            return self._runtime
        if lane > len(self._lanes):
            raise ValueError(f"lane {lane} does not exist: set_lanes made {len(self._lanes) + 1}")
        return self._lanes[lane - 1]

    def set_lanes(self, count: int) -> int:
        """Live mode: `count` lanes (CosyVoice2Runtime.lane) that sessions' streams may use at the same time, at most
        MAX_LANES; returns how many there are. Call before prepare_live (which prepares every lane)."""
        count = max(1, min(int(count), MAX_LANES))
        base = self.runtime()
        while len(self._lanes) < count - 1:
            self._lanes.append(base.lane())
        del self._lanes[count - 1:]
        return count

    def set_flow_rows(self, rows: int) -> int:
        """Live mode's --tts-batch: sessions' flow solves as rows of one, up to `rows` (CosyVoice2Runtime.set_flow_rows,
        the first lane's); returns the rows one solve may carry (1 = off: no fast path, or rows <= 1)."""
        return self.runtime().set_flow_rows(rows)

    def set_lm_rows(self, rows: int) -> int:
        """Live mode's --tts-batch, the LM's half: up to `rows` sessions' generations decode together
        (CosyVoice2Runtime.set_lm_rows, the first lane's); returns the rows (1 = off)."""
        return self.runtime().set_lm_rows(rows)

    def lm_batching(self) -> dict[str, Any] | None:
        """How set_lm_rows' loop shared the LM steps so far (steps, row_steps, largest, max_rows, mean_rows); None
        when it is off."""
        loop = self.runtime().lm_batch
        return None if loop is None else loop.stats()

    def flow_batching(self) -> dict[str, int] | None:
        """How set_flow_rows' batcher shared the flow solves so far: calls, solves, the most in one call, its rows;
        None when it is off."""
        batcher = self.runtime().flow_batcher
        if batcher is None:
            return None
        return {"calls": batcher.calls, "solves": batcher.rows_run, "largest": batcher.largest,
                "max_rows": batcher.max_rows}

    def prepare_speaker(self, prepared: Any, transcript: str = "", speaker: Any = None, **_: Any) -> Any:
        from ...voice.engines import with_engine_state

        if speaker is None:
            raise ValueError("prepare_speaker needs the speaker profile of the clip (ExtractSpeakerEmbedding makes it)")
        state = self.runtime().speaker_state(prepared.waveform, prepared.sample_rate,
                                             transcript or speaker.reference_text)
        return with_engine_state(speaker, NAME, state)

    def _state(self, speaker: Any) -> dict[str, np.ndarray]:
        from ...voice.engines import engine_state

        state = engine_state(speaker, NAME)
        if not {"prompt_feat", "prompt_token", "embedding", "prompt_text_ids"} <= set(state):
            raise ValueError("this speaker was not prepared for CosyVoice 2; run ExtractSpeakerEmbedding with "
                             "engine cosyvoice2 (or `digital-human speak --engine cosyvoice2 --voice clip.wav`)")
        return state

    def stream(self, text: str, speaker: Any, language: str = "auto", speed: float = 1.0, seed: int = 0,
               **_: Any) -> Iterator[np.ndarray]:
        """Sentence by sentence: each yielded piece is one chunk's audio followed by its pause."""
        from ...text.frontend import text_chunks

        state = self._state(speaker)
        runtime = self.runtime()
        _, chunks = text_chunks(text, language, lambda s: len(runtime.text_ids(s)), CHUNK_TOKENS)
        generator = torch.Generator().manual_seed(int(seed))
        for chunk in chunks:
            wave, _ = runtime.speak(runtime.text_ids(chunk.text), state, generator, speed)
            yield np.concatenate([wave, np.zeros(int(round(chunk.pause_after_s * SAMPLE_RATE)), np.float32)])

    def prepare_live(self, speaker: Any, max_speech_seconds: float = 20.0) -> dict[str, Any]:
        """Live mode's warm-up: every CUDA graph a chunk of up to `max_speech_seconds` needs, captured now
        (CosyVoice2Runtime.prepare_live), for every lane (set_lanes): counts summed over the lanes, `lanes` added
        when there are several."""
        state, tokens = self._state(speaker), int(round(max_speech_seconds * 25))
        out: dict[str, Any] = {}
        for lane in range(len(self._lanes) + 1):
            for key, value in self.runtime(lane).prepare_live(state, tokens).items():
                # reserved: after all lanes; an error text: as it is
                out[key] = value if key == "gpu_reserved_mib" or not isinstance(value, int) else out.get(key, 0) + value
        if self._lanes:
            out["lanes"] = len(self._lanes) + 1
        return out

    def live_stream(self, text: str, speaker: Any, language: str = "auto", seed: int = 0,
                    first_hop_tokens: int = FIRST_HOP_TOKENS, hop_tokens: int = LIVE_HOP_TOKENS,
                    limits: Any = None, lane: int = 0, deferred: bool = False,
                    pausable: bool = False) -> Iterator[Any]:
        """Live mode: each chunk's audio streamed while its LM runs (speak_stream), the first piece after
        `first_hop_tokens` speech tokens, later ones every `hop_tokens`; a chunk's pause leads the next chunk's first piece.
        limits: text -> {"min_tokens", "max_tokens"} of the LM (benchmarks on random weights, which never draw a
        sensible stop token) or None. Speed is 1 (speak_stream has no speed control). lane: which of set_lanes'
        lanes runs it (the caller keeps one stream at a time on a lane, or serialises them: a lane's decoder
        parks a suspended stream's state, but its calls are not thread-safe). deferred: each piece as a function that
        makes its audio, to be called before the next piece is asked for (speak_stream's deferred: --tts-batch).
        pausable: PAUSE every PAUSE_TOKENS tokens without a piece, deferred or not (speak_stream): where the caller
        may let a waiting first piece use the LM (LiveVoice asks for them). A deferred stream pauses either way."""
        from ...text.frontend import text_chunks

        state = self._state(speaker)
        runtime = self.runtime(lane)
        _, chunks = text_chunks(text, language, lambda s: len(runtime.text_ids(s)), CHUNK_TOKENS)
        generator = torch.Generator().manual_seed(int(seed))
        hift = torch.Generator().manual_seed(int(seed) + 1)
        pause = None
        for i, chunk in enumerate(chunks):
            extra = dict(limits(chunk.text)) if limits is not None else {}
            pieces = runtime.speak_stream(runtime.text_ids(chunk.text), state, generator, hift, hop_tokens=hop_tokens,
                                          first_hop_tokens=first_hop_tokens if i == 0 else None, deferred=deferred,
                                          pausable=pausable, **extra)
            for piece in pieces:  # each piece as soon as it is made (or, deferred, its tokens are)
                lead, pause = pause, None
                if getattr(piece, "is_pause", False):
                    pause = lead  # not a piece: the chunk's pause waits for the next one
                    yield piece
                elif deferred:
                    yield piece if lead is None else (lambda audio=piece, lead=lead: np.concatenate([lead, audio()]))
                else:
                    yield piece if lead is None else np.concatenate([lead, piece])
            # the chunk's pause goes before the next chunk's first piece (after the last piece it would hold that
            # piece back; alone, a piece of silence is no speech for a talking head)
            pause = np.zeros(int(round(chunk.pause_after_s * SAMPLE_RATE)), np.float32) if chunk.pause_after_s > 0 \
                else None

    def synthesize(self, text: str, speaker: Any, language: str = "auto", speed: float = 1.0, seed: int = 0,
                   progress: Any = None, **_: Any) -> Any:
        from ...voice.tts import SpeechResult

        start = time.perf_counter()
        pieces = list(self.stream(text, speaker, language, speed, seed))
        waveform = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        if not np.any(waveform):
            raise ValueError("CosyVoice 2 produced no speech for this text")
        return SpeechResult(waveform=waveform.astype(np.float32), sample_rate=SAMPLE_RATE, backend=f"torch ({self.device})",
                            precision="fp32+fp16 (fast path)" if self.fast else "fp32", voice=f"{speaker.name or 'speaker'} (CosyVoice 2 zero-shot)",
                            chunks=len(pieces), timings={"synthesis": time.perf_counter() - start})
