"""``rollwire eval``: problems x samples as a resumable collection marked eval, its table and
eval.json, refusals up front, SIGKILL and resume giving the numbers of an uninterrupted run, and
``--compare`` of two folders."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollwire.datasets.evals import pass_at_k
from tests.fakes.serve import serve_in_thread
from tests.fakes.solver import by_sampling_seed, chain_sum_solver
from tests.fakes.spawn import sigkill_once_written
from tests.fakes.vllm import FakeVLLM

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = str(ROOT / "examples" / "tasks")
SINGLE_REWARD = "[cfio]*"  # the bundled tasks but sales-report (several rewards)
TASK = "reasoning_gym:chain_sum"


def rollwire(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollwire", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def harbor_eval(harness: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return rollwire(
        "eval", "--dataset", EXAMPLES, "--tasks", SINGLE_REWARD, "--harness", harness,
        "--samples", "2", "--k", "1,2", "--out", str(out), "--no-progress", *extra,
    )  # fmt: skip


@pytest.fixture(scope="module")
def solver() -> Iterator[str]:
    """An engine whose model answers chain_sum right unless the sampling seed is a multiple
    of 3: samples of one problem differ."""
    with serve_in_thread(FakeVLLM(policy=chain_sum_solver(by_sampling_seed)).app) as url:
        yield url + "/v1"


def eval_cmd(url: str, out: Path, *extra: str) -> list[str]:
    return [
        "eval", "--llm-url", url, "--task", TASK, "--problems", "6", "--samples", "4",
        "--k", "1,2,4", "--max-turns", "2", "--out", str(out), "--no-progress", *extra,
    ]  # fmt: skip


def test_an_eval_prints_per_family_pass_at_k_and_keeps_eval_json(solver, tmp_path):
    out = tmp_path / "ev"
    done = rollwire(*eval_cmd(solver, out))
    assert done.returncode == 0, done.stderr
    assert "reasoning_gym:chain_sum" in done.stdout and "pass@4" in done.stdout
    report = json.loads((out / "eval.json").read_text())
    assert report["command"][:2] == ["rollwire", "eval"]
    assert report["model"] and report["engine_tier"] == "tokens" and report["engines"] == [solver]
    assert report["complete"] and report["planned"] == 24 and report["missing"] == 0
    problems = report["problems"]
    assert [p["seed"] for p in problems] == list(range(6)) and {p["n"] for p in problems} == {4}
    overall = report["metrics"]["overall"]
    assert overall["samples"] == 24 and 0 < overall["passed"] < 24  # some right, some wrong
    by_k = {p["k"]: p["estimate"] for p in overall["pass_at"]}
    direct = {k: sum(pass_at_k(p["n"], p["c"], k) for p in problems) / 6 for k in (1, 2, 4)}
    assert by_k == pytest.approx(direct)
    assert by_k[1] < by_k[4]
    rows = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert {r["rollout_type"] for r in rows} == {"eval"}  # held out: never training data


def test_an_eval_killed_with_sigkill_and_rerun_gives_the_uninterrupted_numbers(tmp_path):
    slow = FakeVLLM(policy=chain_sum_solver(by_sampling_seed))
    slow.behavior.update(delay_s=0.05)
    with serve_in_thread(slow.app) as root:
        url = root + "/v1"
        whole = rollwire(*eval_cmd(url, tmp_path / "whole", "--json"))
        assert whole.returncode == 0, whole.stderr
        killed = tmp_path / "killed"
        proc = subprocess.Popen(
            [sys.executable, "-m", "rollwire", *eval_cmd(url, killed)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        sigkill_once_written(proc, killed / "episodes.jsonl", 5, timeout_s=120)
        assert not (killed / "eval.json").exists()
        resumed = rollwire(*eval_cmd(url, killed, "--json"))
    assert resumed.returncode == 0, resumed.stderr
    a, b = json.loads(whole.stdout), json.loads(resumed.stdout)
    assert a["metrics"] == b["metrics"] and a["problems"] == b["problems"]
    ids = [
        json.loads(x)["episode_id"] for x in (killed / "episodes.jsonl").read_text().splitlines()
    ]
    assert len(ids) == len(set(ids)) == 24


def test_compare_pairs_two_evals_by_problem(tmp_path):
    nop, oracle = tmp_path / "nop", tmp_path / "oracle"
    for harness, out in (("nop", nop), ("oracle", oracle)):
        done = harbor_eval(harness, out)
        assert done.returncode == 0, done.stderr
    result = rollwire("eval", "--compare", str(nop), str(oracle), "--json")
    assert result.returncode == 0, result.stderr
    comparison = json.loads(result.stdout)
    overall = comparison["overall"]
    assert (overall["problems"], overall["wins"], overall["losses"]) == (4, 4, 0)
    by_metric = {d["metric"]: d for d in overall["differences"]}
    assert set(by_metric) == {"reward_mean", "pass@1", "pass@2"}
    reward = by_metric["reward_mean"]
    assert (reward["a"], reward["b"], reward["diff"]) == (0.0, 1.0, 1.0)
    assert reward["p_value"] == pytest.approx(2 / 16) and overall["permutation"] == "exact"
    table = rollwire("eval", "--compare", str(nop), str(oracle))
    assert "paired by problem: 4 problems" in table.stdout and "+1.000" in table.stdout


def test_compare_refuses_evals_of_other_problems(solver, tmp_path):
    env, harbor = tmp_path / "env", tmp_path / "harbor"
    assert rollwire(*eval_cmd(solver, env)).returncode == 0
    assert harbor_eval("oracle", harbor).returncode == 0
    result = rollwire("eval", "--compare", str(env), str(harbor))
    assert result.returncode == 2
    assert "the evals ran different tasks" in result.stderr
    shifted = tmp_path / "shifted"
    assert rollwire(*eval_cmd(solver, shifted, "--seed", "3")).returncode == 0
    result = rollwire("eval", "--compare", str(env), str(shifted))
    assert result.returncode == 2 and "different problems: 3 only in A" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--samples", "2", "--k", "1,4"], "k: pass@4 needs at least 4 samples per problem"),
        (["--problems", "3"], "problems: a Harbor task is one problem"),
        (["--k", "two"], "k: 'two' is not a whole number"),
    ],
)
def test_bad_eval_arguments_are_refused_before_anything_runs(tmp_path, args, message):
    out = tmp_path / "ev"
    result = rollwire(
        "eval", "--dataset", EXAMPLES, "--tasks", SINGLE_REWARD, "--harness", "oracle",
        "--out", str(out), *args,
    )  # fmt: skip
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not out.exists()


def test_a_task_with_several_rewards_and_no_reward_key_is_refused_up_front(tmp_path):
    out = tmp_path / "ev"
    result = rollwire(
        "eval", "--dataset", EXAMPLES, "--harness", "oracle", "--out", str(out), "--no-progress"
    )
    assert result.returncode == 2
    assert "sales-report' declares several rewards" in result.stderr and not out.exists()
    named = rollwire(
        "eval", "--dataset", EXAMPLES, "--tasks", "sales-*", "--harness", "oracle",
        "--reward-key", "correct", "--out", str(out), "--no-progress", "--json",
    )  # fmt: skip
    assert named.returncode == 0, named.stderr
    assert json.loads(named.stdout)["metrics"]["overall"]["passed"] == 1


@pytest.mark.anyio
async def test_collect_episodes_metrics_block_equals_the_cli_eval_of_the_same_folder(
    solver, tmp_path
):
    from mcp import Client

    from rollwire.server.mcp_app import ServerState, build_server

    data = tmp_path / "data"
    done = rollwire(*eval_cmd(solver, data / "ev"))
    assert done.returncode == 0, done.stderr
    cli = json.loads((data / "ev" / "eval.json").read_text())["metrics"]
    call = {
        "out_dir": "ev", "tasks": [TASK], "episodes": 24, "group_size": 4, "eval": True,
        "k": [1, 2, 4], "limits": {"max_turns": 2}, "llm_url": solver,
    }  # fmt: skip
    async with ServerState(data_dir=data) as state, Client(build_server(state)) as client:
        result = await client.call_tool("collect_episodes", call)
        assert not result.is_error, result.content
        again = result.structured_content
        assert again["skipped_done"] == 24 and again["collected"] == 0  # the same collection
        assert again["metrics"] == cli
        bad = await client.call_tool("collect_episodes", {**call, "k": [8]})
        assert bad.is_error and "k: pass@8 needs at least 8 samples" in bad.content[0].text


def test_compare_takes_a_collection_without_eval_json_summarised_at_pass_at_1(tmp_path):
    nop, made = tmp_path / "nop", tmp_path / "collected"
    assert harbor_eval("nop", nop).returncode == 0
    collected = rollwire(
        "collect", "--dataset", EXAMPLES, "--tasks", SINGLE_REWARD, "--harness", "oracle",
        "-n", "8", "--group-size", "2", "--out", str(made), "--no-progress",
    )  # fmt: skip
    assert collected.returncode == 0, collected.stderr
    result = rollwire("eval", "--compare", str(nop), str(made), "--json")
    assert result.returncode == 0, result.stderr
    metrics = [d["metric"] for d in json.loads(result.stdout)["overall"]["differences"]]
    assert metrics == ["reward_mean", "pass@1"]  # the ks both have
    missing = rollwire("eval", "--compare", str(nop), str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "neither an eval nor a collection" in missing.stderr
