"""The local bubblewrap sandbox: real paths, isolation, and no process or directory left behind."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from pathlib import Path

import pytest

from rollwire.harnesses.harbor import sandboxfs
from rollwire.harnesses.harbor.dockerfile import UnsupportedDockerfileError
from rollwire.harnesses.harbor.local import (
    INSTALL_HINT,
    ExecTimeoutError,
    LocalEnvironment,
    namespace_pids,
    sandbox_problem,
)
from tests.harbor.helpers import EXAMPLES, make_environment, make_task, running

pytestmark = pytest.mark.anyio

HOLDER_PROCESSES = 2  # bwrap's pid-1 reaper and the process holding the namespaces


@pytest.fixture(params=["host", "exec"])
def transfers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways files travel: by this process through openat2 (the default where the kernel
    has it), and by cat/tar run in the sandbox (kernels without openat2)."""
    if request.param == "exec":
        monkeypatch.setattr(sandboxfs, "_AVAILABLE", False)
    else:
        assert sandboxfs.available(), "this kernel has no openat2: only the exec path is tested"
    return request.param


def env_dir(tmp_path: Path, dockerfile: str, **files: str) -> Path:
    task = make_task(tmp_path / "tasks", f"t{uuid.uuid4().hex[:6]}", dockerfile=dockerfile)
    for rel, text in files.items():
        path = task / "environment" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return task / "environment"


async def test_exec_sees_the_tasks_real_paths_and_dockerfile_settings(tmp_path: Path) -> None:
    environment = EXAMPLES / "count-errors" / "environment"
    async with running(tmp_path, environment) as env:
        result = await env.exec(
            'pwd; echo "$LOG_FILE"; wc -l < "$LOG_FILE"; '
            "ls -d /logs/agent /logs/verifier /logs/artifacts; echo $TMUX_TMPDIR"
        )
    assert result.return_code == 0, result.stderr
    lines = (result.stdout or "").split()
    assert lines[0] == "/app"
    assert lines[1] == "/var/log/service/service.log"
    assert int(lines[2]) == 35
    assert lines[3:6] == ["/logs/agent", "/logs/artifacts", "/logs/verifier"]
    assert lines[6] == "/tmp"


async def test_exec_honours_cwd_env_and_user(tmp_path: Path) -> None:
    async with running(tmp_path, env_dir(tmp_path, "FROM x\nWORKDIR /srv/app\n")) as env:
        here = await env.exec("pwd; echo $GREETING", cwd="/tmp", env={"GREETING": "hi there"})
        default = await env.exec("pwd")
        nobody = await env.exec("id -u; touch /root/x", user="nobody")
        unknown = await env.exec("true", user="no-such-user")
        failing = await env.exec("echo oops >&2; exit 3")
    assert here.stdout == "/tmp\nhi there\n"
    assert default.stdout == "/srv/app\n"
    assert (nobody.stdout or "").strip() == "65534"
    assert nobody.return_code != 0  # /root belongs to root
    assert unknown.return_code == 126 and "no-such-user" in (unknown.stderr or "")
    assert (failing.return_code, failing.stderr, failing.stdout) == (3, "oops\n", None)


async def test_background_processes_and_tmux_outlive_their_exec(tmp_path: Path) -> None:
    async with running(tmp_path, env_dir(tmp_path, "FROM x\nWORKDIR /app\n")) as env:
        started = time.monotonic()
        await env.exec("sleep 300 > /dev/null 2>&1 &")
        assert time.monotonic() - started < 5
        await env.exec("tmux new-session -d -s agent 'sleep 300'")
        seen = await env.exec("pgrep -c -f '^sleep 300'; tmux has-session -t agent && echo tmux-up")
        assert env.root is not None
        sockets = list((env.root / "tmp").glob("tmux-*/default"))
    assert seen.stdout == "2\ntmux-up\n"
    assert len(sockets) == 1  # the tmux server's socket lives inside the per-trial root


async def test_timed_out_exec_leaves_no_process(tmp_path: Path) -> None:
    async with running(tmp_path, env_dir(tmp_path, "FROM x\nWORKDIR /app\n")) as env:
        started = time.monotonic()
        with pytest.raises(ExecTimeoutError, match="timed out after 1 seconds"):
            await env.exec("setsid sleep 300 & (sleep 300 &) ; sleep 300", timeout_sec=1)
        assert time.monotonic() - started < 5
        assert len(env.pids()) == HOLDER_PROCESSES
        after = await env.exec("echo still usable")
    assert after.stdout == "still usable\n"


async def test_cancelled_exec_leaves_no_process(tmp_path: Path) -> None:
    async with running(tmp_path, env_dir(tmp_path, "FROM x\nWORKDIR /app\n")) as env:
        task = asyncio.create_task(env.exec("setsid sleep 300 & sleep 300"))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(env.pids()) == HOLDER_PROCESSES


async def test_stop_kills_every_process_and_removes_the_root(tmp_path: Path) -> None:
    env = make_environment(tmp_path, env_dir(tmp_path, "FROM x\nWORKDIR /app\n"))
    await env.start(force_build=False)
    await env.exec("setsid sleep 300 > /dev/null 2>&1 & tmux new-session -d 'sleep 300'")
    root, namespace = env.root, env.pid_namespace
    assert root is not None and root.is_dir() and namespace is not None
    assert len(env.pids()) > HOLDER_PROCESSES
    await env.stop(delete=True)
    assert not root.exists()
    assert not root.parent.exists()
    assert namespace_pids(namespace) == []
    assert list((tmp_path / "sandboxes").iterdir()) == []
    with pytest.raises(RuntimeError, match="not running"):
        await env.exec("true")


async def test_writes_outside_the_root_do_not_reach_the_host(tmp_path: Path) -> None:
    name = f"rollwire-escape-{uuid.uuid4().hex}"
    async with running(tmp_path, env_dir(tmp_path, "FROM x\nWORKDIR /app\n")) as env:
        result = await env.exec(
            f"echo x > /etc/{name} && echo x > /tmp/{name} && echo x > /root/{name} && echo ok; "
            f"echo x > /usr/{name} 2>/dev/null || echo usr-read-only; "
            "ls /work 2>/dev/null || echo no-work; "
            "basename \"$(tr '\\0' '\\n' < /proc/1/cmdline | head -1)\"; "
            "mount -t tmpfs none /mnt 2>/dev/null || echo no-mount"
        )
        assert env.root is not None
        inside = (env.root / "etc" / name).exists() and (env.root / "tmp" / name).exists()
    assert result.stdout == "ok\nusr-read-only\nno-work\nbwrap\nno-mount\n"
    assert inside
    for host in (
        Path("/etc") / name,
        Path("/tmp") / name,
        Path("/root") / name,
        Path("/usr") / name,
    ):
        assert not host.exists(), host


async def test_sandbox_has_no_network_by_default(tmp_path: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    probe = (
        "python3 -c 'import socket,sys\n"
        f'try:\n socket.create_connection((sys.argv[1], {port}), timeout=2); print("reached")\n'
        'except OSError as e: print("blocked")\' '
    )
    try:
        async with running(tmp_path, env_dir(tmp_path, "FROM x\n")) as env:
            offline = await env.exec(probe + "127.0.0.1; " + probe + "1.1.1.1")
        async with running(tmp_path, env_dir(tmp_path, "FROM x\n"), network=True) as env:
            online = await env.exec(probe + "127.0.0.1")
    finally:
        listener.close()
    assert offline.stdout == "blocked\nblocked\n"
    assert online.stdout == "reached\n"  # network=True shares the host's network


async def test_files_travel_both_ways(tmp_path: Path, transfers: str) -> None:
    source = tmp_path / "payload"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "data.txt").write_text("payload\n")
    script = source / "run.sh"
    script.write_text("#!/bin/bash\necho ran\n")
    script.chmod(0o755)
    out = tmp_path / "out"
    async with running(tmp_path, env_dir(tmp_path, "FROM x\nWORKDIR /app\n")) as env:
        await env.upload_dir(source, "/solution")
        await env.upload_file(script, "/installed-agent/bin/run.sh")
        ran = await env.exec("/solution/run.sh && /installed-agent/bin/run.sh")
        await env.exec("mkdir -p /logs/agent/deep && echo log > /logs/agent/deep/a.txt")
        await env.download_dir("/logs/agent", out / "agent")
        await env.download_file("/solution/sub/data.txt", out / "data.txt")
        with pytest.raises(FileNotFoundError):
            await env.download_file("/nope.txt", out / "nope.txt")
    assert ran.stdout == "ran\nran\n"
    assert (out / "agent" / "deep" / "a.txt").read_text() == "log\n"
    assert (out / "data.txt").read_text() == "payload\n"
    assert not (out / "nope.txt").exists()


async def test_symlinks_made_in_the_sandbox_never_reach_host_files(
    tmp_path: Path, transfers: str
) -> None:
    out = tmp_path / "out"
    async with running(tmp_path, env_dir(tmp_path, "FROM x\nWORKDIR /app\n")) as env:
        await env.exec(
            "ln -s /etc/passwd /logs/agent/abs-link && "
            "ln -s ../../../../../../etc/passwd /logs/agent/rel-link && echo fine > /logs/agent/ok"
        )
        await env.download_dir("/logs/agent", out)
        await env.download_file("/logs/agent/abs-link", tmp_path / "passwd")
    assert (out / "ok").read_text() == "fine\n"
    assert not (out / "abs-link").exists() and not (out / "abs-link").is_symlink()
    assert not (out / "rel-link").exists() and not (out / "rel-link").is_symlink()
    # The link resolves inside the sandbox: its private /etc/passwd, not the host's.
    assert (tmp_path / "passwd").read_text().splitlines()[0].startswith("root:x:0:0")
    assert len((tmp_path / "passwd").read_text().splitlines()) == 2


async def test_run_step_is_refused_naming_the_line(tmp_path: Path) -> None:
    environment = env_dir(
        tmp_path, "FROM ubuntu:24.04\nWORKDIR /app\nRUN apt-get update && apt-get install -y jq\n"
    )
    with pytest.raises(UnsupportedDockerfileError, match=r"Dockerfile:3: RUN apt-get update"):
        make_environment(tmp_path, environment)


def test_prebuilt_image_and_compose_tasks_are_refused(tmp_path: Path) -> None:
    compose = env_dir(tmp_path, "FROM x\n", **{"docker-compose.yaml": "services: {}\n"})
    with pytest.raises(UnsupportedDockerfileError, match="compose"):
        make_environment(tmp_path, compose)


def test_preflight_names_the_missing_bwrap_and_the_install_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    missing = "/nonexistent/bin/bwrap"
    problem = sandbox_problem(missing)
    assert problem is not None and missing in problem and INSTALL_HINT in problem
    with pytest.raises(SystemExit, match="apt-get install bubblewrap"):
        LocalEnvironment.preflight(bwrap=missing)
    monkeypatch.setenv("ROLLWIRE_BWRAP", missing)
    with pytest.raises(SystemExit, match=missing):
        LocalEnvironment.preflight()
    monkeypatch.delenv("ROLLWIRE_BWRAP")
    LocalEnvironment.preflight()  # the real one is installed here


async def test_start_without_bwrap_fails_clearly(tmp_path: Path) -> None:
    env = make_environment(tmp_path, env_dir(tmp_path, "FROM x\n"), bwrap="/nonexistent/bin/bwrap")
    with pytest.raises(RuntimeError, match="apt-get install bubblewrap"):
        await env.start(force_build=False)
    assert not (tmp_path / "sandboxes").exists()


async def test_stale_roots_of_dead_processes_are_swept(tmp_path: Path) -> None:
    stale = tmp_path / "sandboxes" / "rollwire-sbx-stale"
    (stale / "fs").mkdir(parents=True)
    (stale / "owner.json").write_text('{"pid": 999999999, "start": "1"}')
    async with running(tmp_path, env_dir(tmp_path, "FROM x\n")):
        assert not stale.exists()
    assert os.listdir(tmp_path / "sandboxes") == []


async def test_dockerfile_user_is_the_default_and_transfers_still_work(
    tmp_path: Path, transfers: str
) -> None:
    script = tmp_path / "s.sh"
    script.write_text("echo hi\n")
    async with running(tmp_path, env_dir(tmp_path, "FROM x\nWORKDIR /tmp\nUSER nobody\n")) as env:
        default = await env.exec("id -u")
        as_root = await env.exec("id -u", user="root")
        await env.upload_file(script, "/root/private/s.sh")
        landed = await env.exec("cat /root/private/s.sh", user="root")
    assert (default.stdout, as_root.stdout, landed.stdout) == ("65534\n", "0\n", "echo hi\n")


async def test_a_no_network_task_stays_offline_even_when_network_is_allowed(
    tmp_path: Path,
) -> None:
    from harbor.models.task.config import NetworkMode, NetworkPolicy

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    policy = NetworkPolicy(network_mode=NetworkMode.NO_NETWORK)
    try:
        async with running(
            tmp_path, env_dir(tmp_path, "FROM x\n"), network=True, network_policy=policy
        ) as env:
            result = await env.exec(f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo reached")
    finally:
        listener.close()
    assert result.return_code != 0 and result.stdout is None


async def test_auto_mounted_output_dirs_write_straight_to_the_trial(tmp_path: Path) -> None:
    env = make_environment(tmp_path, env_dir(tmp_path, "FROM x\n"), auto_mounting=True)
    await env.start(force_build=False)
    try:
        await env.exec("echo 0.5 > /logs/verifier/reward.txt")
        assert env.is_path_mounted("/logs/verifier", env.trial_paths.verifier_dir)
    finally:
        await env.stop(delete=True)
    assert (env.trial_paths.verifier_dir / "reward.txt").read_text() == "0.5\n"


async def test_concurrent_sandboxes_never_kill_each_others_processes(tmp_path: Path) -> None:
    # A stopped sandbox's pid-namespace number is reused by the kernel at once: a sweep by that
    # number after the namespace died used to kill a sandbox starting at the same moment.
    environment = EXAMPLES / "count-errors" / "environment"
    failures: list[str] = []

    async def cycle(i: int) -> None:
        for j in range(10):
            try:
                async with running(tmp_path / f"w{i}-{j}", environment) as env:
                    result = await env.exec("sleep 0.02; echo alive")
                    if result.return_code != 0 or (result.stdout or "").strip() != "alive":
                        failures.append(f"{i}/{j}: rc={result.return_code} {result.stderr!r}")
            except Exception as exc:  # the bug surfaced as start failures and missing /proc entries
                failures.append(f"{i}/{j}: {type(exc).__name__}: {exc}")

    async with asyncio.TaskGroup() as tg:
        for i in range(8):
            tg.create_task(cycle(i))
    assert failures == []


async def test_transfers_by_this_process_spawn_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "payload"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "data.txt").write_text("payload\n")
    spawned: list[object] = []
    real = asyncio.create_subprocess_exec

    async def spy(*args: object, **kwargs: object) -> object:
        spawned.append(args[0])
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    async with running(tmp_path, env_dir(tmp_path, "FROM x\nWORKDIR /app\n")) as env:
        await env.exec("mkdir -p /logs/agent && echo log > /logs/agent/a.txt")
        monkeypatch.setattr(asyncio, "create_subprocess_exec", spy)
        await env.upload_dir(source, "/solution")
        await env.upload_file(source / "sub" / "data.txt", "/tests/data.txt")
        await env.download_dir("/logs/agent", tmp_path / "out")
        await env.download_file("/solution/sub/data.txt", tmp_path / "data.txt")
        assert await env.is_dir("/solution/sub") and not await env.is_dir("/tests/data.txt")
        assert await env.is_file("/tests/data.txt") and not await env.is_file("/nope")
        monkeypatch.setattr(asyncio, "create_subprocess_exec", real)
        check = await env.exec("cat /solution/sub/data.txt /tests/data.txt")
    assert spawned == []
    assert check.stdout == "payload\npayload\n"
    assert (tmp_path / "out" / "a.txt").read_text() == "log\n"
    assert (tmp_path / "data.txt").read_text() == "payload\n"


async def test_uploads_follow_sandbox_links_inside_the_sandbox_only(
    tmp_path: Path, transfers: str
) -> None:
    # A link the sandbox made to an absolute path names *its* path, never the host's, even
    # when the host has that path.
    host_dir = tmp_path / "host-dir"
    host_dir.mkdir()
    source = tmp_path / "payload"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "f.txt").write_text("new\n")
    (source / "note.txt").write_text("note\n")
    async with running(tmp_path, env_dir(tmp_path, "FROM x\nWORKDIR /app\n")) as env:
        await env.exec(
            f"mkdir -p {host_dir} && ln -s {host_dir} /app/link && mkdir -p /dst && "
            "ln -s /etc /dst/sub && "
            "ln -s ../../../../../../../../etc/passwd /dst/note.txt"
        )
        await env.upload_file(source / "note.txt", "/app/link/deep/x.txt")
        await env.upload_dir(source, "/dst")
        landed = await env.exec(
            f"cat {host_dir}/deep/x.txt; test -L /dst/sub || cat /dst/sub/f.txt; "
            "test -L /dst/note.txt || cat /dst/note.txt; test -e /etc/f.txt || echo etc-untouched; "
            "head -c 5 /etc/passwd"
        )
        assert await env.is_dir(f"{host_dir}/deep")
    assert landed.stdout == "note\nnew\nnote\netc-untouched\nroot:"
    assert list(host_dir.iterdir()) == []  # the host's directory of that name got nothing


async def test_transfers_keep_modes_and_hard_links_and_respect_read_only_mounts(
    tmp_path: Path, transfers: str
) -> None:
    source = tmp_path / "payload"
    source.mkdir()
    (source / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (source / "run.sh").chmod(0o751)
    os.link(source / "run.sh", source / "again.sh")
    (source / "secret").write_text("s\n")
    (source / "secret").chmod(0o600)
    async with running(tmp_path, env_dir(tmp_path, "FROM x\nWORKDIR /app\n")) as env:
        await env.upload_dir(source, "/opt/tool")
        await env.upload_file(source / "run.sh", "/opt/one/run.sh")
        modes = await env.exec(
            "stat -c '%n %a %h' /opt/tool/run.sh /opt/tool/again.sh /opt/tool/secret "
            "/opt/one/run.sh && /opt/one/run.sh"
        )
        with pytest.raises(RuntimeError, match="failed in the local sandbox"):
            await env.upload_file(source / "secret", "/usr/rollwire-should-not-exist")
        with pytest.raises(RuntimeError, match="failed in the local sandbox"):
            await env.download_dir("/nope", tmp_path / "out")
    assert modes.stdout == (
        "/opt/tool/run.sh 751 2\n/opt/tool/again.sh 751 2\n/opt/tool/secret 600 1\n"
        "/opt/one/run.sh 751 1\nran\n"
    )
    assert not (Path("/usr") / "rollwire-should-not-exist").exists()


async def test_fifos_in_the_sandbox_never_block_a_download(tmp_path: Path, transfers: str) -> None:
    out = tmp_path / "out"
    async with running(tmp_path, env_dir(tmp_path, "FROM x\nWORKDIR /app\n")) as env:
        await env.exec("mkfifo /logs/agent/pipe && echo fine > /logs/agent/ok")
        await env.download_dir("/logs/agent", out)
        if transfers == "host":  # cat would wait for a writer; this process refuses at once
            with pytest.raises(FileNotFoundError, match="not a regular file"):
                await env.download_file("/logs/agent/pipe", tmp_path / "pipe")
    assert sorted(p.name for p in out.iterdir()) == ["ok"]


def test_the_private_etc_is_a_faithful_copy_of_the_hosts_files(tmp_path: Path) -> None:
    from rollwire.harnesses.harbor.local import _ETC_COPIED, _ETC_NETWORK, _make_skeleton

    for attempt in range(2):  # the second from what was read the first time
        fs = tmp_path / f"fs{attempt}"
        _make_skeleton(fs, hostname="h", network=True)
        compared = 0
        for name in (*_ETC_COPIED, *_ETC_NETWORK):
            host = Path("/etc", name)
            if not (host.is_symlink() or host.is_dir() or host.is_file()):
                assert not (fs / "etc" / name).exists() and not (fs / "etc" / name).is_symlink()
                continue
            paths = (
                [host, *sorted(host.rglob("*"))]
                if host.is_dir() and not host.is_symlink()
                else [host]
            )
            for path in paths:
                copy = fs / "etc" / path.relative_to("/etc")
                if path.is_symlink():
                    assert os.readlink(copy) == os.readlink(path), copy
                elif path.is_dir():
                    assert copy.is_dir() and not copy.is_symlink(), copy
                elif path.is_file():
                    assert copy.read_bytes() == path.read_bytes(), copy
                    assert copy.stat().st_mtime_ns == path.stat().st_mtime_ns, copy
                if not path.is_symlink():
                    assert copy.stat().st_mode == path.stat().st_mode, copy
                compared += 1
        assert compared > 10
