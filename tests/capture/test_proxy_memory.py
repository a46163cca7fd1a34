"""The capture proxy's memory stays flat under a trainer's load (issue 17).

``rollwire proxy`` runs as a subprocess in front of the fake vLLM (so the RSS read from
``/proc/<pid>/status`` is the proxy's own), and trainer workers drive it as a trainer does: open a
session on the control plane, run a multi-turn episode in one of the four wire dialects (chat,
Responses, Anthropic, Google; the last call of an episode streamed), read the rollout, and close
the session (which is what lets the proxy forget it). After a warm-up, 10,000 more model calls
must not grow the proxy's RSS by more than 20 MiB. The numbers are printed (``-s``).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.fakes import spawn
from tests.fakes.dialect_calls import DIALECTS, extend, headers, request, user
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM

pytestmark = pytest.mark.slow

ADMIN_KEY = "memory-admin-key"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
WARMUP_CALLS = 1_000
MEASURED_CALLS = int(os.environ.get("ROLLWIRE_MEMORY_CALLS", "10000"))
TURNS = 8  # model calls per episode
WORKERS = 8  # trainer workers running episodes at once
MAX_GROWTH_MIB = 20.0


def rss_mib(pid: int) -> float:
    """The process's resident set size (``VmRSS``), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


@pytest.fixture
def proxy_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``rollwire proxy`` in front of a fake vLLM served in this process."""
    with (
        serve_in_thread(FakeVLLM(default_reply_tokens=6).app) as upstream,
        spawn.proxy_process(upstream, ADMIN_KEY, tmp_path / "proxy.log") as running,
    ):
        yield running


class Load:
    """Trainer workers sharing a budget of model calls."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.calls = 0
        self.episodes = 0

    async def episode(self, dialect: str) -> None:
        sid = (await self.client.post("/sessions", headers=ADMIN)).json()["session_id"]
        history = [user(dialect, f"episode {self.episodes} in {dialect}: tell me a story")]
        for turn in range(TURNS):
            stream = turn == TURNS - 1
            path, body = request(dialect, history, stream)
            resp = await self.client.post(path, json=body, headers=headers(dialect, sid))
            assert resp.status_code == 200, resp.text
            self.calls += 1
            if not stream:
                extend(dialect, history, resp.json(), turn)
        rollout = await self.client.get(f"/sessions/{sid}/rollout", headers=ADMIN)
        assert rollout.status_code == 200 and len(rollout.json()["turns"]) == TURNS
        closed = await self.client.delete(f"/sessions/{sid}", headers=ADMIN)
        assert closed.json()["deleted"] is True
        self.episodes += 1

    async def run(self, calls: int) -> None:
        """Episodes on WORKERS workers, dialects in turn, until ``calls`` more calls are made."""
        target = self.calls + calls

        async def worker(first: int) -> None:
            i = first
            while self.calls < target:
                await self.episode(DIALECTS[i % len(DIALECTS)])
                i += WORKERS

        async with anyio.create_task_group() as tg:
            for w in range(WORKERS):
                tg.start_soon(worker, w)


def test_proxy_rss_stays_flat_over_ten_thousand_calls_with_sessions_closed(proxy_process):
    proc, url = proxy_process
    samples: list[tuple[int, float]] = [(0, rss_mib(proc.pid))]

    async def main() -> None:
        limits = httpx.Limits(max_connections=WORKERS, max_keepalive_connections=WORKERS)
        async with httpx.AsyncClient(base_url=url, timeout=60.0, limits=limits) as client:
            load = Load(client)
            await load.run(WARMUP_CALLS)
            samples.append((load.calls, rss_mib(proc.pid)))
            while load.calls < WARMUP_CALLS + MEASURED_CALLS:
                await load.run(min(1_000, WARMUP_CALLS + MEASURED_CALLS - load.calls))
                samples.append((load.calls, rss_mib(proc.pid)))

    started = time.monotonic()
    anyio.run(main)
    elapsed = time.monotonic() - started
    health = httpx.get(f"{url}/health").json()
    assert health["sessions"] == 0  # every session was closed

    start, warm, end = samples[0][1], samples[1][1], samples[-1][1]
    peak = max(rss for _, rss in samples[1:])
    calls = samples[-1][0]
    print(
        f"\nproxy RSS over {calls} calls in {elapsed:.0f} s: start {start:.1f} MiB, after "
        f"{samples[1][0]} warm-up calls {warm:.1f} MiB, end {end:.1f} MiB (growth "
        f"{end - warm:+.1f} MiB, peak {peak:.1f} MiB); samples "
        + ", ".join(f"{n}:{rss:.1f}" for n, rss in samples)
    )
    assert calls >= WARMUP_CALLS + MEASURED_CALLS - TURNS * WORKERS
    assert end - warm <= MAX_GROWTH_MIB, samples
    assert peak - warm <= MAX_GROWTH_MIB, samples
