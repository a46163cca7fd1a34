"""The ``local`` sandbox: a Harbor environment on bubblewrap, for tasks that need no Docker build.

Each environment gets a per-trial root directory on the host that becomes the sandbox's ``/``:
tasks see their real paths (``/app`` or the Dockerfile's ``WORKDIR``, ``/logs/agent``,
``/logs/verifier``, ``/logs/artifacts``, ``/tests``, ``/solution``, ``/installed-agent``) with
nothing rewritten. The host's ``/usr`` (and ``/etc/alternatives``, ``/etc/ssl/certs``) is mounted
read-only; ``/etc`` is a small private copy. One long-lived bwrap "holder" owns the sandbox's
pid, network, ipc and uts namespaces; every ``exec`` joins them with ``nsenter`` and drops to
Docker's default capability set with ``setpriv``, so background processes (a tmux server, a
web server) outlive the exec that started them, exactly as in a container, and share its
loopback. Killing the holder (pid 1 of the namespace) kills everything, which is how ``stop``
and the death of this process (``--die-with-parent``) clean up. No network unless asked
(``network=True``). The Dockerfile is honoured as far as :mod:`.dockerfile` says; ``RUN`` fails.
Files travel without a process: this one reads and writes them through a handle on the
sandbox's root, every path resolved inside it (:mod:`.sandboxfs`; cat/tar in the sandbox where the
kernel lacks ``openat2``).

Not done here: resource limits (cpus/memory are accepted and not enforced), GPUs, network
allowlists, docker-compose tasks and prebuilt ``docker_image`` tasks (both refused clearly).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, override

import anyio
from harbor.environments.base import (
    BaseEnvironment,
    ExecResult,
    transfer_tar_filter,
)
from harbor.environments.capabilities import (
    EnvironmentCapabilities,
    EnvironmentResourceCapabilities,
)
from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
from harbor.models.task.config import NetworkMode
from harbor.models.trial.paths import TrialPaths

from rollwire.harnesses.harbor import sandboxfs
from rollwire.harnesses.harbor.dockerfile import (
    DockerfilePlan,
    UnsupportedDockerfileError,
    apply_plan,
    make_dir,
    plan_dockerfile,
)
from rollwire.harnesses.harbor.gate import GateSlot

TYPE = "local"
INSTALL_HINT = "apt-get install bubblewrap"
BWRAP_ENV = "ROLLWIRE_BWRAP"  # path of the bwrap binary
SANDBOX_DIR_ENV = "ROLLWIRE_SANDBOX_DIR"  # where per-trial roots are made
EXEC_MARKER = "ROLLWIRE_EXEC"  # set in every exec, so its escaped children can be found

# Sandbox paths mounted read-only from the host (when the host has them).
HOST_READ_ONLY = ("/usr", "/etc/alternatives", "/etc/ssl/certs")  # not /etc/ssl/private
_TOP_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_KERNEL_PATHS = ("/proc", "/dev", "/sys")
_ETC_COPIED = (
    "nsswitch.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "profile",
    "bash.bashrc",
    "inputrc",
    "shells",
    "mime.types",
    "protocols",
    "services",
    "os-release",
    "debian_version",
    "lsb-release",
    "magic",
    "magic.mime",
    "terminfo",
    "login.defs",
)
_ETC_NETWORK = ("resolv.conf", "gai.conf", "host.conf")
# Docker's default capabilities, minus mknod (Docker pairs it with a device cgroup; we cannot).
_CAPS = (
    "-all,+chown,+dac_override,+fowner,+fsetid,+kill,+setgid,+setuid,+setpcap,"
    "+net_bind_service,+net_raw,+sys_chroot,+audit_write,+setfcap"
)
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_READ_CHUNK = 64 * 1024
_PIPE_GRACE_SEC = 0.5  # how long output is still read after the command exits
_ROOT_USERS = (None, 0, "0", "root", "0:0", "root:root")
_READY = "rollwire-sandbox-ready"

logger = logging.getLogger(__name__)


class SandboxUnavailableError(RuntimeError):
    """The local sandbox cannot run on this machine; the message says why and how to fix it."""


class ExecTimeoutError(RuntimeError):
    """A command ran past its timeout; it and everything it started were killed."""


def bwrap_path(explicit: str | None = None) -> str:
    """The bwrap binary: the argument, else ``$ROLLWIRE_BWRAP``, else the one on PATH."""
    return explicit or os.environ.get(BWRAP_ENV) or _which("bwrap", os.environ.get("PATH"))


def _which(name: str, path: str | None) -> str:
    found = _FOUND.get((name, path))
    if found is None or not os.access(found, os.X_OK):
        found = shutil.which(name, path=path)
        if found is None:
            return f"/usr/bin/{name}"  # not remembered: installing it later is seen
        _FOUND[(name, path)] = found
    return found


_FOUND: dict[tuple[str, str | None], str] = {}


def probed(bwrap: str | None = None) -> bool:
    """Whether this bwrap already made a working sandbox here (and is still there): a cheap
    check, without the look-ups of :func:`sandbox_problem`, for every later sandbox."""
    path = bwrap_path(bwrap)
    return path in _WORKING and os.access(path, os.X_OK)


def sandbox_problem(bwrap: str | None = None) -> str | None:
    """Why the local sandbox cannot run here (None when it can); probes a real sandbox once."""
    path = bwrap_path(bwrap)
    if not sys.platform.startswith("linux"):
        return f"the local sandbox needs Linux (bubblewrap); this is {sys.platform}"
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        return (
            f"bubblewrap not found at {path}: install it (`{INSTALL_HINT}`) "
            f"or point ${BWRAP_ENV} at it"
        )
    for tool in ("nsenter", "setpriv"):
        if shutil.which(tool) is None or not Path("/usr/bin", tool).exists():
            return f"{tool} (util-linux) not found in /usr/bin: `apt-get install util-linux`"
    if path in _WORKING:
        return None
    problem = _probe(path)
    if problem is None:
        _WORKING.add(path)
    return problem


_WORKING: set[str] = set()  # bwrap binaries whose probe passed (failures are retried)


def _probe(bwrap: str) -> str | None:
    """Start a throwaway sandbox and run ``true`` in it, the way every exec will."""
    with tempfile.TemporaryDirectory(prefix="rollwire-probe-") as tmp:
        fs = Path(tmp) / "fs"
        _make_skeleton(fs, hostname="probe", network=False)
        read_fd, write_fd = os.pipe()
        try:
            holder = subprocess.Popen(
                _holder_argv(bwrap, fs, [], network=False, hostname="probe", info_fd=write_fd),
                pass_fds=(write_fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except OSError as exc:
            os.close(read_fd)
            os.close(write_fd)
            return f"bubblewrap at {bwrap} does not start: {exc}"
        os.close(write_fd)
        info = None
        try:
            info = _read_info(read_fd, timeout=10.0)
            assert holder.stdout is not None
            if info is None or not _read_ready(holder.stdout.fileno(), timeout=10.0):
                if info is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(info["child-pid"]), signal.SIGKILL)
                else:
                    holder.kill()
                _, err = holder.communicate(timeout=10)
                return f"bubblewrap at {bwrap} cannot make a sandbox here: {err.decode().strip()}"
            pid = int(info["child-pid"])
            argv = _enter_argv(pid, _joins_user_ns(pid), cwd="/", env={"PATH": _PATH}, ids=None)
            done = subprocess.run([*argv, "/bin/true"], capture_output=True, timeout=10)
            if done.returncode != 0:
                return (
                    "cannot enter a bubblewrap sandbox with nsenter "
                    f"(needs root or unprivileged user namespaces): {done.stderr.decode().strip()}"
                )
            return None
        except (OSError, subprocess.SubprocessError, ValueError, KeyError) as exc:
            return f"bubblewrap sandbox probe failed: {exc}"
        finally:
            if info is not None:  # kill pid 1 first so that bwrap reaps it, as stop() does
                with contextlib.suppress(ProcessLookupError, KeyError, ValueError):
                    os.kill(int(info["child-pid"]), signal.SIGKILL)
            try:
                holder.wait(timeout=5)
            except subprocess.TimeoutExpired:
                holder.kill()
                holder.wait(timeout=10)


# Started, not yet torn down: sandboxes per owner. Harbor stops a cancelled trial's sandbox in a
# task of its own (asyncio.shield), so the trial's cancellation returns before the sandbox is
# gone; an owner that must know it is gone waits here.
_LIVE: dict[str | None, int] = {}


async def settled(owner: str, timeout_s: float = 30.0) -> bool:
    """Wait until every sandbox started for ``owner`` is torn down; False on timeout."""
    with anyio.move_on_after(timeout_s):
        while _LIVE.get(owner):  # noqa: ASYNC110 - set from Harbor's own tasks
            await anyio.sleep(0.02)
        return True
    return False


class LocalEnvironment(BaseEnvironment):
    """Harbor's environment interface over bubblewrap: the ``local`` sandbox.

    Select it with ``EnvironmentConfig(import_path="rollwire.harnesses.harbor.local:LocalEnvironment",
    kwargs={...})``. Keyword settings: ``network`` (False: no network at all; True: the host's
    network unless the task asks for none), ``bwrap`` (path of the binary), ``sandbox_dir``
    (where per-trial roots are made; default ``$ROLLWIRE_SANDBOX_DIR`` or the system temp dir),
    ``max_output_bytes`` (per stream and exec; the tail is kept), ``owner`` (a label
    :func:`settled` waits on), ``gate`` (the key of an open :mod:`~rollwire.harnesses.harbor.gate`:
    the sandbox's only way out, its capture session's data plane on ``127.0.0.1:<port>``).
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
        bwrap: str | None = None,
        sandbox_dir: str | Path | None = None,
        max_output_bytes: int = 16 * 1024 * 1024,
        owner: str | None = None,
        gate: str | None = None,
        **kwargs: Any,
    ):
        self._owner = owner  # who waits for this sandbox to be gone (see `settled`)
        self._gate = GateSlot(gate, network=network)  # its one way out, when it has one
        # Set before the base constructor: it reads capabilities and validates the definition.
        self._bwrap = bwrap_path(bwrap)
        self._allow_network = bool(network)
        self._sandbox_dir = Path(
            sandbox_dir or os.environ.get(SANDBOX_DIR_ENV) or tempfile.gettempdir()
        )
        self._max_output = int(max_output_bytes)
        self._plan: DockerfilePlan | None = None
        self._base: Path | None = None
        self._holder: asyncio.subprocess.Process | None = None
        self._init_pid: int | None = None
        self._pid_ns: str | None = None
        # An open handle on the pid namespace pins its inode number: once the namespace dies
        # the kernel reuses the number at once, and a sweep by number would hit a stranger.
        self._pid_ns_fd: int | None = None
        self._enter_user_ns = False
        # A handle on the sandbox's root (its pid 1's), through which files are transferred by
        # this process (see sandboxfs); None where the kernel lacks openat2: transfers then exec.
        self._root_fd: int | None = None
        self._running: dict[int, asyncio.subprocess.Process] = {}
        self._token = uuid.uuid4().hex[:12]
        self._seq = itertools.count()
        self._stopped = False
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
        # No limits: cpus/memory are accepted (auto) and not enforced; explicit limits are refused.
        return EnvironmentResourceCapabilities(fractional_cpus=True)

    @classmethod
    @override
    def preflight(cls, bwrap: str | None = None) -> None:
        """Exit with the reason when the local sandbox cannot run here (Harbor's CLI contract)."""
        problem = sandbox_problem(bwrap)
        if problem is not None:
            raise SystemExit(problem)

    @override
    def _validate_definition(self) -> None:
        if (self.environment_dir / "docker-compose.yaml").exists():
            raise UnsupportedDockerfileError(
                f"{self.environment_dir}/docker-compose.yaml: compose tasks need Docker; "
                "the local sandbox runs single-container tasks"
            )
        if (
            not (self.environment_dir / "Dockerfile").is_file()
            and self.task_env_config.docker_image
        ):
            raise UnsupportedDockerfileError(
                f"the task uses the prebuilt image {self.task_env_config.docker_image!r} "
                "and has no environment/Dockerfile: images need Docker"
            )
        for mount in self._host_mounts:
            if mount["type"] != "bind":
                raise ValueError(
                    f"mount {mount['target']!r} has type {mount['type']!r}: "
                    "the local sandbox supports bind mounts only"
                )
        self._plan = plan_dockerfile(self.environment_dir)

    # --- lifecycle -----------------------------------------------------------------------

    @property
    def root(self) -> Path | None:
        """The host directory that is the sandbox's ``/`` (None before start / after stop)."""
        return None if self._base is None else self._base / "fs"

    @property
    def workdir(self) -> str:
        """The default working directory: ``[environment].workdir``, else the Dockerfile's."""
        assert self._plan is not None
        return self.task_env_config.workdir or self._plan.workdir

    @property
    def pid_namespace(self) -> str | None:
        """The sandbox's pid namespace (``pid:[inode]``), kept after stop for checking."""
        return self._pid_ns

    def pids(self) -> list[int]:
        """Host pids of every process now in the sandbox (empty once it is stopped)."""
        return [] if self._pid_ns is None else namespace_pids(self._pid_ns)

    @property
    def hostname(self) -> str:
        name = re.sub(r"[^a-z0-9-]+", "-", self.environment_name.lower()).strip("-")
        return (name or "sandbox")[:63]

    @property
    def _network_on(self) -> bool:
        return self._allow_network and self.network_policy.network_mode != NetworkMode.NO_NETWORK

    @override
    async def start(self, force_build: bool) -> None:
        assert self._plan is not None
        problem = (
            None if probed(self._bwrap) else await asyncio.to_thread(sandbox_problem, self._bwrap)
        )
        if problem is not None:
            raise SandboxUnavailableError(problem)
        if self._base is not None:
            raise RuntimeError("this local sandbox is already started")
        self._stopped = False
        _LIVE[self._owner] = _LIVE.get(self._owner, 0) + 1
        self._live = True
        self._sandbox_dir.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(_sweep_stale_roots, self._sandbox_dir)
        self._base = Path(tempfile.mkdtemp(prefix="rollwire-sbx-", dir=self._sandbox_dir))
        try:
            (self._base / "owner.json").write_text(json.dumps(_owner()))
            fs = self._base / "fs"
            await asyncio.to_thread(self._build_root, fs)
            await self._start_holder(fs)
            await self._gate.open(self._init_pid)
        except BaseException:
            await self._teardown(delete=True)
            raise

    def _build_root(self, fs: Path) -> None:
        assert self._plan is not None
        _make_skeleton(fs, hostname=self.hostname, network=self._network_on)
        for mount in self._mounts:
            # Harbor's output dirs (and user mount targets) exist and are writable by any user.
            target = fs / str(mount["target"]).lstrip("/")
            target.mkdir(parents=True, exist_ok=True)
            if not mount.get("read_only"):
                target.chmod(0o777)
        for mount in self._host_mounts:
            source = Path(mount["source"])
            if not source.exists() and mount.get("bind", {}).get("create_host_path", True):
                source.mkdir(parents=True)  # as compose does, unless create_host_path=false
        read_only = (*_read_only_paths(), *_KERNEL_PATHS)
        apply_plan(self._plan, fs, read_only=read_only)
        make_dir(fs, self.workdir, read_only=read_only, where="the working directory")

    async def _start_holder(self, fs: Path) -> None:
        assert self._base is not None
        read_fd, write_fd = os.pipe()
        log = (self._base / "holder.log").open("wb")
        try:
            self._holder = await asyncio.create_subprocess_exec(
                *_holder_argv(
                    self._bwrap,
                    fs,
                    self._host_mounts,
                    network=self._network_on,
                    hostname=self.hostname,
                    info_fd=write_fd,
                ),
                pass_fds=(write_fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        finally:
            os.close(write_fd)
            log.close()
        info = await asyncio.to_thread(_read_info, read_fd, 10.0)
        ready = False
        if info is not None and self._holder.stdout is not None:
            self._init_pid = int(info["child-pid"])
            with contextlib.suppress(TimeoutError):
                line = await asyncio.wait_for(self._holder.stdout.readline(), timeout=10.0)
                ready = line.strip() == _READY.encode()
        if info is None or not ready:
            detail = (self._base / "holder.log").read_text(errors="replace").strip()
            raise SandboxUnavailableError(f"bubblewrap did not start the sandbox: {detail}")
        assert self._init_pid is not None
        self._pid_ns_fd = os.open(f"/proc/{self._init_pid}/ns/pid", os.O_RDONLY)
        self._pid_ns = os.readlink(f"/proc/{self._init_pid}/ns/pid")
        self._enter_user_ns = _joins_user_ns(self._init_pid)
        if sandboxfs.available():
            with contextlib.suppress(OSError):  # not allowed here: transfers exec instead
                self._root_fd = sandboxfs.open_root(self._init_pid)
        logger.debug(
            "local sandbox %s up: root %s, init pid %s", self.session_id, fs, self._init_pid
        )

    @override
    async def stop(self, delete: bool) -> None:
        """Kill every process of the sandbox; remove its root unless ``delete`` is False."""
        await self._teardown(delete=delete)

    async def _teardown(self, *, delete: bool) -> None:
        # Teardown runs when a trial is cancelled too: shielded, or its first await would be
        # cancelled and leave the root (and maybe processes) behind.
        with anyio.CancelScope(shield=True):
            try:
                await self._teardown_now(delete=delete)
            finally:
                if getattr(self, "_live", False):
                    self._live = False
                    _LIVE[self._owner] -= 1
                    if not _LIVE[self._owner]:
                        del _LIVE[self._owner]

    async def _teardown_now(self, *, delete: bool) -> None:
        self._stopped = True
        await self._gate.close()
        if self._init_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._init_pid, signal.SIGKILL)  # pid 1 of the namespace: all die
        for pgid in list(self._running):
            _kill_group(pgid)
        if self._holder is not None and self._holder.returncode is None:
            # bwrap exits once its child (pid 1 of the sandbox) is dead and reaped; killing it
            # first would leave that child a zombie for the host's init to reap.
            try:
                await asyncio.wait_for(self._holder.wait(), timeout=5.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self._holder.kill()
                await self._holder.wait()
        if self._pid_ns is not None and self._pid_ns_fd is not None:
            await asyncio.to_thread(_kill_namespace, self._pid_ns, None)
        if self._pid_ns_fd is not None:
            os.close(self._pid_ns_fd)
            self._pid_ns_fd = None
        if self._root_fd is not None:  # transfers still running hold their own duplicate
            os.close(self._root_fd)
            self._root_fd = None
        if self._base is not None:
            if delete:
                await asyncio.to_thread(_remove_tree, self._base)
            else:
                logger.info("local sandbox root kept at %s (delete=False)", self._base / "fs")
        self._base = None if delete else self._base
        self._init_pid = None

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
        """Run ``bash -c command`` in the sandbox, as Docker's ``exec`` would.

        On timeout the command and everything it started are killed and
        :class:`ExecTimeoutError` is raised (Harbor's docker environment raises too).
        """
        return await self._run(
            ["/bin/bash", "-c", command],
            cwd=cwd or self.workdir,
            env=self._merge_env(env),
            user=self._resolve_user(user),
            timeout_sec=timeout_sec,
        )

    async def _run(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: dict[str, str] | None,
        user: str | int | None,
        timeout_sec: float | None,
        stdin: IO[bytes] | None = None,
        stdout: IO[bytes] | None = None,
    ) -> ExecResult:
        if self._holder is None or self._holder.returncode is not None or self._stopped:
            raise RuntimeError(f"the local sandbox {self.session_id} is not running")
        assert self._plan is not None and self.root is not None
        if user is None:
            user = self._plan.user
        ids = _user_ids(self.root, user)
        if isinstance(ids, str):
            return ExecResult(stdout=None, stderr=ids, return_code=126)
        marker = f"{self._token}-{next(self._seq)}"
        home = ids[2] if ids is not None else "/root"
        full_env = {
            "PATH": _PATH,
            "HOME": home,
            "HOSTNAME": self.hostname,
            "TMUX_TMPDIR": "/tmp",  # inside the per-trial root: one tmux server per sandbox
            **self._plan.env,
            **(env or {}),
            EXEC_MARKER: marker,
        }
        bad = [k for k in full_env if not k or "=" in k or "\0" in k]
        if bad:
            raise ValueError(f"environment variable names {bad!r} are not valid")
        assert self._init_pid is not None
        proc = await asyncio.create_subprocess_exec(
            *_enter_argv(self._init_pid, self._enter_user_ns, cwd=cwd, env=full_env, ids=ids),
            *argv,
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
            stdout=stdout if stdout is not None else subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, killed as one
        )
        self._running[proc.pid] = proc
        callback = self._output_callback()
        out = _Tail(self._max_output)
        err = _Tail(self._max_output)
        readers = [asyncio.create_task(_pump(proc.stderr, err, "stderr", callback))]
        if proc.stdout is not None:
            readers.append(asyncio.create_task(_pump(proc.stdout, out, "stdout", callback)))
        try:
            if timeout_sec:
                await asyncio.wait_for(proc.wait(), timeout=timeout_sec)
            else:
                await proc.wait()
        except TimeoutError:
            await self._kill_exec(proc, marker, readers)
            raise ExecTimeoutError(f"Command timed out after {timeout_sec} seconds") from None
        except BaseException:
            await asyncio.shield(self._kill_exec(proc, marker, readers))
            raise
        finally:
            self._running.pop(proc.pid, None)
        # Background children may hold the pipes open; read what is there, then let go.
        _, pending = await asyncio.wait(readers, timeout=_PIPE_GRACE_SEC)
        for task in pending:
            task.cancel()
        code = proc.returncode if proc.returncode is not None else -1
        return ExecResult(
            stdout=out.text() if proc.stdout is not None else None,
            stderr=err.text(),
            return_code=128 - code if code < 0 else code,
        )

    async def _kill_exec(
        self, proc: asyncio.subprocess.Process, marker: str, readers: list[asyncio.Task[None]]
    ) -> None:
        """Kill an exec's process group and whatever it started that left the group."""
        _kill_group(proc.pid)
        if self._pid_ns is not None and self._pid_ns_fd is not None:
            await asyncio.to_thread(_kill_namespace, self._pid_ns, marker)
        with contextlib.suppress(ProcessLookupError):
            await proc.wait()
        for task in readers:
            task.cancel()

    # --- files ---------------------------------------------------------------------------
    # Transfers resolve every path inside the sandbox, so a symlink an agent made can never point
    # them at a host path: by this process through a handle on the sandbox's root (sandboxfs:
    # openat2 with RESOLVE_IN_ROOT, no process spawned), or, where the kernel lacks openat2, by
    # cat/tar run in the sandbox through a pipe.

    def _root_handle(self) -> int | None:
        """A duplicate of the root handle for one transfer (None: transfer by exec instead)."""
        if self._holder is None or self._holder.returncode is not None or self._stopped:
            raise RuntimeError(f"the local sandbox {self.session_id} is not running")
        return None if self._root_fd is None else os.dup(self._root_fd)

    @override
    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        source = await asyncio.to_thread(Path(source_path).open, "rb")
        with source:
            root = self._root_handle()
            if root is not None:
                await _in_thread(
                    root,
                    f"upload {source_path} -> {target_path}",
                    sandboxfs.upload_file,
                    source,
                    target_path,
                )
                return
            mode = os.fstat(source.fileno()).st_mode & 0o7777
            script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1" && chmod "$2" "$1"'
            result = await self._transfer(
                ["/bin/sh", "-c", script, "sh", target_path, f"{mode:o}"], stdin=source
            )
        _check(result, f"upload {source_path} -> {target_path}")

    @override
    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        source = Path(source_dir)
        await asyncio.to_thread(os.listdir, source)  # a missing source raises as before
        root = self._root_handle()
        if root is not None:
            await _in_thread(
                root,
                f"upload {source_dir}/ -> {target_dir}",
                sandboxfs.upload_dir,
                source,
                target_dir,
            )
            return
        with tempfile.TemporaryFile() as archive:
            await asyncio.to_thread(_pack, source, archive)
            archive.seek(0)
            script = 'mkdir -p -- "$1" && tar -xf - -C "$1" --no-same-owner'
            result = await self._transfer(
                ["/bin/sh", "-c", script, "sh", target_dir], stdin=archive
            )
        _check(result, f"upload {source_dir}/ -> {target_dir}")

    @override
    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{self._token}.part")
        try:
            with partial.open("wb") as sink:
                root = self._root_handle()
                if root is not None:
                    try:
                        await _in_thread(
                            root, "", sandboxfs.download_file, source_path, sink, raw=True
                        )
                    except OSError as exc:
                        raise FileNotFoundError(
                            f"download {source_path} from the local sandbox failed: "
                            f"{exc.strerror or exc}"
                        ) from None
                else:
                    result = await self._transfer(["/bin/cat", "--", source_path], stdout=sink)
                    if result.return_code != 0:
                        raise FileNotFoundError(
                            f"download {source_path} from the local sandbox failed: "
                            f"{(result.stderr or '').strip()}"
                        )
            partial.replace(target)
        finally:
            partial.unlink(missing_ok=True)

    @override
    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        target = Path(target_dir)
        await asyncio.to_thread(target.mkdir, parents=True, exist_ok=True)
        with tempfile.TemporaryFile() as archive:
            root = self._root_handle()
            if root is not None:
                await _in_thread(
                    root,
                    f"download {source_dir}/ -> {target}",
                    sandboxfs.download_dir,
                    source_dir,
                    archive,
                )
            else:
                script = 'cd -- "$1" && tar -cf - .'
                result = await self._transfer(
                    ["/bin/sh", "-c", script, "sh", source_dir], stdout=archive
                )
                _check(result, f"download {source_dir}/ -> {target}")
            archive.seek(0)
            await asyncio.to_thread(_unpack, archive, target, self.logger)

    @override
    async def is_dir(self, path: str, user: str | int | None = None) -> bool:
        mode = self._host_mode(path, user)
        return await super().is_dir(path, user) if mode is None else stat.S_ISDIR(mode)

    @override
    async def is_file(self, path: str, user: str | int | None = None) -> bool:
        mode = self._host_mode(path, user)
        return await super().is_file(path, user) if mode is None else stat.S_ISREG(mode)

    def _host_mode(self, path: str, user: str | int | None) -> int | None:
        """``test``'s view of ``path`` for root, by this process: its mode, 0 when it is not
        there; None when only an exec can say (a non-root user, no openat2, not running)."""
        user = self._resolve_user(user)
        if user is None and self._plan is not None:
            user = self._plan.user
        if user not in _ROOT_USERS or self._root_fd is None or self._stopped:
            return None
        try:
            fd = sandboxfs.openat2(self._root_fd, path, os.O_PATH)
        except OSError:
            return 0  # absent, a dangling link, a loop: `test -d` and `test -f` are false
        try:
            return os.fstat(fd).st_mode
        finally:
            os.close(fd)

    async def _transfer(
        self,
        argv: list[str],
        *,
        stdin: IO[bytes] | None = None,
        stdout: IO[bytes] | None = None,
    ) -> ExecResult:
        return await self._run(
            argv, cwd="/", env=None, user="root", timeout_sec=600, stdin=stdin, stdout=stdout
        )


async def _in_thread(root: int, what: str, func: Any, *args: Any, raw: bool = False) -> None:
    """Run a sandboxfs transfer in a thread on its own root handle (closed when it is done).

    An OSError (a path that is not there, a read-only mount) is a RuntimeError naming ``what``,
    as a failed cat/tar is; ``raw`` lets the caller word it.
    """

    def run() -> None:
        try:
            func(root, *args)
        finally:
            os.close(root)

    try:
        await asyncio.to_thread(run)
    except OSError as exc:
        if raw:
            raise
        detail = f"{exc.strerror}: {exc.filename}" if exc.strerror and exc.filename else exc
        raise RuntimeError(f"{what} failed in the local sandbox: {detail}") from exc


# --- the sandbox's root --------------------------------------------------------------------


def _make_skeleton(fs: Path, *, hostname: str, network: bool) -> None:
    """The directories and private /etc a fresh sandbox root starts with."""
    for name, mode in (
        ("tmp", 0o1777),
        ("var/tmp", 0o1777),
        ("root", 0o700),
        ("home", 0o755),
        ("run", 0o755),
        ("etc", 0o755),
        ("usr", 0o755),
        ("proc", 0o555),
        ("dev", 0o755),
        ("logs", 0o755),
    ):
        path = fs / name
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(mode)
    for name in _TOP_DIRS:
        host = Path("/", name)
        if host.is_symlink():
            os.symlink(os.readlink(host), fs / name)
        elif host.is_dir():
            (fs / name).mkdir(exist_ok=True)
    etc = fs / "etc"
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    (etc / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    (etc / "hostname").write_text(f"{hostname}\n")
    (etc / "hosts").write_text(
        f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{hostname}\n"
    )
    etc_fd = os.open(etc, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        dirs: list[tuple[str, int]] = []
        for name in (*_ETC_COPIED, *(_ETC_NETWORK if network else ())):
            for rel, kind, data, mode, times in _host_etc(name):
                _write_entry(etc_fd, rel, kind, data, mode, times)
                if kind == "dir":
                    dirs.append((rel, mode))
        for rel, mode in reversed(dirs):  # after their contents, as copytree does
            os.chmod(rel, mode, dir_fd=etc_fd)
    finally:
        os.close(etc_fd)


# /etc/<name> of the host as read last: (signature, entries). Every sandbox gets a copy of the same
# few files; reading them once, and again only when one changes (by a stat of each), leaves the
# writes, without copy2's per-file opens of the source, sendfile and metadata copies.
_ETC_CACHE: dict[str, tuple[tuple[Any, ...], list[tuple[str, str, Any, int, tuple[int, int]]]]] = {}


def _host_etc(name: str) -> list[tuple[str, str, Any, int, tuple[int, int]]]:
    """/etc/<name> as (relative path, kind, data, mode, (atime, mtime) ns), parents first.

    The top entry is copied as it is: a symlink as a symlink, a directory with its tree (links
    in it as links), a regular file with its content; anything else (or nothing) is left out.
    """
    source = os.path.join("/etc", name)
    stats: list[tuple[str, os.stat_result]] = []
    try:
        top = os.lstat(source)
    except OSError:
        return []
    stats.append((name, top))
    if stat.S_ISDIR(top.st_mode):
        for dirpath, dirnames, filenames in os.walk(source):
            dirnames.sort()
            for entry in sorted(dirnames + filenames):
                path = os.path.join(dirpath, entry)
                with contextlib.suppress(OSError):
                    stats.append((os.path.relpath(path, "/etc"), os.lstat(path)))
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    signature = tuple(
        (rel, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
        for rel, st in stats
    )
    cached = _ETC_CACHE.get(name)
    if cached is not None and cached[0] == signature:
        return cached[1]
    entries: list[tuple[str, str, Any, int, tuple[int, int]]] = []
    for rel, st in stats:
        path = os.path.join("/etc", rel)
        mode, times = stat.S_IMODE(st.st_mode), (st.st_atime_ns, st.st_mtime_ns)
        try:
            if stat.S_ISLNK(st.st_mode):
                entries.append((rel, "link", os.readlink(path), mode, times))
            elif stat.S_ISDIR(st.st_mode):
                entries.append((rel, "dir", None, mode, times))
            elif stat.S_ISREG(st.st_mode):
                entries.append((rel, "file", Path(path).read_bytes(), mode, times))
        except OSError:
            continue
    _ETC_CACHE[name] = (signature, entries)
    return entries


def _write_entry(
    etc_fd: int, rel: str, kind: str, data: Any, mode: int, times: tuple[int, int]
) -> None:
    if kind == "link":
        os.symlink(data, rel, dir_fd=etc_fd)
    elif kind == "dir":
        os.mkdir(rel, 0o700, dir_fd=etc_fd)  # its mode is set once its entries are in
    else:
        fd = os.open(rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=etc_fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            os.utime(fd, ns=times)
        finally:
            os.close(fd)


def _read_only_paths() -> tuple[str, ...]:
    """Sandbox paths that are the host's, read-only."""
    paths = [p for p in HOST_READ_ONLY if Path(p).exists()]
    paths += [f"/{n}" for n in _TOP_DIRS if Path("/", n).is_dir() and not Path("/", n).is_symlink()]
    return tuple(paths)


def _holder_argv(
    bwrap: str,
    fs: Path,
    binds: Sequence[Any],
    *,
    network: bool,
    hostname: str,
    info_fd: int,
) -> list[str]:
    """The bwrap command of the long-lived process that owns the sandbox's namespaces."""
    argv = [bwrap, "--bind", str(fs), "/"]
    for path in _read_only_paths():
        argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for mount in binds:
        flag = "--ro-bind" if mount.get("read_only") else "--bind"
        argv += [flag, str(mount["source"]), str(mount["target"])]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not network:
        argv.append("--unshare-net")
    argv += [
        "--hostname", hostname,
        "--die-with-parent",  # this process dies -> the holder dies -> every process in it dies
        "--cap-drop", "ALL",
        "--info-fd", str(info_fd),
        "--chdir", "/",
        # Says "ready" once it runs inside the finished sandbox (info-fd comes earlier, before
        # the mounts are done), then holds the namespaces until killed.
        "--", "/bin/sh", "-c", f"echo {_READY}; exec /usr/bin/sleep infinity >/dev/null 2>&1",
    ]  # fmt: skip
    return argv


def _enter_argv(
    init_pid: int,
    user_ns: bool,
    *,
    cwd: str,
    env: dict[str, str],
    ids: tuple[int, int, str] | None,
) -> list[str]:
    """nsenter into the holder's namespaces, drop to Docker's capabilities, set user/env/cwd."""
    argv = ["nsenter", "-t", str(init_pid), "-m", "-u", "-i", "-n", "-p", "-r", "-w"]
    if user_ns:
        argv += ["-U", "--preserve-credentials"]
    argv += ["--", "/usr/bin/setpriv", "--bounding-set", _CAPS]
    if ids is not None:
        argv += ["--reuid", str(ids[0]), "--regid", str(ids[1]), "--clear-groups"]
    argv += ["--", "/usr/bin/env", "-i", "-C", cwd, *(f"{k}={v}" for k, v in env.items())]
    return argv


def _joins_user_ns(pid: int) -> bool:
    """Whether bwrap made a user namespace (unprivileged use) that exec must join too."""
    return os.readlink(f"/proc/{pid}/ns/user") != os.readlink("/proc/self/ns/user")


def _read_info(fd: int, timeout: float) -> dict[str, Any] | None:
    """bwrap's --info-fd JSON, or None if it exited without starting the sandbox."""
    data = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
            with contextlib.suppress(ValueError):
                return json.loads(data)
    finally:
        os.close(fd)
    return json.loads(data) if data.strip() else None


def _read_ready(fd: int, timeout: float) -> bool:
    """Whether the holder said it is ready (it runs inside the finished sandbox) in time."""
    ready, _, _ = select.select([fd], [], [], timeout)
    return bool(ready) and os.read(fd, 256).strip() == _READY.encode()


def _user_ids(fs: Path, user: str | int | None) -> tuple[int, int, str] | str | None:
    """(uid, gid, home) for a non-root user, None for root, or why the user cannot be used."""
    if user in _ROOT_USERS:
        return None
    name, _, group = str(user).partition(":")
    entries = {}
    with contextlib.suppress(OSError):
        for line in (fs / "etc/passwd").read_text().splitlines():
            parts = line.split(":")
            if len(parts) >= 6:
                entries[parts[0]] = (int(parts[2]), int(parts[3]), parts[5])
    if name.isdigit():
        uid = int(name)
        match = next((e for e in entries.values() if e[0] == uid), (uid, uid, "/"))
    elif name in entries:
        match = entries[name]
    else:
        return f"unable to find user {name}: no matching entries in the sandbox's /etc/passwd"
    gid = int(group) if group.isdigit() else match[1]
    return match[0], gid, match[2]


def _owner() -> dict[str, Any]:
    return {"pid": os.getpid(), "start": _start_time(os.getpid())}


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _sweep_stale_roots(sandbox_dir: Path) -> None:
    """Remove roots left by processes that died without stopping their sandboxes."""
    for base in sandbox_dir.glob("rollwire-sbx-*"):
        try:
            owner = json.loads((base / "owner.json").read_text())
        except (OSError, ValueError):
            continue
        if owner.get("start") is None or _start_time(int(owner["pid"])) != owner["start"]:
            _remove_tree(base)


def _remove_tree(path: Path) -> None:
    def fix(func: Any, failed: str, exc: BaseException) -> None:
        # A sandboxed process may have left a directory unwritable; open it up and retry.
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), 0o700)
            os.chmod(failed, 0o700)
        with contextlib.suppress(FileNotFoundError):
            func(failed)

    shutil.rmtree(path, onexc=fix)
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)


# --- processes -----------------------------------------------------------------------------


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def namespace_pids(pid_ns: str, marker: str | None = None) -> list[int]:
    """Host pids of the live processes in a pid namespace (only one exec's, given its marker).

    Zombies (dead, waiting for their parent to reap them) are not counted.
    """
    needle = None if marker is None else f"{EXEC_MARKER}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != pid_ns:
                continue
            if Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if needle is not None:
                environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
                if needle not in environ:
                    continue
        except OSError:
            continue
        found.append(int(entry))
    return found


def _kill_namespace(pid_ns: str, marker: str | None) -> None:
    """SIGKILL every process in the sandbox's pid namespace (only one exec's, given a marker)."""
    for _ in range(20):
        victims = namespace_pids(pid_ns, marker)
        if not victims:
            return
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


class _Tail:
    """The last ``limit`` bytes of a stream, and how many were dropped before them."""

    def __init__(self, limit: int):
        self.limit = limit
        self.data = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        excess = len(self.data) - self.limit
        if excess > 0:
            del self.data[:excess]
            self.dropped += excess

    def text(self) -> str | None:
        if not self.data and not self.dropped:
            return None
        text = self.data.decode(errors="replace")
        return f"[{self.dropped} bytes dropped]\n{text}" if self.dropped else text


async def _pump(stream: asyncio.StreamReader | None, sink: _Tail, name: str, callback: Any) -> None:
    if stream is None:
        return
    while chunk := await stream.read(_READ_CHUNK):
        sink.add(chunk)
        if callback is not None:
            await callback(chunk.decode(errors="replace"), name)


def _check(result: ExecResult, what: str) -> None:
    if result.return_code != 0:
        detail = (result.stderr or result.stdout or "no output").strip()
        raise RuntimeError(f"{what} failed in the local sandbox ({result.return_code}): {detail}")


def _pack(source: Path, archive: IO[bytes]) -> None:
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for entry in sorted(source.iterdir()):
            tar.add(entry, arcname=entry.name)


def _unpack(archive: IO[bytes], target: Path, log: logging.Logger) -> None:
    """Extract a tar made in the sandbox; members that would land outside ``target`` are dropped."""

    def member_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        try:
            return transfer_tar_filter(member, dest)
        except tarfile.FilterError as exc:
            log.warning("skipped %s from the sandbox: %s", member.name, exc)
            return None

    with tarfile.open(fileobj=archive, mode="r") as tar:
        tar.extractall(target, filter=member_filter)
