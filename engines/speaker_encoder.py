"""GE2E speaker encoder (the weights Resemblyzer 0.1.4 ships, Apache-2.0), without Resemblyzer.

Resemblyzer cannot be a runtime dependency (it imports webrtcvad, which must be compiled), so this
module re-implements the parts we use and matches its maths:
- front end: librosa mel *power* spectrogram (not log), 16 kHz, 25 ms Hann window, 10 ms hop,
  40 Slaney mel bands; input volume raised (never lowered) to -30 dBFS first;
- partial utterances of 160 frames (1.6 s) at 1.3 per second, the last one kept only when it
  covers >= 75 % of a window (zero padded);
- network: 3-layer LSTM 40->256, Linear 256->256, ReLU, L2 norm of the last hidden state;
- utterance embedding: L2-normalised mean of the partial embeddings.
Resemblyzer's webrtcvad silence trimming is *not* reproduced: our audio preparation already cuts
the clip into speech segments.

Files under `model_dir("speaker_encoder")` (written by `install_ge2e_weights`, i.e. by
`python -m digital_human setup`): `ge2e.safetensors` (weights) and `ge2e.onnx` (mels [B, T, 40]
-> embedding [B, 256], dynamic B and T), built directly with onnx.helper so no exporter version
matters.
"""
from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from ..atomic_file import write_bytes_atomic
from ..paths import model_dir

log = logging.getLogger(__name__)

# --- hyper-parameters (Resemblyzer hparams.py) -------------------------------------------------
SAMPLE_RATE = 16000
N_FFT = 400  # 25 ms
HOP = 160  # 10 ms
N_MELS = 40
PARTIAL_FRAMES = 160  # 1.6 s per partial utterance
PARTIAL_RATE = 1.3  # partial utterances per second
MIN_COVERAGE = 0.75
TARGET_DBFS = -30.0
HIDDEN = 256
EMBED_DIM = 256
LAYERS = 3
MAX_BATCH = 64  # matches the "mels" profile max, so TensorRT never sees a larger batch

# --- files ---------------------------------------------------------------------------------------
WHEEL_REQUIREMENT = "resemblyzer==0.1.4"
WHEEL_MEMBER = "resemblyzer/pretrained.pt"
# sha256 of pretrained.pt in the 0.1.4 wheel: a different file would be a different model.
PRETRAINED_SHA256 = "39373b86598fa3da9fcddee6142382efe09777e8d37dc9c0561f41f0070f134e"
SAFETENSORS_NAME = "ge2e.safetensors"
ONNX_NAME = "ge2e.onnx"
MODEL_NAME = "ge2e_speaker_encoder"
LICENCE = "GE2E weights from Resemblyzer 0.1.4 (Apache-2.0, Resemble AI)"

# The checkpoint also holds the GE2E loss scale/offset (`similarity_*`): training-only, dropped.
_TRAINING_ONLY_KEYS = {"similarity_weight", "similarity_bias"}

RunFn = Callable[[np.ndarray], np.ndarray]


def _expected_shapes() -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in range(LAYERS):
        in_dim = N_MELS if layer == 0 else HIDDEN
        shapes[f"lstm.weight_ih_l{layer}"] = (4 * HIDDEN, in_dim)
        shapes[f"lstm.weight_hh_l{layer}"] = (4 * HIDDEN, HIDDEN)
        shapes[f"lstm.bias_ih_l{layer}"] = (4 * HIDDEN,)
        shapes[f"lstm.bias_hh_l{layer}"] = (4 * HIDDEN,)
    shapes["linear.weight"] = (EMBED_DIM, HIDDEN)
    shapes["linear.bias"] = (EMBED_DIM,)
    return shapes


def encoder_dir() -> Path:
    return model_dir("speaker_encoder")


def _missing_weights_error(folder: Path) -> FileNotFoundError:
    return FileNotFoundError(
        f"GE2E speaker-encoder weights not found in {folder}; run `python -m digital_human setup`"
    )


# --- torch reference module ----------------------------------------------------------------------
def _torch_module_class():
    # torch is imported lazily: the ONNX Runtime path must work without touching torch.
    import torch
    from torch import nn

    class GE2E(nn.Module):
        """LSTM 40->256 x3, Linear 256->256, ReLU, L2 norm (Resemblyzer's VoiceEncoder network)."""

        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(N_MELS, HIDDEN, LAYERS, batch_first=True)
            self.linear = nn.Linear(HIDDEN, EMBED_DIM)
            self.relu = nn.ReLU()

        def forward(self, mels: "torch.Tensor") -> "torch.Tensor":
            _, (hidden, _) = self.lstm(mels)
            raw = self.relu(self.linear(hidden[-1]))
            # clamp only guards an all-zero ReLU output (Resemblyzer would return NaN there)
            return raw / torch.linalg.vector_norm(raw, dim=1, keepdim=True).clamp_min(1e-12)

    return GE2E


def check_state_dict(state: dict, source: str) -> dict:
    """Strict key + shape check; returns the inference weights only (training-only keys dropped)."""
    expected = _expected_shapes()
    keys = set(state) - _TRAINING_ONLY_KEYS
    missing = sorted(set(expected) - keys)
    unexpected = sorted(keys - set(expected))
    if missing or unexpected:
        raise ValueError(f"{source} is not the GE2E encoder checkpoint: missing keys {missing}, "
                         f"unexpected keys {unexpected}")
    bad = [f"{k} {tuple(state[k].shape)} != {shape}" for k, shape in expected.items()
           if tuple(state[k].shape) != shape]
    if bad:
        raise ValueError(f"{source} has wrong tensor shapes: {bad}")
    return {k: state[k] for k in expected}


def load_ge2e_torch(folder: Path | None = None):
    """The torch GE2E module with weights from `ge2e.safetensors` (eval mode, CPU, fp32)."""
    from safetensors.torch import load_file

    folder = Path(folder) if folder is not None else encoder_dir()
    path = folder / SAFETENSORS_NAME
    if not path.is_file():
        raise _missing_weights_error(folder)
    state = check_state_dict(load_file(str(path)), str(path))
    module = _torch_module_class()()
    module.load_state_dict(state, strict=True)
    return module.eval()


# --- ONNX graph ------------------------------------------------------------------------------------
def _onnx_gates(w: np.ndarray) -> np.ndarray:
    """torch stacks LSTM gates as (i, f, g, o); ONNX wants (i, o, f, c) with c == torch's g."""
    i, f, g, o = np.split(w, 4, axis=0)
    return np.concatenate([i, o, f, g], axis=0)


def build_onnx(state: dict[str, np.ndarray], path: Path) -> None:
    """Write the GE2E graph with the standard ONNX LSTM op (TensorRT and ORT both take it)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits: list = []
    nodes: list = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    # ONNX LSTM is time-major [T, B, C]; transposing here keeps the public input batch-first.
    nodes.append(helper.make_node("Transpose", ["mels"], ["x_tbc"], perm=[1, 0, 2]))
    squeeze_axes = const("axes_1", np.array([1], dtype=np.int64))
    squeeze_axes0 = const("axes_0", np.array([0], dtype=np.int64))
    x = "x_tbc"
    for layer in range(LAYERS):
        w = _onnx_gates(state[f"lstm.weight_ih_l{layer}"])[None]
        r = _onnx_gates(state[f"lstm.weight_hh_l{layer}"])[None]
        b = np.concatenate([_onnx_gates(state[f"lstm.bias_ih_l{layer}"]),
                            _onnx_gates(state[f"lstm.bias_hh_l{layer}"])])[None]
        outs = [f"y{layer}", f"h{layer}"]
        nodes.append(helper.make_node(
            "LSTM",
            [x, const(f"W{layer}", w), const(f"R{layer}", r), const(f"B{layer}", b)],
            outs, hidden_size=HIDDEN, direction="forward", name=f"lstm{layer}",
        ))
        # Y is [T, num_directions=1, B, H]; drop the direction axis to feed the next layer.
        nodes.append(helper.make_node("Squeeze", [f"y{layer}", squeeze_axes], [f"x{layer + 1}"]))
        x = f"x{layer + 1}"
    nodes.append(helper.make_node("Squeeze", [f"h{LAYERS - 1}", squeeze_axes0], ["h_last"]))
    nodes.append(helper.make_node("Gemm", ["h_last", const("linear_w", state["linear.weight"]),
                                           const("linear_b", state["linear.bias"])], ["lin"], transB=1))
    nodes.append(helper.make_node("Relu", ["lin"], ["act"]))
    nodes.append(helper.make_node("ReduceL2", ["act"], ["norm"], axes=[1], keepdims=1))  # opset 17: axes attr
    nodes.append(helper.make_node("Max", ["norm", const("eps", np.array(1e-12, dtype=np.float32))],
                                  ["norm_safe"]))
    nodes.append(helper.make_node("Div", ["act", "norm_safe"], ["embedding"]))

    graph = helper.make_graph(
        nodes, "ge2e_speaker_encoder",
        [helper.make_tensor_value_info("mels", TensorProto.FLOAT, ["batch", "frames", N_MELS])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", EMBED_DIM])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="digital_human")
    model.ir_version = 8  # readable by every ONNX Runtime / TensorRT parser from 2022 on
    helper.set_model_props(model, {"source": f"{WHEEL_REQUIREMENT}:{WHEEL_MEMBER}", "licence": LICENCE,
                                   "frontend": "librosa mel power, sr16000 nfft400 hop160 40 mels"})
    onnx.checker.check_model(model, full_check=True)
    write_bytes_atomic(path, model.SerializeToString())


def install_ge2e_weights(wheel_dir: Path | None = None, force: bool = False) -> Path:
    """Fetch the GE2E checkpoint from the resemblyzer wheel, convert it; returns the ONNX path.

    `wheel_dir`: a folder already holding `Resemblyzer-0.1.4-*.whl` (offline installs); otherwise
    pip downloads the wheel. Nothing from resemblyzer is installed or imported.
    """
    import torch
    from safetensors.numpy import save

    from ..assets.pypi_fetch import AssetFetchError, fetch_from_wheel, sha256_file

    folder = encoder_dir()
    onnx_path, st_path = folder / ONNX_NAME, folder / SAFETENSORS_NAME
    if not force and onnx_path.is_file() and st_path.is_file():
        return onnx_path
    with tempfile.TemporaryDirectory(dir=folder, prefix=".ge2e-") as tmp:
        fetched = fetch_from_wheel(WHEEL_REQUIREMENT, {WHEEL_MEMBER: "pretrained.pt"}, Path(tmp),
                                   wheel_dir=Path(wheel_dir) if wheel_dir else None)
        pt_path = fetched[WHEEL_MEMBER]
        digest = sha256_file(pt_path)
        if digest != PRETRAINED_SHA256:
            raise AssetFetchError(f"{WHEEL_MEMBER} from {WHEEL_REQUIREMENT} has sha256 {digest}, expected "
                                  f"{PRETRAINED_SHA256}; the wheel is not the expected release")
        checkpoint = torch.load(pt_path, map_location="cpu", weights_only=True)
        if not isinstance(checkpoint, dict) or "model_state" not in checkpoint:
            raise AssetFetchError(f"{WHEEL_MEMBER} has no 'model_state'; is it resemblyzer 0.1.4?")
        state = check_state_dict(checkpoint["model_state"], WHEEL_MEMBER)
        arrays = {k: v.detach().cpu().numpy().astype(np.float32) for k, v in state.items()}
    write_bytes_atomic(st_path, save(arrays, metadata={"source": f"{WHEEL_REQUIREMENT}:{WHEEL_MEMBER}",
                                                  "licence": LICENCE}))
    build_onnx(arrays, onnx_path)
    diff = ge2e_parity(folder=folder)
    log.info("GE2E speaker encoder installed in %s (ONNX vs torch max abs diff %.2e)", folder, diff)
    if diff > 1e-4:
        raise RuntimeError(f"GE2E ONNX graph disagrees with the torch module (max abs diff {diff:.2e})")
    return onnx_path


def ge2e_model_spec(folder: Path | None = None):
    """The engine-layer description of the encoder; raises when setup has not been run."""
    from .spec import ModelSpec, TensorProfile

    folder = Path(folder) if folder is not None else encoder_dir()
    onnx_path = folder / ONNX_NAME
    if not onnx_path.is_file() or not (folder / SAFETENSORS_NAME).is_file():
        raise _missing_weights_error(folder)
    return ModelSpec(
        name=MODEL_NAME,
        onnx_path=onnx_path,
        profiles={"mels": TensorProfile(min=(1, 40, N_MELS), opt=(8, PARTIAL_FRAMES, N_MELS),
                                        max=(MAX_BATCH, PARTIAL_FRAMES, N_MELS))},
        torch_factory=lambda: load_ge2e_torch(folder),
    )


# --- running ---------------------------------------------------------------------------------------
def _ort_session(onnx_path: Path):
    # Parity opens ONNX Runtime directly on purpose: it checks the graph file itself, whatever
    # backend `auto` would pick.
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    threads = int(os.environ.get("DIGITAL_HUMAN_ORT_THREADS", "0"))
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(onnx_path), sess_options=options, providers=["CPUExecutionProvider"])


def default_run_fn(backend: str = "auto", precision: str = "auto") -> RunFn:
    """mels [B, 160, 40] -> embeddings [B, 256] through the engine loader (the ONE place that
    decides how the encoder runs; the loader caches the runner, so calling this often is cheap)."""
    from . import loader

    runner = loader.bound(ge2e_model_spec(), backend=backend, precision=precision, stage="voice")  # survives release()
    return lambda mels: np.asarray(runner({"mels": mels})["embedding"], dtype=np.float32)


def ge2e_parity(n_frames: int = 160, batch: int = 4, folder: Path | None = None, seed: int = 0) -> float:
    """Max abs difference between the ONNX graph (ONNX Runtime) and the torch module, same weights."""
    import torch

    folder = Path(folder) if folder is not None else encoder_dir()
    module = load_ge2e_torch(folder)
    rng = np.random.default_rng(seed)
    # Mel power values are non-negative and heavy-tailed; squared normals mimic that range.
    mels = (rng.standard_normal((batch, n_frames, N_MELS)) ** 2).astype(np.float32)
    with torch.inference_mode():
        ref = module(torch.from_numpy(mels)).numpy()
    out = _ort_session(folder / ONNX_NAME).run(["embedding"], {"mels": mels})[0]
    return float(np.max(np.abs(out - ref)))


# --- front end and utterance embedding -------------------------------------------------------------
def _check_wav(wav16k: np.ndarray, what: str = "wav16k") -> np.ndarray:
    wav = np.asarray(wav16k)
    if wav.ndim != 1:
        raise ValueError(f"{what} must be a 1-D mono waveform at 16 kHz, got shape {wav.shape}; "
                         "average the channels and resample first")
    if wav.size == 0:
        raise ValueError(f"{what} is empty; give at least a few seconds of speech")
    wav = wav.astype(np.float32, copy=False)
    if not np.all(np.isfinite(wav)):
        raise ValueError(f"{what} contains NaN or Inf samples; decode the audio again")
    return wav


def normalize_volume(wav16k: np.ndarray, target_dbfs: float = TARGET_DBFS) -> np.ndarray:
    """Raise (never lower) the RMS level to target_dbfs, as Resemblyzer's preprocess_wav does.

    The encoder eats a linear (not log) mel spectrogram, so the input level changes the embedding;
    matching Resemblyzer keeps our similarities on its scale.
    """
    wav = _check_wav(wav16k)
    rms = float(np.sqrt(np.mean(np.square(wav, dtype=np.float64))))
    if rms == 0.0:
        raise ValueError("the waveform is pure silence; the speaker encoder needs speech")
    change_db = target_dbfs - 20.0 * np.log10(rms)
    if change_db <= 0:
        return wav
    return (wav * np.float32(10.0 ** (change_db / 20.0))).astype(np.float32)


def wav_to_mel_frames(wav16k: np.ndarray) -> np.ndarray:
    """Resemblyzer's encoder input: mel power spectrogram [frames, 40] float32 of a 16 kHz waveform."""
    import librosa

    wav = _check_wav(wav16k)
    # Every argument spelled out (librosa defaults for center/pad/norm match Resemblyzer on
    # librosa >= 0.10, which is what Resemblyzer 0.1.4 runs with today).
    mel = librosa.feature.melspectrogram(
        y=wav, sr=SAMPLE_RATE, n_fft=N_FFT, hop_length=HOP, win_length=N_FFT, window="hann",
        center=True, pad_mode="constant", power=2.0, n_mels=N_MELS, htk=False, norm="slaney",
    )
    return mel.astype(np.float32).T


def partial_windows(n_samples: int, rate: float = PARTIAL_RATE,
                    min_coverage: float = MIN_COVERAGE) -> list[slice]:
    """Mel-frame slices of the 160-frame partial utterances covering n_samples (Resemblyzer's rule).

    Always at least one window; slices may run past the end (the caller zero-pads the waveform to
    `slices[-1].stop * HOP` samples).
    """
    if n_samples <= 0:
        raise ValueError(f"n_samples must be positive, got {n_samples}")
    if not 0 < min_coverage <= 1:
        raise ValueError(f"min_coverage must be in (0, 1], got {min_coverage}")
    n_frames = int(np.ceil((n_samples + 1) / HOP))
    frame_step = int(np.round((SAMPLE_RATE / rate) / HOP))
    if not 0 < frame_step <= PARTIAL_FRAMES:
        raise ValueError(f"rate {rate} gives a step of {frame_step} frames; "
                         f"use a rate between {SAMPLE_RATE / (HOP * PARTIAL_FRAMES):.3f} and 100")
    steps = max(1, n_frames - PARTIAL_FRAMES + frame_step + 1)
    slices = [slice(i, i + PARTIAL_FRAMES) for i in range(0, steps, frame_step)]
    last = slices[-1]
    coverage = (n_samples - last.start * HOP) / (PARTIAL_FRAMES * HOP)
    if coverage < min_coverage and len(slices) > 1:
        slices = slices[:-1]
    return slices


def partial_mels(wav16k: np.ndarray, rate: float = PARTIAL_RATE, min_coverage: float = MIN_COVERAGE,
                 normalize: bool = True) -> np.ndarray:
    """The encoder batch for one utterance: [P, 160, 40] float32."""
    wav = normalize_volume(wav16k) if normalize else _check_wav(wav16k)
    slices = partial_windows(len(wav), rate, min_coverage)
    needed = slices[-1].stop * HOP
    if needed >= len(wav):
        wav = np.pad(wav, (0, needed - len(wav)))
    mel = wav_to_mel_frames(wav)
    return np.stack([mel[s] for s in slices])


def run_batched(mels: np.ndarray, run_fn: RunFn, max_batch: int = MAX_BATCH) -> np.ndarray:
    """Run the encoder in batches of at most max_batch (the engine profile's limit)."""
    outs = [np.asarray(run_fn(np.ascontiguousarray(mels[i:i + max_batch], dtype=np.float32)),
                       dtype=np.float32) for i in range(0, len(mels), max_batch)]
    out = np.concatenate(outs, axis=0)
    if out.shape != (len(mels), EMBED_DIM):
        raise RuntimeError(f"speaker encoder returned shape {out.shape}, expected {(len(mels), EMBED_DIM)}")
    return out


def l2_normalize(vec: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vec))
    if norm == 0.0 or not np.isfinite(norm):
        raise ValueError("cannot normalise a zero or non-finite embedding")
    return (vec / norm).astype(np.float32)


def embed_utterance(wav16k: np.ndarray, run_fn: RunFn | None = None, rate: float = PARTIAL_RATE,
                    min_coverage: float = MIN_COVERAGE) -> tuple[np.ndarray, np.ndarray]:
    """(utterance embedding [256], partial embeddings [P, 256]) of a 16 kHz mono waveform."""
    run_fn = run_fn or default_run_fn()
    partials = run_batched(partial_mels(wav16k, rate, min_coverage), run_fn)
    return l2_normalize(partials.mean(axis=0)), partials


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two embeddings (any norm)."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"embeddings differ in size: {a.shape} vs {b.shape}")
    denom = np.linalg.norm(a) * np.linalg.norm(b)
    if denom == 0.0:
        raise ValueError("cosine of a zero vector is undefined")
    return float(np.dot(a, b) / denom)


def time_embedding(seconds: float = 10.0, run_fn: RunFn | None = None) -> float:
    """Wall time of one embed_utterance call on `seconds` of noise (for reports/benchmarks)."""
    run_fn = run_fn or default_run_fn()
    wav = (np.random.default_rng(0).standard_normal(int(seconds * SAMPLE_RATE)) * 0.1).astype(np.float32)
    embed_utterance(wav, run_fn)  # warm-up (session/graph initialisation)
    start = time.perf_counter()
    embed_utterance(wav, run_fn)
    return time.perf_counter() - start
