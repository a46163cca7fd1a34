"""Collections: many episodes at concurrency, groups, filters, failures; resume in-process and
after SIGKILL; bad output directories refused before any rollout runs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest

from rollwire.collect.collection import CollectConfig, CollectInputError, collect, work_list
from rollwire.datasets.store import CollectionMismatchError, read_manifest
from rollwire.tools.endpoint import EndpointPool
from rollwire.tools.rollouts import Limits, LLMSpec
from tests.fakes.serve import serve_in_thread
from tests.fakes.spawn import sigkill_once_written
from tests.fakes.vllm import FakeVLLM

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
TASKS = ["reasoning_gym:chain_sum", "reasoning_gym:basic_arithmetic"]


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeVLLM, str]]:
    vllm = FakeVLLM(tool_call_every_turn=True)
    with serve_in_thread(vllm.app) as url:
        yield vllm, url + "/v1"


@pytest.fixture
async def pool(fake) -> AsyncIterator[EndpointPool]:
    """A pool whose endpoint is certified already (certification's probes are not episodes)."""
    vllm, url = fake
    vllm.reset()
    pool = EndpointPool()
    await pool.endpoint(url, model=None, api_key=None)
    yield pool
    await pool.aclose()


def config(url: str, **kw) -> CollectConfig:
    return CollectConfig(
        tasks=kw.pop("tasks", TASKS),
        episodes=kw.pop("episodes", 8),
        llm=LLMSpec(url=url),
        limits=Limits(max_turns=2),
        **kw,
    )


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_200_episodes_at_concurrency_16_with_groups_and_recorded_failures(
    fake, pool, tmp_path
):
    vllm, url = fake
    vllm.behavior.update(fail_status=500, fail_count=7)  # seven episodes meet a dead engine
    out = tmp_path / "c"
    cfg = config(url, episodes=200, group_size=4, concurrency=16, trainable_only=True)
    seen: list[int] = []

    async def on_progress(p) -> None:
        seen.append(p.done)

    result = await collect(cfg, out, pool=pool, on_progress=on_progress)

    assert result.failed == 7 and result.collected + result.filtered + result.failed == 200
    episodes = lines(out / "episodes.jsonl")
    failures = lines(out / "failures.jsonl")
    assert result.episode_ids == [e["episode_id"] for e in episodes]  # written, in file order
    assert len(set(result.episode_ids)) == len(episodes) == result.collected
    assert len(failures) == 7 and all("500" in f["error"] for f in failures)
    assert not set(result.episode_ids) & {f["episode_id"] for f in failures}
    assert seen[-1] == 200 and seen == sorted(seen)
    # Groups: 4 samples of one task instance (one seed), each its own sampling seed.
    groups: dict[str, list[dict]] = defaultdict(list)
    for e in episodes:
        groups[e["group_id"]].append(e)
    for members in groups.values():
        assert len({(m["task"], m["seed"]) for m in members}) == 1 and len(members) <= 4
    by_task = Counter(e["task"] for e in episodes) + Counter(f["task"] for f in failures)
    assert by_task == {TASKS[0]: 100, TASKS[1]: 100}
    manifest = read_manifest(out)
    assert manifest.counts.collected == len(episodes) and manifest.counts.failed == 7
    assert manifest.engine_tier == "tokens" and manifest.model
    assert all(e["sequences"] and e["sequences"][0]["input_ids"] for e in episodes)


def test_work_list_groups_share_a_task_seed_and_ids_are_stable():
    cfg = CollectConfig(tasks=TASKS, episodes=12, group_size=3, seed=10)
    work = work_list(cfg, set())
    assert [w.task for w in work[:6]] == [TASKS[0]] * 3 + [TASKS[1]] * 3
    assert [w.seed for w in work] == [10] * 6 + [11] * 6
    assert len({w.sampling_seed for w in work}) == 12
    assert [w.episode_id for w in work] == [w.episode_id for w in work_list(cfg, set())]
    assert len({w.episode_id for w in work}) == 12
    first = work_list(cfg.model_copy(update={"episodes": 6}), set())
    assert [w.episode_id for w in first] == [w.episode_id for w in work[:6]]  # -n extends


async def test_running_a_collection_twice_in_one_process_skips_what_is_written(
    fake, pool, tmp_path
):
    vllm, url = fake
    cfg = config(url, episodes=8, group_size=2)
    first = await collect(cfg, tmp_path / "c", pool=pool)
    calls = vllm.stats["ok"]
    again = await collect(cfg, tmp_path / "c", pool=pool)
    assert first.collected == 8 and again.collected == 0 and again.skipped_done == 8
    assert vllm.stats["ok"] == calls  # nothing ran again
    more = await collect(cfg.model_copy(update={"episodes": 12}), tmp_path / "c", pool=pool)
    assert more.collected == 4 and more.skipped_done == 8
    ids = [e["episode_id"] for e in lines(tmp_path / "c" / "episodes.jsonl")]
    assert len(ids) == len(set(ids)) == 12


async def test_filtered_episodes_are_recorded_and_not_run_again(fake, pool, tmp_path):
    _, url = fake
    cfg = config(url, episodes=4, min_reward=0.5)  # the fake's answers score 0.0
    result = await collect(cfg, tmp_path / "c", pool=pool)
    assert result.filtered == 4 and result.collected == 0 and result.episode_ids == []
    assert len(lines(tmp_path / "c" / "filtered.jsonl")) == 4
    assert (await collect(cfg, tmp_path / "c", pool=pool)).skipped_done == 4


async def test_an_out_dir_holding_another_collection_is_refused_before_any_rollout(
    fake, pool, tmp_path
):
    vllm, url = fake
    await collect(config(url, episodes=2), tmp_path / "c", pool=pool)
    calls = vllm.stats["ok"]
    with pytest.raises(CollectionMismatchError):
        await collect(config(url, episodes=2, tasks=TASKS[:1]), tmp_path / "c", pool=pool)
    with pytest.raises(CollectInputError, match=r"^out: "):
        await collect(config(url, episodes=2, resume=False), tmp_path / "c", pool=pool)
    assert vllm.stats["ok"] == calls


async def test_a_read_only_out_dir_fails_before_any_rollout(fake, pool, tmp_path):
    vllm, url = fake
    ro = tmp_path / "ro"
    ro.mkdir()
    await anyio.run_process(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)])
    try:
        calls = vllm.stats["ok"]
        with pytest.raises(OSError, match="Read-only file system"):
            await collect(config(url, episodes=2), ro / "c", pool=pool)
        assert vllm.stats["ok"] == calls
    finally:
        await anyio.run_process(["umount", str(ro)])


async def test_bad_collection_input_names_the_field(fake, pool, tmp_path):
    _, url = fake
    with pytest.raises(CollectInputError, match=r"^task: "):
        await collect(config(url, tasks=["reasoning_gym:nope"]), tmp_path / "c", pool=pool)
    with pytest.raises(CollectInputError, match=r"^llm: "):
        await collect(config("http://127.0.0.1:9/v1"), tmp_path / "d")
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()


def _collect_cmd(url: str, out: Path, n: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rollwire",
        "collect",
        "--llm-url",
        url,
        "--task",
        TASKS[0],
        "--task",
        TASKS[1],
        "-n",
        str(n),
        "--group-size",
        "2",
        "--concurrency",
        "4",
        "--out",
        str(out),
        "--no-progress",
    ]


def test_a_collection_killed_with_sigkill_resumes_with_every_episode_exactly_once(tmp_path):
    slow = FakeVLLM(tool_call_every_turn=True)
    slow.behavior.update(delay_s=0.05)
    out = tmp_path / "c"
    n = 60
    with serve_in_thread(slow.app) as root:
        proc = subprocess.Popen(
            _collect_cmd(root + "/v1", out, n),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        episodes = out / "episodes.jsonl"
        sigkill_once_written(proc, episodes, 10, timeout_s=120)
        killed_at = episodes.read_bytes().count(b"\n")
        assert 10 <= killed_at < n, killed_at
        done = subprocess.run(
            [*_collect_cmd(root + "/v1", out, n), "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    rows = lines(episodes)  # every line parses
    ids = [r["episode_id"] for r in rows]
    assert len(ids) == len(set(ids)) == n  # each episode exactly once
    assert result["skipped_done"] >= killed_at and result["collected"] == n - result["skipped_done"]
    manifest = read_manifest(out)
    assert manifest.counts.collected == n == len(rows)
