"""``examples/agent_curation/run.py``: Claude Code curates a dataset through rollwire's tools.

The agent's model is a scripted curator behind the capture proxy (Anthropic Messages, as Claude
Code speaks it) that follows the goal in ``goal.md``; the rollouts run on a fake engine whose
model solves most chain_sum problems (and gets every one whose sum is a multiple of 3 wrong), so
the reward filter has something to drop, and the first collection keeps too few: the curator
extends it. The artefacts are checked as a user would read them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from rollwire.capture.proxy import CaptureProxy, ProxyConfig
from rollwire.capture.rollout import CaptureLevel
from rollwire.harnesses.harbor.installs import ensure_installed
from tests.clients.policy import WAIT_TOOLS, ScriptedPolicy, Step, last_result
from tests.fakes.serve import serve_in_thread
from tests.fakes.solver import chain_sum_solver
from tests.fakes.vllm import FakeVLLM

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "examples" / "agent_curation" / "run.py"
ADMIN = "curation-admin"


solver = chain_sum_solver()  # right, unless the sum is a multiple of 3


def _done(text: str) -> bool:
    return re.search(r"status\W+done", text) is not None


GOAL = 6  # episodes to keep
FIRST = 4  # attempts in the first collection: too few to keep GOAL


def _json_results(results: list[str]) -> list[dict[str, Any]]:
    found = []
    for text in results:
        m = re.search(r"\{.*\}", text, re.DOTALL)
        if m is not None and _done(text):
            found.append(json.loads(m.group(0)))
    return found


def curator(engine: str) -> ScriptedPolicy:
    """The goal's steps: collect FIRST attempts; if fewer than GOAL are kept, call again with
    twice the attempts (the collection resumes and extends); push; report the whole count."""
    collect = {
        "out_dir": "curated",
        "tasks": ["reasoning_gym:chain_sum"],
        "llm": {"url": engine},
        "min_reward": 1.0,
        "trainable_only": True,
        "background": True,
    }

    def extend(results: list[str]) -> dict[str, Any]:
        first = _json_results(results)[0]["totals"]
        kept, attempts = first["collected"], first["collected"] + first["filtered"]
        return {**collect, "episodes": attempts if kept >= GOAL else 2 * attempts}

    def final(results: list[str]) -> str:
        pushed = last_result(results)
        totals = _json_results(results)[-1]["totals"]
        files = len(pushed["plan"]["files"])
        attempts = totals["collected"] + totals["filtered"]
        return f"KEPT {totals['collected']} of {attempts} episodes, dry run {files} files"

    steps = [
        Step("list_tasks", {"source": "reasoning_gym", "query": "chain_sum"}),
        Step("validate_llm", {"llm_url": engine}),
        Step("collect_episodes", {**collect, "episodes": FIRST}, until=_done),
        Step("collect_episodes", extend, until=_done),
        Step("push_dataset", {"out_dir": "curated", "repo_id": "me/curated", "dry_run": True}),
    ]
    return ScriptedPolicy(steps, final=final)


@pytest.fixture
def engine() -> Iterator[str]:
    with serve_in_thread(FakeVLLM(policy=solver).app) as url:
        yield url + "/v1"


def test_the_agent_curates_a_filtered_dataset_and_pushes_it_as_a_dry_run(engine, tmp_path):
    anyio.run(ensure_installed, "claude-code")
    policy = curator(engine)
    with serve_in_thread(FakeVLLM(policy=policy, max_model_len=1_000_000).app) as brain:
        proxy = CaptureProxy(
            ProxyConfig(llm_url=brain + "/v1", capture_level=CaptureLevel.TOKENS, admin_key=ADMIN)
        )
        with serve_in_thread(proxy.app) as url:
            key = httpx.post(
                f"{url}/sessions", headers={"Authorization": f"Bearer {ADMIN}"}
            ).json()["session_id"]
            env = {**os.environ, "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": key}
            out = tmp_path / "out"
            argv = [sys.executable, str(RUN), "--engine-url", engine, "--out", str(out)]
            done = subprocess.run(
                [*argv, "--repo-id", "me/curated"],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            captured = httpx.get(
                f"{url}/sessions/{key}/rollout", headers={"Authorization": f"Bearer {ADMIN}"}
            ).json()
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])

    # the collection: only right answers kept, each trainable
    episodes = [
        json.loads(line)
        for line in (out / "collections" / "curated" / "episodes.jsonl").read_text().splitlines()
    ]
    filtered = (out / "collections" / "curated" / "filtered.jsonl").read_text().splitlines()
    assert episodes and filtered, "the reward filter kept all or nothing"
    assert len(episodes) >= GOAL and len(episodes) + len(filtered) == 2 * FIRST
    assert all(e["reward"] >= 1.0 for e in episodes)

    # the agent's transcript: its tool calls and its final line, as Claude Code wrote them (less
    # the waits for a server still connecting, which a busy machine adds: tests/clients/policy.py)
    events = [json.loads(line) for line in (out / "transcript.jsonl").read_text().splitlines()]
    used = [
        block["name"]
        for e in events
        if e.get("type") == "assistant"
        for block in e["message"]["content"]
        if block.get("type") == "tool_use" and block["name"] not in WAIT_TOOLS
    ]
    assert used[:3] == [
        "mcp__rollwire__list_tasks",
        "mcp__rollwire__validate_llm",
        "mcp__rollwire__collect_episodes",
    ]
    assert used[-1] == "mcp__rollwire__push_dataset"
    result = json.loads((out / "result.json").read_text())
    assert result["final"] == f"KEPT {len(episodes)} of {2 * FIRST} episodes, dry run 3 files"
    assert result["collection"]["collected"] == len(episodes)

    # rollwire's side: the filter arrived as the goal asked
    calls = [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]
    collects = [c["arguments"] for c in calls if c["tool"] == "collect_episodes"]
    assert all(c["min_reward"] == 1.0 and c["trainable_only"] for c in collects)
    assert collects[0]["episodes"] == FIRST  # then extended:
    assert collects[-1]["episodes"] == 2 * FIRST
    assert captured["turns"], "the curating agent's own model calls were captured"
