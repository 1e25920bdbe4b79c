"""CosyVoice 2's speech LM decoding several generations at once: one decode step for every live session that has
tokens to make (live mode's `--tts-batch`, the LM's half; flow_batch.py is the flow's).

Why: on the H200 with 8 sessions (benchmarks/RESULTS_live.md, 2026-12-04) the flow batcher seldom found two pieces
ready together (at most 2 rows a solve), because the one LM made the sessions' tokens in turn: each session held
the LM for its piece's tokens while the others' first pieces queued behind it. A decode step of the 0.5 B LM reads
all its weights whatever the rows, so rows of other sessions ride along in the same step: on the H200 (2026-12-04)
the step took 3.75 ms at 1, 2, 4 and 8 rows. But the 8-session live run that day carried 1.33 rows a step and
came out slower to the first frame, so `--tts-batch` stays off (benchmarks/RESULTS_live.md).

- BatchedDecoder: StaticDecoder's fused step (the same weights, re-stored once by that decoder) for `rows`
  generations, each with its own KV-cache rows, position, sampler state and uniforms; one CUDA graph for the step of
  all rows, rows not in use masked (their position and sampler state stay as they are).
- LMBatchLoop: a thread that owns the BatchedDecoder and the StaticDecoder's prefill. A generation asks for a row
  (`generate_tokens`, called by SpeechLM.generate), its prompt is run through the StaticDecoder's prefill and copied
  into the row, and from then on every step advances every active row; the host reads the drawn tokens back at each
  row's read-back points (the same as StaticDecoder's: `first_readback`, then every `readback`) and hands them to
  that generation. A generation that stops early (a stop token, its consumer gone) frees its row at once.

A row draws the same tokens as the StaticDecoder would for the same seed and prompt (the same uniforms, the same rule),
up to rounding: the batched step's projections are matrix products over the rows, the compiled single step's are
multiply-and-sum reductions (its gemv="reduce"), so now and then a draw at a rounding-sized boundary of the
distribution differs, and that generation goes its own way from there (same distribution). On the CPU the tokens are
equal (tests/test_cosyvoice_lm_batch.py); on the H200 all 8 rows drew the single decoder's tokens (gpu_tts_pieces.py
--sections lm). Every step computes every row (fixed shapes for one graph): a row alone pays the step of 8."""
from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

import torch

from .lm import PV_CHUNKS, StaticDecoder, ras_sample_tensor

log = logging.getLogger("digital_human")

_DONE = object()  # a generation's end in its queue


def _failure(error: BaseException) -> BaseException:
    """A fresh exception for one consumer (the same object raised in several threads would share a traceback)."""
    failure = RuntimeError(f"CosyVoice 2 batched LM: {type(error).__name__}: {error}")
    failure.__cause__ = error
    return failure


class BatchedDecoder:
    """One-token decode steps of `rows` generations of a StaticDecoder's LM at once (module doc). The state of row r:
    keys/values[r], pos[r] (its next cache slot), token[r] (its last token), the sampler's step_index[r], min_len[r],
    window[r], uniforms[r], drawn[r] and banned[r] (tokens masked before min_len); active[r]: the step advances it."""

    def __init__(self, decoder: StaticDecoder, rows: int, compile: bool = False,
                 cuda_graph: bool | None = None) -> None:
        if decoder.sampling is None or decoder.step_kind != "fused":
            raise ValueError("BatchedDecoder needs a StaticDecoder with device sampling and the fused step")
        self.single, self.lm, self.qwen = decoder, decoder.lm, decoder.qwen
        self.rows, self.capacity, self.sampling = int(rows), decoder.capacity, decoder.sampling
        self.device, self.dtype = decoder.device, decoder.dtype
        self.kv_heads, self.q_heads, self.head_dim = decoder.kv_heads, decoder.q_heads, decoder.head_dim
        b, dev = self.rows, self.device
        shape = (b, self.kv_heads, self.capacity, self.head_dim)
        self.keys = [torch.zeros(shape, dtype=self.dtype, device=dev) for _ in self.qwen.layers]
        self.values = [torch.zeros(shape, dtype=self.dtype, device=dev) for _ in self.qwen.layers]
        self.positions = torch.arange(self.capacity, device=dev)
        self.row_index = torch.arange(b, device=dev)
        hidden = self.qwen.config.hidden_size
        vocab = self.lm.llm_decoder.weight.shape[0]
        self.token = torch.zeros(b, dtype=torch.long, device=dev)
        self.embed = torch.zeros(b, 1, hidden, dtype=self.dtype, device=dev)
        self.pos = torch.zeros(b, dtype=torch.long, device=dev)
        self.active = torch.zeros(b, dtype=torch.bool, device=dev)
        self.step_index = torch.zeros(b, dtype=torch.long, device=dev)
        self.min_len = torch.zeros(b, dtype=torch.long, device=dev)
        self.window = torch.full((b, self.sampling.win_size), -1, dtype=torch.long, device=dev)
        self.uniforms = torch.zeros(b, self.capacity, 2, dtype=torch.float32, device=dev)
        self.drawn = torch.zeros(b, self.capacity, dtype=torch.long, device=dev)
        self.banned = torch.zeros(b, vocab, dtype=torch.bool, device=dev)
        self.graph: Any = None  # the captured step's replay (capture)
        self.steps_run = 0   # steps of all rows
        self.row_steps = 0   # active rows summed over those steps (row_steps / steps_run = the mean batch)
        self.largest = 0     # the most rows active in one step
        self._fn, self._draw_fn = self._forward, self._draw
        self.compiled = self.draw_compiled = False
        if compile:  # as StaticDecoder: inductor fuses the norms, rotary and residual adds of the step
            try:
                fn = torch.compile(self._forward, dynamic=False)
                draw = torch.compile(self._draw, dynamic=False)
                with torch.inference_mode():  # with autograd on the K/V writes broke StaticDecoder's compile
                    self._run_step(fn, draw)
                self._fn, self._draw_fn, self.compiled, self.draw_compiled = fn, draw, True, True
            except Exception as exc:  # noqa: BLE001 - any compiler failure: the uncompiled step still works
                log.warning("CosyVoice 2 batched LM step: torch.compile failed (%s); using the uncompiled step", exc)
        self.use_graph = self.device.type == "cuda" if cuda_graph is None else bool(cuda_graph)

    # --- the step ---------------------------------------------------------------------------------------------------
    def _forward(self) -> torch.Tensor:
        """Log-probabilities [rows, vocab] for each row's token at its pos; writes the rows' K/V there; active rows'
        positions advance. StaticDecoder._forward_fused's math with a row dimension (products as multiplies and sums,
        scores and softmax in float32)."""
        from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

        b, d = self.rows, self.head_dim
        x = self.embed
        cos, sin = self.qwen.rotary_emb(x, self.pos.view(b, 1))
        slot = self.pos.clamp(max=self.capacity - 1)  # a row past its end (not read) must not index out of bounds
        visible = self.positions[None, :] <= self.pos[:, None]  # [rows, L]: later slots hold stale values
        sizes = [self.q_heads * d, self.kv_heads * d, self.kv_heads * d]
        group = self.q_heads // self.kv_heads
        for layer, (w_qkv, b_qkv, w_gu), k_cache, v_cache in zip(self.qwen.layers, self.single._fused, self.keys,
                                                                  self.values):
            attn, mlp = layer.self_attn, layer.mlp
            q, k, v = torch.nn.functional.linear(layer.input_layernorm(x), w_qkv, b_qkv).split(sizes, dim=-1)
            q = q.view(b, 1, -1, d).transpose(1, 2)  # [rows, q_heads, 1, d]
            k = k.view(b, 1, -1, d).transpose(1, 2)
            v = v.view(b, 1, -1, d).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            k_cache[self.row_index, :, slot] = k[:, :, 0]
            v_cache[self.row_index, :, slot] = v[:, :, 0]
            # grouped-query attention on the kv_heads cache (query head h uses K/V head h // group)
            qg = q.reshape(b, self.kv_heads, group, 1, d).float()
            scores = (qg * k_cache.float()[:, :, None]).sum(dim=-1) * attn.scaling  # [rows, kv, group, L]
            scores = torch.where(visible[:, None, None, :], scores, -float("inf"))
            probs = scores.softmax(dim=-1)
            # the weighted sum over the slots in two stages, as StaticDecoder._attend (a serial loop over all slots
            # per output otherwise, in inductor's kernel)
            length = self.capacity
            chunks = PV_CHUNKS if length % PV_CHUNKS == 0 else 1
            weighted = probs[..., None] * v_cache.float()[:, :, None]  # [rows, kv, group, L, d]
            o = weighted.view(b, self.kv_heads, group, chunks, length // chunks, d).sum(dim=-2).sum(dim=-2)
            x = x + torch.nn.functional.linear(o.to(x.dtype).reshape(b, 1, -1), attn.o_proj.weight, attn.o_proj.bias)
            gate, up = torch.nn.functional.linear(layer.post_attention_layernorm(x), w_gu).chunk(2, dim=-1)
            x = x + torch.nn.functional.linear(mlp.act_fn(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
        head = self.lm.llm_decoder
        logits = torch.nn.functional.linear(self.qwen.norm(x), head.weight, head.bias)
        self.pos.add_(self.active.long())
        return logits.float().log_softmax(dim=-1)[:, 0]

    def _draw(self, logp: torch.Tensor, rows: torch.Tensor) -> None:
        """Draw each row's next token from logp [rows, vocab] (StaticDecoder._draw per row); only the rows in the
        mask `rows` take it (token, drawn, window, step_index)."""
        i = self.step_index.clamp(max=self.capacity - 1)
        early = (self.step_index < self.min_len)[:, None]
        logp = torch.where(self.banned & early, -float("inf"), logp)
        token = ras_sample_tensor(logp, self.window, self.uniforms[self.row_index, i], self.sampling)
        at = self.step_index % self.window.shape[1]
        self.window[self.row_index, at] = torch.where(rows, token, self.window[self.row_index, at])
        self.drawn[self.row_index, i] = torch.where(rows, token, self.drawn[self.row_index, i])
        self.token.copy_(torch.where(rows, token, self.token))
        self.step_index.add_(rows.long())

    def _run_step(self, fn: Any = None, draw: Any = None) -> None:
        self.embed.copy_(self.lm.speech_embedding.weight.index_select(0, self.token).view(self.rows, 1, -1))
        (draw or self._draw_fn)((fn or self._fn)(), self.active)

    @torch.inference_mode()  # the buffers are inference tensors when made under it (set_lm_rows)
    def capture(self) -> bool:
        """The step of all rows as one CUDA graph (CUDA only; warm-up and capture on the StaticDecoder's capture
        stream with every row inactive: nothing but unread K/V slots changes). As StaticDecoder: a failed capture with
        the compiled sampler is tried again with the uncompiled one; a second failure is logged and the steps run
        without a graph. False when not captured. Call before any generation runs (warm-up)."""
        if not self.use_graph or self.graph is not None:
            return self.graph is not None
        from .flow import capture_graph

        active = self.active.clone()
        self.active.zero_()
        try:
            for attempt in ("compiled", "uncompiled"):
                try:
                    replay, _ = capture_graph(self._run_step, self.device, stream=self.single._graph_stream())
                    self.graph = replay
                    return True
                except Exception as exc:  # noqa: BLE001 - the uncompiled sampler, then no graph
                    if attempt == "compiled" and self.draw_compiled:
                        log.warning("CosyVoice 2 batched LM: capture with the compiled sampler failed (%s); trying "
                                    "the uncompiled sampler", exc)
                        self._draw_fn, self.draw_compiled = self._draw, False
                        torch.cuda.synchronize(self.device)
                        continue
                    log.warning("CosyVoice 2 batched LM: CUDA graph capture failed (%s); its steps run without a "
                                "graph (slower)", exc)
                    self.use_graph = False
                    return False
            return False
        finally:
            self.active.copy_(active)

    def step(self, active_rows: int) -> None:
        """One decode step of every row (the active ones advance); active_rows: how many are active (the stats)."""
        if self.graph is not None:
            self.graph()
        else:
            self._run_step()
        self.steps_run += 1
        self.row_steps += active_rows
        self.largest = max(self.largest, active_rows)

    # --- rows ---------------------------------------------------------------------------------------------------
    def admit(self, row: int, embeds: torch.Tensor, seed: int, min_len: int, banned: list[int]) -> None:
        """Row `row` starts a generation: the prompt through the StaticDecoder's prefill (transformers, or its static
        prefill graphs) and its K/V copied into the row; the sampler reset and seeded as StaticDecoder.begin seeds its
        own (`seed` drawn from the caller's generator), token 0 drawn. The row is then active."""
        single = self.single
        logp = single.prefill(embeds)
        n = int(embeds.shape[1])
        for dst, src in zip(self.keys + self.values, single.keys + single.values):
            dst[row, :, :n].copy_(src[0, :, :n])
        uniforms = torch.empty(self.capacity, 2, dtype=torch.float32, device=self.device)
        uniforms.uniform_(generator=torch.Generator(self.device).manual_seed(int(seed)))
        self.uniforms[row].copy_(uniforms)
        self.pos[row] = n
        self.step_index[row] = 0
        self.window[row] = -1
        self.min_len[row] = int(min_len)
        self.banned[row] = False
        self.banned[row, torch.as_tensor(banned, dtype=torch.long, device=self.device)] = True
        only = self.row_index == row
        logp_rows = torch.zeros(self.rows, logp.shape[-1], dtype=torch.float32, device=self.device)
        logp_rows[row] = logp
        self._draw_fn(logp_rows, only)
        self.active[row] = True

    def release(self, row: int) -> None:
        self.active[row] = False


class _Request:
    """One generation waiting for, or holding, a row: what admit needs, where its tokens go, how far it got."""

    def __init__(self, embeds: torch.Tensor, seed: int, min_len: int, max_len: int, banned: list[int],
                 first_readback: int | None, event: Any) -> None:
        self.embeds, self.seed, self.min_len, self.max_len = embeds, seed, min_len, max_len
        self.banned, self.first_readback, self.event = banned, first_readback, event
        self.tokens: queue.Queue = queue.Queue()
        self.cancelled = False
        self.row: int | None = None
        self.read, self.drawn = 0, 1  # tokens handed over; tokens drawn (token 0 at admission)

    def block_end(self, readback: int) -> int:
        """The next read-back point (StaticDecoder's: the first block first_readback long, when given)."""
        block = readback if self.read or not self.first_readback else max(1, min(self.first_readback, readback))
        return min(self.read + block, self.max_len)


class LMBatchLoop:
    """The thread that decodes every generation's row together (module doc). `generate_tokens` is SpeechLM.generate's
    way in (it passes this object as its `decoder`)."""

    def __init__(self, decoder: StaticDecoder, rows: int, compile: bool = False) -> None:
        self.batch = BatchedDecoder(decoder, rows, compile=compile)
        self.capacity, self.readback = decoder.capacity, decoder.readback
        self.stop_tokens = set(decoder.lm.stop_tokens)
        self._cv = threading.Condition()
        self._waiting: list[_Request] = []
        self._rows: dict[int, _Request] = {}
        self._closed = False
        self._thread: threading.Thread | None = None
        self._stream: Any = None

    @property
    def rows(self) -> int:
        return self.batch.rows

    def fits(self, length: int) -> bool:
        return length <= self.capacity

    def prepare(self) -> int:
        """Capture the step's CUDA graph now (warm-up: not while sessions run); 1 when there is one."""
        return int(self.batch.capture())

    def stats(self) -> dict[str, Any]:
        b = self.batch
        return {"steps": b.steps_run, "row_steps": b.row_steps, "largest": b.largest, "max_rows": b.rows,
                "mean_rows": round(b.row_steps / b.steps_run, 2) if b.steps_run else None}

    def generate_tokens(self, embeds: torch.Tensor, generator: torch.Generator | None, min_len: int, max_len: int,
                        banned: list[int], first_readback: int | None = None) -> Iterator[int]:
        """The tokens of one generation (SpeechLM.generate with this loop as its decoder), as the StaticDecoder's
        device-sampled path yields them; waits for a free row when all are taken."""
        if max_len <= 0:
            return
        # drawn here, in the caller's order, as StaticDecoder.begin draws it (prefill draws nothing)
        seed = int(torch.randint(0, 2 ** 62, (1,), generator=generator))
        event = None
        if embeds.is_cuda:  # the prompt was made on this thread's stream; the loop's waits for it
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(embeds.device))
        request = _Request(embeds, seed, int(min_len), int(max_len), list(banned), first_readback, event)
        with self._cv:
            if self._closed:
                raise RuntimeError("the batched LM loop is closed")
            self._start()
            self._waiting.append(request)
            self._cv.notify_all()
        try:
            while True:
                try:
                    item = request.tokens.get(timeout=1.0)
                except queue.Empty:
                    if self._thread is None or not self._thread.is_alive():
                        raise RuntimeError("the batched LM's decode loop is not running (see the log)") from None
                    continue
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield from item
        finally:
            with self._cv:  # the consumer is gone (done, closed or interrupted): the row is freed at once
                request.cancelled = True
                self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # --- the loop's thread ------------------------------------------------------------------------------------------
    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="cosyvoice-lm-batch", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        """The loop, on a stream of its own on CUDA (a reserved one: a stream shared with another owner could be
        capturing, or queue the LM's steps behind flow solves). Whatever ends it unexpectedly ends every generation
        waiting or under way with that error, and the loop takes no more (their consumers must not wait forever)."""
        try:
            stream = None
            if self.batch.device.type == "cuda":
                from ..cuda_streams import capture_stream, streams_enabled

                torch.cuda.synchronize(self.batch.device)  # the set-up's fills and captures, made on other streams
                stream = capture_stream(self.batch.device) if streams_enabled() else None
            self._stream = stream
            with (torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()), \
                    torch.inference_mode():
                self._loop()
        except BaseException as exc:  # noqa: BLE001
            log.warning("CosyVoice 2 batched LM: the decode loop stopped: %s", exc)
            with self._cv:
                self._closed = True
                for request in self._waiting + list(self._rows.values()):
                    request.tokens.put(_failure(exc))
                self._waiting.clear()
                self._rows.clear()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._waiting and not self._rows:
                    self._cv.wait()
                if self._closed:
                    for request in self._waiting + list(self._rows.values()):
                        request.tokens.put(RuntimeError("the batched LM loop was closed"))
                    return
                free = [r for r in range(self.rows) if r not in self._rows]
                admitted = []
                while free and self._waiting:
                    request = self._waiting.pop(0)
                    if not request.cancelled:
                        request.row = free.pop(0)
                        self._rows[request.row] = request
                        admitted.append(request)
                for row, request in list(self._rows.items()):
                    if request.cancelled and request not in admitted:
                        self._finish(request, None)
            for request in admitted:
                try:
                    self._admit(request)
                except Exception as exc:  # noqa: BLE001 - this generation gets the error; the others go on
                    log.warning("CosyVoice 2 batched LM: a prompt failed: %s", exc)
                    with self._cv:
                        self._finish(request, exc)
            try:
                self._advance()
            except Exception as exc:  # noqa: BLE001 - every generation under way gets the error; the loop goes on
                log.warning("CosyVoice 2 batched LM: a step failed: %s", exc)
                with self._cv:
                    for request in list(self._rows.values()):
                        self._finish(request, exc)

    def _admit(self, request: _Request) -> None:
        stream = torch.cuda.current_stream(self.batch.device) if request.embeds.is_cuda else None
        if stream is not None:
            stream.wait_event(request.event)
            request.embeds.record_stream(stream)
        self.batch.admit(request.row, request.embeds, request.seed, request.min_len, request.banned)
        request.embeds = None

    def _advance(self) -> None:
        """Step every row to the nearest read-back point of an active row, then hand those rows their tokens."""
        with self._cv:
            rows = dict(self._rows)
        if not rows:
            return
        ends = {row: request.block_end(self.readback) for row, request in rows.items()}
        steps = max(0, min(ends[row] - request.drawn for row, request in rows.items()))
        for _ in range(steps):
            self.batch.step(len(rows))
        for request in rows.values():
            request.drawn += steps
        ready = [row for row, request in rows.items() if request.drawn >= ends[row]]
        drawn = self.batch.drawn[ready].cpu() if ready else None  # the one sync of these steps
        with self._cv:
            for k, row in enumerate(ready):
                request = rows[row]
                if request.cancelled:
                    self._finish(request, None)
                    continue
                tokens = drawn[k, request.read:ends[row]].tolist()
                stop = next((j for j, token in enumerate(tokens) if token in self.stop_tokens), None)
                request.tokens.put(tokens if stop is None else tokens[:stop])
                request.read = ends[row]
                if stop is not None or request.read >= request.max_len:
                    self._finish(request, None)

    def _finish(self, request: _Request, error: BaseException | None) -> None:
        """(Under the condition's lock.) The generation's consumer gets the end or the error (first: a device that
        fails below must not leave it waiting), and its row is freed."""
        request.tokens.put(_DONE if error is None else _failure(error))
        if request.row is not None and self._rows.get(request.row) is request:
            del self._rows[request.row]
            try:
                self.batch.release(request.row)
            except Exception as exc:  # noqa: BLE001 - the loop's guard (_run) ends every generation then
                log.warning("CosyVoice 2 batched LM: freeing row %d failed: %s", request.row, exc)
                raise
