// Digital Human pack: in-graph players and status lines (loaded through WEB_DIRECTORY = "./js").
//
// - TRT_TTS: an <audio> player for the speech it made + a status line (backend, timings, warnings).
// - VideoMux / TalkingHeadVideo: a <video> player for the MP4 it wrote.
// - TRT_TTS / TRT_TalkingHead / TalkingHeadVideo / TrainAvatar: the status line also shows live progress (engine build,
//   synthesis, training steps) from the websocket while the node runs.
// - LoadReferenceAudio: upload button + preview. The core "audio_upload" flag only works for an input
//   literally named "audio" on core nodes (frontend 1.27 Comfy.UploadAudio), so the pack wires its own.
//
// Every widget added here is display-only (serialize = false), so saved workflows keep exactly the
// widgets_values the server's node definitions describe.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const AUDIO_NODES = new Set(["TRT_TTS"]);
const VIDEO_NODES = new Set(["VideoMux", "TalkingHeadVideo"]);
const STATUS_NODES = new Set(["TRT_TTS", "TRT_TalkingHead", "TalkingHeadVideo", "TrainAvatar", "VideoMux", "ExtractSpeakerEmbedding"]);
const UPLOAD_NODES = { LoadReferenceAudio: { widget: "audio_file", accept: "audio/*,video/mp4,video/webm" } };
const VIDEO_SUFFIX = /\.(mp4|webm|mov)$/i;

function viewUrl(item) {
  const params = new URLSearchParams({
    filename: item.filename,
    subfolder: item.subfolder ?? "",
    type: item.type ?? "output",
  });
  return api.apiURL(`/view?${params.toString()}`);
}

function splitName(value) {
  const cut = value.lastIndexOf("/");
  return cut < 0 ? ["", value] : [value.slice(0, cut), value.slice(cut + 1)];
}

function addStatus(node) {
  const el = document.createElement("div");
  el.className = "dh-status";
  el.style.cssText = "font: 11px monospace; white-space: pre-wrap; color: var(--descrip-text, #aaa);" +
    "padding: 2px 4px; overflow: auto; max-height: 120px;";
  el.textContent = "";
  const widget = node.addDOMWidget("dh_status", "dh_status", el, { hideOnZoom: false, serialize: false });
  widget.serialize = false;
  widget.computeLayoutSize = () => ({ minHeight: 64, maxHeight: 120, minWidth: 0 });
  node.dhStatus = el;
  return el;
}

function setStatus(node, text) {
  if (!node.dhStatus) return;
  node.dhStatus.textContent = text;
  // Grow (never shrink) the node so the status and player stay visible without leaving the graph.
  const want = node.computeSize();
  if (want[1] > node.size[1] || want[0] > node.size[0]) {
    node.setSize([Math.max(node.size[0], want[0]), Math.max(node.size[1], want[1])]);
  }
  node.setDirtyCanvas?.(true, true);
}

function addMedia(node, kind) {
  const el = document.createElement(kind);
  el.controls = true;
  el.preload = "metadata";
  el.className = `dh-${kind}`;
  el.setAttribute("name", "media");
  el.style.cssText = "width: 100%;" + (kind === "video" ? "max-height: 320px; background: #000;" : "");
  if (kind === "video") {
    el.loop = true;
    el.muted = false;
    el.playsInline = true;
  }
  // "audioUI" is the name core's Comfy.AudioWidget looks up for any node whose output carries
  // `audio`; without a widget of that name it throws and stops updating other nodes' previews.
  // "video-preview" is core's VIDEO_WIDGET_NAME: frontend 1.27 also previews an .mp4 found in a node's
  // `images` output and adds its own player unless a widget of that name exists, which would put two
  // players on VideoMux. Ours works on older frontends too (they would show a broken image instead).
  const name = kind === "audio" ? "audioUI" : "video-preview";
  const widget = node.addDOMWidget(name, kind, el, { hideOnZoom: false, serialize: false });
  widget.serialize = false;
  widget.computeLayoutSize = () => ({ minHeight: kind === "video" ? 180 : 40, minWidth: 0 });
  node.dhMedia = el;
  return el;
}

function showResult(node, message) {
  if (!message) return;
  if (Array.isArray(message.text) && message.text.length) {
    setStatus(node, message.text.join("\n"));
  }
  if (!node.dhMedia) return;
  const candidates = [...(message.audio ?? []), ...(message.video ?? []), ...(message.gifs ?? []),
    ...(message.images ?? [])];
  const item = node.dhMedia.tagName === "VIDEO"
    ? candidates.find((c) => c && VIDEO_SUFFIX.test(c.filename ?? ""))
    : (message.audio ?? [])[0];
  if (!item) return;
  node.dhMedia.src = viewUrl(item);
  node.dhMedia.dataset.filename = item.filename;
  node.dhMedia.load();
}

function addUpload(node, spec) {
  const target = node.widgets?.find((w) => w.name === spec.widget);
  if (!target) return;
  const preview = document.createElement("audio");
  preview.controls = true;
  preview.preload = "metadata";
  preview.className = "dh-reference-audio";
  preview.style.width = "100%";
  const previewWidget = node.addDOMWidget("dh_reference_preview", "audio", preview, { hideOnZoom: false, serialize: false });
  previewWidget.serialize = false;
  previewWidget.computeLayoutSize = () => ({ minHeight: 40, minWidth: 0 });
  const refresh = () => {
    if (!target.value) return;
    const [subfolder, filename] = splitName(String(target.value));
    preview.src = viewUrl({ filename, subfolder, type: "input" });
  };
  const chained = target.callback;
  target.callback = function (...args) {
    refresh();
    return chained?.apply(this, args);
  };
  const picker = document.createElement("input");
  picker.type = "file";
  picker.accept = spec.accept;
  picker.style.display = "none";
  document.body.append(picker);
  picker.onchange = async () => {
    const file = picker.files?.[0];
    if (!file) return;
    const body = new FormData();
    body.append("image", file); // ComfyUI's upload route takes any file under the field name "image"
    const resp = await api.fetchApi("/upload/image", { method: "POST", body });
    if (resp.status !== 200) {
      setStatus(node, `upload failed: ${resp.status} ${resp.statusText}`);
      return;
    }
    const data = await resp.json();
    const name = data.subfolder ? `${data.subfolder}/${data.name}` : data.name;
    const values = target.options?.values;
    if (Array.isArray(values) && !values.includes(name)) values.push(name);
    target.value = name;
    refresh();
    picker.value = "";
  };
  const button = node.addWidget("button", "upload", "choose audio file", () => picker.click(), { serialize: false });
  button.serialize = false;
  button.label = "choose audio file to upload";
  const onRemoved = node.onRemoved;
  node.onRemoved = function () {
    picker.remove();
    preview.pause();
    return onRemoved?.apply(this, arguments);
  };
  // Value may arrive after creation (workflow load), so refresh once the graph is configured too.
  const onConfigure = node.onConfigure;
  node.onConfigure = function () {
    const r = onConfigure?.apply(this, arguments);
    refresh();
    return r;
  };
  refresh();
}

function fmtSeconds(s) {
  return s < 60 ? `${s.toFixed(1)} s` : `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
}

// Live progress for the node that is running (progress events carry the node id as a string).
const running = new Map(); // node id -> {start}
function nodeById(id) {
  return app.graph?.getNodeById?.(Number.isNaN(+id) ? id : +id);
}

// Nodes without a `ui` result (e.g. ExtractSpeakerEmbedding) never get onExecuted: close their
// status when the next node starts or the prompt ends.
function finishRunning(exceptId) {
  for (const [id, state] of running) {
    if (id === exceptId) continue;
    const node = nodeById(id);
    if (node?.dhStatus?.textContent.startsWith("running")) {
      setStatus(node, `done in ${fmtSeconds((performance.now() - state.start) / 1000)}`);
    }
    running.delete(id);
  }
}

api.addEventListener("execution_cached", ({ detail }) => {
  for (const id of detail?.nodes ?? []) {
    const node = nodeById(id);
    if (node && STATUS_NODES.has(node.comfyClass) && !node.dhStatus?.textContent) setStatus(node, "cached");
  }
});

api.addEventListener("executing", ({ detail }) => {
  const id = detail?.node ?? detail;
  finishRunning(id == null ? null : String(id));
  if (id == null) return;
  const node = nodeById(id);
  if (node && STATUS_NODES.has(node.comfyClass)) {
    running.set(String(id), { start: performance.now() });
    setStatus(node, "running...");
  }
});

api.addEventListener("progress", ({ detail }) => {
  const { node: id, value, max } = detail ?? {};
  if (id == null) return;
  const node = nodeById(id);
  if (!node || !STATUS_NODES.has(node.comfyClass)) return;
  const state = running.get(String(id)) ?? { start: performance.now() };
  running.set(String(id), state);
  const elapsed = (performance.now() - state.start) / 1000;
  const eta = value > 0 && value < max ? `, about ${fmtSeconds((elapsed / value) * (max - value))} left` : "";
  setStatus(node, `running: ${value}/${max} (${Math.round((100 * value) / Math.max(max, 1))}%), ` +
    `${fmtSeconds(elapsed)}${eta}`);
});

api.addEventListener("execution_error", ({ detail }) => {
  const node = nodeById(detail?.node_id);
  if (node && STATUS_NODES.has(node.comfyClass)) setStatus(node, `error: ${detail.exception_message ?? ""}`);
});

api.addEventListener("execution_interrupted", ({ detail }) => {
  const node = nodeById(detail?.node_id);
  if (node && STATUS_NODES.has(node.comfyClass)) setStatus(node, "interrupted");
});

app.registerExtension({
  name: "DigitalHuman.MediaAndStatus",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    const name = nodeData?.name;
    if (!STATUS_NODES.has(name) && !AUDIO_NODES.has(name) && !VIDEO_NODES.has(name) && !UPLOAD_NODES[name]) return;
    const onNodeCreated = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
      const r = onNodeCreated?.apply(this, arguments);
      if (UPLOAD_NODES[name]) addUpload(this, UPLOAD_NODES[name]);
      if (AUDIO_NODES.has(name)) addMedia(this, "audio");
      if (VIDEO_NODES.has(name)) addMedia(this, "video");
      if (STATUS_NODES.has(name)) addStatus(this);
      return r;
    };
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      const r = onExecuted?.apply(this, arguments);
      running.delete(String(this.id));
      showResult(this, message);
      return r;
    };
  },
});
