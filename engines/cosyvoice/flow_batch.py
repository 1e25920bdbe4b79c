"""CosyVoice 2's flow solves of several live sessions as rows of one solve (live mode's `--tts-batch`).

Why: on the H200 one TTS lane voiced ~3x real time with 8 sessions speaking (benchmarks/RESULTS_live.md, 2026-12-03
21:57), its time going to the flow (a 10-step solve over every token so far, for every piece) and HiFT; two lanes at
once ran no faster than one after the other. The solve is small kernels replayed from a CUDA graph (FastCFM) that
use a small part of the GPU at one row, so rows of other sessions' solves ride along: on the H200 a 448-frame solve
took 47 ms at 1 row, 53 at 2, 73 at 4 and 115 at 8 (3.3x the rows per second; 2026-12-04, gpu_tts_pieces.py). In
the 8-session live run the same day the pieces seldom met (at most 2 rows a solve): the one LM makes the sessions'
tokens in turn (benchmarks/RESULTS_live.md).

Each session's thread calls the batcher as it would the solver (`batcher(mu, mask, spks, cond, steps)`); a worker
(engines/call_batcher.py) gathers the calls that arrive within `window_s` while other sessions are active, pads
them to the longest one's bucket and to a row count of ROW_SIZES (so that CUDA graphs exist for every call: one per
row count and length bucket, captured by `prepare`), solves once and hands each caller its row. A lone caller waits
for nobody.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..call_batcher import CallBatcher
from .flow import FastCFM

ROW_SIZES = (1, 2, 4, 8)  # rows of one solve are padded up to one of these (or to max_rows, when smaller)


def row_sizes(max_rows: int) -> tuple[int, ...]:
    """The row counts a solve of at most `max_rows` rows is padded to: ROW_SIZES up to it, and it."""
    top = max(1, int(max_rows))
    return tuple(sorted({r for r in ROW_SIZES if r < top} | {top}))


class FlowRowBatcher:
    """A FastCFM's solves from several threads as rows of one `solve_rows` call (see the module's docstring)."""

    def __init__(self, solver: FastCFM, max_rows: int, steps: int, window_s: float = 0.004,
                 stream_priority: int | None = None) -> None:
        """steps: the solves' step count (the flow's `timesteps`; a call with another is refused)."""
        self.solver, self.steps = solver, int(steps)
        self.sizes = row_sizes(max_rows)
        self.max_rows = self.sizes[-1]
        self._batcher = CallBatcher(self._solve, window_s=window_s, max_rows=self.max_rows, join=self._join,
                                    name="cosyvoice-flow-batcher", stream_priority=stream_priority)

    @property
    def calls(self) -> int:
        return self._batcher.calls

    @property
    def rows_run(self) -> int:
        """Sessions' solves run (padding rows not counted): rows_run / calls = the mean batch."""
        return self._batcher.rows_run

    @property
    def largest(self) -> int:
        return self._batcher.largest

    def prepare(self, max_frames: int, spk_dim: int) -> int:
        """Every graph a solve of up to `max_frames` frames needs, at every row count (FastCFM.prepare)."""
        return self.solver.prepare(max_frames, self.steps, spk_dim, rows=self.sizes)

    def __call__(self, mu: torch.Tensor, mask: torch.Tensor, spks: torch.Tensor, cond: torch.Tensor,
                 steps: int = 10) -> torch.Tensor:
        """As FastCFM(mu, mask, spks, cond, steps) for one row: x [1, 80, frames]."""
        if int(steps) != self.steps:
            raise ValueError(f"this flow batcher solves in {self.steps} steps, not {steps}")
        frames = int(mu.shape[2])
        bucket = self.solver.bucket
        padded = -(-frames // bucket) * bucket
        pad = lambda y: F.pad(y, (0, padded - frames))  # noqa: E731
        return self._batcher(pad(mu), pad(mask), spks, pad(cond))[:, :, :frames]

    def _join(self, requests: list[tuple]) -> tuple:
        """One call's (mu, mask, spks, cond): every request padded to the longest's frames (mask 0 there), then
        the last row repeated up to the next row count of `sizes`."""
        longest = max(int(args[0].shape[2]) for args in requests)
        stacked = []
        for i in range(4):
            parts = [args[i] if i == 2 else F.pad(args[i], (0, longest - int(args[i].shape[2]))) for args in requests]
            stacked.append(torch.cat(parts))
        rows = int(stacked[0].shape[0])
        target = next(size for size in self.sizes if size >= rows)
        if target > rows:
            stacked = [torch.cat([x, x[-1:].expand(target - rows, *x.shape[1:])]) for x in stacked]
        return tuple(stacked)

    def _solve(self, mu: torch.Tensor, mask: torch.Tensor, spks: torch.Tensor, cond: torch.Tensor) -> Any:
        return self.solver.solve_rows(mu, mask, spks, cond, self.steps)

    def close(self) -> None:
        self._batcher.close()
