"""README's main job, timed as a user meets it: a fresh process per run, model load included.

Run from the repo root (the pack must be importable as `digital_human`):

    python benchmarks/main_job.py [--repeats 3] [--render headless nodes] [--json results/main_job_cpu.json]
                                  [--baseline /tmp/base]   # a folder holding an older `digital_human` checkout

Each run is `python -m digital_human run ... --json` in a new process (README's first command:
spk_en_male_01 voice, face_02_male photo, the hello text). One unrecorded run first fits the voice
when its cache is cold, so the rows measure what README's headline says: the voice already fitted.
The baseline of the same run is the speech itself (real-time factor = wall / speech seconds) and,
with --baseline, an older checkout run interleaved with this one (same inputs, same load).
Reports per run the outer wall time, the CLI's own stage times and the 1-minute load average
before the run (the CPU may be shared), then the median and spread per render path.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("DIGITAL_HUMAN_DATA", REPO.parent / "shared" / "data"))
TEXT = "Hello! This is my digital twin. The meeting starts at 3:45 pm."


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main_job_command(out: Path, render: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "digital_human", "run", "--voice", str(DATA / "audio" / "spk_en_male_01.wav"),
            "--face", str(DATA / "image" / "face_02_male.png"), "--text", TEXT, "--out", str(out), "--json",
            "--render", render, *extra]


def baseline_models_root(tmp: Path) -> Path:
    """The models of this checkout with a cache of its own: the two checkouts' voice caches differ and
    would evict each other (every run would then fit its voice again)."""
    from digital_human.paths import models_root

    root = tmp / "baseline_models"
    root.mkdir(parents=True)
    for entry in models_root().iterdir():
        if entry.name == "cache":
            continue
        if entry.name == "kokoro":  # its derived graphs are versioned per checkout: shared, they would be
            own = root / entry.name  # rebuilt by each checkout in turn on every run (~10 s each)
            own.mkdir()
            for item in entry.iterdir():
                derived = item.suffix == ".source" or item.with_name(item.name + ".source").exists()
                if not derived:
                    (own / item.name).symlink_to(item)
            continue
        (root / entry.name).symlink_to(entry)
    return root


def run_once(out: Path, render: str, pythonpath: Path | None = None, models: Path | None = None,
             extra: tuple[str, ...] = ()) -> dict:
    env = dict(os.environ)
    if pythonpath is not None:  # a plain path entry wins over the editable install's finder
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    if models is not None:
        env["DIGITAL_HUMAN_MODELS"] = str(models)
    load_before = os.getloadavg()[0]
    used_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(main_job_command(out, render, extra), cwd=REPO.parent, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds of the run and its children (ffmpeg included): what a shared CPU's load changes least
    cpu = (used.ru_utime - used_before.ru_utime) + (used.ru_stime - used_before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"main job failed ({done.returncode}):\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return {"wall_s": wall, "cpu_s": cpu, "load_before": load_before, "report": report}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--render", nargs="+", default=["headless"], choices=["headless", "nodes"])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--baseline", type=Path, nargs="+", default=[],
                        help="folder(s), each holding an older checkout named digital_human")
    parser.add_argument("--models-dir", type=Path,
                        help="keep each checkout's models root (and so its fitted voice) here across invocations: "
                             "<dir>/this and <dir>/b<n>, made on first use")
    parser.add_argument("--no-idle-motion-row", action="store_true",
                        help="also time this checkout with --no-idle-motion (photos' blinks and head motion off)")
    args = parser.parse_args(argv)
    if REPO.name != "digital_human" and not (REPO.parent / "digital_human").exists():
        log("note: the pack is imported as `digital_human` from the installed package, not this checkout")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        # label -> (PYTHONPATH entry, models root, extra CLI arguments)
        keep = args.models_dir

        def own_models(name: str) -> Path:
            if keep is None:
                return baseline_models_root(Path(tmp) / name)
            root = keep / name / "baseline_models"
            return root if root.is_dir() else baseline_models_root(keep / name)

        this_models = own_models("this") if keep is not None else None
        checkouts: dict[str, tuple[Path | None, Path | None, tuple[str, ...]]] = {"": (None, this_models, ())}
        if args.no_idle_motion_row:
            checkouts["no idle motion "] = (None, None, ("--no-idle-motion",))
        for n, folder in enumerate(args.baseline):
            label = "baseline " if len(args.baseline) == 1 else f"baseline {folder} "
            checkouts[label] = (folder, own_models(f"b{n}"), ())
        for label, (path, models, extra) in checkouts.items():
            warm = run_once(Path(tmp) / "warm.mp4", args.render[0], path, models, extra)
            log(f"{label}unrecorded first run (fits the voice if its cache was cold): {warm['wall_s']:.1f} s")
        runs_by_row: dict[str, list[dict]] = {}
        for i in range(args.repeats):  # interleaved, so a change of load hits both checkouts alike
            for render in args.render:
                for label, (path, models, extra) in checkouts.items():
                    run = run_once(Path(tmp) / f"{render}_{i}.mp4", render, path, models, extra)
                    run["speech_s"] = float(run["report"]["audio_seconds"])  # the CLI's own report
                    run["rtf"] = run["wall_s"] / run["speech_s"]
                    log(f"{label}{render} run {i + 1}: {run['wall_s']:.1f} s wall, {run['cpu_s']:.1f} s CPU, speech {run['speech_s']:.2f} s, "
                        f"RTF {run['rtf']:.2f} (load before {run['load_before']:.2f})")
                    runs_by_row.setdefault(label + render, []).append(run)
        for row_name, runs in runs_by_row.items():
            walls = [r["wall_s"] for r in runs]
            rows[row_name] = {"runs": runs, "median_wall_s": statistics.median(walls), "min_wall_s": min(walls),
                              "max_wall_s": max(walls), "median_rtf": statistics.median(r["rtf"] for r in runs),
                              "median_cpu_s": statistics.median(r["cpu_s"] for r in runs)}
    print(f"nproc {os.cpu_count()}, load average at the end {os.getloadavg()}\n")
    print("| render | speech s | wall s per run (load before) | median wall s (spread) | median RTF | median CPU s |")
    print("|---|---|---|---|---|---|")
    for render, row in rows.items():
        runs = ", ".join(f"{r['wall_s']:.1f} ({r['load_before']:.2f})" for r in row["runs"])
        print(f"| {render} | {row['runs'][0]['speech_s']:.2f} | {runs} | {row['median_wall_s']:.1f} "
              f"({row['min_wall_s']:.1f}-{row['max_wall_s']:.1f}) | {row['median_rtf']:.2f} | {row['median_cpu_s']:.1f} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"nproc": os.cpu_count(), "text": TEXT, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
