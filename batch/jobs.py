"""The job file: one JSON object per line, each a `run` (same option names, `_` or `-`), plus `name`.

    {"name": "intro", "text": "Hello.", "voice": "me.wav", "face": "me.jpg"}
    {"text_file": "lesson2.txt", "speaker": "me.npz", "face": "me.mp4", "model": "clone:me", "speed": 1.1}

Relative paths are relative to the job file's folder. Each job is checked on the driver with
`run`'s own parser (same defaults and choices), so a bad line fails alone with its line number,
before any worker starts. A job's content key hashes its normalised options and the contents of
its input files: the output is named by it, so re-running the same file skips finished jobs, and
editing a job (or replacing a file's contents) renders it again.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..assets.pypi_fetch import sha256_file

FORMAT_VERSION = 1  # part of every key: bump when the same job would render differently
FILE_OPTIONS = ("voice", "speaker", "face")  # shipped to the workers by content
NOT_JOB_OPTIONS = frozenset({"help", "out", "json"})  # `run` options a job may not set
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # output file names stay inside --out


@dataclass(frozen=True)
class InputFile:
    """A job's input file, identified by its contents."""

    path: Path
    sha256: str

    @property
    def name(self) -> str:
        return self.path.name


@dataclass
class Job:
    """One line of the job file. `error` is set when the line cannot run (then key may be empty)."""

    index: int
    line: int
    name: str = ""
    options: dict[str, Any] = field(default_factory=dict)  # normalised `run` options, files excluded
    files: dict[str, InputFile] = field(default_factory=dict)  # option -> file
    key: str = ""
    error: str | None = None

    @property
    def label(self) -> str:
        return f"job {self.index} (line {self.line}{', ' + self.name if self.name else ''})"

    def output_name(self) -> str:
        stem = f"{self.name}-{self.key[:16]}" if self.name else self.key[:16]
        return f"{stem}.mp4"

    def run_argv(self, paths: dict[str, Path], out: Path) -> list[str]:
        """`run` arguments with the files at `paths` (where the worker keeps them)."""
        argv = ["--out", str(out)]
        for option, path in paths.items():
            argv += [f"--{option.replace('_', '-')}", str(path)]
        for dest, value in self.options.items():
            action = _run_actions()[dest]
            if action.nargs == 0:  # a flag: present when true
                if value:
                    argv.append(action.option_strings[-1])
            elif value is not None:
                argv += [action.option_strings[-1], str(value)]
        return argv

    def voice_fit_key(self) -> str | None:
        """Content key of this job's voice fit (clip + fit options), or None with a saved speaker."""
        voice = self.files.get("voice")
        if voice is None:
            return None
        fit = {"format": FORMAT_VERSION, "voice": voice.sha256, "voice_text": self.options.get("voice_text"),
               "no_imitate": bool(self.options.get("no_imitate")), "backend": self.options.get("backend")}
        return _sha256_text(json.dumps(fit, sort_keys=True))


@lru_cache(maxsize=1)
def _run_actions() -> dict[str, argparse.Action]:
    """`run`'s options by dest, from the command line's own parser (one source of truth)."""
    from ..pipeline.run_args import run_parser

    return {a.dest: a for a in run_parser()._actions if a.option_strings and a.dest not in NOT_JOB_OPTIONS}


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def parse_job(obj: Any, index: int, line: int, base: Path, hashes: dict[Path, str] | None = None) -> Job:
    """One job from its JSON value; problems raise ValueError naming the field and the fix."""
    from ..pipeline.run_args import parse_run_args

    job = Job(index=index, line=line)
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object like {{\"text\": ..., \"voice\": ..., \"face\": ...}}, "
                         f"got {type(obj).__name__}")
    obj = {str(k).replace("-", "_"): v for k, v in obj.items() if v is not None}  # null = not given
    name = obj.pop("name", "")
    if name and (not isinstance(name, str) or not _NAME_RE.match(name)):
        raise ValueError(f"name {name!r} must be 1-64 letters, digits, '.', '_' or '-' (it names the output file)")
    job.name = name or ""
    known = _run_actions()
    unknown = sorted(set(obj) - set(known) - {"text_file"})
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}; a job takes name and `run`'s options: "
                         f"{', '.join(sorted(set(known) | {'name'}))}")
    hashes = {} if hashes is None else hashes
    paths: dict[str, Path] = {}
    for option in (*FILE_OPTIONS, "text_file"):
        if obj.get(option) in (None, ""):
            obj.pop(option, None)
            continue
        if not isinstance(obj[option], str):
            raise ValueError(f"{option} must be a file path (a string), got {obj[option]!r}")
        path = (base / obj.pop(option)).expanduser()
        if not path.is_file():
            raise ValueError(f"{option} file '{path}' not found (relative paths start at the job file's "
                             f"folder {base}); fix the path or remove the job")
        paths[option] = path.resolve()
    if "text_file" in paths:
        if "text" in obj:
            raise ValueError("give text or text_file, not both")
        try:
            obj["text"] = paths.pop("text_file").read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"text_file is not UTF-8 text ({exc}); save it as UTF-8") from None
    # `run`'s parser checks the rest (required fields, choices, numbers) and fills in its defaults.
    argv = ["--out", "job.mp4"]
    for option, path in paths.items():
        argv += [f"--{option}", str(path)]
    for dest, value in obj.items():
        action = known[dest]
        if action.nargs == 0:
            if not isinstance(value, bool):
                raise ValueError(f"{dest} is a switch: true or false, got {value!r}")
            if value:
                argv.append(action.option_strings[-1])
        elif value is not None:
            if isinstance(value, (dict, list, bool)):
                raise ValueError(f"{dest} must be a string or a number, got {value!r}")
            argv += [action.option_strings[-1], str(value)]
    args = parse_run_args(argv)
    job.options = {dest: getattr(args, dest) for dest in sorted(known)
                   if dest not in (*FILE_OPTIONS, "text_file")}
    for option, path in paths.items():
        if path not in hashes:
            hashes[path] = sha256_file(path)
        job.files[option] = InputFile(path, hashes[path])
    content = {"format": FORMAT_VERSION, "options": job.options,
               "files": {option: f.sha256 for option, f in sorted(job.files.items())}}
    job.key = _sha256_text(json.dumps(content, sort_keys=True, default=str))
    return job


def read_jobs(jobs_file: Path) -> list[Job]:
    """Every non-blank line of the file as a Job; a line that cannot run carries its error."""
    jobs_file = Path(jobs_file)
    if not jobs_file.is_file():
        raise FileNotFoundError(f"job file '{jobs_file}' not found")
    base = jobs_file.resolve().parent
    hashes: dict[Path, str] = {}  # a clip shared by 500 jobs is hashed once
    jobs: list[Job] = []
    for number, raw in enumerate(jobs_file.read_text(encoding="utf-8").splitlines(), start=1):
        if not raw.strip():
            continue
        index = len(jobs)
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            jobs.append(Job(index=index, line=number, error=f"line {number}: not valid JSON ({exc.msg} at column "
                                                            f"{exc.colno}); one JSON object per line"))
            continue
        try:
            jobs.append(parse_job(obj, index, number, base, hashes))
        except ValueError as exc:
            name = obj.get("name", "") if isinstance(obj, dict) and isinstance(obj.get("name"), str) else ""
            jobs.append(Job(index=index, line=number, name=name if _NAME_RE.match(name or "-") else "",
                            error=f"line {number}: {exc}"))
    if not jobs:
        raise ValueError(f"job file '{jobs_file}' has no jobs (one JSON object per line)")
    return jobs
