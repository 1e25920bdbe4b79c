"""v8 (the main branch's fit) on issue-36 range clips, measured with the v9 listener estimator (loaded by path)."""
import importlib.util, json, sys, time
import numpy as np
spec = importlib.util.spec_from_file_location("v9pitch", "/work/wt-voice/voice/pitch.py")
v9 = importlib.util.module_from_spec(spec); spec.loader.exec_module(v9)
import digital_human
assert digital_human.__file__.startswith("/tmp/voice/v8tree"), digital_human.__file__
from digital_human.audio import decode_audio, prepare_reference
from digital_human.voice.clone import fit_voice
from digital_human.voice.formant import formant_shift
from digital_human.voice.speaker import extract_speaker_profile
from digital_human.voice.tts import synthesize_speech
TEXT = {"en": "The old lighthouse keeper wrote a letter to his daughter every winter evening. Fresh bread and warm soup were waiting for everyone who helped in the garden.",
        "zh": "今天天气很好，我们一起去公园散步吧。他每天晚上都会给家里打电话，问问父母的身体怎么样。"}
CLIPS = {"zh_male_shifted_166": ("audio/spk_zh_male_01.wav", "zh", 166.0), "en_male_deep_shifted_85": ("audio/spk_en_male_04_bilingual.m4a", "en", 85.0),
         "en_male_ng_talk_01a": ("video/talk_en_male_01a.mp4", "en", None)}
def ref_pitch(p):
    f0 = np.concatenate([v9.listener_f0(p.waveform[a:b], p.sample_rate) for a, b in p.segments])
    return float(np.median(f0))
out = []
for name in sys.argv[1:]:
    rel, lang, tgt = CLIPS[name]
    w, r = decode_audio("/work/shared/data/" + rel, max_seconds=25.0)
    p = prepare_reference(w, r, source=name, min_speech_seconds=3.0)
    factor = None
    if tgt:
        factor = tgt / ref_pitch(p)
        p = prepare_reference(formant_shift(p.waveform, p.sample_rate, factor), p.sample_rate, source=name, min_speech_seconds=3.0)
    prof = extract_speaker_profile(p, cache=False)
    t = time.perf_counter()
    fitted, res = fit_voice(prof, seed=0, language=lang, reference=p)
    sp = synthesize_speech(TEXT[lang], fitted).waveform
    spk, cl = ref_pitch(p), v9.listener_median_f0(sp, 24000)
    row = dict(clip=name, shift_factor=factor, speaker_f0=spk, clone_f0=cl, f0_error=cl / spk - 1, speaker_f0_pyin_profile=prof.pitch_hz_median,
               base_voice=res.base_voice, f0_scale=res.f0_scale, formant_scale=res.formant_scale, fit_seconds=time.perf_counter() - t)
    print(json.dumps(row), flush=True); out.append(row)
json.dump({"fit": "v8 (commit 25619b1)", "measured_by": "v9 voice/pitch.py listener_median_f0", "clips": out}, open("/tmp/voice/runs/v8_range.json", "w"), indent=1)
