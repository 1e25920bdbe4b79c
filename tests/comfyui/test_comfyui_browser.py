"""The bundled UI workflows in the real frontend (headless Chromium): load cleanly, queue, show results."""
from __future__ import annotations

import json
import random
import urllib.parse
from pathlib import Path

import pytest

from browser import (chromium_path, comparable, dialogs_text, graph_problems, graph_to_prompt, load_ui,
                     open_frontend)
from harness import ARTIFACTS, UI_TEMPLATES, ComfyClient, api_workflow, load_api_workflow, ui_template

pytest.importorskip("playwright", reason="pip install -r tests/comfyui/requirements.txt")
if chromium_path() is None:
    pytest.skip("no Chromium: apt-get install chromium (or set CHROMIUM)", allow_module_level=True)

UI_WORKFLOWS = sorted(UI_TEMPLATES.glob("*.json"))
FRONTEND_NODES = {"MarkdownNote", "Note", "Reroute", "PrimitiveNode"}  # the frontend's own: not in /object_info


def _our_page_errors(page) -> list[str]:
    return [text for kind, text in page.dh_console if kind == "pageerror" and "digital_human" in text]


def _save_failure(page, client: ComfyClient, name: str) -> None:
    """Screenshot, browser console and the server queue of a failed wait, under artifacts/."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}_browser_FAILED.png"))
    (ARTIFACTS / f"{name}_browser_console.txt").write_text(
        "\n".join(f"{k}: {t}" for k, t in page.dh_console) + "\n\nqueue: " + json.dumps(client.get("/queue")))


@pytest.mark.parametrize("ui_path", UI_WORKFLOWS, ids=[p.stem for p in UI_WORKFLOWS])
def test_bundled_workflow_loads_without_errors(ui_path: Path, client: ComfyClient, samples: dict[str, str]) -> None:
    """As a user opens it from the template browser after `setup`: no missing node, no missing file (every
    list widget, the sample file names included, holds a value the server offers), no dialog."""
    info = client.object_info()
    graph = client.get(f"/api/workflow_templates/digital_human/{urllib.parse.quote(ui_path.name)}")
    graph = json.loads(graph) if isinstance(graph, bytes) else graph
    missing = sorted({n["type"] for n in graph["nodes"] if n["type"] not in info and n["type"] not in FRONTEND_NODES})
    if missing:
        pytest.skip(f"nodes not in this build yet: {missing}")
    assert graph == json.loads(ui_path.read_text()), "the served template is not example_workflows/" + ui_path.name
    api = load_api_workflow(api_workflow(ui_path))
    with open_frontend(client) as page:
        load_ui(page, graph, ui_path.stem)
        assert graph_problems(page) == []
        assert not dialogs_text(page).strip(), dialogs_text(page)
        queued = graph_to_prompt(page)
        for nid, node in comparable(api).items():
            got = {k: v for k, v in queued[nid]["inputs"].items() if k in node["inputs"]}
            assert queued[nid]["class_type"] == node["class_type"] and got == node["inputs"], nid
        assert _our_page_errors(page) == []


def test_tts_player_and_status_line_show_the_result(client: ComfyClient, samples: dict[str, str]) -> None:
    graph = json.loads(ui_template("voice_only").read_text())
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
            _save_failure(page, client, "voice_only")
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


def test_video_player_shows_the_clone_from_photo_mp4(client: ComfyClient, samples: dict[str, str]) -> None:
    ui_path = ui_template("clone_from_photo")
    graph = json.loads(ui_path.read_text())  # as shipped: its sample inputs are in input/ after setup
    head = next(n for n in graph["nodes"] if n["type"] == "TRT_TalkingHead")
    mux = next(n for n in graph["nodes"] if n["type"] == "VideoMux")
    with open_frontend(client) as page:
        load_ui(page, graph, "clone_from_photo")
        assert graph_problems(page) == [] and not dialogs_text(page).strip(), dialogs_text(page)
        # A new talking-head seed so the video part really runs instead of coming from the cache.
        page.evaluate("([id, seed]) => { const n = window.app.graph.getNodeById(id); "
                      "n.widgets.find(w => w.name === 'seed').value = seed; }", [head["id"], random.randrange(1, 2**30)])
        page.evaluate("() => window.app.queuePrompt(0, 1)")
        try:
            page.wait_for_function("""(id) => {
                const v = window.app.graph.getNodeById(id)?.dhMedia;
                return v && v.src && v.readyState >= 1 && v.duration > 1 && v.videoWidth > 0;
            }""", arg=mux["id"], timeout=400_000)
        except Exception:
            _save_failure(page, client, "clone_from_photo")
            raise
        player = page.evaluate("""(id) => {
            const v = window.app.graph.getNodeById(id).dhMedia;
            return {tag: v.tagName, src: v.src, duration: v.duration, width: v.videoWidth, height: v.videoHeight,
                    error: v.error && v.error.code, canH264: v.canPlayType('video/mp4; codecs="avc1.42E01E, mp4a.40.2"')};
        }""", mux["id"])
        # Seek into the clip and wait for a decoded frame: the source is playable, not just probed.
        page.evaluate("(id) => { const v = window.app.graph.getNodeById(id).dhMedia; v.currentTime = 1.0; }", mux["id"])
        page.wait_for_function("(id) => window.app.graph.getNodeById(id).dhMedia.readyState >= 2", arg=mux["id"],
                               timeout=30_000)
        status = {n["type"]: page.evaluate("(id) => window.app.graph.getNodeById(id).dhStatus.textContent", n["id"])
                  for n in (head, mux)}
        page.evaluate("() => window.app.extensionManager.command.execute('Comfy.Canvas.FitView')")
        page.wait_for_timeout(1000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "clone_from_photo_browser.png"))
        assert _our_page_errors(page) == []
    assert player["tag"] == "VIDEO" and "/view?" in player["src"] and player["error"] is None, player
    assert player["canH264"] in ("probably", "maybe"), player
    assert player["width"] > 0 and player["height"] > 0, player
    data = client.get("/view?" + player["src"].split("/view?", 1)[1])
    assert data[4:8] == b"ftyp" and len(data) > 10_000, data[:16]
    assert "frames generated" in status["TRT_TalkingHead"], status
    assert "h264" in status["VideoMux"] and "aac" in status["VideoMux"], status


def test_template_browser_shows_titled_cards_with_thumbnails(client: ComfyClient, samples: dict[str, str]) -> None:
    """Workflow > Browse Templates: the pack's category (titled by locales/en/main.json) lists one card per
    template with its title and a thumbnail that loaded (a frame of the result)."""
    titles = sorted(p.stem for p in UI_WORKFLOWS)
    with open_frontend(client) as page:
        page.evaluate("() => window.app.extensionManager.command.execute('Comfy.BrowseTemplates')")
        category = page.get_by_text("Digital Human Clone", exact=True).first
        category.wait_for(timeout=30_000)
        category.click()
        cards = {}
        for title in titles:
            card = page.locator(f'[data-testid="template-workflow-{title}"]')
            card.wait_for(timeout=30_000)
            card.scroll_into_view_if_needed(timeout=30_000)  # two cards a row: the later rows are below the fold
            card.locator("img").first.wait_for(timeout=30_000)
            page.wait_for_function("(el) => [...el.querySelectorAll('img')].some(i => i.complete && i.naturalWidth > 0)",
                                   arg=card.element_handle(), timeout=30_000)
            cards[title] = card.inner_text()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "template_browser.png"))
        assert _our_page_errors(page) == []
    for title, text in cards.items():
        assert title in text, (title, text)
