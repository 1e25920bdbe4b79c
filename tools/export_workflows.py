"""Produce the UI-format workflows (+ thumbnails) from workflows/api/*.json with the real ComfyUI frontend.

For each API workflow: start ComfyUI with this pack (loopback, scratch base dir), upload the sample
inputs, open the frontend in headless Chromium, build the graph with the frontend's own
`app.loadApiJson`, set seed controls to "fixed", export `app.graph.serialize()` (version 0.4, the
frontend's own positional widgets_values), then reload that export with `app.loadGraphData` and
check it: no missing nodes or dialogs, and `app.graphToPrompt()` gives back the API workflow. The
export goes to example_workflows/<name>.json, a canvas screenshot to example_workflows/<name>.jpg.

Layout: ComfyUI (app/custom_node_manager.py) lists `<pack>/{example_workflows,example,examples,workflow,
workflows}/*.json` as templates, so a UI file in both workflows/ and example_workflows/ shows up twice in
the template browser. The UI files therefore live only in example_workflows/ (the folder ComfyUI
recommends); workflows/ holds the API-format files in workflows/api/ (one level down, not matched by that
glob) and a README. Old UI copies left at workflows/<name>.json are removed so they cannot go stale.

    COMFYUI_DIR=/tmp/ComfyUI DIGITAL_HUMAN_MODELS=~/.cache/digital_human/models \\
        /tmp/comfy-venv/bin/python tools/export_workflows.py [--only voice_only]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "comfyui"))

from browser import (comparable, dialogs_text, dump, fit_view, fix_seed_controls, graph_problems,  # noqa: E402
                     graph_to_prompt, load_api, load_ui, open_frontend, serialize)
from harness import WORKFLOWS, ComfyClient, ComfyServer, prepare_base_dir, upload_workflow_inputs  # noqa: E402

UI_FOLDER = ROOT / "example_workflows"
FRONTEND_ONLY_INPUTS = {"audioUI", "video-preview"}  # core preview widgets (audio player, video_upload preview)
# appear in graphToPrompt; the server ignores inputs a node does not declare


def prompt_mismatch(expected: dict, got: dict) -> list[str]:
    """Differences between the API workflow and what the frontend would queue for the exported graph."""
    problems = []
    exp, have = comparable(expected), comparable(got)
    if set(exp) != set(have):
        problems.append(f"node ids differ: {sorted(exp)} vs {sorted(have)}")
    for nid in set(exp) & set(have):
        if exp[nid]["class_type"] != have[nid]["class_type"]:
            problems.append(f"node {nid}: {exp[nid]['class_type']} vs {have[nid]['class_type']}")
        got_inputs = {k: v for k, v in have[nid]["inputs"].items() if k not in FRONTEND_ONLY_INPUTS}
        if got_inputs != exp[nid]["inputs"]:
            problems.append(f"node {nid} inputs: expected {exp[nid]['inputs']}, frontend gives {got_inputs}")
    return problems


def export(client: ComfyClient, api_path: Path, data_dir: Path, targets: list[Path]) -> None:
    name = api_path.stem
    prompt = upload_workflow_inputs(client, api_path, data_dir)
    with open_frontend(client, width=1200, height=700) as page:
        load_api(page, prompt, name)
        # loadApiJson arranges the graph before image/video previews have loaded and grown their nodes
        # (LoadImage would overlap the node below it): arrange again once they have.
        page.wait_for_timeout(2000)
        page.evaluate("() => { window.app.graph.arrange(); window.app.graph.setDirtyCanvas(true, true); }")
        fix_seed_controls(page)
        graph = serialize(page)
        # Validate the export the way a user loads it.
        load_ui(page, graph, name)
        issues = graph_problems(page) + prompt_mismatch(prompt, graph_to_prompt(page))
        dialogs = dialogs_text(page)
        if dialogs.strip():
            issues.append(f"dialog open after load: {dialogs[:500]}")
        if issues:
            raise SystemExit(f"{name}: exported graph does not round-trip:\n  " + "\n  ".join(issues))
        fit_view(page)
        shot = Path(tempfile.mkdtemp()) / f"{name}.jpg"
        box = page.locator("canvas#graph-canvas").bounding_box()
        top = 40  # below the workflow tabs
        page.screenshot(path=str(shot), type="jpeg", quality=75,
                        clip={"x": box["x"], "y": box["y"] + top, "width": box["width"], "height": box["height"] - top - 70})  # above the canvas toolbar
    for folder in targets:
        folder.mkdir(parents=True, exist_ok=True)
        dump(folder / f"{name}.json", graph)
        shutil.copyfile(shot, folder / f"{name}.jpg")
    for stale in (WORKFLOWS / f"{name}.json", WORKFLOWS / f"{name}.jpg"):
        stale.unlink(missing_ok=True)  # a second copy would be listed twice as a template
    print(f"{name}: {len(graph['nodes'])} nodes, {len(graph['links'])} links -> "
          + ", ".join(str(t.relative_to(ROOT)) for t in targets))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comfyui-dir", default=os.environ.get("COMFYUI_DIR"), help="ComfyUI checkout")
    parser.add_argument("--python", default=os.environ.get("COMFYUI_PYTHON", sys.executable))
    parser.add_argument("--models", default=os.environ.get("DIGITAL_HUMAN_MODELS"), help="pack models root")
    parser.add_argument("--data", default=os.environ.get("DIGITAL_HUMAN_DATA", str(ROOT.parent / "shared" / "data")))
    parser.add_argument("--only", nargs="*", help="workflow names (default: every workflows/api/*.json)")
    args = parser.parse_args()
    if not args.comfyui_dir:
        parser.error("set COMFYUI_DIR or --comfyui-dir")
    comfy = Path(args.comfyui_dir).expanduser().resolve()
    apis = sorted((WORKFLOWS / "api").glob("*.json"))
    if args.only:
        apis = [p for p in apis if p.stem in args.only]
    with tempfile.TemporaryDirectory(prefix="dh-export-") as tmp:
        base = prepare_base_dir(Path(tmp), comfy)
        env = {"DIGITAL_HUMAN_MODELS": str(Path(args.models).expanduser())} if args.models else {}
        server = ComfyServer(comfy, base, python=args.python, env=env).start()
        try:
            client = ComfyClient(server.url, timeout=60)
            info = client.object_info()
            for api_path in apis:
                missing = sorted({n["class_type"] for n in json.loads(api_path.read_text()).values()
                                  if n["class_type"] not in info})
                if missing:
                    print(f"{api_path.stem}: skipped, nodes not registered: {missing}")
                    continue
                export(client, api_path, Path(args.data), [UI_FOLDER])
        finally:
            server.stop()


if __name__ == "__main__":
    main()
