"""The docker sandbox on a real Docker daemon: the Dockerfile built, limits set, nothing left over.

The daemon is found as users find it ($DOCKER_HOST, the context, the default socket) and must
hold ``debian:bookworm-slim``; without them every test here fails, saying what is missing. The
task image is built once per daemon (it is cached by content) and one running sandbox is shared
by the tests that only exec in it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
from harbor.models.task.config import NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

from rollwire.harnesses.harbor.docker import (
    KEEPALIVE,
    OWNER_LABEL,
    PROCESS_LABEL,
    SANDBOX_LABEL,
    BuildTimeoutError,
    DockerBuildError,
    DockerEnvironment,
    MissingBaseImageError,
    docker_problem,
    required_images,
)
from rollwire.harnesses.harbor.local import ExecTimeoutError, settled
from rollwire.harnesses.harbor.sandboxes import docker_endpoint
from rollwire.harnesses.harbor.trial import run_trial
from tests.harbor.helpers import make_task

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.docker]

DOCKER_IMPORT_PATH = "rollwire.harnesses.harbor.docker:DockerEnvironment"
BASE_IMAGE = "debian:bookworm-slim"
DOCKERFILE = f"""\
FROM {BASE_IMAGE}
RUN useradd --create-home --uid 1234 agent && echo built-by-run > /etc/rollwire-built \\
 && mkdir -p /srv/app && chown agent /srv/app
ENV GREETING="hello from ENV"
WORKDIR /srv/app
USER agent
"""
SOLVE = 'echo "$GREETING" > /srv/app/answer.txt\n'
TEST = (
    'if grep -qx "hello from ENV" /srv/app/answer.txt; then echo 1; else echo 0; fi'
    " > /logs/verifier/reward.txt\n"
)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # module scope: the shared sandbox lives across the module's tests


@pytest.fixture(scope="module", autouse=True)
def daemon() -> Iterator[Any]:
    """An SDK client on the daemon the sandbox will use; fails (never skips) without one."""
    problem = docker_problem()
    if problem is not None:
        pytest.fail(f"the docker sandbox tests need a Docker daemon: {problem}", pytrace=False)
    import docker  # after the check: without the SDK, docker_problem() has said so

    client = docker.DockerClient(base_url=docker_endpoint()[0], version="auto")
    try:
        client.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(
            f"the Docker daemon has no {BASE_IMAGE}: build it with "
            f"`rollwire images build {BASE_IMAGE}` or `docker load -i` a saved copy",
            pytrace=False,
        )
    yield client
    client.close()


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_task(
        tmp_path_factory.mktemp("docker-tasks"),
        "docker-sandbox-basic",  # fixed content: the image is built once per daemon
        dockerfile=DOCKERFILE,
        solve=SOLVE,
        test=TEST,
    )


def make_env(
    tmp_path: Path,
    environment_dir: Path,
    *,
    config: TaskEnvironmentConfig | None = None,
    **kwargs: Any,
) -> DockerEnvironment:
    """A docker sandbox for a task's environment/ directory, not yet started."""
    trial_paths = TrialPaths(tmp_path / f"trial-{uuid.uuid4().hex[:6]}")
    trial_paths.mkdir()
    kwargs.setdefault("owner", f"test-{uuid.uuid4().hex[:8]}")
    return DockerEnvironment(
        environment_dir=environment_dir,
        environment_name=environment_dir.parent.name,
        session_id=f"{environment_dir.parent.name}__test__env",
        trial_paths=trial_paths,
        task_env_config=config or TaskEnvironmentConfig(),
        **kwargs,
    )


@pytest.fixture(scope="module")
async def sandbox(
    task: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[DockerEnvironment]:
    """One started sandbox on the task's image (built if the daemon lacks it), 1.5 cpus, 512 MB."""
    env = make_env(
        tmp_path_factory.mktemp("shared"),
        task / "environment",
        config=TaskEnvironmentConfig(cpus=1.5, memory_mb=512),
    )
    await env.start(force_build=False)
    try:
        yield env
    finally:
        await env.stop(delete=True)


def containers_of(client: Any, owner: str) -> list[dict[str, Any]]:
    """The owner's containers, as the daemon lists them (``Id``, ``State``, ``Labels``...)."""
    return client.api.containers(all=True, filters={"label": f"{OWNER_LABEL}={owner}"})


def env_dir(tmp_path: Path, dockerfile: str) -> Path:
    return make_task(tmp_path / "tasks", f"t{uuid.uuid4().hex[:6]}", dockerfile=dockerfile) / (
        "environment"
    )


async def running_processes(env: DockerEnvironment, prefix: str) -> list[str]:
    """Command lines of the live processes in the container that start with ``prefix``."""
    result = await env.exec(
        "for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null); "
        f'case "$c" in "{prefix}"*) echo "$c";; esac; done',
        user="root",
    )
    assert result.return_code == 0, result.stderr
    return (result.stdout or "").splitlines()


# --- the image -------------------------------------------------------------------------------


async def test_exec_sees_the_dockerfiles_run_env_workdir_and_user(
    sandbox: DockerEnvironment,
) -> None:
    result = await sandbox.exec('pwd; id -un; echo "$GREETING"; cat /etc/rollwire-built')
    assert result.return_code == 0, result.stderr
    assert result.stdout == "/srv/app\nagent\nhello from ENV\nbuilt-by-run\n"


async def test_exec_honours_cwd_env_user_and_exit_codes(sandbox: DockerEnvironment) -> None:
    here = await sandbox.exec('pwd; echo "$GREETING"', cwd="/tmp", env={"GREETING": "hi there"})
    root = await sandbox.exec("id -u; echo $HOME", user="root")
    unknown = await sandbox.exec("true", user="no-such-user")
    failing = await sandbox.exec("echo oops >&2; exit 3")
    assert here.stdout == "/tmp\nhi there\n"
    assert root.stdout == "0\n/root\n"
    assert unknown.return_code == 126 and "no-such-user" in (unknown.stderr or "")
    assert (failing.return_code, failing.stderr, failing.stdout) == (3, "oops\n", None)


async def test_a_second_start_reuses_the_image_by_content(
    sandbox: DockerEnvironment, task: Path, tmp_path: Path, daemon: Any
) -> None:
    assert sandbox.image is not None and sandbox.image.startswith("rollwire-task/")
    first = daemon.images.get(sandbox.image)
    env = make_env(tmp_path, task / "environment")
    await env.start(force_build=False)
    try:
        assert env.image == sandbox.image
        assert not env.image_built  # no build: the tag for this content was there
        assert daemon.images.get(env.image).id == first.id
    finally:
        await env.stop(delete=True)


async def test_a_missing_from_image_fails_before_any_build_naming_it(
    tmp_path: Path, daemon: Any
) -> None:
    absent = f"rollwire-test/absent-{uuid.uuid4().hex[:8]}:1"
    environment = env_dir(
        tmp_path, f"FROM {BASE_IMAGE} AS base\nFROM {absent}\nCOPY --from=base /etc/hostname /x\n"
    )
    env = make_env(tmp_path, environment)
    images_before = {i.id for i in daemon.images.list(all=True)}
    started = time.monotonic()
    with pytest.raises(MissingBaseImageError) as caught:
        await env.start(force_build=False)
    assert time.monotonic() - started < 15
    message = str(caught.value)
    assert caught.value.images == (absent,)
    assert absent in message and "Dockerfile:2" in message and "docker load -i" in message
    assert BASE_IMAGE not in caught.value.images  # present, and `base` is a stage
    assert {i.id for i in daemon.images.list(all=True)} == images_before  # nothing was built
    assert containers_of(daemon, env._owner or "") == []


def test_required_images_skip_stages_scratch_and_stage_numbers(tmp_path: Path) -> None:
    environment = env_dir(
        tmp_path,
        "ARG BASE=debian:trixie-slim\nFROM $BASE AS one\nFROM one\nFROM scratch\n"
        "COPY --from=one /a /a\nCOPY --from=0 /b /b\nCOPY --from=busybox:1 /c /c\n",
    )
    assert required_images(environment) == [("debian:trixie-slim", 2), ("busybox:1", 7)]


async def test_a_missing_debian_base_names_the_image_build_command(tmp_path: Path) -> None:
    absent = f"debian:rollwire-absent-{uuid.uuid4().hex[:8]}"
    env = make_env(tmp_path, env_dir(tmp_path, f"FROM {absent}\n"))
    with pytest.raises(MissingBaseImageError, match=f"rollwire images build {absent}"):
        await env.start(force_build=False)


async def test_a_prebuilt_image_task_runs_in_that_image(tmp_path: Path) -> None:
    environment = tmp_path / "prebuilt" / "environment"
    environment.mkdir(parents=True)
    env = make_env(tmp_path, environment, config=TaskEnvironmentConfig(docker_image=BASE_IMAGE))
    await env.start(force_build=False)
    try:
        result = await env.exec("cat /etc/debian_version && id -u")
    finally:
        await env.stop(delete=True)
    assert env.image == BASE_IMAGE and not env.image_built
    assert result.return_code == 0 and (result.stdout or "").endswith("\n0\n")


async def test_a_missing_prebuilt_image_fails_naming_it(tmp_path: Path) -> None:
    absent = f"rollwire-test/prebuilt-{uuid.uuid4().hex[:8]}:1"
    environment = tmp_path / "prebuilt" / "environment"
    environment.mkdir(parents=True)
    env = make_env(tmp_path, environment, config=TaskEnvironmentConfig(docker_image=absent))
    with pytest.raises(MissingBaseImageError, match="docker_image") as caught:
        await env.start(force_build=False)
    assert caught.value.images == (absent,)


async def test_a_failing_build_raises_with_the_daemons_error_lines(
    tmp_path: Path, daemon: Any
) -> None:
    marker = f"about-to-fail-{uuid.uuid4().hex[:8]}"
    env = make_env(tmp_path, env_dir(tmp_path, f"FROM {BASE_IMAGE}\nRUN echo {marker} && exit 7\n"))
    with pytest.raises(DockerBuildError) as caught:
        await env.start(force_build=False)
    message = str(caught.value)
    assert "returned a non-zero code: 7" in message
    assert f"\n{marker}\n" in message  # the step's own output, from the build stream
    assert env.image is None and not env.image_built
    assert containers_of(daemon, env._owner or "") == []
    assert await no_build_container_runs(daemon, marker)


async def test_a_build_past_its_timeout_is_abandoned_and_cancelled(
    tmp_path: Path, daemon: Any
) -> None:
    marker = f"600.{uuid.uuid4().int % 10**6}"
    env = make_env(
        tmp_path,
        env_dir(tmp_path, f"FROM {BASE_IMAGE}\nRUN sleep {marker}\n"),
        config=TaskEnvironmentConfig(build_timeout_sec=8),
    )
    started = time.monotonic()
    with pytest.raises(BuildTimeoutError, match="build_timeout_sec"):
        await env.start(force_build=False)
    assert time.monotonic() - started < 60  # the deadline, and the cut, not the 600 s step
    assert await no_build_container_runs(daemon, marker)
    assert containers_of(daemon, env._owner or "") == []


async def test_a_cancelled_build_leaves_no_container(tmp_path: Path, daemon: Any) -> None:
    marker = f"600.{uuid.uuid4().int % 10**6}"
    env = make_env(tmp_path, env_dir(tmp_path, f"FROM {BASE_IMAGE}\nRUN sleep {marker}\n"))
    starting = asyncio.create_task(env.start(force_build=False))
    for _ in range(3000):  # until the daemon runs the RUN step (vfs, a loaded host: minutes)
        await asyncio.sleep(0.1)
        if build_containers(daemon, marker):
            break
    assert build_containers(daemon, marker), "the RUN step never started"
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert await no_build_container_runs(daemon, marker)
    assert await settled(env._owner or "")


def build_containers(daemon: Any, marker: str) -> list[dict[str, Any]]:
    """The builder's containers running ``sleep <marker>``."""
    return [c for c in daemon.api.containers(all=True) if marker in (c.get("Command") or "")]


async def no_build_container_runs(daemon: Any, marker: str, wait_s: float = 300.0) -> bool:
    """Whether the daemon dropped the abandoned build's container (it may take it a moment)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not await asyncio.to_thread(build_containers, daemon, marker):
            return True
        await asyncio.sleep(0.5)
    return False


# --- the container -----------------------------------------------------------------------------


async def test_resource_limits_are_set_on_the_container(
    sandbox: DockerEnvironment, daemon: Any
) -> None:
    assert sandbox.container_id is not None
    host = daemon.api.inspect_container(sandbox.container_id)["HostConfig"]
    assert host["NanoCpus"] == 1_500_000_000
    assert host["Memory"] == 512 * 1024 * 1024
    assert host["MemorySwap"] == 512 * 1024 * 1024
    assert host["PidsLimit"] == 4096


async def test_the_container_has_no_network_by_default(
    sandbox: DockerEnvironment, daemon: Any
) -> None:
    assert sandbox.container_id is not None
    attrs = daemon.api.inspect_container(sandbox.container_id)
    interfaces = await sandbox.exec("ls /sys/class/net")
    assert attrs["HostConfig"]["NetworkMode"] == "none" == sandbox.network_mode
    assert interfaces.stdout == "lo\n"


async def test_network_true_gives_a_network_unless_the_task_asks_for_none(
    task: Path, tmp_path: Path
) -> None:
    online = make_env(tmp_path, task / "environment", network=True)
    offline = make_env(
        tmp_path,
        task / "environment",
        network=True,
        network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK),
    )
    interfaces = {}
    for env in (online, offline):
        await env.start(force_build=False)
        try:
            interfaces[env.network_mode] = (await env.exec("ls /sys/class/net")).stdout
        finally:
            await env.stop(delete=True)
    # A daemon without a bridge network (dockerd --bridge=none) gives the host's instead.
    assert online.network_mode in ("bridge", "host") and offline.network_mode == "none"
    assert interfaces[online.network_mode] != "lo\n" and interfaces["none"] == "lo\n"


async def test_init_pid_is_the_containers_pid_1_on_the_host(sandbox: DockerEnvironment) -> None:
    pid = sandbox.init_pid
    assert pid is not None
    assert os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
    assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    assert (await anyio.Path(f"/proc/{pid}/cmdline").read_bytes()).split(b"\0")[0] == b"sh"


async def test_the_container_is_labelled_with_its_owner(
    sandbox: DockerEnvironment, daemon: Any
) -> None:
    labels = daemon.containers.get(sandbox.container_id).labels
    assert labels[OWNER_LABEL] == sandbox._owner
    assert labels["rollwire.sandbox"] == "1"


async def test_stop_removes_the_container(task: Path, tmp_path: Path, daemon: Any) -> None:
    env = make_env(tmp_path, task / "environment")
    await env.start(force_build=False)
    await env.exec("sleep 300 > /dev/null 2>&1 &")
    assert len(containers_of(daemon, env._owner or "")) == 1
    await env.stop(delete=True)
    assert containers_of(daemon, env._owner or "") == []
    assert await settled(env._owner or "", timeout_s=1)
    with pytest.raises(RuntimeError, match="has been stopped"):
        await env.exec("true")


async def test_stop_without_delete_keeps_the_container_stopped(
    task: Path, tmp_path: Path, daemon: Any
) -> None:
    env = make_env(tmp_path, task / "environment")
    await env.start(force_build=False)
    await env.stop(delete=False)
    try:
        [container] = containers_of(daemon, env._owner or "")
        assert container["Id"] == env.container_id
        assert container["State"] in ("exited", "dead")
    finally:
        for container in containers_of(daemon, env._owner or ""):
            daemon.api.remove_container(container["Id"], force=True)


async def test_containers_of_dead_processes_are_swept_at_start(
    task: Path, tmp_path: Path, daemon: Any
) -> None:
    owner = f"stale-{uuid.uuid4().hex[:8]}"
    dead = f"{socket.gethostname()}:999999999:1"  # no such pid on this host
    daemon.api.create_container(
        BASE_IMAGE, KEEPALIVE, labels={SANDBOX_LABEL: "1", OWNER_LABEL: owner, PROCESS_LABEL: dead}
    )
    assert len(containers_of(daemon, owner)) == 1
    env = make_env(tmp_path, task / "environment")
    await env.start(force_build=False)
    await env.stop(delete=True)
    assert containers_of(daemon, owner) == []


async def test_a_cancelled_start_removes_its_container(
    task: Path, tmp_path: Path, daemon: Any
) -> None:
    env = make_env(tmp_path, task / "environment")
    owner = env._owner or ""
    starting = asyncio.create_task(env.start(force_build=False))
    for _ in range(3000):  # until the container exists (the image is cached: no build)
        await asyncio.sleep(0.1)
        if await asyncio.to_thread(containers_of, daemon, owner):
            break
    assert containers_of(daemon, owner), "the container never appeared"
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert containers_of(daemon, owner) == []
    assert await settled(owner, timeout_s=1)  # start's own teardown was awaited


async def test_auto_mounted_output_dirs_write_straight_to_the_trial(
    task: Path, tmp_path: Path
) -> None:
    env = make_env(tmp_path, task / "environment", auto_mounting=True)
    await env.start(force_build=False)
    try:
        written = await env.exec("echo 0.5 > /logs/verifier/reward.txt && id -un")
        assert env.is_path_mounted("/logs/verifier", env.trial_paths.verifier_dir)
    finally:
        await env.stop(delete=True)
    assert written.stdout == "agent\n", written.stderr
    assert (env.trial_paths.verifier_dir / "reward.txt").read_text() == "0.5\n"


# --- exec -------------------------------------------------------------------------------------


async def test_a_timed_out_exec_kills_what_it_started(sandbox: DockerEnvironment) -> None:
    arg = f"300.{uuid.uuid4().int % 10**6}"
    started = time.monotonic()
    with pytest.raises(ExecTimeoutError, match="timed out after 1 seconds"):
        await sandbox.exec(f"setsid sleep {arg} & (sleep {arg} &) ; sleep {arg}", timeout_sec=1)
    assert time.monotonic() - started < 20
    assert await running_processes(sandbox, f"sleep {arg}") == []
    after = await sandbox.exec("echo still usable")
    assert after.stdout == "still usable\n"


async def test_a_cancelled_exec_kills_what_it_started(sandbox: DockerEnvironment) -> None:
    arg = f"300.{uuid.uuid4().int % 10**6}"
    running = asyncio.create_task(sandbox.exec(f"setsid sleep {arg} & sleep {arg}"))
    for _ in range(300):
        await asyncio.sleep(0.1)
        if len(await running_processes(sandbox, f"sleep {arg}")) == 2:
            break
    assert len(await running_processes(sandbox, f"sleep {arg}")) == 2
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert await running_processes(sandbox, f"sleep {arg}") == []


async def test_background_processes_outlive_their_exec(sandbox: DockerEnvironment) -> None:
    arg = f"30.{uuid.uuid4().int % 10**6}"  # ends by itself
    started = time.monotonic()
    await sandbox.exec("echo plain")
    plain = time.monotonic() - started
    started = time.monotonic()
    result = await sandbox.exec(f"sleep {arg} & echo started")
    assert result.stdout == "started\n"
    # The sleep holds the exec's stdout: the daemon would keep the stream ~2 s more.
    assert time.monotonic() - started < plain + 1.5
    assert await running_processes(sandbox, f"sleep {arg}") == [f"sleep {arg} "]


async def test_output_is_cut_to_its_tail(task: Path, tmp_path: Path) -> None:
    env = make_env(tmp_path, task / "environment", max_output_bytes=1000)
    await env.start(force_build=False)
    try:
        result = await env.exec("seq 1 10000")
    finally:
        await env.stop(delete=True)
    total = sum(len(f"{i}\n") for i in range(1, 10001))
    assert result.return_code == 0
    assert (result.stdout or "").startswith(f"[{total - 1000} bytes dropped]\n")
    assert (result.stdout or "").endswith("\n9999\n10000\n")


# --- files ------------------------------------------------------------------------------------


async def test_files_travel_both_ways(sandbox: DockerEnvironment, tmp_path: Path) -> None:
    source = tmp_path / "payload"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "data.txt").write_text("payload\n")
    script = source / "run.sh"
    script.write_text("#!/bin/bash\necho ran\n")
    script.chmod(0o755)
    out = tmp_path / "out"
    where = f"/tmp/files-{uuid.uuid4().hex[:6]}"
    await sandbox.upload_dir(source, f"{where}/solution")
    await sandbox.upload_file(script, f"{where}/installed-agent/bin/run.sh")
    ran = await sandbox.exec(f"{where}/solution/run.sh && {where}/installed-agent/bin/run.sh")
    owner = await sandbox.exec(f"stat -c %U {where}/solution/sub/data.txt")
    await sandbox.exec(
        f"mkdir -p {where}/logs/deep && echo log > {where}/logs/deep/a.txt", user="root"
    )
    await sandbox.download_dir(f"{where}/logs", out / "logs")
    await sandbox.download_file(f"{where}/solution/sub/data.txt", out / "data.txt")
    with pytest.raises(FileNotFoundError):
        await sandbox.download_file(f"{where}/nope.txt", out / "nope.txt")
    assert ran.stdout == "ran\nran\n"
    assert owner.stdout == "root\n"
    assert (out / "logs" / "deep" / "a.txt").read_text() == "log\n"
    assert (out / "data.txt").read_text() == "payload\n"
    assert not (out / "nope.txt").exists()


async def test_symlinks_made_in_the_sandbox_never_reach_host_files(
    sandbox: DockerEnvironment, tmp_path: Path
) -> None:
    where = f"/tmp/links-{uuid.uuid4().hex[:6]}"
    out = tmp_path / "out"
    await sandbox.exec(
        f"mkdir -p {where} && ln -s /etc/passwd {where}/abs-link && "
        f"ln -s ../../../../../../etc/passwd {where}/rel-link && echo fine > {where}/ok"
    )
    await sandbox.download_dir(where, out)
    await sandbox.download_file(f"{where}/abs-link", tmp_path / "passwd")
    assert (out / "ok").read_text() == "fine\n"
    assert not (out / "abs-link").exists() and not (out / "abs-link").is_symlink()
    assert not (out / "rel-link").exists() and not (out / "rel-link").is_symlink()
    # The link resolves inside the container: its /etc/passwd, with the image's user in it.
    assert "agent:x:1234:" in (tmp_path / "passwd").read_text()


# --- availability -------------------------------------------------------------------------------


def test_docker_problem_names_an_endpoint_without_a_daemon(tmp_path: Path) -> None:
    nowhere = f"unix://{tmp_path}/docker.sock"
    problem = docker_problem(nowhere)
    assert problem is not None and f"{tmp_path}/docker.sock" in problem
    with pytest.raises(SystemExit, match="no Docker daemon"):
        DockerEnvironment.preflight(docker_host=nowhere)
    assert docker_problem() is None


async def test_a_trial_without_a_daemon_is_a_result_naming_it(task: Path, tmp_path: Path) -> None:
    nowhere = f"unix://{tmp_path}/docker.sock"
    outcome = await run_trial(
        task,
        trials_dir=tmp_path / "trials",
        import_path=DOCKER_IMPORT_PATH,
        environment_kwargs={"docker_host": nowhere},
    )
    assert outcome.reward is None and outcome.sandbox == "docker"
    assert outcome.error is not None and "docker.sock" in outcome.error


# --- real Harbor trials ----------------------------------------------------------------------


@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("nop", 0.0)])
async def test_a_harbor_trial_runs_in_the_docker_sandbox(
    agent: str, reward: float, task: Path, tmp_path: Path, daemon: Any
) -> None:
    owner = f"trial-{uuid.uuid4().hex[:8]}"
    outcome = await run_trial(
        task,
        agent=agent,
        trials_dir=tmp_path / "trials",
        import_path=DOCKER_IMPORT_PATH,
        environment_kwargs={"owner": owner},
    )
    assert outcome.error is None, (outcome.error, outcome.verifier_log_tail)
    assert outcome.reward == reward and outcome.sandbox == "docker"
    assert outcome.trial_dir is not None and (outcome.trial_dir / "result.json").is_file()
    assert await settled(owner, timeout_s=300)
    assert containers_of(daemon, owner) == []


async def test_a_cancelled_trial_leaves_no_container(tmp_path: Path, daemon: Any) -> None:
    arg = f"300.{uuid.uuid4().int % 10**6}"
    task = make_task(
        tmp_path / "tasks",
        "docker-sandbox-basic",  # the same environment/: the cached image
        dockerfile=DOCKERFILE,
        solve=f"setsid sleep {arg} & sleep {arg}\n",
        test=TEST,
    )
    owner = f"trial-{uuid.uuid4().hex[:8]}"
    running = asyncio.create_task(
        run_trial(
            task,
            trials_dir=tmp_path / "trials",
            import_path=DOCKER_IMPORT_PATH,
            environment_kwargs={"owner": owner},
        )
    )
    for _ in range(3000):  # until the solution runs in the container
        await asyncio.sleep(0.1)
        if await asyncio.to_thread(sleepers_in, daemon, owner, arg) == 2:
            break
    assert sleepers_in(daemon, owner, arg) == 2
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert await settled(owner, timeout_s=300)  # Harbor stops it in a task of its own
    assert containers_of(daemon, owner) == []


def sleepers_in(daemon: Any, owner: str, arg: str) -> int:
    """How many ``sleep <arg>`` processes run in the owner's container (0 without one)."""
    script = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done 2>/dev/null"
    for container in containers_of(daemon, owner):
        if container["State"] == "running":
            try:
                _, out = daemon.containers.get(container["Id"]).exec_run(
                    ["sh", "-c", script], user="root"
                )
            except Exception:  # the container is going away
                return 0
            return sum(line.startswith(f"sleep {arg}") for line in out.decode().splitlines())
    return 0
