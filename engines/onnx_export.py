"""Export a torch module to ONNX and prove the graph computes the same thing (parity report)."""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..atomic_file import atomic_path

log = logging.getLogger(__name__)


@dataclass
class ParityReport:
    model: str
    max_abs_diff: float
    max_rel_diff: float
    outputs: int

    def __str__(self) -> str:
        return f"{self.model}: ONNX vs torch max abs diff {self.max_abs_diff:.3g}, max rel diff {self.max_rel_diff:.3g}"


def export_onnx(module: Any, example_inputs: Sequence[Any], path: Path, input_names: Sequence[str],
                output_names: Sequence[str], dynamic_axes: dict[str, dict[int, str]] | None = None,
                opset: int = 17) -> Path:
    """Export with the TorchScript exporter (needs no onnxscript; stable for LSTM/conv graphs).

    Written to a temporary name and renamed, so a crash never leaves a half-written graph.
    """
    import torch

    path = Path(path)
    module = module.eval()
    with atomic_path(path) as tmp, warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the exporter's deprecation and RNN batch notes are expected
        torch.onnx.export(module, tuple(example_inputs), str(tmp), input_names=list(input_names),
                          output_names=list(output_names), dynamic_axes=dynamic_axes or {},
                          opset_version=opset, dynamo=False)
    return path


def parity(module: Any, onnx_path: Path, inputs: Sequence[np.ndarray], name: str = "") -> ParityReport:
    """Run the same inputs through torch (FP32, CPU) and ONNX Runtime (CPU) and compare every output."""
    import onnxruntime as ort
    import torch

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    feeds = {i.name: np.asarray(v) for i, v in zip(session.get_inputs(), inputs)}
    onnx_out = session.run(None, feeds)
    with torch.no_grad():
        torch_out = module.eval()(*[torch.from_numpy(np.asarray(v)) for v in inputs])
    if not isinstance(torch_out, (tuple, list)):
        torch_out = (torch_out,)
    max_abs = max_rel = 0.0
    for ref, got in zip(torch_out, onnx_out):
        ref_np = ref.detach().cpu().numpy().astype(np.float64)
        diff = np.abs(ref_np - got.astype(np.float64))
        max_abs = max(max_abs, float(diff.max(initial=0.0)))
        max_rel = max(max_rel, float((diff / (np.abs(ref_np) + 1e-6)).max(initial=0.0)))
    report = ParityReport(name or Path(onnx_path).stem, max_abs, max_rel, len(onnx_out))
    log.info("%s", report)
    return report
