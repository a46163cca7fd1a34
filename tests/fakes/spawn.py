"""The vLLM-shaped fake as its own process (so a test can kill it like a crashed engine), and
``rollwire proxy`` as its own process (so its RSS and file descriptors are its own)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeEngineProcess:
    """``python -m tests.fakes.vllm`` on a free loopback port."""

    def __init__(self, *args: str, port: int | None = None) -> None:
        self.port = port or free_port()
        self.root = f"http://127.0.0.1:{self.port}"
        self.url = self.root + "/v1"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fakes.vllm", "--port", str(self.port), *args],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(self.root + "/v1/models", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"the fake engine on {self.port} did not start") from None
                time.sleep(0.1)

    def behave(self, **changes: Any) -> None:
        httpx.post(self.root + "/_fake/behavior", json=changes, timeout=5).raise_for_status()

    def stats(self) -> dict[str, int]:
        return httpx.get(self.root + "/_fake/stats", timeout=5).json()

    def kill(self) -> None:
        """SIGKILL, as a crashed engine: connections are refused from now on."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@contextlib.contextmanager
def fake_engine(
    *args: str, port: int | None = None, **behavior: Any
) -> Iterator[FakeEngineProcess]:
    engine = FakeEngineProcess(*args, port=port)
    try:
        if behavior:
            engine.behave(**behavior)
        yield engine
    finally:
        engine.kill()


@contextlib.contextmanager
def two_engines(delay_s: float = 0.05) -> Iterator[tuple[FakeEngineProcess, FakeEngineProcess]]:
    """Two engines serving one model, each calling a tool every turn and taking ``delay_s``."""
    with (
        fake_engine(tool_call_every_turn=True, delay_s=delay_s) as a,
        fake_engine(tool_call_every_turn=True, delay_s=delay_s) as b,
    ):
        yield a, b


def sigkill_once_written(proc: subprocess.Popen, path: Path, lines: int, timeout_s: float) -> int:
    """SIGKILL ``proc`` once ``path`` holds ``lines`` lines; the lines it held then."""
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if path.exists() and path.read_bytes().count(b"\n") >= lines:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    return path.read_bytes().count(b"\n")


@contextlib.contextmanager
def proxy_process(
    llm_url: str, admin_key: str, log_path: Path, timeout_s: float = 60.0
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``rollwire proxy`` in front of ``llm_url`` on a free loopback port, its output in
    ``log_path``; yields the process and its URL once ``/health`` answers, terminates it on
    exit."""
    port = free_port()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "rollwire", "proxy", "--llm-url", llm_url),
                *("--port", str(port), "--admin-key", admin_key),
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the proxy did not start: {log_path.read_text()[-2000:]}")
                try:
                    if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            yield proc, url
        finally:
            proc.terminate()
            proc.wait(15)
