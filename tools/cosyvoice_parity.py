"""CosyVoice 2 parity: the reference code (FunAudioLLM/CosyVoice) vs this pack, stage by stage.

Two steps, two Python environments (the reference's dependencies never enter the pack's):

1. `reference` runs INSIDE a venv that can import the reference checkout (torch, transformers,
   diffusers, hyperpyyaml, omegaconf, einops, conformer, librosa, scipy). It builds the reference's
   LLM / flow / HiFT from a cosyvoice2.yaml (`--size full`: the released architecture; `--size
   reduced`: the same architecture, narrower), fills them with seeded random weights
   (engines/cosyvoice/random_weights.py), saves llm.pt / flow.pt / hift.pt in the release's format,
   and records inputs and outputs of every stage in reference.npz:
     LM: log-probabilities of every decode step and the sampled tokens (same seed),
     flow: output mel from given tokens, prompt tokens, prompt mel and x-vector,
     HiFT: waveform from that mel with a given seed, prompt mel features of a test signal.
2. `compare` runs in the pack's environment: loads the release folder through the pack's strict
   loader, runs the same inputs and prints max |difference| per stage (fails above --tol).

    /tmp/cv-ref-venv/bin/python tools/cosyvoice_parity.py reference --ref /tmp/cosyvoice-ref --size full --out /tmp/cv-full
    python tools/cosyvoice_parity.py compare --dir /tmp/cv-full
    # fixtures for CI (weights are rebuilt from the seed, so only inputs/outputs are stored):
    /tmp/cv-ref-venv/bin/python tools/cosyvoice_parity.py reference --ref /tmp/cosyvoice-ref --size reduced \
        --out /tmp/cv-reduced --fixture tests/fixtures/cosyvoice/reduced.npz
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
import types
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]  # the repository root is the package `digital_human`


def pack_parent() -> str:
    """A folder whose `digital_human` entry is this checkout (it may be named otherwise on disk)."""
    if REPO.name == "digital_human":
        return str(REPO.parent)
    import tempfile
    parent = Path(tempfile.mkdtemp(prefix="cv-pack-"))
    (parent / "digital_human").symlink_to(REPO)
    return str(parent)

QWEN_FULL = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
             "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
             "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "tie_word_embeddings": True,
             "hidden_act": "silu", "use_sliding_window": False, "sliding_window": 32768,
             "max_window_layers": 21, "attention_dropout": 0.0, "torch_dtype": "bfloat16",
             "bos_token_id": 151643, "eos_token_id": 151643}
QWEN_REDUCED = dict(QWEN_FULL, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=1000, max_window_layers=2, bos_token_id=0, eos_token_id=0)
# Narrower widths, same architecture (the flow encoder stays 512 wide: the reference hard-codes it).
REDUCTIONS = [(r"llm_input_size: 896", "llm_input_size: 64"), (r"llm_output_size: 896", "llm_output_size: 64"),
              (r"speech_token_size: 6561", "speech_token_size: 100"), (r"vocab_size: 6561", "vocab_size: 100"),
              (r"linear_units: 2048", "linear_units: 64"), (r"num_blocks: 6", "num_blocks: 1"),
              (r"channels: \[256\]", "channels: [64]"), (r"n_blocks: 4", "n_blocks: 1"),
              (r"num_mid_blocks: 12", "num_mid_blocks: 1"), (r"num_heads: 8", "num_heads: 2"),
              (r"attention_head_dim: 64", "attention_head_dim: 32"), (r"base_channels: 512", "base_channels: 32"),
              (r"cond_channels: 512", "cond_channels: 32")]
SEEDS = {"weights": 1234, "inputs": 7, "lm": 2024, "hift": 99}


def model_yaml(ref: Path, size: str) -> str:
    """The model sections of the reference's cosyvoice2.yaml (training sections need extra packages)."""
    text = (ref / "examples/libritts/cosyvoice2/conf/cosyvoice2.yaml").read_text()
    text = text.split("# gan related module")[0]
    if size == "reduced":
        for pattern, repl in REDUCTIONS:
            text, n = re.subn(pattern, repl, text)
            if n != 1:
                raise SystemExit(f"reduction '{pattern}' matched {n} times; the reference yaml changed")
    return text


def make_inputs(cfg: dict, qwen: dict, text_tokens: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEEDS["inputs"])
    vocab, speech = qwen["vocab_size"], cfg["speech_token_size"]
    t = np.linspace(0, 0.5, 12000, endpoint=False)
    return {
        "lm_text": rng.integers(0, vocab, (1, text_tokens)).astype(np.int32),
        "lm_prompt_text": rng.integers(0, vocab, (1, 5)).astype(np.int32),
        "lm_prompt_speech": rng.integers(0, speech, (1, 15)).astype(np.int32),
        "flow_token": rng.integers(0, speech, (1, 30)).astype(np.int32),
        "flow_prompt_token": rng.integers(0, speech, (1, 10)).astype(np.int32),
        "flow_prompt_feat": (rng.standard_normal((1, 20, 80)) * 2 - 5).astype(np.float32),
        "flow_embedding": rng.standard_normal((1, 192)).astype(np.float32),
        "audio24k": (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)[None],
    }


# --- step 1: reference ------------------------------------------------------------------------------
def run_reference(args: argparse.Namespace) -> None:
    import torch

    ref = Path(args.ref).resolve()
    sys.path[:0] = [str(ref), str(ref / "third_party/Matcha-TTS"), pack_parent()]
    import transformers  # before the torchaudio stand-in below: transformers probes torchaudio's spec
    # torchaudio is imported by an ONNX helper module the model classes never call; no build for torch 2.13.
    if "torchaudio" not in sys.modules:
        ta, comp, kaldi = (types.ModuleType(n) for n in ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"))
        ta.compliance, comp.kaldi = comp, kaldi
        sys.modules.update({"torchaudio": ta, "torchaudio.compliance": comp, "torchaudio.compliance.kaldi": kaldi})
    # matcha.utils/__init__ imports Matcha's training stack (lightning, hydra, ...); the model code only
    # needs its logger helper and audio module, so stand in for the package initialiser.
    import logging
    utils = types.ModuleType("matcha.utils")
    utils.__path__ = [str(ref / "third_party/Matcha-TTS/matcha/utils")]
    pylogger = types.ModuleType("matcha.utils.pylogger")
    pylogger.get_pylogger = logging.getLogger
    sys.modules.update({"matcha.utils": utils, "matcha.utils.pylogger": pylogger})
    from hyperpyyaml import load_hyperpyyaml

    from digital_human.engines.cosyvoice.random_weights import seeded_tensor

    out = Path(args.out)
    release = out / "release"
    blank = release / "CosyVoice-BlankEN"
    blank.mkdir(parents=True, exist_ok=True)
    qwen = QWEN_FULL if args.size == "full" else QWEN_REDUCED
    (blank / "config.json").write_text(json.dumps(qwen, indent=1))
    text = model_yaml(ref, args.size)
    (release / "cosyvoice2.yaml").write_text(text)

    # The blank Qwen2 weights are overwritten by llm.pt; build it from its config instead of a 1 GB file.
    def from_config(cls, path, *a, **k):
        config = transformers.Qwen2Config.from_pretrained(path)
        config._attn_implementation = "sdpa"
        return cls(config)
    transformers.Qwen2ForCausalLM.from_pretrained = classmethod(from_config)
    configs = load_hyperpyyaml(text, overrides={"qwen_pretrain_path": str(blank)})
    manifest = {}
    for name in ("llm", "flow", "hift"):
        module = configs[name]
        own = module.state_dict()
        shapes = {k: tuple(v.shape) for k, v in own.items()}
        with torch.no_grad():  # one tensor at a time: the full-size LM alone is 2 GB
            for key, value in own.items():
                value.copy_(seeded_tensor(key, shapes[key], SEEDS["weights"]))
        module.eval()
        manifest[name] = {k: list(s) for k, s in shapes.items()}
        if not args.fixture:
            torch.save(module.state_dict(), release / f"{name}.pt")
    llm, flow, hift = configs["llm"], configs["flow"], configs["hift"]
    if not args.fixture:  # tokenizer, spk2info and random ONNX stand-ins complete the release folder
        from digital_human.engines.cosyvoice.random_release import write_support_files
        write_support_files(release, qwen, speech_vocab=llm.speech_token_size)
    # Full size: 4 text tokens cap the decode at 80 steps of the 0.5 B LM (CPU time).
    inputs = make_inputs({"speech_token_size": llm.speech_token_size}, qwen, 4 if args.size == "full" else 8)
    print("weights ready, running the reference stages", flush=True)
    T = lambda a: torch.from_numpy(a)  # noqa: E731
    n = lambda a: torch.tensor([a.shape[1]], dtype=torch.int32)  # noqa: E731
    outputs: dict[str, np.ndarray] = {}
    timings = {}

    raw_logits: list[torch.Tensor] = []
    hook = llm.llm_decoder.register_forward_hook(lambda m, i, o: raw_logits.append(o.detach().clone()))
    torch.manual_seed(SEEDS["lm"])
    start = time.perf_counter()
    with torch.inference_mode():
        tokens = list(llm.inference(text=T(inputs["lm_text"]), text_len=n(inputs["lm_text"]),
                                    prompt_text=T(inputs["lm_prompt_text"]), prompt_text_len=n(inputs["lm_prompt_text"]),
                                    prompt_speech_token=T(inputs["lm_prompt_speech"]),
                                    prompt_speech_token_len=n(inputs["lm_prompt_speech"]),
                                    embedding=torch.zeros(0, 192)))
    timings["lm_s"] = time.perf_counter() - start
    hook.remove()
    outputs["lm_tokens"] = np.array(tokens, dtype=np.int64)
    outputs["lm_logp"] = torch.cat(raw_logits).log_softmax(dim=-1).numpy()

    start = time.perf_counter()
    with torch.inference_mode():
        mel, _ = flow.inference(token=T(inputs["flow_token"]), token_len=n(inputs["flow_token"]),
                                prompt_token=T(inputs["flow_prompt_token"]), prompt_token_len=n(inputs["flow_prompt_token"]),
                                prompt_feat=T(inputs["flow_prompt_feat"]), prompt_feat_len=n(inputs["flow_prompt_feat"]),
                                embedding=T(inputs["flow_embedding"]), streaming=False, finalize=True)
    timings["flow_s"] = time.perf_counter() - start
    outputs["flow_mel"] = mel.numpy()
    torch.manual_seed(SEEDS["hift"])
    start = time.perf_counter()
    with torch.inference_mode():
        wave, _ = hift.inference(speech_feat=mel)
    timings["hift_s"] = time.perf_counter() - start
    outputs["hift_wave"] = wave.numpy()
    from matcha.utils.audio import mel_spectrogram
    outputs["prompt_mel"] = mel_spectrogram(T(inputs["audio24k"]), n_fft=1920, num_mels=80, sampling_rate=24000,
                                            hop_size=480, win_size=1920, fmin=0, fmax=8000,
                                            center=False).transpose(1, 2).numpy()
    meta = {"size": args.size, "seeds": SEEDS, "manifest": manifest, "qwen_config": qwen, "yaml": text,
            "timings": timings, "torch": torch.__version__, "transformers": transformers.__version__}
    target = Path(args.fixture) if args.fixture else out / "reference.npz"
    target.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(target, meta=np.array(json.dumps(meta)), **{f"in_{k}": v for k, v in inputs.items()},
                        **{f"out_{k}": v for k, v in outputs.items()})
    print(f"reference: {len(tokens)} tokens, mel {mel.shape}, wave {wave.shape}, {timings} -> {target}")


# --- step 2: this pack (engines/cosyvoice/parity.py) -----------------------------------------
def run_compare(args: argparse.Namespace) -> None:
    sys.path.insert(0, pack_parent())
    from digital_human.engines.cosyvoice.parity import compare, write_release_from_fixture

    folder = Path(args.dir)
    data = np.load(folder / "reference.npz" if folder.is_dir() else folder, allow_pickle=False)
    release = folder / "release" if folder.is_dir() else write_release_from_fixture(data, Path(args.work))
    start = time.perf_counter()
    result = compare(data, release)
    result["pack_seconds"] = time.perf_counter() - start
    print(json.dumps(result, indent=1))
    bad = [k for k in ("lm_logp_max_abs", "flow_mel_max_abs", "hift_wave_max_abs", "prompt_mel_max_abs")
           if not result[k] <= args.tol]
    if bad or result["lm_token_mismatches"]:
        raise SystemExit(f"parity FAILED: {bad or 'sampled tokens differ'}")
    print("parity OK")


def run_features(args: argparse.Namespace) -> None:
    """Front-end features vs their sources: Whisper's own log_mel_spectrogram (the package the reference
    frontend calls; `--whisper-src` = an unpacked openai-whisper sdist) and Kaldi fbank from
    kaldi-native-fbank (the reference calls torchaudio's Kaldi fbank, which has no build for torch 2.13 here)."""
    import torch

    sys.path.insert(0, pack_parent())
    from digital_human.engines.cosyvoice.features import kaldi_fbank, whisper_log_mel

    t = np.arange(16000 * 3) / 16000
    noise = np.random.default_rng(0).standard_normal(t.size)
    x = (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.02 * noise).astype(np.float32)
    result = {}
    if args.whisper_src:
        pkg = types.ModuleType("whisper")  # skip whisper/__init__ (model code, tiktoken); audio.py is enough
        pkg.__path__ = [str(Path(args.whisper_src) / "whisper")]
        sys.modules["whisper"] = pkg
        import whisper.audio as wa
        ref = wa.log_mel_spectrogram(torch.from_numpy(x)[None], n_mels=128)
        result["whisper_log_mel_max_abs"] = float((ref - whisper_log_mel(torch.from_numpy(x)[None])).abs().max())
    import kaldi_native_fbank as knf
    opts = knf.FbankOptions()
    opts.frame_opts.dither, opts.frame_opts.samp_freq, opts.mel_opts.num_bins = 0, 16000, 80
    fb = knf.OnlineFbank(opts)
    fb.accept_waveform(16000, x.tolist())
    fb.input_finished()
    ref = np.stack([fb.get_frame(i) for i in range(fb.num_frames_ready)])
    ref = ref - ref.mean(axis=0, keepdims=True)
    result["kaldi_fbank_max_abs"] = float(np.abs(ref - kaldi_fbank(torch.from_numpy(x)[None]).numpy()).max())
    result["kaldi_fbank_absmax"] = float(np.abs(ref).max())
    print(json.dumps(result, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reference")
    r.add_argument("--ref", required=True, help="reference checkout (FunAudioLLM/CosyVoice with third_party/Matcha-TTS)")
    r.add_argument("--size", choices=("full", "reduced"), default="full")
    r.add_argument("--out", required=True)
    r.add_argument("--fixture", help="write only inputs/outputs + manifest here (no weight files)")
    c = sub.add_parser("compare")
    c.add_argument("--dir", required=True, help="--out folder of the reference step, or a fixture .npz")
    c.add_argument("--work", default="/tmp/cosyvoice-fixture-release", help="where a fixture's release folder is rebuilt")
    c.add_argument("--tol", type=float, default=1e-4)
    f = sub.add_parser("features", help="front-end features vs Whisper's code and kaldi-native-fbank")
    f.add_argument("--whisper-src", help="unpacked openai-whisper source (the folder holding whisper/)")
    args = parser.parse_args()
    {"reference": run_reference, "compare": run_compare, "features": run_features}[args.cmd](args)


if __name__ == "__main__":
    main()
