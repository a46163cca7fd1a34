"""The chaos run's short schedule (``tests/chaos/chaos.py``; the long one is in
docs/reliability.md): one collection over two engines and a loopback Ray cluster, its MCP server
over HTTP, while an engine, the second Ray node, the MCP server and the disk each fail once at a
seeded moment. Nothing planned is lost, nothing is written twice, every failure has its cause,
and every stored token is one an engine sampled."""

from __future__ import annotations

from tests.chaos.chaos import run, schedule  # isort: skip (before Ray: the loopback setting)

import functools

import anyio
import pytest

pytestmark = pytest.mark.slow

EPISODES = 160
SEED = 34


def check_line(check: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in check.items() if k != "token_problems")


def test_a_collection_survives_an_engine_a_ray_node_its_mcp_server_and_its_disk_failing(tmp_path):
    events = schedule(SEED, EPISODES, per_kind=1)
    assert sorted(e.kind for e in events) == ["disk", "engine", "node", "server"]

    outcome = anyio.run(functools.partial(run, tmp_path, episodes=EPISODES, seed=SEED, per_kind=1))

    report = "\n".join(outcome.events + outcome.calls)
    print(f"\n{report}\nwall {outcome.wall_s} s; check {check_line(outcome.check)}")
    check = outcome.check
    assert check["episodes"] == check["unique"] == EPISODES and check["as_planned"], report
    assert check["failures_without_cause"] == 0, check
    assert check["n_token_problems"] == 0, check["token_problems"]
    assert check["trainable_spans"] >= EPISODES
    fired = [line for line in outcome.events if "] at " in line]
    assert len(fired) == len(events), report  # every scheduled fault happened
    # The server's death and the full disk each ended a call, which was repeated.
    assert any("call lost" in c for c in outcome.calls), report
    assert any("No space left on device (ENOSPC)" in c for c in outcome.calls), report
