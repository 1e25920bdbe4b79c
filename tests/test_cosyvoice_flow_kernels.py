"""engines/cosyvoice/flow_kernels.py on the CPU: the flow solve with q/k/v fused and with its blocks compiled equals the
eager solve (reduced configuration, weights rebuilt from the reference fixture's seed). Speed is a GPU question
(benchmarks/gpu_tts_pieces.py --sections flow_kernels); what is checked here is that the values stay the same, that
regional compilation compiles each block kind once for every length and row count, and that a failed compile is
announced and the solve still comes out."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="CosyVoice 2 needs the optional extra: pip install .[cosyvoice]")

from digital_human.engines.cosyvoice import flow_kernels  # noqa: E402
from digital_human.engines.cosyvoice.flow import FastCFM, TransformerBlock  # noqa: E402
from digital_human.engines.cosyvoice.parity import write_release_from_fixture  # noqa: E402
from digital_human.engines.cosyvoice.release import load_models  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "cosyvoice" / "reduced.npz"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.set_num_threads(2)
    data = dict(np.load(FIXTURE, allow_pickle=False))
    models = load_models(write_release_from_fixture(data, tmp_path_factory.mktemp("cvk") / "CosyVoice2-0.5B"))
    models.inputs = [torch.from_numpy(data[k]) for k in ("in_flow_token", "in_flow_prompt_token",
                                                          "in_flow_prompt_feat", "in_flow_embedding")]
    models.ref_mel = torch.from_numpy(data["out_flow_mel"])  # made by the reference code
    return models


def _rows(models, frames: int, rows: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(rows, 80, frames, generator=g)
    mask = torch.ones(rows, 1, frames)
    mask[-1, :, frames - 5:] = 0  # the last row shorter: the padding's mask in the bias
    return mu, mask, torch.randn(rows, 80, generator=g), torch.randn(rows, 80, frames, generator=g)


def test_fused_projections_equal_separate(models):
    plain = FastCFM(models.flow.decoder, torch.float32, bucket=16, cuda_graph=False)
    fused = FastCFM(models.flow.decoder, torch.float32, bucket=16, cuda_graph=False, fused=True)
    blocks = [m for m in fused.estimator.modules() if isinstance(m, TransformerBlock)]
    assert blocks and all(isinstance(b.attn1, flow_kernels.FusedSelfAttention) for b in blocks)
    assert not any(isinstance(m, flow_kernels.FusedSelfAttention) for m in models.flow.decoder.estimator.modules())
    args = _rows(models, 32, 2)
    a, b = plain.solve_rows(*args), fused.solve_rows(*args)
    assert float((a - b).abs().max()) < 1e-5 * float(a.abs().max())
    # and through the whole flow against the reference code's mel
    out = models.flow.inference(*models.inputs, solver=fused)
    assert float((out - models.ref_mel).abs().max()) < 1e-4


def test_compiled_blocks_equal_eager_and_compile_once(models):
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    eager = FastCFM(models.flow.decoder, torch.float32, bucket=16, cuda_graph=False, fused=True)
    compiled = FastCFM(models.flow.decoder, torch.float32, bucket=16, cuda_graph=False, fused=True, compiled=True)
    assert flow_kernels.compiled_blocks(compiled.estimator) == sum(
        1 for m in compiled.estimator.modules() if isinstance(m, (TransformerBlock, flow_kernels.CausalResnet)))
    for frames, rows in ((32, 1), (48, 2), (64, 3)):  # three lengths and row counts
        args = _rows(models, frames, rows, seed=frames)
        a, b = eager.solve_rows(*args), compiled.solve_rows(*args)
        assert float((a - b).abs().max()) < 1e-4 * float(a.abs().max()), (frames, rows)
    assert compiled.compile_note is None
    # regional + dynamic: each block kind compiled at most twice (its first shape, then once with dynamic sizes),
    # not once per block instance (3 resnets and 3 transformer blocks in the reduced estimator) or per length
    assert 2 <= counters["stats"]["unique_graphs"] <= 4, dict(counters["stats"])


def test_failed_compile_is_announced_and_solves_eagerly(models, caplog):
    solver = FastCFM(models.flow.decoder, torch.float32, bucket=16, cuda_graph=False, compiled=True)
    block = next(m for m in solver.estimator.modules() if isinstance(m, TransformerBlock))

    def broken(*args, **kwargs):
        raise RuntimeError("inductor said no")

    block._compiled_call_impl = broken
    args = _rows(models, 32, 1)
    with caplog.at_level(logging.WARNING, logger="digital_human.cosyvoice"):
        out = solver.solve_rows(*args)
    assert solver.compile_note and "inductor said no" in solver.compile_note and "eagerly" in solver.compile_note
    assert "inductor said no" in caplog.text
    assert flow_kernels.compiled_blocks(solver.estimator) == 0
    plain = FastCFM(models.flow.decoder, torch.float32, bucket=16, cuda_graph=False).solve_rows(*args)
    assert torch.equal(out, plain)


def test_after_a_compiled_solve_worked_other_failures_are_raised(models):
    """Once a solve with compiled blocks has worked, a later failure that is not the compiler's (an out-of-memory, a
    bad shape) is raised as it is; the blocks stay compiled (they are shared by every lane)."""
    solver = FastCFM(models.flow.decoder, torch.float32, bucket=16, cuda_graph=False, compiled=True)
    args = _rows(models, 32, 1)
    solver.solve_rows(*args)
    block = next(m for m in solver.estimator.modules() if isinstance(m, TransformerBlock))
    working = block._compiled_call_impl

    def oom(*a, **k):
        raise RuntimeError("CUDA out of memory")

    block._compiled_call_impl = oom
    with pytest.raises(RuntimeError, match="out of memory"):
        solver.solve_rows(*args)
    assert solver.compile_note is None and flow_kernels.compiled_blocks(solver.estimator) > 0
    block._compiled_call_impl = working


def test_compiled_code_that_cannot_be_captured_is_captured_eagerly(models, monkeypatch, caplog):
    """A compiled solve that runs but fails inside the graph capture: announced, the blocks made eager, captured
    again (the CPU has no CUDA graphs: the capture is a stand-in that fails while any block is compiled)."""
    from digital_human.engines.cosyvoice import flow as fl

    def capture(run, device, pool=None, stream=None):
        if flow_kernels.compiled_blocks(solver.estimator):
            raise RuntimeError("operation not permitted when stream is capturing")
        out = run()
        return (lambda: out.copy_(run())), out

    monkeypatch.setattr(fl, "_capture", capture)
    solver = FastCFM(models.flow.decoder, torch.float32, bucket=16, cuda_graph=True, compiled=True)
    args = _rows(models, 32, 1)
    with caplog.at_level(logging.WARNING, logger="digital_human.cosyvoice"):
        out = solver.solve_rows(*args)
    assert solver.compile_note and "not permitted" in solver.compile_note and solver.captures == 1
    plain = FastCFM(models.flow.decoder, torch.float32, bucket=16, cuda_graph=False).solve_rows(*args)
    assert torch.equal(out, plain)


def test_a_shared_estimator_keeps_its_kernels(models):
    """Live mode's lanes share the first solver's estimator: the second solver neither copies nor fuses it again."""
    first = FastCFM(models.flow.decoder, torch.float32, bucket=16, cuda_graph=False, fused=True)
    second = FastCFM(models.flow.decoder, torch.float32, bucket=16, cuda_graph=False, estimator=first.estimator)
    assert second.estimator is first.estimator
    assert sum(isinstance(m, flow_kernels.FusedSelfAttention) for m in second.estimator.modules()) > 0


def test_flow_kernels_variable(monkeypatch):
    from digital_human.engines.cosyvoice.engine import FLOW_KERNELS_ENV, fast_path_from_env

    on = lambda: {k for k in ("flow_fused", "flow_compile", "flow_encoder_graph")  # noqa: E731
                  if getattr(fast_path_from_env(), k)}
    monkeypatch.delenv(FLOW_KERNELS_ENV, raising=False)
    assert on() == set()
    monkeypatch.setenv(FLOW_KERNELS_ENV, "fused")
    assert on() == {"flow_fused"}
    monkeypatch.setenv(FLOW_KERNELS_ENV, " Compiled , encoder_graph")
    assert on() == {"flow_compile", "flow_encoder_graph"}
    monkeypatch.setenv(FLOW_KERNELS_ENV, "all")
    assert on() == {"flow_fused", "flow_compile", "flow_encoder_graph"}
    monkeypatch.setenv(FLOW_KERNELS_ENV, "fused,fast")
    with pytest.raises(ValueError, match=f"{FLOW_KERNELS_ENV}.*fast unknown"):
        fast_path_from_env()


def test_padded_encoder_equals_unpadded(models):
    """TokenEncoder with `valid`: the real frames of a padded call are the unpadded call's (the lookahead conv sees
    zeros past the last token either way, attention ignores padded keys, the upsampling conv looks left)."""
    from digital_human.engines.cosyvoice.flow_encoder import FastEncoder

    flow = models.flow
    g = torch.Generator().manual_seed(3)
    vocab = flow.input_embedding.num_embeddings
    for count, bucket in ((5, 8), (29, 32), (32, 32), (41, 7)):
        tokens = torch.randint(0, vocab, (1, count), generator=g)
        with torch.inference_mode():
            want = flow.encode(tokens)
            got = FastEncoder(flow, bucket=bucket, cuda_graph=False)(tokens)
            padded = FastEncoder(flow, bucket=bucket).padded(count)
            wrong = flow.encode(torch.nn.functional.pad(tokens, (0, padded - count)))[:, :, :2 * count]
        assert got.shape == want.shape == (1, 80, 2 * count)
        assert float((got - want).abs().max()) < 1e-5 * float(want.abs().max())
        if padded > count:  # without the mask the padding leaks into the real frames: the test can tell
            assert float((wrong - want).abs().max()) > 1e-3 * float(want.abs().max())
    # the whole flow with it, against the reference code's mel
    out = flow.inference(*models.inputs, encoder=FastEncoder(flow, bucket=16, cuda_graph=False))
    assert float((out - models.ref_mel).abs().max()) < 1e-4


def test_encoder_graphs_prepared_ahead_and_replayed(models, monkeypatch):
    """FastEncoder's graph path on the CPU, with the capture replaced by a stand-in that records the same calls (the
    CPU has no CUDA graphs): prepare() captures every padded length up to the most tokens, longest first; a call
    copies its padded tokens into the graph's inputs, replays, and returns its real frames."""
    from digital_human.engines.cosyvoice import flow as fl
    from digital_human.engines.cosyvoice.flow_encoder import FastEncoder

    captured: list[int] = []

    def capture(run, device, pool=None, stream=None):
        assert pool is None and stream is None  # the CPU: no pool, no capture stream
        out = run()
        captured.append(int(out.shape[2]))
        return (lambda: out.copy_(run())), out

    monkeypatch.setattr(fl, "_capture", capture)
    flow = models.flow
    encoder = FastEncoder(flow, bucket=16, cuda_graph=True)
    assert encoder.prepare(40) == 3 and captured == [96, 64, 32] and encoder.captures == 3
    g = torch.Generator().manual_seed(4)
    for count in (3, 16, 33, 47, 50):
        tokens = torch.randint(0, flow.input_embedding.num_embeddings, (1, count), generator=g)
        with torch.inference_mode():
            got, want = encoder(tokens), flow.encode(tokens)
        assert float((got - want).abs().max()) < 1e-5 * float(want.abs().max()), count
    # up to 48 tokens from the prepared graphs; 50 tokens: a 4th length (64), captured on first use
    assert encoder.captures == 4 and captured[3:] == [128]


def test_runtime_uses_the_encoder_when_asked(models, tmp_path):
    """FastPath(flow_encoder_graph=True) routes the runtime's flow through FastEncoder (here its padded eager call):
    the same speech as without it, within rounding."""
    from digital_human.engines.cosyvoice.engine import CosyVoice2Runtime, FastPath
    from digital_human.engines.cosyvoice.flow_encoder import FastEncoder

    folder = write_release_from_fixture(dict(np.load(FIXTURE, allow_pickle=False)), tmp_path / "CosyVoice2-0.5B")
    base = dict(lm_compile=False, flow_half=False, lm_device_sampling=False)
    plain = CosyVoice2Runtime(folder, "cpu", fast=FastPath(**base))
    enc = CosyVoice2Runtime(folder, "cpu", fast=FastPath(**base, flow_encoder_graph=True))
    assert plain._flow_encoder() is None and isinstance(enc._flow_encoder(), FastEncoder)
    x = {"prompt_token": models.inputs[1], "prompt_feat": models.inputs[2], "embedding": models.inputs[3]}
    tokens = models.inputs[0][0].tolist()
    a, b = plain._mel(tokens, x), enc._mel(tokens, x)
    assert a.shape == b.shape and float((a - b).abs().max()) < 1e-4 * float(a.abs().max())


def test_a_failed_encoder_capture_is_reported_and_the_encoder_runs_eagerly(models, tmp_path, monkeypatch, caplog):
    from digital_human.engines.cosyvoice import flow as fl
    from digital_human.engines.cosyvoice.engine import CosyVoice2Runtime, FastPath
    from digital_human.engines.cosyvoice.flow_encoder import FastEncoder

    def capture(run, device, pool=None, stream=None):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(fl, "_capture", capture)
    folder = write_release_from_fixture(dict(np.load(FIXTURE, allow_pickle=False)), tmp_path / "CosyVoice2-0.5B")
    runtime = CosyVoice2Runtime(folder, "cpu", fast=FastPath(lm_compile=False, flow_half=False,
                                                             lm_device_sampling=False, flow_encoder_graph=True))
    runtime._encoder = FastEncoder(runtime.models.flow, cuda_graph=True)  # as on CUDA
    with caplog.at_level(logging.WARNING, logger="digital_human.cosyvoice"):
        report = runtime._prepare_encoder_graphs(runtime._encoder, 40)
    assert report["encoder_graphs"] == 0 and "not permitted" in report["encoder_graphs_error"]
    assert "runs eagerly" in caplog.text
    assert runtime._flow_encoder() is None  # from now on the flow encodes eagerly
    x = {"prompt_token": models.inputs[1], "prompt_feat": models.inputs[2], "embedding": models.inputs[3]}
    assert runtime._mel(models.inputs[0][0].tolist(), x).shape[2] == 2 * models.inputs[0].shape[1]
