"""TemporalSmooth's pixel filter for a stream of frames, in bounded memory.

smooth_frames_tensor filters a whole clip: a forward One-Euro pass, then a backward pass from the
clip's last frame that cancels the forward pass's delay (zero phase). A long video cannot be held
whole, so here the backward pass runs over fixed blocks of `block` frames, each started `lookahead`
frames past the block's end from the forward value there. The filter forgets its start
geometrically (at rest by (1 - alpha) per frame), so with the default lookahead the result equals
the whole-clip filter to well below one 8-bit level (tests/test_stream_smooth.py), and it does
not depend on how the frames are chunked when they arrive: the blocks are counted from frame 0.
The noise level comes from the first `noise_frames` frames (the whole-clip filter samples the
whole clip; for clips up to that length the two are the same), scene cuts from consecutive frames.
At most block + lookahead + one pushed chunk of frames are held.
"""
from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from .smoothing import (_PIXEL_GAIN, _check_method_strength, _ema_alpha, _min_cutoff, _noise_from_pairs,
                        _noise_pairs)

BLOCK = 16
NOISE_FRAMES = 24  # held before the first frame can be filtered
# the start of a backward block is forgotten to this fraction (at rest) before its frames are reached
FORGET_TO = 1e-3
MAX_LOOKAHEAD_SECONDS = 2.0


def default_lookahead(method: str, strength: float, fps: float) -> int:
    """Frames the backward pass needs before a block so that its start is forgotten to FORGET_TO at
    rest: ln(FORGET_TO) / ln(1 - alpha) with the filter's at-rest alpha, at most 2 s of frames."""
    if method == "none" or strength == 0:
        return 0
    if method == "ema":
        alpha = _ema_alpha(strength)
    else:
        r = 2.0 * math.pi * _min_cutoff(strength, fps) / fps
        alpha = r / (r + 1.0)
    if alpha >= 1.0:
        return 0
    frames = math.ceil(math.log(FORGET_TO) / math.log(1.0 - alpha))
    return int(min(frames, math.ceil(MAX_LOOKAHEAD_SECONDS * fps)))


class StreamingSmoother:
    """push(boxes, masks) frames in order, get the smoothed frames back in order (delayed by up to
    block + lookahead frames); flush() at the end returns the rest. boxes: torch float [k, h, w, 3]
    0..1; masks: torch float [k, h, w] 0..1 or None (whole box). Outputs are (frame index, tensor)."""

    def __init__(self, method: str = "one_euro", strength: float = 0.5, fps: float = 25.0,
                 scene_cut_threshold: float = 0.08, *, lookahead: int | None = None, block: int = BLOCK,
                 noise_frames: int = NOISE_FRAMES, noise_level: float | None = None):
        _check_method_strength(method, strength, fps)
        self.method, self.strength, self.fps = method, float(strength), float(fps)
        self.active = method != "none" and strength > 0
        self.threshold = scene_cut_threshold
        self.lookahead = default_lookahead(method, strength, fps) if lookahead is None else int(lookahead)
        self.block, self.noise_frames = max(1, int(block)), max(2, int(noise_frames))
        self.sigma = None if noise_level is None else max(float(noise_level), 0.25 / 255.0)
        self._per_sigma = None if self.sigma is None else 1.0 / (3.0 * self.sigma)
        self._min_cut = _min_cutoff(strength, fps)
        self.two_pi_dt = 2.0 * math.pi / self.fps
        self.cuts: set[int] = set()
        self._inputs: dict[int, tuple] = {}   # t -> (box, mask) not yet forward-filtered
        self._forward: dict[int, tuple] = {}  # t -> (forward value, mask) not yet emitted
        self._seen = 0          # frames pushed
        self._filtered = 0      # frames forward-filtered
        self._emitted = 0       # frames returned
        self._state = None      # forward filter state
        self._prev_grid = None  # previous frame's strided grid (scene cuts)

    # --- the filter step, as smooth_frames_tensor's -----------------------------------------
    def _step(self, state, cur, mask):
        # mask * (state + a * (cur - state)) + (1 - mask) * cur, rewritten as cur - (cur - state) * w with
        # the per-pixel w = mask * (1 - a): four passes over the 3-channel box instead of nine (a 1000-px
        # face box is 3 M values a frame); the channel-mean change k and the One-Euro gain follow
        # smooth_frames' numpy step (sums and products, several times cheaper than mean() and k**3)
        diff = cur - state
        if self.method == "ema":
            keep = 1.0 - float(_ema_alpha(self.strength))
            w = keep if mask is None else mask * keep
        else:
            ad = diff.abs()
            k = ad[..., 0] + ad[..., 1]
            k += ad[..., 2]
            k *= self._per_sigma  # change in noise sigmas (channel mean / sigma)
            w = k * k
            w *= k
            w *= _PIXEL_GAIN
            w += self._min_cut
            w *= self.two_pi_dt  # _alpha(min_cut + gain * k^3, dt) = r / (r + 1), so 1 - a = 1 / (r + 1)
            w += 1.0
            w.reciprocal_()
            if mask is not None:  # outside the mask (w = 0) the state follows the input
                w *= mask
        diff *= w if isinstance(w, float) else w[..., None]
        return diff.neg_().add_(cur)

    # --- stream -----------------------------------------------------------------------------
    def push(self, boxes, masks=None) -> list[tuple[int, object]]:
        if self.threshold > 0 and len(boxes):
            self._find_cuts(boxes)
        for i in range(len(boxes)):
            mask = None if masks is None else (masks if masks.dim() == 2 else masks[i])
            self._inputs[self._seen] = (boxes[i], mask)
            self._seen += 1
        return self._advance(final=False)

    def _find_cuts(self, boxes) -> None:
        """Scene cuts among the pushed frames (mean change of a strided grid against the frame before),
        read back to the host once per push: on a GPU a read per frame would wait for the queue each time."""
        import torch

        grids = boxes[:, ::4, ::4].float()
        before = grids[:-1] if self._prev_grid is None else torch.cat([self._prev_grid[None], grids[:-1]])
        changes = (grids[len(grids) - len(before):] - before).abs().mean(dim=(1, 2, 3)).tolist()
        first = self._seen + len(grids) - len(before)  # the frame index of changes[0]
        self.cuts.update(first + j for j, c in enumerate(changes) if c > self.threshold)
        self._prev_grid = grids[-1]

    def flush(self) -> list[tuple[int, object]]:
        return self._advance(final=True)

    def _estimate_sigma(self) -> None:
        if self.sigma is not None or self.method == "ema":
            return
        window = min(self._seen, self.noise_frames)
        picks = _noise_pairs(window, sorted(c for c in self.cuts if c < window), 8)
        pairs = [(self._inputs[t - 1][0].cpu().numpy(), self._inputs[t][0].cpu().numpy(),
                  None if self._inputs[t][1] is None else self._inputs[t][1].cpu().numpy()) for t in picks]
        self.sigma = max(float(_noise_from_pairs(pairs)), 0.25 / 255.0)
        self._per_sigma = 1.0 / (3.0 * self.sigma)

    def _advance(self, final: bool) -> list[tuple[int, object]]:
        if not self.active:  # no filtering: frames pass straight through
            out = [(t, self._inputs.pop(t)[0]) for t in sorted(self._inputs)]
            self._emitted = self._seen
            return out
        if self.sigma is None and self.method != "ema":
            if self._seen < self.noise_frames and not final:
                return []
            if self._seen == 0:
                return []
            self._estimate_sigma()
        while self._filtered < self._seen:  # forward pass over what arrived
            t = self._filtered
            box, mask = self._inputs.pop(t)
            if t == 0 or t in self.cuts:
                self._state = box.clone()
            else:
                self._state = self._step(self._state, box, mask)
            self._forward[t] = (self._state, mask)
            self._filtered += 1
        out: list[tuple[int, object]] = []
        while self._emitted < self._filtered:
            start = self._emitted
            stop = min(start + self.block, self._filtered)
            end = min(stop + self.lookahead, self._filtered)  # exclusive: the backward pass starts at end - 1
            if not final and (stop - start < self.block or end - stop < self.lookahead):
                break
            out += self._backward(start, stop, end)
            for t in range(start, stop):
                del self._forward[t]
            self._emitted = stop
        return out

    def _backward(self, start: int, stop: int, end: int) -> list[tuple[int, object]]:
        """Backward pass from frame end - 1 (initialised with its forward value) down to `start`;
        returns frames start..stop-1."""
        results: dict[int, object] = {}
        state = self._forward[end - 1][0]
        if end - 1 < stop:
            results[end - 1] = state
        for t in range(end - 2, start - 1, -1):
            cur, mask = self._forward[t]
            state = cur.clone() if (t + 1) in self.cuts else self._step(state, cur, mask)
            if t < stop:
                results[t] = state
        return [(t, results[t]) for t in range(start, stop)]


def smooth_stream(chunks: Iterator, smoother: StreamingSmoother) -> Iterator[tuple[int, object]]:
    """(index, smoothed box) for every frame of `chunks` ((boxes, masks) pairs), in order."""
    for boxes, masks in chunks:
        yield from smoother.push(boxes, masks)
    yield from smoother.flush()


def smooth_sequence(frames: np.ndarray, mask: np.ndarray | None = None, **kwargs) -> np.ndarray:
    """The streaming filter over an in-memory clip [N, H, W, 3] float 0..1 (tests, comparisons)."""
    import torch

    x = torch.from_numpy(np.ascontiguousarray(frames, np.float32))
    m = None if mask is None else torch.from_numpy(np.ascontiguousarray(mask, np.float32))
    smoother = StreamingSmoother(**kwargs)
    out = np.empty_like(np.asarray(frames, np.float32))
    for t, box in smooth_stream([(x, m)], smoother):
        out[t] = box.numpy()
    return out
