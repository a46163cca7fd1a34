"""Soak: the capture proxy under a steady mixed load for a long time (issue 34).

``rollwire proxy`` runs as its own process in front of the fake vLLM (another process), and
trainer workers drive it as a trainer does, for ``--minutes`` (default 30): open a session on the
control plane, run a multi-turn episode in one of the four wire dialects (chat, Responses,
Anthropic, Google; the last call streamed, the others whole), read the rollout, close the
session. Upstream faults come at a small rate: every ``--fault-every-s`` seconds the engine
answers its next chat request with a 500, a 502 or a 429 in turn.

Each ``--window-s`` window records the proxy's RSS and open file descriptors (``/proc``), the
calls made, and the latency the proxy adds: a probe makes one call straight to the engine and
the same call through the proxy, alternately, once a second; added = through - direct, per pair.
The result: RSS slope (least squares after the warm-up window, MiB per hour), fds at start and
end, p50/p99 added latency in the first and last windows, and the errors: every non-2xx answer
must be an injected fault, answered in the dialect's shape (the count equals the engine's
``injected_failures``); anything else, or a traceback in the proxy's log, is rollwire's.

    UV_PYTHON_DOWNLOADS=never uv run --group dev python bench/proxy_soak.py            # 30 min
    UV_PYTHON_DOWNLOADS=never uv run --group dev python bench/proxy_soak.py --minutes 3
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx

from measure import free_port, git_state, machine, percentile, start_fake, write_json

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.fakes lives in the repository, not in the package
from tests.fakes.dialect_calls import DIALECTS, extend, headers, request, user  # noqa: E402
from tests.fakes.spawn import proxy_process  # noqa: E402

ADMIN_KEY = "soak-admin-key"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
TURNS = 6
FAULTS = (500, 502, 429)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class Window:
    t_s: float
    rss_mib: float
    fds: int
    calls: int
    added_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        added = sorted(self.added_ms)
        return {
            "t_s": round(self.t_s, 1),
            "rss_mib": round(self.rss_mib, 2),
            "fds": self.fds,
            "calls": self.calls,
            "probes": len(added),
            "added_p50_ms": round(percentile(added, 50), 3) if added else None,
            "added_p99_ms": round(percentile(added, 99), 3) if added else None,
        }


@dataclass
class Tally:
    calls: int = 0
    episodes: int = 0
    fault_answers: int = 0  # non-2xx answers naming an upstream status (injected faults)
    direct_faults: int = 0  # injected faults the probe met calling the engine directly
    rollwire_errors: list[str] = field(default_factory=list)


class Pacer:
    """Spaces calls ``1 / rate`` seconds apart over all workers: a steady load, below what the
    proxy can take, so the probe measures the proxy's added latency and not a queue."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self.next = time.monotonic()

    async def wait(self) -> None:
        now = time.monotonic()
        at = max(self.next, now)
        self.next = at + self.interval
        await anyio.sleep(at - now)


async def episode(
    client: httpx.AsyncClient, dialect: str, n: int, tally: Tally, pacer: Pacer
) -> None:
    sid = (await client.post("/sessions", headers=ADMIN)).json()["session_id"]
    history = [user(dialect, f"episode {n} in {dialect}: tell me a story")]
    try:
        for turn in range(TURNS):
            stream = turn == TURNS - 1
            path, body = request(dialect, history, stream)
            await pacer.wait()
            resp = await client.post(path, json=body, headers=headers(dialect, sid))
            tally.calls += 1
            if resp.status_code != 200:
                text = resp.text
                if any(f"upstream answered {s}" in text for s in FAULTS):
                    tally.fault_answers += 1  # the injected fault, in the dialect's shape
                    return
                tally.rollwire_errors.append(f"{dialect} {resp.status_code}: {text[:300]}")
                return
            if not stream:
                extend(dialect, history, resp.json(), turn)
        rollout = await client.get(f"/sessions/{sid}/rollout", headers=ADMIN)
        if rollout.status_code != 200:
            tally.rollwire_errors.append(f"rollout {rollout.status_code}: {rollout.text[:300]}")
    finally:
        closed = await client.delete(f"/sessions/{sid}", headers=ADMIN)
        if closed.status_code != 200:
            tally.rollwire_errors.append(f"close {closed.status_code}: {closed.text[:300]}")
        tally.episodes += 1


async def soak(args: argparse.Namespace, proxy: str, engine: str, pid: int) -> dict[str, Any]:
    tally = Tally()
    pacer = Pacer(args.rate)
    windows: list[Window] = []
    current = Window(0.0, rss_mib(pid), open_fds(pid), 0)
    start = time.monotonic()
    end = start + args.minutes * 60
    limits = httpx.Limits(max_connections=args.workers + 2)
    async with (
        httpx.AsyncClient(base_url=proxy, timeout=60.0, limits=limits) as client,
        httpx.AsyncClient(timeout=60.0) as probe_client,
        anyio.create_task_group() as tg,
    ):

        async def worker(w: int) -> None:
            i = w
            while time.monotonic() < end:
                try:
                    await episode(client, DIALECTS[i % len(DIALECTS)], i, tally, pacer)
                except httpx.HTTPError as exc:  # the proxy did not answer: rollwire's
                    tally.rollwire_errors.append(f"transport: {type(exc).__name__}: {exc}")
                i += args.workers

        async def faults() -> None:
            k = 0
            while time.monotonic() < end:
                await anyio.sleep(args.fault_every_s)
                status = FAULTS[k % len(FAULTS)]
                k += 1
                await probe_client.post(
                    f"{engine}/_fake/behavior", json={"fail_status": status, "fail_count": 1}
                )

        async def probe() -> None:
            # A session of its own per probe (opened and closed untimed), as a trainer's
            # episode has: one session kept for the whole run would grow by a turn a second.
            body = {"model": "smol", "messages": [user("chat", "probe")], "max_tokens": 8}
            while time.monotonic() < end:
                sid = (await client.post("/sessions", headers=ADMIN)).json()["session_id"]
                try:
                    t0 = time.perf_counter()
                    d = await probe_client.post(f"{engine}/v1/chat/completions", json=body)
                    t1 = time.perf_counter()
                    p = await client.post(
                        "/v1/chat/completions", json=body, headers=headers("chat", sid)
                    )
                    t2 = time.perf_counter()
                finally:
                    await client.delete(f"/sessions/{sid}", headers=ADMIN)
                if d.status_code != 200:
                    tally.direct_faults += 1  # an injected fault, served to the probe directly
                elif p.status_code != 200:
                    if any(f"upstream answered {s}" in p.text for s in FAULTS):
                        tally.fault_answers += 1
                    else:
                        tally.rollwire_errors.append(f"probe {p.status_code}: {p.text[:300]}")
                else:
                    current.added_ms.append(((t2 - t1) - (t1 - t0)) * 1000)
                await anyio.sleep(1.0)

        for w in range(args.workers):
            tg.start_soon(worker, w)
        tg.start_soon(faults)
        tg.start_soon(probe)
        while time.monotonic() < end:
            await anyio.sleep(min(args.window_s, max(0.0, end - time.monotonic())))
            windows.append(current)
            current.t_s = time.monotonic() - start
            current.rss_mib = rss_mib(pid)
            current.fds = open_fds(pid)
            current.calls = tally.calls
            current = Window(0.0, 0.0, 0, 0)
            w = windows[-1]
            print(
                f"  {w.t_s:7.0f} s  RSS {w.rss_mib:6.1f} MiB  fds {w.fds:4d}  calls {w.calls:7d}  "
                f"added p99 {w.summary()['added_p99_ms']} ms  faults answered "
                f"{tally.fault_answers}  rollwire errors {len(tally.rollwire_errors)}",
                flush=True,
            )
    async with httpx.AsyncClient(timeout=10.0) as c:  # every call has ended
        injected = (await c.get(f"{engine}/_fake/stats")).json()["injected_failures"]
    return {"tally": tally, "windows": windows, "injected": injected}


def slope_mib_per_hour(windows: list[Window]) -> float:
    xs = [w.t_s / 3600 for w in windows]
    ys = [w.rss_mib for w in windows]
    if len(xs) < 2:
        return 0.0
    return statistics.linear_regression(xs, ys).slope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument(
        "--rate", type=float, default=60.0, help="model calls per second, all workers"
    )
    parser.add_argument("--fault-every-s", type=float, default=2.0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "proxy_soak.json"))
    args = parser.parse_args()

    engine_port = free_port()
    engine = f"http://127.0.0.1:{engine_port}"
    fake = start_fake(engine_port, {}, reply_tokens=6)
    log_path = Path(tempfile.mkdtemp(prefix="rollwire-soak-")) / "proxy.log"
    try:
        with proxy_process(engine + "/v1", ADMIN_KEY, log_path) as (proc, proxy):
            print(f"soak: {args.minutes:g} min, {args.workers} workers, proxy pid {proc.pid}")
            out = anyio.run(soak, args, proxy, engine, proc.pid)
            sessions_left = httpx.get(f"{proxy}/health").json()["sessions"]
    finally:
        fake.terminate()
        fake.wait(15)
    tally: Tally = out["tally"]
    windows: list[Window] = out["windows"]
    proxy_log = log_path.read_text(errors="replace")
    tracebacks = proxy_log.count("Traceback")
    measured = windows[1:] if len(windows) > 2 else windows  # the first is the warm-up
    first, last = measured[0], measured[-1]
    result = {
        "bench": "proxy_soak",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "git": git_state(),
        "args": vars(args),
        "calls": tally.calls,
        "episodes": tally.episodes,
        "calls_per_s": round(tally.calls / (args.minutes * 60), 1),
        "injected_faults": out["injected"],
        "fault_answers": tally.fault_answers,
        "direct_faults": tally.direct_faults,
        "faults_accounted": tally.fault_answers + tally.direct_faults == out["injected"],
        "rollwire_errors": len(tally.rollwire_errors),
        "rollwire_error_samples": tally.rollwire_errors[:10],
        "proxy_log_tracebacks": tracebacks,
        "sessions_left": sessions_left,
        "rss_start_mib": round(windows[0].rss_mib, 2),
        "rss_end_mib": round(windows[-1].rss_mib, 2),
        "rss_slope_mib_per_hour": round(slope_mib_per_hour(measured), 2),
        "fds_start": first.fds,
        "fds_end": last.fds,
        "fds_max": max(w.fds for w in windows),
        "added_first": first.summary(),
        "added_last": last.summary(),
        "windows": [w.summary() for w in windows],
    }
    path = write_json(result, args.out)
    print(
        f"\n{tally.calls} calls ({result['calls_per_s']}/s), {tally.episodes} episodes; injected "
        f"faults {out['injected']}, answered as faults {tally.fault_answers} (+ "
        f"{tally.direct_faults} met by the direct probe); rollwire errors "
        f"{len(tally.rollwire_errors)}, tracebacks in the proxy log {tracebacks}, sessions left "
        f"{sessions_left}\nRSS {result['rss_start_mib']} -> {result['rss_end_mib']} MiB, slope "
        f"{result['rss_slope_mib_per_hour']} MiB/h after the warm-up window; fds "
        f"{first.fds} -> {last.fds} (max {result['fds_max']}); added latency p50/p99 first "
        f"window {first.summary()['added_p50_ms']}/{first.summary()['added_p99_ms']} ms, last "
        f"{last.summary()['added_p50_ms']}/{last.summary()['added_p99_ms']} ms\n-> {path}"
    )
    for sample in tally.rollwire_errors[:5]:
        print("  rollwire error:", sample)


if __name__ == "__main__":
    main()
