"""The bundled UI workflows in the real frontend (headless Chromium): load cleanly, queue, show results."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from browser import (chromium_path, comparable, dialogs_text, graph_problems, graph_to_prompt, load_ui,
                     open_frontend)
from harness import ARTIFACTS, WORKFLOWS, ComfyClient, load_api_workflow

pytest.importorskip("playwright", reason="pip install -r tests/comfyui/requirements.txt")
if chromium_path() is None:
    pytest.skip("no Chromium: apt-get install chromium (or set CHROMIUM)", allow_module_level=True)

UI_WORKFLOWS = sorted((WORKFLOWS.parent / "example_workflows").glob("*.json"))


def _our_page_errors(page) -> list[str]:
    return [text for kind, text in page.dh_console if kind == "pageerror" and "digital_human" in text]


@pytest.mark.parametrize("ui_path", UI_WORKFLOWS, ids=[p.stem for p in UI_WORKFLOWS])
def test_bundled_workflow_loads_without_errors(ui_path: Path, client: ComfyClient, uploaded: dict[str, str]) -> None:
    info = client.object_info()
    graph = client.get(f"/api/workflow_templates/digital_human/{ui_path.name}")
    graph = json.loads(graph) if isinstance(graph, bytes) else graph
    missing = sorted({n["type"] for n in graph["nodes"] if n["type"] not in info})
    if missing:
        pytest.skip(f"nodes not in this build yet: {missing}")
    assert graph == json.loads((WORKFLOWS / ui_path.name).read_text()), "workflows/ and example_workflows/ differ"
    api = load_api_workflow(WORKFLOWS / "api" / ui_path.name)
    with open_frontend(client) as page:
        load_ui(page, graph, ui_path.stem)
        assert graph_problems(page) == []
        assert not dialogs_text(page).strip(), dialogs_text(page)
        queued = graph_to_prompt(page)
        for nid, node in comparable(api).items():
            got = {k: v for k, v in queued[nid]["inputs"].items() if k in node["inputs"]}
            assert queued[nid]["class_type"] == node["class_type"] and got == node["inputs"], nid
        assert _our_page_errors(page) == []


def test_tts_player_and_status_line_show_the_result(client: ComfyClient, uploaded: dict[str, str]) -> None:
    graph = json.loads((WORKFLOWS.parent / "example_workflows" / "voice_only.json").read_text())
    tts = next(n for n in graph["nodes"] if n["type"] == "TRT_TTS")
    with open_frontend(client) as page:
        load_ui(page, graph, "voice_only")
        # A new seed so the TTS really runs (and reports progress) instead of coming from the cache.
        page.evaluate("([id, seed]) => { const n = window.app.graph.getNodeById(id); "
                      "n.widgets.find(w => w.name === 'seed').value = seed; }", [tts["id"], random.randrange(1, 2**30)])
        page.evaluate("() => window.app.queuePrompt(0, 1)")
        selector = "audio.dh-audio"
        try:
            page.wait_for_function(f"""() => {{
                const a = document.querySelector('{selector}');
                return a && a.src && a.readyState >= 1 && a.duration > 0.5;
            }}""", timeout=300_000)
        except Exception:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "voice_only_browser_FAILED.png"))
            (ARTIFACTS / "voice_only_browser_console.txt").write_text(
                "\n".join(f"{k}: {t}" for k, t in page.dh_console) + "\n\nqueue: " + json.dumps(client.get("/queue")))
            raise
        player = page.evaluate(f"""() => {{
            const a = document.querySelector('{selector}');
            return {{src: a.src, duration: a.duration, error: a.error && a.error.code}};
        }}""")
        status = page.evaluate("(id) => window.app.graph.getNodeById(id).dhStatus.textContent", tts["id"])
        page.evaluate("() => window.app.extensionManager.command.execute('Comfy.Canvas.FitView')")
        page.wait_for_timeout(800)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "voice_only_browser.png"))
        assert _our_page_errors(page) == []
    assert "/view?" in player["src"] and player["error"] is None, player
    # The player's file is the one the server reports and it is real audio.
    data = client.get("/view?" + player["src"].split("/view?", 1)[1])
    assert data[:4] == b"RIFF" and len(data) > 24000
    assert "backend" in status and "RTF" in status, status
