"""Phone timings for real recordings: an offline aligner whose model ships inside a PyPI wheel.

The talking heads need to know *which* sound is spoken *when* (lips meet on p/b/m, round on o/u/w). For
the pack's own speech the TTS knows its phonemes; for any other audio (training footage, a user's clip)
this module recovers them with pocketsphinx 5 (BSD-2-Clause) and the US-English acoustic model, phone
language model and CMU dictionary that ship inside its wheel, so nothing is downloaded at run time.
Install it with the optional extra: `pip install "comfyui-digital-human[align]"`.

    align_phones(wave, rate, text=None, language="en") -> PhoneAlignment

- With a transcript (`text`): forced alignment. The words are looked up in CMUdict (numbers are read
  out first by the pack's English normaliser), aligned word by word, then a second pass aligns the
  phones inside them. `method == "forced"`.
- Without one, or when forced alignment fails (a word not in the dictionary, text that does not match
  the audio): pocketsphinx's phone loop (`allphone` search with the wheel's phone trigram model), which
  recognises phones with no words at all. `method == "phone-loop"`; `reason` then says why forced
  alignment was not used. Phone-loop labels are a recogniser's guess: on the clips measured (see
  benchmarks/RESULTS.md, "Phone aligner") the phone loop's label equals the forced alignment's on
  55-63% of the speech frames, so treat them as a noisy hint, not a transcript.
- Failure (pocketsphinx not installed, a language other than English, silence, noise, too little
  speech, low confidence) returns `method == "none"`, no phones, `confidence == 0.0` and a `reason`.
  It never raises on ordinary audio, so the caller falls back to its audio features.

Labels (`Phone.label`), for mapping to visemes: the 39 ARPAbet phonemes of CMUdict without stress
digits, upper case -
  vowels      AA AE AH AO AW AY EH ER EY IH IY OW OY UH UW
  stops       B D G K P T          affricates  CH JH
  fricatives  DH F HH S SH TH V Z ZH
  nasals      M N NG               liquids/glides  L R W Y
- plus "SIL" for silence, pauses, breaths and non-speech noise (pocketsphinx's filler phones +NSN+,
  +SPN+ and the like are folded into SIL, since they carry no mouth shape). `phones` covers the audio
  from 0 to its end without gaps or overlaps, in time order; consecutive SILs are merged. Times are
  in seconds on a 10 ms grid (the acoustic model's frame rate).

Confidence, in [0, 1], is the intersection-over-union of two independent speech detections on the
10 ms grid: the frames that the WebRTC voice-activity detector (also in the pocketsphinx wheel) marks
as speech, and the frames that the aligner covers with a non-SIL phone that fits the audio. "Fits":
for forced alignment, the phone's per-frame acoustic score (log-likelihood relative to the best
senone of each frame, from the second alignment pass) is above FIT_SCORE_PER_FRAME; text that does
not match the audio drives most phones far below it. For the phone loop every recognised phone
counts (its path is the acoustic best by construction, so its score says nothing), so there the
confidence says "speech found and covered", not "phones correct". A result below MIN_CONFIDENCE is
returned as a failure.
"""
from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Phone", "PhoneAlignment", "align_phones", "aligner_available", "ARPABET_PHONES",
           "MIN_CONFIDENCE", "FIT_SCORE_PER_FRAME"]

ARPABET_PHONES = frozenset(
    "AA AE AH AO AW AY B CH D DH EH ER EY F G HH IH IY JH K L M N NG OW OY P R S SH T TH UH UW V W Y Z ZH"
    .split())
SILENCE = "SIL"
RATE = 16000  # the acoustic model's sample rate
FRAMES_PER_SECOND = 100  # pocketsphinx's default frame rate (10 ms hop)
# Calibrated on shared clips (benchmarks/phone_align.py, table in benchmarks/RESULTS.md): the right
# transcript scores -11..-17 per speech frame on average, an unrelated one -45..-53. -35 sits between.
FIT_SCORE_PER_FRAME = -35.0
MIN_CONFIDENCE = 0.5
MIN_SPEECH_SECONDS = 0.3  # less voiced audio than this has too few phones to drive a mouth
# Phone-loop settings: the phone-LM weight, insertion penalty and wide beams that
# research/clone_audio_probes.py already used for phone features of 01a/01b; not re-tuned here (the
# beams are wide because the loop is cheap: 43-90 ms per audio second measured).
_LOOP_OPTIONS = dict(lw=2.0, pip=0.3, beam=1e-20, pbeam=1e-20)
# WebRTC VAD aggressiveness 0..3. 3, the strictest: on spk_en_03 and two pack-TTS sentences it still
# flags 96-99% of the frames that forced alignment puts phones on, and the fewest of its pauses (0-18%,
# against 9-38% at 2 and 42-57% at 0-1). No mode rejects white noise; the phone loop does that.
_VAD_MODE = 3
_ENGLISH = frozenset({"en", "en-us", "en_us", "english"})


@dataclass(frozen=True)
class Phone:
    label: str  # ARPAbet without stress, or "SIL" (see the module docstring)
    start: float  # seconds
    end: float  # seconds, > start


@dataclass
class PhoneAlignment:
    phones: list[Phone] = field(default_factory=list)
    confidence: float = 0.0
    method: str = "none"  # "forced", "phone-loop" or "none"
    reason: str = ""  # why forced alignment, or any alignment, was not used; "" when nothing failed
    duration: float = 0.0  # seconds of audio aligned

    @property
    def ok(self) -> bool:
        return self.method != "none" and bool(self.phones)

    def labels_at(self, times: np.ndarray) -> list[str]:
        """The phone label at each time in seconds ("SIL" outside the phones) - e.g. video frame centres."""
        times = np.asarray(times, dtype=np.float64)
        if not self.phones:
            return [SILENCE] * len(times)
        starts = np.array([p.start for p in self.phones])
        ends = np.array([p.end for p in self.phones])
        idx = np.searchsorted(starts, times, side="right") - 1
        return [self.phones[i].label if i >= 0 and t < ends[i] else SILENCE for i, t in zip(idx, times)]


def _failure(reason: str, duration: float = 0.0) -> PhoneAlignment:
    return PhoneAlignment(phones=[], confidence=0.0, method="none", reason=reason, duration=duration)


def aligner_available() -> str | None:
    """None when pocketsphinx and its English model are importable, else why not."""
    try:
        import pocketsphinx
    except ImportError:
        return 'pocketsphinx is not installed (pip install "comfyui-digital-human[align]")'
    model = pocketsphinx.get_model_path()
    if not os.path.isfile(os.path.join(model, "en-us", "cmudict-en-us.dict")):
        return f"pocketsphinx's en-us model is missing from {model}"
    return None


# pocketsphinx decoders are not thread-safe and the forced one takes 0.1-0.4 s to load CMUdict, so one of
# each is kept per process behind a lock; a decoder that raised mid-utterance is dropped and rebuilt.
_lock = threading.Lock()
_decoders: dict[str, object] = {}
# A decoder carries its cepstral-mean estimate from one utterance into the next, so the same audio would
# align differently depending on what was aligned before it in the process (seen: 40 vs 41 phones on a
# clip's second run). The feature computation is re-initialised for each new alignment instead.


def _decoder(kind: str):
    if kind not in _decoders:
        from pocketsphinx import Decoder, get_model_path

        model = get_model_path()
        hmm = os.path.join(model, "en-us", "en-us")
        if kind == "forced":
            # lm=None: alignment needs the dictionary but not the 30 MB word trigram model
            _decoders[kind] = Decoder(hmm=hmm, dict=os.path.join(model, "en-us", "cmudict-en-us.dict"),
                                      lm=None, loglevel="FATAL")
        else:
            _decoders[kind] = Decoder(hmm=hmm, allphone=os.path.join(model, "en-us", "en-us-phone.lm.bin"),
                                      lm=None, dict=None, loglevel="FATAL", **_LOOP_OPTIONS)
    else:
        _decoders[kind].reinit_feat()
    return _decoders[kind]


def _to_pcm16(wave: np.ndarray, rate: int) -> tuple[np.ndarray, str | None]:
    """Mono 16 kHz float in [-1, 1], peak-normalised; or a reason why the audio cannot be aligned."""
    w = np.asarray(wave, dtype=np.float32)
    if w.ndim == 2:  # [channels, samples] (the pack's decode_audio) or [samples, channels]
        w = w.mean(axis=0 if w.shape[0] <= w.shape[1] else 1)
    if w.ndim != 1:
        return w, f"expected mono or [channels, samples] audio, got shape {np.shape(wave)}"
    if w.size == 0:
        return w, "empty audio"
    if not np.all(np.isfinite(w)):
        return w, "audio contains NaN or infinite samples"
    if rate != RATE:
        import soxr

        w = soxr.resample(w, rate, RATE).astype(np.float32)
    w = w - float(w.mean())
    peak = float(np.abs(w).max()) if w.size else 0.0
    if peak < 1e-4:  # -80 dBFS: digital silence or a dead input; nothing to align
        return w, f"silent audio ({w.size / RATE:.2f} s, peak below -80 dBFS)"
    # The features use batch cepstral mean normalisation, so level matters little, but int16 needs a
    # sensible range: peak at -1 dBFS, like the pack's reference-audio cleaner.
    return (w * (0.89 / peak)).astype(np.float32), None


def _vad_frames(pcm: bytes, n_frames: int) -> np.ndarray:
    """Speech flags on the 10 ms grid from pocketsphinx's WebRTC VAD (30 ms windows, each spread to 3)."""
    from pocketsphinx import Vad

    vad = Vad(mode=_VAD_MODE, sample_rate=RATE)
    step = vad.frame_bytes
    per = round(vad.frame_length * FRAMES_PER_SECOND)
    flags = np.zeros(n_frames, dtype=bool)
    for i, off in enumerate(range(0, len(pcm) - step + 1, step)):
        if vad.is_speech(pcm[off:off + step]):
            flags[i * per:(i + 1) * per] = True
    return flags


def _words(text: str, decoder) -> tuple[list[str], list[str]]:
    """Transcript -> dictionary words, and the words the dictionary lacks."""
    try:  # read numbers, dates, units out loud the way the pack's TTS would say them
        from ..text.normalize_en import normalize_en

        text = normalize_en(text)
    except Exception:  # the normaliser is a nicety; raw text still aligns when it has no numbers
        pass
    tokens = re.findall(r"[a-z]+(?:'[a-z]+)*", text.lower().replace("\u2019", "'"))
    missing = [t for t in tokens if decoder.lookup_word(t) is None]
    return tokens, missing


def _forced(pcm: bytes, words: list[str]) -> list[tuple[str, int, int, int]]:
    """(phone, first frame, frames, score) from the two-pass alignment; raises RuntimeError on failure."""
    d = _decoder("forced")
    d.set_align_text(" ".join(words))
    d.start_utt()
    d.process_raw(pcm, full_utt=True)
    d.end_utt()
    if d.hyp() is None:  # the word pass found no path through the text (it does not fit the audio)
        raise RuntimeError("the word-level pass found no path through the transcript")
    # Second pass for phone boundaries. Note: calling hyp() after this pass crashes pocketsphinx 5.1.1
    # (segfault), so only get_alignment() is read from here on.
    d.set_alignment()
    d.start_utt()
    d.process_raw(pcm, full_utt=True)
    d.end_utt()
    alignment = d.get_alignment()
    if alignment is None:
        raise RuntimeError("no phone alignment came back")
    return [(p.name, int(p.start), int(p.duration), int(p.score)) for word in alignment for p in word]


def _phone_loop(pcm: bytes) -> list[tuple[str, int, int, None]]:
    d = _decoder("loop")
    d.start_utt()
    d.process_raw(pcm, full_utt=True)
    d.end_utt()
    return [(s.word, int(s.start_frame), int(s.end_frame) - int(s.start_frame) + 1, None) for s in d.seg()]


def _label(name: str) -> str:
    base = re.sub(r"\d", "", name).upper()
    return base if base in ARPABET_PHONES else SILENCE  # SIL, +NSN+, +SPN+, <sil>, ...


def _build(segments, n_frames: int, vad: np.ndarray, duration: float, method: str,
           reason: str) -> PhoneAlignment:
    """Phones on a gap-free grid plus the confidence (VAD-vs-aligned-speech IoU, see the docstring)."""
    labels = np.full(n_frames, SILENCE, dtype=object)
    fits = np.zeros(n_frames, dtype=bool)
    for name, start, frames, score in segments:
        lo, hi = max(0, start), min(n_frames, start + frames)
        if hi <= lo:
            continue
        lab = _label(name)
        labels[lo:hi] = lab
        if lab != SILENCE:
            fits[lo:hi] = score is None or score / frames >= FIT_SCORE_PER_FRAME
    speech = labels != SILENCE
    union = int(np.count_nonzero(vad | speech))
    if int(np.count_nonzero(vad)) < MIN_SPEECH_SECONDS * FRAMES_PER_SECOND:
        return _failure(_join(reason, f"too little speech ({np.count_nonzero(vad) / FRAMES_PER_SECOND:.2f} s "
                                      f"voiced by the VAD, need {MIN_SPEECH_SECONDS} s)"), duration)
    if not speech.any():
        return _failure(_join(reason, f"{method}: no phones recognised (only silence or noise)"), duration)
    confidence = int(np.count_nonzero(vad & fits)) / union if union else 0.0
    if confidence < MIN_CONFIDENCE:
        return _failure(_join(reason, f"{method}: confidence {confidence:.2f} < {MIN_CONFIDENCE} (the aligned "
                                      f"phones do not match where the VAD hears speech)"), duration)
    # Phones from the segments themselves (not from runs of equal labels: "bus stop" has two S in a row);
    # gaps become SIL and consecutive SILs merge, so the list tiles the audio.
    spans: list[list] = []
    cursor = 0
    for name, start, frames, _ in sorted(segments, key=lambda s: s[1]):
        lo, hi = max(cursor, start), min(n_frames, start + frames)
        if hi <= lo:
            continue
        if lo > cursor:
            spans.append([SILENCE, cursor, lo])
        spans.append([_label(name), lo, hi])
        cursor = hi
    if cursor < n_frames:
        spans.append([SILENCE, cursor, n_frames])
    merged: list[list] = []
    for span in spans:
        if merged and span[0] == SILENCE and merged[-1][0] == SILENCE:
            merged[-1][2] = span[2]
        else:
            merged.append(span)
    phones = [Phone(lab, lo / FRAMES_PER_SECOND, min(hi / FRAMES_PER_SECOND, duration)) for lab, lo, hi in merged]
    phones = [p for p in phones if p.end > p.start]
    return PhoneAlignment(phones=phones, confidence=round(confidence, 4), method=method, reason=reason,
                          duration=duration)


def _join(first: str, second: str) -> str:
    return f"{first}; {second}" if first else second


def align_phones(wave: np.ndarray, rate: int, text: str | None = None,
                 language: str = "en") -> PhoneAlignment:
    """Phone timings of `wave` (mono, or [channels, samples]; any rate). See the module docstring.

    Never raises on ordinary audio: anything that cannot be aligned comes back as method "none" with
    confidence 0 and a reason, and the caller keeps its audio features.
    """
    lang = (language or "").strip().lower()
    if lang.startswith("zh") or lang in {"cmn", "mandarin", "chinese"}:
        return _failure("no Mandarin aligner: no permissively licensed Mandarin acoustic model ships inside a "
                        "PyPI wheel (pocketsphinx's wheel has US English only); Mandarin audio keeps the "
                        "audio features")
    if lang not in _ENGLISH:
        return _failure(f"no aligner for language {language!r}: pocketsphinx's wheel ships a US-English "
                        f"model only")
    missing = aligner_available()
    if missing:
        return _failure(missing)
    w, problem = _to_pcm16(wave, rate)
    duration = float(w.size) / RATE if w.ndim == 1 and w.size and problem is None else 0.0
    if problem:
        return _failure(problem, duration)
    if duration < 0.1:
        return _failure(f"audio too short to align ({duration:.3f} s)", duration)
    pcm = (np.clip(w, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
    n_frames = int(np.ceil(duration * FRAMES_PER_SECOND))
    with _lock:
        vad = _vad_frames(pcm, n_frames)
        reason = ""
        if text is not None and text.strip():
            try:
                words, oov = _words(text, _decoder("forced"))
            except RuntimeError as exc:
                _decoders.pop("forced", None)
                return _failure(f"pocketsphinx failed to load: {exc}", duration)
            if not words:
                reason = "forced alignment not used: the transcript has no English words"
            elif oov:
                reason = f"forced alignment not used: not in the dictionary: {' '.join(sorted(set(oov)))}"
            else:
                try:
                    result = _build(_forced(pcm, words), n_frames, vad, duration, "forced", "")
                except RuntimeError as exc:  # pocketsphinx reports a failed search this way
                    _decoders.pop("forced", None)
                    result = _failure(f"forced: {exc}", duration)
                if result.ok:
                    return result
                reason = "forced alignment failed: " + result.reason.removeprefix("forced: ")
        try:
            return _build(_phone_loop(pcm), n_frames, vad, duration, "phone-loop", reason)
        except RuntimeError as exc:
            _decoders.pop("loop", None)
            return _failure(_join(reason, f"phone-loop: {exc}"), duration)
