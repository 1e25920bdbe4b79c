"""`digital-human serve-fleet`: the live server as a Ray Serve application, one replica per GPU.

Why this shape. A live session is stateful (its clock, queues and encoders live in one process) and its media
leaves over a websocket or WebRTC (UDP straight from that process), so a session can neither be spread over
replicas nor moved, and Serve's request router, which may send each request to any replica, cannot carry it.
So Serve manages the processes and placement is done here:

- every Serve replica (`LiveReplica`: one GPU each when the cluster has GPUs, else CPUs) builds the face and
  voice once and runs the pack's own LiveServer on its own port: the very API, page, websocket and WebRTC of
  `serve`, one copy of the models per replica;
- a small ingress (`FleetIngress`, on Serve's HTTP proxy) only places sessions: POST /sessions asks every
  replica's /metrics for its load, opens the session on the least loaded replica that has room and answers
  with that replica's base URL, which the client then talks to directly (say, interrupt, websocket, WebRTC,
  DELETE); when every replica is full it answers 503 saying so. GET /metrics sums the replicas; GET / sends a
  browser to the least loaded replica's page;
- Serve gives no way to address one chosen replica, so replicas write their URL into a small named Ray actor
  (`Registry`) and refresh it at every Serve health check: a replica that died (and that Serve replaces)
  drops out after a few missed health periods, its replacement appears when it is ready.

A replica's own capacity check (SessionManager) stays the authority: two placements racing for its last slot
get one 201 and one 503, and the ingress then tries the next replica. Loopback by default, like `serve`.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("digital_human.live")

NAMESPACE = "digital_human"        # the registry actor's Ray namespace (replicas look it up by name)
APP = "digital-human-live"         # Serve application names: APP (the ingress) and APP-replicas
HEALTH_PERIOD_S = 5.0              # Serve's health check of a replica, which also refreshes its registry entry
STALE_AFTER_S = 4 * HEALTH_PERIOD_S
PROBE_TIMEOUT_S = 3.0              # a replica's /metrics; one that does not answer is skipped, not waited for
OPEN_TIMEOUT_S = 15.0              # a replica's POST /sessions (starts the session's threads)
SHIPPED = ("face", "voice", "speaker")  # input files read here and sent to the replicas (no shared disk needed)
MAX_SHIPPED_MB = 512
FLEET_MODULES = ("ray", "starlette", "uvicorn", "aiohttp", "av", "aiortc")  # the [fleet] extra's top modules


# --- the registry: which replica listens where ----------------------------------------------------------
class Registry:
    """Replica id -> {replica, url, pid, max_sessions, seen}. One small Ray actor per fleet (no CPU reserved)."""

    def __init__(self) -> None:
        self._replicas: dict[str, dict[str, Any]] = {}

    def register(self, replica: str, url: str, pid: int, max_sessions: int) -> None:
        self._replicas[replica] = {"replica": replica, "url": url, "pid": pid, "max_sessions": max_sessions,
                                   "seen": time.time()}

    def forget(self, replica: str) -> None:
        self._replicas.pop(replica, None)

    def replicas(self, max_age_s: float) -> list[dict[str, Any]]:
        now = time.time()
        return [dict(r) for r in self._replicas.values() if now - r["seen"] <= max_age_s]


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _advertised_host(host: str) -> str:
    """The address other processes reach a replica at: the node's IP when it listens on every interface."""
    if host in ("0.0.0.0", "::", ""):
        import ray

        return ray.util.get_node_ip_address()
    return host


# --- one replica: the pack's own live server --------------------------------------------------------------
class LiveReplica:
    """A Serve replica that builds the face and voice (warmed) and serves them on its own port."""

    def __init__(self, settings: dict[str, Any], files: dict[str, tuple[str, bytes]], host: str,
                 registry: str) -> None:
        import ray
        from ray import serve

        from .run import build_live
        from .server import LiveServer, RunningServer, ServerOptions

        args = argparse.Namespace(**settings)
        self._folder = Path(tempfile.mkdtemp(prefix="dh-fleet-"))
        for option, (name, data) in files.items():  # the driver's input files, written on this node
            path = self._folder / f"{option}-{Path(name).name}"
            path.write_bytes(data)
            setattr(args, option, str(path))
        manager = build_live(args)
        self.server = RunningServer(LiveServer(manager, ServerOptions(ice_servers=args.ice_server,
                                                                      udp_ports=args.udp_ports)), host, 0)
        self.url = _url(_advertised_host(host), int(self.server.url.rsplit(":", 1)[1]))
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.max_sessions = manager.max_sessions
        self._registry = ray.get_actor(registry, namespace=NAMESPACE)
        ray.get(self._registry.register.remote(self.replica, self.url, os.getpid(), self.max_sessions))
        log.info("fleet replica %s: %s", self.replica, self.url)

    def check_health(self) -> None:
        """Serve calls this every HEALTH_PERIOD_S; raising makes Serve replace the replica. It doubles as the
        registry heartbeat, so a replica that stops answering health checks also stops receiving sessions."""
        if not self.server.alive():
            raise RuntimeError(f"replica {self.replica}: the live server's event loop stopped")
        self._registry.register.remote(self.replica, self.url, os.getpid(), self.max_sessions)

    def __del__(self) -> None:  # Serve's graceful shutdown of the replica
        registry = getattr(self, "_registry", None)
        if registry is not None:
            try:
                registry.forget.remote(self.replica)
            except Exception:  # noqa: BLE001 - the registry went first (the fleet is stopping)
                pass
        if getattr(self, "server", None) is not None:
            self.server.stop()  # closes every session of this replica
        shutil.rmtree(getattr(self, "_folder", ""), ignore_errors=True)


# --- the ingress: placement and the fleet's metrics -------------------------------------------------------
def _least_loaded(loads: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The replicas with a free slot, the emptiest (by fraction of its capacity, then sessions) first."""
    free = [(r, m) for r, m in loads if m["sessions"] < m["max_sessions"]]
    return sorted(free, key=lambda rm: (rm[1]["sessions"] / max(1, rm[1]["max_sessions"]), rm[1]["sessions"],
                                        rm[0]["replica"]))


def aggregate_metrics(loads: list[tuple[dict[str, Any], dict[str, Any]]],
                      unreachable: list[dict[str, Any]]) -> dict[str, Any]:
    """The fleet's /metrics: counts and sessions summed over replicas. Percentiles do not add up across
    replicas, so each stage keeps its total count, the largest value and the worst replica's percentiles;
    every replica's own snapshot is listed too."""
    counts: dict[str, int] = {}
    stages: dict[str, dict[str, float]] = {}
    for _, m in loads:
        for key, n in m.get("counts", {}).items():
            counts[key] = counts.get(key, 0) + int(n)
        for stage, s in m.get("stages", {}).items():
            agg = stages.setdefault(stage, {"n": 0, "max_ms": 0.0, "worst_p50_ms": 0.0, "worst_p95_ms": 0.0,
                                            "worst_p99_ms": 0.0})
            agg["n"] += s["n"]
            agg["max_ms"] = max(agg["max_ms"], s["max_ms"])
            for p in ("p50", "p95", "p99"):
                agg[f"worst_{p}_ms"] = max(agg[f"worst_{p}_ms"], s[f"{p}_ms"])
    return {"replicas": [{"replica": r["replica"], "url": r["url"], "pid": r["pid"], **m} for r, m in loads],
            "unreachable": [{"replica": r["replica"], "url": r["url"], "pid": r["pid"]} for r in unreachable],
            "sessions": sum(m["sessions"] for _, m in loads),
            "max_sessions": sum(m["max_sessions"] for _, m in loads),
            "counts": counts, "stages": stages}


class FleetIngress:
    """Serve's HTTP entry point: POST /sessions (placement), GET /metrics (the fleet's), GET / (a replica's page)."""

    def __init__(self, registry: str) -> None:
        import ray

        self._registry = ray.get_actor(registry, namespace=NAMESPACE)
        self._http: Any = None

    async def _client(self) -> Any:
        import aiohttp

        if self._http is None:  # made on the replica's own event loop, at the first request
            self._http = aiohttp.ClientSession()
        return self._http

    async def _call(self, method: str, url: str, timeout: float) -> tuple[int, dict[str, Any]]:
        import aiohttp

        http = await self._client()
        async with http.request(method, url, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            return r.status, await r.json(content_type=None)

    async def _loads(self) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], list[dict[str, Any]]]:
        """(replica, its /metrics) for every replica that answers; the registered ones that did not."""
        replicas = await self._registry.replicas.remote(STALE_AFTER_S)
        answers = await asyncio.gather(*(self._call("GET", r["url"] + "/metrics", PROBE_TIMEOUT_S)
                                         for r in replicas), return_exceptions=True)
        loads, unreachable = [], []
        for replica, answer in zip(replicas, answers):
            if isinstance(answer, BaseException) or answer[0] != 200:
                unreachable.append(replica)
            else:
                loads.append((replica, answer[1]))
        return loads, unreachable

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import JSONResponse, RedirectResponse

        path, method = request.url.path.rstrip("/") or "/", request.method
        if path == "/sessions" and method == "POST":
            return await self._open()
        if path == "/metrics" and method == "GET":
            loads, unreachable = await self._loads()
            return JSONResponse(aggregate_metrics(loads, unreachable))
        if path == "/" and method == "GET":
            loads, _ = await self._loads()
            order = _least_loaded(loads)
            if not order:
                return JSONResponse({"ok": False, "error": _full_message(loads, [])}, status_code=503)
            return RedirectResponse(order[0][0]["url"] + "/", status_code=307)
        if path.startswith("/sessions/"):
            return JSONResponse({"ok": False, "error": "a session lives on one replica: send this request to the "
                                 "`base` URL that POST /sessions answered with"}, status_code=404)
        return JSONResponse({"ok": False, "error": f"{method} {path}: the fleet's entry point answers POST /sessions, "
                             "GET /metrics and GET /"}, status_code=404)

    async def _open(self) -> Any:
        import aiohttp
        from starlette.responses import JSONResponse

        loads, unreachable = await self._loads()
        for replica, _ in _least_loaded(loads):
            try:
                status, body = await self._call("POST", replica["url"] + "/sessions", OPEN_TIMEOUT_S)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                unreachable.append(replica)
                continue
            if status == 201:
                return JSONResponse({**body, "base": replica["url"], "replica": replica["replica"]}, status_code=201)
            if status != 503:  # the replica's own answer (it names the problem)
                return JSONResponse(body, status_code=status)
            # 503: another placement took its last slot meanwhile; try the next one
        return JSONResponse({"ok": False, "error": _full_message(loads, unreachable)}, status_code=503)


def _full_message(loads: list[tuple[dict[str, Any], dict[str, Any]]], unreachable: list[dict[str, Any]]) -> str:
    if not loads:
        return ("no replica of the fleet answers (still starting, or being restarted by Ray Serve: "
                "`serve status` shows them); try again in a few seconds")
    sessions = sum(m["sessions"] for _, m in loads)
    capacity = sum(m["max_sessions"] for _, m in loads)
    late = f"; {len(unreachable)} more did not answer (restarting?)" if unreachable else ""
    return (f"every replica of the fleet is at capacity ({sessions} of {capacity} live sessions on {len(loads)} "
            f"replicas{late}); close one (DELETE /sessions/{{id}} on its replica's base URL) or start the fleet "
            "with more --replicas (GPUs) or a larger --max-sessions")


# --- the driver: check, connect, deploy, stop ----------------------------------------------------------------
def add_fleet_arguments(p: argparse.ArgumentParser) -> None:
    """`serve-fleet`: every `serve` option (each replica's) plus the fleet's own."""
    from .run import add_serve_arguments

    add_serve_arguments(p)
    p.add_argument("--replicas", type=int, help="live server replicas (default: one per GPU of the Ray "
                                                "cluster, or 1 without GPUs); --max-sessions is per replica")
    p.add_argument("--gpus-per-replica", type=float, help="default 1 when the cluster has GPUs, else 0 (CPU)")
    p.add_argument("--cpus-per-replica", type=float, default=1.0)
    p.add_argument("--address", help="join a Ray cluster: auto (this machine's `ray start`) or HOST:PORT; "
                                     "default: start a local Ray instance")


def check_fleet_args(args: argparse.Namespace) -> None:
    """Everything that can be checked before Ray starts or a model loads; one clear error naming the fix."""
    from .run import check_serve_inputs

    if args.replicas is not None and args.replicas < 1:
        raise ValueError(f"--replicas must be at least 1, got {args.replicas}")
    if args.cpus_per_replica <= 0:
        raise ValueError(f"--cpus-per-replica must be > 0, got {args.cpus_per_replica:g}")
    if args.gpus_per_replica is not None and args.gpus_per_replica < 0:
        raise ValueError(f"--gpus-per-replica must be >= 0, got {args.gpus_per_replica:g}")
    if args.max_sessions < 1:
        raise ValueError(f"--max-sessions must be at least 1, got {args.max_sessions}")
    check_serve_inputs(args, "serve-fleet", "fleet", FLEET_MODULES)
    for option in SHIPPED:
        path = getattr(args, option, None)
        if path and Path(path).stat().st_size > MAX_SHIPPED_MB << 20:
            raise ValueError(f"--{option} '{path}' is over {MAX_SHIPPED_MB} MB; every replica gets a copy: "
                             "trim it (a live face needs seconds of video, not minutes)")


def _check_listen(host: str, port: int | None) -> None:
    """The ingress's address can be listened on here (port None: only the host), named before Ray starts."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port or 0))
        except OSError as exc:
            what = f"--host {host}" if port is None else f"--host {host} --port {port}"
            raise ValueError(f"{what}: cannot listen there ({exc}); pick another --port or --host") from None


@dataclass
class Fleet:
    """A running fleet: `url` (the ingress), `replicas()` (the registry's entries), `stop()`."""

    url: str
    registry: Any
    started_ray: bool

    def replicas(self) -> list[dict[str, Any]]:
        import ray

        return ray.get(self.registry.replicas.remote(STALE_AFTER_S))

    def stop(self) -> None:
        import ray
        from ray import serve

        for name in (APP, f"{APP}-replicas"):  # replicas close their sessions as they shut down
            try:
                serve.delete(name)
            except Exception as exc:  # noqa: BLE001 - stopping goes on
                log.warning("fleet: could not delete Serve application %s: %s", name, exc)
        ray.kill(self.registry)
        if self.started_ray:
            serve.shutdown()
            ray.shutdown()


def start_fleet(args: argparse.Namespace) -> Fleet:
    """Check, start or join Ray, deploy the replicas (blocks until each is warm and listening), then the
    ingress on Serve's HTTP proxy at args.host:args.port."""
    check_fleet_args(args)
    # a joined cluster may already run Serve's proxy on this port (then the fleet shares it): host only
    _check_listen(args.host, args.port if args.address is None else None)
    from ...ray_env import connect_ray, worker_env

    started_ray = connect_ray(args.address, 256, None, command="serve-fleet")
    try:
        return _deploy(args, started_ray, worker_env)
    except BaseException:
        if started_ray:
            import ray

            ray.shutdown()
        raise


def _deploy(args: argparse.Namespace, started_ray: bool, worker_env: Any) -> Fleet:
    import ray
    from ray import serve

    cluster_gpus = float(ray.cluster_resources().get("GPU", 0.0))
    gpus = args.gpus_per_replica if args.gpus_per_replica is not None else (1.0 if cluster_gpus >= 1 else 0.0)
    replicas = args.replicas or (max(1, int(cluster_gpus // gpus)) if gpus > 0 else 1)
    if started_ray:  # this machine is the whole cluster: what cannot fit would wait forever
        cpus = float(ray.cluster_resources().get("CPU", 0.0))
        if gpus * replicas > cluster_gpus:
            raise ValueError(f"{replicas} replicas x {gpus:g} GPU need {gpus * replicas:g} GPUs, this machine has "
                             f"{cluster_gpus:g}; lower --replicas, use --gpus-per-replica 0 for CPU replicas, or "
                             "join a larger cluster with --address")
        if args.cpus_per_replica * replicas > cpus:
            raise ValueError(f"{replicas} replicas x {args.cpus_per_replica:g} CPU need "
                             f"{args.cpus_per_replica * replicas:g} CPUs, this machine has {cpus:g}; lower "
                             "--replicas or --cpus-per-replica")
    same_machine = args.address in (None, "auto")
    env = worker_env(same_machine=same_machine, cpus_per_worker=args.cpus_per_replica, gpu=gpus > 0)
    files = {option: (Path(path).name, Path(path).read_bytes())
             for option in SHIPPED if (path := getattr(args, option, None))}
    settings = {k: v for k, v in vars(args).items() if k != "func"}
    registry_name = f"{APP}-registry-{os.getpid()}-{threading.get_ident()}"
    registry = ray.remote(num_cpus=0)(Registry).options(name=registry_name, namespace=NAMESPACE,
                                                        runtime_env={"env_vars": env}).remote()
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        replica = serve.deployment(
            LiveReplica, name="LiveReplica", num_replicas=replicas, health_check_period_s=HEALTH_PERIOD_S,
            health_check_timeout_s=30.0, max_ongoing_requests=4,
            ray_actor_options={"num_cpus": args.cpus_per_replica, "num_gpus": gpus, "runtime_env": {"env_vars": env}})
        started = time.perf_counter()
        try:
            serve.run(replica.bind(settings, files, args.host, registry_name), name=f"{APP}-replicas",
                      route_prefix=None)
        except RuntimeError as exc:  # Serve's own message names only the deployment: add the replica's error
            raise RuntimeError(f"the live replicas did not start: {_replica_error(serve) or exc}") from None
        ingress = serve.deployment(FleetIngress, name="FleetIngress", num_replicas=1, max_ongoing_requests=64,
                                   ray_actor_options={"num_cpus": 0, "runtime_env": {"env_vars": env}})
        serve.run(ingress.bind(registry_name), name=APP, route_prefix="/")
    except BaseException:
        ray.kill(registry)
        raise
    log.info("fleet: %d replicas ready in %.1f s", replicas, time.perf_counter() - started)
    return Fleet(url=_url(args.host if args.host not in ("0.0.0.0", "::") else "127.0.0.1", args.port),
                 registry=registry, started_ray=started_ray)


def _replica_error(serve: Any) -> str | None:
    """The last line of the error a replica's constructor raised (Serve keeps its traceback in the status)."""
    try:
        message = serve.status().applications[f"{APP}-replicas"].deployments["LiveReplica"].message
    except Exception:  # noqa: BLE001 - no status to add
        return None
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return lines[-1] if lines else None


def serve_fleet(args: argparse.Namespace) -> dict[str, Any]:
    """The CLI: start the fleet, print where it listens, serve until SIGTERM/SIGINT, then stop it."""
    from ... import stop_signals

    fleet = start_fleet(args)
    stop_signals.claim()  # ray.init replaced the SIGTERM handler with a plain exit: stop cleanly instead
    replicas = fleet.replicas()
    try:
        print(f"live fleet: {fleet.url}/  ({len(replicas)} replicas: "
              f"{', '.join(r['url'] for r in replicas)}; Ctrl-C or SIGTERM stops)", flush=True)
        threading.Event().wait()
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM raised as stop_signals.Stopped: a normal end of serving
        log.info("fleet: stopping")
    finally:
        fleet.stop()
    return {"outputs": [], "backend": {"tts": args.engine, "talking_head": args.model},
            "timings": {}, "replicas": replicas}
