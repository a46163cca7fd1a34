"""Sandbox availability: real checks (a bwrap sandbox, a Docker daemon), isolated, fast, no raise."""

from __future__ import annotations

import importlib
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harbor.environments import factory
from harbor.models.environment_type import EnvironmentType
from harbor.models.trial.config import EnvironmentConfig

from rollwire.harnesses.harbor import sandboxes
from rollwire.harnesses.harbor.local import BWRAP_ENV, INSTALL_HINT, sandbox_problem
from rollwire.harnesses.harbor.sandboxes import (
    SandboxStatus,
    available_sandboxes,
    sandbox_import_path,
    sandbox_names,
)


def by_name(statuses: list[SandboxStatus]) -> dict[str, SandboxStatus]:
    return {s.name: s for s in statuses}


def summary(statuses: list[SandboxStatus]) -> dict[str, tuple[bool, str | None]]:
    return {s.name: (s.available, s.reason) for s in statuses}


def fake_binary(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def no_docker_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No DOCKER_HOST, no context, an empty Docker config dir: the default socket is used."""
    for var in ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_TLS_VERIFY"):
        monkeypatch.delenv(var, raising=False)
    config = tmp_path / "docker-config"
    config.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    return config


class FakeDaemon:
    """A unix socket that answers like dockerd's /_ping and /info (or never answers at all)."""

    def __init__(self, *, answer: bool = True, info: bytes = b"{}") -> None:
        self.dir = tempfile.mkdtemp(prefix="rw-dkr-", dir="/tmp")  # unix paths must be short
        self.path = os.path.join(self.dir, "docker.sock")
        self.answer = answer
        self.info = info
        self.requests: list[bytes] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(8)
        self.server.settimeout(0.1)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        held: list[socket.socket] = []
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self.answer:
                held.append(conn)  # accept, read nothing, say nothing
                continue
            with conn:
                conn.settimeout(1)
                request = conn.recv(4096)
                self.requests.append(request)
                body = self.info if request.startswith(b"GET /info") else b"OK"
                conn.sendall(
                    b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
        for conn in held:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        self.server.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def fake_docker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_docker_config: Path
) -> Iterator[Path]:
    """A docker client on PATH (a stub): the daemon is whatever DOCKER_HOST the test sets."""
    bin_dir = tmp_path / "bin"
    fake_binary(bin_dir, "docker")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    yield no_docker_config


# --- local -----------------------------------------------------------------------------------


def test_local_is_available_here_with_a_real_sandbox_probe() -> None:
    assert sandbox_problem() is None, "these tests need bubblewrap: " + INSTALL_HINT
    (local,) = available_sandboxes(["local"])
    assert local.available, local.reason
    assert local.live_checked and local.reason is None
    assert local.kind == "local"
    assert local.import_path == "rollwire.harnesses.harbor.local:LocalEnvironment"


def test_local_is_unavailable_with_the_install_hint_when_bwrap_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = str(tmp_path / "no" / "bwrap")
    (local,) = available_sandboxes(["local"], bwrap=missing)
    assert not local.available and not local.live_checked
    assert local.reason is not None
    assert INSTALL_HINT in local.reason and missing in local.reason

    monkeypatch.setenv(BWRAP_ENV, missing)  # the same through the environment variable
    (local,) = available_sandboxes(["local"])
    assert not local.available
    assert local.reason is not None and "apt-get install bubblewrap" in local.reason


# --- docker ----------------------------------------------------------------------------------


def test_docker_is_unavailable_when_no_daemon_answers(
    fake_docker: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """This machine's own case (a docker client, no daemon), set up so it holds anywhere."""
    socket_path = tmp_path / "docker.sock"  # nothing listens there
    monkeypatch.setenv("DOCKER_HOST", f"unix://{socket_path}")
    docker = by_name(available_sandboxes(["docker", "kata"]))
    for name in ("docker", "kata"):  # kata runs through the same daemon
        assert not docker[name].available
        assert f"daemon answers at {socket_path}" in (docker[name].reason or "")
    assert "docker client found" in (docker["kata"].reason or "")  # kata is Harbor's: CLI too


def test_docker_is_available_when_a_daemon_answers_no_compose_needed(
    fake_docker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rollwire's docker sandbox speaks the Engine API: a daemon that answers is enough."""
    daemon = FakeDaemon()
    try:
        monkeypatch.setenv("DOCKER_HOST", f"unix://{daemon.path}")
        (docker,) = available_sandboxes(["docker"])
        assert docker.available, docker.reason
        assert docker.live_checked and docker.reason is None
        assert docker.import_path == "rollwire.harnesses.harbor.docker:DockerEnvironment"
        assert daemon.requests and daemon.requests[0].startswith(b"GET /_ping ")
    finally:
        daemon.close()


def test_a_socket_that_never_answers_is_no_daemon_and_costs_under_a_second(
    fake_docker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = FakeDaemon(answer=False)
    try:
        monkeypatch.setenv("DOCKER_HOST", f"unix://{daemon.path}")
        start = time.perf_counter()
        (docker,) = available_sandboxes(["docker"])
        assert time.perf_counter() - start < 1.0
        assert not docker.available
        assert docker.reason is not None
        assert f"daemon answers at {daemon.path}" in docker.reason
        assert "did not answer" in docker.reason
    finally:
        daemon.close()


def test_docker_context_is_followed(fake_docker: Path) -> None:
    import hashlib
    import json

    meta = fake_docker / "contexts" / "meta" / hashlib.sha256(b"remote").hexdigest()
    meta.mkdir(parents=True)
    (meta / "meta.json").write_text(
        json.dumps(
            {"Name": "remote", "Endpoints": {"docker": {"Host": "unix:///tmp/rw-nope.sock"}}}
        )
    )
    (fake_docker / "config.json").write_text(json.dumps({"currentContext": "remote"}))
    (docker,) = available_sandboxes(["docker"])
    assert not docker.available
    assert docker.reason is not None
    assert "daemon answers at /tmp/rw-nope.sock" in docker.reason
    assert "context 'remote'" in docker.reason


def test_no_docker_client_is_its_own_reason(
    no_docker_config: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    (kata,) = available_sandboxes(["kata"])  # Harbor's: it runs the docker CLI
    assert not kata.available
    assert kata.reason is not None and "docker client not found" in kata.reason


# --- binaries and clouds ---------------------------------------------------------------------


def test_singularity_needs_its_binary_not_just_harbors_preflight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    (status,) = available_sandboxes(["singularity"])
    assert not status.available
    assert status.reason is not None and "singularity binary is not on PATH" in status.reason

    fake_binary(bin_dir, "apptainer")  # Harbor calls `singularity` by name
    (status,) = available_sandboxes(["singularity"])
    assert not status.available
    assert status.reason is not None and "ln -s" in status.reason

    fake_binary(bin_dir, "singularity")
    (status,) = available_sandboxes(["singularity"])
    assert status.available, status.reason
    assert not status.live_checked and "no container was started" in (status.reason or "")


def test_credentials_alone_are_not_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "e2b", None)  # the SDK is not importable, installed or not
    monkeypatch.setenv("E2B_API_KEY", "e2b_fake")  # Harbor's own preflight would pass now
    (e2b,) = available_sandboxes(["e2b"])
    assert not e2b.available
    assert e2b.reason is not None
    assert "SDK not installed" in e2b.reason and "harbor[e2b]" in e2b.reason


def test_a_cloud_backend_with_sdk_and_credentials_is_available_without_a_live_check(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """EC2 through Harbor's real class and preflight (boto3 + ssh), with fake keys: no network."""
    import boto3  # noqa: F401 - a dependency (harbor's): present wherever rollwire is

    fake_binary(tmp_path / "bin", "ssh")  # Harbor's preflight only looks for the binary
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("AWS_SHARED_CREDENTIALS_FILE", raising=False)
    monkeypatch.delenv("AWS_CONFIG_FILE", raising=False)
    (ec2,) = available_sandboxes(["ec2"])
    assert not ec2.available
    assert ec2.reason is not None and "no AWS credentials" in ec2.reason

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFAKE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake")
    (ec2,) = available_sandboxes(["ec2"])
    assert ec2.available, ec2.reason
    assert not ec2.live_checked
    assert ec2.reason is not None and "no live check was run" in ec2.reason


FAKE_ENV_MODULE = """
import os
from harbor.environments.base import BaseEnvironment
import rw_fake_cloud_sdk  # the vendor SDK

_HAS_RW_FAKE = rw_fake_cloud_sdk.COMPLETE

class FakeCloudEnvironment(BaseEnvironment):
    @classmethod
    def preflight(cls):
        if os.environ.get("RW_FAKE_PREFLIGHT") == "crash":
            raise RuntimeError("preflight blew up")
        if not os.environ.get("RW_FAKE_KEY"):
            raise SystemExit("Fake cloud requires RW_FAKE_KEY.")
"""


FAKE_MODULES = ("rw_fake_cloud_sdk", "rw_fake_cloud_env")


@pytest.fixture
def fake_cloud(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """Harbor's `modal` slot pointed at a fake class whose SDK and preflight we control."""
    for module in FAKE_MODULES:
        sys.modules.pop(module, None)
    (tmp_path / "rw_fake_cloud_sdk.py").write_text("COMPLETE = True\n")
    (tmp_path / "rw_fake_cloud_env.py").write_text(FAKE_ENV_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(
        factory._ENVIRONMENT_REGISTRY,
        EnvironmentType.MODAL,
        factory._EnvEntry("rw_fake_cloud_env", "FakeCloudEnvironment", "modal"),
    )
    monkeypatch.setitem(
        sandboxes._BACKENDS,
        "modal",
        sandboxes._Backend("cloud", ("rw_fake_cloud_sdk",), "modal", harbor_preflight=True),
    )
    monkeypatch.delenv("RW_FAKE_KEY", raising=False)
    importlib.invalidate_caches()
    yield "modal"
    for module in FAKE_MODULES:
        sys.modules.pop(module, None)


def test_harbors_preflight_is_required_and_its_exit_is_a_reason(
    fake_cloud: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (status,) = available_sandboxes([fake_cloud])
    assert not status.available
    assert status.reason == "Harbor's preflight: Fake cloud requires RW_FAKE_KEY."

    monkeypatch.setenv("RW_FAKE_KEY", "k")
    (status,) = available_sandboxes([fake_cloud])
    assert status.available and not status.live_checked
    assert status.reason is not None and "no live check was run" in status.reason
    assert status.import_path == "rw_fake_cloud_env:FakeCloudEnvironment"

    monkeypatch.setenv("RW_FAKE_PREFLIGHT", "crash")
    (status,) = available_sandboxes([fake_cloud])
    assert not status.available
    assert status.reason is not None and "RuntimeError: preflight blew up" in status.reason


def test_an_incomplete_sdk_flag_in_harbors_module_is_reported(
    fake_cloud: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "rw_fake_cloud_sdk.py").write_text("COMPLETE = False\n")
    monkeypatch.setenv("RW_FAKE_KEY", "k")
    (status,) = available_sandboxes([fake_cloud])
    assert not status.available
    assert status.reason is not None and "_HAS_RW_FAKE is False" in status.reason


# --- isolation, speed, never raising ---------------------------------------------------------


def test_every_harbor_environment_type_is_listed_after_local() -> None:
    statuses = available_sandboxes()
    names = [s.name for s in statuses]
    assert names[0] == "local"
    assert names == sandbox_names()
    assert set(names[1:]) == {member.value for member in EnvironmentType}
    for status in statuses:
        assert status.kind != "unknown", status.name  # every type has a check of ours
        assert status.import_path == sandbox_import_path(status.name)
        if not status.available:
            assert status.reason, status.name


def test_an_import_failure_is_reported_for_that_backend_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    fake_binary(bin_dir, "singularity")  # its capability check passes, so its class is imported
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    baseline = summary(available_sandboxes())
    assert baseline["singularity"][0], baseline["singularity"]

    monkeypatch.setitem(
        factory._ENVIRONMENT_REGISTRY,
        EnvironmentType.SINGULARITY,
        factory._EnvEntry("rollwire_no_such_module.singularity", "SingularityEnvironment", None),
    )
    monkeypatch.setattr(sandboxes, "LOCAL_IMPORT_PATH", "rollwire_no_such_module:LocalEnvironment")
    after = summary(available_sandboxes())
    for name in ("singularity", "local"):
        available, reason = after[name]
        assert not available
        assert reason is not None and "does not import" in reason
        assert "ModuleNotFoundError" in reason and "rollwire_no_such_module" in reason
    others = {k: v for k, v in after.items() if k not in ("singularity", "local")}
    assert others == {k: v for k, v in baseline.items() if k not in ("singularity", "local")}


def test_a_crashing_check_is_that_backends_problem_and_nothing_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def boom() -> sandboxes._Verdict:
        raise RuntimeError("kaboom")

    def leave() -> sandboxes._Verdict:
        raise SystemExit("a check that exits")

    baseline = summary(available_sandboxes())
    monkeypatch.setitem(sandboxes._BACKENDS, "podman", sandboxes._Backend("container", check=boom))
    monkeypatch.setitem(
        sandboxes._BACKENDS, "openshift", sandboxes._Backend("cluster", check=leave)
    )
    after = summary(available_sandboxes())
    assert after["podman"] == (False, "the capability check failed: RuntimeError: kaboom")
    assert after["openshift"] == (
        False,
        "the capability check failed: SystemExit: a check that exits",
    )
    assert {k: v for k, v in after.items() if k not in ("podman", "openshift")} == {
        k: v for k, v in baseline.items() if k not in ("podman", "openshift")
    }


def test_a_broken_harbor_registry_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        def items(self) -> object:
            raise RuntimeError("registry moved")

    monkeypatch.setattr(factory, "_ENVIRONMENT_REGISTRY", Broken())
    statuses = by_name(available_sandboxes())
    assert statuses["local"].available, statuses["local"].reason
    assert not statuses["e2b"].available
    assert "registry moved" in (statuses["e2b"].reason or "")
    assert by_name(available_sandboxes(["no-such-sandbox"]))["no-such-sandbox"].available is False


def test_unknown_names_are_reported_not_raised() -> None:
    (status,) = available_sandboxes(["no-such-sandbox"])
    assert not status.available
    assert status.reason is not None and "no environment type 'no-such-sandbox'" in status.reason


def test_all_checks_together_take_under_a_second() -> None:
    available_sandboxes()  # the first call may import Harbor's modules
    start = time.perf_counter()
    statuses = available_sandboxes()
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, sorted((s.seconds, s.name) for s in statuses)[-5:]


# --- import paths ----------------------------------------------------------------------------


def test_sandbox_import_path_builds_environment_configs() -> None:
    from rollwire.harnesses.harbor.trial import LOCAL_IMPORT_PATH

    assert sandbox_import_path("local") == LOCAL_IMPORT_PATH
    assert sandbox_import_path("docker") == "rollwire.harnesses.harbor.docker:DockerEnvironment"
    assert sandbox_import_path(EnvironmentType.E2B) == "harbor.environments.e2b:E2BEnvironment"
    assert sandbox_import_path("my.module:MyEnv") == "my.module:MyEnv"
    for name in sandbox_names():
        config = EnvironmentConfig(import_path=sandbox_import_path(name))
        assert config.import_path and ":" in config.import_path
    with pytest.raises(ValueError, match=r"unknown sandbox 'nope'.*local"):
        sandbox_import_path("nope")
