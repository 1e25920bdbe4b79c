"""Live mode (DESIGN 5e): `digital-human serve`. face.py renders one shared reference face (idle and speaking),
session.py runs a session's stages (text -> TTS pieces -> frames -> one media clock), metrics.py keeps the
per-stage percentiles, encode.py packs the clock's ticks as fragmented MP4, webrtc.py as WebRTC tracks,
server.py is the HTTP/websocket server and page.py its page. aiohttp/aiortc/av are the `live` extra."""
