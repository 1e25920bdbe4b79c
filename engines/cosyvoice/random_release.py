"""A random-weight `CosyVoice2-0.5B`-shaped folder for tests and the real-server check (no real weights).

`write_support_files` adds what is not a torch checkpoint: the Qwen2 config, a byte-level tokenizer
(256 byte tokens, no merges), an empty spk2info.pt, and two random ONNX graphs with the input/output
signature of the release's campplus.onnx (fbank [1, T, 80] -> embedding [1, 192]) and
speech_tokenizer_v2.onnx (log-mel [1, 128, T], length [1] -> tokens [1, ceil(T/4)]).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def _byte_vocab() -> dict[str, int]:
    """GPT-2 byte-to-unicode table: every byte is one printable character, hence one token."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = keep[:], 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): i for i, c in enumerate(chars)}


def write_tokenizer(folder: Path, eos_id: int) -> None:
    vocab = _byte_vocab()
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "model_max_length": 32768, "errors": "replace",
        "unk_token": None, "bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False}), encoding="utf-8")


def _save(graph, path: Path) -> None:
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # readable by every ONNX Runtime the pack supports (onnx's default may be newer)
    onnx.save(model, str(path))


def campplus_stand_in(path: Path, seed: int = 0) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weight = numpy_helper.from_array((rng.standard_normal((80, 192)) / 9).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["input"], ["pooled"], axes=[1], keepdims=0),
         helper.make_node("MatMul", ["pooled", "w"], ["output"])],
        "campplus_stand_in",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, "T", 80])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 192])], [weight])
    _save(graph, path)


def speech_tokenizer_stand_in(path: Path, vocab: int, seed: int = 1) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((128, vocab)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([0], np.int64), "start"),
             numpy_helper.from_array(np.array([2 ** 31 - 1], np.int64), "end"),
             numpy_helper.from_array(np.array([1], np.int64), "axis"),
             numpy_helper.from_array(np.array([4], np.int64), "step")]
    nodes = [helper.make_node("Transpose", ["feats"], ["ft"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["ft", "w"], ["scores"]),
             helper.make_node("ArgMax", ["scores"], ["ids"], axis=2, keepdims=0),
             helper.make_node("Slice", ["ids", "start", "end", "axis", "step"], ["picked"]),
             # the length input is part of the release's signature; fold it in as a no-op (x * 0 + ids)
             helper.make_node("Cast", ["feats_length"], ["len64"], to=TensorProto.INT64),
             helper.make_node("Mul", ["len64", "zero"], ["nothing"]),
             helper.make_node("Add", ["picked", "nothing"], ["indices"])]
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "zero"))
    graph = helper.make_graph(
        nodes, "speech_tokenizer_stand_in",
        [helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, "T"]),
         helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1])],
        [helper.make_tensor_value_info("indices", TensorProto.INT64, [1, "N"])], inits)
    _save(graph, path)


def write_support_files(folder: Path, qwen_config: dict, speech_vocab: int = 100) -> None:
    import torch

    blank = folder / "CosyVoice-BlankEN"
    blank.mkdir(parents=True, exist_ok=True)
    (blank / "config.json").write_text(json.dumps(qwen_config, indent=1))
    write_tokenizer(blank, int(qwen_config.get("eos_token_id", 0)))
    torch.save({}, folder / "spk2info.pt")
    campplus_stand_in(folder / "campplus.onnx")
    speech_tokenizer_stand_in(folder / "speech_tokenizer_v2.onnx", speech_vocab)


def write_random_release(folder: Path, yaml_text: str, qwen_config: dict, seed: int = 1234) -> Path:
    """A complete random-weight release folder for a cosyvoice2.yaml text and Qwen2 config (any size).

    The key -> shape manifest comes from this pack's own modules, built on the meta device (no memory,
    no initialisation), so no reference checkout is needed; weights are random_weights.seeded_state_dict
    (the same values the reference-side tool writes for the same names). For speed measurements and
    plumbing only: random weights say nothing about speech quality.
    """
    import torch

    from .flow import CausalFlow
    from .hift import HiFT
    from .lm import SpeechLM, qwen2_from_config
    from .random_weights import seeded_state_dict
    from .release import configs_from_yaml, read_config

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cosyvoice2.yaml").write_text(yaml_text)
    lm_cfg, flow_cfg, hift_cfg = configs_from_yaml(read_config(folder / "cosyvoice2.yaml"))
    write_support_files(folder, qwen_config, speech_vocab=flow_cfg.vocab_size)
    builders = {"llm": lambda: SpeechLM(qwen2_from_config(folder / "CosyVoice-BlankEN"), **lm_cfg),
                "flow": lambda: CausalFlow(flow_cfg), "hift": lambda: HiFT(hift_cfg)}
    for name, build in builders.items():
        try:
            with torch.device("meta"):
                module = build()
        except RuntimeError:  # a module that draws CPU tensors at construction: build it for real
            module = build()
        shapes = {k: tuple(v.shape) for k, v in module.state_dict().items()}
        del module
        torch.save(seeded_state_dict(shapes, seed), folder / f"{name}.pt")
    return folder
