"""The real ComfyUI frontend in headless Chromium (Playwright for Python, Apache-2.0, driving Debian's
`chromium`). Shared by the browser test and tools/export_workflows.py.

Everything here goes through the frontend's own objects (`window.app`, `LiteGraph`): workflows are built
with `app.loadApiJson` / `app.loadGraphData` and exported with `app.graph.serialize()`, so positional
widgets_values (seed control entries, upload buttons) are whatever the frontend itself writes.
"""
from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from harness import ComfyClient

SETTINGS = {
    # First-run UI (tutorial/template browser, release toasts) would cover the canvas.
    "Comfy.TutorialCompleted": True,
    "Comfy.InstalledVersion": "9.9.9",
    "Comfy.Release.Version": "9.9.9",
    "Comfy.Workflow.ShowMissingNodesWarning": True,
    "Comfy.Workflow.ShowMissingModelsWarning": True,
    "Comfy.Minimap.Visible": False,  # keeps screenshots/thumbnails to the graph itself
    "Comfy.Graph.CanvasInfo": False,
    "LiteGraph.Canvas.LowQualityRenderingZoomThreshold": 0.2,  # text stays readable in zoomed-out thumbnails
}


def chromium_path() -> str | None:
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


@contextmanager
def open_frontend(client: ComfyClient, width: int = 1400, height: int = 900) -> Iterator[Any]:
    """A page with the frontend loaded and the pack's node types registered; console errors collected."""
    from playwright.sync_api import sync_playwright

    exe = chromium_path()
    if exe is None:
        raise RuntimeError("no Chromium found: apt-get install chromium (or set CHROMIUM=/path/to/chrome)")
    for key, value in SETTINGS.items():
        client.request("POST", f"/settings/{key}", value)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, headless=True,
                                     args=["--no-sandbox", "--autoplay-policy=no-user-gesture-required"])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.dh_console = []  # type: ignore[attr-defined]
            page.on("console", lambda m: page.dh_console.append((m.type, m.text)))
            page.on("pageerror", lambda e: page.dh_console.append(("pageerror", f"{e}\n{getattr(e, 'stack', '')}")))
            page.goto(client.url + "/", wait_until="domcontentloaded", timeout=180_000)  # bounds: a busy CPU is slow
            page.wait_for_function("() => window.app && window.app.graph && window.LiteGraph && "
                                   "window.LiteGraph.registered_node_types['TRT_TTS']", timeout=240_000)
            page.wait_for_timeout(1000)  # extensions finish their setup hooks
            page.keyboard.press("Escape")  # close anything that popped up anyway
            yield page
        finally:
            browser.close()


def load_api(page: Any, prompt: dict[str, Any], name: str) -> None:
    page.evaluate("([p, n]) => window.app.loadApiJson(p, n)", [prompt, name])
    page.wait_for_timeout(500)


def load_ui(page: Any, graph: dict[str, Any], name: str) -> None:
    page.evaluate("async ([g, n]) => { await window.app.loadGraphData(g, true, true, n); }", [graph, name])
    page.wait_for_timeout(500)


def fix_seed_controls(page: Any) -> None:
    """Seeds stay as written ('fixed'): a template must not re-run the voice search on every queue."""
    page.evaluate("""() => {
      for (const node of window.app.graph.nodes) {
        for (const w of node.widgets ?? []) {
          if (w.name === 'control_after_generate') w.value = 'fixed';
        }
      }
    }""")


def fit_view(page: Any) -> None:
    page.evaluate("() => window.app.extensionManager.command.execute('Comfy.Canvas.FitView')")
    page.wait_for_timeout(500)


def serialize(page: Any) -> dict[str, Any]:
    return page.evaluate("() => JSON.parse(JSON.stringify(window.app.graph.serialize()))")


def graph_to_prompt(page: Any) -> dict[str, Any]:
    """The API prompt the frontend would post for the loaded graph (what Queue sends)."""
    return page.evaluate("async () => (await window.app.graphToPrompt()).output")


def graph_problems(page: Any) -> list[str]:
    """Missing node types, nodes whose widgets did not take the saved values, and list widgets (file names
    included) whose value is not one the server offers: what a user would see as a missing file."""
    return page.evaluate("""() => {
      const out = [];
      for (const node of window.app.graph.nodes) {
        if (!window.LiteGraph.registered_node_types[node.type]) out.push(`missing node type ${node.type}`);
        if (node.has_errors) out.push(`node ${node.id} (${node.type}) has errors`);
        for (const w of node.widgets ?? []) {
          if (w.value === undefined && w.serialize !== false && w.type !== 'button')
            out.push(`node ${node.id} widget ${w.name} is undefined`);
          const values = w.type === 'combo' ? w.options?.values : null;
          if (Array.isArray(values) && !values.includes(w.value))
            out.push(`node ${node.id} (${node.type}) ${w.name} '${w.value}' is not in its list`);
        }
      }
      return out;
    }""")


def dialogs_text(page: Any) -> str:
    """Text of any open dialog (missing nodes / models, load errors)."""
    return page.evaluate("() => [...document.querySelectorAll('.p-dialog')].map(d => d.innerText).join('\\n---\\n')")


def comparable(prompt: dict[str, Any]) -> dict[str, Any]:
    """API prompt reduced to what executes: class types and inputs (titles/_meta dropped)."""
    return {nid: {"class_type": n["class_type"], "inputs": n["inputs"]} for nid, n in prompt.items()}


def dump(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
