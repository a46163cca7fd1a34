"""The ``docker`` sandbox: a Harbor environment on a real Docker Engine, through its HTTP API.

Harbor's own docker environment drives ``docker compose`` (v2), which Debian does not ship; this
one speaks the Engine API with the official SDK (``docker``, docker-py) and needs nothing else on
the host. The daemon is found the standard way (:func:`.sandboxes.docker_endpoint`:
``$DOCKER_HOST``, else the current context, else the default socket) unless ``docker_host`` is
given.

Image: the task's ``environment/`` directory is the build context and the daemon builds its
Dockerfile, so every instruction is honoured (``RUN`` included). The image is tagged
``rollwire-task/<task>:<hash>``, the hash covering the context's content and the ids of the base
images, and reused while that tag exists (``force_build`` rebuilds it, without the layer cache).
rollwire never pulls: every ``FROM`` (and ``COPY --from``) image must already be in the daemon,
else :class:`MissingBaseImageError` says so, and how to provide it, before any build starts.
A prebuilt ``docker_image`` task needs its image in the daemon the same way. The build honours
the task's ``build_timeout_sec``: at the deadline the connection is cut, the daemon cancels the
build, and :class:`BuildTimeoutError` is raised.

Container: one per trial, kept alive by a shell loop (``sh`` and ``sleep`` must be in the image,
as for Harbor's ``sleep infinity``), labelled ``rollwire.sandbox=1`` and ``rollwire.owner=<owner>``,
with the task's workdir, environment, cpu/memory limits (and a pids limit) and the trial's host
mounts as Harbor's docker environment makes them (the log dirs with ``auto_mounting=True``). No
network unless asked (``network=True``, and then none either when the task asks for none).
It is removed on ``stop`` and whenever ``start`` fails or is cancelled (teardown is shielded
from cancellation); a container left by a process that died is swept at the next start.

``exec`` runs ``bash -c`` (``sh -c`` in images without bash) through the exec API, off the
event loop, stdout and stderr apart. Every exec carries a marker in its environment: on timeout
(:class:`.local.ExecTimeoutError`) or cancellation a second exec kills every process that has
it, so what the command started in the background dies too.

Not done here: GPUs, network allowlists, compose tasks, Windows containers, storage limits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import hashlib
import itertools
import json
import logging
import os
import re
import select
import shlex
import socket
import struct
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import IO, Any, override
from urllib.parse import urlsplit

import anyio
from harbor.environments.base import (
    BaseEnvironment,
    ExecResult,
    SandboxBuildFailedError,
    transfer_tar_filter,
)
from harbor.environments.capabilities import (
    EnvironmentCapabilities,
    EnvironmentResourceCapabilities,
)
from harbor.environments.definition import (
    require_agent_environment_definition,
    should_use_prebuilt_docker_image,
)
from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
from harbor.models.task.config import NetworkMode, TaskOS
from harbor.models.trial.config import ResourceMode
from harbor.models.trial.paths import TrialPaths

from rollwire.extras import install_hint
from rollwire.harnesses.harbor.dockerfile import (
    UnsupportedDockerfileError,
    _instructions,
    _words,
)
from rollwire.harnesses.harbor.gate import GateSlot
from rollwire.harnesses.harbor.local import (
    _LIVE,
    EXEC_MARKER,
    ExecTimeoutError,
    _start_time,
    _Tail,
)
from rollwire.harnesses.harbor.sandboxes import docker_endpoint, docker_request

try:
    import docker
    import docker.errors
    import docker.types
    import docker.utils

    _HAS_DOCKER = True
except ImportError:  # the harbor extra brings it; docker_problem() says so
    docker = None  # type: ignore[assignment]
    _HAS_DOCKER = False

__all__ = [
    "BuildTimeoutError",
    "DockerBuildError",
    "DockerEnvironment",
    "DockerUnavailableError",
    "ExecExitUnknownError",
    "ExecTimeoutError",
    "MissingBaseImageError",
    "docker_client",
    "docker_problem",
]

TYPE = "docker"
IMAGE_REPOSITORY = "rollwire-task"  # images are rollwire-task/<task>:<content hash>
SANDBOX_LABEL = "rollwire.sandbox"  # "1" on every container this module makes
OWNER_LABEL = "rollwire.owner"  # the ``owner`` kwarg ("" when none)
SESSION_LABEL = "rollwire.session"  # Harbor's session id
PROCESS_LABEL = "rollwire.process"  # host:pid:start-time of the process that made it (sweeps)
BASE_IMAGE_COMMAND = "rollwire images build debian:bookworm-slim"
SDK_HINT = f"{install_hint('harbor')} (the Docker SDK for Python, docker>=7.1)"
DEFAULT_PIDS_LIMIT = 4096
PING_TIMEOUT_SEC = 2.0
# pid 1 of every sandbox: sleeps until killed; TERM (docker stop) ends it at once.
KEEPALIVE = ["sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]

_STDOUT, _STDERR = 1, 2
_READ_CHUNK = 64 * 1024
_POLL_SEC = 0.1  # how often a blocked reader looks at its stop flag
_PIPE_GRACE_SEC = 0.5  # quiet time after the command's exit before its stream is let go
_EXIT_CHECK_MAX_SEC = 1.0  # an idle exec is asked "has it ended?" at most this far apart
_EXIT_RECORD_SEC = 10.0  # how long an exec whose stream ended may take to report its exit code
_ABANDON_WAIT_SEC = 30.0  # how long a cut build's thread is waited for before it is left
_ROOT_USERS = ("0", "root", "0:0", "root:root")
_GO_MODE_DIR = 1 << 31  # Go's os.ModeDir, in the archive API's stat header
# Kills every process whose environment holds ROLLWIRE_EXEC=<marker>. Only cat, kill and a
# POSIX sh are needed: a NUL-free $(cat environ) is the variables run together, and markers
# have a fixed length, so one cannot match another.
_KILL_SCRIPT = r"""m="ROLLWIRE_EXEC=$1"; i=0
while [ "$i" -lt 50 ]; do
  found=
  for d in /proc/[0-9]*; do
    case "$(cat "$d/environ" 2>/dev/null)" in *"$m"*) found="$found ${d#/proc/}";; esac
  done
  [ -z "$found" ] && exit 0
  kill -9 $found 2>/dev/null
  i=$((i + 1)); sleep 0.05 2>/dev/null || sleep 1
done
exit 1"""

logger = logging.getLogger(__name__)


class DockerUnavailableError(RuntimeError):
    """No Docker daemon (or no Docker SDK) to run the sandbox; the message says which and why."""


class MissingBaseImageError(RuntimeError):
    """An image the task needs is not in the Docker daemon, which rollwire never pulls from."""

    def __init__(self, message: str, images: Sequence[str]):
        super().__init__(message)
        self.images = tuple(images)


class DockerBuildError(SandboxBuildFailedError):
    """The daemon failed to build the task's image; the message carries its error lines."""


class BuildTimeoutError(DockerBuildError, TimeoutError):
    """The build ran past the task's ``build_timeout_sec``; it was abandoned and cancelled."""


class ExecExitUnknownError(RuntimeError):
    """An exec's output stream ended but the daemon never said how it exited: what ran there
    (a verifier writing its reward file, say) cannot be taken as finished."""


# --- the daemon ----------------------------------------------------------------------------


def _endpoint(docker_host: str | None) -> tuple[str, str]:
    return (docker_host, "docker_host") if docker_host else docker_endpoint()


def _where(endpoint: str) -> str:
    return urlsplit(endpoint).path if endpoint.startswith("unix://") else endpoint


def docker_problem(docker_host: str | None = None, timeout: float = PING_TIMEOUT_SEC) -> str | None:
    """Why the docker sandbox cannot run here (None when it can): no SDK, or no daemon answers.

    One ping of the daemon's endpoint, bounded by ``timeout``; never raises.
    """
    if not _HAS_DOCKER:
        return f"the Docker SDK for Python is not installed: {SDK_HINT}"
    endpoint, source = _endpoint(docker_host)
    try:
        scheme = urlsplit(endpoint).scheme
        tls = os.environ.get("DOCKER_TLS_VERIFY") or urlsplit(endpoint).port == 2376
        if scheme == "unix" or (scheme == "tcp" and not tls):
            body, detail = docker_request(endpoint, "/_ping", timeout=timeout)
            if body is None:
                return (
                    f"no Docker daemon answers at {_where(endpoint)} ({source}: {detail}); "
                    "start one, or point $DOCKER_HOST at one"
                )
            return None
        client = _client(endpoint, timeout=timeout)  # TLS, ssh: let the SDK speak it
        try:
            client.ping()
        finally:
            client.close()
        return None
    except Exception as exc:
        return f"no Docker daemon answers at {endpoint} ({source}: {type(exc).__name__}: {exc})"


def docker_client(docker_host: str | None = None, timeout: float = 300.0) -> Any:
    """An SDK client for the daemon ``docker_host`` names, else the standard one."""
    if not _HAS_DOCKER:
        raise DockerUnavailableError(f"the Docker SDK for Python is not installed: {SDK_HINT}")
    return _client(_endpoint(docker_host)[0], timeout=timeout)


def _client(endpoint: str, timeout: float = 300.0) -> Any:
    """An SDK client for ``endpoint``, with $DOCKER_TLS_VERIFY/$DOCKER_CERT_PATH honoured."""
    assert docker is not None
    kwargs: dict[str, Any] = {}
    if os.environ.get("DOCKER_TLS_VERIFY") or os.environ.get("DOCKER_CERT_PATH"):
        with contextlib.suppress(Exception):
            kwargs = docker.utils.kwargs_from_env()
    kwargs["base_url"] = endpoint
    return docker.DockerClient(version="auto", timeout=timeout, **kwargs)


# --- threads and cancellation ----------------------------------------------------------------

_EXECUTOR: concurrent.futures.ThreadPoolExecutor | None = None
_EXECUTOR_LOCK = threading.Lock()


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    """The threads blocking Docker calls run in: many, since every running exec holds one.

    Not asyncio's default executor (min(32, cpus + 4) threads): a few long execs would starve
    every other ``to_thread`` in the process.
    """
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = concurrent.futures.ThreadPoolExecutor(
                max_workers=256, thread_name_prefix="rollwire-docker"
            )
        return _EXECUTOR


def _spawn[T](fn: Callable[..., T], *args: Any, **kwargs: Any) -> asyncio.Future[T]:
    loop = asyncio.get_running_loop()
    return loop.run_in_executor(_executor(), functools.partial(fn, *args, **kwargs))


async def _finish[T](aw: Awaitable[T]) -> T:
    """Await ``aw`` to its end even if this task is cancelled meanwhile, once or many times.

    A cancellation that arrived is raised afterwards. (``anyio.CancelScope(shield=True)`` holds
    off anyio's cancel scopes but not a plain ``Task.cancel()``, which Harbor uses.)
    """
    task = asyncio.ensure_future(aw)
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if not task.cancelled() and task.exception() is not None:
            logger.debug("finished after a cancellation with %r", task.exception())
        raise asyncio.CancelledError
    return task.result()


async def _in_thread[T](fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a short blocking call in a thread; on cancellation it still completes first."""
    return await _finish(_spawn(fn, *args, **kwargs))


# --- the Dockerfile's images -----------------------------------------------------------------


def required_images(environment_dir: Path) -> list[tuple[str, int]]:
    """(image, line) for each image the Dockerfile needs from the daemon, in order.

    ``FROM`` images and ``COPY --from`` images; build stages, stage numbers and ``scratch`` are
    not images. ``ARG``s declared before the first ``FROM`` are substituted (with their
    defaults: rollwire passes no build args); a reference left with ``$`` in it is skipped.
    """
    path = environment_dir / "Dockerfile"
    text = path.read_text()
    try:
        instructions = _instructions(text, path)
    except UnsupportedDockerfileError:  # an escape directive: read FROM lines plainly
        return [
            (m.group(1), n)
            for n, line in enumerate(text.splitlines(), start=1)
            if (m := re.match(r"\s*FROM\s+(?:--\S+\s+)*(\S+)", line, re.IGNORECASE))
            and m.group(1).lower() != "scratch"
            and "$" not in m.group(1)
        ]
    args: dict[str, str] = {}
    stages: set[str] = set()
    found: list[tuple[str, int]] = []
    seen_from = False

    def need(image: str, line: int) -> None:
        if image and "$" not in image and image.lower() not in stages | {"scratch"}:
            if image not in (f[0] for f in found):
                found.append((image, line))

    for line, keyword, rest in instructions:
        where = f"{path}:{line}"
        try:
            if keyword == "ARG" and not seen_from:
                for word in _words(rest, args, where):
                    name, _, default = word.partition("=")
                    args.setdefault(name, default)
            elif keyword == "FROM":
                seen_from = True
                words = [w for w in _words(rest, args, where) if not w.startswith("--")]
                if not words:
                    continue
                need(words[0], line)
                if len(words) >= 3 and words[1].lower() == "as":
                    stages.add(words[2].lower())
            elif keyword in ("COPY", "ADD"):
                for word in rest.split():
                    if not word.startswith("--"):
                        break
                    flag, _, value = word.partition("=")
                    if flag == "--from" and not value.isdigit():
                        need(value, line)
        except UnsupportedDockerfileError:
            continue  # the daemon will say what is wrong with the line
    return found


def _missing_message(images: Sequence[tuple[str, str]], endpoint: str) -> str:
    several = len(images) > 1
    lines = [
        f"{'Images' if several else 'An image'} the task needs "
        f"{'are' if several else 'is'} not in the Docker daemon at {_where(endpoint)} "
        "(rollwire never pulls):"
    ]
    lines += [f"  {name} ({where})" for name, where in images]
    lines += [
        f"Provide {'them' if several else 'it'} before the build:",
        "  - load a saved copy: `docker load -i image.tar` (made with `docker save`);",
        "  - or pull it from a registry the daemon can reach: `docker pull <image>`;",
    ]
    for name, _ in images:
        short = name.split("/")[-1]
        if short.startswith("debian:"):
            command = BASE_IMAGE_COMMAND.replace("debian:bookworm-slim", short)
            lines.append(f"  - or, for {name}, build it here offline: `{command}`.")
    return "\n".join(lines)


# --- the environment -------------------------------------------------------------------------


class DockerEnvironment(BaseEnvironment):
    """Harbor's environment interface on a Docker Engine: the ``docker`` sandbox.

    Select it with ``EnvironmentConfig(import_path="rollwire.harnesses.harbor.docker:DockerEnvironment",
    kwargs={...})``. Keyword settings: ``network`` (False: no network at all; True: the daemon's
    bridge network, or the host's when the daemon has none (``dockerd --bridge=none``), unless
    the task asks for none), ``docker_host`` (the daemon's endpoint; default as the docker CLI
    finds it), ``max_output_bytes`` (per stream and exec; the tail is kept), ``pids_limit``
    (processes in the container; None for no limit), ``owner`` (a label, and what
    :func:`.local.settled` waits on).
    """

    def __init__(
        self,
        environment_dir: Path,
        environment_name: str,
        session_id: str,
        trial_paths: TrialPaths,
        task_env_config: TaskEnvironmentConfig,
        *args: Any,
        network: bool = False,
        docker_host: str | None = None,
        max_output_bytes: int = 16 * 1024 * 1024,
        pids_limit: int | None = DEFAULT_PIDS_LIMIT,
        owner: str | None = None,
        gate: str | None = None,
        **kwargs: Any,
    ):
        self._owner = owner
        self._gate = GateSlot(gate, network=network)  # its one way out, when it has one
        self._allow_network = bool(network)
        self._docker_host = docker_host
        self._max_output = int(max_output_bytes)
        self._pids_limit = pids_limit
        self._base_images: list[tuple[str, int]] = []
        self._client: Any = None
        self._endpoint: str | None = None
        self._container_id: str | None = None
        self._container_name: str | None = None
        self._init_pid: int | None = None
        self._image: str | None = None
        self._image_built = False
        self._network_mode: str | None = None
        self._shell = "bash"
        self._token = uuid.uuid4().hex[:12]
        self._seq = itertools.count()
        self._stopped = False
        self._container_started = False
        self._live = False
        super().__init__(
            environment_dir,
            environment_name,
            session_id,
            trial_paths,
            task_env_config,
            *args,
            **kwargs,
        )

    @staticmethod
    @override
    def type() -> str:
        return TYPE

    @property
    @override
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True, mounted=True)

    @classmethod
    @override
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(
            cpu_limit=True,
            cpu_request=True,
            memory_limit=True,
            memory_request=True,
            fractional_cpus=True,
        )

    @classmethod
    @override
    def preflight(cls, docker_host: str | None = None) -> None:
        """Exit with the reason when the docker sandbox cannot run here (Harbor's CLI contract)."""
        problem = docker_problem(docker_host)
        if problem is not None:
            raise SystemExit(problem)

    @override
    def _validate_definition(self) -> None:
        require_agent_environment_definition(
            self.environment_dir, docker_image=self.task_env_config.docker_image
        )
        if (self.environment_dir / "docker-compose.yaml").exists():
            raise ValueError(
                f"{self.environment_dir}/docker-compose.yaml: compose tasks need Harbor's own "
                "docker environment (docker compose); the rollwire docker sandbox runs "
                "single-container tasks"
            )
        if self.os != TaskOS.LINUX:
            raise ValueError(f"the docker sandbox runs Linux containers, not {self.os.value}")
        for mount in self._host_mounts:
            kind = mount["type"]
            if kind == "image" or (kind == "volume" and mount.get("volume", {}).get("subpath")):
                raise ValueError(
                    f"mount {mount['target']!r} ({kind}"
                    f"{' with subpath' if kind == 'volume' else ''}) is not supported by the "
                    "docker sandbox: bind mounts and named volumes only"
                )
        if (self.environment_dir / "Dockerfile").is_file():
            self._base_images = required_images(self.environment_dir)

    # --- what it is ----------------------------------------------------------------------

    @property
    def container_id(self) -> str | None:
        """The container's id (None before start; kept after ``stop(delete=False)``)."""
        return self._container_id

    @property
    def init_pid(self) -> int | None:
        """The host pid of the container's pid 1 (``State.Pid``), as the daemon sees the host.

        Its ``/proc/<pid>/ns/net`` is the container's network namespace. None when not running.
        """
        return self._init_pid

    @property
    def image(self) -> str | None:
        """The image the container runs: ``rollwire-task/<task>:<hash>`` or the prebuilt one."""
        return self._image

    @property
    def image_built(self) -> bool:
        """Whether this start built the image (False: it was in the daemon already)."""
        return self._image_built

    @property
    def network_mode(self) -> str | None:
        """The container's network mode: ``none``, ``bridge`` or ``host``."""
        return self._network_mode

    @property
    def hostname(self) -> str:
        name = re.sub(r"[^a-z0-9-]+", "-", self.environment_name.lower()).strip("-")
        return (name or "sandbox")[:63]

    @property
    def _network_on(self) -> bool:
        return self._allow_network and self.network_policy.network_mode != NetworkMode.NO_NETWORK

    def _api(self) -> Any:
        if self._container_started and (self._stopped or self._container_id is None):
            raise RuntimeError(f"the docker sandbox {self.session_id} has been stopped") from None
        if self._client is None or self._container_id is None or self._stopped:
            # Harbor still collects logs and artifacts after a failed start; the start's own
            # error is the trial's error, so this one says only why there is nothing to read
            # (``from None``: no second copy of that error chained under it).
            raise RuntimeError(
                f"the docker sandbox {self.session_id} never started: nothing to read from it"
            ) from None
        return self._client.api

    # --- lifecycle -----------------------------------------------------------------------

    @override
    async def start(self, force_build: bool) -> None:
        if self._container_id is not None or self._live:
            raise RuntimeError("this docker sandbox is already started")
        self._stopped = False
        _LIVE[self._owner] = _LIVE.get(self._owner, 0) + 1
        self._live = True
        try:
            await _in_thread(self._connect)
            self._image = await self._prepare_image(force_build)
            await _in_thread(_sweep_stale_containers, self._client)
            await _in_thread(self._create_container)
            self._shell = await self._detect_shell()
            await self.ensure_dirs(self._mount_targets(writable_only=True))
            await self._upload_environment_dir_after_start()
            await self._gate.open(self._init_pid)  # needs the daemon on this host
        except BaseException:
            await self._teardown(delete=True)
            raise

    def _connect(self) -> None:
        if not _HAS_DOCKER:
            raise DockerUnavailableError(f"the Docker SDK for Python is not installed: {SDK_HINT}")
        endpoint, source = _endpoint(self._docker_host)
        try:
            self._client = _client(endpoint)
        except Exception as exc:
            problem = docker_problem(self._docker_host)
            raise DockerUnavailableError(
                problem or f"cannot reach the Docker daemon at {endpoint} ({source}): {exc}"
            ) from exc
        self._endpoint = endpoint

    # image -----------------------------------------------------------------------------------

    async def _prepare_image(self, force_build: bool) -> str:
        prebuilt = should_use_prebuilt_docker_image(
            self.environment_dir,
            docker_image=self.task_env_config.docker_image,
            force_build=force_build,
        )
        if prebuilt:
            assert self.task_env_config.docker_image is not None
            await _in_thread(self._check_prebuilt, self.task_env_config.docker_image)
            return self.task_env_config.docker_image
        deadline = self.task_env_config.build_timeout_sec
        stop = threading.Event()
        holder: dict[str, Any] = {}
        future = _spawn(self._ensure_built, force_build, stop, holder)
        try:
            done, _ = await asyncio.wait({future}, timeout=deadline)
        except BaseException:
            _abandon_build(stop, holder)
            with anyio.CancelScope(shield=True):
                await _finish(_settle(future, _ABANDON_WAIT_SEC))
            raise
        if not done:
            _abandon_build(stop, holder)
            with anyio.CancelScope(shield=True):
                await _finish(_settle(future, _ABANDON_WAIT_SEC))
            raise BuildTimeoutError(
                f"building the image for {self.environment_name} ({self.environment_dir}) did "
                f"not finish within {deadline:g} s (the task's [environment].build_timeout_sec); "
                "the build was abandoned and the daemon cancelled it"
                + (f". Last output:\n{holder['tail']}" if holder.get("tail") else "")
            )
        return future.result()

    def _check_prebuilt(self, name: str) -> None:
        try:
            self._client.images.get(name)
        except docker.errors.ImageNotFound:
            assert self._endpoint is not None
            raise MissingBaseImageError(
                _missing_message([(name, "the task's [environment].docker_image")], self._endpoint),
                [name],
            ) from None

    def _ensure_built(self, force_build: bool, stop: threading.Event, holder: dict) -> str:
        """The task's image, built unless its tag is in the daemon already (thread)."""
        client = self._client
        assert self._endpoint is not None
        dockerfile = self.environment_dir / "Dockerfile"
        ids: list[str] = []
        missing: list[tuple[str, str]] = []
        for name, line in self._base_images:
            try:
                ids.append(f"{name}={client.images.get(name).id}")
            except docker.errors.ImageNotFound:
                missing.append((name, f"{dockerfile}:{line}"))
        if missing:
            raise MissingBaseImageError(
                _missing_message(missing, self._endpoint), [m[0] for m in missing]
            )
        digest = hashlib.sha256("\n".join([self.environment_id, *ids]).encode()).hexdigest()
        slug = re.sub(r"[^a-z0-9]+", "-", self.environment_name.lower()).strip("-") or "task"
        tag = f"{IMAGE_REPOSITORY}/{slug[:100]}:{digest[:20]}"
        lock = _build_lock(tag)
        while not lock.acquire(timeout=_POLL_SEC):  # another trial builds the same image
            if stop.is_set():
                raise _Abandoned
        try:
            if stop.is_set():
                raise _Abandoned
            if not force_build:
                with contextlib.suppress(docker.errors.ImageNotFound):
                    client.images.get(tag)
                    return tag
            self._build(tag, force_build, stop, holder)
            self._image_built = True
            return tag
        finally:
            lock.release()

    def _build(self, tag: str, nocache: bool, stop: threading.Event, holder: dict) -> None:
        api = self._client.api
        path = str(self.environment_dir)
        exclude = None
        ignore = self.environment_dir / ".dockerignore"
        if ignore.is_file():
            exclude = [
                line.strip()
                for line in ignore.read_text().splitlines()
                if line.strip() and not line.strip().startswith("#")
            ]
        self.logger.info("building %s from %s", tag, path)
        context = docker.utils.tar(path, exclude=exclude, dockerfile=("Dockerfile", None))
        labels = {"rollwire.task": self.environment_name, "rollwire.environment": path}
        params = {
            "t": tag,
            "rm": True,
            "forcerm": True,
            "nocache": nocache,
            "dockerfile": "Dockerfile",
            "labels": json.dumps(labels),
        }
        try:
            response = api._post(
                api._url("/build"),
                data=context,
                params=params,
                headers={"Content-Type": "application/tar"},
                stream=True,
                timeout=None,
            )
        finally:
            context.close()
        holder["response"] = response
        tail: list[str] = []
        try:
            if stop.is_set():
                raise _Abandoned
            for item in api._stream_helper(response, decode=True):
                if stop.is_set():
                    raise _Abandoned
                if not isinstance(item, dict):
                    continue
                text = item.get("stream") or item.get("status") or ""
                for line in text.splitlines():
                    if line.strip():
                        self.logger.debug("build %s: %s", tag, line)
                        tail.append(line)
                        del tail[:-40]
                        holder["tail"] = "\n".join(tail[-10:])
                if "error" in item or "errorDetail" in item:
                    detail = item.get("errorDetail") or {}
                    error = item.get("error") or detail.get("message") or json.dumps(item)
                    raise DockerBuildError(
                        f"docker build of {self.environment_dir} failed: {error.strip()}\n"
                        "--- the build's last lines ---\n" + "\n".join(tail[-30:])
                    )
        except docker.errors.APIError as exc:
            if stop.is_set():
                raise _Abandoned from exc
            raise DockerBuildError(
                f"docker build of {self.environment_dir} failed: {exc.explanation or exc}"
            ) from exc
        except Exception as exc:
            if stop.is_set() and not isinstance(exc, DockerBuildError):
                raise _Abandoned from exc
            raise
        finally:
            response.close()
        try:
            self._client.images.get(tag)
        except docker.errors.ImageNotFound:
            raise DockerBuildError(
                f"docker build of {self.environment_dir} ended without an image "
                "(the stream was cut?):\n" + "\n".join(tail[-30:])
            ) from None

    # container -------------------------------------------------------------------------------

    def _create_container(self) -> None:
        """Create and start the trial's container (thread)."""
        client = self._client
        assert self._image is not None
        self._network_mode = self._pick_network_mode()
        slug = re.sub(r"[^a-zA-Z0-9_.-]+", "-", self.session_id).strip("-.") or "trial"
        self._container_name = f"rollwire-{slug[:48]}-{self._token[:8]}"
        labels = {
            SANDBOX_LABEL: "1",
            OWNER_LABEL: self._owner or "",
            SESSION_LABEL: self.session_id,
            PROCESS_LABEL: _process_label(),
        }
        options: dict[str, Any] = {
            "command": KEEPALIVE,
            "name": self._container_name,
            "labels": labels,
            "detach": True,
            "environment": self._startup_env(),
            "network_mode": self._network_mode,
            "working_dir": self.task_env_config.workdir or None,
            "pids_limit": self._pids_limit,
            **self._resource_options(),
            **self._mount_options(),
        }
        if self._network_mode != "host":
            options["hostname"] = self.hostname
        container = client.containers.create(self._image, **options)
        self._container_id = container.id
        self._container_started = True
        try:
            container.start()
        except docker.errors.APIError as exc:
            raise RuntimeError(
                f"the docker sandbox's container did not start: {exc.explanation or exc}"
            ) from exc
        container.reload()
        state = container.attrs.get("State") or {}
        if not state.get("Running"):
            logs = container.logs(tail=20).decode(errors="replace").strip()
            raise RuntimeError(
                f"the docker sandbox's container exited at once ({state.get('ExitCode')}); "
                f"its image needs sh and sleep and an ENTRYPOINT that runs the command: {logs}"
            )
        self._init_pid = int(state.get("Pid") or 0) or None
        self.logger.debug(
            "docker sandbox %s up: container %s, image %s, network %s",
            self.session_id,
            container.short_id,
            self._image,
            self._network_mode,
        )

    def _pick_network_mode(self) -> str:
        if not self._network_on:
            return "none"
        if self._client.networks.list(names=["bridge"]):
            return "bridge"
        logger.warning(
            "the Docker daemon has no bridge network (dockerd --bridge=none): "
            "network=True gives the docker sandbox the host's network"
        )
        return "host"

    def _resource_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        cpus = self._resource_limit_value("cpu", auto_mode=ResourceMode.LIMIT)
        memory = self._resource_limit_value("memory", auto_mode=ResourceMode.LIMIT)
        cpu_request = self._resource_request_value("cpu", auto_mode=ResourceMode.LIMIT)
        memory_request = self._resource_request_value("memory", auto_mode=ResourceMode.LIMIT)
        if cpus:
            options["nano_cpus"] = int(float(cpus) * 1e9)
        if memory:
            options["mem_limit"] = f"{int(memory)}m"
            options["memswap_limit"] = f"{int(memory)}m"  # no swap beyond the limit
        if cpu_request:
            options["cpu_shares"] = max(2, int(float(cpu_request) * 1024))
        if memory_request:
            options["mem_reservation"] = f"{int(memory_request)}m"
        return options

    def _mount_options(self) -> dict[str, Any]:
        binds: list[str] = []
        mounts: list[Any] = []
        for mount in self._host_mounts:
            target = str(mount["target"])
            if mount["type"] == "bind":
                source = Path(mount["source"])
                if not source.exists() and mount.get("bind", {}).get("create_host_path", True):
                    source.mkdir(parents=True)  # as compose does, unless create_host_path=false
                modes = ["ro" if mount.get("read_only") else "rw"]
                if selinux := mount.get("bind", {}).get("selinux"):
                    modes.append(selinux)
                binds.append(f"{source.resolve()}:{target}:{','.join(modes)}")
            else:
                mounts.append(
                    docker.types.Mount(
                        target,
                        str(mount["source"]),
                        type="volume",
                        read_only=bool(mount.get("read_only")),
                    )
                )
        options: dict[str, Any] = {}
        if binds:
            options["volumes"] = binds
        if mounts:
            options["mounts"] = mounts
        return options

    async def _detect_shell(self) -> str:
        argv = ["sh", "-c", "command -v bash >/dev/null 2>&1 && echo bash || echo sh"]
        code, out, err = await _in_thread(self._exec_buffered, argv, "0")
        shell = out.strip()
        if code != 0 or shell not in ("bash", "sh"):
            raise RuntimeError(
                f"the docker sandbox's image {self._image} cannot run sh ({code}): "
                f"{(err or out).strip()}"
            )
        return shell

    @override
    async def stop(self, delete: bool) -> None:
        """Remove the container (``delete=False``: stop it and keep it)."""
        if self._container_id is not None and not self._stopped and self._host_mounts:
            await self.prepare_logs_for_host()
        await self._teardown(delete=delete)

    @override
    async def prepare_logs_for_host(self) -> None:
        """Give the bind-mounted writable dirs to this process's user, as Harbor's docker does."""
        if not hasattr(os, "getuid") or self._container_id is None or self._stopped:
            return
        targets = [m["target"] for m in self._host_mounts if not m.get("read_only")]
        if not targets:
            return
        quoted = " ".join(shlex.quote(str(t)) for t in targets)
        with contextlib.suppress(Exception):
            await self.exec(f"chown -R {os.getuid()}:{os.getgid()} {quoted}", user="root")

    async def _teardown(self, *, delete: bool) -> None:
        # Runs when a trial is cancelled too: shielded (from anyio scopes and from plain task
        # cancellation), or the container would be left behind.
        with anyio.CancelScope(shield=True):
            try:
                await self._gate.close()
                await _finish(_spawn(self._teardown_now, delete))
            finally:
                if self._live:
                    self._live = False
                    _LIVE[self._owner] -= 1
                    if not _LIVE[self._owner]:
                        del _LIVE[self._owner]

    def _teardown_now(self, delete: bool) -> None:
        self._stopped = True
        client = self._client
        ref = self._container_id or self._container_name
        if client is not None and ref is not None:
            if delete:
                _remove_container(client, ref)
            else:
                _stop_container(client, ref)
                logger.info("docker sandbox container %s kept, stopped (delete=False)", ref)
        if delete:
            self._container_id = None
        self._init_pid = None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
        self._client = None

    # --- exec ----------------------------------------------------------------------------

    @override
    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Run ``bash -c command`` (``sh -c`` without bash) in the container, like ``docker exec``.

        ``cwd`` defaults to the task's workdir, else the image's ``WORKDIR``; ``user`` to the
        environment's default user, else the image's ``USER``. On timeout the command and
        everything it started are killed and :class:`ExecTimeoutError` is raised.
        """
        return await self._run(
            [self._shell, "-c", command],
            cwd=cwd or self.task_env_config.workdir,
            env=self._merge_env(env),
            user=self._resolve_user(user),
            timeout_sec=timeout_sec,
        )

    async def _run(
        self,
        argv: list[str],
        *,
        cwd: str | None,
        env: dict[str, str] | None,
        user: str | int | None,
        timeout_sec: float | None,
    ) -> ExecResult:
        api = self._api()
        marker = f"{self._token}{next(self._seq):08d}"
        full_env = {**(env or {}), EXEC_MARKER: marker}
        bad = [k for k in full_env if not k or "=" in k or "\0" in k]
        if bad:
            raise ValueError(f"environment variable names {bad!r} are not valid")
        user_arg = "" if user is None else str(user)
        try:
            created = await _in_thread(
                api.exec_create,
                self._container_id,
                argv,
                stdout=True,
                stderr=True,
                environment=[f"{k}={v}" for k, v in full_env.items()],
                workdir=cwd,
                user=user_arg,
            )
        except docker.errors.APIError as exc:
            raise RuntimeError(
                f"the docker sandbox {self.session_id} cannot run commands: "
                f"{exc.explanation or exc}"
            ) from exc
        exec_id = created["Id"]
        out = _Tail(self._max_output)
        err = _Tail(self._max_output)
        stop = threading.Event()
        sink = _sink(out, err, self._output_callback(), asyncio.get_running_loop(), stop)
        future = _spawn(_pump, api, exec_id, sink, stop)
        try:
            done, _ = await asyncio.wait({future}, timeout=timeout_sec or None)
        except BaseException:
            stop.set()
            with anyio.CancelScope(shield=True):
                await _finish(self._kill_exec(marker, user_arg, future))
            raise
        if not done:
            stop.set()
            with anyio.CancelScope(shield=True):
                await _finish(self._kill_exec(marker, user_arg, future))
            raise ExecTimeoutError(f"Command timed out after {timeout_sec} seconds")
        code, started = future.result()
        stdout, stderr = out.text(), err.text()
        if not started and stderr is None:
            # The exec never started (unknown user, no shell): what the daemon says about it
            # comes on stdout, when it comes at all.
            stderr = (stdout or "").replace("\r\n", "\n") or (
                f"the command could not start in the container (exit {code})"
                + (f": is user {user_arg!r} in the image's /etc/passwd?" if user_arg else "")
            )
            stdout = None
        return ExecResult(stdout=stdout, stderr=stderr, return_code=code)

    async def _kill_exec(
        self, marker: str, user: str, pump: asyncio.Future[tuple[int, bool]]
    ) -> None:
        """Kill every process of one exec (its marker), as its user and as root."""
        users = [user] if user in _ROOT_USERS else [user, "0"]
        for who in users:
            with contextlib.suppress(Exception):
                await _in_thread(self._exec_buffered, ["sh", "-c", _KILL_SCRIPT, "sh", marker], who)
        with contextlib.suppress(Exception):
            await _settle(pump, 10.0)

    def _exec_buffered(self, argv: list[str], user: str) -> tuple[int, str, str]:
        """Run a short command to its end (thread): (exit code, stdout, stderr)."""
        api = self._api()
        exec_id = api.exec_create(self._container_id, argv, user=user)["Id"]
        out, err = api.exec_start(exec_id, demux=True)
        code = api.exec_inspect(exec_id).get("ExitCode")
        return (
            -1 if code is None else int(code),
            (out or b"").decode(errors="replace"),
            (err or b"").decode(errors="replace"),
        )

    # --- files ---------------------------------------------------------------------------
    # The daemon's archive API; paths resolve inside the container (its symlinks included).

    @override
    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        target = PurePosixPath(target_path)
        with tempfile.TemporaryFile() as archive:
            await _in_thread(_pack_file, Path(source_path), target.name, archive)
            await self._put(archive, str(target.parent), f"upload {source_path} -> {target_path}")

    @override
    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        with tempfile.TemporaryFile() as archive:
            await _in_thread(_pack_dir, Path(source_dir), archive)
            await self._put(archive, target_dir, f"upload {source_dir}/ -> {target_dir}")

    async def _put(self, archive: IO[bytes], directory: str, what: str) -> None:
        api = self._api()

        def put() -> None:
            archive.seek(0)
            api.put_archive(self._container_id, directory, archive)

        try:
            await _in_thread(put)
        except docker.errors.NotFound:  # the directory does not exist yet
            code, out, err = await _in_thread(
                self._exec_buffered, ["mkdir", "-p", "--", directory], "0"
            )
            if code != 0:
                raise RuntimeError(f"{what} failed in the docker sandbox: {err or out}") from None
            await _in_thread(put)
        except docker.errors.APIError as exc:
            raise RuntimeError(
                f"{what} failed in the docker sandbox: {exc.explanation or exc}"
            ) from exc

    @override
    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{self._token}.part")
        try:
            with tempfile.TemporaryFile() as archive:
                await self._get(source_path, archive, want_dir=False)
                await _in_thread(_unpack_file, archive, partial, source_path)
            partial.replace(target)
        finally:
            partial.unlink(missing_ok=True)

    @override
    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        target = Path(target_dir)
        await asyncio.to_thread(target.mkdir, parents=True, exist_ok=True)
        with tempfile.TemporaryFile() as archive:
            await self._get(source_dir, archive, want_dir=True)
            await _in_thread(_unpack_dir, archive, target, self.logger)

    async def _get(self, path: str, archive: IO[bytes], *, want_dir: bool) -> None:
        api = self._api()

        def get() -> None:
            source = path
            for _ in range(10):  # a symlink: fetch what it points to (resolved in the container)
                stream, stat = api.get_archive(self._container_id, source)
                link = stat.get("linkTarget") or ""
                if link and link != source and not (stat.get("mode", 0) & _GO_MODE_DIR):
                    with contextlib.suppress(Exception):
                        stream.close()
                    source = link
                    continue
                is_dir = bool(stat.get("mode", 0) & _GO_MODE_DIR)
                if is_dir != want_dir:
                    with contextlib.suppress(Exception):
                        stream.close()
                    kind = "a directory" if is_dir else "not a directory"
                    error = IsADirectoryError if is_dir else NotADirectoryError
                    raise error(f"{path} in the docker sandbox is {kind}")
                for chunk in stream:
                    archive.write(chunk)
                archive.seek(0)
                return
            raise FileNotFoundError(f"{path} in the docker sandbox: too many symlinks")

        try:
            await _in_thread(get)
        except docker.errors.NotFound:
            raise FileNotFoundError(f"{path} not found in the docker sandbox") from None
        except docker.errors.APIError as exc:
            raise RuntimeError(
                f"download {path} from the docker sandbox failed: {exc.explanation or exc}"
            ) from exc


# --- helpers -------------------------------------------------------------------------------


class _Abandoned(Exception):
    """A build or wait given up on because the caller left (timeout or cancellation)."""


_BUILD_LOCKS: dict[str, threading.Lock] = {}
_BUILD_LOCKS_GUARD = threading.Lock()


def _build_lock(tag: str) -> threading.Lock:
    with _BUILD_LOCKS_GUARD:
        return _BUILD_LOCKS.setdefault(tag, threading.Lock())


def _abandon_build(stop: threading.Event, holder: dict) -> None:
    """Cut a running build's connection: the reading thread stops and the daemon cancels."""
    stop.set()
    response = holder.get("response")
    if response is None:
        return
    for sock in _response_sockets(response):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(Exception):
        response.close()


def _response_sockets(response: Any) -> list[Any]:
    """The OS sockets under a streamed requests response (found the way docker-py finds them)."""
    found = []
    raw = getattr(response, "raw", None)
    candidates = [
        getattr(getattr(raw, "_connection", None), "sock", None),
        getattr(
            getattr(getattr(getattr(raw, "_fp", None), "fp", None), "raw", None), "_sock", None
        ),
    ]
    for sock in candidates:
        if sock is not None and hasattr(sock, "shutdown") and sock not in found:
            found.append(sock)
    return found


async def _settle[T](future: asyncio.Future[T], wait_s: float) -> None:
    """Wait (bounded) for a thread's future to end, ignoring how it ended."""
    done, _ = await asyncio.wait({future}, timeout=wait_s)
    if done:
        with contextlib.suppress(BaseException):
            future.result()
    else:
        logger.warning("a docker sandbox thread did not stop within %s s; left running", wait_s)


def _remove_container(client: Any, ref: str, attempts: int = 3) -> None:
    """Remove a container, killing it first; a busy daemon gets a second and third try."""
    for attempt in range(attempts):
        try:
            client.api.remove_container(ref, force=True, v=True)
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:
            if "already in progress" in str(exc):
                return
            if attempt == attempts - 1:
                logger.warning("could not remove the docker sandbox container %s: %s", ref, exc)
                return
            time.sleep(1.0 + attempt)
        except Exception as exc:  # the daemon went away
            logger.warning("could not remove the docker sandbox container %s: %s", ref, exc)
            return


def _stop_container(client: Any, ref: str) -> None:
    """Stop a container (TERM, then KILL after 2 s) and wait until it has exited."""
    try:
        client.api.stop(ref, timeout=2)
    except docker.errors.NotFound:
        return
    except Exception as exc:  # a busy daemon may give up waiting for the exit: kill it
        logger.debug("docker stop %s: %s; killing it", ref, exc)
        with contextlib.suppress(Exception):
            client.api.kill(ref)
    try:
        client.api.wait(ref, timeout=120)
    except Exception as exc:
        logger.warning("the docker sandbox container %s may still run: %s", ref, exc)


def _process_label() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def _sweep_stale_containers(client: Any) -> None:
    """Remove sandbox containers left by processes on this host that died without stopping them."""
    host = socket.gethostname()
    try:  # the plain list: no inspect of each, which races with containers going away
        containers = client.api.containers(all=True, filters={"label": SANDBOX_LABEL})
    except Exception as exc:
        logger.debug("could not list sandbox containers: %s", exc)
        return
    for container in containers:
        label = (container.get("Labels") or {}).get(PROCESS_LABEL, "")
        owner_host, _, start = label.rpartition(":")
        owner_host, _, pid = owner_host.rpartition(":")
        if owner_host != host or not pid.isdigit() or start == "None":
            continue
        if _start_time(int(pid)) == start:
            continue  # its process is alive
        logger.info("removing stale docker sandbox container %s", container["Id"][:12])
        with contextlib.suppress(Exception):
            client.api.remove_container(container["Id"], force=True, v=True)


def _sink(
    out: _Tail,
    err: _Tail,
    callback: Any,
    loop: asyncio.AbstractEventLoop,
    stop: threading.Event,
) -> Callable[[int, bytes], None]:
    """Where an exec's frames go (called in the reading thread)."""

    def add(stream: int, data: bytes) -> None:
        name = "stderr" if stream == _STDERR else "stdout"
        (err if stream == _STDERR else out).add(data)
        if callback is not None and not stop.is_set():
            try:
                asyncio.run_coroutine_threadsafe(
                    callback(data.decode(errors="replace"), name), loop
                ).result()
            except Exception as exc:  # a broken callback must not lose the command's output
                logger.debug("output callback failed: %s", exc)

    return add


def _pump(
    api: Any, exec_id: str, sink: Callable[[int, bytes], None], stop: threading.Event
) -> tuple[int, bool]:
    """Start an exec and read its output until it ends: (exit code, whether it started) (thread).

    The daemon answers the start request (its stream) *before* it starts the process, so for a
    moment the exec is neither running nor done (no exit code yet): only an exit code
    says that it has ended, never "not running" alone. The daemon holds the stream open up to
    ~2 s after the command exits when a background child keeps its stdout; an idle exec is asked
    whether it has ended, and once it has and :data:`_PIPE_GRACE_SEC` passes with no output the
    stream is let go.
    """
    sock = api.exec_start(exec_id, socket=True)
    buffer = bytearray()
    exited_at: float | None = None
    last_data = last_check = time.monotonic()
    check_every = 0.2
    try:
        while not stop.is_set():
            now = time.monotonic()
            if exited_at is not None and now - max(exited_at, last_data) >= _PIPE_GRACE_SEC:
                break  # exited, and nothing more came for a while: a background child holds it
            if _readable(sock, _POLL_SEC):
                chunk = _recv(sock)
                if chunk is None:
                    continue
                if not chunk:
                    break
                buffer += chunk
                _frames(buffer, sink)
                last_data = time.monotonic()
                check_every = 0.2
                continue
            now = time.monotonic()
            if exited_at is None and now - max(last_data, last_check) >= check_every:
                last_check = now
                check_every = min(check_every * 2, _EXIT_CHECK_MAX_SEC)
                if _exit_code(api.exec_inspect(exec_id)) is not None:
                    exited_at = now
    finally:
        _close(sock)
    # The daemon records the exit before it closes the stream; a loaded one may still be slow
    # to answer. No exit code in time is an error, never a guessed one: the caller would go on
    # (a verifier to read a reward file) while the command may still run.
    deadline = time.monotonic() + _EXIT_RECORD_SEC
    while not stop.is_set():
        info = api.exec_inspect(exec_id)
        code = _exit_code(info)
        if code is not None:
            return code, bool(info.get("Pid"))
        if time.monotonic() > deadline:
            raise ExecExitUnknownError(
                f"the docker daemon let go of exec {exec_id[:12]}'s output but reported no exit "
                f"code within {_EXIT_RECORD_SEC:g} s (it says: running={info.get('Running')!r}, "
                f"pid={info.get('Pid')!r})"
            )
        time.sleep(0.02)
    return -1, True


def _exit_code(info: dict[str, Any]) -> int | None:
    """An exec's exit code once the daemon says it has ended; None while it has not started
    (running false, no exit code yet: the start request is answered first) or still runs."""
    code = info.get("ExitCode")
    return None if info.get("Running") or code is None else int(code)


def _readable(sock: Any, timeout: float) -> bool:
    pending = getattr(sock, "pending", None)  # TLS: bytes already decrypted
    if callable(pending) and pending():
        return True
    ready, _, _ = select.select([sock], [], [], timeout)
    return bool(ready)


def _recv(sock: Any) -> bytes | None:
    """Bytes from the stream: b"" at its end, None when nothing could be read just now."""
    try:
        if hasattr(sock, "recv"):
            return sock.recv(_READ_CHUNK)
        return sock.read(_READ_CHUNK)  # SocketIO: None when it would block
    except (BlockingIOError, InterruptedError, TimeoutError):
        return None
    except OSError:
        return b""


def _frames(buffer: bytearray, sink: Callable[[int, bytes], None]) -> None:
    """Hand every complete frame (8-byte header: stream, 0, 0, 0, big-endian size) to ``sink``."""
    while len(buffer) >= 8:
        stream, size = struct.unpack(">BxxxL", bytes(buffer[:8]))
        if len(buffer) < 8 + size:
            return
        data = bytes(buffer[8 : 8 + size])
        del buffer[: 8 + size]
        if data:
            sink(stream, data)


def _close(sock: Any) -> None:
    inner = getattr(sock, "_sock", None)
    with contextlib.suppress(Exception):
        sock.close()
    if inner is not None:
        with contextlib.suppress(Exception):
            inner.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            inner.close()


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _pack_file(source: Path, name: str, archive: IO[bytes]) -> None:
    with tarfile.open(fileobj=archive, mode="w") as tar:
        tar.add(source, arcname=name, recursive=False, filter=_root_owned)


def _pack_dir(source: Path, archive: IO[bytes]) -> None:
    if not source.is_dir():
        raise NotADirectoryError(f"{source} is not a directory")
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for entry in sorted(source.iterdir()):
            tar.add(entry, arcname=entry.name, filter=_root_owned)


def _unpack_file(archive: IO[bytes], target: Path, source: str) -> None:
    with tarfile.open(fileobj=archive, mode="r|") as tar:
        for member in tar:
            if member.isfile():
                extracted = tar.extractfile(member)
                assert extracted is not None
                with target.open("wb") as sink:
                    while chunk := extracted.read(_READ_CHUNK):
                        sink.write(chunk)
                return
    raise FileNotFoundError(f"{source} in the docker sandbox is not a regular file")


def _unpack_dir(archive: IO[bytes], target: Path, log: logging.Logger) -> None:
    """Extract a directory's archive (its entries are ``<basename>/...``) into ``target``.

    Members that would land outside ``target`` (links the sandbox made) are dropped.
    """

    def member_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        _head, sep, rest = member.name.partition("/")
        if not sep or not rest:
            return None  # the directory itself
        member = member.replace(name=rest, deep=False)
        if member.islnk():  # hard links name the archive path, which lost its first part too
            linked = member.linkname.partition("/")[2]
            member = member.replace(linkname=linked, deep=False)
        try:
            return transfer_tar_filter(member, dest)
        except tarfile.FilterError as exc:
            log.warning("skipped %s from the docker sandbox: %s", member.name, exc)
            return None

    with tarfile.open(fileobj=archive, mode="r") as tar:
        tar.extractall(target, filter=member_filter)
