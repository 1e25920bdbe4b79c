"""Fewer GPU kernels per CosyVoice 2 flow solve, for FastCFM's half-precision estimator copy.

Why: a live piece's flow solve is 10 Euler steps of the estimator with its 56 transformer blocks and 14 ResNet
blocks: 16,784 torch calls (counted on the CPU with the full-size architecture; views among them launch
no kernel), their kernels replayed from a CUDA graph. On an H200 the solve's time hardly depends on its length
(47 ms at 448 frames for one row, 2026-12-04 benchmarks/RESULTS_live.md) and each further row adds ~10 ms: the
fixed part, one kernel after another, is what a live server pays per piece. Two ways to launch fewer:

- fuse_projections: each self-attention's to_q / to_k / to_v as one projection (one GEMM of the stacked weights
  instead of three). The same products; only the GEMM's rounding may differ.
- compile_blocks: torch.compile (inductor) of each transformer and ResNet block (regional compilation: the 56
  transformer blocks share one compiled graph, the 14 ResNets one per input width (3), so the compile is paid once
  per block kind and not for the unrolled network), with dynamic lengths and rows. Layer norms, activations, masks and residual
  adds fuse into a few kernels. Capturing the compiled blocks in FastCFM's graphs works as for the eager ones:
  the capture's warm-up call compiles.

Neither changes the reference path (CausalFlow.inference without a solver) nor the released weights.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from .flow import CausalResnet, TransformerBlock, _SelfAttention

log = logging.getLogger("digital_human.cosyvoice")


class FusedSelfAttention(nn.Module):
    """flow._SelfAttention with its three input projections as one: [q | k | v] = x @ [Wq; Wk; Wv]^T."""

    def __init__(self, attn: _SelfAttention) -> None:
        super().__init__()
        self.heads, self.head_dim = attn.heads, attn.head_dim
        weight = torch.cat([attn.to_q.weight, attn.to_k.weight, attn.to_v.weight]).detach().clone()
        self.to_qkv = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device,
                                dtype=weight.dtype)
        with torch.no_grad():
            self.to_qkv.weight.copy_(weight)
        self.to_out = attn.to_out

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.to_qkv(x).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.to_out[0](out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


def fuse_projections(estimator: nn.Module) -> int:
    """Replace every CosyVoice 2 transformer block's self-attention in `estimator` by FusedSelfAttention (in place);
    returns how many. Other estimators (CosyVoice 3's DiT) have none, and are left as they are (0)."""
    count = 0
    for module in estimator.modules():
        if isinstance(module, TransformerBlock) and isinstance(module.attn1, _SelfAttention):
            module.attn1 = FusedSelfAttention(module.attn1).requires_grad_(False)
            count += 1
    return count


def compile_blocks(estimator: nn.Module) -> int:
    """torch.compile each transformer and ResNet block of a CosyVoice 2 estimator in place (nn.Module.compile, dynamic
    shapes: every padded length and row count shares the compiled code); returns how many blocks. The compile runs
    at each block kind's first call. A failure there is not caught here: FastCFM announces it and runs eagerly."""
    count = 0
    for module in estimator.modules():
        if isinstance(module, (TransformerBlock, CausalResnet)):
            module.compile(dynamic=True)
            count += 1
    return count


def compiled_blocks(estimator: nn.Module) -> int:
    """How many of the estimator's blocks run compiled now."""
    return sum(1 for m in estimator.modules() if isinstance(m, (TransformerBlock, CausalResnet))
               and getattr(m, "_compiled_call_impl", None) is not None)


def uncompile_blocks(estimator: nn.Module) -> None:
    """Undo compile_blocks: every block runs its eager forward again (the announced fallback of a failed compile)."""
    for module in estimator.modules():
        if isinstance(module, (TransformerBlock, CausalResnet)):
            module._compiled_call_impl = None
