"""CosyVoice 2 as a TTS engine (voice/engines.py): zero-shot voice cloning from the user's release folder.

prepare_speaker: prompt mel (24 kHz), speech tokens (speech_tokenizer_v2.onnx on Whisper log-mel at
16 kHz) and x-vector (campplus.onnx on Kaldi fbank), trimmed so mel frames = 2 x tokens, plus the
transcript's Qwen token ids; stored on DH_SPEAKER under "cosyvoice2/...".
synthesize: per sentence chunk, LM tokens -> flow mel -> HiFT waveform. With a transcript the LM is
prompted with the reference text and speech tokens (zero-shot mode); without one it is not
(cross-lingual mode); the flow always gets the prompt mel, tokens and x-vector.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from ..loader import get as get_runner
from ..spec import ModelSpec
from .features import kaldi_fbank, prompt_mel, whisper_log_mel
from .release import LICENSE, RELEASE_NAME, check_release, load_models

log = logging.getLogger("digital_human")
NAME = "cosyvoice2"
SAMPLE_RATE = 24000
MAX_PROMPT_SECONDS = 20.0  # the speech tokenizer takes at most 30 s; long prompts also slow the LM
CHUNK_TOKENS = 80          # text tokens per LM call (the reference splits paragraphs the same way)
SPECIAL_TOKENS = {
    "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
    "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|endofprompt|>", "[breath]", "<strong>",
                                  "</strong>", "[noise]", "[laughter]", "[cough]", "[clucking]", "[accent]",
                                  "[quick_breath]", "<laughter>", "</laughter>", "[hissing]", "[sigh]",
                                  "[vocalized-noise]", "[lipsmack]", "[mn]"]}


def default_folder() -> Path:
    from ...paths import model_dir

    return model_dir("cosyvoice") / RELEASE_NAME


def _resample(wave: np.ndarray, sr: int, target: int) -> np.ndarray:
    from ...audio.prepare import _resample as resample

    return resample(np.asarray(wave, np.float32), sr, target)


class CosyVoice2Runtime:
    """The loaded release: networks, tokenizer and the two ONNX front-end models."""

    def __init__(self, folder: str | Path, device: str = "cpu") -> None:
        from transformers import AutoTokenizer

        self.folder = check_release(folder)
        self.device = torch.device(device)
        self.models = load_models(self.folder)
        for module in (self.models.lm, self.models.flow, self.models.hift):
            module.to(self.device)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.folder / "CosyVoice-BlankEN"))
        self.tokenizer.add_special_tokens(SPECIAL_TOKENS)
        # The reference runs both ONNX files with ONNX Runtime; so does the engine layer here.
        self.campplus = get_runner(ModelSpec(name=f"{NAME}-campplus", onnx_path=self.folder / "campplus.onnx"),
                                   backend="onnxruntime", precision="fp32", stage="voice")
        self.speech_tokenizer = get_runner(
            ModelSpec(name=f"{NAME}-speech-tokenizer", onnx_path=self.folder / "speech_tokenizer_v2.onnx"),
            backend="onnxruntime", precision="fp32", stage="voice")

    def text_ids(self, text: str) -> list[int]:
        return list(self.tokenizer([text], return_tensors="pt")["input_ids"][0].tolist())

    def speaker_state(self, wave: np.ndarray, sample_rate: int, transcript: str = "") -> dict[str, np.ndarray]:
        wave = np.asarray(wave, np.float32).reshape(-1)
        limit = int(MAX_PROMPT_SECONDS * sample_rate)
        if wave.size > limit:
            wave = wave[:limit]
        w24 = torch.from_numpy(_resample(wave, sample_rate, 24000))[None]
        w16 = torch.from_numpy(_resample(wave, sample_rate, 16000))[None]
        feat = prompt_mel(w24)[0]                                     # [frames, 80]
        mel128 = whisper_log_mel(w16)                                 # [1, 128, frames]
        names = self.speech_tokenizer.input_names()
        tokens = next(iter(self.speech_tokenizer.run({names[0]: mel128.numpy(),
                                                      names[1]: np.array([mel128.shape[2]], np.int32)}).values()))
        tokens = np.asarray(tokens).reshape(-1).astype(np.int32)
        n = min(feat.shape[0] // 2, tokens.size)  # the flow needs exactly 2 mel frames per token
        if n < 1:
            raise ValueError("the reference audio is too short for CosyVoice 2; give at least 1 s of speech")
        fbank = kaldi_fbank(w16)
        embedding = next(iter(self.campplus.run({self.campplus.input_names()[0]: fbank[None].numpy()}).values()))
        return {"prompt_feat": feat[: 2 * n].numpy().astype(np.float32), "prompt_token": tokens[:n],
                "embedding": np.asarray(embedding, np.float32).reshape(-1),
                "prompt_text_ids": np.array(self.text_ids(transcript) if transcript.strip() else [], np.int32)}

    @torch.inference_mode()
    def speak(self, text_ids: list[int], state: dict[str, np.ndarray], generator: torch.Generator,
              speed: float = 1.0) -> tuple[np.ndarray, int]:
        """One chunk: (waveform, speech tokens generated)."""
        dev = self.device
        t = lambda a, dtype: torch.as_tensor(np.asarray(a), dtype=dtype, device=dev)[None]  # noqa: E731
        prompt_text = t(state["prompt_text_ids"], torch.int32)
        zero_shot = prompt_text.shape[1] > 0
        prompt_token = t(state["prompt_token"], torch.int32)
        lm_prompt = prompt_token if zero_shot else prompt_token[:, :0]
        tokens = list(self.models.lm.generate(t(text_ids, torch.int32), prompt_text, lm_prompt, generator=generator))
        if not tokens:
            return np.zeros(0, np.float32), 0
        mel = self.models.flow.inference(t(tokens, torch.int32), prompt_token, t(state["prompt_feat"], torch.float32),
                                         t(state["embedding"], torch.float32))
        if speed != 1.0:
            mel = F.interpolate(mel, size=max(1, int(mel.shape[2] / speed)), mode="linear")
        wave = self.models.hift.inference(mel, generator=generator)
        return wave[0].float().cpu().numpy(), len(tokens)


class CosyVoice2Engine:
    """TTS engine entry (registry line in voice/engines.py)."""

    name = NAME
    sample_rate = SAMPLE_RATE
    description = f"CosyVoice 2 zero-shot voice cloning ({LICENSE}); needs the user's {RELEASE_NAME} folder."

    def __init__(self, folder: str | Path | None = None, device: str = "cpu") -> None:
        self.folder = Path(folder) if folder else default_folder()
        self.device = device
        self._runtime: CosyVoice2Runtime | None = None

    def check_files(self) -> None:
        """Raise one error naming every missing release file (and the missing extra)."""
        check_release(self.folder)
        from .lm import require_transformers

        require_transformers()

    def runtime(self) -> CosyVoice2Runtime:
        if self._runtime is None:
            self._runtime = CosyVoice2Runtime(self.folder, self.device)
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
        if not {"prompt_feat", "prompt_token", "embedding", "prompt_text_ids"} <= set(state):
            raise ValueError("this speaker was not prepared for CosyVoice 2; run ExtractSpeakerEmbedding with "
                             "engine cosyvoice2 (or `digital-human speak --engine cosyvoice2 --voice clip.wav`)")
        return state

    def stream(self, text: str, speaker: Any, language: str = "auto", speed: float = 1.0, seed: int = 0,
               **_: Any) -> Iterator[np.ndarray]:
        """Sentence by sentence: each yielded piece is one chunk's audio followed by its pause."""
        from ...text.frontend import text_chunks

        state = self._state(speaker)
        runtime = self.runtime()
        _, chunks = text_chunks(text, language, lambda s: len(runtime.text_ids(s)), CHUNK_TOKENS)
        generator = torch.Generator().manual_seed(int(seed))
        for chunk in chunks:
            wave, _ = runtime.speak(runtime.text_ids(chunk.text), state, generator, speed)
            yield np.concatenate([wave, np.zeros(int(round(chunk.pause_after_s * SAMPLE_RATE)), np.float32)])

    def synthesize(self, text: str, speaker: Any, language: str = "auto", speed: float = 1.0, seed: int = 0,
                   progress: Any = None, **_: Any) -> Any:
        from ...voice.tts import SpeechResult

        start = time.perf_counter()
        pieces = list(self.stream(text, speaker, language, speed, seed))
        waveform = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        if not np.any(waveform):
            raise ValueError("CosyVoice 2 produced no speech for this text")
        return SpeechResult(waveform=waveform.astype(np.float32), sample_rate=SAMPLE_RATE, backend=f"torch ({self.device})",
                            precision="fp32", voice=f"{speaker.name or 'speaker'} (CosyVoice 2 zero-shot)",
                            chunks=len(pieces), timings={"synthesis": time.perf_counter() - start})
