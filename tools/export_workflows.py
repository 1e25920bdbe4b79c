"""Produce the UI-format workflows (+ thumbnails) from workflows/api/*.json with the real ComfyUI frontend.

For each API workflow: start ComfyUI with this pack (loopback, scratch base dir), upload the sample
inputs, open the frontend in headless Chromium, build the graph with the frontend's own
`app.loadApiJson`, set seed controls to "fixed", export `app.graph.serialize()` (version 0.4, the
frontend's own positional widgets_values), then reload that export with `app.loadGraphData` and
check it: no missing nodes or dialogs, and `app.graphToPrompt()` gives back the API workflow. Before the
export it lays the nodes out in titled groups (voice, face, talking head, video) and adds a Markdown note
saying what to upload and what each model needs. The export goes to example_workflows/<card title>.json
(ComfyUI 0.3.64's template browser shows the file name as the card's title and description; see
harness.TEMPLATE_TITLES). Thumbnails are frames of the result: tools/make_thumbnails.py.

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
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "comfyui"))

from browser import (comparable, dialogs_text, dump, fit_view, fix_seed_controls, graph_problems,  # noqa: E402
                     graph_to_prompt, load_api, load_ui, open_frontend, serialize)
from harness import (ARTIFACTS, WORKFLOWS, ComfyClient, ComfyServer, load_api_workflow,  # noqa: E402
                     prepare_base_dir, ui_template)

UI_FOLDER = ROOT / "example_workflows"
SETUP_LINE = ("**First time?** Run `python -m digital_human setup` once: it installs the models and puts the sample "
              "inputs (`digital_human_sample_*`) into ComfyUI's input folder, so this template runs as shipped. "
              "Then press **Run**, or upload your own files in the nodes named below.")
VOICE_TEXT = ("**Voice** (Load Reference Audio): upload a clip of the person speaking - 3 s to 10 min of one "
              "voice (wav, mp3, m4a, flac, ogg); 10-30 s of clear speech works best. The first run of a new clip "
              "fits a voice (14 short syntheses: about a minute on a 2-core CPU), later runs reuse it from the cache. "
              "Type the text in **TTS in Cloned Voice** (English or Mandarin).")
PHOTO_TEXT = ("**Face** (Load Image): upload a frontal photo with one clear face (png, jpg). The **Frame Rate** "
              "node is the one clock every video node reads.")
MODELS_TEXT = ("**Models** (all installed by setup, nothing is downloaded at run time): speaker encoder GE2E and "
               "TTS Kokoro-82M (both Apache-2.0); face detector and 468-point mesh from MediaPipe (Apache-2.0). "
               "Talking head `portrait` needs no weights; `clone:<name>` is trained by **Train Avatar** on at least "
               "20 s of talking footage of the person.")
SAMPLES_TEXT = ("Sample inputs: NASA's portrait of astronaut Eileen Collins (public domain), a voice the pack "
                "speaks with its bundled Kokoro voice, and a video the pack animated from the two.")
# Per API workflow: the note and the groups, as columns of groups (each group lays its nodes left to right).
LAYOUTS = {
    "voice_only": {
        "note": ["## Voice clone", "Text to speech in the voice of a short clip.", SETUP_LINE, VOICE_TEXT,
                 "The speech is saved by **Save speech** (FLAC in ComfyUI's output folder) and plays in the node.",
                 MODELS_TEXT, SAMPLES_TEXT],
        "columns": [[("Voice: reference clip -> cloned voice -> speech", ["1", "2", "3"], "#2a4858")],
                    [("Output", ["4"], "#3f5a3a")]],
    },
    "clone_from_photo": {
        "note": ["## Talking photo", "A photo and a voice clip become a lip-synced MP4 of the person saying your "
                 "text in their voice.", SETUP_LINE, VOICE_TEXT, PHOTO_TEXT,
                 "**Talking head** (`portrait`) moves the mouth from the speech; **Temporal Smooth** removes "
                 "flicker; **Video Mux** writes the MP4 (H.264 + AAC) to the output folder and plays it.",
                 MODELS_TEXT, SAMPLES_TEXT],
        "columns": [[("Voice: reference clip -> cloned voice -> speech", ["1", "2", "3"], "#2a4858"),
                     ("Face: photo -> aligned face", ["4", "5", "6"], "#5a4a2a")],
                    [("Talking head: lips from the speech", ["7", "8"], "#4a2a58")],
                    [("Video: MP4 with the speech", ["9"], "#3f5a3a")]],
    },
    "clone_from_photo_fast": {
        "note": ["## Talking photo (fast)", "As *Talking photo*, with one **Talking Head to Video** node doing the "
                 "talking head, smoothing and MP4 in one go (frames stay on the GPU: 1.6-2.6x faster there; the "
                 "same frames to rounding). Use the other template to edit frames in between.", SETUP_LINE,
                 VOICE_TEXT, PHOTO_TEXT, MODELS_TEXT, SAMPLES_TEXT],
        "columns": [[("Voice: reference clip -> cloned voice -> speech", ["1", "2", "3"], "#2a4858"),
                     ("Face: photo -> aligned face", ["4", "5", "6"], "#5a4a2a")],
                    [("Talking head and video: lips from the speech -> MP4", ["7"], "#4a2a58")]],
    },
    "clone_from_video": {
        "note": ["## Clone from video", "A talking video of one person (at least 20 s with the face visible and "
                 "their own voice on the sound track) trains a clone model of that person, which then says your "
                 "text in their voice.", SETUP_LINE,
                 "**Video** (Load Reference Video): upload the talking video (mp4, mov, webm, mkv). Its sound is "
                 "the reference voice and its frame rate is the one clock.",
                 "**Train Avatar** trains the `clone` model (resumes from its checkpoint; on a CPU it stops at "
                 "the time budget, 10 min by default). Once trained, pick `clone:<name>` in the talking head "
                 "and remove Train Avatar to skip training.", MODELS_TEXT, SAMPLES_TEXT],
        "columns": [[("Face: video -> aligned faces", ["1", "4"], "#5a4a2a"),
                     ("Voice: the video's own sound -> cloned voice -> speech", ["2", "3"], "#2a4858")],
                    [("Clone model: trained on the video", ["8"], "#584a2a"),
                     ("Talking head: lips from the speech", ["5", "6"], "#4a2a58")],
                    [("Video: MP4 with the speech", ["7"], "#3f5a3a")]],
    },
    "lipsync_video_musetalk": {
        "note": ["## Lip-sync a video with MuseTalk 1.5", "A talking video of the person says your text in their "
                 "voice: MuseTalk 1.5 redraws the lower face of every frame from the speech (no training).",
                 "**Needs your MuseTalk files** (nothing is downloaded): put the MuseTalk 1.5 release under "
                 "`models/digital_human/musetalk/` exactly as released - `musetalkV15/unet.pth` and "
                 "`musetalkV15/musetalk.json` (huggingface.co/TMElyralab/MuseTalk), `sd-vae/` (config.json and "
                 "diffusion_pytorch_model.bin or .safetensors, stabilityai/sd-vae-ft-mse) and `whisper/` "
                 "(config.json, preprocessor_config.json, pytorch_model.bin or model.safetensors, "
                 "openai/whisper-tiny), and install the extra once: `pip install diffusers transformers` "
                 "(versions in the pack's pyproject, extra `musetalk`). Without them the prompt is refused when "
                 "queued, with the list of what is missing. `python -m digital_human setup --check musetalk` "
                 "says what is present. Licences: MuseTalk code MIT, weights released for commercial use; "
                 "sd-vae-ft-mse MIT; whisper MIT.", SETUP_LINE,
                 "**Video** (Load Reference Video): upload the talking video (mp4, mov, webm, mkv; any length, it "
                 "loops ping-pong under longer speech). Its sound is the reference voice and its frame rate the one "
                 "clock.", MODELS_TEXT, SAMPLES_TEXT],
        "columns": [[("Face: video -> aligned faces", ["1", "4"], "#5a4a2a"),
                     ("Voice: the video's own sound -> cloned voice -> speech", ["2", "3"], "#2a4858")],
                    [("MuseTalk 1.5 lip-sync and video: lips from the speech -> MP4", ["5"], "#4a2a58")]],
    },
    "lipsync_video_wav2lip": {
        "note": ["## Lip-sync a video with Wav2Lip", "A talking video of the person says your text in their "
                 "voice: Wav2Lip redraws the face box of every frame from the speech (no training; small and fast, "
                 "a 96x96 mouth region).",
                 "**Needs your Wav2Lip checkpoint** (nothing is downloaded): put `wav2lip.pth` or "
                 "`wav2lip_gan.pth` from the Wav2Lip README (github.com/Rudrabha/Wav2Lip) in "
                 "`models/digital_human/wav2lip/`. With both there the GAN one is used (set "
                 "DIGITAL_HUMAN_WAV2LIP_CHECKPOINT=wav2lip to pick the other); the run's report says which. Without "
                 "one the prompt is refused when queued, naming both files and where they go. **Licence**: the "
                 "Wav2Lip repository and models are for personal / research / non-commercial use only; commercial "
                 "use is prohibited by its authors.", SETUP_LINE,
                 "**Video** (Load Reference Video): upload the talking video (mp4, mov, webm, mkv; any length, it "
                 "loops ping-pong under longer speech). Its sound is the reference voice and its frame rate the one "
                 "clock.", MODELS_TEXT, SAMPLES_TEXT],
        "columns": [[("Face: video -> aligned faces", ["1", "4"], "#5a4a2a"),
                     ("Voice: the video's own sound -> cloned voice -> speech", ["2", "3"], "#2a4858")],
                    [("Wav2Lip lip-sync and video: lips from the speech -> MP4", ["5"], "#4a2a58")]],
    },
    "lipsync_video_latentsync": {
        "note": ["## Lip-sync a video with LatentSync", "A talking video of the person says your text in their "
                 "voice: LatentSync (ByteDance; latent diffusion on Stable Diffusion 1.5's UNet, whisper tiny "
                 "speech features) redraws the mouth of every frame from the speech, 16 frames at a time (no "
                 "training). The slowest and best-looking lip-sync of the pack: 1.6 works at 512x512 (about 18 GB "
                 "of GPU memory), 1.5 at 256x256 (about 8 GB).",
                 "**Needs your LatentSync files** (nothing is downloaded): under `models/digital_human/latentsync/` "
                 "in the release's own layout - `latentsync_unet.pt` and `whisper/tiny.pt` "
                 "(huggingface.co/ByteDance/LatentSync-1.6, or -1.5), `configs/unet/stage2_512.yaml` (1.6; or "
                 "`stage2.yaml` for 1.5) and `latentsync/utils/mask.png` (github.com/bytedance/LatentSync, same "
                 "paths), `sd-vae-ft-mse/` (config.json and diffusion_pytorch_model.safetensors or .bin, "
                 "stabilityai/sd-vae-ft-mse) - and the extra once: `pip install diffusers transformers pyyaml` "
                 "(versions in the pack's pyproject, extra `latentsync`). Without them the prompt is refused when "
                 "queued, with the list of what is missing. `python -m digital_human setup --check latentsync` says "
                 "what is present. Settings on the Talking Head to Video node: `steps` (0 = the reference's 20), "
                 "`guidance` (0 = 1.5), `deepcache` (0 = exact; 2-3 faster, the frames change), `fast_path` "
                 "(torch.compile, CUDA: compiles once per process, then faster); the variables "
                 "DIGITAL_HUMAN_LATENTSYNC_STEPS / _GUIDANCE / _DEEPCACHE / _COMPILE win when set; "
                 "DIGITAL_HUMAN_LATENTSYNC_CONFIG=stage2 picks 1.5.",
                 "**Licences**: LatentSync code Apache-2.0; its weights under the licence on their Hugging Face "
                 "model card (reported as CreativeML Open RAIL++-M: use, commercial included, under use-based "
                 "restrictions passed on with the weights - read the card before use); sd-vae-ft-mse MIT; whisper "
                 "tiny MIT.", SETUP_LINE,
                 "**Video** (Load Reference Video): upload the talking video (mp4, mov, webm, mkv; any length, it "
                 "loops ping-pong under longer speech). Its sound is the reference voice and its frame rate the one "
                 "clock.", MODELS_TEXT, SAMPLES_TEXT],
        "columns": [[("Face: video -> aligned faces", ["1", "4"], "#5a4a2a"),
                     ("Voice: the video's own sound -> cloned voice -> speech", ["2", "3"], "#2a4858")],
                    [("LatentSync lip-sync and video: lips from the speech -> MP4", ["5"], "#4a2a58")]],
    },
    "talking_photo_sonic": {
        "note": ["## Talking photo with Sonic", "One photo says your text in the cloned voice with Sonic (CVPR 2025, "
                 "on Stable Video Diffusion): lips, head and expression all move. The video is Sonic's own square "
                 "face crop (turn on `paste_back` to put it back into the photo).",
                 "**Needs your Sonic files** (nothing is downloaded): under `models/digital_human/sonic/` exactly "
                 "as released - `Sonic/unet.pth`, `Sonic/audio2token.pth`, `Sonic/audio2bucket.pth` and "
                 "`RIFE/flownet.pkl` (huggingface.co/LeonJoe13/Sonic), `stable-video-diffusion-img2vid-xt/` "
                 "(unet/config.json, vae/, image_encoder/, feature_extractor/, scheduler/; "
                 "stabilityai/stable-video-diffusion-img2vid-xt; or, instead of that folder, ComfyUI's own "
                 "`models/checkpoints/svd_xt*.safetensors`) and `whisper-tiny/` (openai/whisper-tiny) - and "
                 "the extra once: `pip install diffusers transformers` (versions in the pack's pyproject, extra "
                 "`sonic`). Without them the prompt is refused when queued, with the list of what is missing.",
                 "**Licences - not for commercial use**: Sonic's weights are CC BY-NC-SA 4.0; Stable Video "
                 "Diffusion img2vid-xt's are under Stability AI's non-commercial community licence (the LICENSE file "
                 "in that folder); whisper-tiny and RIFE MIT.",
                 "**Speed**: 25 steps on 25-frame windows - about a minute for 10 s of speech on an H200; minutes "
                 "per step on a CPU. `vram` low fits 12 GB cards.", SETUP_LINE, VOICE_TEXT, PHOTO_TEXT,
                 MODELS_TEXT, SAMPLES_TEXT],
        "columns": [[("Voice: reference clip -> cloned voice -> speech", ["1", "2", "3"], "#2a4858"),
                     ("Face: photo -> face box", ["4", "5", "6"], "#5a4a2a")],
                    [("Sonic: the whole head from the speech -> MP4", ["7"], "#4a2a58")]],
    },
    "voice_clone_cosyvoice": {
        "note": ["## Voice clone with CosyVoice 2", "Text to speech in the voice of a short clip, cloned zero-shot by "
                 "CosyVoice 2 (no voice fitting: a few seconds of reference are enough).",
                 "**Needs your CosyVoice files** (nothing is downloaded): put the `CosyVoice2-0.5B` folder exactly as "
                 "released (FunAudioLLM on Hugging Face or ModelScope, Apache-2.0) at "
                 "`models/digital_human/cosyvoice/CosyVoice2-0.5B/` - `cosyvoice2.yaml`, `llm.pt`, `flow.pt`, "
                 "`hift.pt`, `campplus.onnx`, `speech_tokenizer_v2.onnx`, `spk2info.pt` and the "
                 "`CosyVoice-BlankEN/` folder - and install the extra once: `pip install transformers pyyaml` "
                 "(versions in the pack's pyproject, extra `cosyvoice`). Without them the prompt is refused when "
                 "queued, with the list of what is missing. CosyVoice 3 folders: the CosyVoice 3 template.",
                 SETUP_LINE,
                 "**Voice** (Load Reference Audio): upload a clip of the person speaking (3-30 s of one voice). "
                 "Type what the clip says in **Voice for CosyVoice 2** (`reference_text`): with it CosyVoice "
                 "continues the clip's speech (zero-shot mode, best likeness); leave it empty for cross-lingual "
                 "mode. Type the text to speak in **TTS with CosyVoice 2** (English, Mandarin and more). Same seed, "
                 "same audio.",
                 "The speech is saved by **Save speech** (FLAC in ComfyUI's output folder) and plays in the node.",
                 "Sample input: a voice the pack speaks with its bundled Kokoro voice; the reference text is what it "
                 "says."],
        "columns": [[("Voice: reference clip -> CosyVoice 2 speaker -> speech", ["1", "2", "3"], "#2a4858")],
                    [("Output", ["4"], "#3f5a3a")]],
    },
    "voice_clone_cosyvoice3": {
        "note": ["## Voice clone with CosyVoice 3", "Text to speech in the voice of a short clip, cloned zero-shot by "
                 "Fun-CosyVoice3-0.5B (better speaker similarity than CosyVoice 2; no voice fitting).",
                 "**Needs your CosyVoice 3 files** (nothing is downloaded): put the `Fun-CosyVoice3-0.5B` folder "
                 "exactly as released (FunAudioLLM on Hugging Face or ModelScope, Apache-2.0) at "
                 "`models/digital_human/cosyvoice/Fun-CosyVoice3-0.5B/` - `cosyvoice3.yaml`, `llm.pt`, `flow.pt`, "
                 "`hift.pt`, `campplus.onnx`, `speech_tokenizer_v3.onnx` and the `CosyVoice-BlankEN/` folder - and "
                 "install the extra once: `pip install transformers pyyaml` (extra `cosyvoice`). Without them the "
                 "prompt is refused when queued, with the list of what is missing. A CosyVoice 2 folder needs the "
                 "CosyVoice 2 template.",
                 SETUP_LINE,
                 "**Voice** (Load Reference Audio): upload a clip of the person speaking (3-30 s of one voice). "
                 "Type what the clip says in **Voice for CosyVoice 3** (`reference_text`) for zero-shot mode (best "
                 "likeness); leave it empty for cross-lingual mode. Type the text to speak in **TTS with CosyVoice "
                 "3**. Same seed, same audio.",
                 "The speech is saved by **Save speech** (FLAC in ComfyUI's output folder) and plays in the node.",
                 "Sample input: a voice the pack speaks with its bundled Kokoro voice; the reference text is what it "
                 "says."],
        "columns": [[("Voice: reference clip -> CosyVoice 3 speaker -> speech", ["1", "2", "3"], "#2a4858")],
                    [("Output", ["4"], "#3f5a3a")]],
    },
}
LAYOUT_JS = """([spec]) => {
  const LG = window.LiteGraph, g = window.app.graph;
  const TITLE = LG.NODE_TITLE_HEIGHT, GAP = 40, PAD = 24, HEAD = 50;
  const note = LG.createNode('MarkdownNote');
  note.title = 'Read me';
  g.add(note);
  note.widgets[0].value = spec.note;
  note.size = [460, 640];
  note.pos = [0, TITLE];
  let x = 500;
  for (const column of spec.columns) {
    let y = 0, width = 0;
    for (const [title, ids, color] of column) {
      let nx = x + PAD, tallest = 0;
      for (const id of ids) {
        const node = g.getNodeById(Number(id));
        node.pos = [nx, y + HEAD + TITLE];
        nx += node.size[0] + GAP;
        tallest = Math.max(tallest, node.size[1]);
      }
      const group = new LG.LGraphGroup(title);
      group.color = color;
      g.add(group);
      group.pos = [x, y];
      group.size = [nx - GAP + PAD - x, HEAD + TITLE + tallest + PAD];
      width = Math.max(width, group.size[0]);
      y += group.size[1] + 60;
    }
    x += width + 60;
  }
  g.setDirtyCanvas(true, true);
}"""
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
        # optional widgets the API workflow leaves out (e.g. fast_path, visemes) are queued at their defaults by
        # the frontend: compared like test_comfyui_browser does, on the inputs the API workflow sets
        got_inputs = {k: v for k, v in have[nid]["inputs"].items()
                      if k not in FRONTEND_ONLY_INPUTS and k in exp[nid]["inputs"]}
        if got_inputs != exp[nid]["inputs"]:
            problems.append(f"node {nid} inputs: expected {exp[nid]['inputs']}, frontend gives {got_inputs}")
    return problems


def export(client: ComfyClient, api_path: Path, targets: list[Path]) -> None:
    name = api_path.stem
    prompt = load_api_workflow(api_path)  # as shipped: the sample inputs are in input/ after setup
    layout = LAYOUTS.get(name)
    with open_frontend(client, width=1600, height=900) as page:
        load_api(page, prompt, name)
        # Lay out once image/video previews have loaded and grown their nodes.
        page.wait_for_timeout(2500)
        if layout is not None:
            page.evaluate(LAYOUT_JS, [{"note": "\n\n".join(layout["note"]), "columns": layout["columns"]}])
        else:
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
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"{name}_graph.png"))  # to look at the layout; not shipped
    title = ui_template(name).stem
    for folder in targets:
        folder.mkdir(parents=True, exist_ok=True)
        dump(folder / f"{title}.json", graph)
        old_thumb = folder / f"{name}.jpg"
        if title != name and old_thumb.exists() and not (folder / f"{title}.jpg").exists():
            old_thumb.replace(folder / f"{title}.jpg")  # until make_thumbnails.py renders a new one
        for stale in (folder / f"{name}.json", folder / f"{name}.jpg"):
            if title != name:
                stale.unlink(missing_ok=True)  # renamed to the card title
    for stale in (WORKFLOWS / f"{name}.json", WORKFLOWS / f"{name}.jpg"):
        stale.unlink(missing_ok=True)  # a second copy would be listed twice as a template
    print(f"{name}: {len(graph['nodes'])} nodes, {len(graph['links'])} links, {len(graph.get('groups', []))} groups"
          f" -> {title}.json in " + ", ".join(str(t.relative_to(ROOT)) for t in targets))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comfyui-dir", default=os.environ.get("COMFYUI_DIR"), help="ComfyUI checkout")
    parser.add_argument("--python", default=os.environ.get("COMFYUI_PYTHON", sys.executable))
    parser.add_argument("--models", default=os.environ.get("DIGITAL_HUMAN_MODELS"), help="pack models root")
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
                export(client, api_path, [UI_FOLDER])
        finally:
            server.stop()


if __name__ == "__main__":
    main()
