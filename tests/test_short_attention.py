"""engines/latentsync/short_attention.py: the F <= 16 self-attention kernel against
F.scaled_dot_product_attention, on inputs made the way the UNet's Attention.forward makes them (strided
views of [b, n, heads * D]), and its output layout ([B, F, H, D] memory, so the caller's transpose+reshape
is a view).

Kernel tests need Triton: on a CUDA machine they run the compiled kernel; on the CPU they run under Triton's
interpreter in a fresh pytest process started with TRITON_INTERPRET=1 (test_kernel_tests_under_the_interpreter), so
no other test's code runs interpreted and no earlier import of triton decides the mode. Without Triton they skip;
the rest needs no Triton: the torch reference path, the custom op's fake (torch.compile / inductor on CPU), the
F > 16 refusal, and that the module imports without Triton.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from digital_human.engines.latentsync import short_attention as sa

MODULE_PATH = Path(sa.__file__)
H = 2  # heads: enough to exercise the head strides, small enough for the interpreter


def _caller_qkv(b: int, frames: int, heads: int, d: int, dtype: torch.dtype, device: str = "cpu",
                seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as unet.Attention.forward makes them: `to_q(x).view(b, n, heads, -1).transpose(1, 2)`,
    i.e. strides (n * heads * D, D, heads * D, 1)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(3):
        proj = torch.randn(b, frames, heads * d, generator=g).to(device=device, dtype=dtype)
        out.append(proj.view(b, frames, heads, -1).transpose(1, 2))
    return out[0], out[1], out[2]


def _sdpa32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float())


def _tolerance(dtype: torch.dtype) -> float:
    # outputs are of order 1: fp16's rounding of the output and of the softmax weights is ~5e-4 each
    return {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]


def _assert_layout(out: torch.Tensor, b: int, heads: int, frames: int, d: int) -> None:
    assert out.shape == (b, heads, frames, d)
    assert out.stride() == (frames * heads * d, d, heads * d, 1)  # [B, F, H, D] memory: stride(2) == H * D
    out.transpose(1, 2).view(b, frames, heads * d)  # the caller's reshape is a view (raises if it were not)


# --------------------------------------------------------------------------------------------------------------
# Kernel (Triton: compiled on CUDA, interpreted on CPU)

# Triton decides at its import whether @triton.jit functions (its own tl.max too) are interpreted, and other tests of a
# run import it first (torch.compile's inductor does): so on the CPU the kernel tests run in a fresh process started
# with TRITON_INTERPRET=1 (test_kernel_tests_under_the_interpreter), and here only in that process or on CUDA.
STARTED_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture
def kernel_device() -> Iterator[str]:
    if not STARTED_INTERPRETED and not torch.cuda.is_available():
        pytest.skip("on the CPU these run in a fresh process under Triton's interpreter "
                    "(test_kernel_tests_under_the_interpreter)")
    pytest.importorskip("triton", reason="Triton not installed: the kernel tests need it (CPU interpreter or CUDA)")
    yield "cpu" if STARTED_INTERPRETED else "cuda"


def test_kernel_tests_under_the_interpreter() -> None:
    """This file's kernel tests in a fresh pytest process with TRITON_INTERPRET=1 (the CPU's way to run the kernel)."""
    import importlib.util

    if STARTED_INTERPRETED or torch.cuda.is_available():
        pytest.skip("this process runs the kernel tests itself")
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton not installed: the kernel tests need it (CPU interpreter or CUDA)")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__)),
                           "-k", "kernel and not under_the_interpreter"], cwd=root, capture_output=True, text=True,
                          env=dict(os.environ, TRITON_INTERPRET="1"), timeout=900)
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and " failed" not in proc.stdout, tail


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("d", [40, 80, 160])
@pytest.mark.parametrize("frames", [1, 5, 16])
def test_kernel_matches_sdpa(kernel_device: str, frames: int, d: int, dtype: torch.dtype) -> None:
    b = 3
    q, k, v = _caller_qkv(b, frames, H, d, dtype, kernel_device)
    assert q.stride() == (frames * H * d, d, H * d, 1)  # the caller's views, not contiguous copies
    out = sa._triton_short_attention(q, k, v)
    assert out.dtype == dtype and out.device == q.device
    _assert_layout(out, b, H, frames, d)
    torch.testing.assert_close(out.float(), _sdpa32(q, k, v), atol=_tolerance(dtype), rtol=0)
    # the public entry (the custom op) dispatches to the same kernel here
    assert sa.available(q.device)
    torch.testing.assert_close(sa.short_attention(q, k, v), out, atol=0, rtol=0)


@pytest.mark.parametrize("heads_per_program, num_warps", [(1, 1), (2, 2), (4, 4), (3, 1)])
def test_kernel_launch_parameters_agree(kernel_device: str, heads_per_program: int, num_warps: int) -> None:
    """Heads per program (3 does not divide 4 heads: it falls back to a divisor) and warps change the
    schedule, not the result."""
    q, k, v = _caller_qkv(2, 7, 4, 40, torch.float32, kernel_device, seed=1)
    out = sa._triton_short_attention(q, k, v, heads_per_program=heads_per_program, num_warps=num_warps)
    _assert_layout(out, 2, 4, 7, 40)
    torch.testing.assert_close(out, _sdpa32(q, k, v), atol=1e-5, rtol=0)


def test_kernel_other_strides(kernel_device: str) -> None:
    """Plain contiguous [B, H, F, D] and slices of one fused qkv projection: any strides, unit last stride."""
    b, frames, d = 2, 9, 80
    g = torch.Generator().manual_seed(2)
    contiguous = [torch.randn(b, H, frames, d, generator=g).to(kernel_device) for _ in range(3)]
    fused = torch.randn(b, frames, 3 * H * d, generator=g).to(kernel_device)
    sliced = [t.view(b, frames, H, d).transpose(1, 2) for t in fused.split(H * d, dim=-1)]
    for q, k, v in (contiguous, sliced):
        out = sa._triton_short_attention(q, k, v)
        _assert_layout(out, b, H, frames, d)
        torch.testing.assert_close(out, _sdpa32(q, k, v), atol=1e-5, rtol=0)


def test_kernel_bf16_on_cuda(kernel_device: str) -> None:
    if kernel_device != "cuda":
        pytest.skip("bfloat16 is checked on CUDA only (the interpreter computes through numpy, which has no bf16)")
    q, k, v = _caller_qkv(64, 16, 8, 40, torch.bfloat16, "cuda")
    torch.testing.assert_close(sa._triton_short_attention(q, k, v).float(), _sdpa32(q, k, v), atol=1.6e-2, rtol=0)


# --------------------------------------------------------------------------------------------------------------
# Reference path, custom op, refusal: no Triton needed (what CI runs)

@pytest.fixture
def no_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("d", [40, 80, 160])
@pytest.mark.parametrize("frames", [1, 5, 16])
def test_reference_matches_sdpa(no_interpreter: None, frames: int, d: int, dtype: torch.dtype) -> None:
    b = 4
    q, k, v = _caller_qkv(b, frames, H, d, dtype)
    out = sa._reference_short_attention(q, k, v)
    assert out.dtype == dtype
    _assert_layout(out, b, H, frames, d)
    torch.testing.assert_close(out.float(), _sdpa32(q, k, v), atol=_tolerance(dtype), rtol=0)
    # on CPU without the interpreter the op runs the reference
    assert not sa.available("cpu")
    torch.testing.assert_close(sa.short_attention(q, k, v), out, atol=0, rtol=0)


@pytest.mark.parametrize("frames", [17, 32])
def test_more_than_16_frames_refused(frames: int) -> None:
    q, k, v = _caller_qkv(1, frames, H, 40, torch.float32)
    for fn in (sa.short_attention, sa._reference_short_attention, torch.ops.digital_human.short_attention):
        with pytest.raises(ValueError, match="at most 16 frames"):
            fn(q, k, v)


def test_mismatched_inputs_refused() -> None:
    q, k, v = _caller_qkv(1, 4, H, 40, torch.float32)
    with pytest.raises(ValueError, match="one shape"):
        sa.short_attention(q, k[:, :, :3], v)
    with pytest.raises(ValueError, match="float16/bfloat16/float32"):
        sa.short_attention(q, k.half(), v)
    with pytest.raises(ValueError, match=r"\[B, H, F, D\]"):
        sa.short_attention(q[0], k[0], v[0])


def test_available(no_interpreter: None) -> None:
    assert not sa.available("cpu")
    assert not sa.available(torch.device("meta"))
    if not torch.cuda.is_available():
        assert not sa.available("cuda")


def test_custom_op_opcheck(no_interpreter: None) -> None:
    """Schema, fake (shape *and* strides equal to the real output's), and dispatch checks of torch.library."""
    q, k, v = _caller_qkv(2, 5, H, 40, torch.float32)
    torch.library.opcheck(torch.ops.digital_human.short_attention.default, (q, k, v))


def test_fake_gives_the_real_layout() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k, v = (torch.empty(3, 5, H * 80).view(3, 5, H, 80).transpose(1, 2) for _ in range(3))
        out = torch.ops.digital_human.short_attention(q, k, v)
    assert out.shape == (3, H, 5, 80) and out.stride() == (5 * H * 80, 80, H * 80, 1)


class _TemporalAttention(torch.nn.Module):
    """unet.Attention.forward's shape handling around the op."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.to_q, self.to_k, self.to_v = (torch.nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.to_out = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, fused: bool) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = (p(x).view(b, n, self.heads, -1).transpose(1, 2) for p in (self.to_q, self.to_k, self.to_v))
        if fused:
            out = sa.short_attention(q, k, v)
        else:
            out = F.scaled_dot_product_attention(q, k, v)
        return self.to_out(out.transpose(1, 2).reshape(b, n, -1))


def test_torch_compile_sees_one_opaque_op(no_interpreter: None) -> None:
    """Dynamo traces through the wrapper and keeps the op as one graph node (what inductor and CUDA-graph
    capture then treat as an opaque call); the graph runs with the fake's layout."""
    torch._dynamo.reset()
    graphs: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, example_inputs: list) -> torch.fx.GraphModule:
        graphs.append(gm)
        return gm

    model = _TemporalAttention(2 * 40, 2).eval()
    x = torch.randn(6, 16, 80)
    with torch.no_grad():
        out = torch.compile(model, backend=record, fullgraph=True)(x, True)
        torch.testing.assert_close(out, model(x, False), atol=1e-5, rtol=0)
    targets = [node.target for gm in graphs for node in gm.graph.nodes if node.op == "call_function"]
    assert targets.count(torch.ops.digital_human.short_attention.default) == 1, targets


def test_torch_compile_inductor_cpu(no_interpreter: None) -> None:
    """Inductor compiles a graph around the op (on CPU the op runs the reference) and matches SDPA."""
    torch._dynamo.reset()
    model = _TemporalAttention(2 * 40, 2).eval()
    x = torch.randn(6, 11, 80)
    with torch.no_grad():
        try:
            compiled = torch.compile(model, backend="inductor", fullgraph=True)(x, True)
        except Exception as exc:  # no C++ toolchain for inductor's CPU code here
            if "fake" in repr(exc).lower() or "short_attention" in repr(exc):
                raise
            pytest.skip(f"inductor unavailable here: {exc!r}"[:200])
        torch.testing.assert_close(compiled, model(x, False), atol=1e-5, rtol=0)


def test_imports_without_triton_and_twice() -> None:
    """Triton is optional and imported lazily: with it unimportable the module imports and the op runs the
    reference. Importing the module a second time under another name (ComfyUI loads the pack by its folder
    name) reuses the registered op instead of failing to register it again."""
    script = textwrap.dedent(f"""
        import importlib.util, sys
        sys.modules["triton"] = None  # makes `import triton` raise ImportError
        import torch
        mods = []
        for name in ("short_attention_a", "short_attention_b"):
            spec = importlib.util.spec_from_file_location(name, {str(MODULE_PATH)!r})
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            mods.append(mod)
        assert mods[0].triton is None and not mods[0].available("cpu") and not mods[0].available("cuda")
        x = torch.randn(2, 5, 2 * 40)
        q = k = v = x.view(2, 5, 2, 40).transpose(1, 2)
        out = mods[1].short_attention(q, k, v)
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        assert (out - ref).abs().max().item() < 1e-5 and out.stride(2) == 80
        print("ok")
    """)
    env = {key: val for key, val in os.environ.items() if key != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]


def test_scale_is_inverse_sqrt_head_dim() -> None:
    """Large logits (softmax saturates) agree too: the scale and the max-subtraction are the SDPA ones."""
    q, k, v = _caller_qkv(2, 16, H, 160, torch.float32)
    q = q * 8
    torch.testing.assert_close(sa._reference_short_attention(q, k, v), _sdpa32(q, k, v), atol=1e-5, rtol=0)
