"""First-use voice fit time: what a user waits the first time a clip is used (issue 18: <= 60 s).

Run from the repo root (the pack must be importable as `digital_human`):

    python benchmarks/voice_fit_time.py [--clips spk_en_male_04_bilingual spk_en_female_02:25] [--repeats 3]

Per clip (NAME or NAME:SECONDS to use only the first SECONDS of it) and repeat, with the voice cache
bypassed (nothing read from or written to it, as on a first use): prepare the clip, build the
speaker profile (GE2E + pitch) and fit the voice with the default settings. The bundled voices'
probe pitch is cached by `digital-human setup` (voice/clone.py); the first repeat of a run where
that cache is missing also measures it, which the report shows. Reports the median of the repeats,
the load average (the CPU is shared), the process CPU time and the number of syntheses, and (JSON)
what was fitted. DIGITAL_HUMAN_FIT_WORKERS=1 gives the sequential fit (voice/parallel.py); the fit's
own single-thread sessions are opened by the first fit of the process, so the first repeat pays
for that (~2 s) as a user's first fit does.

Two code versions, interleaved on a shared CPU (e.g. a baseline worktree against this checkout):

    python benchmarks/voice_fit_time.py --trees /tmp/base18 /work/main --repeats 3 --json out.json

runs every fit in a fresh process (as the CLI's `run` does) with the pack imported from each tree in
turn, alternating which tree goes first per repeat. A tree is a folder holding the pack as
`digital_human`, or the pack's own root (then its parent must import it as `digital_human`, e.g.
through the editable install). Each process loads the models and librosa before the clock starts.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "audio"
DEFAULT_CLIPS = ["spk_en_male_04_bilingual", "spk_en_female_02:25"]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def clip_path(data: Path, name: str) -> Path:
    found = sorted(p for p in data.iterdir() if p.stem == name)
    if not found:
        raise SystemExit(f"clip '{name}' not found in {data}")
    return found[0]


def fit_once(path: Path, seconds: float | None) -> dict:
    from digital_human.audio import decode_audio, prepare_reference
    from digital_human.voice.clone import fit_voice, uncached_pitch_count, PROBES
    from digital_human.voice.speaker import extract_speaker_profile
    from digital_human.voice.tts import bundled_voices

    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    cpu_start = time.process_time()
    wave, rate = decode_audio(path, max_seconds=seconds)
    prepared = prepare_reference(wave, rate, source=path.name)
    t_prepare = time.perf_counter() - start
    profile = extract_speaker_profile(prepared, cache=False)
    t_profile = time.perf_counter() - start - t_prepare
    pitch_uncached = uncached_pitch_count(bundled_voices(), PROBES["en"], "auto", "auto")
    steps = []
    fitted, result = fit_voice(profile, reference=prepared, progress=lambda d, t: steps.append((d, t)))
    total = time.perf_counter() - start
    return {"seconds": total, "prepare_s": t_prepare, "profile_s": t_profile, "fit_s": total - t_prepare - t_profile,
            "speech_s": prepared.speech_seconds, "syntheses": result.evaluations,
            "probe_pitch_uncached_voices": pitch_uncached, "progress_calls": len(steps),
            "base_voice": result.base_voice, "load_before": load_before, "load_after": os.getloadavg()[0],
            "cpu_s": time.process_time() - cpu_start, "fit_workers": _fit_workers(),
            # what was fitted, to check that two versions (or worker counts) fit the same voice
            "similarity": float(result.similarity), "base_similarity": float(result.base_similarity),
            "f0_scale": float(result.f0_scale), "formant_scale": float(result.formant_scale),
            "voice_scores": {k: float(v) for k, v in result.voice_scores.items()},
            "history": [float(v) for v in result.history],
            "timbre_offset_norm": float((result.timbre_offset.astype("float64") ** 2).sum() ** 0.5)}


def _fit_workers() -> int:
    try:
        from digital_human.voice.parallel import fit_workers
    except ImportError:  # a version before voice/parallel.py: the sequential fit
        return 1
    return fit_workers()


def _warm_up() -> None:
    import librosa  # noqa: F401  (a CLI run has imported it before the fit; a library import, not fit work)
    from digital_human.voice.tts import synthesize_speech

    synthesize_speech("Warm up.")  # model load is not part of a fit (the node loads it once per process)


def fit_in_process(tree: Path, spec: str, data: Path) -> dict:
    """One fit of clip `spec` in a fresh Python process that imports the pack from `tree`."""
    env = dict(os.environ)
    if (tree / "digital_human" / "__init__.py").is_file():  # a folder holding the pack
        env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", spec, "--data", str(data)]
    out = subprocess.run(cmd, env=env, cwd=str(tree), capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"fit of {spec} with {tree} failed:\n{out.stderr[-3000:]}")
    run = json.loads(out.stdout.strip().splitlines()[-1])
    run["tree"] = str(tree)
    return run


def one(spec: str, data: Path) -> int:
    """--one: warm up, fit once, print the run as one JSON line (the child of fit_in_process)."""
    import digital_human

    _warm_up()
    name, _, secs = spec.partition(":")
    run = fit_once(clip_path(data, name), float(secs) if secs else None)
    run["pack"] = str(Path(digital_human.__file__).resolve().parent)
    print(json.dumps(run))
    return 0


def compare_trees(args) -> int:
    rows = []
    for spec in args.clips:
        runs: dict[str, list] = {str(t): [] for t in args.trees}
        for i in range(args.repeats):
            for tree in (args.trees if i % 2 == 0 else args.trees[::-1]):
                run = fit_in_process(tree, spec, args.data)
                log(f"{spec} run {i + 1} {tree}: {run['seconds']:.1f} s (cpu {run['cpu_s']:.1f} s, "
                    f"{run['syntheses']} syntheses, {run['base_voice']}, load {run['load_before']:.1f} -> "
                    f"{run['load_after']:.1f})")
                runs[str(tree)].append(run)
        for tree, rs in runs.items():
            rows.append({"clip": spec, "tree": tree, "pack": rs[0].get("pack"), **_summary(rs)})
    _report(rows, {"code": lambda row: row["tree"]}, args.json)
    return 0


def _summary(runs: list[dict]) -> dict:
    seconds = [r["seconds"] for r in runs]
    return {"runs": runs, "median_s": statistics.median(seconds), "min_s": min(seconds), "max_s": max(seconds),
            "median_cpu_s": statistics.median(r["cpu_s"] for r in runs)}


def _report(rows: list[dict], variant_columns: dict, json_path: Path | None) -> None:
    """The markdown table (one row per clip and variant; `variant_columns`: header -> cell of a row) and the JSON."""
    print(f"nproc {os.cpu_count()}, load average at the end {os.getloadavg()}\n")
    headers = ["clip", *variant_columns, "base voice", "syntheses", "fit s per run (load 1-min avg before)",
               "median s (min-max)", "median CPU s"]
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for row in rows:
        r0 = row["runs"][0]
        runs = ", ".join(f"{r['seconds']:.0f} ({r['load_before']:.1f})" for r in row["runs"])
        cells = [row["clip"], *(cell(row) for cell in variant_columns.values()), r0["base_voice"], r0["syntheses"],
                 runs, f"{row['median_s']:.0f} ({row['min_s']:.0f}-{row['max_s']:.0f})", f"{row['median_cpu_s']:.0f}"]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    if json_path:
        json_path.write_text(json.dumps({"nproc": os.cpu_count(), "rows": rows}, indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--clips", nargs="+", default=DEFAULT_CLIPS, help="NAME or NAME:SECONDS")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--workers", type=int, nargs="+", default=[],
                        help="fit with each of these worker counts (DIGITAL_HUMAN_FIT_WORKERS) in every repeat, "
                             "alternating which goes first: old (1 = sequential) vs new interleaved on a shared CPU")
    parser.add_argument("--trees", type=Path, nargs="+", default=[],
                        help="code trees to compare, one fresh process per fit, interleaved (see above)")
    parser.add_argument("--one", metavar="CLIP", help=argparse.SUPPRESS)  # child of --trees
    args = parser.parse_args(argv)
    if args.one:
        return one(args.one, args.data)
    if args.trees:
        return compare_trees(args)
    _warm_up()
    rows = []
    variants = args.workers or [None]
    for spec in args.clips:
        name, _, secs = spec.partition(":")
        path = clip_path(args.data, name)
        runs: dict = {w: [] for w in variants}
        for i in range(args.repeats):
            for w in (variants if i % 2 == 0 else variants[::-1]):
                if w is not None:
                    os.environ["DIGITAL_HUMAN_FIT_WORKERS"] = str(w)
                run = fit_once(path, float(secs) if secs else None)
                log(f"{spec} run {i + 1}{'' if w is None else f' workers {w}'}: {run['seconds']:.1f} s "
                    f"(cpu {run['cpu_s']:.1f} s, {run['syntheses']} syntheses, load {run['load_before']:.1f} -> "
                    f"{run['load_after']:.1f})")
                runs[w].append(run)
        for w, rs in runs.items():
            rows.append({"clip": spec, "workers": rs[0]["fit_workers"], **_summary(rs)})
    _report(rows, {"workers": lambda row: row["workers"],
                   "speech s": lambda row: f"{row['runs'][0]['speech_s']:.1f}"}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
