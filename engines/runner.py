"""The one interface every backend implements: numpy arrays in, numpy arrays out.

Nodes never see backend types; they call `runner(feeds)` and read `runner.backend` to report what ran.
Backends that can keep data on the GPU also accept torch tensors (see `accepts_torch`).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np


@dataclass
class RunnerInfo:
    """What the UI and the CLI report about a loaded model."""

    model: str
    backend: str  # "tensorrt", "torch-cuda", "torch-cpu", "onnxruntime-cuda", "onnxruntime-cpu"
    device: str
    precision: str  # "fp16", "fp32", "int8"
    cache_key: str = ""
    load_seconds: float = 0.0
    fallback_from: list[str] = field(default_factory=list)  # backends tried first, with reasons
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        text = f"{self.model}: {self.backend} {self.precision} on {self.device}"
        if self.fallback_from:  # backend names only: the reasons are long and live in the debug log
            text += " (fallback after: " + ", ".join(r.split(":", 1)[0] for r in self.fallback_from) + ")"
        return text


class Runner(abc.ABC):
    """A loaded model. Call it with a dict of input name -> array; get output name -> array."""

    accepts_torch = False

    def __init__(self, info: RunnerInfo) -> None:
        self.info = info

    @property
    def backend(self) -> str:
        return self.info.backend

    @property
    def precision(self) -> str:
        return self.info.precision

    @abc.abstractmethod
    def input_names(self) -> list[str]: ...

    @abc.abstractmethod
    def output_names(self) -> list[str]: ...

    @abc.abstractmethod
    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]: ...

    def __call__(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        missing = [name for name in self.input_names() if name not in feeds]
        if missing:
            raise ValueError(f"{self.info.model}: missing inputs {missing}; expected {self.input_names()}")
        return self.run(feeds)

    def release(self) -> None:
        """Free device memory held by this runner (the loader calls it on eviction)."""
