"""CosyVoice 2's tensor-op sampler (lm.ras_sample_tensor) on the CPU, and the decoder that draws on the device.

The fast path draws tokens inside the LM step's CUDA graph with tensor ops (no host sync per token). It is
not the reference's draw (other random numbers), so what is checked here is its distribution: on fixed
log-probabilities, the frequencies of many draws against the exact probabilities of the reference rule
(parity.ras_distribution), and against the reference sampler's own frequencies; then the decoder's
determinism and length rules with the sampler inside its step (run eagerly here; captured on a GPU).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

pytest.importorskip("transformers", reason="CosyVoice 2 needs the optional extra: pip install .[cosyvoice]")

from digital_human.engines.cosyvoice.lm import SamplingConfig, StaticDecoder, ras_sample, ras_sample_tensor  # noqa: E402
from digital_human.engines.cosyvoice.parity import ras_distribution, write_release_from_fixture  # noqa: E402
from digital_human.engines.cosyvoice.release import load_models  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "cosyvoice" / "reduced.npz"
CFG = SamplingConfig()


def _logp(vocab: int = 60, scale: float = 2.0, seed: int = 3) -> torch.Tensor:
    return (scale * torch.randn(vocab, generator=torch.Generator().manual_seed(seed))).log_softmax(dim=0)


def _tensor_draws(logp: torch.Tensor, window: list[int], n: int, seed: int) -> np.ndarray:
    uniforms = torch.rand(n, 2, generator=torch.Generator().manual_seed(seed))
    win = torch.tensor([([-1] * CFG.win_size + window)[-CFG.win_size:]] * n)
    return ras_sample_tensor(logp.expand(n, -1), win, uniforms, CFG).numpy()


def _chi2_p(counts: np.ndarray, expected_p: np.ndarray) -> float:
    """Chi-square goodness of fit; tokens expected fewer than 5 times are pooled into one bin."""
    expected = expected_p * counts.sum()
    big = expected >= 5
    f_obs = np.append(counts[big], counts[~big].sum())
    f_exp = np.append(expected[big], expected[~big].sum())
    if f_exp[-1] == 0:
        f_obs, f_exp = f_obs[:-1], f_exp[:-1]
    return float(stats.chisquare(f_obs, f_exp * f_obs.sum() / f_exp.sum()).pvalue)


@pytest.mark.parametrize("window", [[], [-1], "top"])
def test_tensor_sampler_distribution_matches_the_reference_rule(window):
    logp = _logp()
    order = logp.argsort(descending=True).tolist()
    # "top": the two most likely tokens were just drawn, so RAS replaces them by a full-distribution draw
    history = order[:2] if window == "top" else window
    exact = ras_distribution(logp, history, CFG)
    assert abs(exact.sum() - 1) < 1e-9
    n = 200_000
    counts = np.bincount(_tensor_draws(logp, history, n, seed=11), minlength=logp.numel())
    assert _chi2_p(counts, exact) > 1e-4
    assert np.abs(counts / n - exact).max() < 0.006
    # the reference sampler on the same inputs, fewer draws (it loops on the host)
    gen = torch.Generator().manual_seed(12)
    ref = np.bincount([ras_sample(logp.clone(), list(history), CFG, gen) for _ in range(6000)],
                      minlength=logp.numel())
    assert _chi2_p(ref, exact) > 1e-4
    assert np.abs(ref / ref.sum() - counts / n).max() < 0.03
    if window != "top":  # no repeat: never outside the nucleus
        assert set(np.flatnonzero(counts)) <= set(np.flatnonzero(exact))
    else:  # the fallback was exercised: draws reach past the top_k tokens
        assert np.count_nonzero(counts) > CFG.top_k and counts[order[CFG.top_k:]].sum() > 0


def test_tensor_sampler_edges_and_determinism():
    logp = _logp(scale=6.0)  # a peaked distribution: the nucleus is one or two tokens
    a = _tensor_draws(logp, [], 5000, seed=1)
    assert np.array_equal(a, _tensor_draws(logp, [], 5000, seed=1))  # same uniforms, same tokens
    assert not np.array_equal(a, _tensor_draws(logp, [], 5000, seed=2))
    # uniforms at the very ends of [0, 1) stay inside the kept set / the non-zero tokens
    top = int(logp.argmax())
    nucleus = set(np.flatnonzero(ras_distribution(logp, [], CFG)).tolist())
    assert top in nucleus and len(nucleus) < 4
    banned = logp.clone()
    banned[-1] = -float("inf")  # a token of probability 0 at the end of the vocabulary
    drawn = set()
    for u in (0.0, 1.0 - 2 ** -24):
        uniforms = torch.tensor([[u, u]])
        drawn.add(int(ras_sample_tensor(logp[None], torch.full((1, CFG.win_size), -1), uniforms, CFG)))
        # the top token repeated everywhere in the window: the fallback never returns it, nor a token of p = 0
        t = int(ras_sample_tensor(banned[None], torch.full((1, CFG.win_size), top), torch.tensor([[0.0, u]]), CFG))
        assert t != top and t != logp.numel() - 1
    assert drawn <= nucleus and top in drawn


@pytest.fixture(scope="module")
def lm():
    data = dict(np.load(FIXTURE, allow_pickle=False))
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        models = load_models(write_release_from_fixture(data, Path(tmp) / "CosyVoice2-0.5B"))
    torch.set_num_threads(2)
    return models.lm, tuple(torch.from_numpy(data[k]) for k in ("in_lm_text", "in_lm_prompt_text",
                                                                 "in_lm_prompt_speech"))


def test_decoder_with_device_sampling_is_deterministic(lm):
    model, args = lm
    draw = lambda decoder, seed, **k: list(model.generate(*args, generator=torch.Generator().manual_seed(seed),  # noqa: E731
                                                          decoder=decoder, **k))
    # 256 slots: the prompt plus the longest call (20 x the text's 8 tokens) fits, so no eager fallback
    dec = StaticDecoder(model, capacity=256, sampling=model.sampling, readback=4)
    a = draw(dec, 6, min_tokens=30, max_tokens=30)  # (the reduced vocabulary's other stop tokens end most
    assert len(a) == 30 and all(0 <= t < model.speech_token_size for t in a)  # seeds' calls early; not 6's)
    assert draw(dec, 6, min_tokens=30, max_tokens=30) == a  # the decoder is reused: state is reset per call
    assert draw(StaticDecoder(model, capacity=256, sampling=model.sampling, readback=16), 6,
                min_tokens=30, max_tokens=30) == a  # the read-back block size does not change the draws
    assert draw(dec, 10, min_tokens=30, max_tokens=30) != a
    assert draw(dec, 6, min_tokens=5, max_tokens=5) == a[:5]
    # without a forced length the call ends at a stop token (not yielded), wherever it falls in a block
    lengths = set()
    for seed in range(6):
        free = draw(dec, seed)
        assert all(t < model.speech_token_size for t in free) and len(free) < 20 * args[0].shape[1]
        assert free == draw(dec, seed)
        lengths.add(len(free))
    assert len(lengths) > 2  # stops at different steps, not only at block ends
    # teacher-forced log-probabilities of a sampling decoder are still the LM's (the draw is a side effect)
    with torch.inference_mode():
        ref = model.logits_trace(*args, a[:10])
        rows = [dec.prefill(model.prompt_embeddings(*args))] + [dec.step(t) for t in a[:10]]
    assert float((torch.stack(rows) - ref).abs().max()) < 1e-4


def test_device_sampling_follows_the_lm_distribution(lm):
    """Token 0 after the prompt, over many seeds: its frequencies against the exact RAS probabilities of
    the LM's first-step log-probabilities (the window is empty at step 0, so that is the nucleus draw)."""
    model, args = lm
    dec = StaticDecoder(model, capacity=256, sampling=model.sampling, readback=1)
    with torch.inference_mode():
        logp = model.logits_trace(*args, [])[0]
        logp[model.speech_token_size] = -float("inf")  # min length: no end of speech at step 0
        embeds, firsts = model.prompt_embeddings(*args), []
        for seed in range(600):  # begin(): prefill and draw token 0 (stop tokens included, unlike generate)
            dec.begin(embeds, torch.Generator().manual_seed(seed), min_len=1)
            firsts.append(int(dec.drawn[0]))
    exact = ras_distribution(logp, [], model.sampling)
    counts = np.bincount(firsts, minlength=logp.numel())
    assert set(np.flatnonzero(counts)) <= set(np.flatnonzero(exact))
    assert _chi2_p(counts, exact) > 1e-4


@pytest.mark.parametrize("device_sampling", [True, False])
def test_generations_that_take_turns_on_one_decoder_keep_their_own_state(lm, device_sampling):
    """Live sessions share one decoder and advance their generations a piece at a time, other sessions' pieces in
    between: each generation must get the tokens it gets alone (StaticDecoder.claim parks and restores the state;
    before it, a generation resumed from another's prompt, cache and sampler state)."""
    model, args = lm
    other = (args[0].flip(1),) + args[1:]  # another text
    dec = StaticDecoder(model, capacity=256, sampling=model.sampling if device_sampling else None, readback=4)

    def gen(a, seed):
        return model.generate(*a, generator=torch.Generator().manual_seed(seed), decoder=dec, min_tokens=24,
                              max_tokens=24)

    alone_a, alone_b = list(gen(args, 6)), list(gen(other, 4))  # seeds whose calls run the whole 24 tokens
    assert len(alone_a) == len(alone_b) == 24 and alone_a != alone_b
    # token by token, and in uneven pieces (5, then all of b, then the rest of a), with a third started and dropped
    a, b = gen(args, 6), gen(other, 4)
    got_a, got_b = [], []
    for _ in range(24):
        got_a.append(next(a))
        got_b.append(next(b))
    assert (got_a, got_b) == (alone_a, alone_b)
    a, b, c = gen(args, 6), gen(other, 4), gen(other, 12)
    got_a = [next(a) for _ in range(5)]
    next(c)
    got_b = list(b)
    del c  # dropped mid-way (an interrupted session): nothing of it stays parked
    got_a += list(a)
    assert (got_a, got_b) == (alone_a, alone_b)
    assert not dec._parked
