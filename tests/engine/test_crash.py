"""A native crash in the reference engine ends the engine, not rollwire.

Each test crashes a real engine process on purpose: the hidden fault switch
(``ROLLWIRE_ENGINE_FAULT=SIGSEGV@N``, docs/development.md) makes the engine send itself SIGSEGV
in its Nth model call, while the HTTP request that asked for it waits. The caller (the demo,
``rollwire engine``, ``rollwire serve --embedded-engine``) says so in one line that names the
engine, the signal and what to try, and exits non-zero; the MCP server goes on serving and
answers the tool call in flight with a tool error.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rollwire.engine.process import FAULT_ENV
from tests.fakes.spawn import ROOT

pytestmark = pytest.mark.slow

CRASH_LINE = re.compile(
    r"^rollwire: the reference engine \(llama\.cpp, pid \d+\) died of SIGSEGV \(.+\); try: .+"
)


def _env(fault: str) -> dict[str, str]:
    return {**os.environ, FAULT_ENV: fault, "PYTHONUNBUFFERED": "1"}


def _crash_lines(stderr: str) -> list[str]:
    """rollwire's own lines about the crash (a tool error's log line quotes it, not starts it)."""
    return [line for line in stderr.splitlines() if CRASH_LINE.match(line)]


def _one_crash_line(proc: subprocess.Popen[str], code: int, seen: list[str]) -> str:
    """The process exited 1 and said exactly one crash line (returned); ``seen`` is what was
    read of its stderr before."""
    stderr = "".join(seen) + proc.stderr.read()  # type: ignore[union-attr]
    assert code == 1, stderr
    crash = _crash_lines(stderr)
    assert len(crash) == 1, stderr
    return crash[0]


def _spawn(*args: str, fault: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "rollwire", *args],
        cwd=ROOT,
        env=_env(fault),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _read_until(stream: object, pattern: str, proc: subprocess.Popen[str], seen: list[str]) -> str:
    """The first line of ``stream`` matching ``pattern`` (every line read is kept in ``seen``)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = stream.readline()  # type: ignore[attr-defined]
        if not line:
            raise AssertionError(f"ended before {pattern!r}:\n{''.join(seen)}")
        seen.append(line)
        if re.search(pattern, line):
            return line
    raise AssertionError(f"no {pattern!r} in 300 s:\n{''.join(seen)}")


def test_demo_reports_an_engine_crash_in_one_line_and_exits_1(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rollwire", "demo", "--out", str(tmp_path / "rollout.json")],
        cwd=ROOT,
        env=_env("SIGSEGV@1"),  # validate_llm's first generation
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stderr
    crash = _crash_lines(done.stderr)
    assert len(crash) == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "rollout.json").exists()


def test_engine_command_reports_a_crash_in_one_line_and_exits_1() -> None:
    proc = _spawn("engine", "--port", "0", fault="SIGSEGV@1")
    try:
        seen: list[str] = []
        banner = _read_until(proc.stderr, r"^rollwire engine .* on http://", proc, seen)
        url = banner.rsplit(" on ", 1)[1].strip()
        with pytest.raises(httpx.HTTPError):  # the engine dies under this request
            httpx.post(
                f"{url}/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
                timeout=60,
            )
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    _one_crash_line(proc, code, seen)


@pytest.mark.anyio
async def test_serve_answers_the_call_in_flight_with_a_tool_error_and_keeps_serving() -> None:
    """`rollwire serve --http --embedded-engine`: the engine dies in the middle of run_rollout;
    that call ends in a tool error naming the signal, list_tasks still answers, and the server
    exits 1 on SIGTERM."""
    from mcp import Client

    proc = _spawn("serve", "--http", "--port", "0", "--embedded-engine", fault="SIGSEGV@1")
    try:
        seen: list[str] = []
        line = _read_until(proc.stderr, r"rollwire MCP server on http://\S+/mcp", proc, seen)
        mcp_url = re.search(r"(http://\S+/mcp)", line).group(1)  # type: ignore[union-attr]
        async with Client(mcp_url) as mcp:
            result = await mcp.call_tool(
                "run_rollout",
                {"task": "reasoning_gym:chain_sum", "limits": {"max_turns": 1}},
            )
            assert result.is_error, result
            text = result.content[0].text
            assert "run_rollout" in text and "SIGSEGV" in text, text
            listed = await mcp.call_tool("list_tasks", {"limit": 3})
            assert not listed.is_error and listed.structured_content["tasks"], listed
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    crash = _one_crash_line(proc, code, seen)
    assert "goes on serving" in crash
