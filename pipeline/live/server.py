"""`digital-human serve`: the live sessions over HTTP/JSON, a websocket (fragmented MP4 for Media Source
Extensions) and WebRTC (aiortc). Loopback by default; every request is checked and answered with a clear error,
and nothing a client sends (or fails to send) stops the server or another session."""
from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

from .encode import AUDIO_CODECS, FMP4Encoder, mime
from .session import CapacityError, Session, SessionError, SessionManager

log = logging.getLogger("digital_human.live")
TICKS_AHEAD = 4  # ticks waiting for this client's encoder: each is latency (and what an interrupt must replace)
SEND_QUEUE = 50  # encoded fragments waiting for a slow websocket; beyond it the encoder waits and ticks drop


@dataclass
class ServerOptions:
    ice_servers: list[str] = field(default_factory=list)   # none by default: loopback and LAN need none
    udp_ports: tuple[int, int] | None = None


def _error(status: int, message: str) -> Any:
    from aiohttp import web

    return web.json_response({"ok": False, "error": message}, status=status)


async def _json_body(request: Any) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        raise SessionError("the request body is not JSON; send e.g. {\"text\": \"Hello\"}") from None
    if not isinstance(body, dict):
        raise SessionError("the request body must be a JSON object, e.g. {\"text\": \"Hello\"}")
    return body


class LiveServer:
    def __init__(self, manager: SessionManager, options: ServerOptions | None = None) -> None:
        self.manager, self.options = manager, options or ServerOptions()
        self._peers: set[Any] = set()

    def app(self) -> Any:
        from aiohttp import web

        from .page import PAGE

        app = web.Application(client_max_size=64 * 1024)
        async def page(_request: Any) -> Any:
            return web.Response(text=PAGE, content_type="text/html")

        routes = [web.get("/", page),
                  web.get("/metrics", self.metrics), web.post("/sessions", self.open_session),
                  web.get("/sessions/{id}", self.session_info), web.post("/sessions/{id}/say", self.say),
                  web.post("/sessions/{id}/interrupt", self.interrupt), web.delete("/sessions/{id}", self.close),
                  web.post("/sessions/{id}/shown", self.shown), web.get("/sessions/{id}/ws", self.websocket),
                  web.post("/sessions/{id}/webrtc", self.webrtc)]
        app.add_routes(routes)
        app.on_shutdown.append(self._shutdown)
        return app

    async def _shutdown(self, _app: Any) -> None:
        for pc in list(self._peers):
            await pc.close()
        await asyncio.to_thread(self.manager.close_all)

    def _session(self, request: Any) -> Session:
        return self.manager.get(request.match_info["id"])

    # --- JSON API ---------------------------------------------------------------------------------
    async def metrics(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({**self.manager.metrics.snapshot(), "sessions": len(self.manager.sessions),
                                  "max_sessions": self.manager.max_sessions,
                                  "tts_lanes": getattr(self.manager.voice, "lanes", 1),
                                  "tts_batch": getattr(self.manager.voice, "batch_rows", 1)})

    async def open_session(self, request: Any) -> Any:
        from aiohttp import web

        try:
            session = await asyncio.to_thread(self.manager.create)
        except CapacityError as exc:
            return _error(503, str(exc))
        face = self.manager.face
        return web.json_response({"ok": True, "id": session.id, "ws": f"/sessions/{session.id}/ws",
                                  "webrtc": f"/sessions/{session.id}/webrtc", "width": face.width,
                                  "height": face.height, "fps": face.fps, "sample_rate": session.rate}, status=201)

    async def session_info(self, request: Any) -> Any:
        from aiohttp import web

        try:
            return web.json_response({"ok": True, **self._session(request).report()})
        except KeyError as exc:
            return _error(404, exc.args[0])

    async def say(self, request: Any) -> Any:
        from aiohttp import web

        try:
            session = self._session(request)
            body = await _json_body(request)
            utterance = session.say(body.get("text"), interrupt=bool(body.get("interrupt", False)))
        except KeyError as exc:
            return _error(404, exc.args[0])
        except SessionError as exc:
            return _error(400, str(exc))
        return web.json_response({"ok": True, "utterance": utterance.id}, status=202)

    async def interrupt(self, request: Any) -> Any:
        from aiohttp import web

        try:
            self._session(request).interrupt()
        except KeyError as exc:
            return _error(404, exc.args[0])
        return web.json_response({"ok": True})

    async def close(self, request: Any) -> Any:
        from aiohttp import web

        try:
            await asyncio.to_thread(self.manager.close, request.match_info["id"])
        except KeyError as exc:
            return _error(404, exc.args[0])
        return web.json_response({"ok": True})

    async def shown(self, request: Any) -> Any:
        """The client says it showed the first frame of an utterance: {"utterance": id}."""
        from aiohttp import web

        try:
            session = self._session(request)
            body = await _json_body(request)
            self._mark_shown(session, body.get("utterance"))
        except KeyError as exc:
            return _error(404, exc.args[0])
        except SessionError as exc:
            return _error(400, str(exc))
        return web.json_response({"ok": True})

    def _mark_shown(self, session: Session, uid: Any) -> None:
        utterance = session.utterances.get(uid) if isinstance(uid, int) else None
        if utterance is None:
            raise SessionError(f"no utterance {uid!r} in session {session.id}")
        if utterance.mark("client_shown"):
            self.manager.metrics.add("client_shown", utterance.times["client_shown"])

    # --- websocket: fragmented MP4 ----------------------------------------------------------------
    async def websocket(self, request: Any) -> Any:
        from aiohttp import WSMsgType, web

        try:
            session = self._session(request)
        except KeyError as exc:
            return _error(404, exc.args[0])
        audio = request.query.get("audio", "opus")  # ?audio=aac for a browser without Opus in MP4
        if audio not in AUDIO_CODECS:
            return _error(400, f"audio={audio!r}: the websocket stream's audio is one of {sorted(AUDIO_CODECS)} "
                               "(opus: lower latency; aac: for browsers whose Media Source Extensions lack Opus)")
        ws = web.WebSocketResponse(heartbeat=20, max_msg_size=64 * 1024)
        await ws.prepare(request)
        face = self.manager.face
        await ws.send_json({"type": "init", "mime": mime(audio), "audio": audio, "session": session.id,
                            "width": face.width, "height": face.height, "fps": face.fps, "sample_rate": session.rate})
        loop = asyncio.get_running_loop()
        sends: asyncio.Queue = asyncio.Queue(maxsize=SEND_QUEUE)
        ticks: queue.Queue = queue.Queue(maxsize=TICKS_AHEAD)
        stop = threading.Event()

        def output(tick: Any) -> None:
            try:
                ticks.put_nowait(tick)
            except queue.Full:
                self.manager.metrics.count("ticks_dropped_ws")

        def encode() -> None:
            encoder = FMP4Encoder(face.width, face.height, face.fps, session.rate, session.samples_per_frame,
                                  audio=audio)
            origin, speaking = None, None
            try:
                while not stop.is_set():
                    try:
                        tick = ticks.get(timeout=0.1)
                    except queue.Empty:
                        continue
                    origin = tick.index if origin is None else origin
                    tick = session.current(tick)  # speech cut by an interrupt while it waited here: idle instead
                    data = encoder.encode(tick.index, tick.frame, tick.audio)
                    t = ((tick.index - origin) * session.samples_per_frame + encoder.shift) / session.rate
                    events = []
                    now = tick.utterance.id if tick.speaking and tick.utterance is not None else None
                    if now != speaking:  # the clock's own record of where speech starts and stops in the stream
                        events.append({"type": "speech_start" if now else "speech_end", "utterance": now or speaking,
                                       "t": round(t, 4), "frame": tick.index - origin})
                        if now and tick.utterance.mark("first_packet"):
                            pass
                        speaking = now
                    if data or events:
                        asyncio.run_coroutine_threadsafe(sends.put((events, data)), loop).result(timeout=30)
            except Exception as exc:  # noqa: BLE001 - the client left or stalled for 30 s: stop encoding for it
                if not stop.is_set():
                    log.info("session %s: websocket stream stopped: %s", session.id, exc)
            finally:
                encoder.close()

        async def send() -> None:
            while True:
                events, data = await sends.get()
                for event in events:
                    await ws.send_json(event)
                if data:
                    await ws.send_bytes(data)

        remove = session.add_output(output)
        encoder_thread = threading.Thread(target=encode, name=f"live-{session.id}-fmp4", daemon=True)
        encoder_thread.start()
        sender = asyncio.ensure_future(send())
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                try:
                    message = json.loads(msg.data)
                    if message.get("type") == "shown":
                        self._mark_shown(session, message.get("utterance"))
                    elif message.get("type") == "say":
                        session.say(message.get("text"), interrupt=bool(message.get("interrupt", False)))
                    elif message.get("type") == "interrupt":
                        session.interrupt()
                except (ValueError, AttributeError) as exc:
                    await ws.send_json({"type": "error", "error": str(exc)})
        finally:  # the client left (or the server stops): stop this stream; its session's speech stops cleanly
            remove()
            stop.set()
            sender.cancel()
            await asyncio.to_thread(encoder_thread.join, 5)
            session.interrupt()
        return ws

    # --- WebRTC -----------------------------------------------------------------------------------
    async def webrtc(self, request: Any) -> Any:
        from aiohttp import web
        from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

        from .webrtc import ice_servers, make_tracks

        try:
            session = self._session(request)
            body = await _json_body(request)
            if body.get("type") != "offer" or not isinstance(body.get("sdp"), str):
                raise SessionError("send the browser's offer: {\"type\": \"offer\", \"sdp\": \"...\"}")
        except KeyError as exc:
            return _error(404, exc.args[0])
        except SessionError as exc:
            return _error(400, str(exc))
        pc = RTCPeerConnection(RTCConfiguration(iceServers=ice_servers(self.options.ice_servers)))
        self._peers.add(pc)
        video, audio, output = make_tracks(asyncio.get_running_loop(), session.rate, session.samples_per_frame)
        pc.addTrack(video)
        pc.addTrack(audio)
        remove = session.add_output(output)

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            if pc.connectionState in ("failed", "closed", "disconnected"):
                remove()
                self._peers.discard(pc)
                if pc.connectionState != "closed":
                    await pc.close()

        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=body["sdp"], type="offer"))
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as exc:  # noqa: BLE001 - a malformed offer
            remove()
            self._peers.discard(pc)
            await pc.close()
            return _error(400, f"could not answer the WebRTC offer: {exc}")
        return web.json_response({"type": pc.localDescription.type, "sdp": pc.localDescription.sdp})


class RunningServer:
    """A server on its own thread and event loop (tests, benchmarks): `url`, `stop()`."""

    def __init__(self, server: LiveServer, host: str = "127.0.0.1", port: int = 0) -> None:
        from aiohttp import web

        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.url = ""
        self._error: BaseException | None = None

        async def start() -> None:
            self._runner = web.AppRunner(server.app())
            await self._runner.setup()
            site = web.TCPSite(self._runner, host, port)
            await site.start()
            sock = site._server.sockets[0]  # the port the OS gave (port 0)
            self.url = f"http://{host}:{sock.getsockname()[1]}"

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                if server.options.udp_ports:
                    from .webrtc import limit_udp_ports

                    limit_udp_ports(self._loop, *server.options.udp_ports)
                self._loop.run_until_complete(start())
            except BaseException as exc:  # noqa: BLE001
                self._error = exc
            finally:
                self._ready.set()
            if self._error is None:
                self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="live-server", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def alive(self) -> bool:
        """The server's thread still runs its event loop (a fleet replica's health check)."""
        return self._thread.is_alive() and self._loop.is_running()

    def stop(self) -> None:
        async def cleanup() -> None:
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(cleanup(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
