"""CosyVoice 3 parity: the reference code (FunAudioLLM/CosyVoice, Fun-CosyVoice3-0.5B) vs this pack.

Same two-step scheme as tools/cosyvoice_parity.py (CosyVoice 2):
1. `reference` runs INSIDE a venv that can import the reference checkout (torch, transformers,
   hyperpyyaml, omegaconf, einops, x-transformers 2.11.24 as the reference pins, scipy). It builds the
   reference's CosyVoice3LM / CausalMaskedDiffWithDiT / CausalHiFTGenerator from the example cosyvoice3.yaml
   (`--size full`: the released architecture; `reduced`: narrower, same layout), fills them with seeded
   random weights (engines/cosyvoice/random_weights.py; the rotary `inv_freq` buffer keeps its computed
   values), saves llm.pt / flow.pt / hift.pt, and records:
     LM: greedy decoding (argmax over the speech tokens) with every step's log-probabilities, and the
         sampled tokens of the reference's own inference() for a seed;
     flow: mel from given tokens, prompt tokens, prompt mel and x-vector;
     HiFT: waveform from that mel (the causal HiFT is deterministic: fixed construction-time noise, whose
         first samples are recorded too); end to end: sampled tokens -> flow -> HiFT;
     prompt mel (fmax 12 kHz) of a test signal.
2. `compare` (the pack's environment) loads the folder through the pack's strict loader and prints max
   |difference| per stage; fails above --tol.

    /tmp/cosy3-venv/bin/python tools/cosyvoice3_parity.py reference --ref /tmp/cosy3ref --size full --out /tmp/cv3-full
    python tools/cosyvoice3_parity.py compare --dir /tmp/cv3-full
    /tmp/cosy3-venv/bin/python tools/cosyvoice3_parity.py reference --ref /tmp/cosy3ref --size reduced \
        --out /tmp/cv3-reduced --fixture tests/fixtures/cosyvoice/reduced_v3.npz
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cosyvoice_parity import QWEN_FULL, pack_parent  # noqa: E402

# Reduced: narrower widths; the Qwen vocabulary stays full (CosyVoice3LM asserts <|endofprompt|> = 151646
# is in the text); its weights are rebuilt from the seed, so the fixture holds no weights.
QWEN_REDUCED = dict(QWEN_FULL, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_window_layers=2)
REDUCTIONS = [(r"llm_input_size: 896", "llm_input_size: 64"), (r"llm_output_size: 896", "llm_output_size: 64"),
              (r"speech_token_size: 6561", "speech_token_size: 100"), (r"vocab_size: 6561", "vocab_size: 100"),
              (r"channels: 1024", "channels: 64"), (r"dim: 1024", "dim: 64"), (r"depth: 22", "depth: 2"),
              (r"heads: 16", "heads: 2"), (r"dim_head: 64", "dim_head: 32"),
              (r"base_channels: 512", "base_channels: 32"), (r"cond_channels: 512", "cond_channels: 32")]
SEEDS = {"weights": 1234, "inputs": 7, "lm": 2024}
ENDOFPROMPT = 151646
GREEDY_STEPS = 24


def model_yaml(ref: Path, size: str) -> str:
    text = (ref / "examples/libritts/cosyvoice3/conf/cosyvoice3.yaml").read_text()
    text = text.split("# gan related module")[0]
    if size == "reduced":
        for pattern, repl in REDUCTIONS:
            text, n = re.subn(pattern, repl, text)
            if n != 1:
                raise SystemExit(f"reduction '{pattern}' matched {n} times; the reference yaml changed")
    return text


def make_inputs(speech: int, text_tokens: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEEDS["inputs"])
    t = np.linspace(0, 0.5, 12000, endpoint=False)
    prompt_text = rng.integers(0, 150000, (1, 6)).astype(np.int32)
    prompt_text[0, 3] = ENDOFPROMPT  # "You are a helpful assistant.<|endofprompt|>" + transcript, in short
    return {
        "lm_text": rng.integers(0, 150000, (1, text_tokens)).astype(np.int32),
        "lm_prompt_text": prompt_text,
        "lm_prompt_speech": rng.integers(0, speech, (1, 15)).astype(np.int32),
        "flow_token": rng.integers(0, speech, (1, 30)).astype(np.int32),
        "flow_prompt_token": rng.integers(0, speech, (1, 10)).astype(np.int32),
        "flow_prompt_feat": (rng.standard_normal((1, 20, 80)) * 2 - 5).astype(np.float32),
        "flow_embedding": rng.standard_normal((1, 192)).astype(np.float32),
        "audio24k": (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)[None],
    }


def _stub_reference_imports(ref: Path) -> None:
    """Modules the model classes import but never call here (no builds for this torch, or heavy stacks)."""
    import logging

    import transformers  # noqa: F401 - before the torchaudio stand-in: transformers probes torchaudio's spec
    if "torchaudio" not in sys.modules:
        ta, comp, kaldi = (types.ModuleType(n) for n in ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"))
        ta.compliance, comp.kaldi = comp, kaldi
        sys.modules.update({"torchaudio": ta, "torchaudio.compliance": comp, "torchaudio.compliance.kaldi": kaldi})
    utils = types.ModuleType("matcha.utils")
    utils.__path__ = [str(ref / "third_party/Matcha-TTS/matcha/utils")]
    pylogger = types.ModuleType("matcha.utils.pylogger")
    pylogger.get_pylogger = logging.getLogger
    sys.modules.update({"matcha.utils": utils, "matcha.utils.pylogger": pylogger})
    if "onnxruntime" not in sys.modules:
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            sys.modules["onnxruntime"] = types.ModuleType("onnxruntime")


def run_reference(args: argparse.Namespace) -> None:
    import torch

    ref = Path(args.ref).resolve()
    sys.path[:0] = [str(ref), str(ref / "third_party/Matcha-TTS"), pack_parent()]
    _stub_reference_imports(ref)
    import transformers
    from hyperpyyaml import load_hyperpyyaml

    from digital_human.engines.cosyvoice.random_weights import seeded_tensor

    out = Path(args.out)
    release = out / "release"
    blank = release / "CosyVoice-BlankEN"
    blank.mkdir(parents=True, exist_ok=True)
    qwen = QWEN_FULL if args.size == "full" else QWEN_REDUCED
    (blank / "config.json").write_text(json.dumps(qwen, indent=1))
    text = model_yaml(ref, args.size)
    (release / "cosyvoice3.yaml").write_text(text)

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
        with torch.no_grad():
            for key, value in own.items():
                if key.endswith("inv_freq"):
                    continue  # the rotary table keeps its computed values (a buffer in the checkpoint)
                value.copy_(seeded_tensor(key, shapes[key], SEEDS["weights"]))
        module.eval()
        manifest[name] = {k: list(s) for k, s in shapes.items()}
        if not args.fixture:
            torch.save(module.state_dict(), release / f"{name}.pt")
    llm, flow, hift = configs["llm"], configs["flow"], configs["hift"]
    if not args.fixture:
        from digital_human.engines.cosyvoice.random_release3 import write_support_files3
        write_support_files3(release, qwen, speech_vocab=llm.speech_token_size)
    inputs = make_inputs(llm.speech_token_size, 4 if args.size == "full" else 8)
    print("weights ready, running the reference stages", flush=True)
    T = lambda a: torch.from_numpy(a)  # noqa: E731
    n = lambda a: torch.tensor([a.shape[1]], dtype=torch.int32)  # noqa: E731
    outputs: dict[str, np.ndarray] = {}
    timings = {}

    # LM, greedy: the reference's own input assembly and one-step forward, argmax over the speech tokens
    start = time.perf_counter()
    with torch.inference_mode():
        text_all = torch.cat([T(inputs["lm_prompt_text"]), T(inputs["lm_text"])], dim=1)
        sts = llm.speech_token_size
        lm_input = torch.cat([llm.speech_embedding.weight[llm.sos].reshape(1, 1, -1),
                              llm.llm.model.model.embed_tokens(text_all.long()),
                              llm.speech_embedding.weight[llm.task_id].reshape(1, 1, -1),
                              llm.speech_embedding(T(inputs["lm_prompt_speech"]).long())], dim=1)
        cache, rows, greedy = None, [], []
        for _ in range(GREEDY_STEPS):
            masks = torch.tril(torch.ones((1, lm_input.shape[1], lm_input.shape[1]), dtype=torch.bool))
            y, cache = llm.llm.forward_one_step(lm_input, masks=masks, cache=cache)
            logp = llm.llm_decoder(y[:, -1]).log_softmax(dim=-1)[0]
            rows.append(logp.clone())
            token = int(logp[:sts].argmax())
            greedy.append(token)
            lm_input = llm.speech_embedding.weight[token].reshape(1, 1, -1)
    timings["lm_greedy_s"] = time.perf_counter() - start
    outputs["lm_greedy_tokens"] = np.array(greedy, dtype=np.int64)
    outputs["lm_greedy_logp"] = torch.stack(rows).numpy()

    torch.manual_seed(SEEDS["lm"])
    with torch.inference_mode():
        sampled = list(llm.inference(text=T(inputs["lm_text"]), text_len=n(inputs["lm_text"]),
                                     prompt_text=T(inputs["lm_prompt_text"]), prompt_text_len=n(inputs["lm_prompt_text"]),
                                     prompt_speech_token=T(inputs["lm_prompt_speech"]),
                                     prompt_speech_token_len=n(inputs["lm_prompt_speech"]),
                                     embedding=torch.zeros(0, 192)))
    outputs["lm_tokens"] = np.array(sampled, dtype=np.int64)

    def vocode(tokens: torch.Tensor, prompt_token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.inference_mode():
            mel, _ = flow.inference(token=tokens, token_len=n(tokens.numpy()), prompt_token=prompt_token,
                                    prompt_token_len=n(prompt_token.numpy()), prompt_feat=T(inputs["flow_prompt_feat"]),
                                    prompt_feat_len=n(inputs["flow_prompt_feat"]), embedding=T(inputs["flow_embedding"]),
                                    streaming=False, finalize=True)
            wave, _ = hift.inference(speech_feat=mel, finalize=True)
        return mel, wave

    start = time.perf_counter()
    mel, wave = vocode(T(inputs["flow_token"]), T(inputs["flow_prompt_token"]))
    timings["flow_hift_s"] = time.perf_counter() - start
    outputs["flow_mel"], outputs["hift_wave"] = mel.numpy(), wave.numpy()
    if len(sampled):
        e2e_mel, e2e_wave = vocode(torch.tensor([sampled], dtype=torch.int32), T(inputs["flow_prompt_token"]))
        outputs["e2e_wave"] = e2e_wave.numpy()
    gen = hift.m_source.l_sin_gen
    outputs["noise_start"] = gen.rand_ini.numpy()
    outputs["noise_sine_head"] = gen.sine_waves[:, :2000].numpy()
    outputs["noise_sine_tail"] = gen.sine_waves[:, -50:].numpy()
    outputs["noise_branch_tail"] = hift.m_source.uv[:, -50:].numpy()
    from matcha.utils.audio import mel_spectrogram
    outputs["prompt_mel"] = mel_spectrogram(T(inputs["audio24k"]), n_fft=1920, num_mels=80, sampling_rate=24000,
                                            hop_size=480, win_size=1920, fmin=0, fmax=None,
                                            center=False).transpose(1, 2).numpy()
    meta = {"size": args.size, "seeds": SEEDS, "manifest": manifest, "qwen_config": qwen, "yaml": text,
            "timings": timings, "torch": torch.__version__, "transformers": transformers.__version__}
    target = Path(args.fixture) if args.fixture else out / "reference.npz"
    target.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(target, meta=np.array(json.dumps(meta)), **{f"in_{k}": v for k, v in inputs.items()},
                        **{f"out_{k}": v for k, v in outputs.items()})
    print(f"reference: greedy {greedy[:8]}..., sampled {len(sampled)} tokens, mel {tuple(mel.shape)}, "
          f"wave {tuple(wave.shape)}, {timings} -> {target}")


def run_compare(args: argparse.Namespace) -> None:
    sys.path.insert(0, pack_parent())
    from digital_human.engines.cosyvoice.parity3 import compare, write_release_from_fixture

    folder = Path(args.dir)
    data = np.load(folder / "reference.npz" if folder.is_dir() else folder, allow_pickle=False)
    release = folder / "release" if folder.is_dir() else write_release_from_fixture(data, Path(args.work))
    start = time.perf_counter()
    result = compare(data, release)
    result["pack_seconds"] = time.perf_counter() - start
    print(json.dumps(result, indent=1))
    bad = [k for k in ("lm_logp_max_abs", "prompt_mel_max_abs", "noise_max_abs") if not result[k] <= args.tol]
    bad += [k for k in ("flow_mel_rel", "hift_wave_rel", "e2e_wave_rel") if k in result and not result[k] <= args.tol]
    if bad or result["lm_greedy_mismatches"] or result["lm_sampled_mismatches"]:
        raise SystemExit(f"parity FAILED: {bad or 'tokens differ'}")
    print("parity OK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reference")
    r.add_argument("--ref", required=True)
    r.add_argument("--size", choices=["full", "reduced"], default="reduced")
    r.add_argument("--out", required=True)
    r.add_argument("--fixture", default="")
    c = sub.add_parser("compare")
    c.add_argument("--dir", required=True, help="a reference output folder, or a fixture .npz")
    c.add_argument("--work", default="/tmp/cv3-fixture-release")
    c.add_argument("--tol", type=float, default=1e-4)
    args = parser.parse_args()
    {"reference": run_reference, "compare": run_compare}[args.cmd](args)


if __name__ == "__main__":
    main()
