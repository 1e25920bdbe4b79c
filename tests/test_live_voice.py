"""Live mode's first TTS piece is short: Kokoro's first sentence is cut after a few words (at a clause mark or
before a phrase), CosyVoice 2's live stream vocodes its first piece after FIRST_HOP_TOKENS speech tokens
(random-weight reduced release: the plumbing and the lengths, not the voice)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from digital_human.text.chunking import (PAUSE_CLAUSE_S, PAUSE_WORD_S, TextChunk, split_first_piece,
                                         split_sentences)


def _texts(text):
    return [(c.text, c.pause_after_s) for c in split_first_piece(split_sentences(text))]


def test_short_first_sentences_stay_whole():
    for text in ("Hello.", "Yes, of course.", "Thank you for waiting.", "I can help you with that. Let me check."):
        assert _texts(text)[0][0] == split_sentences(text)[0].text


def test_long_first_sentence_cut_at_a_clause_then_a_phrase_then_words():
    # a clause mark with at least three words before it
    assert _texts("Of all the options, the yearly plan is the cheapest one for you.")[0] == (
        "Of all the options,", PAUSE_CLAUSE_S)
    # no clause mark: before a preposition or conjunction
    assert _texts("The package will arrive on Monday morning.") == [
        ("The package will arrive", PAUSE_WORD_S), ("on Monday morning.", 0.0)]
    # neither: after max_words - 2 words, and the rest keeps the sentence's pause
    got = _texts("Unfortunately the delivery scheduled yesterday evening could not be completed. Sorry.")
    assert got[0] == ("Unfortunately the delivery scheduled", PAUSE_WORD_S)
    assert got[1][0] == "yesterday evening could not be completed." and got[1][1] > 0 and got[2][0] == "Sorry."


def test_cut_keeps_enough_words_on_both_sides_and_every_word():
    for n in range(1, 30):
        text = " ".join(f"w{i}" for i in range(n)) + "."
        pieces = split_first_piece([TextChunk(text, 0.0)])
        assert " ".join(p.text for p in pieces) == text
        if len(pieces) == 2:
            assert all(len(p.text.split()) >= 3 for p in pieces) and len(pieces[0].text.split()) <= 6
        else:
            assert n <= 6


def test_chinese_first_sentence_cut_at_a_clause_mark():
    text = "您好，您订购的商品已经发货了，预计周一上午送达。"
    pieces = split_first_piece(split_sentences(text))
    assert [p.text for p in pieces] == ["您好，您订购的商品已经发货了，", "预计周一上午送达。"]


# --- CosyVoice 2's live stream -------------------------------------------------------------------------------
FIXTURE = Path(__file__).parent / "fixtures" / "cosyvoice" / "reduced.npz"


@pytest.fixture(scope="module")
def cosyvoice(tmp_path_factory, data_dir):
    pytest.importorskip("transformers", reason="CosyVoice 2 needs the optional extra: pip install .[cosyvoice]")
    from digital_human.audio import load_reference
    from digital_human.engines.cosyvoice.engine import CosyVoice2Engine
    from digital_human.engines.cosyvoice.parity import write_release_from_fixture
    from digital_human.voice.speaker import SpeakerProfile

    data = dict(np.load(FIXTURE, allow_pickle=False))
    engine = CosyVoice2Engine(write_release_from_fixture(data, tmp_path_factory.mktemp("cv2live") / "CosyVoice2-0.5B"))
    prepared = load_reference(data_dir / "audio" / "spk_en_male_01.wav", max_seconds=7)
    base = SpeakerProfile(embedding=np.ones(256, np.float32) / 16, segment_embeddings=np.zeros((0, 256), np.float32),
                          content_hash="x", speech_seconds=prepared.speech_seconds, name="male01")
    return engine, engine.prepare_speaker(prepared, "Hello there, this is my voice.", base)


def test_cosyvoice_live_stream_first_piece_after_first_hop(cosyvoice):
    import torch

    from digital_human.engines.cosyvoice.engine import FIRST_HOP_TOKENS, STREAM_HOP_TOKENS
    from digital_human.pipeline.live.voice import LiveVoice

    torch.set_num_threads(2)
    engine, speaker = cosyvoice
    rt, state, text = engine.runtime(), engine._state(speaker), "Hello there, how are you today?"
    limits = lambda _text: {"min_tokens": 40, "max_tokens": 40}  # noqa: E731 - random weights draw no sensible stop

    def tokens(seed):  # the LM's tokens for a seed (live_stream draws with the same generator)
        x = rt._inputs(rt.text_ids(text), state)
        return len(list(rt._tokens(x, torch.Generator().manual_seed(seed), **limits(text))))

    # this reduced vocabulary may draw an (unbanned) stop token early: a seed whose 40 tokens all come
    seed = next((s for s in range(20) if tokens(s) == 40), None)
    assert seed is not None, "no seed of 20 gave 40 tokens"
    sizes = [p.size for p in engine.live_stream(text, speaker, seed=seed, limits=limits)]
    spt = sum(sizes) // 40  # samples per speech token (the release's 960; this reduced vocoder's own)
    assert sum(sizes) == 40 * spt
    assert sizes[0] == FIRST_HOP_TOKENS * spt  # the first piece: 8 tokens' audio, made after 8 + lookahead tokens
    # then hops that double the speech sent, up to STREAM_HOP_TOKENS: 8, 16 (8 + 8 + 16 = 32 of 40), the rest
    assert sizes[1:3] == [FIRST_HOP_TOKENS * spt, 2 * FIRST_HOP_TOKENS * spt] and len(sizes) == 4
    assert 2 * FIRST_HOP_TOKENS < STREAM_HOP_TOKENS
    # the same audio length as the offline call of the same seed (the pieces join to about speak's waveform)
    offline, n = rt.speak(rt.text_ids(text), state, torch.Generator().manual_seed(seed), **limits(text))
    assert n == 40 and offline.size == sum(sizes)
    voice = LiveVoice(engine, speaker, token_limits=limits)
    voice.warm()
    assert voice.prepared == {"flow_graphs": 0, "lm_graph": 0}  # the CPU path has no CUDA graphs to capture ahead
    first = next(iter(voice.pieces(text)))  # seed 0: its own length, cut at the first hop when it gets there
    assert first.wave.size == (FIRST_HOP_TOKENS * spt if tokens(0) >= FIRST_HOP_TOKENS + 3 else tokens(0) * spt)


def test_cosyvoice_live_stream_later_hops_grow_to_the_live_hop(cosyvoice, monkeypatch):
    """After the first pieces the live hops double the speech sent up to LIVE_HOP_TOKENS (50: each piece re-runs the
    flow, so fewer, longer pieces leave a shared lane more room for other sessions): 8, 8, 16, 32, 50, 50, ...
    The LM is answered with 200 fixed tokens (this reduced random vocabulary draws stop tokens early)."""
    import torch

    from digital_human.engines.cosyvoice.engine import FIRST_HOP_TOKENS, LIVE_HOP_TOKENS

    torch.set_num_threads(2)
    engine, speaker = cosyvoice
    rt, total = engine.runtime(), 200
    vocab = rt.models.flow.cfg.vocab_size
    monkeypatch.setattr(rt, "_tokens", lambda x, generator, **limits: iter([(7 * i) % vocab for i in range(total)]))
    items = list(engine.live_stream("Hello there, how are you today?", speaker, pausable=True))
    sizes = [p.size for p in items if not getattr(p, "is_pause", False)]
    spt = sum(sizes) // total
    hops = [n // spt for n in sizes]
    first = FIRST_HOP_TOKENS
    assert hops[:6] == [first, first, 2 * first, 4 * first, LIVE_HOP_TOKENS, LIVE_HOP_TOKENS], hops
    assert sum(hops) == total and len(hops) == 7  # 8 + 8 + 16 + 32 + 50 + 50 = 164, then the last 36
    # every PAUSE_TOKENS tokens without a piece the stream pauses (LiveVoice may give the LM to a waiting first
    # piece there): inside the longer hops, none in the short first ones; none unless asked for
    kinds = ["P" if getattr(p, "is_pause", False) else "a" for p in items]
    assert "".join(kinds) == "aaaPaPPPaPPPaPPa", "".join(kinds)  # 32: one pause; 50: three; the last 36: two
    plain = list(engine.live_stream("Hello there, how are you today?", speaker))  # the default: pieces only
    assert [p.size for p in plain] == sizes


def test_flow_graphs_captured_ahead_so_none_is_captured_while_serving(cosyvoice, monkeypatch, caplog):
    """Live mode captures the flow's CUDA graphs at warm-up (FastCFM.prepare) for every length bucket a chunk may
    need: a capture while other sessions use the GPU failed on an H200 ("operation not permitted when stream is
    capturing"). The CPU has no CUDA graphs: the capture is replaced by a stand-in that records the same calls."""
    import torch

    from digital_human.engines.cosyvoice import flow as fl

    def capture(run, device, pool=None, stream=None):  # a "graph": its output tensor, refilled by each replay
        assert stream is None  # the CPU has no capture stream (on CUDA: the solver's own, cuda_streams)
        out = run()
        return (lambda: out.copy_(run())), out

    monkeypatch.setattr(fl, "_capture", capture)
    engine, _ = cosyvoice
    flow = engine.runtime().models.flow
    solver = fl.FastCFM(flow.decoder, torch.float32, bucket=16, cuda_graph=True)
    steps, dim = flow.cfg.timesteps, flow.spk_embed_affine_layer.out_features
    assert solver.prepare(40, steps, dim) == 3 and solver.captures == 3  # buckets 16, 32, 48 all kept
    g = torch.Generator().manual_seed(0)
    for frames in (10, 33, 48):
        mu, cond = torch.randn(1, fl.MEL_BINS, frames, generator=g), torch.randn(1, fl.MEL_BINS, frames, generator=g)
        mask, spks = torch.ones(1, 1, frames), torch.randn(1, dim, generator=g)
        got = solver(mu, mask, spks, cond, steps=steps)
        padded = -(-frames // 16) * 16
        pad = lambda y: torch.nn.functional.pad(y, (0, padded - frames))  # noqa: E731
        want = fl.solve_ode(solver.estimator, solver.noise[:, :, :padded].to(mu), pad(mu), pad(mask), spks, pad(cond),
                            steps, solver.cfg_rate)[:, :, :frames]
        torch.testing.assert_close(got, want)
    assert solver.captures == 3  # served from the graphs made ahead
    with caplog.at_level("WARNING", logger="digital_human.cosyvoice"):
        solver(torch.zeros(1, fl.MEL_BINS, 60), torch.ones(1, 1, 60), torch.zeros(1, dim), torch.zeros(1, fl.MEL_BINS, 60),
               steps=steps)
    assert solver.captures == 4 and "longer than the 48 frames prepared" in caplog.text


def test_cosyvoice_live_stream_puts_a_pause_before_the_next_chunk_not_alone(cosyvoice):
    """A pause between text chunks leads the next chunk's first piece: a piece of pure silence is no speech for a
    talking head (MuseTalk refuses it: utterances failed on an H200 run before this)."""
    engine, speaker = cosyvoice
    limits = lambda _text: {"min_tokens": 12, "max_tokens": 12}  # noqa: E731
    pieces = list(engine.live_stream("Good morning to you. How are you doing today?", speaker, limits=limits))
    pause = int(round(0.35 * 24000))  # text/chunking's sentence pause at 24 kHz
    assert all(float(np.abs(p).max()) >= 1e-4 for p in pieces)  # never silence alone
    assert sum(p.size > pause and not np.any(p[:pause]) for p in pieces[1:]) == 1


def test_the_voice_lock_serves_first_pieces_before_later_ones():
    """Sessions share one TTS engine: while one holds it, a new utterance's first piece (priority 0) that came
    later is served before another session's later piece (priority 1) that was already waiting; within a
    priority, in arrival order; one holder at a time."""
    import threading
    import time

    from digital_human.pipeline.live.voice import FirstPiecesFirst

    lock, order, inside = FirstPiecesFirst(), [], []
    release = threading.Event()

    def holder():
        with lock.hold(1):
            release.wait(5)

    def waiter(name, priority):
        with lock.hold(priority):
            inside.append(name)
            assert len(inside) == 1
            order.append(name)
            time.sleep(0.01)
            inside.remove(name)

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    time.sleep(0.05)
    for name, priority in (("later-a", 1), ("later-b", 1), ("first-c", 0), ("first-d", 0)):
        t = threading.Thread(target=waiter, args=(name, priority))
        t.start()
        threads.append(t)
        time.sleep(0.05)  # in this arrival order
    release.set()
    for t in threads:
        t.join(5)
    assert order == ["first-c", "first-d", "later-a", "later-b"]


def test_kokoro_pieces_lose_their_edge_silence_but_no_phone():
    """Kokoro pads every synthesis with ~0.3 s of silence at each end: a live piece keeps LEAD_KEEP_S before its
    first sound and TAIL_KEEP_S after its last, and its phone times move with the cut."""
    from digital_human.pipeline.live.voice import LEAD_KEEP_S, TAIL_KEEP_S, trim_edges

    rate = 24000
    wave = np.zeros(rate, np.float32)
    wave[int(0.3 * rate):int(0.7 * rate)] = 0.5 * np.sin(np.arange(int(0.4 * rate)) * 0.3)
    phones = [("h", 0.28, 0.4), ("i", 0.4, 0.72)]  # the last phone runs a little past the sound
    out, moved = trim_edges(wave, rate, phones)
    start = 0.28 - LEAD_KEEP_S  # the first phone starts before the first sound: the phones are never cut
    assert abs(len(out) / rate - (0.72 + TAIL_KEEP_S - start)) < 2 / rate
    assert moved == [("h", round(0.28 - start, 6), round(0.4 - start, 6)), ("i", round(0.4 - start, 6), round(0.72 - start, 6))]
    np.testing.assert_array_equal(out, wave[int(round(start * rate)):int(round(start * rate)) + len(out)])
    silent = np.zeros(100, np.float32)
    assert trim_edges(silent, rate)[0] is silent  # nothing to find: unchanged


def test_prepare_live_compiles_the_lm_step(tmp_path, caplog):
    """prepare_live (live mode's warm-up, called outside any inference_mode) must make the LM's compiled step: with
    autograd on, the compile failed ("modified by an inplace operation": the KV cache's index_copy_) and the step
    ran uncompiled, seen on an H200 on 2026-12-03. The CPU's inductor shows the same failure."""
    pytest.importorskip("transformers", reason="CosyVoice 2 needs the optional extra: pip install .[cosyvoice]")
    import inspect

    import torch

    from digital_human.engines.cosyvoice.engine import CosyVoice2Runtime, FastPath
    from digital_human.engines.cosyvoice.parity import write_release_from_fixture

    data = dict(np.load(FIXTURE, allow_pickle=False))
    folder = write_release_from_fixture(data, tmp_path / "CosyVoice2-0.5B")
    fast = FastPath(lm_graph=True, lm_compile=True, lm_device_sampling=False, flow_half=False, flow_graph=False)
    rt = CosyVoice2Runtime(folder, "cpu", fast=fast)
    state = {"prompt_token": np.zeros(4, np.int64)}
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    with caplog.at_level("WARNING"):
        try:
            out = rt.prepare_live(state, 8)
        except Exception as exc:  # no C++ compiler for inductor's CPU code on this machine
            pytest.skip(f"torch.compile unavailable here: {exc!r}"[:200])
    assert "torch.compile failed" not in caplog.text, caplog.text[-500:]
    assert rt._decoder is not None and not inspect.ismethod(rt._decoder._fn)  # the compiled function, not the method
    assert out["flow_graphs"] == 0 and out["lm_graph"] == 0  # no CUDA graphs on the CPU
