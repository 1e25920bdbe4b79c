"""benchmarks/_contention.py: the interpreter-lock probe sees a thread that holds the lock, and the GPU sampler
reads nvidia-smi's query loop (a stand-in script here: no GPU on this machine) or says why it has no readings."""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _contention import GilProbe, GpuUtilSampler  # noqa: E402


def _probe(seconds: float) -> dict:
    with GilProbe(interval_s=0.002) as probe:
        time.sleep(seconds)
    return probe.report()


def test_the_lock_probe_sees_a_thread_that_holds_the_interpreter_lock():
    idle = _probe(0.4)
    stop = threading.Event()

    def spin():  # pure Python: gives the lock up only when the switch interval asks
        while not stop.is_set():
            sum(range(2000))

    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        busy = _probe(0.4)
    finally:
        stop.set()
        spinner.join()
        sys.setswitchinterval(before)
    assert idle["late_ms"]["n"] > 20 and busy["late_ms"]["n"] > 20
    assert busy["late_ms"]["p50"] > idle["late_ms"]["p50"] + 1.0  # waits ~ the 5-ms switch interval
    assert 0 <= idle["waiting_share"] < busy["waiting_share"] <= 1.0


def test_the_gpu_sampler_parses_the_query_loop(tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\n"
                    "case \"$*\" in *--query-gpu=utilization.gpu,memory.used*--format=csv,noheader,nounits*--loop-ms=100*) ;;\n"
                    "  *) echo \"unexpected arguments: $*\" >&2; exit 2 ;; esac\n"
                    "for u in 10 100 97 40; do echo \"$u, 2048\"; done\nexec sleep 30\n")
    fake.chmod(0o755)
    with GpuUtilSampler(interval_ms=100, executable=str(fake)) as sampler:
        time.sleep(0.3)
    report = sampler.report()
    assert report["util_pct"]["n"] == 4 and report["util_pct"]["max"] == 100.0
    assert report["share_at_95_pct_or_more"] == 0.5 and report["memory_used_mib_max"] == 2048.0


def test_the_gpu_sampler_says_why_it_has_no_readings(tmp_path):
    with GpuUtilSampler(executable=str(tmp_path / "missing-nvidia-smi")) as sampler:
        pass
    assert "did not start" in sampler.report()["error"]
    silent = tmp_path / "nvidia-smi"
    silent.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    silent.chmod(0o755)
    with GpuUtilSampler(executable=str(silent)) as sampler:
        time.sleep(0.2)
    assert "no readings" in sampler.report()["error"] and "failed" in sampler.report()["error"]
