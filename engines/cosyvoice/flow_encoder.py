"""CosyVoice 2's token encoder (CausalFlow.encode) replayed from CUDA graphs, one per padded token count.

Why: every live piece encodes the prompt's and the utterance's tokens so far before its flow solve. Eagerly that is
~530 torch calls from Python (counted on the CPU, full-size architecture: 10 conformer blocks, the lookahead
and upsampling convolutions), each giving up the interpreter lock and winning it back; with 8 sessions' threads in one process, each win can wait for whichever
thread runs Python. A replayed graph is one call. The solve itself (flow.FastCFM) and the vocoder (hift_graph) were
replayed already; this was the piece's remaining eager stage.

Lengths are padded up to a multiple of `bucket` tokens and the padding is masked (TokenEncoder.forward's `valid`):
the real frames come out as from the unpadded tokens, up to the order of float sums. Graphs are captured per padded
length (prepare() at warm-up, else on first use, announced) on a capture stream of the encoder's own and kept for its
life, sharing one memory pool; calls are serialised (cuda_streams.ReplayOrder: the graphs share their buffers).
Off CUDA (or with cuda_graph=False) the same padded call runs eagerly.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("digital_human.cosyvoice")


class FastEncoder:
    """flow.encode(tokens) for [1, N] token ids, padded to a multiple of `bucket` tokens; returns mu [1, 80, 2N]
    (2 = the flow's token_mel_ratio)."""

    def __init__(self, flow: Any, bucket: int = 32, cuda_graph: bool | None = None) -> None:
        self.flow, self.bucket = flow, int(bucket)
        self.ratio = int(flow.cfg.token_mel_ratio)  # mel frames a token (2)
        device = next(flow.parameters()).device
        self.use_graph = device.type == "cuda" if cuda_graph is None else bool(cuda_graph)
        self.graphs: dict[int, tuple[Callable[[], None], dict[str, torch.Tensor], torch.Tensor]] = {}
        self.prepared = 0  # tokens prepare() covered
        self.captures = 0
        self._pool: Any = None
        self._stream: Any = None
        from ..cuda_streams import ReplayOrder

        self._order = ReplayOrder()  # one call at a time, on the host and the device: the graphs share their buffers

    def padded(self, tokens: int) -> int:
        return -(-int(tokens) // self.bucket) * self.bucket

    def _inputs(self, tokens: torch.Tensor, padded: int) -> dict[str, torch.Tensor]:
        count = int(tokens.shape[1])
        ids = torch.zeros(1, padded, dtype=torch.long, device=tokens.device)
        ids[:, :count] = tokens
        valid = torch.zeros(1, padded, dtype=torch.float32, device=tokens.device)
        valid[:, :count] = 1.0
        return {"tokens": ids, "valid": valid}

    def _graph(self, padded: int, inputs: dict[str, torch.Tensor]):
        if padded in self.graphs:
            return self.graphs[padded]
        from .flow import _capture

        static = {k: v.clone() for k, v in inputs.items()}
        device = static["tokens"].device
        if self._pool is None and device.type == "cuda":
            self._pool = torch.cuda.graph_pool_handle()
        if self._stream is None and device.type == "cuda":
            from ..cuda_streams import capture_stream

            self._stream = capture_stream(device)
        if self.prepared and padded > self.prepared:
            log.warning("[digital_human] CosyVoice 2 flow encoder: %d tokens are more than the %d prepared; capturing "
                        "that length's graph now", padded, self.prepared)
        replay, out = _capture(lambda: self.flow.encode(static["tokens"], static["valid"]), device, pool=self._pool,
                               stream=self._stream)
        self.captures += 1
        self.graphs[padded] = (replay, static, out)
        return self.graphs[padded]

    @torch.inference_mode()
    def prepare(self, max_tokens: int) -> int:
        """Capture the graph of every padded length up to `max_tokens` now, longest first (the shared pool is sized by
        the first); returns the graphs kept. Nothing off CUDA."""
        if not self.use_graph:
            return 0
        device = next(self.flow.parameters()).device
        top = self.padded(max_tokens)
        with self._order.lock:
            for padded in range(top, 0, -self.bucket):
                self._graph(padded, self._inputs(torch.zeros(1, padded, dtype=torch.long, device=device), padded))
        self.prepared = max(self.prepared, top)
        return len(self.graphs)

    @torch.inference_mode()
    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        count = int(tokens.shape[1])
        padded = self.padded(count)
        inputs = self._inputs(tokens.long(), padded)
        if not self.use_graph:
            return self.flow.encode(inputs["tokens"], inputs["valid"])[:, :, :self.ratio * count]
        with self._order.turn(tokens.device):
            replay, static, out = self._graph(padded, inputs)
            for name, value in inputs.items():
                static[name].copy_(value)
            replay()
            result = out[:, :, :self.ratio * count].clone()
        return result
