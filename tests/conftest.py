"""Shared fixtures: anyio's pytest plugin (asyncio) and one real reference engine per session."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# huggingface_hub fetches an agent registry from huggingface.co for its User-Agent unless
# telemetry is off (read at import): tests never reach the internet, subprocesses included.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import anyio
import anyio.from_thread
import pytest

from rollwire.engine.model import ReferenceModel
from rollwire.engine.process import EngineDied, EngineProcess, EngineSpec, running_engine

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


@contextlib.contextmanager
def engine_in_child(spec: EngineSpec) -> Iterator[EngineProcess]:
    """The reference engine in a child process, as the CLI runs it
    (:func:`rollwire.engine.process.running_engine`): a native crash ends that process, not the
    test worker, and fails the tests that use it with the engine's one line."""
    with anyio.from_thread.start_blocking_portal() as portal:
        try:
            with portal.wrap_async_context_manager(running_engine(spec)) as engine:
                yield engine
        except EngineDied as exc:
            pytest.fail(str(exc), pytrace=False)
        if engine.death is not None:
            pytest.fail(f"{engine.death} (during the tests that used it)", pytrace=False)


@pytest.fixture(scope="session")
def engine_url() -> Iterator[str]:
    """SmolLM2-135M-Instruct on CPU through llama.cpp, in a child process (``/v1`` routes)."""
    with engine_in_child(EngineSpec(n_ctx=4096, served_name=SERVED)) as engine:
        yield engine.url


@pytest.fixture(scope="session")
def raw_engine_url() -> Iterator[str]:
    spec = EngineSpec(n_ctx=4096, served_name=SERVED, raw_logprobs=True)
    with engine_in_child(spec) as engine:
        yield engine.url


@pytest.fixture(scope="session")
def reference_model(engine_url: str) -> ReferenceModel:
    """The same model in this process, for tests of the model's own methods (loads in well
    under a second). It asks for ``engine_url`` first: that child has loaded the same library
    and decoded a token, so a build that crashes on this CPU fails here with the engine's one
    line instead of taking the test worker down."""
    return ReferenceModel(n_ctx=4096)


@pytest.fixture(scope="session")
def converted_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded SmolLM2 GGUF as a Hugging Face folder, written by ``rollwire convert``
    itself (~45 s; needs the train extra). Once per run: under xdist the workers share it (the
    first one there converts, under a lock, into a folder it renames into place when whole; the
    other waits). Tests read it and never write into it."""
    from rollwire.server.cli import main

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's base temp, above each worker's own
    out = root / "smollm2-hf"
    with open(root / "smollm2-hf.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "config.json").is_file():
            partial = root / "smollm2-hf.partial"
            shutil.rmtree(partial, ignore_errors=True)
            assert main(["convert", "--out", str(partial)]) == 0
            partial.rename(out)
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
        "tests/chaos/test_chaos.py",  # its own loopback cluster: never beside another
        "tests/packaging/test_extras.py::test_extra_installs_alone_and_works_alone[ray]",
    ),
}


def worker_group(nodeid: str) -> str:
    """The unit xdist hands to one worker: the test's resource, else its file."""
    for resource, prefixes in SHARED_RESOURCES.items():
        if nodeid.startswith(prefixes):
            return resource
    return nodeid.split("::", 1)[0]


#: The longest units, longest first: xdist hands them out before the rest, so the run does not
#: end with one worker on a long file while the other is idle. The order is roughly that of
#: docs/ci-time.md's unit tables (the SFT warm-up is by far the longest there, pinned or not).
#: It only pays because of the pinning: unpinned, the longest units are the CPU-heavy ones, and
#: two of them side by side on two shared cores each took twice as long.
LONGEST_FIRST = (
    "tests/examples/test_sft_warmup.py",
    "tests/engine/test_weight_sync.py",
    "tests/e2e/test_vllm_weight_sync.py",
    "tests/test_cli.py",
    "tests/engine/test_hf_engine.py",
    "tests/packaging/test_extras.py",
    "tests/packaging/test_wheel.py",
    "tests/clients/test_client_matrix.py",
    "tests/engine/test_engine.py",
    "tests/test_demo.py",
    "docker",
    "ray",
)


def _rank(item: pytest.Item) -> int:
    group = worker_group(item.nodeid)
    return LONGEST_FIRST.index(group) if group in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker, the longest units first (a stable sort: within a unit, and among the
    rest, the order stays the collection's). A run without xdist keeps the collection's order."""
    if hasattr(config, "workerinput"):
        items.sort(key=_rank)


#: The CPUs this process could use before any pinning (a worker pins itself at configure time).
STARTING_CPUS: set[int] = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()


def worker_cpus(worker: str, workers: int, cpus: set[int]) -> set[int] | None:
    """The CPUs xdist worker ``gwN`` of ``workers`` runs on: every ``workers``-th of ``cpus``
    from its index, so the workers never share a core. ``None`` (leave it unpinned) where the
    name is not a worker's or there are fewer CPUs than workers.

    Pinned, each worker's engines, trainers and servers (which inherit the mask, and size their
    thread pools to it: ``rollwire.engine.model.usable_cpus``, torch's default) run as on a
    machine of their own. Unpinned, two workers' llama.cpp and torch thread pools, each as wide
    as the machine, spun against each other: the SFT warm-up took 1,253 s beside the other
    worker, against 697 s pinned beside it (docs/ci-time.md)."""
    if not worker.startswith("gw") or not worker[2:].isdigit() or len(cpus) < workers:
        return None
    return set(sorted(cpus)[int(worker[2:]) :: workers])


def _pin_this_process(mask: set[int]) -> None:
    """Every thread of this process (execnet's included) onto ``mask``: Linux applies an
    affinity to one thread, and a thread or child process inherits its creator's."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(tid), mask)


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if not hasattr(os, "sched_setaffinity") or not worker:
        return
    mask = worker_cpus(worker, workers, os.sched_getaffinity(0))
    if mask is not None:
        _pin_this_process(mask)


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
        config.option.loadscopereorder = False  # the workers' order (longest first) stands
        return _ByResource(config, log)
