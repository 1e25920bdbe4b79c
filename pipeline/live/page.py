"""The page served at `/`: type text, watch and hear the avatar (websocket + Media Source Extensions by default,
WebRTC with ?transport=webrtc). It reports the first shown frame of each utterance back (client_shown)."""

PAGE = r"""<!doctype html>
<html><head><meta charset="utf-8"><title>digital human - live</title>
<style>body{font-family:sans-serif;margin:1em;max-width:900px}video{background:#222;max-width:100%}
#text{width:70%}#log{font:12px monospace;white-space:pre-wrap;color:#444}</style></head>
<body>
<video id="video" autoplay playsinline muted></video>
<p><input id="text" placeholder="What should the avatar say?" maxlength="2000">
<button id="say">Say</button> <button id="stop">Interrupt</button></p>
<div id="status">connecting...</div><div id="log"></div>
<script>
const video = document.getElementById("video"), statusBox = document.getElementById("status");
const live = window.__live = {framesShown: 0, speech: [], shown: [], errors: [], transport: null, session: null};
function log(line) { document.getElementById("log").textContent = line + "\n" + document.getElementById("log").textContent.slice(0, 3000); }
async function api(path, method, body) {
  const r = await fetch(path, {method, headers: {"Content-Type": "application/json"}, body: body ? JSON.stringify(body) : undefined});
  const j = await r.json(); if (!r.ok) throw new Error(j.error || r.status); return j;
}
let ws = null, pending = [];
function watchFrames() {  // which utterance's first frame is on screen: tell the server (client_shown)
  const step = (now, meta) => {
    live.framesShown++;
    for (const s of live.speech) if (!s.shown && meta.mediaTime + 1e-3 >= s.t) {
      s.shown = true; live.shown.push({utterance: s.utterance, mediaTime: meta.mediaTime});
      if (ws && ws.readyState === 1) ws.send(JSON.stringify({type: "shown", utterance: s.utterance}));
      else api(`/sessions/${live.session}/shown`, "POST", {utterance: s.utterance}).catch(() => {});
    }
    video.requestVideoFrameCallback(step);
  };
  if (video.requestVideoFrameCallback) video.requestVideoFrameCallback(step);
}
async function startWebsocket(session) {
  const ms = new MediaSource(); video.src = URL.createObjectURL(ms);
  await new Promise(r => ms.addEventListener("sourceopen", r, {once: true}));
  // Opus audio (lower latency) where Media Source Extensions play it in MP4, else AAC
  const audio = MediaSource.isTypeSupported('video/mp4; codecs="avc1.42E01F, opus"') ? "opus" : "aac";
  live.audio = audio;
  ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/sessions/${session}/ws?audio=${audio}`);
  ws.binaryType = "arraybuffer"; let sb = null;
  const pump = () => { if (sb && !sb.updating && pending.length) sb.appendBuffer(pending.shift()); };
  ws.onmessage = (e) => {
    if (typeof e.data === "string") {
      const m = JSON.parse(e.data);
      if (m.type === "init") {
        if (!MediaSource.isTypeSupported(m.mime)) { statusBox.textContent = "this browser cannot play " + m.mime + "; try ?transport=webrtc"; live.errors.push("mime"); return; }
        sb = ms.addSourceBuffer(m.mime); sb.mode = "segments"; sb.addEventListener("updateend", () => {
          pump();
          const b = video.buffered; if (b.length && b.end(b.length - 1) - video.currentTime > 0.6) video.currentTime = b.end(b.length - 1) - 0.1;  // stay live
        });
        statusBox.textContent = `live: ${m.width}x${m.height} @ ${m.fps} fps, websocket`; video.play().catch(() => {});
      } else if (m.type === "speech_start") { live.speech.push({utterance: m.utterance, t: m.t, shown: false}); log(`utterance ${m.utterance} starts at ${m.t.toFixed(2)} s`); }
      else if (m.type === "error") { live.errors.push(m.error); log("error: " + m.error); }
      return;
    }
    pending.push(e.data); pump();
  };
  ws.onclose = () => { statusBox.textContent = "disconnected"; };
}
async function startWebrtc(session) {
  const pc = new RTCPeerConnection({iceServers: []});
  pc.addTransceiver("video", {direction: "recvonly"}); pc.addTransceiver("audio", {direction: "recvonly"});
  const stream = new MediaStream(); pc.ontrack = (e) => { stream.addTrack(e.track); video.srcObject = stream; video.play().catch(() => {}); };
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise(r => { if (pc.iceGatheringState === "complete") r(); else pc.addEventListener("icegatheringstatechange", () => pc.iceGatheringState === "complete" && r()); });
  const answer = await api(`/sessions/${session}/webrtc`, "POST", {type: "offer", sdp: pc.localDescription.sdp});
  await pc.setRemoteDescription(answer); statusBox.textContent = "live: WebRTC";
}
(async () => {
  try {
    const s = await api("/sessions", "POST"); live.session = s.id;
    live.transport = new URLSearchParams(location.search).get("transport") || "websocket";
    watchFrames();
    if (live.transport === "webrtc") await startWebrtc(s.id); else await startWebsocket(s.id);
  } catch (e) { statusBox.textContent = "could not open a session: " + e.message; live.errors.push(String(e.message)); }
})();
document.getElementById("say").onclick = async () => {
  video.muted = false;  // a click: the browser lets the page play sound now
  const text = document.getElementById("text").value;
  try { const r = await api(`/sessions/${live.session}/say`, "POST", {text, interrupt: true}); log(`utterance ${r.utterance} queued`); }
  catch (e) { log("error: " + e.message); live.errors.push(e.message); }
};
document.getElementById("stop").onclick = () => api(`/sessions/${live.session}/interrupt`, "POST").catch(() => {});
document.getElementById("text").addEventListener("keydown", (e) => { if (e.key === "Enter") document.getElementById("say").click(); });
</script></body></html>
"""
