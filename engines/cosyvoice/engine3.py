"""CosyVoice 3 (Fun-CosyVoice3-0.5B) as a TTS engine (voice/engines.py): zero-shot cloning from the user's folder.

What is shared with CosyVoice 2 (engine.py): the runtime's stages, the Qwen2 body and sampler, the front-end
(campplus.onnx, Whisper log-mel into the speech tokenizer, Kaldi fbank), chunking by sentence, the fast
path (FastPath: static KV cache + CUDA-graphed LM step with sampling on the GPU, FP16 CUDA-graphed flow,
folded-weight-norm vocoder) and its switch (`fast=` or DIGITAL_HUMAN_COSYVOICE_FAST=1). What differs: the
networks (release3.py), speech_tokenizer_v3.onnx, prompt mels up to 12 kHz, the tokenizer's extra tokens
(tokens3.py) and the prompt format: the LM's text starts with "You are a helpful assistant.<|endofprompt|>"
followed by the reference transcript (zero-shot), nothing else (cross-lingual: no transcript, no prompt
speech tokens in the LM), or an instruction ("You are a helpful assistant. <instruction><|endofprompt|>",
the release's instruct mode: dialects, speed, emotion; the LM gets no prompt speech tokens then either).
The vocoder is deterministic (fixed noise, causal_hift.py): the seed drives only the LM's sampling.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from ..loader import get as get_runner
from ..spec import ModelSpec
from .causal_hift import without_weight_norm_causal
from .engine import CHUNK_TOKENS, FAST_ENV, MAX_PROMPT_SECONDS, STREAM_HOP_TOKENS, CosyVoice2Runtime, FastPath, _resample
from .features import kaldi_fbank, prompt_mel, whisper_log_mel
from .release3 import LICENSE, RELEASE_NAME, check_release, load_models
from .tokens3 import ENDOFPROMPT, SPECIAL_TOKENS_V3, SYSTEM_PROMPT

log = logging.getLogger("digital_human")
NAME = "cosyvoice3"
SAMPLE_RATE = 24000
HIFT_LOOK_FRAMES = 4  # mel frames the causal vocoder's input convolution looks ahead


def default_folder() -> Path:
    from ...paths import models_root

    return models_root() / "cosyvoice" / RELEASE_NAME


def instruct_prompt(instruction: str) -> str:
    """The release's instruct prompt for a style / dialect instruction ("请用广东话表达。", "Speak slowly.")."""
    instruction = instruction.strip()
    if ENDOFPROMPT in instruction:
        return instruction if instruction.startswith(SYSTEM_PROMPT) else f"{SYSTEM_PROMPT} {instruction}"
    return f"{SYSTEM_PROMPT} {instruction}{ENDOFPROMPT}"


class CosyVoice3Runtime(CosyVoice2Runtime):
    """The loaded CosyVoice 3 release: networks, tokenizer and the two ONNX front-end models."""

    hift_graphs_supported = False  # hift_graph.HiftGraphs replays CosyVoice 2's HiFT (drawn sine source), not this one

    def __init__(self, folder: str | Path, device: str = "cpu", fast: FastPath | None = None,
                 offload: bool = False) -> None:
        from transformers import AutoTokenizer

        self.folder = check_release(folder)
        self.device = torch.device(device)
        self.fast = fast
        self.offload = offload and self.device.type != "cpu"
        self.models = load_models(self.folder)
        if fast is not None and fast.lm_bf16:
            self.models.lm.to(torch.bfloat16)
        self.hift = without_weight_norm_causal(self.models.hift) if fast is not None else self.models.hift
        self._decoder = None
        self._solver = None
        self._drawer = None
        self._flow_batcher = None  # --tts-batch (CosyVoice2Runtime.set_flow_rows)
        self._lm_batch = None      # --tts-batch's LM half (CosyVoice2Runtime.set_lm_rows)
        self._hift_graphs = None   # stays None: the causal HiFT has its own fixed source (hift_graphs_supported)
        if not self.offload:
            for module in (self.models.lm, self.models.flow, self.hift):
                module.to(self.device)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.folder / "CosyVoice-BlankEN"))
        self.tokenizer.add_special_tokens(SPECIAL_TOKENS_V3)
        self.campplus = get_runner(ModelSpec(name=f"{NAME}-campplus", onnx_path=self.folder / "campplus.onnx"),
                                   backend="onnxruntime", precision="fp32", stage="voice")
        self.speech_tokenizer = get_runner(
            ModelSpec(name=f"{NAME}-speech-tokenizer", onnx_path=self.folder / "speech_tokenizer_v3.onnx"),
            backend="onnxruntime", precision="fp32", stage="voice")

    def speaker_state(self, wave: np.ndarray, sample_rate: int, transcript: str = "") -> dict[str, np.ndarray]:
        wave = np.asarray(wave, np.float32).reshape(-1)
        limit = int(MAX_PROMPT_SECONDS * sample_rate)
        if wave.size > limit:
            wave = wave[:limit]
        w24 = torch.from_numpy(np.array(_resample(wave, sample_rate, 24000)))[None]  # a writable copy
        w16 = torch.from_numpy(np.array(_resample(wave, sample_rate, 16000)))[None]
        feat = prompt_mel(w24, fmax=None)[0]                          # [frames, 80], bands up to 12 kHz
        mel128 = whisper_log_mel(w16)
        names = self.speech_tokenizer.input_names()
        tokens = next(iter(self.speech_tokenizer.run({names[0]: mel128.numpy(),
                                                      names[1]: np.array([mel128.shape[2]], np.int32)}).values()))
        tokens = np.asarray(tokens).reshape(-1).astype(np.int32)
        n = min(feat.shape[0] // 2, tokens.size)
        if n < 1:
            raise ValueError("the reference audio is too short for CosyVoice 3; give at least 1 s of speech")
        fbank = kaldi_fbank(w16)
        embedding = next(iter(self.campplus.run({self.campplus.input_names()[0]: fbank[None].numpy()}).values()))
        zero_shot = bool(transcript.strip())
        prompt = f"{SYSTEM_PROMPT}{ENDOFPROMPT}{transcript.strip()}"
        return {"prompt_feat": feat[: 2 * n].numpy().astype(np.float32), "prompt_token": tokens[:n],
                "embedding": np.asarray(embedding, np.float32).reshape(-1),
                "prompt_text_ids": np.array(self.text_ids(prompt), np.int32),
                "zero_shot": np.array([1 if zero_shot else 0], np.int8)}

    def with_instruction(self, state: dict[str, np.ndarray], instruction: str) -> dict[str, np.ndarray]:
        """The state for instruct mode: the instruction replaces the transcript; no prompt speech in the LM."""
        return {**state, "prompt_text_ids": np.array(self.text_ids(instruct_prompt(instruction)), np.int32),
                "zero_shot": np.array([0], np.int8)}

    def _inputs(self, text_ids: list[int], state: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        dev = self.device
        t = lambda a, dtype: torch.as_tensor(np.asarray(a), dtype=dtype, device=dev)[None]  # noqa: E731
        prompt_token = t(state["prompt_token"], torch.int32)
        zero_shot = bool(np.asarray(state["zero_shot"]).reshape(-1)[0])
        return {"text": t(text_ids, torch.int32), "prompt_text": t(state["prompt_text_ids"], torch.int32),
                "prompt_token": prompt_token, "lm_prompt": prompt_token if zero_shot else prompt_token[:, :0],
                "prompt_feat": t(state["prompt_feat"], torch.float32), "embedding": t(state["embedding"], torch.float32)}

    def _wave(self, mel: torch.Tensor, generator: torch.Generator | None = None, draws: Any = None) -> torch.Tensor:
        return self.hift.inference(mel, half=self.fast is not None and self.fast.hift_half)

    def _prefetch_draws(self, generator: torch.Generator, frames: int) -> None:
        return None  # the causal vocoder draws nothing: its noise is fixed

    @torch.inference_mode()
    def speak_stream(self, text_ids: list[int], state: dict[str, np.ndarray], generator: torch.Generator,
                     hift_generator: torch.Generator | None = None, hop_tokens: int = STREAM_HOP_TOKENS,
                     **limits: Any) -> Iterator[np.ndarray]:
        """One chunk as audio pieces while the LM is still generating (first audio after ~hop_tokens steps).

        Each piece re-runs the offline flow on every token so far and vocodes the mel from the start (as the
        release's streaming does: its vocoder noise and sine phase run from the utterance start), up to the
        frames that later tokens still change plus the vocoder's 4-frame look-ahead; the samples not yet
        sent are emitted. The pieces join to about, not exactly, `speak`'s waveform (the flow of a prefix
        differs a little from the flow of the whole). Not with offload."""
        if self.offload:
            raise ValueError("speak_stream keeps every network on the device; create the runtime without offload")
        x = self._inputs(text_ids, state)
        lookahead = self.models.flow.cfg.pre_lookahead_len
        ratio = self.models.flow.cfg.token_mel_ratio
        tokens: list[int] = []
        sent = 0  # mel frames already emitted

        def piece(final: bool) -> np.ndarray:
            nonlocal sent
            mel = self._mel(tokens, x)
            end = mel.shape[2] if final else ratio * (len(tokens) - lookahead)
            wave = self._wave(mel[:, :, :min(mel.shape[2], end + HIFT_LOOK_FRAMES)])[0]
            samples = wave.shape[0] // min(mel.shape[2], end + HIFT_LOOK_FRAMES)
            out = wave[sent * samples:end * samples].float().cpu().numpy()
            sent = end
            return out

        for token in self._tokens(x, generator, **limits):
            tokens.append(token)
            if ratio * (len(tokens) - lookahead) - sent >= ratio * hop_tokens:
                yield piece(False)
        if tokens and ratio * len(tokens) > sent:
            yield piece(True)


class CosyVoice3Engine:
    """TTS engine entry (registry line in voice/engines.py)."""

    name = NAME
    sample_rate = SAMPLE_RATE
    description = f"CosyVoice 3 zero-shot voice cloning ({LICENSE}); needs the user's {RELEASE_NAME} folder."

    def __init__(self, folder: str | Path | None = None, device: str = "cpu", fast: bool | None = None) -> None:
        """fast: the FastPath speed-ups (CUDA only); None = on when DIGITAL_HUMAN_COSYVOICE_FAST=1 (as CosyVoice 2)."""
        self.folder = Path(folder) if folder else default_folder()
        self.device = device
        if fast is None:
            fast = os.environ.get(FAST_ENV, "") == "1"
        self.fast = bool(fast) and torch.device(device).type == "cuda"
        self._runtime: CosyVoice3Runtime | None = None

    def check_files(self) -> None:
        """Raise one error naming every missing release file (a CosyVoice 2 folder: say so; the missing extra)."""
        check_release(self.folder)
        from .lm import require_transformers

        require_transformers()

    def runtime(self) -> CosyVoice3Runtime:
        if self._runtime is None:
            self._runtime = CosyVoice3Runtime(self.folder, self.device, FastPath() if self.fast else None)
        return self._runtime

    def prepare_speaker(self, prepared: Any, transcript: str = "", speaker: Any = None, **_: Any) -> Any:
        from ...voice.engines import with_engine_state

        if speaker is None:
            raise ValueError("prepare_speaker needs the speaker profile of the clip (ExtractSpeakerEmbedding makes it)")
        state = self.runtime().speaker_state(prepared.waveform, prepared.sample_rate,
                                             transcript or speaker.reference_text)
        return with_engine_state(speaker, NAME, state)

    def _state(self, speaker: Any) -> dict[str, np.ndarray]:
        from ...voice.engines import engine_state

        state = engine_state(speaker, NAME)
        if not {"prompt_feat", "prompt_token", "embedding", "prompt_text_ids", "zero_shot"} <= set(state):
            raise ValueError("this speaker was not prepared for CosyVoice 3; run ExtractSpeakerEmbedding with "
                             "engine cosyvoice3 (or `digital-human speak --engine cosyvoice3 --voice clip.wav`)")
        return state

    def stream(self, text: str, speaker: Any, language: str = "auto", speed: float = 1.0, seed: int = 0,
               instruction: str = "", **_: Any) -> Iterator[np.ndarray]:
        """Sentence by sentence: each yielded piece is one chunk's audio followed by its pause.
        instruction: the release's instruct mode (speaking style / dialect), e.g. "请用广东话表达。"."""
        from ...text.frontend import text_chunks

        state = self._state(speaker)
        runtime = self.runtime()
        if instruction.strip():
            state = runtime.with_instruction(state, instruction)
        _, chunks = text_chunks(text, language, lambda s: len(runtime.text_ids(s)), CHUNK_TOKENS)
        generator = torch.Generator().manual_seed(int(seed))
        for chunk in chunks:
            wave, _ = runtime.speak(runtime.text_ids(chunk.text), state, generator, speed)
            yield np.concatenate([wave, np.zeros(int(round(chunk.pause_after_s * SAMPLE_RATE)), np.float32)])

    def synthesize(self, text: str, speaker: Any, language: str = "auto", speed: float = 1.0, seed: int = 0,
                   progress: Any = None, instruction: str = "", **_: Any) -> Any:
        from ...voice.tts import SpeechResult

        start = time.perf_counter()
        pieces = list(self.stream(text, speaker, language, speed, seed, instruction=instruction))
        waveform = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        if not np.any(waveform):
            raise ValueError("CosyVoice 3 produced no speech for this text")
        mode = "instruct" if instruction.strip() else "zero-shot"
        return SpeechResult(waveform=waveform.astype(np.float32), sample_rate=SAMPLE_RATE, backend=f"torch ({self.device})",
                            precision="fp32+fp16 (fast path)" if self.fast else "fp32",
                            voice=f"{speaker.name or 'speaker'} (CosyVoice 3 {mode})",
                            chunks=len(pieces), timings={"synthesis": time.perf_counter() - start})
