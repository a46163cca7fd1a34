"""Serving an ASGI app with uvicorn on a socket bound here (one way, for every command).

The CLI's servers (proxy, engine, MCP), the demo and a Harbor trial's proxy and gate all serve
through it. A base module (the bottom layer): imports nothing of rollwire; any layer may import
it.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import uvicorn


def run_server(fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """``anyio.run`` for the long-lived servers (proxy, engine, MCP): on uvloop where it is
    installed (a leaner event loop on the proxy's hot path: bench/README.md, issue 20)."""
    uvloop = importlib.util.find_spec("uvloop") is not None
    return anyio.run(fn, *args, backend_options={"use_uvloop": True} if uvloop else {})


def settle_gc() -> None:
    """Once a server has started: its startup objects never die, so keep them out of full
    collections (gen-2 pauses of 40-60 ms under load otherwise), and collect the young
    generation every 10,000 allocations rather than 700 (a proxied call parses a reply of
    thousands of objects that die by reference count: 2.0 -> 1.7 ms of proxy CPU per call,
    bench/README.md)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


class BindError(OSError):
    """The address could not be bound; the message says which and why."""


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, so a taken port is a clear error rather than a traceback."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on connections of such a listener.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise BindError(
            f"cannot bind {host}:{port} ({exc.strerror}); choose another --port"
        ) from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def url_of(sock: socket.socket) -> str:
    """``http://host:port`` for a bound socket (a wildcard address reads as loopback)."""
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@contextlib.asynccontextmanager
async def serving(
    app: Any, sock: socket.socket, *, stop_on_exit: bool
) -> AsyncIterator[uvicorn.Server]:
    """Run ``app`` until the block is done (``stop_on_exit``) or until the server stops by itself."""
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, lifespan="auto")
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        while not server.started:  # uvicorn offers no startup event to wait on
            if server.should_exit:
                raise RuntimeError("the server stopped during startup")
            await anyio.sleep(0.02)
        try:
            yield server
        finally:
            if stop_on_exit:
                server.should_exit = True
