"""Text -> speech in a speaker's voice: the pipeline behind TRT_TTS.

text frontend (normalise, chunk at sentences, G2P) -> Kokoro-82M through the engine loader, one call
per chunk -> chunks joined with natural pauses. The voice is a Kokoro voice pack: the imitated one
stored on the speaker (see voice/clone.py) or a bundled voice.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..engines import loader
from ..engines.kokoro.assets import kokoro_assets
from ..engines.kokoro.controls import AUDIO_LEAD_S, DURATION_HOP
from ..engines.kokoro.synth import kokoro_model_spec, style_for, synthesize_timed
from ..text import phonemize
from ..text.tokens import tokenize
from .formant import formant_shift, synthesis_controls
from .imitation import apply_offset
from .phone_timing import PhoneTime, token_phones
from .spectral_match import apply_eq
from .speaker import SpeakerProfile

SAMPLE_RATE = 24000
DEFAULT_VOICE = "jm_kumo"  # of the five bundled (Japanese) voices it speaks English most clearly
EDGE_FADE_S = 0.005  # tiny fades so joined chunks never click

KEY_BASE_VOICE = "imitation_base_voice"
KEY_OFFSET = "imitation_timbre_offset"
KEY_SCORES = "imitation_voice_scores"
KEY_F0 = "imitation_f0_scale"
KEY_EQ = "imitation_eq_db"  # spectral EQ gains (dB per mel band, spectral_match.py) of the imitated voice
KEY_FORMANT = "imitation_formant_scale"  # formant scale of the imitated voice (formant.py); absent = 1

RunFn = Callable[[dict], dict]  # graph feeds -> outputs (a loader runner or a bare session)
MapFn = Callable[[Callable, list], list]  # map(fn, items) -> results in the items' order


@dataclass
class SpeechResult:
    waveform: np.ndarray  # float32 mono
    sample_rate: int
    backend: str
    precision: str
    voice: str
    chunks: int
    timings: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # (phone, start_s, end_s) of the speech in `waveform`, from the TTS's own durations (gaps are
    # silence); None when the engine cannot say (then the talking head reads the audio alone)
    phones: list[PhoneTime] | None = None
    engine: str = ""  # the TTS engine that ran, and why when a choice (cosyvoice-auto) picked it; "" = Kokoro

    @property
    def audio_seconds(self) -> float:
        return len(self.waveform) / self.sample_rate


def bundled_voices() -> dict[str, np.ndarray]:
    return dict(kokoro_assets().voices)


@dataclass
class VoiceChoice:
    """What synthesize_speech needs to speak in a voice: pack, pitch, formants and EQ."""

    pack: np.ndarray  # [rows, 1, 256]
    f0_scale: float
    label: str
    eq: np.ndarray | None = None  # dB per mel band, already scaled by strength; None = no EQ
    formant: float = 1.0


def _voice_for(speaker: SpeakerProfile | None, base_voice: str, strength: float) -> VoiceChoice:
    """The imitated voice (pack, pitch, formants, EQ, all scaled by strength) or a bundled voice."""
    voices = bundled_voices()
    if base_voice != "auto" and base_voice not in voices:
        raise ValueError(f"base voice '{base_voice}' is not bundled; choose auto or one of {sorted(voices)}")
    imitated_base = str(speaker.extras[KEY_BASE_VOICE]) if speaker and KEY_BASE_VOICE in speaker.extras else None
    if imitated_base and base_voice in ("auto", imitated_base):
        if imitated_base not in voices:  # fitted where `setup` had installed Kokoro's English/Mandarin voices
            raise ValueError(f"{speaker.name or 'this speaker'}'s voice was fitted from the Kokoro voice "
                             f"'{imitated_base}', which is not installed here: run `python -m digital_human setup` "
                             "(it fetches the English and Mandarin voices), or extract the speaker embedding again")
        strength = float(np.clip(strength, 0.0, 1.0))
        offset = np.asarray(speaker.extras[KEY_OFFSET], np.float32)
        pack = apply_offset(voices[imitated_base], offset * strength)
        f0 = float(speaker.extras.get(KEY_F0, np.array(1.0))) ** strength
        formant = float(speaker.extras.get(KEY_FORMANT, np.array(1.0))) ** strength
        eq = speaker.extras.get(KEY_EQ)
        eq = None if eq is None else np.asarray(eq, np.float32).reshape(-1) * strength
        label = (f"{speaker.name or 'speaker'} (imitated from {imitated_base}, pitch x{f0:.2f}"
                 f"{f', formants x{formant:.2f}' if abs(formant - 1) > 1e-3 else ''}"
                 f"{', spectral EQ' if eq is not None else ''}, strength {strength:.2f})")
        return VoiceChoice(pack, f0, label, eq, formant)
    if base_voice == "auto" and speaker is not None and KEY_SCORES in speaker.extras:
        scores = dict(zip(voices, np.asarray(speaker.extras[KEY_SCORES]).tolist()))
        base_voice = max(scores, key=scores.get)
    name = DEFAULT_VOICE if base_voice == "auto" else base_voice
    return VoiceChoice(voices[name], 1.0, name)


def synthesize_speech(text: str, speaker: SpeakerProfile | None = None, *, language: str = "auto",
                      speed: float = 1.0, backend: str = "auto", precision: str = "auto",
                      base_voice: str = "auto", imitation_strength: float = 1.0,
                      voice_pack: np.ndarray | None = None, f0_scale: float = 1.0, formant_scale: float = 1.0,
                      progress: Callable[[int, int], None] | None = None, runner: RunFn | None = None,
                      map_fn: MapFn | None = None) -> SpeechResult:
    """Synthesize `text`; raises the text frontend's clear errors for empty/unspeakable/unsupported text.

    voice_pack/f0_scale/formant_scale: speak in this exact voice (the imitation search's candidates)
    instead of the speaker's; then no EQ is applied.
    runner: run Kokoro on this (feeds -> outputs) instead of the loader's runner (the voice fit's
    single-thread sessions, voice/parallel.py). map_fn(fn, items) -> list: how the chunks' Kokoro
    calls are run (default one after another; a thread pool's map runs them side by side - the
    result is the same, every chunk is spoken independently).
    """
    if voice_pack is None:
        voice = _voice_for(speaker, base_voice, imitation_strength)
    else:
        voice = VoiceChoice(np.asarray(voice_pack, np.float32), f0_scale, "custom", None, formant_scale)
    return synthesize_voices(text, [voice], language=language, speed=speed, backend=backend, precision=precision,
                             progress=progress, runner=runner, map_fn=map_fn)[0]


def synthesize_voices(text: str, voices: list[VoiceChoice], *, language: str = "auto", speed: float = 1.0,
                      backend: str = "auto", precision: str = "auto",
                      progress: Callable[[int, int], None] | None = None, runner: RunFn | None = None,
                      map_fn: MapFn | None = None) -> list[SpeechResult]:
    """`text` spoken by each of `voices` (the text frontend runs once). All (voice, chunk) Kokoro calls
    go through map_fn together, so a thread pool keeps its workers busy across voices. progress is
    called per chunk of the first voice (synthesize_speech's contract: one voice)."""
    timings: dict[str, float] = {}
    start = time.perf_counter()
    chunks = phonemize(text, language)
    timings["frontend"] = time.perf_counter() - start
    start = time.perf_counter()
    loaded = loader.get(kokoro_model_spec("fp32"), backend=backend, precision=precision, stage="voice")
    run = runner or loaded
    timings["load"] = time.perf_counter() - start
    vocab = kokoro_assets().vocab
    # Which backend ran is in the report (result.backend); the loader logged one line about it and the
    # fallback reasons at debug level, so they do not repeat in every status line.
    warnings: list[str] = []
    chunk_ids: list[list[int]] = []
    for chunk in chunks:
        if chunk.unknown:
            warnings.append(f"skipped characters the voice cannot say: {''.join(sorted(set(chunk.unknown)))}")
        chunk_ids.append(tokenize(chunk.phonemes, vocab, dropped=[]))
    controls = [synthesis_controls(v.f0_scale, speed, v.formant) for v in voices]

    def speak(job: tuple[int, int]) -> tuple[np.ndarray, int, np.ndarray | None]:
        """(formant-shifted speech, its length before the shift, durations) of one chunk in one voice."""
        v, c = job
        ids = chunk_ids[c]
        kokoro_f0, kokoro_speed = controls[v]
        wave, durations = synthesize_timed(ids, style_for(voices[v].pack, len(ids)), kokoro_speed, run,
                                           f0_scale=kokoro_f0)
        return formant_shift(wave, SAMPLE_RATE, voices[v].formant), len(wave), durations

    jobs = [(v, c) for v in range(len(voices)) for c in range(len(chunks)) if chunk_ids[c]]
    start = time.perf_counter()
    if map_fn is None:
        spoken = {}
        for v in range(len(voices)):
            for c in range(len(chunks)):
                if chunk_ids[c]:
                    spoken[(v, c)] = speak((v, c))
                if progress and v == 0:
                    progress(c + 1, len(chunks))
    else:
        spoken = dict(zip(jobs, map_fn(speak, jobs)))
    synthesis_s = (time.perf_counter() - start) / max(1, len(voices))
    results = []
    for v, voice in enumerate(voices):
        pieces: list[np.ndarray] = []
        phones: list[PhoneTime] | None = []
        offset = 0  # samples of output so far: where the next chunk's phones start
        for c, chunk in enumerate(chunks):
            if chunk_ids[c]:
                wave, raw_len, durations = spoken.pop((v, c))  # freed as assembled (long texts)
                kokoro_speed = controls[v][1]
                if phones is not None and durations is not None and raw_len:
                    kept = [ch for ch in chunk.phonemes if ch in vocab]  # what tokenize() fed, in order
                    # the formant shift resamples: every time in the chunk stretches by the length ratio
                    phones += token_phones(kept, durations, DURATION_HOP / SAMPLE_RATE, offset / SAMPLE_RATE,
                                           len(wave) / raw_len, AUDIO_LEAD_S / kokoro_speed)
                else:
                    phones = None  # a runner without the durations output: no partial timings
                if voice.eq is not None:  # per chunk, before the fades, so the filter never rings into a pause
                    wave = apply_eq(wave, SAMPLE_RATE, voice.eq)
                pieces.append(_fade(wave))
                offset += len(wave)
            pieces.append(np.zeros(int(round(chunk.pause_after_s * SAMPLE_RATE)), np.float32))
            offset += len(pieces[-1])
        if progress and v == 0 and map_fn is not None:
            progress(len(chunks), len(chunks))
        waveform = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        if waveform.size == 0 or not np.any(waveform):
            raise ValueError("the text produced no speech; check that it contains words in English or Mandarin")
        peak = float(np.abs(waveform).max())
        if peak > 0.99:  # Kokoro rarely overshoots; never hand clipped audio downstream
            waveform = waveform * (0.99 / peak)
        results.append(SpeechResult(waveform=waveform.astype(np.float32), sample_rate=SAMPLE_RATE,
                                    backend=loaded.backend, precision=loaded.precision, voice=voice.label,
                                    chunks=len(chunks), timings={**timings, "synthesis": synthesis_s},
                                    warnings=list(dict.fromkeys(warnings)), phones=phones))
    return results


def _fade(wave: np.ndarray) -> np.ndarray:
    n = min(len(wave) // 2, int(EDGE_FADE_S * SAMPLE_RATE))
    if n > 0:
        ramp = np.linspace(0.0, 1.0, n, dtype=np.float32)
        wave = wave.copy()
        wave[:n] *= ramp
        wave[-n:] *= ramp[::-1]
    return wave
