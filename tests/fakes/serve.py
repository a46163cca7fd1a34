"""Run an ASGI app under a real uvicorn server in a background thread (for tests).

``with serve_in_thread(app) as base_url:`` yields e.g. ``"http://127.0.0.1:43125"``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

__all__ = ["serve_in_thread"]


class _ThreadServer(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # older uvicorn: never touch signals off-main
        pass


@contextlib.contextmanager
def serve_in_thread(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    log_level: str = "warning",
    startup_timeout_s: float = 10.0,
    shutdown_timeout_s: float = 10.0,
    **config_kwargs: Any,
) -> Iterator[str]:
    """Serve ``app`` on ``host``, on an ephemeral port unless ``port`` is given, and yield its
    base URL once the server accepts connections. On exit it sets ``should_exit`` and joins the
    thread. Open connections get one second to finish before they are closed. Extra keyword
    arguments go to :class:`uvicorn.Config`.
    """
    # proto=IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on accepted sockets whose proto
    # says TCP, and without it every response waits ~40 ms (Nagle + delayed ACK).
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]
    config_kwargs.setdefault("timeout_graceful_shutdown", 1)
    config_kwargs.setdefault("access_log", False)
    config = uvicorn.Config(app, host=host, port=bound_port, log_level=log_level, **config_kwargs)
    server = _ThreadServer(config)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # surfaced to the caller below
            errors.append(exc)

    thread = threading.Thread(target=run, name=f"uvicorn-{bound_port}", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not server.started:
            if errors or not thread.is_alive():
                raise RuntimeError(f"uvicorn failed to start: {errors[0] if errors else 'exited'}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"uvicorn did not start within {startup_timeout_s}s")
            time.sleep(0.005)
        yield f"http://[{host}]:{bound_port}" if ":" in host else f"http://{host}:{bound_port}"
    finally:
        server.should_exit = True
        thread.join(shutdown_timeout_s)
        sock.close()
    if thread.is_alive():
        raise RuntimeError("uvicorn server thread did not stop")
