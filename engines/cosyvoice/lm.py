"""CosyVoice 2 speech-token language model: Qwen2 (transformers) + speech-token embeddings and head.

The Qwen2 body comes from transformers (optional extra `pip install .[cosyvoice]`), built from the
release's `CosyVoice-BlankEN/config.json`; every weight comes from `llm.pt`. Decoding follows the
released runtime: [sos] text [task] prompt-speech-tokens, then one token per step with a KV cache,
sampled by top-p/top-k nucleus sampling with the repetition-aware rule (VALL-E 2): when the drawn
token already occurs in the last `win_size` tokens, it is banned and a token is drawn from the full
distribution instead. All draws use one torch.Generator, so the same seed gives the same tokens.

ras_sample (the reference's rule, on the host) is what the eager path uses; ras_sample_tensor is the same rule
as tensor ops only (no host sync), which the fast path's StaticDecoder runs on the GPU inside its CUDA graph.
The two draw from the same distribution but not the same tokens for a seed (see ras_sample_tensor).
"""
from __future__ import annotations

import logging
import os
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


log = logging.getLogger("digital_human")


def require_transformers():
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        raise ImportError("CosyVoice 2 needs transformers for its Qwen2 language model: "
                          "pip install 'comfyui-digital-human[cosyvoice]' (or pip install transformers)") from exc
    return transformers


@dataclass(frozen=True)
class SamplingConfig:
    top_p: float = 0.8
    top_k: int = 25
    win_size: int = 10
    tau_r: float = 0.1


def nucleus_pick(scores: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> int:
    probs, order = scores.softmax(dim=0).sort(descending=True, stable=True)
    # Keep adding the most likely tokens while the running float32 sum is below top_p (and fewer
    # than top_k are kept): a sequential float32 sum, so the cut falls where the reference's does.
    kept: list[float] = []
    total = np.float32(0.0)
    limit = np.float32(cfg.top_p)
    for value in probs[: cfg.top_k].tolist():
        if not (len(kept) == 0 or total < limit):
            break
        total = np.float32(total + np.float32(value))
        kept.append(value)
    draw = torch.tensor(kept, dtype=scores.dtype).multinomial(1, replacement=True, generator=generator)
    return int(order[int(draw)])


def ras_sample(scores: torch.Tensor, history: list[int], cfg: SamplingConfig,
               generator: torch.Generator | None) -> int:
    """Repetition-aware sampling on log-probabilities `scores` (1-D); may modify `scores`."""
    token = nucleus_pick(scores, cfg, generator)
    repeats = sum(1 for t in history[-cfg.win_size:] if t == token)
    if repeats >= cfg.win_size * cfg.tau_r:
        scores[token] = -float("inf")
        # drawn on the CPU (the generator's device), so a seed means the same on every device
        token = int(scores.softmax(dim=0).cpu().multinomial(1, replacement=True, generator=generator))
    return token


def ras_sample_tensor(logp: torch.Tensor, window: torch.Tensor, uniforms: torch.Tensor,
                      cfg: SamplingConfig) -> torch.Tensor:
    """Repetition-aware nucleus sampling as tensor ops only: no .item()/.tolist(), so no host sync, and
    capturable in a CUDA graph. Batched: logp [B, V] log-probabilities, window [B, W] the last W drawn
    tokens (-1 = empty slot), uniforms [B, 2] in [0, 1) (one for the nucleus draw, one for the fallback).
    Returns the drawn tokens, [B] int64.

    Same rule and distribution as ras_sample: keep the most likely tokens while the running sum of the
    ones before is below top_p (at most top_k, at least one), draw among them; if the drawn token occurs in
    the window at least win_size * tau_r times, draw from the full distribution with it removed. The draws
    are inverse-CDF lookups of the given uniforms instead of torch.multinomial on a CPU generator, and the
    running sums are the device's cumsum rather than a sequential float32 loop, so for a seed the tokens
    differ from ras_sample's (same distribution, deterministic for the same uniforms on the same device).
    """
    probs = logp.float().softmax(dim=-1)
    top, order = probs.topk(cfg.top_k, dim=-1)  # descending
    running = top.cumsum(dim=-1)
    # token i is kept when the sum of tokens 0..i-1 is below top_p; token 0 always
    kept = torch.cat([torch.ones_like(top[:, :1], dtype=torch.bool), running[:, :-1] < cfg.top_p], dim=-1)
    cdf = (top * kept).cumsum(dim=-1)
    # first index whose cdf exceeds u * total; the clamp guards u * total rounding up to the total
    pick = (cdf <= uniforms[:, :1] * cdf[:, -1:]).sum(dim=-1, keepdim=True)
    pick = torch.minimum(pick, kept.sum(dim=-1, keepdim=True) - 1)
    token = order.gather(-1, pick)  # [B, 1]

    repeats = (window == token).sum(dim=-1)
    banned = repeats >= cfg.win_size * cfg.tau_r
    # fallback: the full distribution without the drawn token (what softmax with its score at -inf gives)
    rest = probs.scatter(-1, token, 0.0)
    cdf_rest = rest.cumsum(dim=-1)
    other = (cdf_rest <= uniforms[:, 1:] * cdf_rest[:, -1:]).sum(dim=-1, keepdim=True)
    # never past the last token with probability > 0 (rounding at the top end of the cdf)
    index = torch.arange(rest.shape[-1], device=rest.device)
    last = torch.where(rest > 0, index, 0).amax(dim=-1, keepdim=True)
    other = torch.minimum(other, last)
    return torch.where(banned, other[:, 0], token[:, 0])


class _QwenHolder(nn.Module):
    """Keeps the `llm.model.*` key prefix of the released checkpoint."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model


def qwen2_from_config(config_dir: Path) -> nn.Module:
    transformers = require_transformers()
    config = transformers.Qwen2Config.from_pretrained(str(config_dir))
    config._attn_implementation = "sdpa"
    try:
        from transformers.modeling_utils import no_init_weights
    except ImportError:  # moved in some releases; then pay for the random initialisation
        from contextlib import nullcontext as no_init_weights

    with no_init_weights():  # every weight comes from llm.pt; skip 0.5 B random initialisations
        model = transformers.Qwen2ForCausalLM(config)
    model.tie_weights()  # skipped under no_init_weights; the release ties lm_head to embed_tokens
    return model


class SpeechLM(nn.Module):
    """Qwen2LM of CosyVoice 2 (inference only)."""

    def __init__(self, qwen: nn.Module, speech_token_size: int = 6561,
                 sampling: SamplingConfig = SamplingConfig()) -> None:
        super().__init__()
        hidden = qwen.config.hidden_size
        self.speech_token_size = speech_token_size
        self.sampling = sampling
        self.llm_embedding = nn.Embedding(2, hidden)  # 0 = sos, 1 = task id
        self.llm = _QwenHolder(qwen)
        self.llm_decoder = nn.Linear(hidden, speech_token_size + 3)
        self.speech_embedding = nn.Embedding(speech_token_size + 3, hidden)

    @property
    def stop_tokens(self) -> range:
        return range(self.speech_token_size, self.speech_token_size + 3)

    def min_len_banned(self, forced: bool) -> list[int]:
        """Tokens masked while fewer than the minimum length are drawn: the reference masks index
        speech_token_size only (CosyVoice 2's end of speech), also when min_tokens forces a length."""
        return [self.speech_token_size]

    def _sos_task(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.llm_embedding.weight[0], self.llm_embedding.weight[1]

    def prompt_embeddings(self, text: torch.Tensor, prompt_text: torch.Tensor,
                          prompt_speech_token: torch.Tensor) -> torch.Tensor:
        text_emb = self.llm.model.model.embed_tokens(torch.cat([prompt_text, text], dim=1).long())
        sos_row, task_row = self._sos_task()
        sos = sos_row.reshape(1, 1, -1)
        task = task_row.reshape(1, 1, -1)
        parts = [sos, text_emb, task]
        if prompt_speech_token.shape[1]:
            parts.append(self.speech_embedding(prompt_speech_token.long()))
        return torch.cat(parts, dim=1)

    def _step(self, embeds: torch.Tensor, cache):
        # No attention mask: causal over the prompt, everything cached for a step (the reference's full-length
        # masks). A mask of the new tokens' length only was ignored by transformers 4.x but is read as a
        # padding mask by 5.x, which then hides the cache from each step.
        out = self.llm.model.model(inputs_embeds=embeds, attention_mask=None,
                                   use_cache=True, past_key_values=cache, return_dict=True)
        return out.last_hidden_state[:, -1], out.past_key_values

    @torch.inference_mode()
    def logits_trace(self, text: torch.Tensor, prompt_text: torch.Tensor, prompt_speech_token: torch.Tensor,
                     forced: list[int]) -> torch.Tensor:
        """Log-probabilities of each step when the tokens `forced` are fed back (teacher forcing)."""
        embeds, cache, rows = self.prompt_embeddings(text, prompt_text, prompt_speech_token), None, []
        for token in [None, *forced]:
            if token is not None:
                embeds = self.speech_embedding.weight[token].reshape(1, 1, -1)
            hidden, cache = self._step(embeds, cache)
            rows.append(self.llm_decoder(hidden).log_softmax(dim=-1)[0])
        return torch.stack(rows)

    @torch.inference_mode()
    def generate(self, text: torch.Tensor, prompt_text: torch.Tensor, prompt_speech_token: torch.Tensor,
                 generator: torch.Generator | None = None, min_token_text_ratio: float = 2,
                 max_token_text_ratio: float = 20, decoder: "StaticDecoder | None" = None,
                 min_tokens: int | None = None, max_tokens: int | None = None,
                 first_readback: int | None = None) -> Iterator[int]:
        """Yield speech tokens one by one. text/prompt_text: [1, N] Qwen token ids. first_readback: with a device
        sampler, the first block read back after this many tokens (when fewer than its readback: a stream's first
        piece needs only a few; the tokens drawn are the same).

        decoder: a StaticDecoder built on this LM (fixed-size KV cache, CUDA graph on a GPU); the prompt runs
        through transformers, or on CUDA through the decoder's own padded forward (static_prefill, the same
        log-probs), and the one-token steps through its captured step. min_tokens/max_tokens override
        the text-length ratios (benchmarks force a length: random weights rarely draw a stop token)."""
        min_len = int(text.shape[1] * min_token_text_ratio) if min_tokens is None else int(min_tokens)
        max_len = int(text.shape[1] * max_token_text_ratio) if max_tokens is None else int(max_tokens)
        embeds, history = self.prompt_embeddings(text, prompt_text, prompt_speech_token), []
        if decoder is not None and not decoder.fits(embeds.shape[1] + max_len):
            decoder = None  # longer than its cache: the eager path has no length limit
        banned = self.min_len_banned(min_tokens is not None)
        if decoder is not None and hasattr(decoder, "generate_tokens"):  # lm_batch.LMBatchLoop: a row of its steps
            yield from decoder.generate_tokens(embeds, generator, min_len, max_len, banned, first_readback)
            return
        if decoder is not None and decoder.sampling is not None:
            yield from self._generate_on_device(decoder, embeds, generator, min_len, max_len, banned, first_readback)
            return
        cache, me = None, _Generation()
        try:
            for step in range(max_len):
                if decoder is None:
                    hidden, cache = self._step(embeds, cache)
                    logp = self.llm_decoder(hidden).log_softmax(dim=-1)[0]
                elif step == 0:
                    decoder.claim(me)
                    logp = decoder.prefill(embeds)
                else:
                    decoder.claim(me)  # another generation may have used the decoder while this one was suspended
                    logp = decoder.step(history[-1])
                if step < min_len:
                    logp[banned] = -float("inf")
                token = ras_sample(logp, history, self.sampling, generator)
                if token in self.stop_tokens:
                    return
                yield token
                history.append(token)
                if decoder is None:
                    embeds = self.speech_embedding.weight[token].reshape(1, 1, -1)
        finally:
            if decoder is not None:
                decoder.release(me)

    def _generate_on_device(self, decoder: "StaticDecoder", embeds: torch.Tensor, generator: torch.Generator | None,
                            min_len: int, max_len: int, banned: list[int] | None = None,
                            first_readback: int | None = None) -> Iterator[int]:
        """Tokens drawn by the decoder itself (ras_sample_tensor after each step, no host sync per token); the
        host reads them back every decoder.readback steps to look for a stop token. Steps run past a stop
        token within a read-back block are discarded (their K/V writes land in slots no later step reads)."""
        if max_len <= 0:
            return
        me = _Generation()
        try:
            decoder.claim(me)
            decoder.begin(embeds, generator, min_len, banned)  # prefill and token 0
            read, drawn = 0, 1
            while read < max_len:
                block = decoder.readback if read or not first_readback else max(1, min(first_readback,
                                                                                       decoder.readback))
                end = min(read + block, max_len)
                decoder.claim(me)  # another generation may have used the decoder while this one was suspended
                decoder.advance(end - drawn)
                drawn = end
                for token in decoder.drawn[read:end].tolist():  # the one sync per block
                    if token in self.stop_tokens:
                        return
                    yield token
                read = end
        finally:
            decoder.release(me)


def _cache_tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(key, value) per layer of a transformers DynamicCache, [1, kv_heads, T, head_dim] each."""
    if hasattr(cache, "key_cache"):  # transformers 4.x
        return list(zip(cache.key_cache, cache.value_cache))
    return [(layer.keys, layer.values) for layer in cache.layers]  # transformers 5.x


# The prompt's pass (prefill) through transformers' eager forward took ~50 ms on an H200 whatever the first hop
# (2026-12-03: LM to its first tokens 54 ms for 4- and 8-token first pieces): launch-bound, like the steps were.
# The static prefill replayed from CUDA graphs: 23 ms, the same log-probs and K/V to the bit (H200, 2026-12-03,
# benchmarks/RESULTS_live.md), so it is on by default on CUDA. On the CPU (no graphs) padding to a bucket only
# adds work: off there unless asked for.
PREFILL_ENV = "DIGITAL_HUMAN_COSYVOICE_STATIC_PREFILL"  # "1" on, "0" off; unset: on on CUDA
PREFILL_BUCKET = 64  # prompt lengths padded to a multiple of this: one captured graph per multiple

PV_CHUNKS = 32  # stages of the fused step's attention-weighted sum over the cache (see StaticDecoder._attend)


class _Generation:
    """Who is decoding (one `generate` call): StaticDecoder.claim keeps each suspended generation's state apart."""


def _fuse_rows(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One [sum of outs, in] weight (and bias) for linears that read the same input, so one mat-vec does the
    work of several. The linears' parameters are then re-pointed at row blocks of it: the same values, so
    the modules (and the eager path) compute exactly what they did, and the weights are not held twice.
    Row blocks of a contiguous matrix are contiguous, so the modules' own GEMMs are unchanged too."""
    has_bias = [m.bias is not None for m in linears]
    if any(has_bias) and not all(has_bias):
        raise ValueError("_fuse_rows: either all or none of the linears have a bias")
    # outside inference mode: parameters must not become inference tensors (later autograd-mode use breaks)
    with torch.inference_mode(False), torch.no_grad():
        weight = torch.cat([m.weight.detach() for m in linears])
        bias = torch.cat([m.bias.detach() for m in linears]) if all(has_bias) else None
        start = 0
        for m in linears:
            rows = m.weight.shape[0]
            m.weight.data = weight[start:start + rows]
            if bias is not None:
                m.bias.data = bias[start:start + rows]
            start += rows
    return weight, bias


class StaticDecoder:
    """One-token decode steps of a SpeechLM on a fixed-size KV cache, replayed as one CUDA graph.

    Why: eager transformers decoding launches ~20 small kernels per layer per token from Python, so a
    0.5 B LM on a GPU is bound by launch overhead, not by its 2 GB of weight reads. Here the step is
    written against the same modules (projections, RMSNorms, MLPs, rotary table, llm_decoder) with the
    cache preallocated and the position held in a device tensor, so every step has the same shapes
    and addresses and can be captured once and replayed. The prompt (prefill) still runs through
    transformers and its cache is copied in. On a CPU the same step runs eagerly (tests compare it
    with the eager path). Weights are shared with the LM: do not move the LM while a decoder exists.

    The step's input is the previous token as a device tensor (self.token; its embedding is looked up
    inside the step). With `sampling` set, the step also draws the next token with ras_sample_tensor and
    writes it to self.token (the next replay's input) and to self.drawn[step]: a whole generation then
    runs without the host reading anything until it asks (generate reads every `readback` steps). The
    draws use uniforms filled per generation from a device generator seeded by the caller's generator.

    step: "fused" (default) or "reference". Both are the same math on the same weights (FP32 results equal
    to rounding). "reference" is the first version: the modules' own projections (7 mat-vecs per layer) and
    scaled_dot_product_attention, which inductor lowers by copying the 2 K/V heads out to the 14 query
    heads (most of its attention time). "fused": q/k/v as one mat-vec and gate/up as one (the LM's
    weights are re-stored as row blocks of one matrix per layer, see _fuse_rows: no second copy), and
    grouped-query attention written against the 2-head cache directly (each K/V head serves its 7 query
    heads as a broadcast, nothing expanded). gemv: "linear" = the weight mat-vecs through F.linear (cuBLAS),
    "reduce" = written as a multiply and a row sum, which inductor turns into its own reduction kernels
    (only with compile; uncompiled it would materialize the products, so it falls back to "linear").
    """

    def __init__(self, lm: SpeechLM, capacity: int = 2560, cuda_graph: bool | None = None,
                 compile: bool = False, sampling: SamplingConfig | None = None, readback: int = 16,
                 step: str = "fused", gemv: str = "reduce", weights_from: "StaticDecoder | None" = None) -> None:
        """weights_from: another decoder of the same LM whose fused weights this one reads (live mode's TTS lanes:
        a KV cache, sampler state and graphs each, one copy of the weights)."""
        if step not in ("fused", "reference"):
            raise ValueError(f"step must be 'fused' or 'reference', not {step!r}")
        if gemv not in ("linear", "reduce"):
            raise ValueError(f"gemv must be 'linear' or 'reduce', not {gemv!r}")
        qwen = lm.llm.model.model
        cfg = qwen.config
        if getattr(cfg, "use_sliding_window", False):
            raise ValueError("StaticDecoder does not implement Qwen2 sliding-window attention")
        weight = lm.llm_decoder.weight
        self.lm, self.qwen, self.capacity = lm, qwen, int(capacity)
        self.sampling, self.readback = sampling, max(1, int(readback))
        self.device, self.dtype = weight.device, weight.dtype
        self.kv_heads = cfg.num_key_value_heads
        self.q_heads = cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        shape = (1, self.kv_heads, self.capacity, self.head_dim)
        self.keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in qwen.layers]
        self.values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in qwen.layers]
        self.positions = torch.arange(self.capacity, device=self.device)
        # static inputs of the captured step: the previous token, its embedding, its position
        self.token = torch.zeros(1, dtype=torch.long, device=self.device)
        self.embed = torch.zeros(1, 1, cfg.hidden_size, dtype=self.dtype, device=self.device)
        self.pos = torch.zeros(1, dtype=torch.long, device=self.device)
        # sampler state (used only with `sampling`): index of the token being drawn, the min-length rule,
        # the RAS window (-1 = empty), one pair of uniforms per drawn token, the drawn tokens
        vocab = weight.shape[0]
        self.step_index = torch.zeros(1, dtype=torch.long, device=self.device)
        self.min_len = torch.zeros(1, dtype=torch.long, device=self.device)
        self.window = torch.full((sampling.win_size if sampling else 1,), -1, dtype=torch.long, device=self.device)
        self.uniforms = torch.zeros(self.capacity, 2, dtype=torch.float32, device=self.device)
        self.drawn = torch.zeros(self.capacity, dtype=torch.long, device=self.device)
        self.end_of_speech = torch.arange(vocab, device=self.device) == lm.speech_token_size
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None
        # Several generations may be suspended at once (live sessions' streams share one decoder, each advanced a
        # piece at a time): the one whose state the buffers hold, the others' state parked (claim)
        self.used = 0  # cache slots holding this generation's keys/values (prompt + steps), host-side
        self._owner: Any = None  # weakref to the _Generation whose state the buffers hold
        # claim and release from different threads (a live stream closed on its session's thread while another
        # generation claims under the voice's lock): their bookkeeping one at a time
        self._turns = threading.Lock()
        self._parked: "weakref.WeakKeyDictionary[_Generation, dict]" = weakref.WeakKeyDictionary()
        # static_prefill: the prompt through the decoder's own forward at PREFILL_BUCKET-padded lengths (CUDA graphs
        # per length from prepare_prefill) instead of transformers' eager forward (PREFILL_ENV; default: CUDA only)
        choice = os.environ.get(PREFILL_ENV, "").strip()
        self.static_prefill = choice == "1" or (choice != "0" and self.device.type == "cuda")
        self._prefill_graphs: dict[int, tuple[Any, torch.Tensor, torch.Tensor]] = {}
        self._prefill_pool: Any = None
        self._capture_stream: Any = None  # _graph_stream()
        self.step_kind = step
        self.gemv = gemv if compile else "linear"
        self._fused: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]] = []
        if weights_from is not None and weights_from.lm is not lm:
            raise ValueError("weights_from must be a decoder of the same LM")
        if step == "fused" and weights_from is not None and weights_from._fused:
            self._fused = weights_from._fused  # fusing again would copy the weights and re-point the modules
        elif step == "fused":
            for layer in qwen.layers:
                attn, mlp = layer.self_attn, layer.mlp
                w_qkv, b_qkv = _fuse_rows([attn.q_proj, attn.k_proj, attn.v_proj])
                w_gu, _ = _fuse_rows([mlp.gate_proj, mlp.up_proj])
                self._fused.append((w_qkv, b_qkv, w_gu))
        self._fn = self._forward_fused if step == "fused" else self._forward
        self._draw_fn = self._draw
        self.draw_compiled = False
        if compile:
            # Why: even replayed from a graph, ~40 small kernels per layer cost ~2-3 us each on the GPU;
            # inductor fuses the norms, rotary and residual adds. Compiled here (first call), captured below.
            try:
                fn = torch.compile(self._fn, dynamic=False)
                self.pos.zero_()
                # traced with autograd on, the in-place K/V writes fail the compile (seen on an H200 when the
                # decoder was built outside inference mode: gpu_tts_pieces.py's lm section, 2026-12-04)
                with torch.inference_mode():
                    fn()
                self._fn = fn
            except Exception as exc:  # noqa: BLE001 - any compiler failure: keep the uncompiled step
                log.warning("CosyVoice 2 LM step: torch.compile failed (%s); using the uncompiled step", exc)
            if sampling is not None:
                # the sampler is ~40 tiny kernels uncompiled; fused it is a handful
                try:
                    draw = torch.compile(self._draw, dynamic=False)
                    with torch.inference_mode():
                        draw(torch.zeros(vocab, dtype=torch.float32, device=self.device))
                    self._draw_fn, self.draw_compiled = draw, True
                except Exception as exc:  # noqa: BLE001
                    log.warning("CosyVoice 2 sampler: torch.compile failed (%s); using the uncompiled sampler", exc)
            self._reset()
        use_graph = self.device.type == "cuda" if cuda_graph is None else cuda_graph
        if use_graph:
            try:
                self._capture()
            except Exception as exc:  # noqa: BLE001 - a compiled sampler that cannot be captured: retry without
                if not self.draw_compiled:
                    raise
                log.warning("CosyVoice 2 sampler: capture of the compiled sampler failed (%s); using the "
                            "uncompiled sampler", exc)
                self._draw_fn, self.draw_compiled = self._draw, False
                torch.cuda.synchronize(self.device)
                self._capture()

    def fits(self, length: int) -> bool:
        return length <= self.capacity

    # --- generations that take turns ---------------------------------------------------------------------------
    _STATE = ("pos", "token", "step_index", "min_len", "window", "uniforms", "drawn", "end_of_speech")

    def claim(self, generation: Any) -> None:
        """Make the buffers hold `generation`'s state before it uses the decoder: when another generation used it
        since (live sessions share one decoder, each advancing a piece at a time, other sessions' pieces in between),
        that one's state is parked (copied aside) and this one's parked state, if any, copied back in place (the
        captured graph reads the buffers' addresses). Only the cache slots in use are copied. Why: without it a
        session's next piece continued from another session's prompt and tokens (its KV cache, position and
        sampler state). Free when one generation runs alone. Not thread-safe: callers hold one lock around every
        use of the decoder (live: the voice's), and every generation's work is read back (synchronised) before
        it is suspended, so the buffers are settled when another claims them."""
        with self._turns:
            owner = self._owner() if self._owner is not None else None
            if owner is generation:
                return
            if owner is not None:
                self._parked[owner] = self._park()
            saved = self._parked.pop(generation, None)
            if saved is not None:
                self._restore(saved)
            self._owner = weakref.ref(generation)

    def release(self, generation: Any) -> None:
        """`generation` has ended: nothing of it is parked or kept."""
        with self._turns:
            self._parked.pop(generation, None)
            if self._owner is not None and self._owner() is generation:
                self._owner = None

    def _park(self) -> dict:
        n = max(0, min(int(self.used), self.capacity))
        saved = {"used": n, "keys": [k[:, :, :n].clone() for k in self.keys],
                 "values": [v[:, :, :n].clone() for v in self.values],
                 **{name: getattr(self, name).clone() for name in self._STATE}}
        if self.device.type == "cuda":  # restored maybe from another thread's stream: it waits for these copies
            saved["event"] = torch.cuda.Event()
            saved["event"].record(torch.cuda.current_stream(self.device))
        return saved

    def _restore(self, saved: dict) -> None:
        stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        if stream is not None:
            stream.wait_event(saved["event"])
        n = saved["used"]
        for dst, src in zip(self.keys + self.values, saved["keys"] + saved["values"]):
            dst[:, :, :n].copy_(src)
        for name in self._STATE:
            getattr(self, name).copy_(saved[name])
        self.used = n
        if stream is not None:  # the copies may be freed (with `saved`) before this stream has read them
            for t in saved["keys"] + saved["values"] + [saved[name] for name in self._STATE]:
                t.record_stream(stream)

    def _reset(self) -> None:
        self.pos.zero_()
        self.token.zero_()
        self.step_index.zero_()
        self.window.fill_(-1)

    def _forward(self) -> torch.Tensor:
        """Log-probabilities for the token at self.pos (its embedding in self.embed); writes its K/V."""
        from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

        x = self.embed
        cos, sin = self.qwen.rotary_emb(x, self.pos.view(1, 1))
        # keys at positions <= pos are valid; later slots hold stale values and are masked out
        visible = (self.positions <= self.pos).view(1, 1, 1, -1)
        for layer, k_cache, v_cache in zip(self.qwen.layers, self.keys, self.values):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(1, 1, -1, self.head_dim).transpose(1, 2)
            k = attn.k_proj(h).view(1, 1, -1, self.head_dim).transpose(1, 2)
            v = attn.v_proj(h).view(1, 1, -1, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            k_cache.index_copy_(2, self.pos, k)
            v_cache.index_copy_(2, self.pos, v)
            o = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=visible, scale=attn.scaling,
                                               enable_gqa=True)
            x = x + attn.o_proj(o.transpose(1, 2).reshape(1, 1, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        logits = self.lm.llm_decoder(self.qwen.norm(x))
        self.pos.add_(1)  # inside the graph: the next replay writes the next slot
        return logits.float().log_softmax(dim=-1)[0, 0]

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [1, 1, in] times weight [out, in]^T (+ bias): the mat-vec of every projection in the fused step."""
        if self.gemv == "linear":
            return F.linear(x, weight, bias)
        # Why a multiply and a row sum: inductor compiles it into one reduction kernel reading each weight row
        # once (coalesced along `in`), with the input's producer (norm, activation) fused into its loads,
        # instead of a cuBLAS GEMV call; the sum runs in float32 whatever the weights' dtype.
        y = (x.reshape(1, -1).float() * weight.float()).sum(dim=-1)
        if bias is not None:
            y = y + bias.float()
        return y.to(x.dtype).view(1, 1, -1)

    def _attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, visible: torch.Tensor,
                scale: float) -> torch.Tensor:
        """Grouped-query attention of one token. q [1, q_heads, 1, d]; caches [1, kv_heads, L, d]; visible [L].
        Query head h uses K/V head h // group (transformers' repeat_kv order), so q viewed as
        [kv_heads, group, d] lines up with the cache's heads and broadcasting does the sharing: no expanded
        copy of the cache. Written as multiplies and sums (not matmul) so that inductor emits reduction
        kernels over the cache (cuBLAS' batched GEMVs for these shapes were slow in the reference step's
        profile); scores and softmax in float32, as the math SDPA backend."""
        group = self.q_heads // self.kv_heads
        qg = q.reshape(self.kv_heads, group, 1, self.head_dim).float()
        keys, values = k_cache[0].float(), v_cache[0].float()  # [kv_heads, L, d]
        scores = (qg * keys[:, None]).sum(dim=-1) * scale  # [kv_heads, group, L]
        scores = torch.where(visible, scores, -float("inf"))
        probs = scores.softmax(dim=-1)
        # The weighted sum over the L slots in two stages (chunks of L, then the chunk sums): as one sum,
        # inductor gives each of only kv_heads * group * d = 896 outputs a serial loop over 2560 slots
        # (0.40 ms of a 1.40 ms step on the H200); chunked, the first stage has PV_CHUNKS times the outputs.
        length = values.shape[1]
        chunks = PV_CHUNKS if length % PV_CHUNKS == 0 else 1
        weighted = probs[..., None] * values[:, None]  # [kv_heads, group, L, d]
        out = weighted.view(self.kv_heads, group, chunks, length // chunks, self.head_dim).sum(dim=-2).sum(dim=-2)
        return out.to(q.dtype).reshape(1, 1, -1)

    def _forward_fused(self) -> torch.Tensor:
        """The step of _forward with q/k/v and gate/up as one mat-vec each and GQA on the 2-head cache."""
        from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

        x = self.embed
        cos, sin = self.qwen.rotary_emb(x, self.pos.view(1, 1))
        visible = self.positions <= self.pos  # later slots hold stale values
        d = self.head_dim
        sizes = [self.q_heads * d, self.kv_heads * d, self.kv_heads * d]
        for layer, (w_qkv, b_qkv, w_gu), k_cache, v_cache in zip(self.qwen.layers, self._fused, self.keys,
                                                                  self.values):
            attn, mlp = layer.self_attn, layer.mlp
            q, k, v = self._linear(layer.input_layernorm(x), w_qkv, b_qkv).split(sizes, dim=-1)
            q = q.view(1, 1, -1, d).transpose(1, 2)
            k = k.view(1, 1, -1, d).transpose(1, 2)
            v = v.view(1, 1, -1, d).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            k_cache.index_copy_(2, self.pos, k)
            v_cache.index_copy_(2, self.pos, v)
            o = self._attend(q, k_cache, v_cache, visible, attn.scaling)
            x = x + self._linear(o, attn.o_proj.weight, attn.o_proj.bias)
            gate, up = self._linear(layer.post_attention_layernorm(x), w_gu, None).chunk(2, dim=-1)
            x = x + self._linear(mlp.act_fn(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
        head = self.lm.llm_decoder
        logits = self._linear(self.qwen.norm(x), head.weight, head.bias)
        self.pos.add_(1)  # inside the graph: the next replay writes the next slot
        return logits.float().log_softmax(dim=-1)[0, 0]

    def _draw(self, logp: torch.Tensor) -> None:
        """Draw the token after `logp` into self.token / self.drawn / the window; advance step_index."""
        assert self.sampling is not None
        # clamped: teacher-forced steps (step()) may replay the graph past the capacity of the buffers
        i = self.step_index.clamp(max=self.capacity - 1)
        # the min-length rule: no end-of-speech token before min_len tokens (as generate's eager loop)
        logp = torch.where(self.end_of_speech & (self.step_index < self.min_len), -float("inf"), logp)
        token = ras_sample_tensor(logp.view(1, -1), self.window.view(1, -1), self.uniforms.index_select(0, i),
                                  self.sampling)
        self.window.index_copy_(0, self.step_index % self.window.shape[0], token)
        self.drawn.index_copy_(0, i, token)
        self.token.copy_(token)
        self.step_index.add_(1)

    def _graph_step(self) -> torch.Tensor:
        """One step from self.token: embedding lookup, forward, and (with sampling) the draw."""
        self.embed.copy_(self.lm.speech_embedding.weight.index_select(0, self.token).view(1, 1, -1))
        logp = self._fn()
        if self.sampling is not None:
            self._draw_fn(logp)
        return logp

    def _graph_stream(self) -> Any:
        """This decoder's stream for its captures and their warm-ups (cuda_streams.capture_stream: its own cuBLAS
        workspace, so that another lane's decoder replaying at the same time does not write it)."""
        if self._capture_stream is None:
            from ..cuda_streams import capture_stream

            self._capture_stream = capture_stream(self.device)
        return self._capture_stream

    def _capture(self) -> None:
        # Warm-up on the capture stream (lazy cuBLAS/SDPA init and the workspace must not happen during capture),
        # then capture. These runs write garbage K/V at positions 0..3; prefill overwrites them before any real step.
        stream = self._graph_stream()
        current = torch.cuda.current_stream(self.device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            for _ in range(3):
                self._reset()
                self._graph_step()
        self.graph = torch.cuda.CUDAGraph()
        # thread-local: other threads' GPU work (live mode's talking head) neither fails nor breaks the capture
        with torch.cuda.graph(self.graph, stream=stream, capture_error_mode="thread_local"):
            self.out = self._graph_step()
        current.wait_stream(stream)
        self._reset()

    def prefill(self, embeds: torch.Tensor) -> torch.Tensor:
        """Run the prompt, keep its K/V; log-probs of step 0. Through transformers (as the eager path does), or
        with static_prefill on: the decoder's own forward over the prompt padded to a PREFILL_BUCKET multiple,
        replayed from that length's CUDA graph when prepare_prefill captured one."""
        n = embeds.shape[1]
        if self.static_prefill and n <= self.capacity:
            hidden = self._static_prefill(embeds.to(self.dtype), n)
        else:
            hidden, cache = self.lm._step(embeds.to(self.dtype), None)
            for (k, v), k_cache, v_cache in zip(_cache_tensors(cache), self.keys, self.values):
                k_cache[:, :, :n].copy_(k)
                v_cache[:, :, :n].copy_(v)
        self.pos.fill_(n)
        self.used = n
        return self.lm.llm_decoder(hidden).float().log_softmax(dim=-1)[0]

    # --- the prompt as static shapes (static_prefill) ------------------------------------------------------------
    def _prefill_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The LM over a whole prompt x [1, P, hidden] from position 0 (causal), written against the same modules
        as transformers' Qwen2 forward; writes K/V slots 0..P-1; the final-norm hidden states [1, P, hidden].
        Rows past the real prompt (padding) see only earlier rows and are never seen by them (causal), so the
        real rows' states and K/V are those of the unpadded prompt; the padding's slots are rewritten by the
        steps before any step reads them (a step sees slots <= its position)."""
        from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

        length = x.shape[1]
        cos, sin = self.qwen.rotary_emb(x, self.positions[:length].view(1, -1))
        for layer, k_cache, v_cache in zip(self.qwen.layers, self.keys, self.values):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(1, length, -1, self.head_dim).transpose(1, 2)
            k = attn.k_proj(h).view(1, length, -1, self.head_dim).transpose(1, 2)
            v = attn.v_proj(h).view(1, length, -1, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            k_cache[:, :, :length].copy_(k)
            v_cache[:, :, :length].copy_(v)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=attn.scaling, enable_gqa=True)
            x = x + attn.o_proj(o.transpose(1, 2).reshape(1, length, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.qwen.norm(x)

    def _static_prefill(self, embeds: torch.Tensor, n: int) -> torch.Tensor:
        """Hidden state [1, hidden] of the prompt's last row, through the padded static forward."""
        padded = min(self.capacity, -(-n // PREFILL_BUCKET) * PREFILL_BUCKET)
        graph = self._prefill_graphs.get(padded)
        if graph is not None:
            replay, static_in, static_out = graph
            static_in[:, :n].copy_(embeds)
            static_in[:, n:].zero_()
            replay()
            return static_out[:, n - 1].clone()
        x = torch.zeros(1, padded, embeds.shape[-1], dtype=self.dtype, device=self.device)
        x[:, :n] = embeds
        return self._prefill_forward(x)[:, n - 1]

    def prepare_prefill(self, max_length: int) -> int:
        """Capture the static prefill's CUDA graph for every PREFILL_BUCKET length up to `max_length` (CUDA and
        static_prefill only; all in one memory pool: one prefill runs at a time); returns how many exist."""
        if not (self.static_prefill and self.device.type == "cuda"):
            return 0
        hidden = self.qwen.config.hidden_size
        top = min(self.capacity, -(-int(max_length) // PREFILL_BUCKET) * PREFILL_BUCKET)
        stream = self._graph_stream()  # the step graph's: one generation at a time uses a decoder
        for padded in range(PREFILL_BUCKET, top + 1, PREFILL_BUCKET):
            if padded in self._prefill_graphs:
                continue
            static_in = torch.zeros(1, padded, hidden, dtype=self.dtype, device=self.device)
            current = torch.cuda.current_stream(self.device)
            stream.wait_stream(current)
            with torch.cuda.stream(stream):  # warm-up off the capture (lazy cuBLAS/SDPA set-up)
                self._prefill_forward(static_in)
            graph = torch.cuda.CUDAGraph()
            self._prefill_pool = self._prefill_pool or torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self._prefill_pool, stream=stream, capture_error_mode="thread_local"):
                static_out = self._prefill_forward(static_in)
            current.wait_stream(stream)
            self._prefill_graphs[padded] = (graph.replay, static_in, static_out)
        self._reset()
        return len(self._prefill_graphs)

    def step(self, token: int) -> torch.Tensor:
        """Feed back `token`; log-probabilities of the next one (a copy: callers may edit it)."""
        self.token.fill_(int(token))
        self.used += 1
        if self.graph is None:
            return self._graph_step().clone()
        self.graph.replay()
        return self.out.clone()

    def begin(self, embeds: torch.Tensor, generator: torch.Generator | None, min_len: int,
              banned: list[int] | None = None) -> None:
        """Prefill, reset the sampler, draw token 0 (into self.drawn[0] and self.token). With sampling only.
        banned: the tokens masked before min_len (default: speech_token_size, the reference's rule)."""
        if self.sampling is None:
            raise ValueError("begin() draws on the device: build the decoder with sampling=SamplingConfig()")
        # in place: the captured graph reads this tensor's address
        self.end_of_speech.zero_()
        self.end_of_speech[torch.as_tensor(banned if banned is not None else [self.lm.speech_token_size],
                                           device=self.device)] = True
        logp = self.prefill(embeds)
        # The device generator's seed comes from the caller's generator (one draw from it), so the same seed
        # gives the same uniforms, hence the same tokens on the same device and software.
        seed = int(torch.randint(0, 2 ** 62, (1,), generator=generator))
        self.uniforms.uniform_(generator=torch.Generator(self.device).manual_seed(seed))
        self.step_index.zero_()
        self.window.fill_(-1)
        self.min_len.fill_(int(min_len))
        self._draw_fn(logp)

    def advance(self, steps: int) -> None:
        """Run `steps` decode steps from self.token, each drawing the next token (no host sync)."""
        self.used += max(0, int(steps))
        for _ in range(steps):
            if self.graph is None:
                self._graph_step()
            else:
                self.graph.replay()


class SpeechLM3(SpeechLM):
    """CosyVoice3LM (Fun-CosyVoice3-0.5B), inference only. The same Qwen2 body, prompt layout and sampler as
    CosyVoice 2's; what differs is the speech-token table: 6561 speech tokens + 200 special rows in one
    embedding (sos = 6561, end of speech = 6562, task id = 6563; no separate llm_embedding), a head without
    bias over all 6761 rows, and every special row (6561..6760) stops decoding."""

    SPECIAL_ROWS = 200

    def __init__(self, qwen: nn.Module, speech_token_size: int = 6561,
                 sampling: SamplingConfig = SamplingConfig()) -> None:
        nn.Module.__init__(self)
        hidden = qwen.config.hidden_size
        self.speech_token_size = speech_token_size
        self.sampling = sampling
        self.llm = _QwenHolder(qwen)
        self.llm_decoder = nn.Linear(hidden, speech_token_size + self.SPECIAL_ROWS, bias=False)
        self.speech_embedding = nn.Embedding(speech_token_size + self.SPECIAL_ROWS, hidden)

    @property
    def stop_tokens(self) -> range:
        return range(self.speech_token_size, self.speech_token_size + self.SPECIAL_ROWS)

    def min_len_banned(self, forced: bool) -> list[int]:
        """The reference masks index speech_token_size (here the sos row, never the end of speech) before the
        minimum length; kept for parity. `forced` (a benchmark's min_tokens) masks all 200 stop rows, so
        random weights give the asked length."""
        return list(self.stop_tokens) if forced else [self.speech_token_size]

    def _sos_task(self) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.speech_embedding.weight
        return w[self.speech_token_size], w[self.speech_token_size + 2]
