"""benchmarks/gpu_tts_pieces.py's CPU smoke run (reduced release): every section runs and reports every part, the HiFT
graphs' path (eager on the CPU) gives the eager vocoder's waveform a batched flow row its solve alone, and each batched LM row the single decoder's tokens. The GPU
figures come from the H200 run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="CosyVoice 2 needs the optional extra: pip install .[cosyvoice]")

ROOT = Path(__file__).resolve().parents[1]


def test_tts_pieces_benchmark_runs_on_the_cpu(tmp_path):
    out = tmp_path / "pieces.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_tts_pieces.py"), "--device", "cpu", "--size", "reduced",
           "--repeats", "1", "--lengths", "4,9", "--rows", "1,2", "--flow-frames", "40", "--lm-steps", "6", "--work", str(tmp_path / "w"),
           "--sections", "hift,flow,lm,flow_kernels,encoder", "--kernel-frames", "40,100", "--encoder-tokens", "9,40",
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    hift = report["hift"]
    assert hift["graphs"] == 0 and hift["graphs_reserved_mib"] is None  # the CPU: no CUDA graphs
    assert sorted(hift["lengths"]) == ["4", "9"]
    for row in hift["lengths"].values():
        assert row["eager"]["n"] == row["graph"]["n"] == 1 and row["max_abs_diff"] < 1e-3  # DFT matrices vs FFT
    flow = report["flow"]
    assert flow["padded"] % 16 == 0 and sorted(flow["rows"]) == ["1", "2"]
    assert flow["rows"]["2"]["row0_max_abs_diff_vs_alone"] < 1e-4 and flow["rows"]["1"]["throughput_vs_1_row"] == 1.0
    lm = report["lm"]
    assert lm["graph"] is False and sorted(lm["rows"]) == ["1", "2"]  # the CPU: no CUDA graph
    for rows, row in lm["rows"].items():
        assert row["rows_with_the_single_decoders_tokens"] == int(rows) and row["ms_per_step"] > 0
    kernels = report["flow_kernels"]["variants"]
    assert sorted(kernels) == ["fused", "fused_compiled", "plain"]
    for name, variant in kernels.items():
        assert sorted(variant["lengths"]) == ["128x1", "128x2", "64x1", "64x2"] and variant["compile_note"] is None
        for row in variant["lengths"].values():
            assert row["kernels"] is None  # counted on CUDA only
            if name != "plain":  # FP32 on the CPU: the same solve up to rounding
                assert row["max_abs_diff_vs_plain"] < 1e-4 * max(row["plain_abs_max"], 1.0) and row["speedup_vs_plain"] > 0
    encoder = report["encoder"]
    assert encoder["graphs"] == 0 and sorted(encoder["tokens"]) == ["40", "9"]  # the CPU: the padded call, eagerly
    for row in encoder["tokens"].values():
        assert row["eager_kernels"] is None and row["max_abs_diff"] < 1e-5 * max(row["mu_abs_max"], 1.0)
