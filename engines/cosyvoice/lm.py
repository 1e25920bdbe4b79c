"""CosyVoice 2 speech-token language model: Qwen2 (transformers) + speech-token embeddings and head.

The Qwen2 body comes from transformers (optional extra `pip install .[cosyvoice]`), built from the
release's `CosyVoice-BlankEN/config.json`; every weight comes from `llm.pt`. Decoding follows the
released runtime: [sos] text [task] prompt-speech-tokens, then one token per step with a KV cache,
sampled by top-p/top-k nucleus sampling with the repetition-aware rule (VALL-E 2): when the drawn
token already occurs in the last `win_size` tokens, it is banned and a token is drawn from the full
distribution instead. All draws use one torch.Generator, so the same seed gives the same tokens.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

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

    def prompt_embeddings(self, text: torch.Tensor, prompt_text: torch.Tensor,
                          prompt_speech_token: torch.Tensor) -> torch.Tensor:
        text_emb = self.llm.model.model.embed_tokens(torch.cat([prompt_text, text], dim=1).long())
        sos = self.llm_embedding.weight[0].reshape(1, 1, -1)
        task = self.llm_embedding.weight[1].reshape(1, 1, -1)
        parts = [sos, text_emb, task]
        if prompt_speech_token.shape[1]:
            parts.append(self.speech_embedding(prompt_speech_token.long()))
        return torch.cat(parts, dim=1)

    def _step(self, embeds: torch.Tensor, cache):
        out = self.llm.model.model(inputs_embeds=embeds,
                                   attention_mask=torch.ones(1, embeds.shape[1], dtype=torch.bool, device=embeds.device),
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
                 min_tokens: int | None = None, max_tokens: int | None = None) -> Iterator[int]:
        """Yield speech tokens one by one. text/prompt_text: [1, N] Qwen token ids.

        decoder: a StaticDecoder built on this LM (fixed-size KV cache, CUDA graph on a GPU); the prompt
        still runs through transformers, only the one-token steps change. min_tokens/max_tokens override
        the text-length ratios (benchmarks force a length: random weights rarely draw a stop token)."""
        min_len = int(text.shape[1] * min_token_text_ratio) if min_tokens is None else int(min_tokens)
        max_len = int(text.shape[1] * max_token_text_ratio) if max_tokens is None else int(max_tokens)
        embeds, history = self.prompt_embeddings(text, prompt_text, prompt_speech_token), []
        if decoder is not None and not decoder.fits(embeds.shape[1] + max_len):
            decoder = None  # longer than its cache: the eager path has no length limit
        cache = None
        for step in range(max_len):
            if decoder is None:
                hidden, cache = self._step(embeds, cache)
                logp = self.llm_decoder(hidden).log_softmax(dim=-1)[0]
            elif step == 0:
                logp = decoder.prefill(embeds)
            else:
                logp = decoder.step(history[-1])
            if step < min_len:
                logp[self.speech_token_size] = -float("inf")
            token = ras_sample(logp, history, self.sampling, generator)
            if token in self.stop_tokens:
                return
            yield token
            history.append(token)
            if decoder is None:
                embeds = self.speech_embedding.weight[token].reshape(1, 1, -1)


def _cache_tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(key, value) per layer of a transformers DynamicCache, [1, kv_heads, T, head_dim] each."""
    if hasattr(cache, "key_cache"):  # transformers 4.x
        return list(zip(cache.key_cache, cache.value_cache))
    return [(layer.keys, layer.values) for layer in cache.layers]  # transformers 5.x


class StaticDecoder:
    """One-token decode steps of a SpeechLM on a fixed-size KV cache, replayed as one CUDA graph.

    Why: eager transformers decoding launches ~20 small kernels per layer per token from Python, so a
    0.5 B LM on a GPU is bound by launch overhead, not by its 2 GB of weight reads. Here the step is
    written against the same modules (projections, RMSNorms, MLPs, rotary table, llm_decoder) with the
    cache preallocated and the position held in a device tensor, so every step has the same shapes
    and addresses and can be captured once and replayed. The prompt (prefill) still runs through
    transformers and its cache is copied in. On a CPU the same step runs eagerly (tests compare it
    with the eager path). Weights are shared with the LM: do not move the LM while a decoder exists.
    """

    def __init__(self, lm: SpeechLM, capacity: int = 2560, cuda_graph: bool | None = None,
                 compile: bool = False) -> None:
        qwen = lm.llm.model.model
        cfg = qwen.config
        if getattr(cfg, "use_sliding_window", False):
            raise ValueError("StaticDecoder does not implement Qwen2 sliding-window attention")
        weight = lm.llm_decoder.weight
        self.lm, self.qwen, self.capacity = lm, qwen, int(capacity)
        self.device, self.dtype = weight.device, weight.dtype
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        shape = (1, self.kv_heads, self.capacity, self.head_dim)
        self.keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in qwen.layers]
        self.values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in qwen.layers]
        self.positions = torch.arange(self.capacity, device=self.device)
        # static inputs of the captured step: the next token's embedding and its position
        self.embed = torch.zeros(1, 1, cfg.hidden_size, dtype=self.dtype, device=self.device)
        self.pos = torch.zeros(1, dtype=torch.long, device=self.device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None
        self._fn = self._forward
        if compile:
            # Why: even replayed from a graph, ~40 small kernels per layer cost ~2-3 us each on the GPU;
            # inductor fuses the norms, rotary and residual adds. Compiled here (first call), captured below.
            try:
                fn = torch.compile(self._forward, dynamic=False)
                self.pos.zero_()
                fn()
                self._fn = fn
            except Exception as exc:  # noqa: BLE001 - any compiler failure: keep the uncompiled step
                log.warning("CosyVoice 2 LM step: torch.compile failed (%s); using the uncompiled step", exc)
            self.pos.zero_()
        use_graph = self.device.type == "cuda" if cuda_graph is None else cuda_graph
        if use_graph:
            self._capture()

    def fits(self, length: int) -> bool:
        return length <= self.capacity

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

    def _capture(self) -> None:
        # Warm-up on a side stream (lazy cuBLAS/SDPA init must not happen during capture), then capture.
        # These runs write garbage K/V at positions 0..3; prefill overwrites them before any real step.
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(3):
                self.pos.zero_()
                self._fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self.pos.zero_()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self._fn()
        self.pos.zero_()

    def prefill(self, embeds: torch.Tensor) -> torch.Tensor:
        """Run the prompt through transformers (as the eager path does), keep its K/V; log-probs of step 0."""
        hidden, cache = self.lm._step(embeds.to(self.dtype), None)
        n = embeds.shape[1]
        for (k, v), k_cache, v_cache in zip(_cache_tensors(cache), self.keys, self.values):
            k_cache[:, :, :n].copy_(k)
            v_cache[:, :, :n].copy_(v)
        self.pos.fill_(n)
        return self.lm.llm_decoder(hidden).float().log_softmax(dim=-1)[0]

    def step(self, token: int) -> torch.Tensor:
        """Feed back `token`; log-probabilities of the next one (a copy: callers may edit it)."""
        self.embed.copy_(self.lm.speech_embedding.weight[token].view(1, 1, -1))
        if self.graph is None:
            return self._fn().clone()
        self.graph.replay()
        return self.out.clone()
