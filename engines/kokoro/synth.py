"""Kokoro-82M inference: phoneme token ids + style vector + speed -> 24 kHz waveform.

The graph's inputs (read from kokoro-v1.0.int8.onnx): `tokens` int64 [1, N+2], `style` float32
[1, 256], `speed` float32 [1]; output `audio` float32 [T]. The pack's graphs (controls.py) add the
input `f0_scale` [1] and the output `durations` float32 [1, N+2] (frames of DURATION_HOP samples per
token, pads included). The text frontend turns text into a phoneme string; `tokens_from_phonemes`
maps it through Kokoro's vocabulary.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from ..spec import ModelSpec, TensorProfile

MAX_PHONEME_TOKENS = 510  # Kokoro's context is 512 positions, two of them the 0 pads
STYLE_DIM = 256
INPUT_NAMES = ("tokens", "style", "speed", "f0_scale")
OUTPUT_NAMES = ("audio", "durations")

RunFn = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


def tokens_from_phonemes(phonemes: str, vocab: Mapping[str, int]) -> list[int]:
    """Map every phoneme character to its id; unknown characters are an error, not silently dropped."""
    unknown = sorted({c for c in phonemes if c not in vocab})
    if unknown:
        raise ValueError(
            f"phonemes contain characters outside Kokoro's vocabulary: {unknown!r}; "
            "the text frontend must map or drop them"
        )
    return [vocab[c] for c in phonemes]


def style_for(voice: np.ndarray, n_tokens: int) -> np.ndarray:
    """Style vector [1, 256] for an utterance of `n_tokens` phonemes (pads not counted).

    A Kokoro voice pack holds one style per utterance length (row i is for i+1 phonemes), as the
    reference implementation indexes it with `pack[len(phonemes) - 1]`.
    """
    pack = np.asarray(voice, dtype=np.float32)
    if pack.ndim == 1:  # a single style vector (e.g. one found by voice imitation)
        pack = pack[None]
    pack = pack.reshape(pack.shape[0], -1)
    if pack.shape[1] != STYLE_DIM:
        raise ValueError(f"voice must be [rows, {STYLE_DIM}] (or [rows, 1, {STYLE_DIM}]), got {np.shape(voice)}")
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    row = min(n_tokens, pack.shape[0]) - 1
    return pack[row : row + 1].copy()


def kokoro_model_spec(kind: str = "fp32") -> ModelSpec:
    """ModelSpec for the loader. "fp32": the rewritten float graph (GPU/TensorRT/torch; the int8 graph
    is offered as the CPU variant); "int8": the shipped graph only (ONNX Runtime CPU)."""
    if kind not in ("int8", "fp32"):
        raise ValueError(f"kind must be 'int8' or 'fp32', got '{kind}'")
    if kind == "int8":
        onnx_path, cpu_path = int8_control_graph(), None
    else:
        from .graph_rewrite import float_graph
        from .torch_port import kokoro_torch_module

        onnx_path, cpu_path = float_graph(), int8_control_graph()
    n_max = MAX_PHONEME_TOKENS + 2
    return ModelSpec(
        name=f"kokoro-82m-{kind}",
        onnx_path=onnx_path,
        cpu_onnx_path=cpu_path,
        profiles={
            "tokens": TensorProfile(min=(1, 3), opt=(1, 128), max=(1, n_max)),
            "style": TensorProfile(min=(1, STYLE_DIM), opt=(1, STYLE_DIM), max=(1, STYLE_DIM)),
            "speed": TensorProfile(min=(1,), opt=(1,), max=(1,)),
            "f0_scale": TensorProfile(min=(1,), opt=(1,), max=(1,)),
        },
        # int64 ids never change with precision; speed scales every predicted duration
        fp32_inputs=("tokens", "speed", "f0_scale"),
        fp16_mode="autocast",  # the harmonic source integrates phase: keep that part in FP32
        cuda_graphs=False,  # output length depends on predicted durations
        torch_auto_precision="fp32",  # H200: eager FP32 RTF 0.013 vs FP16 autocast 0.018 (launch-bound)
        # plain onnx2torch.convert stops at opset ~17; this adds the opset-20 converters Kokoro needs
        torch_factory=kokoro_torch_module if kind == "fp32" else None,
        input_names=INPUT_NAMES,
        output_names=OUTPUT_NAMES,
    )


def int8_control_graph() -> Path:
    """The shipped int8 graph plus the pitch control input (controls.py), cached next to it."""
    from .assets import kokoro_assets
    from .controls import controlled_copy

    assets = kokoro_assets()
    return controlled_copy(assets.int8_onnx, assets.int8_onnx.with_name("kokoro-v1.0.int8.ctl.onnx"), assets.sha256)


def model_inputs(token_ids: list[int], style: np.ndarray, speed: float, f0_scale: float = 1.0) -> dict[str, np.ndarray]:
    """Validated graph feeds: tokens padded with 0 at both ends, as Kokoro was trained."""
    ids = [int(t) for t in token_ids]
    if not ids:
        raise ValueError("token_ids is empty: nothing to synthesize")
    if len(ids) > MAX_PHONEME_TOKENS:
        raise ValueError(
            f"token_ids has {len(ids)} phoneme tokens; Kokoro takes at most {MAX_PHONEME_TOKENS} per call - "
            "split the text into shorter chunks (sentences) first"
        )
    if min(ids) < 0:
        raise ValueError("token_ids must be non-negative vocabulary ids")
    style = np.asarray(style, dtype=np.float32).reshape(1, -1)
    if style.shape[1] != STYLE_DIM:
        raise ValueError(f"style must have {STYLE_DIM} values, got {style.shape[1]} (use style_for(voice, n))")
    if not (0.5 <= float(f0_scale) <= 2.0):  # an octave either way; beyond, the vocoder breaks down
        raise ValueError(f"f0_scale must be within 0.5..2.0, got {f0_scale}")
    if not (0.25 <= float(speed) <= 4.0):  # beyond this the duration predictor output is meaningless
        raise ValueError(f"speed must be within 0.25..4.0, got {speed}")
    return {
        "tokens": np.array([[0, *ids, 0]], dtype=np.int64),
        "style": np.ascontiguousarray(style),
        "speed": np.array([speed], dtype=np.float32),
        "f0_scale": np.array([f0_scale], dtype=np.float32),
    }


def synthesize(token_ids: list[int], style: np.ndarray, speed: float, run_fn: RunFn,
               f0_scale: float = 1.0) -> np.ndarray:
    """Float32 mono waveform at 24 kHz. `run_fn` is a loader runner (or any feeds -> outputs callable)."""
    return synthesize_timed(token_ids, style, speed, run_fn, f0_scale)[0]


def synthesize_timed(token_ids: list[int], style: np.ndarray, speed: float, run_fn: RunFn,
                     f0_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray | None]:
    """(waveform, durations): durations float32 [N+2], frames of DURATION_HOP samples per token in
    the order the graph saw them: the leading pad (the silence before speech), the N token ids, the
    trailing pad. None when the graph has no durations output (the shipped graph)."""
    out = run_fn(model_inputs(token_ids, style, speed, f0_scale))
    audio = out["audio"] if isinstance(out, Mapping) else out[0]
    wave = np.asarray(audio, dtype=np.float32).reshape(-1)
    dur = out.get("durations") if isinstance(out, Mapping) else (out[1] if len(out) > 1 else None)
    if dur is None:
        return wave, None
    return wave, np.asarray(dur, dtype=np.float32).reshape(-1)


def ort_cpu_runner(onnx_path, threads: int = 2) -> RunFn:
    """Direct ONNX Runtime CPU session (tests/benchmarks; the pack itself goes through engines.loader)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(str(onnx_path), sess_options=opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    accepted = {i.name for i in session.get_inputs()}

    def run(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        # the shipped graph has no f0_scale input (controls.py adds it): feed only what it declares
        return dict(zip(names, session.run(None, {k: v for k, v in feeds.items() if k in accepted})))

    return run
