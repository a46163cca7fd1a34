"""Shared fixtures: anyio's pytest plugin (asyncio) and one real reference engine per session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# huggingface_hub fetches an agent registry from huggingface.co for its User-Agent unless
# telemetry is off (read at import): tests never reach the internet, subprocesses included.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import pytest

from rollwire.engine.model import ReferenceModel
from rollwire.engine.server import create_engine_app
from tests.fakes.serve import serve_in_thread

SERVED = "SmolLM2-135M-Instruct"

# The Docker daemon `.ci/system` starts (through .ci/docker) listens on its own socket: with
# $DOCKER_HOST unset, the tests and the processes they spawn use it when it is there.
_CI_DOCKER_SOCKET = (
    Path(os.environ.get("ROLLWIRE_DOCKER_RUN", "/run/rollwire-docker")) / "docker.sock"
)
if "DOCKER_HOST" not in os.environ and _CI_DOCKER_SOCKET.is_socket():
    os.environ["DOCKER_HOST"] = f"unix://{_CI_DOCKER_SOCKET}"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def reference_model() -> ReferenceModel:
    """SmolLM2-135M-Instruct on CPU through llama.cpp (loads in well under a second)."""
    return ReferenceModel(n_ctx=4096)


@pytest.fixture(scope="session")
def engine_url(reference_model: ReferenceModel) -> Iterator[str]:
    with serve_in_thread(create_engine_app(reference_model, served_name=SERVED)) as url:
        yield url


@pytest.fixture(scope="session")
def raw_engine_url(reference_model: ReferenceModel) -> Iterator[str]:
    app = create_engine_app(reference_model, served_name=SERVED, raw_logprobs=True)
    with serve_in_thread(app) as url:
        yield url


@pytest.fixture(scope="session")
def converted_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded SmolLM2 GGUF as a Hugging Face folder, written by ``rollwire convert``
    itself (~35 s; needs the train extra)."""
    out = tmp_path_factory.mktemp("smollm2-hf")
    from rollwire.server.cli import main

    assert main(["convert", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="session")
def hf_tokenizer(converted_dir: Path) -> Any:
    """The converted folder's tokenizer, loaded by plain transformers."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(converted_dir)
