"""MCP overhead of run_rollout: the same rollout in-process, through MCP in memory and over HTTP.

Every call runs one whole rollout of ``reasoning_gym:chain_sum`` (seed 1, ``max_turns`` 2)
against the fake vLLM (``python -m tests.fakes.vllm --reply-tokens 24``, in its own process, set
to call the first tool on every user turn): certification is cached after the warm-up, so a
rollout is the env session, the tool loop, the in-process capture proxy, one model call, the
verifier, the rollout document and the summary (~3 ms). The model is nearly free, so what the
MCP layer adds is a large share of the total. Paths, all in this one process and event loop,
sharing one :class:`ServerState` (its pool, certification, proxy and store):

* ``in-process`` (the baseline): ``rollwire.tools.rollouts.run_rollout(req, pool=state.pool,
  store=state.store)``, the function the MCP tool calls (``plan`` in a worker thread included).
* ``mcp-memory``: ``Client(build_server(state)).call_tool("run_rollout", ...)``: argument
  validation, the tool wrapper (job registry, progress hook), result serialisation and the
  client's result validation, with the SDK's in-process dispatch (no JSON-RPC framing).
* ``mcp-http``: ``Client(url + "/mcp")`` against ``http_app(build_server(state))`` served by
  uvicorn on 127.0.0.1 (``rollwire.serving``): streamable HTTP (httpx2 client; a JSON
  response), one client session held open. Client and server share this process's core, so
  the number includes both sides' CPU.
* ``mcp-http+progress``: the same with a ``progress_callback``: the response becomes an SSE
  stream carrying the five progress notifications (one per phase) before the result.
* ``mcp-http, new session per call``: ``async with Client(url)`` around each call, as a one-shot
  client does: a new httpx2 client (and SSL context), the discover request, and the session's
  first call, which also fetches tools/list to validate the result against the output schema.
  ``..., shared httpx2 client``: the same on one reused httpx2 client (no new SSL context).
* controls: ``get_rollout`` of the last rollout over each transport: a tool that is a dict
  lookup and returns the same summary (inside a status), i.e. the MCP floor per call without a
  rollout. (``ping`` is gone from protocol 2026-07-28, which this client negotiates.)

Sequential paths are interleaved in rounds (the order rotates each round: ABC, BCA, CAB, ...)
so drift hits every path alike; each reports median and p95 per call, CPU ms per call (this
process, all threads; the median over rounds) and *added* = median(path) - median(in-process), judged against the
target of <= 10 ms per call. Then 32 concurrent rollouts, again interleaved per round:
in-process (32 tasks) against HTTP with one shared client session (32 concurrent
``call_tool`` on it) and with 32 client sessions (one each; opened, and their first call
made, outside the timing):
rollouts/s, p50/p95 latency, and the added machine time per rollout,
1000 / rate(path) - 1000 / rate(in-process). At concurrency 32 latency is queueing
(about 32 / rate), so the target is judged on that added time per rollout.

Placement: the fake on CPU 0 and this process on CPU 1 (``taskset``/``sched_setaffinity``;
``--no-pin`` turns it off). Every server binds to 127.0.0.1 only.

Run from the repository root::

    UV_PYTHON_DOWNLOADS=never uv run python bench/mcp_overhead.py --quick   # ~15 s
    UV_PYTHON_DOWNLOADS=never uv run python bench/mcp_overhead.py           # ~130 s
    UV_PYTHON_DOWNLOADS=never uv run python bench/mcp_overhead.py --profile 200  # + cProfile

Results: markdown tables on stdout and ``bench/results/mcp_overhead.json`` (``--quick``:
``mcp_overhead_quick.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime as dt
import io
import math
import os
import platform
import pstats
import shutil
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp
import orjson
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from measure import (
    cpu_seconds,
    free_port,
    git_state,
    machine_busy_seconds,
    percentile,
    start_fake,
)
from rollwire.server.mcp_app import ServerState, build_server, http_app
from rollwire.serving import bind, serving, url_of
from rollwire.tools.rollouts import (
    Limits,
    LLMSpec,
    RolloutRequest,
    run_rollout,
)

THIS_FILE = Path(__file__).resolve()
ROOT = THIS_FILE.parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
HOST = "127.0.0.1"
FAKE_CPU = 0
BENCH_CPU = 1

TASK = "reasoning_gym:chain_sum"
SEED = 1
MAX_TURNS = 2
REPLY_TOKENS = 24
CONCURRENCY = 32
TARGET_ADDED_MS = 10.0
CALL_TIMEOUT_S = 60.0

IN_PROCESS = "in-process"
MEMORY = "mcp-memory"
HTTP = "mcp-http"
HTTP_PROGRESS = "mcp-http+progress"
HTTP_FRESH = "mcp-http, new session per call"
HTTP_FRESH_SHARED = "mcp-http, new session per call, shared httpx2 client"
CTRL_MEMORY = "get_rollout (memory)"
CTRL_HTTP = "get_rollout (http)"
SEQ_PATHS = (
    IN_PROCESS,
    MEMORY,
    HTTP,
    HTTP_PROGRESS,
    HTTP_FRESH,
    HTTP_FRESH_SHARED,
    CTRL_MEMORY,
    CTRL_HTTP,
)
CONC_IN_PROCESS = "in-process x32"
CONC_HTTP_SHARED = "mcp-http x32, 1 session"
CONC_HTTP_SESSIONS = "mcp-http x32, 32 sessions"
CONC_PATHS = (CONC_IN_PROCESS, CONC_HTTP_SHARED, CONC_HTTP_SESSIONS)


# --------------------------------------------------------------------------- processes


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# --------------------------------------------------------------------------- wire accounting


class _CountingStream(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, on_bytes: Callable[[int], None]) -> None:
        self.inner = inner
        self.on_bytes = on_bytes

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.on_bytes(len(chunk))
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class CountingTransport(httpx2.AsyncBaseTransport):
    """An httpx2 transport that records each exchange: method, content type, bytes each way."""

    def __init__(self) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.exchanges: list[dict[str, Any]] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        sent = len(await request.aread())
        response = await self.inner.handle_async_request(request)
        row = {
            "method": request.method,
            "status": response.status_code,
            "content_type": response.headers.get("content-type", ""),
            "request_body_bytes": sent,
            "response_body_bytes": 0,
        }
        self.exchanges.append(row)

        def add(n: int) -> None:
            row["response_body_bytes"] += n

        return httpx2.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_CountingStream(response.stream, add),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


# --------------------------------------------------------------------------- statistics


@dataclass
class Run:
    latencies_ms: list[float]
    wall_s: float
    cpu_s: float  # this process, all threads
    fake_cpu_s: float
    foreign_cpu_s: float  # CPU that processes other than this one and the fake used


@dataclass
class Side:
    runs: list[Run] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        lat = sorted(x for r in self.runs for x in r.latencies_ms)
        calls = len(lat)
        wall = sum(r.wall_s for r in self.runs)
        return {
            "calls": calls,
            "median_ms": percentile(lat, 50),
            "p95_ms": percentile(lat, 95),
            "p99_ms": percentile(lat, 99),
            "mean_ms": statistics.fmean(lat) if lat else math.nan,
            "per_s": calls / wall if wall else math.nan,
            "per_s_rounds": [round(len(r.latencies_ms) / r.wall_s, 1) for r in self.runs],
            "median_ms_rounds": [round(statistics.median(r.latencies_ms), 3) for r in self.runs],
            # The median over rounds: a GC pause lands in whichever path runs, and it can
            # double one round's CPU per call.
            "cpu_ms_per_call": statistics.median(
                1e3 * r.cpu_s / len(r.latencies_ms) for r in self.runs
            ),
            "cpu_ms_per_call_all_rounds": 1e3 * sum(r.cpu_s for r in self.runs) / calls,
            "fake_cpu_ms_per_call": 1e3 * sum(r.fake_cpu_s for r in self.runs) / calls,
            "foreign_load_cores": sum(r.foreign_cpu_s for r in self.runs) / wall if wall else 0,
        }


class Meter:
    """CPU and wall time around one timed run."""

    def __init__(self, fake_pid: int) -> None:
        self.fake_pid = fake_pid

    async def run(self, body: Callable[[], Awaitable[list[float]]]) -> Run:
        fake0, busy0, cpu0 = cpu_seconds(self.fake_pid), machine_busy_seconds(), time.process_time()
        t0 = time.perf_counter()
        latencies = await body()
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        fake = cpu_seconds(self.fake_pid) - fake0
        foreign = max(0.0, machine_busy_seconds() - busy0 - cpu - fake)
        return Run(latencies, wall, cpu, fake, foreign)


# --------------------------------------------------------------------------- the benchmark


def comparable(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary without what differs between two runs of the same rollout."""
    return {k: v for k, v in summary.items() if k not in ("rollout_id", "timings")}


class Bench:
    def __init__(
        self,
        state: ServerState,
        llm_url: str,
        url: str,
        memory: Client,
        http: Client,
        fake_pid: int,
    ) -> None:
        self.state = state
        self.url = url
        self.httpx2_client = httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=300))
        self.llm_url = llm_url
        self.memory = memory
        self.http = http
        self.meter = Meter(fake_pid)
        self.arguments = {
            "task": TASK,
            "llm_url": llm_url,
            "seed": SEED,
            "limits": {"max_turns": MAX_TURNS},
        }
        self.reference: dict[str, Any] | None = None
        self.last_id = ""
        self.bad = 0

    def check(self, label: str, summary: dict[str, Any]) -> None:
        """Every path must return the very same rollout (bar its id and timings)."""
        got = comparable(summary)
        if self.reference is None:
            self.reference = got
        if got != self.reference or not got.get("ok"):
            self.bad += 1
            if self.bad <= 3:
                print(f"  {label}: unexpected result {got}", file=sys.stderr)

    async def in_process(self) -> None:
        req = RolloutRequest(
            task=TASK, llm=LLMSpec(url=self.llm_url), seed=SEED, limits=Limits(max_turns=MAX_TURNS)
        )
        out = await run_rollout(req, pool=self.state.pool, store=self.state.store)
        self.check(IN_PROCESS, out.model_dump(mode="json"))

    async def via(self, label: str, client: Client, progress: bool = False) -> None:
        progressed: list[float] = []

        async def on_progress(done: float, total: float | None, message: str | None) -> None:
            progressed.append(done)

        result = await client.call_tool(
            "run_rollout", self.arguments, progress_callback=on_progress if progress else None
        )
        if result.is_error or result.structured_content is None:
            self.bad += 1
            print(f"  {label}: tool error {result.content}", file=sys.stderr)
            return
        if progress and progressed[-1:] != [4]:
            self.bad += 1
            print(f"  {label}: progress {progressed}", file=sys.stderr)
        self.last_id = result.structured_content["rollout_id"]
        self.check(label, result.structured_content)

    async def fresh_session(self, shared: bool = False) -> None:
        """Open a session, run one rollout (the session's first call also lists the tools, for
        the output schema), close the session. ``shared``: on this bench's one httpx2 client
        (``Client(url)`` makes a new one per session, and with it a new SSL context)."""
        if shared:
            transport = streamable_http_client(self.url, http_client=self.httpx2_client)
            async with Client(transport) as client:
                await self.via(HTTP_FRESH_SHARED, client)
        else:
            async with Client(self.url) as client:
                await self.via(HTTP_FRESH, client)

    async def lookup(self, client: Client) -> None:
        """The control: a trivial tool (a dict lookup) whose result embeds the same summary."""
        result = await client.call_tool("get_rollout", {"rollout_id": self.last_id})
        if result.is_error or (result.structured_content or {}).get("status") != "done":
            self.bad += 1
            print(f"  get_rollout: {result.content}", file=sys.stderr)

    def call(self, path: str) -> Callable[[], Awaitable[Any]]:
        return {
            IN_PROCESS: self.in_process,
            MEMORY: lambda: self.via(MEMORY, self.memory),
            HTTP: lambda: self.via(HTTP, self.http),
            HTTP_PROGRESS: lambda: self.via(HTTP_PROGRESS, self.http, progress=True),
            HTTP_FRESH: self.fresh_session,
            HTTP_FRESH_SHARED: lambda: self.fresh_session(shared=True),
            CTRL_MEMORY: lambda: self.lookup(self.memory),
            CTRL_HTTP: lambda: self.lookup(self.http),
        }[path]

    async def sequential(self, path: str, n: int) -> Run:
        call = self.call(path)

        async def body() -> list[float]:
            out = []
            perf = time.perf_counter
            for _ in range(n):
                t0 = perf()
                with anyio.fail_after(CALL_TIMEOUT_S):
                    await call()
                out.append((perf() - t0) * 1e3)
            return out

        return await self.meter.run(body)

    async def concurrent(self, path: str, n: int, sessions: list[Client]) -> Run:
        """``n`` rollouts by ``CONCURRENCY`` workers, each calling back to back."""
        if path == CONC_IN_PROCESS:
            calls = [self.in_process] * CONCURRENCY
        elif path == CONC_HTTP_SHARED:
            calls = [lambda: self.via(path, self.http)] * CONCURRENCY
        else:
            calls = [lambda c=c: self.via(path, c) for c in sessions]
        tickets = n

        async def body() -> list[float]:
            out: list[float] = []
            perf = time.perf_counter

            async def worker(call: Callable[[], Awaitable[Any]]) -> None:
                nonlocal tickets
                while tickets > 0:
                    tickets -= 1
                    t0 = perf()
                    with anyio.fail_after(CALL_TIMEOUT_S):
                        await call()
                    out.append((perf() - t0) * 1e3)

            async with anyio.create_task_group() as tg:
                for call in calls:
                    tg.start_soon(worker, call)
            return out

        return await self.meter.run(body)


async def wire_sizes(url: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One run_rollout over HTTP on a fresh session, with every HTTP exchange recorded."""
    transport = CountingTransport()
    http = httpx2.AsyncClient(transport=transport, timeout=httpx2.Timeout(30, read=300))
    async with http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            setup = len(transport.exchanges)
            result = await client.call_tool("run_rollout", arguments)
            call = transport.exchanges[setup:]
            progress_mark = len(transport.exchanges)
            await client.call_tool("run_rollout", arguments, progress_callback=_ignore_progress)
            with_progress = transport.exchanges[progress_mark:]
            lookup_mark = len(transport.exchanges)
            rollout_id = (result.structured_content or {}).get("rollout_id", "")
            await client.call_tool("get_rollout", {"rollout_id": rollout_id})
            lookup = transport.exchanges[lookup_mark:]
            tokens_mark = len(transport.exchanges)
            with_tokens = await client.call_tool(
                "run_rollout", {**arguments, "include_tokens": True}
            )
            tokens = transport.exchanges[tokens_mark:]
            setup_rows = transport.exchanges[:setup]
            protocol = client.protocol_version
        closing = transport.exchanges[tokens_mark + len(tokens) :]
    structured = orjson.dumps(result.structured_content)
    text = "".join(getattr(c, "text", "") for c in result.content)
    tokens_text = "".join(getattr(c, "text", "") for c in with_tokens.content)
    return {
        "protocol_version": protocol,
        "session_setup_exchanges": setup_rows,
        "run_rollout_exchanges": call,
        "run_rollout_with_progress_exchanges": with_progress,
        "get_rollout_exchanges": lookup,
        "session_close_exchanges": closing,
        "include_tokens_exchanges": tokens,
        "include_tokens_structured_content_bytes": len(
            orjson.dumps(with_tokens.structured_content)
        ),
        "include_tokens_text_content_bytes": len(tokens_text.encode()),
        "structured_content_bytes": len(structured),
        "text_content_bytes": len(text.encode()),
        "call_tool_result_json_bytes": len(
            result.model_dump_json(by_alias=True, exclude_none=True).encode()
        ),
    }


async def _ignore_progress(done: float, total: float | None, message: str | None) -> None:
    return None


def rotate(items: tuple[str, ...], k: int) -> list[str]:
    k %= len(items)
    return [*items[k:], *items[:k]]


async def measure(args: argparse.Namespace, pin: bool) -> dict[str, Any]:
    port = free_port()
    fake = start_fake(
        port,
        {"tool_call_every_turn": True},
        reply_tokens=REPLY_TOKENS,
        cpu=FAKE_CPU if pin else None,
    )
    llm_url = f"http://{HOST}:{port}/v1"
    state = ServerState()
    sock = bind(HOST, 0)
    seq = {p: Side() for p in SEQ_PATHS}
    conc = {p: Side() for p in CONC_PATHS}
    out: dict[str, Any] = {}
    started = time.monotonic()
    try:
        # The app's lifespan enters ``state`` (pool, job registry); every path shares it.
        async with serving(http_app(build_server(state)), sock, stop_on_exit=True):
            url = url_of(sock) + "/mcp"
            async with Client(build_server(state)) as memory, Client(url) as http:
                bench = Bench(state, llm_url, url, memory, http, fake.pid)
                async with contextlib.AsyncExitStack() as stack:
                    stack.push_async_callback(bench.httpx2_client.aclose)
                    t0 = time.perf_counter()
                    await bench.in_process()  # certifies the endpoint, imports reasoning_gym
                    out["first_call_s"] = round(time.perf_counter() - t0, 3)
                    for path in SEQ_PATHS:  # rollouts first: the controls look up the last one
                        for _ in range(args.warmup):
                            await bench.call(path)()
                    out["wire"] = await wire_sizes(url, bench.arguments)
                    summary = await run_rollout(
                        RolloutRequest(
                            task=TASK,
                            llm=LLMSpec(url=llm_url),
                            seed=SEED,
                            limits=Limits(max_turns=MAX_TURNS),
                        ),
                        pool=state.pool,
                        store=state.store,
                    )
                    out["summary_json_bytes"] = len(summary.model_dump_json().encode())
                    out["summary_example"] = comparable(summary.model_dump(mode="json"))
                    sessions: list[Client] = []
                    if args.conc_calls:
                        for _ in range(CONCURRENCY):
                            sessions.append(await stack.enter_async_context(Client(url)))
                        with anyio.fail_after(CALL_TIMEOUT_S):  # each session's first call
                            async with anyio.create_task_group() as tg:  # lists the tools:
                                for c in sessions:  # not timed
                                    tg.start_soon(bench.via, CONC_HTTP_SESSIONS, c)
                    last_round_s = 0.0
                    for r in range(args.rounds):
                        if time.monotonic() - started + last_round_s > args.max_seconds:
                            print(f"time cap: stopped after {r} rounds", file=sys.stderr)
                            break
                        round_started = time.monotonic()
                        for path in rotate(SEQ_PATHS, r):
                            seq[path].runs.append(await bench.sequential(path, args.calls))
                        if args.conc_calls:
                            for path in rotate(CONC_PATHS, r):
                                conc[path].runs.append(
                                    await bench.concurrent(path, args.conc_calls, sessions)
                                )
                        last_round_s = time.monotonic() - round_started
                        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
                    if args.profile:
                        out["profile"] = await profile(bench, args.profile)
                out["rounds_done"] = len(seq[IN_PROCESS].runs)
                out["bad_results"] = bench.bad
                out["rollouts_stored"] = len(state.store)
                out["certify_calls"] = state.pool.certify_calls
    finally:
        stop(fake)
    out["seq"] = {p: s.summary() for p, s in seq.items() if s.runs}
    out["conc"] = {p: s.summary() for p, s in conc.items() if s.runs}
    return out


async def profile(bench: Bench, n: int) -> dict[str, str]:
    """cProfile ``n`` sequential calls of the in-process and the HTTP path, and ``n // 5`` of a
    new session per call (after the rounds)."""
    texts: dict[str, str] = {}
    for path, calls in ((IN_PROCESS, n), (HTTP, n), (HTTP_FRESH, max(1, n // 5))):
        call = bench.call(path)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            await call()
        prof.disable()
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(40)
        texts[f"{path} ({calls} calls)"] = buf.getvalue()
    return texts


def verdicts(res: dict[str, Any]) -> dict[str, Any]:
    seq, conc = res["seq"], res["conc"]
    base = seq[IN_PROCESS]
    out: dict[str, Any] = {}
    for path in (MEMORY, HTTP, HTTP_PROGRESS, HTTP_FRESH, HTTP_FRESH_SHARED):
        if path in seq:
            added = seq[path]["median_ms"] - base["median_ms"]
            out[path] = {
                "added_median_ms": added,
                "added_p95_ms": seq[path]["p95_ms"] - base["p95_ms"],
                "added_cpu_ms_per_call": seq[path]["cpu_ms_per_call"] - base["cpu_ms_per_call"],
                "added_median_ms_rounds": [
                    round(a - b, 3)
                    for a, b in zip(
                        seq[path]["median_ms_rounds"], base["median_ms_rounds"], strict=True
                    )
                ],
                "met": added <= TARGET_ADDED_MS,
            }
    if CONC_IN_PROCESS in conc:
        base_rate = conc[CONC_IN_PROCESS]["per_s"]
        for path in (CONC_HTTP_SHARED, CONC_HTTP_SESSIONS):
            if path in conc:
                added = 1e3 / conc[path]["per_s"] - 1e3 / base_rate
                out[path] = {
                    "added_ms_per_rollout": added,
                    "added_median_latency_ms": conc[path]["median_ms"]
                    - conc[CONC_IN_PROCESS]["median_ms"],
                    "throughput_ratio": conc[path]["per_s"] / base_rate,
                    "met": added <= TARGET_ADDED_MS,
                }
    return out


def _f(x: float | None, nd: int = 2) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def markdown(doc: dict[str, Any]) -> str:
    res, v = doc["results"], doc["verdicts"]
    seq, conc = res["seq"], res["conc"]
    lines = [
        "| path | calls | median ms | p95 ms | CPU ms/call | added median ms | added CPU ms/call "
        "| other processes (cores) | target (<= 10 ms added) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for path, s in seq.items():
        added = added_cpu = verdict = "-"
        if path in v:
            added = _f(v[path]["added_median_ms"])
            added_cpu = _f(v[path]["added_cpu_ms_per_call"])
            verdict = "**met**" if v[path]["met"] else "**MISSED**"
        elif path == IN_PROCESS:
            verdict = "(baseline)"
        elif path in (CTRL_MEMORY, CTRL_HTTP):
            verdict = "(control: no rollout)"
        lines.append(
            f"| {path} | {s['calls']} | {_f(s['median_ms'])} | {_f(s['p95_ms'])} "
            f"| {_f(s['cpu_ms_per_call'])} | {added} | {added_cpu} "
            f"| {_f(s['foreign_load_cores'])} | {verdict} |"
        )
    if conc:
        lines += [
            "",
            f"| concurrency {CONCURRENCY} | rollouts | rollouts/s | p50 ms | p95 ms "
            "| CPU ms/rollout | added ms/rollout (1000/rate) | added p50 ms "
            "| other processes (cores) | target (<= 10 ms added) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for path, s in conc.items():
            added = added_p50 = "-"
            verdict = "(baseline)"
            if path in v:
                added = _f(v[path]["added_ms_per_rollout"])
                added_p50 = _f(v[path]["added_median_latency_ms"])
                verdict = "**met**" if v[path]["met"] else "**MISSED**"
            lines.append(
                f"| {path} | {s['calls']} | {_f(s['per_s'], 0)} | {_f(s['median_ms'])} "
                f"| {_f(s['p95_ms'])} | {_f(s['cpu_ms_per_call'])} | {added} | {added_p50} "
                f"| {_f(s['foreign_load_cores'])} | {verdict} |"
            )
    wire = res["wire"]

    def exchanges(rows: list[dict[str, Any]]) -> str:
        return ", ".join(
            f"{e['method']} {e['request_body_bytes']} B -> {e['status']} "
            f"{e['content_type'].split(';')[0] or '-'} {e['response_body_bytes']} B"
            for e in rows
        )

    lines += [
        "",
        f"Response size: the in-process summary is {res['summary_json_bytes']} B of JSON; the "
        f"MCP result carries it twice (structuredContent {wire['structured_content_bytes']} B "
        f"+ an indented text copy {wire['text_content_bytes']} B; CallToolResult "
        f"{wire['call_tool_result_json_bytes']} B). With include_tokens=true: structuredContent "
        f"{wire['include_tokens_structured_content_bytes']} B + text "
        f"{wire['include_tokens_text_content_bytes']} B; "
        f"{exchanges(wire['include_tokens_exchanges'])}.",
        f"On the wire (protocol {wire['protocol_version']}), HTTP exchanges: session open: "
        f"{exchanges(wire['session_setup_exchanges'])}; the session's first run_rollout: "
        f"{exchanges(wire['run_rollout_exchanges'])} (the second is the client's tools/list, "
        f"for the output schema); run_rollout with progress: "
        f"{exchanges(wire['run_rollout_with_progress_exchanges'])}; get_rollout: "
        f"{exchanges(wire['get_rollout_exchanges'])}; session close: "
        f"{exchanges(wire['session_close_exchanges']) or 'none'}.",
        f"Added median per round ({HTTP}): {v.get(HTTP, {}).get('added_median_ms_rounds')}.",
    ]
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    pin = (
        not args.no_pin
        and shutil.which("taskset") is not None
        and {FAKE_CPU, BENCH_CPU} <= os.sched_getaffinity(0)
    )
    if pin:
        os.sched_setaffinity(0, {BENCH_CPU})
    load_start = os.getloadavg()[0]
    started = time.monotonic()
    results = await measure(args, pin)
    if results["bad_results"]:
        raise RuntimeError(f"{results['bad_results']} calls returned an unexpected result")
    doc = {
        "benchmark": "mcp_overhead",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "mcp": getattr(mcp, "__version__", None) or _version("mcp"),
            "uvicorn": _version("uvicorn"),
            "httpx2": _version("httpx2"),
        },
        "git": git_state(),
        "placement": {"fake": FAKE_CPU, "bench": BENCH_CPU} if pin else "unpinned",
        "params": {
            "task": TASK,
            "seed": SEED,
            "max_turns": MAX_TURNS,
            "reply_tokens": REPLY_TOKENS,
            "rounds": args.rounds,
            "calls_per_path_per_round": args.calls,
            "concurrency": CONCURRENCY,
            "concurrent_rollouts_per_path_per_round": args.conc_calls,
            "warmup": args.warmup,
            "quick": args.quick,
        },
        "target_added_ms": TARGET_ADDED_MS,
        "results": results,
        "verdicts": verdicts(results),
        "elapsed_s": round(time.monotonic() - started, 1),
        "loadavg_start_end": [load_start, os.getloadavg()[0]],
    }
    return doc


def _version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="3 rounds, fewer calls (~15 s)")
    p.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    p.add_argument("--calls", type=int, default=60, help="sequential calls per path per round")
    p.add_argument(
        "--conc-calls",
        type=int,
        default=256,
        help=f"rollouts per concurrent path per round at concurrency {CONCURRENCY} (0: skip)",
    )
    p.add_argument("--warmup", type=int, default=10, help="untimed calls per path first")
    p.add_argument(
        "--max-seconds",
        type=float,
        default=240.0,
        help="start no round that would end after this (as long as the last one took)",
    )
    p.add_argument("--profile", type=int, default=0, help="cProfile N calls per path at the end")
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    p.add_argument("--json", default=None, help="output (default bench/results/mcp_overhead.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.calls, args.conc_calls, args.warmup = 3, 20, 64, 3
        args.max_seconds = min(args.max_seconds, 45.0)
    if min(args.rounds, args.calls) < 1 or args.conc_calls < 0 or args.warmup < 0:
        p.error("--rounds and --calls must be positive; --conc-calls and --warmup >= 0")
    if args.json is None:
        name = "mcp_overhead_quick.json" if args.quick else "mcp_overhead.json"
        args.json = str(RESULTS_DIR / name)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # reasoning_gym (imported by the first rollout) pulls in cellpylib, whose source trips
    # SyntaxWarnings when compiled (PYTHONDONTWRITEBYTECODE is set here): noise, not ours.
    warnings.filterwarnings("ignore", category=SyntaxWarning)
    doc = anyio.run(main_async, args)
    table = markdown(doc)
    doc["markdown"] = table
    print()
    print(table)
    for path, text in doc["results"].get("profile", {}).items():
        print(f"\n### cProfile, {path}, sequential\n{text}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    print(f"\nwrote {out} ({doc['elapsed_s']:.0f} s; placement: {doc['placement']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
