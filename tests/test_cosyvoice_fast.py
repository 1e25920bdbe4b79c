"""CosyVoice 2 fast-path pieces on the CPU (reduced configuration, weights rebuilt from the fixture's seed).

The CUDA graphs themselves need a GPU (benchmarks/gpu_cosyvoice.py); what runs here is the same code
uncaptured: the static-KV-cache decode step against transformers' eager decode, the padded (bucketed)
flow solve against the unpadded reference solve, the folded-weight-norm HiFT against the parametrized one,
and the runtime's fast and streaming paths end to end.
"""
from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="CosyVoice 2 needs the optional extra: pip install .[cosyvoice]")

from digital_human.engines.cosyvoice.engine import CosyVoice2Runtime, FastPath  # noqa: E402
from digital_human.engines.cosyvoice.flow import FastCFM  # noqa: E402
from digital_human.engines.cosyvoice.hift import draw_source, without_weight_norm  # noqa: E402
from digital_human.engines.cosyvoice.lm import StaticDecoder  # noqa: E402
from digital_human.engines.cosyvoice.parity import write_release_from_fixture  # noqa: E402
from digital_human.engines.cosyvoice.random_release import write_random_release  # noqa: E402
from digital_human.engines.cosyvoice.release import load_models  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "cosyvoice" / "reduced.npz"


@pytest.fixture(scope="module")
def data():
    return dict(np.load(FIXTURE, allow_pickle=False))


@pytest.fixture(scope="module")
def folder(data, tmp_path_factory) -> Path:
    return write_release_from_fixture(data, tmp_path_factory.mktemp("cvfast") / "CosyVoice2-0.5B")


@pytest.fixture(scope="module")
def models(folder):
    torch.set_num_threads(2)
    return load_models(folder)


def _lm_inputs(data):
    return tuple(torch.from_numpy(data[k]) for k in ("in_lm_text", "in_lm_prompt_text", "in_lm_prompt_speech"))


def test_static_decoder_matches_eager_decode(models, data):
    args = _lm_inputs(data)
    eager = list(models.lm.generate(*args, generator=torch.Generator().manual_seed(2024)))
    decoder = StaticDecoder(models.lm, capacity=128)
    fast = list(models.lm.generate(*args, generator=torch.Generator().manual_seed(2024), decoder=decoder))
    assert fast == eager == data["out_lm_tokens"].tolist()  # and both equal the reference code's tokens
    with torch.inference_mode():  # teacher-forced log-probabilities, step by step
        ref = models.lm.logits_trace(*args, eager)
        rows = [decoder.prefill(models.lm.prompt_embeddings(*args))] + [decoder.step(t) for t in eager]
    assert torch.stack(rows).shape == ref.shape
    assert float((torch.stack(rows) - ref).abs().max()) < 1e-4


def test_static_decoder_too_short_falls_back_to_eager(models, data):
    args = _lm_inputs(data)
    decoder = StaticDecoder(models.lm, capacity=16)  # prompt alone is longer: generate must not use it
    assert not decoder.fits(17)
    tokens = list(models.lm.generate(*args, generator=torch.Generator().manual_seed(2024), decoder=decoder))
    assert tokens == data["out_lm_tokens"].tolist()


def test_forced_token_count(models, data):
    """max_tokens caps the length; min_tokens only bans the end-of-speech token, so the two other stop
    tokens can still end a call early (here at step 3 of the reduced 100-token vocabulary)."""
    args = _lm_inputs(data)
    draw = lambda **k: list(models.lm.generate(*args, generator=torch.Generator().manual_seed(5), **k))  # noqa: E731
    assert draw(min_tokens=2, max_tokens=2) == [60, 68]
    assert draw(min_tokens=40, max_tokens=40) == [60, 68, 3]


@pytest.mark.parametrize("bucket", [7, 64])
def test_padded_flow_solve_equals_reference(models, data, bucket):
    inputs = [torch.from_numpy(data[k]) for k in ("in_flow_token", "in_flow_prompt_token", "in_flow_prompt_feat",
                                                   "in_flow_embedding")]
    ref = models.flow.inference(*inputs)
    solver = FastCFM(models.flow.decoder, torch.float32, bucket=bucket)
    assert (ref.shape[2] + 2 * inputs[1].shape[1]) % bucket  # the padding is really used
    out = models.flow.inference(*inputs, solver=solver)
    assert out.shape == ref.shape
    assert float((out - ref).abs().max()) < 1e-4
    half = models.flow.inference(*inputs, solver=FastCFM(models.flow.decoder, torch.bfloat16, bucket=bucket))
    assert float((half - ref).abs().max()) < 0.05 * float(ref.abs().max())  # bf16 on CPU: close, not equal


def test_folded_hift_equals_weight_normed(models, data):
    mel = torch.from_numpy(data["out_flow_mel"])
    ref = models.hift.inference(mel, generator=torch.Generator().manual_seed(99))
    folded = without_weight_norm(models.hift)
    assert not any("parametrizations" in k for k in folded.state_dict())
    out = folded.inference(mel, generator=torch.Generator().manual_seed(99))
    assert float((out - ref).abs().max()) < 1e-5
    # the original keeps its parametrization and still runs
    assert any("parametrizations" in k for k in models.hift.state_dict())
    assert torch.equal(models.hift.inference(mel, generator=torch.Generator().manual_seed(99)), ref)


def test_source_draws_made_ahead_equal_drawn_inline(models, data):
    """hift.draw_source: the same start phases and noise as SineSource draws itself, the generator left alike."""
    mel = torch.from_numpy(data["out_flow_mel"])
    folded = without_weight_norm(models.hift)
    for seed, warm in ((99, 0), (5, 3)):  # warm: odd normal draws before, so a cached Box-Muller value is pending
        g_ref, g_ahead = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        for g in (g_ref, g_ahead):
            torch.empty(warm).normal_(generator=g)
        ref = folded.inference(mel, generator=g_ref)
        draws = draw_source(g_ahead, mel.shape[2], harmonics=models.hift.cfg.nb_harmonics)
        out = folded.inference(mel, generator=None, draws=draws)
        assert torch.equal(out, ref)
        assert torch.equal(g_ref.get_state(), g_ahead.get_state())
        assert torch.equal(torch.randn(7, generator=g_ref), torch.randn(7, generator=g_ahead))
    with pytest.raises(ValueError):  # drawn for another length: refused, not silently other noise
        folded.inference(mel, draws=draw_source(torch.Generator().manual_seed(1), mel.shape[2] + 1))


def _state(runtime: CosyVoice2Runtime) -> dict[str, np.ndarray]:
    t = np.arange(24000 * 2) / 24000
    wave = (0.3 * np.sin(2 * np.pi * 150 * t) + 0.01 * np.random.default_rng(1).standard_normal(t.size)).astype(np.float32)
    return runtime.speaker_state(wave, 24000, "hello there")


def test_runtime_fast_path_and_stream_on_cpu(folder):
    eager = CosyVoice2Runtime(folder, "cpu")
    # FP32 everywhere so that the CPU comparison is exact up to rounding (the GPU default is FP16 flow)
    # the host sampler: the same tokens as the eager path for a seed (the device sampler draws others)
    fast = CosyVoice2Runtime(folder, "cpu", fast=FastPath(lm_compile=False, flow_half=False, lm_device_sampling=False))
    state = _state(eager)
    ids = eager.text_ids("Hi there.")
    timings: dict[str, float] = {}
    a, n_a = eager.speak(ids, state, torch.Generator().manual_seed(10), min_tokens=30, max_tokens=30)
    b, n_b = fast.speak(ids, state, torch.Generator().manual_seed(10), timings=timings, min_tokens=30, max_tokens=30)
    assert n_a == n_b == 30 and a.shape == b.shape and a.size == n_a * 960, n_a
    assert float(np.abs(a - b).max()) < 1e-3
    assert set(timings) == {"lm_s", "flow_s", "hift_s"}
    pieces = list(fast.speak_stream(ids, state, torch.Generator().manual_seed(10), hop_tokens=10,
                                    min_tokens=30, max_tokens=30))
    assert len(pieces) == 3  # 30 tokens, 3 held back for the lookahead: 10 + 10 + the rest
    assert sum(p.size for p in pieces) == b.size  # every frame sent exactly once
    assert all(np.all(np.isfinite(p)) and p.size % 480 == 0 for p in pieces)
    # the default fast path draws on the device: its own tokens, the same for the same seed, streamed alike
    # (seed 13: a call that reaches 30 tokens; the reduced vocabulary's other stop tokens end many early)
    dev = CosyVoice2Runtime(folder, "cpu", fast=FastPath(lm_compile=False, flow_half=False))
    c, n_c = dev.speak(ids, state, torch.Generator().manual_seed(13), min_tokens=30, max_tokens=30)
    d, _ = dev.speak(ids, state, torch.Generator().manual_seed(13), min_tokens=30, max_tokens=30)
    assert n_c == 30 and np.array_equal(c, d)
    # HiFT's source draws made in a thread during the flow (hift_prefetch, the default) vs inline: same
    # waveform, and the generator left in the same state (the next chunk of a text draws from it)
    inline = CosyVoice2Runtime(folder, "cpu", fast=FastPath(lm_compile=False, flow_half=False, hift_prefetch=False))
    g_pre, g_inl = torch.Generator().manual_seed(13), torch.Generator().manual_seed(13)
    e, _ = inline.speak(ids, state, g_inl, min_tokens=30, max_tokens=30)
    assert np.array_equal(c, e)
    dev.speak(ids, state, g_pre, min_tokens=30, max_tokens=30)
    assert torch.equal(g_pre.get_state(), g_inl.get_state())
    assert dev._drawer is not None and inline._drawer is None
    pieces = list(dev.speak_stream(ids, state, torch.Generator().manual_seed(13), hop_tokens=10,
                                   min_tokens=30, max_tokens=30))
    assert len(pieces) == 3 and sum(p.size for p in pieces) == c.size


def test_random_release_manifest_matches_reference_manifest(data, tmp_path):
    """write_random_release builds its manifest from this pack's modules; the fixture's came from the
    reference code: the same keys, shapes and seeded values."""
    meta = json.loads(str(data["meta"][()]))
    folder = write_random_release(tmp_path / "rel", meta["yaml"], meta["qwen_config"], seed=meta["seeds"]["weights"])
    from digital_human.engines.cosyvoice.random_weights import seeded_state_dict

    for name, shapes in meta["manifest"].items():
        mine = torch.load(folder / f"{name}.pt", weights_only=True)
        ref = seeded_state_dict({k: tuple(s) for k, s in shapes.items()}, meta["seeds"]["weights"])
        assert set(mine) == set(ref)
        assert all(torch.equal(mine[k], ref[k]) for k in ref)
    load_models(folder)


def test_fused_step_equals_reference_step(models, data):
    """The fused decode step (q/k/v and gate/up as one mat-vec, GQA on the 2-head cache) computes what the
    reference step does, to float32 rounding; fusing leaves the LM's parameter values as they were (they
    become row blocks of the fused matrices) and the eager path's tokens unchanged."""
    args = _lm_inputs(data)
    before = {k: v.clone() for k, v in models.lm.state_dict().items()}
    reference = StaticDecoder(models.lm, capacity=128, step="reference")
    fused = StaticDecoder(models.lm, capacity=128)
    assert fused.step_kind == "fused" and fused.gemv == "linear"  # uncompiled: "reduce" falls back
    assert all(torch.equal(v, before[k]) for k, v in models.lm.state_dict().items())
    attn = models.lm.llm.model.model.layers[0].self_attn
    w_qkv = fused._fused[0][0]
    assert attn.v_proj.weight.untyped_storage().data_ptr() == w_qkv.untyped_storage().data_ptr()
    assert StaticDecoder(models.lm, capacity=8, gemv="reduce").gemv == "linear"  # "reduce" only when compiled
    tokens = data["out_lm_tokens"].tolist()
    with torch.inference_mode():
        emb = models.lm.prompt_embeddings(*args)
        a = torch.stack([reference.prefill(emb)] + [reference.step(t) for t in tokens])
        b = torch.stack([fused.prefill(emb)] + [fused.step(t) for t in tokens])
    assert float((a - b).abs().max()) < 1e-5
    assert list(models.lm.generate(*args, generator=torch.Generator().manual_seed(2024), decoder=fused)) == tokens
    assert list(models.lm.generate(*args, generator=torch.Generator().manual_seed(2024))) == tokens
    with pytest.raises(ValueError):
        StaticDecoder(models.lm, capacity=8, step="other")


def test_static_prefill_matches_transformers(models, data, monkeypatch):
    """The prompt through the decoder's own forward, padded to a PREFILL_BUCKET multiple (static_prefill: CUDA's
    default, DIGITAL_HUMAN_COSYVOICE_STATIC_PREFILL=1 elsewhere), gives transformers' step-0 log-probabilities and K/V, and the
    same tokens after it; padding rows never reach the real ones."""
    from digital_human.engines.cosyvoice import lm as lm_module

    args = _lm_inputs(data)
    with torch.inference_mode():
        embeds = models.lm.prompt_embeddings(*args)
        n = embeds.shape[1]
        monkeypatch.delenv(lm_module.PREFILL_ENV, raising=False)
        plain = StaticDecoder(models.lm, capacity=128)
        assert not plain.static_prefill  # on the CPU: off unless the variable says 1
        ref = plain.prefill(embeds)
        ref_keys = [k[:, :, :n].clone() for k in plain.keys]
        monkeypatch.setenv(lm_module.PREFILL_ENV, "1")
        monkeypatch.setattr(lm_module, "PREFILL_BUCKET", 8)  # the fixture's prompt is short: pad it
        static = StaticDecoder(models.lm, capacity=128)
        assert static.static_prefill and n % 8 != 0
        got = static.prefill(embeds)
        assert static.prepare_prefill(n) == 0  # graphs are CUDA's
    assert float((got - ref).abs().max()) < 1e-4
    assert max(float((a[:, :, :n] - b).abs().max()) for a, b in zip(static.keys, ref_keys)) < 1e-4
    assert int(static.pos) == int(plain.pos) == n and static.used == n
    tokens = list(models.lm.generate(*args, generator=torch.Generator().manual_seed(2024), decoder=static))
    assert tokens == data["out_lm_tokens"].tolist()


def test_compiled_decoder_built_outside_inference_mode(models, data, caplog):
    """A decoder made with autograd on (as a benchmark or a caller may) still compiles: traced with autograd on,
    the step's in-place K/V writes failed the compile, and the uncompiled step ran instead, announced
    (gpu_tts_pieces.py on an H200, 2026-12-04). Its log-probabilities are the uncompiled decoder's."""
    assert torch.is_grad_enabled()
    with caplog.at_level("WARNING", logger="digital_human"):
        compiled = StaticDecoder(models.lm, capacity=64, compile=True)
    assert not [r for r in caplog.records if "compile failed" in r.getMessage()]
    assert not inspect.ismethod(compiled._fn)  # torch.compile's wrapper, not the bound uncompiled step
    plain = StaticDecoder(models.lm, capacity=64)
    tokens = data["out_lm_tokens"].tolist()[:8]
    with torch.inference_mode():
        emb = models.lm.prompt_embeddings(*_lm_inputs(data))[:, :48]
        a = torch.stack([compiled.prefill(emb)] + [compiled.step(t) for t in tokens])
        b = torch.stack([plain.prefill(emb)] + [plain.step(t) for t in tokens])
    assert float((a - b).abs().max()) < 1e-4
