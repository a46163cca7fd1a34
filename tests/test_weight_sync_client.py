"""``rollwire.trl.WeightSync`` against the real torch engine: a trainer's model pushed by disk
and by HTTP, failures that leave the engine serving, vLLM's reload refused for a folder that
does not fit, and ``make_rollout_func(weight_sync=...)`` stamping rows with the trainer's step.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollwire.engine.server import create_engine_app
from rollwire.server.mcp_app import ServerState, build_server, http_app
from rollwire.tools.rollouts import LLMSpec
from rollwire.trl import WeightSync, WeightSyncError, make_rollout_func
from tests.conftest import SERVED
from tests.fakes.serve import serve_in_thread

pytestmark = pytest.mark.slow

KEY = "sync-key"
PROMPT = [{"role": "user", "content": "Name three rivers."}]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("weights")


@pytest.fixture(scope="module")
def engine(converted_dir: Path, root: Path) -> Iterator[str]:
    from rollwire.engine.hf import HFModel

    model = HFModel(converted_dir, n_ctx=2048)
    app = create_engine_app(model, served_name=SERVED, admin_key=KEY, weights_roots=[root])
    with serve_in_thread(app) as url:
        yield url


@pytest.fixture(scope="module")
def trainer_model(converted_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(converted_dir, dtype=torch.float32)


@pytest.fixture
def model(trainer_model: Any, engine: str, root: Path) -> Iterator[Any]:
    """The trainer's model; after the test both it and the engine hold the original weights."""
    saved = trainer_model.model.norm.weight.detach().clone()
    yield trainer_model
    restore(trainer_model, saved)
    sync = WeightSync(engine, transfer="disk", admin_key=KEY, checkpoint_dir=root / "restore")
    httpx.post(f"{engine}/resume", headers={"Authorization": f"Bearer {KEY}"})
    sync.push(trainer_model, "original")
    sync.close()


def nudge(model: Any, factor: float = 1.3) -> None:
    import torch

    with torch.no_grad():
        model.model.norm.weight.mul_(factor)


def restore(model: Any, saved: Any) -> None:
    """Put back the exact tensor (multiplying by 1/1.3 again leaves float32 rounding behind)."""
    import torch

    with torch.no_grad():
        model.model.norm.weight.copy_(saved)


def greedy_logprobs(url: str) -> list[float]:
    body = {"model": SERVED, "messages": PROMPT, "max_tokens": 6, "temperature": 0}
    reply = httpx.post(f"{url}/v1/chat/completions", json={**body, "logprobs": True}, timeout=300)
    return [e["logprob"] for e in reply.json()["choices"][0]["logprobs"]["content"]]


def version(url: str) -> str:
    return httpx.get(f"{url}/weight_info").json()["weight_version"]


@pytest.mark.parametrize("transfer", ["disk", "http"])
def test_a_push_puts_the_trainers_weights_into_the_engine(engine, model, root, transfer):
    before = greedy_logprobs(engine)
    sync = WeightSync(engine, transfer=transfer, admin_key=KEY, checkpoint_dir=root / transfer)
    saved = model.model.norm.weight.detach().clone()
    try:
        nudge(model)
        first = sync.push(model, "step-1")
        moved = greedy_logprobs(engine)
        restore(model, saved)
        sync.push(model, "step-2")
    finally:
        sync.close()
    assert version(engine) == "step-2"
    assert max(abs(a - b) for a, b in zip(before, moved, strict=False)) > 0.01
    assert greedy_logprobs(engine) == pytest.approx(before, abs=1e-6)  # the original weights back
    assert first.transfer == transfer and first.bytes > 500_000_000 and first.paused_s > 0
    if transfer == "disk":  # the engine read it from disk: only the latest push is kept
        assert sorted(p.name for p in (root / "disk").iterdir()) == ["step-2"]


def test_a_failed_push_raises_and_the_engine_goes_on_serving(engine, model, root, tmp_path):
    served = version(engine)
    wrong_key = WeightSync(engine, transfer="http", admin_key="nope")
    with pytest.raises(WeightSyncError, match="401"):
        wrong_key.push(model, "never")
    wrong_key.close()
    outside = WeightSync(engine, transfer="disk", admin_key=KEY, checkpoint_dir=tmp_path)
    with pytest.raises(WeightSyncError, match="outside the engine's weights roots"):
        outside.push(model, "never")
    outside.close()
    assert version(engine) == served
    assert httpx.get(f"{engine}/is_paused").json() == {"is_paused": False}  # resumed


class _WrongShapes:
    """A 'model' whose checkpoint does not fit the served one (one tensor of another shape)."""

    def __init__(self, source: Path) -> None:
        self.source = source

    def save_pretrained(self, folder: Path, **_: Any) -> None:
        import torch
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(self.source / "model.safetensors"))
        tensors["model.norm.weight"] = torch.zeros(5)
        Path(folder).mkdir(parents=True)
        save_file(tensors, str(Path(folder) / "model.safetensors"))


def test_vllm_reload_is_not_asked_for_a_folder_that_does_not_fit(engine, converted_dir, root):
    sync = WeightSync(engine, transfer="vllm_reload", admin_key=KEY, checkpoint_dir=root / "vllm")
    try:
        with pytest.raises(WeightSyncError, match=r"does not fit the served .*shape \[5\]"):
            sync.push(_WrongShapes(converted_dir), "bad")
    finally:
        sync.close()
    assert httpx.get(f"{engine}/is_paused").json() == {"is_paused": False}  # never paused


class _Trainer:
    """What rollout_func reads of a TRL trainer: its step and its model."""

    def __init__(self, model: Any, step: int) -> None:
        self.model = model
        self.state = type("State", (), {"global_step": step})()


def test_rollout_func_pushes_each_new_step_before_its_rollouts(engine, model, root):
    state = ServerState(default_llm=LLMSpec(url=engine + "/v1"))
    sync = WeightSync(engine, transfer="disk", admin_key=KEY, checkpoint_dir=root / "hook")
    limits, sampling = {"max_turns": 1}, {"max_tokens": 8}
    try:
        with serve_in_thread(http_app(build_server(state))) as server:
            rollout_func = make_rollout_func(
                server + "/mcp", limits=limits, sampling=sampling, weight_sync=sync
            )
            try:
                first = rollout_func(["reasoning_gym:chain_sum"], _Trainer(model, 0))
                again = rollout_func(["reasoning_gym:chain_sum"], _Trainer(model, 0))
                nudge(model)
                second = rollout_func(["reasoning_gym:chain_sum"], _Trainer(model, 1))
            finally:
                rollout_func.close()
    finally:
        sync.close()
        shutil.rmtree(root / "hook", ignore_errors=True)
    assert first["weight_version"] == again["weight_version"] == ["step-0"]
    assert second["weight_version"] == ["step-1"]
    assert [r.version for r in sync.history] == ["step-0", "step-1"]  # one push per step
    assert rollout_func.stats["pushes"] == 2
