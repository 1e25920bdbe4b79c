"""Engine layer: export parity, runner backends, loader caching, fallback order, TensorRT cache names."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from digital_human.engines import backend_tensorrt, cache_keys, loader as loader_mod
from digital_human.engines.onnx_export import export_onnx, parity
from digital_human.engines.runner import Runner, RunnerInfo
from digital_human.engines.spec import ModelSpec, TensorProfile


class TinyNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv1d(4, 8, 3, padding=1)
        self.lstm = torch.nn.LSTM(8, 8, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)
        out, _ = self.lstm(y)
        return out[:, -1]


@pytest.fixture(scope="module")
def tiny_spec(tmp_path_factory) -> ModelSpec:
    path = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    export_onnx(TinyNet(), [torch.randn(2, 7, 4)], path, ["x"], ["y"], {"x": {0: "batch", 1: "frames"}})
    return ModelSpec(name="tiny", onnx_path=path, torch_factory=TinyNet,
                     profiles={"x": TensorProfile((1, 1, 4), (4, 16, 4), (8, 64, 4))})


def test_export_parity_is_tight(tiny_spec):
    x = np.random.default_rng(1).standard_normal((3, 11, 4)).astype(np.float32)
    report = parity(TinyNet(), tiny_spec.onnx_path, [x], "tiny")
    print(report)
    assert report.max_abs_diff < 1e-5


def test_onnxruntime_and_torch_cpu_runners_agree(tiny_spec):
    fresh = loader_mod.EngineLoader()
    x = np.random.default_rng(2).standard_normal((2, 9, 4)).astype(np.float32)
    ort_runner = fresh.get(tiny_spec, backend="onnxruntime")
    torch_runner = fresh.get(tiny_spec, backend="torch")
    assert ort_runner.backend == "onnxruntime-cpu" and torch_runner.backend == "torch-cpu"
    a, b = ort_runner({"x": x})["y"], torch_runner({"x": x})["y"]
    assert a.shape == (2, 8) and np.abs(a - b).max() < 1e-5


def test_loader_caches_runner(tiny_spec):
    fresh = loader_mod.EngineLoader()
    first = fresh.get(tiny_spec, backend="onnxruntime")
    second = fresh.get(tiny_spec, backend="onnxruntime")
    assert first is second and fresh.load_count == 1
    assert fresh.release() == 1
    fresh.get(tiny_spec, backend="onnxruntime")
    assert fresh.load_count == 2


def test_missing_input_is_named(tiny_spec):
    runner = loader_mod.EngineLoader().get(tiny_spec, backend="onnxruntime")
    with pytest.raises(ValueError, match="missing inputs \\['x'\\]"):
        runner({})


def test_candidate_order():
    order = loader_mod.candidate_order
    assert order("auto", True)[:3] == [("tensorrt", "cuda"), ("torch", "cuda"), ("onnxruntime", "cuda")]
    assert order("auto", False) == [("onnxruntime", "cpu"), ("torch", "cpu")]
    assert order("tensorrt", False)[0] == ("tensorrt", "cuda")
    assert order("torch", False) == [("torch", "cpu")]
    with pytest.raises(ValueError, match="backend must be one of"):
        order("tflite", False)


class _RecordingRunner(Runner):
    def input_names(self):
        return ["x"]

    def output_names(self):
        return ["y"]

    def run(self, feeds):
        return {"y": np.asarray(feeds["x"]) * 2}


def test_auto_falls_back_and_reports_why(tiny_spec):
    fresh = loader_mod.EngineLoader()
    fresh._has_cuda = lambda: True
    attempts = []

    def fake_load(spec, backend, device, precision):
        attempts.append((backend, device))
        if device == "cuda":
            raise RuntimeError(f"{backend} unavailable here")
        return _RecordingRunner(RunnerInfo(spec.name, f"{backend}-{device}", device, "fp32"))

    fresh._loader = fake_load
    runner = fresh.get(tiny_spec, backend="auto")
    assert attempts == [("tensorrt", "cuda"), ("torch", "cuda"), ("onnxruntime", "cuda"), ("onnxruntime", "cpu")]
    assert runner.backend == "onnxruntime-cpu"
    assert len(runner.info.fallback_from) == 3 and "tensorrt-cuda" in runner.info.fallback_from[0]
    assert "fallback after" in runner.info.summary()


def _loader_where_tensorrt_fails(message: str):
    """(a fresh EngineLoader that sees CUDA, where loading TensorRT raises `message` and the other
    backends load a recording runner, the list of backends it tried)."""
    fresh = loader_mod.EngineLoader()
    fresh._has_cuda = lambda: True
    attempts: list[str] = []

    def fake_load(spec, backend, device, precision):
        attempts.append(backend)
        if backend == "tensorrt":
            raise RuntimeError(message)
        return _RecordingRunner(RunnerInfo(spec.name, f"{backend}-{device}", device, "fp32"))

    fresh._loader = fake_load
    return fresh, attempts


def test_failed_backend_is_tried_once_until_release(tiny_spec):
    """A backend that cannot load (TensorRT not installed) is not retried, nor warned about, on every
    call of a long job; release() forgets the failures (the user may have fixed the cause)."""
    fresh, attempts = _loader_where_tensorrt_fails("TensorRT is not installed")
    first = fresh.get(tiny_spec)
    again = fresh.get(tiny_spec)
    assert again is first and attempts == ["tensorrt", "torch"]
    fresh.release()
    fresh.get(tiny_spec)
    assert attempts == ["tensorrt", "torch", "tensorrt", "torch"]


def test_out_of_memory_is_not_remembered(tiny_spec):
    """Running out of GPU memory while loading is transient (other models may be freed): that backend is
    tried again on the next call, unlike a missing library."""
    fresh, attempts = _loader_where_tensorrt_fails("CUDA out of memory. Tried to allocate 2.00 GiB")
    fresh.get(tiny_spec)
    fresh.get(tiny_spec)
    assert attempts == ["tensorrt", "torch", "tensorrt"]


def test_bound_runner_survives_release(tiny_spec, monkeypatch):
    """Stage unloading (release) must not leave cached callables pointing at a released runner."""
    fresh = loader_mod.EngineLoader()
    monkeypatch.setattr(loader_mod, "_LOADER", fresh)
    run = loader_mod.bound(tiny_spec, backend="torch", stage="face")
    x = np.random.default_rng(0).standard_normal((2, 5, 4)).astype(np.float32)
    before = run({"x": x})["y"]
    assert loader_mod.release("face") == 1 and fresh.loaded() == []
    after = run({"x": x})["y"]  # reloaded, not a crash on the released module
    np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-6)
    assert fresh.load_count == 2 and run.info.model == "tiny" and run.input_names() == ["x"]


def test_no_backend_error_lists_every_reason(tiny_spec):
    fresh = loader_mod.EngineLoader()
    fresh._has_cuda = lambda: False

    def failing(spec, backend, device, precision):
        raise RuntimeError(f"no {backend}")

    fresh._loader = failing
    with pytest.raises(RuntimeError, match="(?s)no backend could load 'tiny'.*no onnxruntime.*no torch"):
        fresh.get(tiny_spec)


def test_real_tensorrt_request_without_tensorrt_falls_back(tiny_spec):
    # This machine has no TensorRT and no GPU: an explicit request must still give a working runner.
    runner = loader_mod.EngineLoader().get(tiny_spec, backend="tensorrt")
    assert runner.backend == "onnxruntime-cpu"
    assert any("tensorrt" in reason for reason in runner.info.fallback_from)


def test_cache_keys_change_with_graph_precision_and_profile(tiny_spec, tmp_path):
    key = cache_keys.runner_cache_key(tiny_spec, "tensorrt", "cuda", "fp16", "trt10.3")
    assert key != cache_keys.runner_cache_key(tiny_spec, "tensorrt", "cuda", "fp32", "trt10.3")
    assert key != cache_keys.runner_cache_key(tiny_spec, "tensorrt", "cuda", "fp16", "trt10.4")
    other_profile = ModelSpec("tiny", tiny_spec.onnx_path, {"x": TensorProfile((1, 1, 4), (1, 8, 4), (2, 32, 4))})
    assert key != cache_keys.runner_cache_key(other_profile, "tensorrt", "cuda", "fp16", "trt10.3")
    copy = tmp_path / "tiny_changed.onnx"
    copy.write_bytes(tiny_spec.onnx_path.read_bytes() + b"\0")
    changed = ModelSpec("tiny", copy, tiny_spec.profiles)
    assert cache_keys.runner_cache_key(changed, "tensorrt", "cuda", "fp16", "trt10.3").split("|")[1] != key.split("|")[1]


def test_engine_file_name_carries_version_and_capability(tiny_spec):
    name = cache_keys.engine_file_name(tiny_spec, "fp16", "10.3.0", "90")
    assert name.startswith("tiny-") and name.endswith("-fp16-p" + cache_keys.short(tiny_spec.profile_key())
                                                         + "-trt10.3.0-sm90.engine")
    assert name != cache_keys.engine_file_name(tiny_spec, "fp16", "10.4.0", "90")
    assert name != cache_keys.engine_file_name(tiny_spec, "fp16", "10.3.0", "89")


def test_profile_validation_and_key():
    prof = TensorProfile((1, 3), (1, 128), (1, 512))
    assert prof.contains((1, 200)) and not prof.contains((1, 600)) and prof.key() == "1x3-1x128-1x512"
    with pytest.raises(ValueError):
        TensorProfile((1, 10), (1, 5), (1, 20))


def test_tensorrt_profile_shapes_are_passed(tiny_spec):
    calls = []
    profile = SimpleNamespace(set_shape=lambda name, lo, opt, hi: calls.append((name, lo, opt, hi)))
    backend_tensorrt.set_profile_shapes(profile, tiny_spec)
    assert calls == [("x", (1, 1, 4), (4, 16, 4), (8, 64, 4))]


def test_tensorrt_rebuilds_when_cached_engine_fails_to_deserialize(tiny_spec, tmp_path, monkeypatch):
    """The rebuild decision, with TensorRT's runtime replaced by a recorder (TensorRT is not installable here)."""
    engine_path = tmp_path / "tiny.engine"
    engine_path.write_bytes(b"stale engine from another TensorRT version")
    builds = []

    class Runtime:
        def __init__(self, logger):
            pass

        def deserialize_cuda_engine(self, data):
            return None if data.startswith(b"stale") else ("engine", data)

    trt = SimpleNamespace(Runtime=Runtime, Logger=SimpleNamespace(WARNING=2, __call__=None))
    trt.Logger = type("Logger", (), {"WARNING": 2, "__init__": lambda self, level: None})

    def fake_build(trt_mod, spec, precision, path):
        builds.append(path)
        path.write_bytes(b"fresh")
        return b"fresh"

    monkeypatch.setattr(backend_tensorrt, "build_engine", fake_build)
    engine, built = backend_tensorrt.load_or_build(trt, tiny_spec, "fp16", engine_path)
    assert built and engine == ("engine", b"fresh") and builds == [engine_path]
    engine, built = backend_tensorrt.load_or_build(trt, tiny_spec, "fp16", engine_path)
    assert not built and len(builds) == 1


def test_tensorrt_import_error_says_how_to_install():
    with pytest.raises(RuntimeError, match="TensorRT is not installed"):
        backend_tensorrt.import_tensorrt()


# --- quiet backend probing (issues 18, 19) -------------------------------------------------------------
def _fake_comfy(monkeypatch, cpu: bool, with_cpu_mode: bool = True) -> None:
    """ComfyUI's comfy.model_management as 0.3.64 exposes it: cpu_mode() and cpu_state (CPUState enum)."""
    import enum
    import sys
    import types

    state = enum.Enum("CPUState", "GPU CPU MPS")
    mm = types.ModuleType("comfy.model_management")
    mm.cpu_state = state.CPU if cpu else state.GPU
    if with_cpu_mode:
        mm.cpu_mode = lambda: mm.cpu_state == state.CPU
    monkeypatch.setitem(sys.modules, "comfy.model_management", mm)


@pytest.mark.parametrize("with_cpu_mode", [True, False])
def test_comfy_cpu_flag_turns_every_gpu_backend_off(monkeypatch, tiny_spec, with_cpu_mode):
    from digital_human.engines import backend_onnxruntime, backend_torch, devices

    monkeypatch.setattr(devices, "nvidia_driver_present", lambda: True)  # as on a GPU machine
    monkeypatch.setattr(backend_onnxruntime, "available_providers", lambda: ["CUDAExecutionProvider",
                                                                             "CPUExecutionProvider"])
    _fake_comfy(monkeypatch, cpu=False, with_cpu_mode=with_cpu_mode)
    assert not devices.comfy_cpu_mode() and backend_onnxruntime.cuda_available()
    _fake_comfy(monkeypatch, cpu=True, with_cpu_mode=with_cpu_mode)
    assert devices.comfy_cpu_mode()
    assert not backend_onnxruntime.cuda_available() and not backend_torch.cuda_available()
    assert not loader_mod.cuda_device_available() and not devices.torch_cuda_usable()
    fresh = loader_mod.EngineLoader()
    tried = []

    def record(spec, backend, device, precision):
        tried.append(f"{backend}-{device}")
        return _RecordingRunner(RunnerInfo(spec.name, f"{backend}-{device}", device, "fp32"))

    fresh._loader = record
    assert fresh.get(tiny_spec).backend == "onnxruntime-cpu" and tried == ["onnxruntime-cpu"]


def test_cpu_only_machine_tries_no_gpu_backend(tiny_spec, caplog):
    """Without an NVIDIA driver nothing GPU is probed, so nothing fails: one info line says what runs."""
    import logging

    from digital_human.engines import devices

    if devices.nvidia_driver_present():
        pytest.skip("this machine has an NVIDIA driver")
    with caplog.at_level(logging.DEBUG, logger="digital_human.engines"):
        runner = loader_mod.EngineLoader().get(tiny_spec)
    assert runner.backend == "onnxruntime-cpu" and runner.info.fallback_from == []
    lines = [r for r in caplog.records if "tiny" in r.getMessage()]
    assert [r.levelname for r in lines] == ["INFO"] and "runs on onnxruntime-cpu" in lines[0].getMessage()


def test_fallback_reasons_go_to_debug_and_one_line_says_what_ran(tiny_spec, caplog):
    import logging

    fresh, _ = _loader_where_tensorrt_fails("TensorRT is not installed (pip install tensorrt-cu12 ...)")
    with caplog.at_level(logging.DEBUG, logger="digital_human.engines"):
        runner = fresh.get(tiny_spec)
    by_level = {r.levelname: r.getMessage() for r in caplog.records}
    assert "pip install tensorrt-cu12" in by_level["DEBUG"] and "WARNING" not in by_level
    assert by_level["INFO"].endswith("runs on torch-cuda fp32 (not available: tensorrt-cuda)")
    assert runner.info.summary() == "tiny: torch-cuda fp32 on cuda (fallback after: tensorrt-cuda)"
    caplog.clear()
    fresh, _ = _loader_where_tensorrt_fails("TensorRT is not installed")
    with caplog.at_level(logging.DEBUG, logger="digital_human.engines"):  # asked by name and not given: a warning
        fresh.get(tiny_spec, backend="tensorrt")
    assert any(r.levelname == "WARNING" and "tensorrt asked for" in r.getMessage() for r in caplog.records)


def test_onnxruntime_cuda_probe_prints_no_errors(tiny_spec):
    """Where onnxruntime-gpu is installed but CUDA's libraries are not (this CPU machine), trying the CUDA
    provider must fail quietly: ONNX Runtime's red ERROR/WARNING lines are silenced, the reason raised."""
    import subprocess
    import sys

    import onnxruntime

    from digital_human.engines import devices

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers() or devices.nvidia_driver_present():
        pytest.skip("needs onnxruntime-gpu on a machine without CUDA")
    code = (
        "import sys, digital_human.engines.devices as d, digital_human.engines.backend_onnxruntime as b\n"
        "from digital_human.engines.spec import ModelSpec\n"
        "d.nvidia_driver_present = lambda: True\n"
        f"spec = ModelSpec(name='tiny', onnx_path={str(tiny_spec.onnx_path)!r})\n"
        "try:\n    b.load(spec, 'cuda', 'auto')\nexcept RuntimeError as e:\n    print('refused:', e)\n"
        "print(b.load(spec, 'cpu', 'auto').info.backend)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused: onnxruntime could not create a CUDA session" in proc.stdout and "onnxruntime-cpu" in proc.stdout
    assert "onnxruntime" not in proc.stderr.lower() and "cuda" not in proc.stderr.lower(), proc.stderr[-2000:]


def test_loader_loads_different_models_in_parallel_and_one_model_once(tiny_spec, tmp_path):
    """The CLI opens the TTS session on a background thread while the main thread loads other models:
    a slow load must not hold up another model's, and two threads asking for the same model load it once."""
    import threading

    other_path = tmp_path / "other.onnx"
    other_path.write_bytes(tiny_spec.onnx_path.read_bytes() + b"\0")  # another graph hash, another key
    other = ModelSpec(name="other", onnx_path=other_path, torch_factory=TinyNet, profiles=tiny_spec.profiles)
    fresh = loader_mod.EngineLoader()
    fresh._has_cuda = lambda: False
    release_slow = threading.Event()
    slow_started = threading.Event()
    loads: list[str] = []

    def fake_load(spec, backend, device, precision):
        loads.append(spec.name)
        if spec.name == "tiny":
            slow_started.set()
            assert release_slow.wait(10), "the slow load was never released"
        return _RecordingRunner(RunnerInfo(spec.name, f"{backend}-{device}", device, "fp32"))

    fresh._loader = fake_load
    got: dict[str, object] = {}
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, fresh.get(tiny_spec, backend="onnxruntime")))
               for i in range(2)]
    for thread in threads:
        thread.start()
    assert slow_started.wait(10)
    quick = fresh.get(other, backend="onnxruntime")  # returns while "tiny" is still loading
    assert quick.info.model == "other" and not release_slow.is_set()
    release_slow.set()
    for thread in threads:
        thread.join(10)
    assert got[0] is got[1] and loads.count("tiny") == 1 and fresh.load_count == 2
