"""One way out of a sandbox: its capture session's data plane, served inside its own network.

An agent that runs inside a sandbox (claude-code, codex, ...) must reach the capture proxy, and
nothing else: not the engine (calls that bypass capture vanish from the data), not the proxy's
control plane, not the MCP server, not any other host port, not the internet. A policy under RL
training finds such shortcuts, so the sandbox gets no route to any of them.

How: the sandbox keeps a network namespace of its own with loopback only (``local``: bubblewrap's
``--unshare-net``; ``docker``: ``network_mode=none``). Once it is up, this process makes a
listening socket *inside* that namespace (a thread of its own enters it with ``setns``, which
moves only the calling thread, binds ``127.0.0.1:<port>``, and leaves; the socket stays in the
namespace it was made in) and serves on it, from this process, an app that answers one capture
session's data-plane routes only, to that session's key only
(:meth:`rollwire.capture.proxy.CaptureProxy.session_app`). The agent's base URL is
``http://127.0.0.1:<port>`` inside the sandbox. No packet leaves the namespace: the bytes cross
into this process through the socket, and the handlers are the proxy's own.

Ownership: a :func:`gate_host` block (the rollout's) owns a task group; a sandbox whose kwargs
name a gate (``gate=<key>``) calls :meth:`Gate.attach` with a pid of its namespace when it has
started and :meth:`Gate.detach` when it stops; the block's exit stops whatever is still served.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio
from anyio.abc import TaskGroup

from rollwire.serving import serving

GATE_HOST = "127.0.0.1"
_PORT_RANGE = (20000, 60000)

_GATES: dict[str, Gate] = {}


class GateError(RuntimeError):
    """The gate could not be opened in the sandbox's network namespace."""


def listen_in_netns(pid: int, port: int, host: str = GATE_HOST) -> socket.socket:
    """A listening TCP socket on ``host:port`` in the network namespace of process ``pid``.

    Runs in a thread made for it: ``setns(CLONE_NEWNET)`` changes the calling thread only, and
    a thread that could not return to this process's namespace must never serve anything else.
    """
    box: dict[str, Any] = {}

    def enter_bind_leave() -> None:
        try:
            own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
            try:
                target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
            except OSError as exc:
                os.close(own)
                raise GateError(f"process {pid} has no network namespace to enter: {exc}") from None
            try:
                if os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/thread-self/ns/net"):
                    raise GateError(
                        f"process {pid} shares this process's network: the sandbox must have "
                        "a network namespace of its own for a gate"
                    )
                os.setns(target, os.CLONE_NEWNET)
                try:
                    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
                    try:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                        sock.bind((host, port))
                        sock.listen(128)
                        sock.setblocking(False)
                    except OSError:
                        sock.close()
                        raise
                finally:
                    os.setns(own, os.CLONE_NEWNET)  # if this fails the thread dies with it
                box["sock"] = sock
            finally:
                os.close(target)
                os.close(own)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=enter_bind_leave, name=f"rollwire-gate-{pid}", daemon=True)
    thread.start()
    thread.join()
    error = box.get("error")
    if isinstance(error, GateError):
        raise error
    if error is not None:
        raise GateError(
            f"cannot listen on {host}:{port} in the network namespace of pid {pid}: "
            f"{type(error).__name__}: {error}"
        ) from error
    return box["sock"]


class Gate:
    """One capture session's data plane, served inside one sandbox's network namespace."""

    def __init__(self, key: str, app: Any, port: int, tg: TaskGroup) -> None:
        self.key = key
        self.app = app
        self.port = port
        self._tg = tg
        self._stop: anyio.Event | None = None
        self._done: anyio.Event | None = None
        self.pid: int | None = None  # the sandbox process whose namespace it serves in

    @property
    def url(self) -> str:
        """The agent's root URL, as seen from inside the sandbox."""
        return f"http://{GATE_HOST}:{self.port}"

    @property
    def attached(self) -> bool:
        return self._stop is not None

    async def attach(self, pid: int) -> None:
        """Serve inside the network namespace of ``pid`` (the sandbox is up)."""
        if self._stop is not None:
            raise GateError(f"gate {self.key!r} already serves pid {self.pid}'s sandbox")
        sock = await anyio.to_thread.run_sync(listen_in_netns, pid, self.port)
        self._stop, self._done, self.pid = anyio.Event(), anyio.Event(), pid
        try:
            await self._tg.start(self._serve, sock, self._stop, self._done)
        except BaseException:
            sock.close()
            self._stop = self._done = None
            raise

    async def _serve(
        self, sock: socket.socket, stop: anyio.Event, done: anyio.Event, *, task_status: Any
    ) -> None:
        try:
            async with serving(self.app, sock, stop_on_exit=True) as server:
                # A call still running when the sandbox stops gets a moment, then is cut.
                server.config.timeout_graceful_shutdown = 1.0
                task_status.started()
                await stop.wait()
        finally:
            sock.close()
            done.set()

    async def detach(self) -> None:
        """Stop serving (the sandbox is stopping); a no-op when not attached."""
        stop, done = self._stop, self._done
        if stop is None or done is None:
            return
        with anyio.CancelScope(shield=True):
            stop.set()
            with anyio.move_on_after(10):
                await done.wait()
        self._stop = self._done = None


class GateSlot:
    """A sandbox's end of a gate: the ``gate=<key>`` kwarg, opened once the sandbox is up.

    A gated sandbox has no network but its gate, so ``network=True`` with a gate is refused.
    """

    def __init__(self, key: str | None, *, network: bool) -> None:
        if key is not None and network:
            raise ValueError(
                "a gated sandbox has no network but its gate: pass network=False with gate"
            )
        self.key = key
        self._gate: Gate | None = None

    async def open(self, pid: int | None) -> None:
        """Serve the gate inside the network namespace of ``pid`` (no-op without a key)."""
        if self.key is None:
            return
        if pid is None:
            raise GateError(f"gate {self.key!r}: the sandbox has no process to reach its network")
        self._gate = lookup(self.key)
        await self._gate.attach(pid)

    async def close(self) -> None:
        """Stop serving (the sandbox is stopping); safe to call at any time."""
        gate, self._gate = self._gate, None
        if gate is not None:
            await gate.detach()


def lookup(key: str) -> Gate:
    """The gate a sandbox's ``gate=<key>`` names (it must be open)."""
    gate = _GATES.get(key)
    if gate is None:
        raise GateError(f"no open gate {key!r}: the sandbox was started outside its rollout")
    return gate


def pick_port() -> int:
    """A port for a gate: the sandbox's network is its own, so any port is free there."""
    low, high = _PORT_RANGE
    return low + secrets.randbelow(high - low)


@contextlib.asynccontextmanager
async def gate_host(key: str, app: Any, port: int | None = None) -> AsyncIterator[Gate]:
    """Open a gate named ``key`` for ``app`` until the block ends (then nothing is served)."""
    if key in _GATES:
        raise GateError(f"a gate {key!r} is already open")
    async with anyio.create_task_group() as tg:
        gate = Gate(key, app, port or pick_port(), tg)
        _GATES[key] = gate
        try:
            yield gate
        finally:
            del _GATES[key]
            await gate.detach()
