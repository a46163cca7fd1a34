"""collect_episodes and push_dataset through the real MCP client, and the CLI's collect, export
and push: a collection made over MCP loads with `datasets` with its token arrays intact."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import datasets
import pytest
from mcp import Client

from rollwire.server import cli
from rollwire.server.mcp_app import ServerState, build_server
from tests.datasets.fake_hub import FakeHub
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM

pytestmark = pytest.mark.anyio

TOKEN = "hf_standInToken0987654321fedcba"
REPO = "bob/rollwire-chain-sum"


@pytest.fixture(scope="module")
def fake_url() -> Iterator[str]:
    with serve_in_thread(FakeVLLM(tool_call_every_turn=True).app) as url:
        yield url + "/v1"


@pytest.fixture
def hub(monkeypatch) -> Iterator[FakeHub]:
    fake = FakeHub(token=TOKEN)
    with serve_in_thread(fake.app()) as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        yield fake


@pytest.fixture
async def client(tmp_path) -> AsyncIterator[tuple[Client, ServerState]]:
    async with ServerState(data_dir=tmp_path / "data") as state:
        async with Client(build_server(state)) as c:
            yield c, state


async def test_collect_episodes_reports_progress_resumes_and_pushes(
    client, fake_url, hub, tmp_path
):
    c, state = client
    progress: list[tuple[float, float | None]] = []

    async def on_progress(done, total, message):
        progress.append((done, total))

    args = {
        "out_dir": "chain",
        "episodes": 6,
        "group_size": 3,
        "tasks": ["reasoning_gym:chain_sum"],
        "llm": fake_url,
        "limits": {"max_turns": 2},
        "concurrency": 3,
    }
    result = await c.call_tool("collect_episodes", args, progress_callback=on_progress)
    out = result.structured_content
    assert not result.is_error and out["collected"] == 6 and out["failed"] == 0, out
    assert out["engine_tier"] == "tokens" and len(out["episode_ids"]) == 6
    assert (done_total := progress[-1]) == (6, 6) and done_total
    path = state.data_dir / "chain"
    rows = [json.loads(x) for x in (path / "episodes.jsonl").read_text().splitlines()]
    assert [r["episode_id"] for r in rows] == out["episode_ids"]
    assert len({r["group_id"] for r in rows}) == 2

    again = (await c.call_tool("collect_episodes", args)).structured_content
    assert again["collected"] == 0 and again["skipped_done"] == 6

    dry = (
        await c.call_tool("push_dataset", {"out_dir": "chain", "repo_id": REPO, "dry_run": True})
    ).structured_content
    assert dry["sent"] is False and hub.requests == [] and dry["plan"]["n_rows"] == 6
    assert TOKEN not in json.dumps(dry)
    pushed = await c.call_tool("push_dataset", {"out_dir": "chain", "repo_id": REPO})
    assert not pushed.is_error and pushed.structured_content["sent"] is True
    assert TOKEN not in json.dumps(pushed.structured_content)
    repo = hub.repos[REPO]
    assert repo.private and "README.md" in repo.files
    # What landed on the Hub loads as the train split, token arrays intact.
    local = tmp_path / "hub-copy"
    for name, data in repo.files.items():
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_bytes(data)
    loaded = datasets.load_dataset(str(local), split="train", cache_dir=str(tmp_path / "hf"))
    assert loaded.num_rows == 6
    by_id = {r["episode_id"]: r for r in rows}
    for row in loaded:
        original = by_id[row["episode_id"]]["sequences"][0]
        assert row["sequences"][0]["input_ids"] == original["input_ids"]
        assert row["sequences"][0]["loss_mask"] == original["loss_mask"]
        assert row["sequences"][0]["logprobs"] == pytest.approx(original["logprobs"])


async def test_collect_episodes_takes_answer_mode_and_task_config_and_records_the_talk(
    client, fake_url
):
    c, state = client
    args = {
        "out_dir": "either",
        "episodes": 2,
        "tasks": ["reasoning_gym:chain_sum"],
        "llm": fake_url,
        "task_config": {"min_terms": 2, "max_terms": 2},
        "answer_mode": "either",
    }
    out = (await c.call_tool("collect_episodes", args)).structured_content
    assert out["collected"] == 2, out
    path = state.data_dir / "either"
    manifest = json.loads((path / "manifest.json").read_text())
    assert "answer_mode" in json.dumps(manifest) and "max_terms" in json.dumps(manifest)
    for line in (path / "episodes.jsonl").read_text().splitlines():
        row = json.loads(line)
        question = row["messages"][0]["content"]
        assert question.count(" + ") + question.count(" - ") == 1  # two terms: the config held
        assert [m["role"] for m in row["messages"]] == ["user", "assistant", "tool"]
        assert row["messages"][1]["tool_calls"][0]["function"]["name"] == "answer"
        assert [t["function"]["name"] for t in row["tools"]] == ["answer"]
    other_mode = await c.call_tool("collect_episodes", {**args, "answer_mode": "text"})
    assert other_mode.is_error and "CollectionMismatchError" in other_mode.content[0].text


async def test_collect_and_push_bad_input_are_tool_errors(client, fake_url):
    c, _ = client
    base = {"out_dir": "x", "episodes": 2, "llm": fake_url}
    cases = [
        ({**base, "tasks": ["reasoning_gym:nope"]}, "task: "),
        ({**base}, "task: "),
        ({**base, "tasks": ["reasoning_gym:chain_sum"], "episodes": 0}, "episodes"),
        ({**base, "tasks": ["reasoning_gym:chain_sum"], "llm": "http://127.0.0.1:9/v1"}, "llm: "),
        ({**base, "dataset": "/no/such/dir"}, "dataset: "),
    ]
    for args, needle in cases:
        result = await c.call_tool("collect_episodes", args)
        assert result.is_error and needle in result.content[0].text, (args, result.content)
    missing = await c.call_tool("push_dataset", {"out_dir": "nothing-here", "repo_id": REPO})
    assert missing.is_error and "out_dir: " in missing.content[0].text
    assert (await c.call_tool("list_tasks", {"limit": 1})).structured_content  # still serving


ESCAPES = ["../escape", "a/../../escape", "/tmp/rollwire-not-the-data-dir", ".", "link/inside"]


@pytest.mark.parametrize("out_dir", ESCAPES)
async def test_an_out_dir_that_resolves_outside_the_data_dir_is_a_tool_error_naming_it(
    client, fake_url, tmp_path, out_dir
):
    c, state = client
    state.data_dir.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (state.data_dir / "link").symlink_to(outside)  # a symlink that leads out
    args = {"out_dir": out_dir, "episodes": 1, "tasks": ["reasoning_gym:chain_sum"]}
    result = await c.call_tool("collect_episodes", {**args, "llm": fake_url})
    assert result.is_error and "out_dir: " in result.content[0].text, result.content
    pushed = await c.call_tool("push_dataset", {"out_dir": out_dir, "repo_id": REPO})
    assert pushed.is_error and "out_dir: " in pushed.content[0].text
    assert not any(outside.iterdir()) and not (tmp_path / "escape").exists()
    assert sorted(p.name for p in state.data_dir.iterdir()) == ["link"]  # nothing written


async def test_an_absolute_out_dir_inside_the_data_dir_is_accepted(client, fake_url):
    c, state = client
    inside = state.data_dir.resolve() / "abs"
    args = {"out_dir": str(inside), "episodes": 1, "tasks": ["reasoning_gym:chain_sum"]}
    done = await c.call_tool("collect_episodes", {**args, "llm": fake_url})
    assert not done.is_error, done.content
    assert (inside / "manifest.json").exists()


def test_cli_collect_export_and_push_dry_run(fake_url, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    out = tmp_path / "c"
    argv = ["collect", "--llm-url", fake_url, "--task", "reasoning_gym:chain_sum", "-n", "3"]
    assert cli.main([*argv, "--out", str(out), "--no-progress", "--max-turns", "2"]) == 0
    assert "collected 3, filtered 0, failed 0" in capsys.readouterr().out
    assert cli.main(["export", str(out), "--format", "jsonl"]) == 0
    assert "3 episodes" in capsys.readouterr().out
    exported = [json.loads(x) for x in (out / "data" / "train.jsonl").read_text().splitlines()]
    assert len(exported) == 3 and exported[0]["sequences"][0]["input_ids"]
    assert cli.main(["push", str(out), "--repo-id", REPO, "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert REPO in text and "private" in text and TOKEN not in text
    assert cli.main(["push", str(tmp_path / "none"), "--repo-id", REPO, "--dry-run"]) == 2


def test_cli_collect_takes_task_config_and_answer_mode(fake_url, tmp_path, capsys):
    out = tmp_path / "c"
    argv = ["collect", "--llm-url", fake_url, "--task", "reasoning_gym:chain_sum", "-n", "2"]
    argv += ["--out", str(out), "--no-progress", "--answer-mode", "either"]
    assert cli.main([*argv, "--task-config", '{"min_terms": 3, "max_terms": 3}']) == 0
    rows = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert all(r["messages"][0]["content"].count("=") == 1 for r in rows)
    assert all(
        r["messages"][0]["content"].count(" + ") + r["messages"][0]["content"].count(" - ") == 2
        for r in rows
    )
    assert "either" in (out / "manifest.json").read_text()
    capsys.readouterr()
    assert cli.main([*argv, "--task-config", "[1]"]) == 2
    assert "--task-config must be a JSON object" in capsys.readouterr().err


def test_cli_collect_refuses_a_different_collection_in_out(fake_url, tmp_path, capsys):
    out = tmp_path / "c"
    base = ["collect", "--llm-url", fake_url, "-n", "1", "--out", str(out), "--no-progress"]
    assert cli.main([*base, "--task", "reasoning_gym:chain_sum"]) == 0
    assert cli.main([*base, "--task", "reasoning_gym:basic_arithmetic"]) == 2
    assert "holds a different collection" in capsys.readouterr().err


async def test_cancelling_collect_episodes_keeps_what_was_written_and_resumes(client, tmp_path):
    import anyio

    c, state = client
    slow = FakeVLLM(tool_call_every_turn=True)
    with serve_in_thread(slow.app) as root:
        url = root + "/v1"
        assert (await c.call_tool("validate_llm", {"llm_url": url})).structured_content
        slow.behavior.update(delay_s=0.2)
        args = {
            "out_dir": "slow",
            "episodes": 40,
            "tasks": ["reasoning_gym:chain_sum"],
            "llm": url,
            "limits": {"max_turns": 1},
            "concurrency": 2,
        }
        episodes = state.data_dir / "slow" / "episodes.jsonl"
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.call_tool, "collect_episodes", args)
            with anyio.fail_after(60):
                while not episodes.exists() or episodes.read_bytes().count(b"\n") < 4:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
        await anyio.sleep(1.0)  # the server finishes cancelling (in-flight writes complete)
        written = [json.loads(x) for x in episodes.read_text().splitlines()]
        assert 4 <= len(written) < 40
        slow.behavior.update(delay_s=0.0)
        again = await c.call_tool("collect_episodes", args)
        assert not again.is_error, again.content
        done = again.structured_content
    assert done["skipped_done"] >= len(written) and done["totals"]["collected"] == 40
    ids = [json.loads(x)["episode_id"] for x in episodes.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 40
