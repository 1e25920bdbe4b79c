"""CosyVoice 2's LM decoding several generations at once (engines/cosyvoice/lm_batch.py, live mode's --tts-batch LM
half). On the CPU with the fast path's device-sampled fused decoder (no compile, no CUDA graphs), random-weight
reduced release: every row draws the tokens the StaticDecoder draws alone for the same seed and prompt, with rows
joining and leaving at different times, more generations than rows, and a consumer that goes away."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers", reason="CosyVoice 2 needs the optional extra: pip install .[cosyvoice]")
import torch  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "cosyvoice" / "reduced.npz"
TEXTS = ("Hello there, how are you today?", "The parcel left the depot this morning.", "Good night.")


@pytest.fixture(scope="module")
def runtime_and_state(tmp_path_factory, data_dir):
    from digital_human.audio import load_reference
    from digital_human.engines.cosyvoice.engine import CosyVoice2Runtime, FastPath
    from digital_human.engines.cosyvoice.parity import write_release_from_fixture

    torch.set_num_threads(2)
    data = dict(np.load(FIXTURE, allow_pickle=False))
    release = write_release_from_fixture(data, tmp_path_factory.mktemp("cv2lm") / "CosyVoice2-0.5B")
    runtime = CosyVoice2Runtime(release, "cpu", fast=FastPath(lm_compile=False, flow_half=False))
    prepared = load_reference(data_dir / "audio" / "spk_en_male_01.wav", max_seconds=7)
    state = runtime.speaker_state(prepared.waveform, prepared.sample_rate, "Hello there, this is my voice.")
    return runtime, state


def _tokens(runtime, state, text: str, seed: int, count: int, **kw) -> list[int]:
    x = runtime._inputs(runtime.text_ids(text), state)
    generator = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        return list(runtime.models.lm.generate(x["text"], x["prompt_text"], x["lm_prompt"], generator=generator,
                                               min_tokens=count, max_tokens=count, **kw))


def test_rows_draw_the_tokens_each_draws_alone(runtime_and_state):
    from digital_human.engines.cosyvoice.lm_batch import LMBatchLoop

    runtime, state = runtime_and_state
    decoder = runtime._lm_decoder()
    assert decoder is not None and decoder.sampling is not None and decoder.step_kind == "fused"
    # seeds whose random-weight tokens run to the forced length (others draw one of the other stop tokens early)
    jobs = [(TEXTS[0], 8, 40, None), (TEXTS[1], 11, 23, 11), (TEXTS[2], 4, 31, 4), (TEXTS[0], 5, 17, 11)]
    alone = [_tokens(runtime, state, text, seed, n, decoder=decoder, first_readback=first)
             for text, seed, n, first in jobs]
    assert [len(t) for t in alone] == [n for _, _, n, _ in jobs]

    loop = LMBatchLoop(decoder, rows=2)  # 4 generations on 2 rows: the later ones wait for a free row
    together: dict[int, list[int]] = {}
    barrier = threading.Barrier(len(jobs))

    def run(k: int) -> None:
        text, seed, n, first = jobs[k]
        barrier.wait(30)
        together[k] = _tokens(runtime, state, text, seed, n, decoder=loop, first_readback=first)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    loop.close()
    assert sorted(together) == list(range(len(jobs)))
    for k in range(len(jobs)):
        assert together[k] == alone[k], k
    stats = loop.stats()
    assert stats["largest"] == 2 and stats["max_rows"] == 2
    assert stats["row_steps"] > stats["steps"]  # rows did share steps


def test_a_consumer_that_goes_away_frees_its_row(runtime_and_state):
    from digital_human.engines.cosyvoice.lm_batch import LMBatchLoop

    runtime, state = runtime_and_state
    decoder = runtime._lm_decoder()
    loop = LMBatchLoop(decoder, rows=1)
    x = runtime._inputs(runtime.text_ids(TEXTS[0]), state)
    with torch.inference_mode():
        stream = runtime.models.lm.generate(x["text"], x["prompt_text"], x["lm_prompt"],
                                            generator=torch.Generator().manual_seed(8), min_tokens=40,
                                            max_tokens=40, decoder=loop)
        first = [next(stream) for _ in range(5)]
        stream.close()  # an interrupted utterance: the one row must serve the next generation
    assert len(first) == 5
    again = _tokens(runtime, state, TEXTS[1], 11, 23, decoder=loop, first_readback=11)
    loop.close()
    assert len(again) == 23 and again == _tokens(runtime, state, TEXTS[1], 11, 23, decoder=decoder, first_readback=11)


def test_runtime_batches_the_lm_for_live_sessions(runtime_and_state):
    """set_lm_rows puts the loop behind the runtime's own token path (speak_stream, live_stream); 1 turns it off."""
    runtime, state = runtime_and_state
    try:
        assert runtime.set_lm_rows(4) == 4 and runtime.lm_batch is not None
        x = runtime._inputs(runtime.text_ids(TEXTS[2]), state)
        with torch.inference_mode():
            batched = list(runtime._tokens(x, torch.Generator().manual_seed(4), min_tokens=12, max_tokens=12))
        assert runtime.lm_batch.stats()["steps"] >= 11
    finally:
        assert runtime.set_lm_rows(1) == 1 and runtime.lm_batch is None
    with torch.inference_mode():
        assert len(batched) == 12
        assert batched == list(runtime._tokens(x, torch.Generator().manual_seed(4), min_tokens=12, max_tokens=12))


def test_a_failing_prompt_ends_its_generation_only(runtime_and_state):
    """A prompt the prefill cannot take (here: of the wrong width) raises in its own consumer, and the loop goes on
    serving the next generation (the same tokens as the single decoder's)."""
    from digital_human.engines.cosyvoice.lm_batch import LMBatchLoop

    runtime, state = runtime_and_state
    decoder = runtime._lm_decoder()
    loop = LMBatchLoop(decoder, rows=2)
    bad = torch.zeros(1, 5, 3)
    with pytest.raises((RuntimeError, ValueError)):
        list(loop.generate_tokens(bad, torch.Generator().manual_seed(0), 1, 5, [runtime.models.lm.speech_token_size]))
    good = _tokens(runtime, state, TEXTS[1], 11, 23, decoder=loop, first_readback=11)
    loop.close()
    assert good == _tokens(runtime, state, TEXTS[1], 11, 23, decoder=decoder, first_readback=11)


def test_a_dead_loop_fails_its_consumers_instead_of_leaving_them_waiting(runtime_and_state):
    """A device error that also breaks freeing the row (as a sticky CUDA error would) ends the loop's thread: every
    generation under way raises, and a later one is refused at once."""
    from digital_human.engines.cosyvoice.lm_batch import LMBatchLoop

    runtime, state = runtime_and_state
    loop = LMBatchLoop(runtime._lm_decoder(), rows=1)

    def broken(*_a, **_k):
        raise RuntimeError("device lost")

    loop.batch.step = broken
    loop.batch.release = broken
    with pytest.raises(RuntimeError, match="device lost"):
        _tokens(runtime, state, TEXTS[1], 11, 23, decoder=loop)
    loop._thread.join(10)
    assert not loop._thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        _tokens(runtime, state, TEXTS[1], 11, 23, decoder=loop)
