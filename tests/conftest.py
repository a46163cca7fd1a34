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


# Under pytest-xdist (the README's test line runs two workers), the tests of one file share a
# worker, so a module's fixtures (an engine, a server, a cluster) start once; and the tests that
# drive one machine-wide resource share one too, so two of them never contend for it: the Docker
# daemon (image builds and tags), the Ray clusters on loopback. (xdist's own `xdist_group` marks
# do nothing under pytest 9: xdist renames `item._nodeid`, which pytest 9 no longer reads.)
SHARED_RESOURCES = {
    "docker": (
        "tests/harbor/test_docker_rollout.py",
        "tests/harbor/test_docker_sandbox.py",
        "tests/harbor/test_images.py",
    ),
    "ray": (
        "tests/scale/",
        "tests/packaging/test_extras.py::test_extra_installs_alone_and_works_alone[ray]",
    ),
}


def worker_group(nodeid: str) -> str:
    """The unit xdist hands to one worker: the test's resource, else its file."""
    for resource, prefixes in SHARED_RESOURCES.items():
        if nodeid.startswith(prefixes):
            return resource
    return nodeid.split("::", 1)[0]


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # pragma: no cover - xdist is in the dev group
    pass
else:

    class _ByResource(LoadScopeScheduling):
        """xdist's scope scheduling with :func:`worker_group` as the scope."""

        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> _ByResource:
        # Units go out largest (most tests) first, xdist's default. Longest first was tried and
        # measured slower: the longest units are the CPU-heavy ones, and two of them at once on
        # two cores each take twice as long (docs/ci-time.md).
        return _ByResource(config, log)
