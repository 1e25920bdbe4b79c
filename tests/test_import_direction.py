"""The main job is one library function that `run`, `batch` and `serve` call, and none of them imports
another (DESIGN 5e): the imports only flow cli -> batch -> pipeline and cli -> pipeline."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imported_modules(path: Path, package: str) -> set[str]:
    """Every module a file imports (relative imports resolved against `package`), at any depth."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[:len(parts) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def _imports_of(folder: str) -> dict[str, set[str]]:
    out = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        package = ".".join(("digital_human", *rel.parts[:-1])) if rel.name != "__init__" else \
            ".".join(("digital_human", *rel.parts[:-1]))
        out[str(path.relative_to(ROOT))] = _imported_modules(path, package)
    return out


def _touches(modules: set[str], name: str) -> list[str]:
    return sorted(m for m in modules if m == name or m.startswith(name + "."))


def test_batch_and_pipeline_never_import_the_cli() -> None:
    for folder in ("batch", "pipeline"):
        for path, modules in _imports_of(folder).items():
            assert not _touches(modules, "digital_human.cli"), f"{path} imports the CLI"


def test_pipeline_never_imports_batch() -> None:
    for path, modules in _imports_of("pipeline").items():
        assert not _touches(modules, "digital_human.batch"), f"{path} imports batch"


def test_run_batch_and_cli_share_one_main_job() -> None:
    from digital_human import cli
    from digital_human.pipeline import main_job, run_args

    assert cli.run_main_job is main_job.run_main_job
    parser = cli.build_parser()
    args = parser.parse_args(["run", "--text", "hi", "--voice", "v.wav", "--face", "f.png", "--out", "o.mp4"])
    assert args.func is main_job.run_main_job
    # the batch's job files are checked against the very same option set
    own = run_args.parse_run_args(["--text", "hi", "--voice", "v.wav", "--face", "f.png", "--out", "o.mp4"])
    assert {k: v for k, v in vars(args).items() if k not in ("func", "command", "verbose")} == vars(own)
