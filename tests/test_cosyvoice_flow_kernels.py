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


def test_a_shared_estimator_keeps_its_kernels(models):
    """Live mode's lanes share the first solver's estimator: the second solver neither copies nor fuses it again."""
    first = FastCFM(models.flow.decoder, torch.float32, bucket=16, cuda_graph=False, fused=True)
    second = FastCFM(models.flow.decoder, torch.float32, bucket=16, cuda_graph=False, estimator=first.estimator)
    assert second.estimator is first.estimator
    assert sum(isinstance(m, flow_kernels.FusedSelfAttention) for m in second.estimator.modules()) > 0


def test_flow_kernels_variable(monkeypatch):
    from digital_human.engines.cosyvoice.engine import FLOW_KERNELS_ENV, fast_path_from_env

    monkeypatch.delenv(FLOW_KERNELS_ENV, raising=False)
    assert not fast_path_from_env().flow_fused and not fast_path_from_env().flow_compile
    monkeypatch.setenv(FLOW_KERNELS_ENV, "fused")
    assert fast_path_from_env().flow_fused and not fast_path_from_env().flow_compile
    monkeypatch.setenv(FLOW_KERNELS_ENV, " Compiled ")
    assert fast_path_from_env().flow_fused and fast_path_from_env().flow_compile
    monkeypatch.setenv(FLOW_KERNELS_ENV, "fast")
    with pytest.raises(ValueError, match=FLOW_KERNELS_ENV):
        fast_path_from_env()
