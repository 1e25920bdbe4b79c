"""RGB -> yuv420p (BT.709, limited range) in torch, so frames reach ffmpeg already converted.

Why: mux.py's RGB path lets ffmpeg's `scale` filter convert every frame to YUV 4:2:0 on the CPU,
and pipes 3 bytes per pixel instead of 1.5. Converting on the device that produced the
frames (a GPU in the headless text-to-video path) removes that filter and halves the pipe bytes.

The result is meant to be what `-vf scale=out_color_matrix=bt709:out_range=tv,format=yuv420p`
gives for the same rgb24 input, so both mux paths look the same. Measured against the ffmpeg
9.0.2 x86-64 build that imageio-ffmpeg ships, it is bit-identical for frames >= 12 px high,
because it repeats what swscale does (found by experiment, then checked in its source):
- luma: the coefficients of swscale's BT.709 table (15-bit fixed point), rounded twice as it does
  (to 1/64 first, then to an integer);
- chroma, horizontally: plain average of each pixel pair (swscale's `rgb24ToUV_half`);
- chroma, vertically: NOT a 2-row average but swscale's default bicubic (B=0, C=0.6) downscale,
  8 taps centred between the two rows, 12-bit coefficients, border rows repeated;
- rounding: the x86 SIMD vertical scaler (`yuv2yuvX`) truncates each tap's product to 1/8 and
  adds a fixed 7/8, so results are not "round half up" - except the last chroma row, which
  swscale always computes with the exact C code.
Other ffmpeg builds (other CPUs, a future swscale) may differ by 1 in some chroma samples; frames
under 12 px high use shortened filters in swscale and differ more (no real video is that small).

Integer arithmetic (int32) is used instead of float so the result is exact and identical on CPU
and CUDA (checked on an H200: 250 frames of 512x512 in about 8 ms). On a CPU, ffmpeg's own SIMD
conversion is several times faster than this; convert here only where the frames already are on
a GPU.
"""
from __future__ import annotations

import functools

import torch

PAD_MODES = ("edge", "black")

# swscale's RGB -> limited-range BT.709 table, in units of 2**-15: round(K * 219/255 * 2**15) for Y,
# round(K * 224/255 * 2**15) for U/V (K = the BT.709 matrix row). These equal the integers
# swscale's fill_rgb2yuv_table() derives; V's row sums to -1, not 0, exactly as in swscale.
_RY, _GY, _BY = 5983, 20127, 2032
_RU, _GU, _BU = -3298, -11094, 14392
_RV, _GV, _BV = 14392, -13073, -1320

# Vertical chroma filter (sums to 4096): bicubic (Keys, a = -0.6) at distances 1.75, 1.25, 0.75,
# 0.25 chroma rows from the centre between luma rows 2i and 2i+1, quantized as swscale does.
_CHROMA_TAPS = (-58, -172, 492, 1786, 1786, 492, -172, -58)


@functools.lru_cache(maxsize=16)
def _vertical_taps(height: int) -> tuple[tuple[int, ...], ...]:
    """Per chroma row, the 8 coefficients applied to rows 2i-3 .. 2i+4 of the edge-padded image.

    Taps that fall outside the image are added onto the border row's tap (swscale merges them
    before filtering), leaving 0 in their own slot; a merged tap is one product, and with the
    per-product truncation below that differs from several products of the same row.
    """
    rows = []
    for i in range(height // 2):
        coef = [0] * 8
        first_slot: dict[int, int] = {}
        for k, tap in enumerate(_CHROMA_TAPS):
            src = min(max(2 * i - 3 + k, 0), height - 1)
            slot = first_slot.setdefault(src, k)
            coef[slot] += tap
        rows.append(tuple(coef))
    return tuple(rows)


def _pad_even(frames: torch.Tensor, pad_mode: str) -> torch.Tensor:
    """Add one row/column to odd sizes: the border repeated ("edge") or RGB 0 ("black")."""
    if frames.shape[1] % 2:
        extra = frames[:, -1:] if pad_mode == "edge" else torch.zeros_like(frames[:, -1:])
        frames = torch.cat([frames, extra], dim=1)
    if frames.shape[2] % 2:
        extra = frames[:, :, -1:] if pad_mode == "edge" else torch.zeros_like(frames[:, :, -1:])
        frames = torch.cat([frames, extra], dim=2)
    return frames


def _chroma(r2: torch.Tensor, g2: torch.Tensor, b2: torch.Tensor, coefs: tuple[int, int, int],
            taps: torch.Tensor, out: torch.Tensor) -> None:
    """One chroma plane from pair sums [B, H, W/2] (int32) into `out` [B, H/2, W/2] (uint8)."""
    cr, cg, cb = coefs
    # 15-bit intermediate (value * 128): swscale computes value * 64 rounded, then doubles it.
    c15 = ((cr * r2 + cg * g2 + cb * b2 + (256 << 15) + (1 << 9)) >> 10) << 1
    n, h, w2 = c15.shape
    hc = h // 2
    # rows 2i-3 .. 2i+4 for every i as strided views of an edge-padded copy (3 rows each side)
    padded = torch.cat([c15[:, :1].expand(n, 3, w2), c15, c15[:, -1:].expand(n, 3, w2)], dim=1)
    acc = torch.zeros((n, hc, w2), dtype=torch.int32, device=c15.device)
    exact = torch.zeros((n, w2), dtype=torch.int32, device=c15.device)
    for k in range(8):
        rows = padded[:, k: k + 2 * hc: 2]
        prod = rows * taps[:, k].view(1, hc, 1)
        acc += prod >> 16  # pmulhw: each product truncated to 1/8 of an output step
        exact += prod[:, -1]
    acc = (acc + 7) >> 3
    # the last chroma row comes from swscale's C code: exact sum, rounded half up
    acc[:, -1] = (exact + (1 << 18)) >> 19
    out.copy_(acc.clamp_(0, 255))


def rgb_to_yuv420p(frames: torch.Tensor, pad_mode: str = "edge") -> torch.Tensor:
    """uint8 RGB [B, H, W, 3] (any device) -> uint8 [B, Hp*Wp*3//2] yuv420p on the same device.

    Each row is one frame in ffmpeg's `rawvideo` yuv420p layout: the Y plane (Hp x Wp), then U,
    then V (Hp/2 x Wp/2 each). Hp, Wp = H, W rounded up to even; odd sizes get one more row/column
    (pad_mode "edge" repeats the border, "black" adds RGB 0 - as media.mux's pad_mode).
    BT.709 limited range, matching ffmpeg's `scale` filter (see the module docstring).
    """
    if not isinstance(frames, torch.Tensor):
        raise TypeError(f"frames must be a torch.Tensor, got {type(frames).__name__}.")
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be [B, H, W, 3] RGB, got shape {tuple(frames.shape)}.")
    if frames.dtype != torch.uint8:
        raise ValueError(f"frames must be uint8 (0..255), got {frames.dtype}; "
                         "convert float 0..1 with (x.clamp(0, 1) * 255).round().to(torch.uint8).")
    if pad_mode not in PAD_MODES:
        raise ValueError(f"pad_mode must be one of {PAD_MODES}, got {pad_mode!r}.")
    n, h, w, _ = frames.shape
    if h == 0 or w == 0:
        raise ValueError(f"frames have zero size ({w}x{h}).")
    rgb = _pad_even(frames, pad_mode)
    hp, wp = rgb.shape[1], rgb.shape[2]
    out = torch.empty((n, hp * wp * 3 // 2), dtype=torch.uint8, device=frames.device)
    if n == 0:
        return out
    y_plane = out[:, : hp * wp].view(n, hp, wp)
    u_plane = out[:, hp * wp: hp * wp * 5 // 4].view(n, hp // 2, wp // 2)
    v_plane = out[:, hp * wp * 5 // 4:].view(n, hp // 2, wp // 2)

    x = rgb.to(torch.int32)
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    # swscale keeps luma as value * 64 (rounded), then rounds that to an integer
    y14 = (_RY * r + _GY * g + _BY * b + (32 << 14) + (1 << 8)) >> 9
    y_plane.copy_(((y14 + 32) >> 6).clamp_(0, 255))
    del y14

    pairs = x[:, :, 0::2] + x[:, :, 1::2]  # [B, H, W/2, 3]: sums of horizontal pixel pairs
    del x, r, g, b
    r2, g2, b2 = pairs[..., 0], pairs[..., 1], pairs[..., 2]
    taps = torch.tensor(_vertical_taps(hp), dtype=torch.int32, device=frames.device)
    _chroma(r2, g2, b2, (_RU, _GU, _BU), taps, u_plane)
    _chroma(r2, g2, b2, (_RV, _GV, _BV), taps, v_plane)
    return out
