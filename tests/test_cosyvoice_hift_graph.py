"""CosyVoice 2's HiFT from CUDA graphs per mel length (hift_graph.HiftGraphs), on the CPU: the graph-safe iSTFT equals
torch.istft, the vocoder with draws made ahead and that iSTFT equals HiFT.inference, and with the capture replaced by
a stand-in (the CPU has no CUDA graphs) every length up to the longest is made ahead, pieces are served from them and
a longer mel runs eagerly; live pieces come out as without graphs (reduced random-weight release)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="CosyVoice 2 needs the optional extra: pip install .[cosyvoice]")

from digital_human.engines.cosyvoice import hift_graph as hg  # noqa: E402
from digital_human.engines.cosyvoice.hift import draw_source, without_weight_norm  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "cosyvoice" / "reduced.npz"


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    from digital_human.engines.cosyvoice.parity import write_release_from_fixture

    torch.set_num_threads(2)
    data = dict(np.load(FIXTURE, allow_pickle=False))
    return write_release_from_fixture(data, tmp_path_factory.mktemp("cv2hift") / "CosyVoice2-0.5B")


@pytest.fixture(scope="module")
def hift(release):
    from digital_human.engines.cosyvoice.release import load_models

    return without_weight_norm(load_models(release).hift)


def _fake_capture(run, device, pool=None, stream=None):  # a "graph": its output tensor, refilled by each replay
    out = run()
    return (lambda: out.copy_(run())), out


def test_overlap_add_istft_equals_torch_istft():
    g = torch.Generator().manual_seed(0)
    window = torch.hann_window(16, periodic=True)
    for frames in (2, 7, 60):
        spec = torch.complex(torch.randn(2, 9, frames, generator=g), torch.randn(2, 9, frames, generator=g))
        want = torch.istft(spec, 16, 4, 16, window=window)
        got = hg.overlap_add_istft(spec, 16, 4, 16, window=window)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="as long as n_fft"):
        hg.overlap_add_istft(spec, 16, 4, 8, window=torch.ones(8))


def test_pieces_from_graphs_equal_hift_inference(hift, monkeypatch):
    monkeypatch.setattr(hg, "_capture", _fake_capture)
    graphs = hg.HiftGraphs(hift, cuda_graph=True)
    assert graphs.prepare(range(1, 7)) == 6 and sorted(graphs.graphs) == [1, 2, 3, 4, 5, 6]
    assert graphs.covers(6) and not graphs.covers(9)
    g = torch.Generator().manual_seed(3)
    harmonics = hift.cfg.nb_harmonics
    for frames in (6, 2, 6, 9):  # 9: longer than prepared, eager
        mel = torch.randn(1, 80, 20, generator=g)[:, :, 3:3 + frames]  # a slice, as speak_stream's pieces
        want = hift.inference(mel, generator=torch.Generator().manual_seed(frames))
        got = graphs(mel, draw_source(torch.Generator().manual_seed(frames), frames, 1, harmonics))
        assert got.shape == want.shape == (1, frames * graphs.samples_per_frame)
        # the DFT-matrix STFT/iSTFT round differently from cuFFT/pocketfft, and random weights amplify it (the
        # magnitude is exp of a conv output): up to ~1e-4 on a waveform in [-0.99, 0.99], -80 dB
        torch.testing.assert_close(got, want, atol=5e-4, rtol=0)
    assert graphs.replays == 3 and graphs.eager == 1
    with pytest.raises(ValueError, match="one mel at a time"):
        graphs(torch.zeros(2, 80, 3), draw_source(None, 3, 2, harmonics))


def test_live_pieces_with_hift_graphs_equal_pieces_without(release, monkeypatch):
    """speak_stream's pieces through the runtime's HiftGraphs (as prepare_live makes them on CUDA) against the eager
    vocoder: the same audio to rounding, every piece served from a graph."""
    from digital_human.engines.cosyvoice.engine import CosyVoice2Runtime, FastPath, live_piece_frames

    monkeypatch.setattr(hg, "_capture", _fake_capture)
    runtime = CosyVoice2Runtime(release, "cpu", fast=FastPath(lm_compile=False, flow_half=False))
    t = np.arange(24000 * 2) / 24000
    wave = (0.3 * np.sin(2 * np.pi * 150 * t)).astype(np.float32)
    state = runtime.speaker_state(wave, 24000, "hello there")
    ids = runtime.text_ids("Hello there, how are you today?")
    tokens = [(7 * i) % runtime.models.flow.cfg.vocab_size for i in range(60)]
    monkeypatch.setattr(runtime, "_tokens", lambda x, generator, **limits: iter(tokens))  # no early stop token

    def pieces():
        return list(runtime.speak_stream(ids, state, torch.Generator().manual_seed(0),
                                         torch.Generator().manual_seed(1), hop_tokens=16, first_hop_tokens=8))

    eager = pieces()
    runtime._hift_graphs = hg.HiftGraphs(runtime.hift, cuda_graph=True)
    lengths = live_piece_frames(8, 16)  # hops of 8, 8, 16, 16, ...: every piece within the first 48 lengths
    assert runtime._hift_graphs.prepare(lengths) == len(lengths) == 48
    graphed = pieces()
    assert len(graphed) == len(eager) >= 4
    for a, b in zip(graphed, eager):
        np.testing.assert_allclose(a, b, atol=5e-4)  # as above
    assert runtime._hift_graphs.replays == len(eager) and runtime._hift_graphs.eager == 0


def test_a_failed_capture_is_announced_and_the_pieces_stay_eager(release, monkeypatch, caplog):
    from digital_human.engines.cosyvoice.engine import CosyVoice2Runtime, FastPath

    def broken(self, max_frames):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(hg.HiftGraphs, "prepare", broken)
    runtime = CosyVoice2Runtime(release, "cpu", fast=FastPath(lm_compile=False, flow_half=False))
    with caplog.at_level("WARNING", logger="digital_human"):
        out = runtime._prepare_hift_graphs()
    assert out == {"hift_graphs": 0, "hift_graphs_error": "RuntimeError: operation not permitted when stream is capturing"}
    assert runtime._hift_graphs is None and "vocoded eagerly" in caplog.text
    mel = torch.zeros(1, 80, 4)
    assert runtime._wave(mel, torch.Generator().manual_seed(0)).shape == (1, 4 * 480)  # the eager vocoder


def test_framed_stft_equals_torch_stft():
    g = torch.Generator().manual_seed(1)
    window = torch.hann_window(16, periodic=True)
    for length in (480, 4801, 24000):
        x = torch.randn(2, length, generator=g)
        spec = torch.view_as_real(torch.stft(x, 16, 4, 16, window=window, return_complex=True))
        want = torch.cat([spec[..., 0], spec[..., 1]], dim=1)
        got = hg.framed_stft(x, 16, 4, window)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_live_piece_lengths_cover_every_piece_a_chunk_can_have():
    """The live hops (8, 8, 16, 32, 50, 50, ... tokens; later chunks 50 from the start) vocode 16, 24, 40, 72, 108,
    108, ... and 100 frames (2 a token, 8 of left context after the first piece); a chunk's last piece anything up to
    2 * (50 + 3) frames and the context: graphs for every length up to 114, none left to the eager vocoder."""
    from digital_human.engines.cosyvoice.engine import live_piece_frames, next_hop

    lengths = live_piece_frames()
    assert lengths == list(range(1, 115))
    assert live_piece_frames(8, 16) == list(range(1, 49))  # short hops: the 48 short lengths hold them all
    # every piece speak_stream's schedule can make, up to the last (its own rule, re-run here on token counts)
    for total in range(1, 600):
        sent, pieces = 0, []
        for n in range(1, total + 1):
            if 2 * (n - 3) - sent >= 2 * next_hop(sent, 8, 50, True):
                pieces.append(2 * (n - 3) - max(0, sent - 8))
                sent = 2 * (n - 3)
        if 2 * total > sent:
            pieces.append(2 * total - max(0, sent - 8))
        assert set(pieces) <= set(lengths), (total, pieces)
