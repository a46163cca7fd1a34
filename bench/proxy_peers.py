"""Peers, side by side: rollwire's capture proxy against other proxies, one upstream, one run.

Every entry answers the same 256-token chat completion (logprobs, ``top_logprobs: 1``,
``return_token_ids``; ~60 KB of vLLM-shaped JSON) from the same upstream, driven by the same
load generator, all in one run:

1. ``direct``: the upstream itself, no proxy (the baseline);
2. ``starlette``: a minimal pass-through, Starlette on uvicorn, httpx to the upstream (this
   file, ``--serve starlette``): it forwards the body of ``POST /v1/chat/completions`` and
   returns the upstream's body;
3. ``aiohttp``: the same with aiohttp on both sides (``web`` server, ``ClientSession``);
4. ``litellm``: LiteLLM's proxy configured as its docs say for an OpenAI-compatible upstream
   (``model_list`` with ``model: openai/<name>``, ``api_base``, ``api_key``, and the master
   key it refuses to start without), in an isolated environment of its own
   (``--litellm-env``), with ``LITELLM_LOCAL_MODEL_COST_MAP=True`` and telemetry off, so it
   never reaches the internet. It logs and transforms each reply, so it counts as capturing,
   though not at the token level;
5. ``rollwire``: ``python -m rollwire proxy``, exactly as bench/proxy_overhead.py runs it
   (token-in and every check on; one capture session per connection, rotated every
   ``--per-session`` calls, sessions opened before each timed run).

The upstream is bench/proxy_overhead.py's replay server (``--serve-replay``: it answers each
distinct request with the bytes ``tests.fakes.vllm`` gave the first time, ~0.1 ms a call),
so calls/s at concurrency 32 measures the proxies, not the engine. Its load generator, CPU
placement (upstreams and this client on CPU 0, every proxy on CPU 1, with taskset) and /proc
CPU accounting are reused from there.

Before timing, each entry answers one call whose reply is inspected: where the 256 token ids
and 256 logprobs are (a client reads them at ``choices[0].token_ids`` and
``choices[0].logprobs.content``), whether they equal the direct reply's, and which keys the
entry dropped or added. A reply that moved or lost them is a finding, recorded, not an error.
Then the entries take turns in ``--rounds`` rounds per concurrency (the order rotates each
round) so machine noise hits them all. Per entry and concurrency: the *added* median and p99
latency against direct (pooled, and per round), calls/s, and the CPU the entry's process spent
per call (from ``/proc``, the number least disturbed by a noisy machine); after all rounds its
resident memory (``VmRSS`` and peak ``VmHWM`` from ``/proc/<pid>/status``).

Run from the repository root::

    UV_PYTHON_DOWNLOADS=never uv run python bench/proxy_peers.py                # ~2-3 min
    UV_PYTHON_DOWNLOADS=never uv run python bench/proxy_peers.py --rounds 3
    UV_PYTHON_DOWNLOADS=never uv run python bench/proxy_peers.py --entries direct,aiohttp,rollwire

The first run with ``litellm`` makes its environment with uv (``litellm[proxy]==VERSION``;
where the index lacks a package that extra pins, ``litellm==VERSION`` plus the extra's other
requirements, recorded as such); later runs reuse it. An entry that cannot be installed,
started or measured is marked failed with the reason; the others are still measured.

Results: markdown tables on stdout and ``bench/results/proxy_peers.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import importlib.metadata
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from measure import free_port, git_state, machine, write_json
from proxy_overhead import (
    ALL_SERVICES,
    CALL_TIMEOUT_S,
    CLIENT_CPU,
    HOST,
    MODEL,
    PROXY_CPU,
    RESULTS_DIR,
    UPSTREAM_CPU,
    HttpConn,
    Mode,
    RunResult,
    Service,
    SessionPool,
    Side,
    build_request,
    completion_body,
    http_json,
    pin_client,
    rotating_sessions,
    run_load,
    spawn_fake,
    spawn_replay,
    spawn_rollwire_proxy,
    start_service,
    verify,
    wait_ready,
    warn_if_busy,
)
from proxy_overhead import _fmt as fmt

THIS_FILE = Path(__file__).resolve()
ENTRIES = ("direct", "starlette", "aiohttp", "litellm", "rollwire")
CAPTURES = {
    "direct": "-",
    "starlette": "no",
    "aiohttp": "no",
    "litellm": "yes (logs, transforms)",
    "rollwire": "yes (tokens)",
}
LITELLM_VERSION = "1.110.2"
LITELLM_ENV_PACKAGES = (
    "litellm",
    "litellm-proxy-extras",
    "litellm-enterprise",
    "fastapi",
    "starlette",
    "uvicorn",
    "uvloop",
    "httptools",
    "httpx",
    "aiohttp",
    "openai",
)
LOCAL_PACKAGES = ("rollwire", "starlette", "uvicorn", "httpx", "aiohttp", "uvloop", "httptools")
UPSTREAM_POOL = 64  # keep-alive upstream connections of the minimal pass-throughs (>= 32)
JSON_HEADERS = {"content-type": "application/json"}
PATH = "/v1/chat/completions"


# --------------------------------------------------------------------------- pass-throughs


def serve_starlette(port: int, upstream: str) -> None:
    """Starlette on uvicorn, httpx to the upstream: the body in, the upstream's body out."""
    import httpx
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    clients: list[httpx.AsyncClient] = []

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        limits = httpx.Limits(
            max_connections=UPSTREAM_POOL, max_keepalive_connections=UPSTREAM_POOL
        )
        async with httpx.AsyncClient(limits=limits, timeout=CALL_TIMEOUT_S) as client:
            clients.append(client)
            yield

    async def chat(request: Request) -> Response:
        body = await request.body()
        reply = await clients[0].post(
            f"{upstream}/chat/completions", content=body, headers=JSON_HEADERS
        )
        return Response(reply.content, reply.status_code, media_type="application/json")

    async def health(_request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    routes = [Route(PATH, chat, methods=["POST"]), Route("/health", health)]
    app = Starlette(routes=routes, lifespan=lifespan)
    uvicorn.run(app, host=HOST, port=port, log_level="warning", access_log=False)


def serve_aiohttp(port: int, upstream: str) -> None:
    """An aiohttp web server, an aiohttp ClientSession to the upstream."""
    from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

    session_key = web.AppKey("session", ClientSession)

    async def upstream_session(app: web.Application) -> AsyncIterator[None]:
        connector = TCPConnector(limit=UPSTREAM_POOL)
        timeout = ClientTimeout(total=CALL_TIMEOUT_S)
        async with ClientSession(connector=connector, timeout=timeout) as session:
            app[session_key] = session
            yield

    async def chat(request: web.Request) -> web.Response:
        body = await request.read()
        session = request.app[session_key]
        async with session.post(
            f"{upstream}/chat/completions", data=body, headers=JSON_HEADERS
        ) as reply:
            data = await reply.read()
        return web.Response(body=data, status=reply.status, content_type="application/json")

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.cleanup_ctx.append(upstream_session)
    app.router.add_post(PATH, chat)
    app.router.add_get("/health", health)
    loop = None  # on uvloop where it is installed, as uvicorn (and rollwire's proxy) would be
    with contextlib.suppress(ImportError):
        import uvloop

        loop = uvloop.new_event_loop()
    web.run_app(app, host=HOST, port=port, print=None, access_log=None, loop=loop)


PASS_THROUGHS = {"starlette": serve_starlette, "aiohttp": serve_aiohttp}


# --------------------------------------------------------------------------- LiteLLM


def default_litellm_env(version: str) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "rollwire-bench" / f"litellm-{version}"


# Run by the LiteLLM environment's own python: the requirements of litellm's ``proxy`` extra.
PROXY_EXTRA_SCRIPT = """
import importlib.metadata, sys
from packaging.requirements import Requirement
for line in importlib.metadata.requires("litellm") or []:
    req = Requirement(line)
    m = req.marker
    if m is not None and m.evaluate({"extra": "proxy"}) and not m.evaluate({"extra": ""}):
        req.marker = None
        print(req)
"""

VERSIONS_SCRIPT = """
import importlib.metadata, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        pass
print(json.dumps(out))
"""


def _run(argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
    )


def _tail(text: str, n: int = 600) -> str:
    return " ".join(text.split())[-n:]


def package_versions(python: str, names: tuple[str, ...]) -> dict[str, str]:
    done = _run([python, "-c", VERSIONS_SCRIPT, *names], 60)
    return orjson.loads(done.stdout) if done.returncode == 0 else {}


def ensure_litellm(env_dir: Path, version: str, timeout_s: float) -> dict[str, Any]:
    """LiteLLM's proxy in a virtual environment of its own: reused when it holds ``version``,
    else made with uv. RuntimeError (with the reason) when it cannot be made."""
    python = env_dir / "bin" / "python"
    script = env_dir / "bin" / "litellm"
    info: dict[str, Any] = {"env": str(env_dir)}
    if python.exists() and script.exists():
        have = package_versions(str(python), ("litellm",)).get("litellm")
        if have == version and (env_dir / ".rollwire-bench-install").exists():
            info["install"] = (env_dir / ".rollwire-bench-install").read_text().strip()
            info["reused"] = True
            info["packages"] = package_versions(str(python), LITELLM_ENV_PACKAGES)
            return info
    uv = shutil.which("uv")
    if uv is None:
        raise RuntimeError("uv is not on PATH: cannot make LiteLLM's environment")
    if env_dir.exists() and not (env_dir / "pyvenv.cfg").exists():
        raise RuntimeError(f"{env_dir} exists and is not a virtual environment: left alone")
    started = time.monotonic()
    shutil.rmtree(env_dir, ignore_errors=True)
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    done = _run([uv, "venv", "-q", "-p", sys.executable, str(env_dir)], 120)
    if done.returncode != 0:
        raise RuntimeError(f"uv venv failed: {_tail(done.stderr)}")
    install = [uv, "pip", "install", "-q", "-p", str(python)]
    done = _run([*install, f"litellm[proxy]=={version}"], timeout_s)
    if done.returncode == 0:
        how = f"uv pip install 'litellm[proxy]=={version}'"
    else:
        # The extra pins packages the index may not have (1.110.x: ``litellm-proxy``, a
        # meta-package, and exact ``litellm-proxy-extras``/``litellm-enterprise`` versions):
        # install litellm itself, then the extra's other requirements.
        why = _tail(done.stderr, 400)
        done = _run([*install, f"litellm=={version}"], timeout_s)
        if done.returncode != 0:
            raise RuntimeError(f"cannot install litellm=={version}: {_tail(done.stderr)}")
        extra = _run([str(python), "-c", PROXY_EXTRA_SCRIPT], 60)
        if extra.returncode != 0:
            raise RuntimeError(f"cannot read litellm's proxy extra: {_tail(extra.stderr)}")
        reqs, left_out, relaxed = [], [], []
        for line in extra.stdout.split():
            name = line.split("=")[0].split("<")[0].split(">")[0].split("[")[0]
            if name == "litellm-proxy":
                left_out.append(line)
            elif name.startswith("litellm-") and "==" in line:
                relaxed.append(line)
                reqs.append(name)
            else:
                reqs.append(line)
        req_file = env_dir / "proxy-extra.txt"
        req_file.write_text("\n".join(reqs) + "\n")
        done = _run([*install, "-r", str(req_file)], timeout_s)
        if done.returncode != 0:
            raise RuntimeError(
                f"cannot install litellm's proxy requirements: {_tail(done.stderr)} "
                f"(and litellm[proxy]=={version}: {why})"
            )
        how = (
            f"uv pip install litellm=={version}, then its [proxy] extra's requirements without "
            f"{', '.join(left_out) or 'nothing'} and with pins relaxed on {', '.join(relaxed)} "
            f"(litellm[proxy]=={version} itself: {why})"
        )
    (env_dir / ".rollwire-bench-install").write_text(how + "\n")
    info.update(
        install=how,
        reused=False,
        install_s=round(time.monotonic() - started, 1),
        packages=package_versions(str(python), LITELLM_ENV_PACKAGES),
    )
    if info["packages"].get("litellm") != version:
        raise RuntimeError(f"installed litellm {info['packages'].get('litellm')}, not {version}")
    return info


def litellm_config(path: Path, upstream_port: int, master_key: str) -> None:
    """The docs' config for an OpenAI-compatible server (JSON strings are valid YAML)."""
    path.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: http://{HOST}:{upstream_port}/v1\n"
        "      api_key: none\n"
        "general_settings:\n"
        f'  master_key: "{master_key}"\n'
    )


# --------------------------------------------------------------------------- entries


@dataclass
class Entry:
    name: str
    port: int = 0
    service: Service | None = None  # None for direct
    headers: dict[str, str] = field(default_factory=dict)
    sessions: bool = False  # rollwire: a capture session per connection
    ready_path: str = "/health"
    ready_timeout_s: float = 60.0
    requests: int = 200
    failed: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    sides: dict[int, Side] = field(default_factory=dict)

    def fail(self, reason: str) -> None:
        if self.failed is None:
            tail = self.service.log_tail(1500) if self.service else ""
            self.failed = reason + (f"\n--- log tail ---\n{tail}" if tail else "")
            print(f"  {self.name}: FAILED: {reason}", file=sys.stderr, flush=True)
        if self.service is not None:  # a failed proxy leaves the proxies' core to the others
            self.service.stop()
            with contextlib.suppress(ValueError):  # and the CPU accounting
                ALL_SERVICES.remove(self.service)


def rss_mib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak) of a process, in MiB."""
    out: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in ("VmRSS", "VmHWM"):
                    out[key] = round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return out


def child_pids(pid: int) -> list[int]:
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(x) for x in f.read().split()]
    return kids


def reply_shape(reply: dict[str, Any], want: int, ref: dict[str, Any] | None) -> dict[str, Any]:
    """Where the reply keeps token ids and logprobs; what it dropped or added against ``ref``."""
    choice = reply["choices"][0]
    ids = choice.get("token_ids")
    moved = (choice.get("provider_specific_fields") or {}).get("token_ids")
    content = (choice.get("logprobs") or {}).get("content") or []
    shape: dict[str, Any] = {
        "choices[0].token_ids": len(ids) if isinstance(ids, list) else ids,
        "choices[0].provider_specific_fields.token_ids": (
            len(moved) if isinstance(moved, list) else moved
        ),
        "choices[0].logprobs.content": len(content),
        "logprob_entries_with_bytes": sum(e.get("bytes") is not None for e in content),
        "top_logprobs_entries": sum(len(e.get("top_logprobs") or []) for e in content),
        "prompt_token_ids": len(reply.get("prompt_token_ids") or []),
        "where_expected": (isinstance(ids, list) and len(ids) == want and len(content) == want),
    }
    if ref is not None:
        ref_choice = ref["choices"][0]
        ref_content = ref_choice["logprobs"]["content"]
        shape["same_token_ids_as_direct"] = (ids if ids else moved) == ref_choice["token_ids"]
        shape["same_logprobs_as_direct"] = [e.get("logprob") for e in content] == [
            e["logprob"] for e in ref_content
        ]
        shape["same_text_as_direct"] = (
            choice["message"].get("content") == ref_choice["message"]["content"]
        )
        for label, a, b in (("", reply, ref), ("choices[0].", choice, ref_choice)):
            dropped = sorted(set(b) - set(a))
            shape.setdefault("keys_dropped", []).extend(label + k for k in dropped)
            shape.setdefault("non_null_keys_dropped", []).extend(
                label + k for k in dropped if b[k] is not None
            )
            shape.setdefault("keys_added", []).extend(label + k for k in sorted(set(a) - set(b)))
    return shape


async def entry_request(entry: Entry, body: bytes, pool: SessionPool | None = None) -> bytes:
    if entry.sessions:
        assert pool is not None
        await pool.fill(1)
        return pool.take()
    return build_request("POST", PATH, body, entry.headers)


async def check_entry(
    entry: Entry, body: bytes, want: int, ref: dict[str, Any] | None
) -> dict[str, Any]:
    """One reply, inspected (the second of two: the first may be a replay-cache miss)."""
    pool = SessionPool(entry.port, body, 10) if entry.sessions else None
    request = await entry_request(entry, body, pool)
    conn = await HttpConn.open(entry.port)
    try:
        for _ in range(2):
            async with asyncio.timeout(CALL_TIMEOUT_S):
                status, raw = await conn.send(request)
    finally:
        await conn.close()
    if pool is not None:
        await pool.close_used()
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {raw[:300]!r}")
    reply = orjson.loads(raw)
    shape = {"reply_bytes": len(raw), **reply_shape(reply, want, ref)}
    shape["_reply"] = reply
    return shape


async def start_entries(
    names: list[str],
    upstream: Service,
    args: argparse.Namespace,
    cpu: int | None,
    log_dir: Path,
) -> list[Entry]:
    """Start every proxy (all at once: LiteLLM's slow start overlaps the others'), then wait."""
    entries: list[Entry] = []
    upstream_url = f"http://{HOST}:{upstream.port}/v1"
    for name in names:
        entry = Entry(name, requests=args.requests)
        entries.append(entry)
        try:
            if name == "direct":
                entry.port = upstream.port
                entry.ready_path = ""
            elif name in PASS_THROUGHS:
                port = free_port()
                argv = [sys.executable, str(THIS_FILE), "--serve", name, "--port", str(port)]
                entry.service = start_service(
                    name, [*argv, "--upstream", upstream_url], port, cpu, log_dir
                )
                have = local_versions()
                entry.info["packages"] = {
                    k: v for k, v in have.items() if k in ("uvicorn", "httpx", "aiohttp")
                }
                entry.info["event_loop"] = "uvloop" if "uvloop" in have else "asyncio"
                if name == "starlette":
                    entry.info["http_parser"] = "httptools" if "httptools" in have else "h11"
            elif name == "rollwire":
                entry.service = spawn_rollwire_proxy(name, upstream.port, cpu, log_dir)
                entry.sessions = True
                entry.info["packages"] = {"rollwire": local_versions().get("rollwire")}
            elif name == "litellm":
                entry.requests = args.litellm_requests
                entry.ready_path = "/health/liveliness"
                entry.ready_timeout_s = args.litellm_start_timeout
                env_dir = Path(args.litellm_env or default_litellm_env(args.litellm_version))
                print(f"  litellm: environment {env_dir} ...", file=sys.stderr, flush=True)
                entry.info.update(
                    await asyncio.to_thread(
                        ensure_litellm, env_dir, args.litellm_version, args.litellm_install_timeout
                    )
                )
                key = "sk-" + secrets.token_hex(32)
                entry.headers = {"authorization": f"Bearer {key}"}
                config = log_dir / "litellm.yaml"
                litellm_config(config, upstream.port, key)
                entry.info["config"] = config.read_text().replace(key, "sk-<random>")
                port = free_port()
                argv = [
                    *("env", "LITELLM_LOCAL_MODEL_COST_MAP=True", "LITELLM_TELEMETRY=False"),
                    *(str(env_dir / "bin" / "python"), str(env_dir / "bin" / "litellm")),
                    *("--config", str(config), "--host", HOST, "--port", str(port)),
                ]
                entry.info["argv"] = argv[3:]
                entry.service = start_service(name, argv, port, cpu, log_dir)
            else:
                raise ValueError(name)
            if entry.service is not None:
                entry.port = entry.service.port
        except Exception as exc:  # one entry failing must not stop the others
            entry.fail(f"start: {exc}")

    async def ready(entry: Entry) -> None:
        if entry.failed or entry.service is None:
            return
        t0 = time.monotonic()
        try:
            await wait_ready(entry.service, entry.ready_path, entry.ready_timeout_s)
        except Exception as exc:
            entry.fail(f"not ready: {str(exc).splitlines()[0].rstrip(':')}")
            return
        entry.info["ready_s"] = round(time.monotonic() - t0, 1)
        entry.info["rss_mib_idle"] = rss_mib(entry.service.proc.pid)
        entry.info["child_processes"] = len(child_pids(entry.service.proc.pid))

    await asyncio.gather(*(ready(e) for e in entries))
    return entries


def log_warnings(path: Path, most: int = 8) -> dict[str, Any]:
    """How many lines of a service's log warn or err, and the first few distinct ones."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return {}
    hits = [ln for ln in lines if any(w in ln for w in ("WARNING", "ERROR", "Traceback"))]
    first = list(dict.fromkeys(ln.strip()[:240] for ln in hits))[:most]
    return {"log_lines": len(lines), "warning_lines": len(hits), "first": first}


def local_versions() -> dict[str, str]:
    out = {}
    for name in LOCAL_PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[name] = importlib.metadata.version(name)
    return out


# --------------------------------------------------------------------------- measuring


async def one_run(
    entry: Entry,
    body: bytes,
    n: int,
    conc: int,
    services: list[Service],
    args: argparse.Namespace,
    cap_s: float,
) -> RunResult:
    if entry.sessions:
        pool = SessionPool(entry.port, body, args.per_session)
        await pool.fill(math.ceil(n / args.per_session) + conc)
        try:
            source = rotating_sessions(pool, args.per_session)
            return await run_load(entry.port, n, conc, source, services, cap_s)
        finally:
            await pool.close_used()
    request = await entry_request(entry, body)
    return await run_load(entry.port, n, conc, lambda _w: lambda: request, services, cap_s)


async def measure(
    entries: list[Entry],
    body: bytes,
    args: argparse.Namespace,
    global_deadline: float,
) -> None:
    def cap() -> float:
        return max(1.0, min(args.run_seconds, global_deadline - time.monotonic()))

    async def attempt(entry: Entry, n: int, conc: int, label: str) -> RunResult | None:
        try:
            run = await one_run(entry, body, n, conc, list(ALL_SERVICES), args, cap())
        except Exception as exc:  # the others go on
            entry.fail(f"{label} c={conc}: {exc!r}")
            return None
        if entry.service is not None and entry.service.proc.poll() is not None:
            entry.fail(f"{label} c={conc}: the process exited ({entry.service.proc.returncode})")
            return None
        return run

    print("  warm-up", file=sys.stderr, flush=True)
    for conc in args.concurrency:
        for entry in entries:
            if not entry.failed:
                await attempt(entry, max(20, 2 * conc), conc, "warm-up")
    for conc in args.concurrency:
        for entry in entries:
            entry.sides[conc] = Side()
        for rnd in range(args.rounds):
            live = [e for e in entries if not e.failed]
            k = rnd % max(1, len(live))
            for entry in live[k:] + live[:k]:
                if time.monotonic() > global_deadline:
                    print("  global time cap reached: stopping early", file=sys.stderr)
                    return
                run = await attempt(entry, entry.requests, conc, f"round {rnd}")
                if run is not None:
                    entry.sides[conc].runs.append(run)
                    print(
                        f"  [c={conc} round {rnd}] {entry.name}: median "
                        f"{fmt(sorted(run.latencies_ms)[run.calls // 2] if run.calls else None)}"
                        f" ms, {run.calls / run.wall_s:.0f} calls/s",
                        file=sys.stderr,
                        flush=True,
                    )


def summarise(entry: Entry, direct: Entry | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for conc, side in entry.sides.items():
        if not side.runs:
            continue
        s = side.summary()
        r: dict[str, Any] = {"concurrency": conc, **s}
        if entry.service is not None:
            r["proxy_cpu_ms_per_call"] = s["cpu_ms_per_call"].get(entry.name, math.nan)
            wall = sum(run.wall_s for run in side.runs)
            others = sum(
                v
                for run in side.runs
                for k, v in run.cpu_s.items()
                if k in ENTRIES and k != entry.name
            )
            # Idle peers are not free: LiteLLM, say, keeps background tasks on the proxies' core.
            r["other_proxies_cpu_cores"] = others / wall if wall else math.nan
        ref = direct.sides.get(conc) if direct is not None and direct is not entry else None
        if ref is not None and ref.runs:
            d = ref.summary()
            r["added_median_ms"] = s["median_ms"] - d["median_ms"]
            r["added_p99_ms"] = s["p99_ms"] - d["p99_ms"]
            r["added_median_ms_rounds"] = [
                round(a - b, 3)
                for a, b in zip(s["median_ms_rounds"], d["median_ms_rounds"], strict=False)
            ]
        out[str(conc)] = r
    return out


# --------------------------------------------------------------------------- report


def markdown(doc: dict[str, Any]) -> str:
    f = fmt
    lo, hi = (
        str(c) for c in (min(doc["params"]["concurrency"]), max(doc["params"]["concurrency"]))
    )
    lines = [
        f"| entry | captures | added median ms c={lo} | p99 ms c={lo} | calls/s c={lo} "
        f"| calls/s c={hi} | proxy CPU ms/call c={lo} / c={hi} | RSS MiB (peak) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, e in doc["entries"].items():
        if e["failed"]:
            reason = e["failed"].splitlines()[0][:160]
            lines.append(f"| {name} | {e['captures']} | failed: {reason} | | | | | |")
            continue
        a, b = e["results"].get(lo, {}), e["results"].get(hi, {})
        if name == "direct":
            added = f"baseline ({f(a.get('median_ms'))})"
        else:
            added = f(a.get("added_median_ms"))
        cpu = f"{f(a.get('proxy_cpu_ms_per_call'))} / {f(b.get('proxy_cpu_ms_per_call'))}"
        rss = e.get("rss_mib_after", {})
        mem = f"{f(rss.get('VmRSS'), 0)} ({f(rss.get('VmHWM'), 0)})" if rss else "-"
        if name == "direct":
            cpu = mem = "-"
        lines.append(
            f"| {name} | {e['captures']} | {added} | {f(a.get('p99_ms'))} "
            f"| {f(a.get('calls_per_s'), 0)} | {f(b.get('calls_per_s'), 0)} | {cpu} | {mem} |"
        )
    lines += [
        "",
        f"| entry | added p99 ms c={lo} | added median ms c={lo}, per round | median ms c={hi} "
        f"| p99 ms c={hi} | errors | other processes (cores) c={lo} / c={hi} |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for name, e in doc["entries"].items():
        if e["failed"]:
            continue
        a, b = e["results"].get(lo, {}), e["results"].get(hi, {})
        errors = sum(r.get("errors", 0) for r in e["results"].values())
        added_p99 = "-" if name == "direct" else f(a.get("added_p99_ms"))
        lines.append(
            f"| {name} | {added_p99} | {a.get('added_median_ms_rounds', '-')} "
            f"| {f(b.get('median_ms'))} | {f(b.get('p99_ms'))} | {errors} "
            f"| {f(a.get('foreign_load_cores'))} / {f(b.get('foreign_load_cores'))} |"
        )
    lines += [
        "",
        "| entry | ids at choices[0].token_ids | ids elsewhere | logprobs | with bytes "
        "| same ids / logprobs as direct | non-null keys dropped | keys added |",
        "|---|---:|---|---:|---:|---|---|---|",
    ]
    for name, e in doc["entries"].items():
        c = e.get("check")
        if not c:
            continue
        moved = c.get("choices[0].provider_specific_fields.token_ids")
        same = f"{c.get('same_token_ids_as_direct', '-')} / {c.get('same_logprobs_as_direct', '-')}"
        lines.append(
            f"| {name} | {c['choices[0].token_ids']} "
            f"| {f'provider_specific_fields: {moved}' if moved is not None else '-'} "
            f"| {c['choices[0].logprobs.content']} | {c['logprob_entries_with_bytes']} | {same} "
            f"| {', '.join(c.get('non_null_keys_dropped', [])) or '-'} "
            f"| {', '.join(c.get('keys_added', [])) or '-'} |"
        )
    ll = doc["entries"].get("litellm", {}).get("info", {})
    load = doc["loadavg_start_end"]
    lines += [
        "",
        f"Load average {load[0]:.2f} at the start, {load[1]:.2f} at the end; other processes "
        f"used {f(doc['foreign_load_cores'])} cores during the timed runs (above ~0.2 the tails "
        f"are not the proxies'). {doc['params']['rounds']} rounds, order rotating; placement "
        f"{doc['placement']}. Proxy CPU = the proxy process's own CPU per call (/proc). "
        "RSS after all rounds (peak in brackets).",
    ]
    if ll.get("packages"):
        lines.append(f"LiteLLM {ll['packages'].get('litellm')}: {ll.get('install')}.")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    pin = pin_client(args.no_pin)
    load_start = warn_if_busy()
    started = time.monotonic()
    body = completion_body(args.reply_tokens)
    log_dir = Path(tempfile.mkdtemp(prefix="rollwire-peers-"))
    entries: list[Entry] = []
    origin: dict[str, Any] = {}
    try:
        fake = spawn_fake(args.reply_tokens, UPSTREAM_CPU if pin else None, log_dir)
        await wait_ready(fake, "/health")
        upstream = spawn_replay("upstream", fake.port, 0.0, UPSTREAM_CPU if pin else None, log_dir)
        await wait_ready(upstream, "/v1/models")
        entries = await start_entries(
            args.entries, upstream, args, PROXY_CPU if pin else None, log_dir
        )
        by_name = {e.name: e for e in entries}
        direct = by_name.get("direct")
        ref: dict[str, Any] | None = None
        # The correctness check, before any timing; direct first (the reference).
        for entry in sorted(entries, key=lambda e: e.name != "direct"):
            if entry.failed:
                continue
            try:
                check = await check_entry(entry, body, args.reply_tokens, ref)
                if entry.name == "direct":
                    ref = check["_reply"]
                if entry.name == "rollwire":  # capture tier and the captured rollout
                    assert entry.service is not None
                    mode = Mode(entry.name, upstream, entry.service, [upstream, fake], 0)
                    check["capture"] = await verify(mode, body, args.reply_tokens)
            except Exception as exc:
                entry.fail(f"check: {exc!r}")
                continue
            check.pop("_reply")
            entry.info["check"] = check
            summary = {k: v for k, v in check.items() if not k.startswith("keys")}
            print(f"  check {entry.name}: {summary}", file=sys.stderr, flush=True)
        measure_deadline = time.monotonic() + args.max_total_seconds
        await measure([e for e in entries if not e.failed], body, args, measure_deadline)
        for entry in entries:
            if entry.service is not None and entry.service.proc.poll() is None:
                entry.info["rss_mib_after"] = rss_mib(entry.service.proc.pid)
        with contextlib.suppress(Exception):
            origin = (await http_json(fake.port, "GET", "/_fake/stats"))[1]
        results = {e.name: summarise(e, direct) for e in entries}
    except BaseException:
        for s in ALL_SERVICES:
            print(f"--- {s.name} log (tail) ---\n{s.log_tail()}", file=sys.stderr)
        print(f"service logs kept in {log_dir}", file=sys.stderr)
        raise
    finally:
        for s in reversed(ALL_SERVICES):
            s.stop()
    for entry in entries:
        if entry.service is not None:
            entry.info["log_warnings"] = log_warnings(entry.service.log_path)
    if args.keep_logs:
        print(f"service logs kept in {log_dir}", file=sys.stderr)
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    runs = [r for e in entries for side in e.sides.values() for r in side.runs]
    wall = sum(r.wall_s for r in runs)
    doc: dict[str, Any] = {
        "benchmark": "proxy_peers",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git": git_state(),
        "machine": machine(),
        "placement": (
            {"upstreams": UPSTREAM_CPU, "proxies": PROXY_CPU, "client": CLIENT_CPU}
            if pin
            else "unpinned"
        ),
        "params": {
            "entries": args.entries,
            "reply_tokens": args.reply_tokens,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "requests_per_round": {e.name: e.requests for e in entries},
            "run_seconds": args.run_seconds,
            "max_total_seconds": args.max_total_seconds,
            "per_session": args.per_session,
            "upstream_pool_of_pass_throughs": UPSTREAM_POOL,
            "litellm_version": args.litellm_version,
        },
        "local_packages": local_versions(),
        "entries": {
            e.name: {
                "captures": CAPTURES[e.name],
                "failed": e.failed,
                "check": e.info.pop("check", None),
                "rss_mib_after": e.info.pop("rss_mib_after", {}),
                "info": e.info,
                "results": results.get(e.name, {}),
            }
            for e in entries
        },
        "origin_stats": origin,  # chat_completions: requests the replay did not have cached
        "foreign_load_cores": sum(r.foreign_cpu_s for r in runs) / wall if wall else math.nan,
        "loadavg_start_end": [load_start, os.getloadavg()[0]],
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    return doc


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", default=",".join(ENTRIES), help=f"comma-separated: {ENTRIES}")
    p.add_argument("--concurrency", default="1,32", help="comma-separated (default 1,32)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per concurrency")
    p.add_argument("--requests", type=int, default=200, help="calls per entry per round")
    p.add_argument(
        "--litellm-requests", type=int, default=100, help="calls per round for LiteLLM (slow)"
    )
    p.add_argument(
        "--run-seconds", type=float, default=10.0, help="time cap of one timed run (one entry)"
    )
    p.add_argument(
        "--max-total-seconds",
        type=float,
        default=300.0,
        help="cap on the measuring (warm-up and rounds; installs and starts not counted)",
    )
    p.add_argument("--per-session", type=int, default=100, help="calls per capture session")
    p.add_argument("--reply-tokens", type=int, default=256)
    p.add_argument("--no-pin", action="store_true", help="do not pin processes with taskset")
    p.add_argument("--litellm-version", default=LITELLM_VERSION)
    p.add_argument(
        "--litellm-env", help="LiteLLM's virtual environment (default: ~/.cache/rollwire-bench/)"
    )
    p.add_argument("--litellm-install-timeout", type=float, default=600.0)
    p.add_argument("--litellm-start-timeout", type=float, default=180.0)
    p.add_argument("--keep-logs", action="store_true", help="keep the services' logs")
    p.add_argument("--json", default=str(RESULTS_DIR / "proxy_peers.json"))
    # Internal: a pass-through subprocess.
    p.add_argument("--serve", choices=sorted(PASS_THROUGHS), help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--upstream", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.entries = [e.strip() for e in args.entries.split(",") if e.strip()]
    if not args.entries or len(set(args.entries)) != len(args.entries):
        p.error("--entries: distinct names")
    if unknown := set(args.entries) - set(ENTRIES):
        p.error(f"--entries: unknown {sorted(unknown)}; choose among {ENTRIES}")
    args.entries.sort(key=ENTRIES.index)
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if not args.concurrency or min(args.concurrency) < 1:
        p.error("--concurrency: positive integers")
    if min(args.rounds, args.requests, args.litellm_requests, args.per_session) < 1:
        p.error("--rounds, --requests, --litellm-requests and --per-session must be positive")
    return args


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM: the same clean-up as Ctrl-C


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        with contextlib.suppress(KeyboardInterrupt):
            PASS_THROUGHS[args.serve](args.port, args.upstream)
        return 0
    # Ctrl-C and SIGTERM stop every process started here, even when this runs as a background
    # job (which starts with SIGINT ignored; the services would inherit that).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        doc = asyncio.run(main_async(args))
    except KeyboardInterrupt:
        print("interrupted: every process this benchmark started is stopped", file=sys.stderr)
        return 130
    finally:
        for s in ALL_SERVICES:  # whatever main_async did not get to
            s.stop()
    table = markdown(doc)
    doc["markdown"] = table
    print()
    print(table)
    out = write_json(doc, args.json)
    print(f"\nwrote {out} ({doc['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
