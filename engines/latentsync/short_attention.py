"""Self-attention over at most 16 positions (LatentSync's temporal motion-module attention), as one Triton kernel.

Why: the motion modules attend across the F <= 16 frames of a window for every pixel, so q/k/v are
[B, H, F, D] with B in the thousands and F tiny. torch's SDPA kernels pad F up to their 64/128-row tiles and
spend most of the call on empty tiles (on an H200, B=8192, D=40: ~0.7-1 ms for ~0.34 GB of traffic, which
HBM moves in ~70 us). Here one program holds a whole [16, D] q/k/v tile per head in registers, so the call
costs about one read of q/k/v and one write of out.

Layout contract (that of `Attention.forward` in unet.py): q, k, v are any-strided [B, H, F, D] views with a
unit last-dim stride (typically `to_q(x).view(b, n, heads, -1).transpose(1, 2)`), and the output is returned
as a [B, H, F, D] view of [B, F, H, D] memory, so `out.transpose(1, 2).reshape(B, F, H * D)` costs nothing.

The op is registered as `torch.ops.digital_human.short_attention` so torch.compile and CUDA-graph capture see
one opaque call. Forward only (inference): no autograd formula is registered. Triton is imported lazily, the
first time the kernel runs, so this module imports on machines without it (CI: CPU torch only); there the op
runs `_reference_short_attention`, plain torch with float32 accumulation and the same output layout.
"""
from __future__ import annotations

import functools
import math
import os
from typing import Any

import torch

MAX_FRAMES = 16   # the kernel keeps a whole sequence in one 16-row tile: longer ones are refused
MAX_HEAD_DIM = 256  # a [16, 256] tile of each of q, k, v still fits in registers
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# Set by _triton() on first use; module globals so the kernel body below can name `tl` the way Triton's
# JIT resolves names (through the function's globals), whatever the installed Triton version.
triton: Any = None
tl: Any = None


def _interpreting() -> bool:
    """Triton's CPU interpreter (TRITON_INTERPRET=1) runs the kernel on host tensors: used by the tests."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@functools.cache
def _triton_importable() -> bool:
    try:
        import triton as _t  # noqa: F401
        import triton.language as _tl  # noqa: F401
    except Exception:  # ImportError, or a broken install (missing CUDA libraries): either way, no kernel
        return False
    return True


def available(device: torch.device | str) -> bool:
    """Whether the Triton kernel (rather than the torch reference) runs for tensors on `device`."""
    if not _triton_importable():
        return False
    if _interpreting():
        return True
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.is_available()


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 4:
        raise ValueError(f"short_attention: q must be [B, H, F, D], got shape {tuple(q.shape)}")
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"short_attention: q, k, v must have one shape (self-attention), got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in _DTYPES:
        raise ValueError(f"short_attention: q, k, v must share one of float16/bfloat16/float32, got "
                         f"{q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"short_attention: q, k, v on different devices: {q.device}, {k.device}, {v.device}")
    frames, head_dim = q.shape[2], q.shape[3]
    if frames > MAX_FRAMES:
        raise ValueError(f"short_attention handles at most {MAX_FRAMES} frames per sequence, got F={frames}; "
                         "use torch.nn.functional.scaled_dot_product_attention for longer ones")
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"short_attention handles head dims up to {MAX_HEAD_DIM}, got D={head_dim}")


def _empty_out(q: torch.Tensor) -> torch.Tensor:
    """[B, H, F, D] view of contiguous [B, F, H, D] memory: the caller's transpose(1, 2).reshape is free."""
    b, h, f, d = q.shape
    return torch.empty((b, f, h, d), dtype=q.dtype, device=q.device).transpose(1, 2)


def _reference_short_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Plain torch, float32 accumulation, same output layout as the kernel: the fallback and the tests' oracle."""
    _check(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    out = _empty_out(q)
    out.copy_(torch.matmul(scores.softmax(dim=-1), v.float()))
    return out


# ---------------------------------------------------------------------------------------------------------------
# Triton kernel. Kept a plain function and wrapped with triton.jit on first use (see _triton) so that importing
# this module never imports Triton.

def _short_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr,
    frames,
    sq_b, sq_h, sq_f, sk_b, sk_h, sk_f, sv_b, sv_h, sv_f, so_b, so_h, so_f,
    qk_scale,                        # softmax scale * log2(e): the softmax runs on exp2
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,           # HEAD_DIM rounded up to a power of two (tl.arange needs one), >= 16
    BLOCK_F: tl.constexpr,           # 16: every sequence is padded to one tensor-core tile, so with BLOCK_D
                                     # >= 16 both products always fit tl.dot's M, N, K >= 16 (no
                                     # elementwise fallback needed for F < 16)
    HEADS_PER_PROGRAM: tl.constexpr,  # divides `heads`; > 1 amortises the per-program setup over heads
    FP32_INPUTS: tl.constexpr,
):
    # int64: row * batch stride can pass 2**31 for large batches of wide rows (int32 would wrap)
    row = tl.program_id(0).to(tl.int64)
    first_head = tl.program_id(1) * HEADS_PER_PROGRAM
    offs_f = tl.arange(0, BLOCK_F)
    offs_d = tl.arange(0, BLOCK_D)
    frame_ok = offs_f < frames
    tile_ok = frame_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    # Padded key columns get -inf so they take no softmax weight; padded query rows load zeros (finite
    # scores, no NaN) and are never stored.
    key_bias = tl.where(frame_ok, 0.0, float("-inf"))
    for i in tl.static_range(HEADS_PER_PROGRAM):
        head = first_head + i
        q = tl.load(q_ptr + row * sq_b + head * sq_h + offs_f[:, None] * sq_f + offs_d[None, :],
                    mask=tile_ok, other=0.0)
        k = tl.load(k_ptr + row * sk_b + head * sk_h + offs_f[:, None] * sk_f + offs_d[None, :],
                    mask=tile_ok, other=0.0)
        v = tl.load(v_ptr + row * sv_b + head * sv_h + offs_f[:, None] * sv_f + offs_d[None, :],
                    mask=tile_ok, other=0.0)
        if FP32_INPUTS:
            # float32 callers asked for float32 maths: keep tensor cores off TF32 (10-bit mantissa)
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))  # 16-bit operands, float32 accumulator
        s = s * qk_scale + key_bias[None, :]
        m = tl.max(s, axis=1)
        p = tl.exp2(s - m[:, None])
        denom = tl.sum(p, axis=1)
        if FP32_INPUTS:
            o = tl.dot(p, v, input_precision="ieee")
        else:
            # weights in [0, 1] rounded to the input type for the tensor-core product (as flash attention
            # does); the sum itself accumulates in float32 and is normalised after
            o = tl.dot(p.to(v.dtype), v)
        o = o / denom[:, None]
        tl.store(o_ptr + row * so_b + head * so_h + offs_f[:, None] * so_f + offs_d[None, :],
                 o.to(o_ptr.dtype.element_ty), mask=tile_ok)


@functools.cache
def _triton() -> Any:
    """Import Triton and JIT the kernel, once. Cached: TRITON_INTERPRET is read at this point."""
    global triton, tl
    import triton as _triton_mod
    import triton.language as _tl

    triton, tl = _triton_mod, _tl
    return _triton_mod.jit(_short_attention_kernel)


def _launch_defaults(head_dim: int) -> tuple[int, int]:
    """(heads per program, num_warps), from a sweep on an H200 (fp16, B=8192, H=8, F=16; heads per program
    1/2/4/8 x num_warps 1/2/4): two heads a program beat one by 10-25% (per-program setup amortised, more
    loads in flight) and 4-8 gave nothing more; two warps were best at D=40/80 and one at D=160 (not profiled
    further). Measured there: D=40 ~155 us
    (SDPA 1050), D=80 ~195 us (SDPA 1380), D=160 ~345 us (SDPA 2060), i.e. 2.2-3.9 TB/s of q/k/v/out."""
    block_d = max(16, _next_pow2(head_dim))
    return 2, (1 if block_d >= 256 else 2)


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _triton_short_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                            heads_per_program: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """The kernel, with its launch parameters open (tests and benchmarks; the op uses the defaults)."""
    _check(q, k, v)
    # the kernel adds offs_d without a stride: the rare caller with a strided last dim pays for a copy
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    b, h, f, d = q.shape
    out = _empty_out(q)
    if out.numel() == 0:
        return out
    default_heads, default_warps = _launch_defaults(d)
    per_program = math.gcd(h, heads_per_program or default_heads)  # must divide h: no head mask in the kernel
    kernel = _triton()
    grid = (b, h // per_program)
    kernel[grid](
        q, k, v, out, f,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        (1.0 / math.sqrt(d)) * math.log2(math.e),
        HEAD_DIM=d, BLOCK_D=max(16, _next_pow2(d)), BLOCK_F=MAX_FRAMES,
        HEADS_PER_PROGRAM=per_program, FP32_INPUTS=q.dtype == torch.float32,
        num_warps=num_warps or default_warps, num_stages=1,
    )
    return out


# ---------------------------------------------------------------------------------------------------------------
# Custom op: inductor and CUDA graphs treat it as one opaque call whose output layout the fake states.

def _short_attention_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    if available(q.device):
        return _triton_short_attention(q, k, v)
    return _reference_short_attention(q, k, v)


def _short_attention_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    _check(q, k, v)
    return _empty_out(q)


if hasattr(torch.ops.digital_human, "short_attention"):
    # The pack imported a second time under another module name (ComfyUI loads it by folder name):
    # the op is process-wide and a second definition would raise, so use the first one.
    _op = torch.ops.digital_human.short_attention
else:
    _op = torch.library.custom_op("digital_human::short_attention", mutates_args=())(_short_attention_impl)
    _op.register_fake(_short_attention_fake)


def short_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v over F <= 16 positions, like F.scaled_dot_product_attention(q, k, v).

    q, k, v: [B, H, F, D], any strides with a unit last-dim stride, one of float16/bfloat16/float32.
    Returns [B, H, F, D] laid out as contiguous [B, F, H, D] (stride(2) == H * D). Raises ValueError for
    F > 16 (MAX_FRAMES) before anything runs, so callers can route those to SDPA.
    """
    _check(q, k, v)  # here too, so eager callers get the ValueError itself rather than via the dispatcher
    return _op(q, k, v)
