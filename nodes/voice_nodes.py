"""Voice chain nodes: LoadReferenceAudio -> ExtractSpeakerEmbedding -> TRT_TTS (+ LoadSpeaker).

Each node is a thin recipe over the pack's modules (audio/, voice/, text/, engines/), so the CLI runs
exactly the same code and a later move to ComfyUI's V3 schema only touches this file.
"""
from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic_file import atomic_path
from ..assets.pypi_fetch import sha256_file
from ..voice.imitation import DEFAULT_BUDGET
from .comfy_glue import (Progress, check_plain_name, list_input_files, resolve_input_file, temp_directory,
                         without_server_paths)

log = logging.getLogger("digital_human")

CATEGORY = "DigitalHuman"
AUDIO_EXTENSIONS = (".wav", ".mp3", ".m4a", ".aac", ".flac", ".ogg", ".opus", ".webm", ".mp4")
BACKENDS = ["auto", "tensorrt", "torch", "onnxruntime"]
PRECISIONS = ["auto", "fp16", "fp32"]
SPEAKER_DIR = "speakers"


class LoadReferenceAudio:
    """Reference voice clip: decode, mono, trim, -1 dBFS, 3-10 s speech segments."""

    DESCRIPTION = ("Load a clip of the voice to clone (wav/mp3/m4a/flac/ogg) from ComfyUI's input folder, "
                   "or take an AUDIO input. Cleans it and finds the speech segments the speaker encoder needs.")

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        files = list_input_files(AUDIO_EXTENSIONS)
        return {
            "required": {
                "audio_file": (files or [""], {"audio_upload": True,  # js/ adds the button for this name
                                               "tooltip": "A clip with 3 s to 10 min of one person speaking."}),
                "max_seconds": ("FLOAT", {"default": 600.0, "min": 5.0, "max": 3600.0, "step": 5.0,
                                          "tooltip": "Longer clips are cut to this length (with a warning)."}),
            },
            "optional": {"audio": ("AUDIO", {"tooltip": "Use this audio instead of the file."})},
        }

    RETURN_TYPES = ("AUDIO", "STRING")
    RETURN_NAMES = ("reference", "report")
    FUNCTION = "load"
    CATEGORY = CATEGORY

    @classmethod
    def IS_CHANGED(cls, audio_file: str = "", max_seconds: float = 600.0, audio: Any = None) -> str:
        try:
            return sha256_file(resolve_input_file(audio_file, "audio_file")) + f"|{max_seconds}"
        except (ValueError, OSError):
            return f"{audio_file}|{max_seconds}"

    @classmethod
    def VALIDATE_INPUTS(cls, audio_file: str = "") -> bool | str:
        # The file list is built at start-up; accept uploads made since, but confine names to input/.
        # Only audio_file is named: ComfyUI skips its own checks for the inputs this signature takes.
        if not audio_file:
            return True  # may be fed by the optional AUDIO input; load() says what is missing
        try:
            resolve_input_file(audio_file, "audio_file")
        except (ValueError, FileNotFoundError) as exc:
            return str(exc)
        return True

    def load(self, audio_file: str = "", max_seconds: float = 600.0, audio: dict | None = None):
        from ..audio import from_comfy_audio, load_reference, prepare_reference, to_comfy_audio

        if audio is not None:
            wave, rate = from_comfy_audio(audio)
            prepared = prepare_reference(wave, rate, source="AUDIO input", max_seconds=max_seconds)
        else:
            prepared = load_reference(resolve_input_file(audio_file, "audio_file"), max_seconds=max_seconds)
        for warning in prepared.warnings:
            log.warning("LoadReferenceAudio: %s", warning)
        out = to_comfy_audio(prepared.waveform, prepared.sample_rate)
        out["dh_prepared"] = prepared  # segments etc. for ExtractSpeakerEmbedding; core nodes ignore it
        report = (f"{prepared.source}: {prepared.speech_seconds:.1f} s of speech in "
                  f"{prepared.duration_seconds:.1f} s, {len(prepared.segments)} segments")
        if prepared.warnings:
            report += "\nwarnings: " + "; ".join(prepared.warnings)
        return (out, report)


class ExtractSpeakerEmbedding:
    """GE2E embedding of the reference + a Kokoro voice fitted to it (cached by audio content)."""

    DESCRIPTION = ("Speaker embedding (GE2E, from resemblyzer's Apache-2.0 weights) of the reference voice, "
                   "and a TTS voice fitted to it by a timbre search. Cached by audio content in memory and on disk.")

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "reference": ("AUDIO",),
                "imitate": ("BOOLEAN", {"default": True, "tooltip": "Fit a TTS voice to this speaker "
                                        "(about 16 short syntheses, once per clip; cached)."}),
                "search_budget": ("INT", {"default": DEFAULT_BUDGET, "min": 5, "max": 200,
                                          "tooltip": "Syntheses the voice search may use."}),
                "seed": ("INT", {"default": 0, "min": 0, "max": 2**31 - 1}),
                "backend": (BACKENDS, {"default": "auto"}),
            },
            "optional": {
                "reference_text": ("STRING", {"multiline": True, "default": "",
                                              "tooltip": "Transcript of the clip (optional; picks the "
                                                         "language of the voice search)."}),
                "save_name": ("STRING", {"default": "", "tooltip": "Save the speaker as models/digital_human/"
                                         "speakers/<name>.npz for LoadSpeaker."}),
                "engine": (_engine_names(), {"default": "kokoro", "tooltip": ENGINE_TOOLTIP}),
            },
        }

    RETURN_TYPES = ("DH_SPEAKER", "STRING")
    RETURN_NAMES = ("speaker", "report")
    FUNCTION = "extract_node"
    CATEGORY = CATEGORY

    @classmethod
    def VALIDATE_INPUTS(cls, save_name: str = "", engine: str = "kokoro") -> bool | str:
        named = check_plain_name(save_name, "save_name", "my_voice",
                                 "ComfyUI's models folder under digital_human/speakers/ (for Load Speaker)")
        return _engine_files_ok(engine) if named is True else named

    def extract_node(self, reference: dict, imitate: bool = True, search_budget: int = DEFAULT_BUDGET, seed: int = 0,
                     backend: str = "auto", reference_text: str = "", save_name: str = "", engine: str = "kokoro"):
        speaker, report = self.extract(reference, backend=backend, reference_text=reference_text,
                                       imitate=imitate, budget=search_budget, seed=seed, save_name=save_name,
                                       engine=engine)
        return (speaker, report["text"])

    def extract(self, reference: dict, backend: str = "auto", reference_text: str = "", imitate: bool = True,
                budget: int = DEFAULT_BUDGET, seed: int = 0, name: str = "", save_name: str = "",
                engine: str = "kokoro") -> tuple[Any, dict]:
        from ..audio import from_comfy_audio, prepare_reference
        from ..engines import speaker_encoder as se
        from ..paths import model_dir, resolve_inside
        from ..voice.clone import fit_voice, has_fitted_voice, without_fitted_voice
        from ..voice.embedding_cache import default_cache
        from ..voice.speaker import extract_speaker_profile

        timings: dict[str, float] = {}
        start = time.perf_counter()
        prepared = reference.get("dh_prepared") if isinstance(reference, dict) else None
        if prepared is None:  # e.g. core LoadAudio: clean it the same way
            wave, rate = from_comfy_audio(reference)
            prepared = prepare_reference(wave, rate, source="AUDIO input")
        timings["prepare"] = time.perf_counter() - start
        start = time.perf_counter()
        run_fn = se.default_run_fn(backend=backend)
        speaker = extract_speaker_profile(prepared, run_fn=run_fn, name=name, reference_text=reference_text)
        timings["embed"] = time.perf_counter() - start
        encoder_backend = _loaded_backend("ge2e")
        lines = [speaker.summary()]
        if engine != "kokoro":  # the Kokoro voice search is Kokoro's own speaker preparation
            from ..voice.engines import get_engine

            start = time.perf_counter()
            tts = get_engine(engine)  # a choice (cosyvoice-auto): the engine it picks, whose name keys the state
            speaker = tts.prepare_speaker(prepared, reference_text, speaker)
            timings[f"prepare_{tts.name}"] = time.perf_counter() - start
            lines.append(f"voice: prepared for {tts.name}" + (f" (picked by {engine})" if tts.name != engine else ""))
        elif imitate and not has_fitted_voice(speaker, budget, seed, "auto", reference=prepared):
            start = time.perf_counter()
            bar: list[Progress] = []  # made on the first report: fit_voice knows the total (budget + checks)

            def on_progress(done: int, total: int) -> None:
                if not bar:
                    bar.append(Progress(total, "voice fit"))
                bar[0].update(done - bar[0].done)

            speaker, result = fit_voice(speaker, budget=budget, seed=seed, backend=backend, reference=prepared,
                                        progress=on_progress)
            default_cache().put(speaker)  # next run of the same clip skips the search
            timings["voice_search"] = time.perf_counter() - start
            lines.append(f"voice: {result.base_voice} similarity {result.base_similarity:.3f} -> imitated "
                         f"{result.similarity:.3f} ({result.evaluations} syntheses)")
        elif imitate:
            lines.append("voice: fitted voice reused from cache")
        else:
            # The cache may hold this clip's fitted voice from an earlier run; imitate=False means the
            # nearest bundled voice, so hand out a profile without the fit.
            speaker = without_fitted_voice(speaker)
        if save_name:
            target = resolve_inside(f"{save_name}.npz", model_dir(SPEAKER_DIR), what="save_name",
                                    hint="Use a plain name such as my_voice.")
            speaker.save_npz(target)
            lines.append(f"saved {target.name}")
        lines.append(f"encoder: {encoder_backend}")
        lines.extend(f"warning: {w}" for w in speaker.warnings)
        return speaker, {"text": "\n".join(lines), "backend": encoder_backend, "timings": timings}


class LoadSpeaker:
    """A speaker saved by ExtractSpeakerEmbedding (models/digital_human/speakers/*.npz)."""

    DESCRIPTION = "Reload a saved voice (.npz written by ExtractSpeakerEmbedding's save_name)."

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        from ..paths import model_dir

        # dot files are other processes' unfinished saves (atomic_file)
        names = sorted(p.name for p in model_dir(SPEAKER_DIR).glob("*.npz") if not p.name.startswith("."))
        return {"required": {"speaker_file": (names or [""],)}}

    RETURN_TYPES = ("DH_SPEAKER", "STRING")
    RETURN_NAMES = ("speaker", "report")
    FUNCTION = "load"
    CATEGORY = CATEGORY

    def load(self, speaker_file: str):
        from ..paths import model_dir, resolve_inside
        from ..voice.speaker import SpeakerProfile

        if not speaker_file:
            raise ValueError("speaker_file: no saved speaker yet; run ExtractSpeakerEmbedding with a save_name")
        path = resolve_inside(speaker_file, model_dir(SPEAKER_DIR), what="speaker_file")
        speaker = SpeakerProfile.load_npz(path)
        return (speaker, speaker.summary())


class TRT_TTS:
    """Text -> speech in the speaker's voice (Kokoro-82M through the engine layer)."""

    DESCRIPTION = ("Speak any English or Mandarin text in the cloned voice. Numbers, dates, money and units "
                   "are read out; long text is split at sentences. Runs on TensorRT / torch CUDA / ONNX Runtime.")

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "text": ("STRING", {"multiline": True, "default": "Hello! This is my digital twin speaking."}),
                "language": (["auto", "en", "zh"], {"default": "auto"}),
                "speed": ("FLOAT", {"default": 1.0, "min": 0.5, "max": 2.0, "step": 0.05}),
                "seed": ("INT", {"default": 0, "min": 0, "max": 2**31 - 1,
                                 "tooltip": "Kokoro is deterministic; change to force a re-run."}),
                "imitation_strength": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.05,
                                                 "tooltip": "0 = nearest bundled voice, 1 = fitted voice."}),
                "base_voice": (["auto", *_kokoro_voice_names()],
                               {"default": "auto", "tooltip": "auto = the speaker's fitted voice when it has one. "
                                "The English and Mandarin voices appear once `setup` "
                                "has installed them."}),
                "backend": (BACKENDS, {"default": "auto"}),
                "precision": (PRECISIONS, {"default": "auto"}),
            },
            "optional": {"speaker": ("DH_SPEAKER",),
                         "engine": (_engine_names(), {"default": "kokoro", "tooltip": ENGINE_TOOLTIP}),
                         "fast_path": ("BOOLEAN", {"default": False, "tooltip": _fast_path_tooltip()}),
                         # appended last: UI workflows keep their widgets' positions
                         "instruction": ("STRING", {"multiline": True, "default": "",
                                                    "tooltip": INSTRUCTION_TOOLTIP})},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, engine: str = "kokoro", instruction: str = "") -> bool | str:
        from ..voice.engines import instruction_problem

        problem = instruction_problem(engine, instruction)
        return problem if problem else _engine_files_ok(engine)

    RETURN_TYPES = ("AUDIO", "STRING")
    RETURN_NAMES = ("speech", "report")
    FUNCTION = "speak"
    CATEGORY = CATEGORY

    def speak(self, text: str, language: str = "auto", speed: float = 1.0, seed: int = 0,
              imitation_strength: float = 1.0, base_voice: str = "auto", backend: str = "auto",
              precision: str = "auto", speaker: Any = None, engine: str = "kokoro", fast_path: bool = False,
              instruction: str = ""):
        from ..audio import to_comfy_audio
        from ..audio.phone_channel import with_phones

        result = self._synthesize(text, speaker, language, speed, imitation_strength, base_voice, backend, precision,
                                  seed=seed, engine=engine, fast_path=fast_path, instruction=instruction)
        report = self._report(result)
        ui = {"audio": [_save_preview(result.waveform, result.sample_rate)], "text": [report]}
        # the TTS's phone timings ride along (audio/phone_channel.py): the talking head times its visemes by them
        speech = with_phones(to_comfy_audio(result.waveform, result.sample_rate), getattr(result, "phones", None))
        return {"ui": ui, "result": (speech, report)}

    def synthesize_to_file(self, text: str, speaker: Any, out_path: Path, language: str = "auto",
                           speed: float = 1.0, seed: int = 0, backend: str = "auto",
                           voice: str = "auto", imitation_strength: float = 1.0,
                           engine: str = "kokoro", fast_path: bool | None = None,
                           instruction: str = "") -> dict[str, Any]:
        """CLI entry: same synthesis, written atomically to a WAV file."""
        start = time.perf_counter()
        result = self._synthesize(text, speaker, language, speed, imitation_strength, voice, backend, "auto",
                                  seed=seed, engine=engine, fast_path=fast_path, instruction=instruction)
        elapsed = time.perf_counter() - start
        path = _write_wav_atomic(Path(out_path), result.waveform, result.sample_rate)
        return {"path": path, "backend": result.backend, "timings": result.timings, "warnings": result.warnings,
                "audio_seconds": round(result.audio_seconds, 3), "rtf": round(elapsed / result.audio_seconds, 4),
                "voice": result.voice, "engine": result.engine or engine}

    def _synthesize(self, text, speaker, language, speed, strength, base_voice, backend, precision,
                    seed: int = 0, engine: str = "kokoro", fast_path: bool | None = None, instruction: str = ""):
        from ..voice.engines import instruction_problem
        from ..voice.tts import synthesize_speech

        problem = instruction_problem(engine, instruction)  # before any work: Kokoro has no instruct mode
        if problem:
            raise ValueError(problem)
        if engine != "kokoro":
            from ..voice.engines import engine_options, get_engine, resolve_engine

            picked, why = resolve_engine(engine)
            if why:
                log.info("[digital_human] TTS engine %s -> %s: %s", engine, picked, why)
            # fast_path: the engine's CUDA fast path (its variable overrides the switch; fast_path.py)
            options = engine_options(engine, fast_path)
            extra = {"instruction": instruction} if instruction.strip() else {}
            result = get_engine(picked, **options).synthesize(text, speaker, language=language, speed=speed,
                                                              seed=seed, **extra)
            result.engine = f"{picked} (picked by {engine}: {why})" if why else picked
            if fast_path and not options and isinstance(getattr(result, "warnings", None), list):
                result.warnings.append(f"{engine}: fast path not used (it needs a CUDA GPU, or the engine has none, "
                                       "or its variable is 0); ran eager")
            return result

        progress: Progress | None = None

        def report_progress(done: int, total: int) -> None:
            nonlocal progress
            progress = progress or Progress(total, "TTS")
            progress.update(1)

        return synthesize_speech(text, speaker, language=language, speed=speed, backend=backend,
                                 precision=precision, base_voice=base_voice, imitation_strength=strength,
                                 progress=report_progress)

    @staticmethod
    def _report(result: Any) -> str:
        synth = result.timings.get("synthesis", 0.0)
        lines = [f"{result.audio_seconds:.2f} s of speech, voice {result.voice}",
                 f"backend {result.backend} ({result.precision}); synthesis {synth:.2f} s, "
                 f"RTF {synth / max(result.audio_seconds, 1e-9):.3f}; {result.chunks} chunk(s)"]
        if getattr(result, "engine", ""):
            lines.append(f"engine {result.engine}")
        lines.extend(f"warning: {w}" for w in result.warnings)
        return "\n".join(lines)


ENGINE_TOOLTIP = ("kokoro: embedded, no files needed. cosyvoice2: zero-shot cloning (Apache-2.0), needs the "
                  "CosyVoice2-0.5B folder in models/digital_human/cosyvoice/ and `pip install .[cosyvoice]`. "
                  "cosyvoice3: Fun-CosyVoice3-0.5B (Apache-2.0), better speaker similarity, needs that folder "
                  "in models/digital_human/cosyvoice/ and the same extra. cosyvoice-auto: cosyvoice3 when the "
                  "Fun-CosyVoice3-0.5B folder is complete, else cosyvoice2 (the report says which ran).")
INSTRUCTION_TOOLTIP = ("CosyVoice 3 only (cosyvoice3, or cosyvoice-auto when it picks CosyVoice 3): a speaking "
                       "style or dialect instruction, e.g. 'Speak slowly and cheerfully.' or '请用广东话表达。'; "
                       "it replaces the reference transcript in the prompt (the voice still comes from the "
                       "clip). Empty = normal cloning. Other engines refuse a non-empty instruction.")


JAPANESE_VOICES = ["jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo"]  # in the PyPI package


_voice_list_warned: list[str] = []


def _kokoro_voice_names() -> list[str]:
    """Every installed Kokoro voice (the Japanese five, plus English and Mandarin after `setup`)."""
    from ..engines.kokoro.assets import voice_names
    from ..engines.kokoro.voice_set import installed_voice_names

    try:
        return voice_names()
    except (OSError, ValueError, RuntimeError) as exc:  # setup not run yet: the node still lists its voices
        if not _voice_list_warned:  # ComfyUI asks for the inputs on every page load: say it once
            _voice_list_warned.append(str(exc))
            log.warning("could not list the Kokoro voices (%s)", exc)
        return JAPANESE_VOICES + [n for n in installed_voice_names() if n not in JAPANESE_VOICES]


def _fast_path_tooltip() -> str:
    from ..fast_path import COSYVOICE_COST

    return "Engines with a CUDA fast path (cosyvoice2); kokoro ignores it. " + COSYVOICE_COST


def _engine_names() -> list[str]:
    from ..voice.engines import ENGINES

    return list(ENGINES)


def _engine_files_ok(engine: str) -> bool | str:
    """Validation: an engine's missing pip extra (with the line that installs it) and every missing file
    (and where it goes), found without importing the engine (voice/engines.engine_problem)."""
    from ..voice.engines import engine_problem

    problem = engine_problem(engine)
    return without_server_paths(problem) if problem else True


def _loaded_backend(model_prefix: str) -> str:
    from ..engines import loader

    for summary in reversed(loader.loader().loaded()):
        if summary.startswith(model_prefix):
            return summary
    return "unknown"


def _write_wav_atomic(path: Path, wave: np.ndarray, rate: int) -> Path:
    import soundfile as sf

    with atomic_path(path) as tmp:
        sf.write(str(tmp), wave, rate, subtype="PCM_16", format="WAV")
    return path


def _save_preview(wave: np.ndarray, rate: int) -> dict[str, str]:
    """Write a preview file into ComfyUI's temp folder; return the UI descriptor the audio widget plays."""
    folder = temp_directory()
    folder.mkdir(parents=True, exist_ok=True)
    name = f"dh_tts_{hashlib.sha1(wave.tobytes()).hexdigest()[:16]}.wav"
    _write_wav_atomic(folder / name, wave, rate)
    return {"filename": name, "subfolder": "", "type": "temp"}


NODE_CLASS_MAPPINGS = {
    "LoadReferenceAudio": LoadReferenceAudio,
    "ExtractSpeakerEmbedding": ExtractSpeakerEmbedding,
    "DH_LoadSpeaker": LoadSpeaker,
    "TRT_TTS": TRT_TTS,
}
NODE_DISPLAY_NAME_MAPPINGS = {
    "LoadReferenceAudio": "Load Reference Audio (Digital Human)",
    "ExtractSpeakerEmbedding": "Extract Speaker Embedding",
    "DH_LoadSpeaker": "Load Saved Speaker",
    "TRT_TTS": "TTS in Cloned Voice (TensorRT)",
}
