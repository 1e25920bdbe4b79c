"""MuseTalk's CUDA-graph path (MuseTalkPipeline graphs=True): the step and the encoder at a fixed batch, replayed
from captured graphs through static input tensors, a capture failure logged and the pipeline going on without
the graph. The CPU has no CUDA graphs: these tests replace the capture with one that records a "graph" whose
replay runs the function on the static inputs and writes its static outputs - the copy-in / replay / clone-out
and padding logic is the pipeline's own, the results must equal eager."""
from __future__ import annotations

import logging

import numpy as np
import pytest

pytest.importorskip("diffusers", reason="MuseTalk is an optional extra: pip install .[musetalk]")
pytest.importorskip("transformers", reason="MuseTalk is an optional extra: pip install .[musetalk]")
torch = pytest.importorskip("torch")

from digital_human.engines.musetalk import pipeline as pipeline_mod
from digital_human.engines.musetalk.networks import load_networks
from digital_human.engines.musetalk.random_release import write_release


@pytest.fixture(scope="module")
def networks(tmp_path_factory):
    root = tmp_path_factory.mktemp("release")
    write_release(root, "reduced", seed=5)
    return load_networks(models_root=root)


class FakeGraph:
    """What _capture_cuda_graph returns, on the CPU: replay() recomputes fn on the static inputs and writes the
    static outputs in place (a CUDA graph's replay does the same to its captured buffers)."""

    def __init__(self, fn, inputs):
        self.fn, self.inputs, self.replays = fn, inputs, 0
        out = fn(*inputs)
        self.outputs = out if isinstance(out, tuple) else (out,)

    def replay(self):
        self.replays += 1
        out = self.fn(*self.inputs)
        for dst, src in zip(self.outputs, out if isinstance(out, tuple) else (out,)):
            dst.copy_(src)


def fake_capture(captured):
    def capture(fn, inputs, stream):
        graph = FakeGraph(fn, inputs)
        captured.append(graph)
        return graph, graph.outputs
    return capture


def test_resolve_graphs(monkeypatch):
    monkeypatch.delenv(pipeline_mod.GRAPHS_ENV, raising=False)
    assert pipeline_mod.resolve_graphs(None, compile=True) is True
    assert pipeline_mod.resolve_graphs(None, compile=False) is False
    assert pipeline_mod.resolve_graphs(False, compile=True) is False
    monkeypatch.setenv(pipeline_mod.GRAPHS_ENV, "0")
    assert pipeline_mod.resolve_graphs(None, compile=True) is False
    monkeypatch.setenv(pipeline_mod.GRAPHS_ENV, "1")
    assert pipeline_mod.resolve_graphs(None, compile=False) is True
    assert pipeline_mod.resolve_graphs(False, compile=False) is False


def test_cpu_asked_for_graphs_runs_without_them(networks, caplog):
    with caplog.at_level(logging.WARNING, logger="digital_human.musetalk"):
        pipe = pipeline_mod.MuseTalkPipeline(networks, seed=0, graphs=True)
    assert pipe.graphs is False and "CUDA only" in pipe.graphs_note
    assert any("CUDA graphs are for CUDA only" in r.getMessage() for r in caplog.records)
    with pipe.stream_scope():  # no stream of its own: a no-op
        pass


def _inputs(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, 32, 32, generator=g), torch.randn(n, 50, 384, generator=g)


def test_graph_replays_equal_eager_with_padding(networks, monkeypatch):
    eager = pipeline_mod.MuseTalkPipeline(networks, seed=0)
    lat, win = _inputs(5)
    # eager in the same batches (the CPU's convolutions round differently per batch size): 3, then the last 2
    # padded with a copy of the last frame to 3
    expected = np.concatenate([eager.generate(lat[:3], win[:3]),
                               eager.generate(lat[[3, 4, 4]], win[[3, 4, 4]])[:2]])
    crops = np.random.default_rng(1).integers(0, 256, (5, 256, 256, 3), dtype=np.uint8)
    expected_latents = eager.encode_references(crops)

    captured = []
    monkeypatch.setattr(pipeline_mod, "_capture", fake_capture(captured))
    monkeypatch.setattr(pipeline_mod, "ENCODE_BATCH", 2)
    pipe = pipeline_mod.MuseTalkPipeline(networks, seed=0)
    pipe.graphs = True  # as on CUDA (the CPU refuses graphs=True; the capture here is the fake one)
    first = pipe.generate(lat[:3], win[:3])  # fixes the step's batch at 3, captured after this call
    assert pipe._compiled_batch == 3 and sorted(pipe._graph) == ["step"]
    rest = pipe.generate(lat[3:], win[3:])  # 2 frames padded to 3: a replay
    assert np.array_equal(np.concatenate([first, rest]), expected)
    assert np.array_equal(pipe.generate(lat, win), expected)  # 5 = 3 + (2 padded): two more replays
    step = captured[0]
    assert step.replays == 3 and all(x.shape[0] == 3 for x in step.inputs)

    got = pipe.encode_references(crops)  # 5 crops -> batches of 2: first call captured, the rest replayed
    assert torch.allclose(got, expected_latents, atol=1e-5, rtol=0)
    assert sorted(pipe._graph) == ["encoder", "step"] and pipe.graphs_note is None
    assert set(pipe.graph_capture_seconds) == {"encoder", "step"}
    with pytest.raises(ValueError):
        pipe._graph["step"](lat[:2], win[:2])  # a graph replays only its captured shapes


def test_capture_failure_is_logged_and_not_retried(networks, monkeypatch, caplog):
    eager = pipeline_mod.MuseTalkPipeline(networks, seed=0)
    lat, win = _inputs(4, seed=3)
    expected = np.concatenate([eager.generate(lat[:2], win[:2]), eager.generate(lat[2:], win[2:])])
    calls = []

    def failing(fn, inputs, stream):
        calls.append(len(inputs[0]))
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(pipeline_mod, "_capture", failing)
    pipe = pipeline_mod.MuseTalkPipeline(networks, seed=0)
    pipe.graphs = True
    with caplog.at_level(logging.WARNING, logger="digital_human.musetalk"):
        got = np.concatenate([pipe.generate(lat[:2], win[:2]), pipe.generate(lat[2:], win[2:])])
    assert np.array_equal(got, expected)
    assert calls == [2]  # tried once, then the step runs without a graph
    assert "CUDA graph of the step failed" in pipe.graphs_note and not pipe._graph
    assert any("running it without a graph" in r.getMessage() for r in caplog.records)
