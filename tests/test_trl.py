"""rollwire.trl against a live rollwire server: TRL's rollout_func contract (keys, lengths,
alignment, env_mask), failures as rows without gradient, groups, timeouts, event loops."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from rollwire.server.mcp_app import ServerState, build_server, http_app
from rollwire.tools.rollouts import LLMSpec
from rollwire.trl import (
    REQUIRED_KEYS,
    announce_weight_version,
    choose_sequence,
    make_rollout_func,
    policy_step,
    reward_from_rollout,
    row_of,
    task_dataset,
)
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM

CHAIN = "reasoning_gym:chain_sum"
ARITH = "reasoning_gym:basic_arithmetic"


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeVLLM, str]]:
    vllm = FakeVLLM(tool_call_every_turn=True)
    with serve_in_thread(vllm.app) as url:
        yield vllm, url + "/v1"


@pytest.fixture(scope="module")
def server(fake) -> Iterator[tuple[str, ServerState]]:
    _, url = fake
    state = ServerState(default_llm=LLMSpec(url=url))
    with serve_in_thread(http_app(build_server(state))) as root:
        yield root + "/mcp", state


def check_trl_contract(out: dict, n: int) -> None:
    """What GRPOTrainer relies on."""
    for key in (*REQUIRED_KEYS, "env_mask", "reward"):
        assert len(out[key]) == n, key
    for prompt, completion, logprobs, mask in zip(
        out["prompt_ids"], out["completion_ids"], out["logprobs"], out["env_mask"], strict=True
    ):
        assert prompt and completion and all(isinstance(t, int) for t in prompt + completion)
        assert len(completion) == len(logprobs) == len(mask)
        assert set(mask) <= {0, 1}
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if m == 0)
        assert all(lp <= 0.0 for lp in logprobs)


def test_rollout_func_returns_trls_contract_with_groups_on_one_task_seed(server):
    url, state = server
    rollout_func = make_rollout_func(url, group_size=4, limits={"max_turns": 2}, seed=7)
    try:
        prompts = [CHAIN] * 4 + [ARITH] * 4
        out = rollout_func(prompts, None)
    finally:
        rollout_func.close()
    check_trl_contract(out, 8)
    assert all(out["ok"]) and all(r is not None for r in out["reward"])
    assert sum(sum(m) for m in out["env_mask"]) > 0
    # a GRPO group shares its task seed; the next group has another
    assert len(set(out["seed"][:4])) == 1 and len(set(out["seed"][4:])) == 1
    assert out["seed"][0] != out["seed"][4]
    # the row is exactly the captured sequence: the first prompt, then everything after it
    for i, rid in enumerate(out["rollout_id"]):
        stored = state.store.get(rid).result
        (seq,) = [s for s in stored.sequences if s.trainable]
        assert out["prompt_ids"][i] + out["completion_ids"][i] == seq.input_ids
        start = seq.turn_spans[0].start
        assert out["env_mask"][i] == seq.loss_mask[start:]
        assert len(out["prompt_ids"][i]) == start
    assert reward_from_rollout(prompts, None, **out) == out["reward"]


def test_failed_rollouts_are_rows_that_train_nothing(server):
    url, _ = server
    rollout_func = make_rollout_func(url, pad_token_id=2)
    try:
        out = rollout_func(
            ["reasoning_gym:no_such_task", CHAIN], None
        )  # a tool error, then a good one
        dead = make_rollout_func(url, llm="http://127.0.0.1:9/v1")
        try:
            unreachable = dead([CHAIN], None)
        finally:
            dead.close()
    finally:
        rollout_func.close()
    check_trl_contract(out, 2)
    assert out["ok"] == [False, True] and out["reward"][0] is None
    assert out["env_mask"][0] == [0] and out["prompt_ids"][0] == [2]
    assert "task: " in out["error"][0]
    check_trl_contract(unreachable, 1)
    assert unreachable["ok"] == [False] and unreachable["reward"] == [None]
    assert sum(unreachable["env_mask"][0]) == 0 and "endpoint not usable" in unreachable["error"][0]


def test_a_rollout_past_the_timeout_is_a_failed_row_not_a_hang():
    slow = FakeVLLM(tool_call_every_turn=True)
    with serve_in_thread(slow.app) as slow_root:
        state = ServerState(default_llm=LLMSpec(url=slow_root + "/v1"))
        with serve_in_thread(http_app(build_server(state))) as root:
            rollout_func = make_rollout_func(root + "/mcp", timeout=3.0)
            try:
                warm = rollout_func([CHAIN], None)  # certifies the endpoint
                assert warm["ok"] == [True]
                slow.behavior.update(delay_s=30.0)
                start = time.monotonic()
                out = rollout_func([CHAIN], None)
                took = time.monotonic() - start
            finally:
                slow.behavior.update(delay_s=0.0)
                rollout_func.close()
    check_trl_contract(out, 1)
    assert out["ok"] == [False] and "timeout" in out["error"][0] and took < 20


@pytest.mark.anyio
async def test_rollout_func_works_when_the_caller_runs_an_event_loop(server):
    url, _ = server
    rollout_func = make_rollout_func(url, limits={"max_turns": 1})
    try:
        out = rollout_func([CHAIN, CHAIN], None)  # a plain call from inside a coroutine
        again = rollout_func([ARITH], None)  # the same long-lived session
    finally:
        rollout_func.close()
    check_trl_contract(out, 2)
    check_trl_contract(again, 1)


def _seq(role: str, trainable: bool, mask: list[int], sid: str) -> dict:
    n = len(mask)
    return {
        "sequence_id": sid,
        "role": role,
        "trainable": trainable,
        "input_ids": list(range(n)),
        "loss_mask": mask,
        "logprobs": [-0.5 if m else 0.0 for m in mask],
        "prompt_len": 1,
        "turn_spans": [[1, n]],
    }


def test_the_training_sequence_is_the_agent_one_with_most_trainable_tokens():
    aux = _seq("auxiliary", True, [0, 1, 1, 1, 1, 1], "aux")
    first = _seq("agent", True, [0, 1, 1, 0], "first")
    second = _seq("agent", True, [0, 1, 0, 1], "second")  # ties: the later wins
    short = _seq("agent", True, [0, 1], "short")
    untrusted = _seq("agent", False, [0, 1, 1, 1, 1, 1, 1], "untrusted")
    assert choose_sequence([aux, first, second, short, untrusted])["sequence_id"] == "second"
    assert choose_sequence([aux, untrusted]) is None
    row = row_of({"ok": True, "reward": 1.0, "sequences": [first, second, aux]})
    assert row["sequences_total"] == 2 and row["completion_ids"] == [1, 2, 3]
    assert row["env_mask"] == [1, 0, 1] and row["logprobs"] == [-0.5, 0.0, -0.5]


def test_task_dataset_holds_task_references(server):
    url, _ = server
    local = task_dataset("reasoning_gym", query="chain_sum", repeat=2)
    assert local["prompt"][:2] == [CHAIN, CHAIN]
    remote = task_dataset("examples/tasks", limit=3, server_url=url)
    assert remote.num_rows == 3 and all(
        p.startswith("harbor:examples/tasks#") for p in remote["prompt"]
    )
    with pytest.raises(ValueError, match="no task matches"):
        task_dataset("reasoning_gym", query="zzz-nothing")


def test_importing_rollwire_trl_pulls_in_neither_torch_nor_trl():
    code = (
        "import sys, rollwire.trl as t; t.make_rollout_func('http://127.0.0.1:9/mcp'); "
        "print(sorted(m for m in ('torch', 'trl', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


class _Trainer:
    """What rollout_func reads of a TRL trainer: its step."""

    def __init__(self, step: int) -> None:
        self.state = type("State", (), {"global_step": step})()


def test_rows_carry_the_weight_version_that_sampled_them(server, fake):
    vllm, _ = fake
    url, _ = server
    vllm.behavior.update(weight_version="step-5")
    rollout_func = make_rollout_func(url, limits={"max_turns": 2})
    try:
        out = rollout_func([CHAIN, CHAIN], None)
    finally:
        rollout_func.close()
        vllm.behavior.update(weight_version="default")
    assert out["weight_version"] == ["step-5", "step-5"]
    assert out["weight_versions"] == [["step-5"], ["step-5"]]
    assert out["stale"] == [False, False]


@pytest.mark.parametrize("policy", ["drop", "flag"])
def test_max_staleness_drops_or_flags_rows_behind_the_trainer(server, fake, policy):
    vllm, _ = fake
    url, _ = server
    vllm.behavior.update(weight_version="step-1")
    rollout_func = make_rollout_func(url, limits={"max_turns": 2}, max_staleness=2, stale=policy)
    try:
        fresh = rollout_func([CHAIN], _Trainer(3))  # 2 steps behind: within the bound
        old = rollout_func([CHAIN, CHAIN], _Trainer(4))  # 3 steps behind
    finally:
        rollout_func.close()
        vllm.behavior.update(weight_version="default")
    check_trl_contract(old, 2)
    assert fresh["stale"] == [False] and sum(fresh["env_mask"][0]) > 0
    assert old["stale"] == [True, True] and old["weight_version"] == ["step-1", "step-1"]
    if policy == "drop":
        assert all(sum(m) == 0 for m in old["env_mask"]) and old["reward"] == [None, None]
        assert "3 step(s) behind (max_staleness=2)" in old["error"][0]
    else:
        assert all(sum(m) > 0 for m in old["env_mask"])
    stats = rollout_func.stats
    assert stats["samples"] == 3 and stats["stale"] == 2
    assert stats["dropped"] == (2 if policy == "drop" else 0)


def test_a_row_of_no_known_version_counts_as_stale(server, fake):
    vllm, _ = fake
    url, _ = server
    vllm.behavior.update(weight_version="not-a-step")
    rollout_func = make_rollout_func(url, limits={"max_turns": 2}, max_staleness=5)
    try:
        out = rollout_func([CHAIN], _Trainer(0))
    finally:
        rollout_func.close()
        vllm.behavior.update(weight_version="default")
    assert out["stale"] == [True] and "of no known step" in out["error"][0]
    assert rollout_func.stats["unknown_version"] == 1


def test_policy_step_reads_the_step_a_version_names():
    assert [policy_step(v) for v in ("step-12", "12", "ckpt_7", "default")] == [12, 12, 7, 0]
    assert policy_step("latest") is None and policy_step(None) is None


def test_an_announced_version_reaches_rollouts_on_an_engine_without_weight_info():
    quiet = FakeVLLM(tool_call_every_turn=True, weight_version=None)
    with serve_in_thread(quiet.app) as engine_root:
        state = ServerState(default_llm=LLMSpec(url=engine_root + "/v1"))
        with serve_in_thread(http_app(build_server(state), token="tok")) as root:
            headers = {"Authorization": "Bearer tok"}
            rollout_func = make_rollout_func(
                root + "/mcp", headers=headers, limits={"max_turns": 1}
            )
            try:
                before = rollout_func([CHAIN], None)
                said = announce_weight_version(root + "/mcp", "step-9", headers=headers)
                after = rollout_func([CHAIN], None)
                with pytest.raises(RuntimeError, match="401"):
                    announce_weight_version(root + "/mcp", "step-10")  # no token
            finally:
                rollout_func.close()
    assert before["weight_version"] == [None]
    assert (
        said["weight_version"] == "step-9"
        and said["endpoints"][0]["engine_reports_version"] is False
    )
    assert after["weight_version"] == ["step-9"]
