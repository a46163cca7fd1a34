"""run_env_rollout end to end: tool loop -> in-process capture proxy -> fake vLLM; results, never raises."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from rollwire.capture.proxy import CaptureProxy, ProxyConfig
from rollwire.capture.rollout import CaptureLevel
from rollwire.capture.upstream import Upstream
from rollwire.harnesses.envs import registry
from rollwire.harnesses.envs.registry import TaskError, TaskInfo, list_tasks, parse_task
from rollwire.harnesses.envs.run import run_env_rollout
from rollwire.sessions.toolloop import LoopLimits
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM
from tests.sessions.conftest import CounterEnv, counter_session

pytestmark = pytest.mark.anyio


class CounterAdapter:
    family = "counter"

    def list_tasks(self) -> list[TaskInfo]:
        return [TaskInfo(task="counter:to3", family="counter", description="reach 3")]

    def make_session(self, name: str, config: dict[str, Any], *, seed: int | None, episode_id: str):
        if name != "to3":
            raise TaskError(f"unknown counter task {name!r}")
        return counter_session(CounterEnv(fail_on_step=config.get("fail_on_step")))


@pytest.fixture(autouse=True)
def counter_family(monkeypatch):
    monkeypatch.setitem(registry.ADAPTERS, "counter", f"{__name__}:CounterAdapter")


@pytest.fixture
async def proxy(request) -> AsyncIterator[CaptureProxy]:
    fake = FakeVLLM(**getattr(request, "param", {}))
    with serve_in_thread(fake.app) as url:
        upstream = Upstream(url)
        proxy = CaptureProxy(
            ProxyConfig(llm_url=url, model="smol", capture_level=CaptureLevel.TOKENS),
            upstream=upstream,
        )
        proxy.fake = fake  # type: ignore[attr-defined]
        yield proxy
        await upstream.aclose()


def test_task_reference_round_trips():
    assert parse_task("reasoning_gym:chain_sum") == ("reasoning_gym", "chain_sum")
    with pytest.raises(TaskError, match="family:name"):
        parse_task("chain_sum")


def test_unknown_family_is_reported_not_raised_when_listing():
    listing = list_tasks(["counter", "nope"])
    assert [t.task for t in listing.tasks] == ["counter:to3"]
    assert "unknown env family 'nope'" in listing.unavailable["nope"]


@pytest.mark.parametrize("proxy", [{"tool_call_every_turn": True}], indirect=True)
async def test_episode_through_the_proxy_is_a_trainable_result(proxy):
    out = await run_env_rollout(
        "counter:to3", proxy=proxy, seed=1, limits=LoopLimits(max_turns=3), include_sequences=True
    )
    result, doc = out.result, out.document
    assert result.ok, result
    assert result.n_trainable_tokens > 0 and result.rollout_type == "train"
    # the fake calls add(n) with n in 1..9 (seeded), so the env may finish in one move
    assert result.n_tool_calls >= 1 and result.reward in (None, 1.0)
    assert (result.stop_reason == "done") == (result.reward == 1.0)
    (seq,) = [s for s in doc.sequences if s.trainable]
    # only the sampled spans are targets: tool output and prompts are masked
    ones = {i for i, m in enumerate(seq.loss_mask) if m}
    spans = {i for s in seq.turn_spans for i in range(s.start, s.end)}
    assert ones <= spans
    assert proxy.sessions.all() == []  # the capture session is closed after export


async def test_model_that_never_calls_a_tool_ends_with_no_verdict(proxy):
    result = (await run_env_rollout("counter:to3", proxy=proxy, seed=1)).result
    assert result.stop_reason == "no_tool_call" and result.reward is None and result.ok


async def test_unknown_task_is_a_failed_result_naming_it(proxy):
    result = (await run_env_rollout("counter:to9", proxy=proxy)).result
    assert not result.ok and "'to9'" in result.error and result.reward is None


@pytest.mark.parametrize("proxy", [{"tool_call_every_turn": True}], indirect=True)
async def test_env_crash_mid_episode_is_a_result_with_no_reward(proxy, monkeypatch):
    monkeypatch.setattr(
        CounterEnv, "step", lambda self, action: (_ for _ in ()).throw(RuntimeError("boom"))
    )
    out = await run_env_rollout("counter:to3", proxy=proxy, seed=1)
    assert out.result.reward is None
    assert any("boom" in (f.message or "") for f in out.result.findings)


@pytest.mark.parametrize(
    "proxy", [{"tool_call_every_turn": True, "shift_logprobs": True}], indirect=True
)
async def test_bad_capture_data_is_a_model_error_result_not_a_crash(proxy):
    """The proxy refuses a reply whose ids and logprobs disagree (502, on_bad_data="error"): the
    tool loop ends with a model error naming the finding, and nothing is trained on."""
    out = await run_env_rollout("counter:to3", proxy=proxy, seed=1)
    result = out.result
    assert not result.ok and result.stop_reason == "model_error"
    assert "upstream reply unusable for training: logprob_id_mismatch" in result.error
    assert any(
        f.code == "model_error" and "logprob_id_mismatch" in f.message for f in result.findings
    )
    assert result.n_trainable_tokens == 0 and out.document.turns == []


async def test_unreachable_model_is_a_failed_result():
    proxy = CaptureProxy(
        ProxyConfig(llm_url="http://127.0.0.1:9", model="smol", capture_level=CaptureLevel.TOKENS),
        upstream=Upstream("http://127.0.0.1:9"),
    )
    result = (await run_env_rollout("counter:to3", proxy=proxy)).result
    assert not result.ok and "never reached" in result.error


async def test_adapter_that_raises_on_start_is_a_failed_result(proxy, monkeypatch):
    monkeypatch.setattr(CounterAdapter, "make_session", lambda self, *a, **k: 1 / 0)
    result = (await run_env_rollout("counter:to3", proxy=proxy)).result
    assert not result.ok and "ZeroDivisionError" in result.error
