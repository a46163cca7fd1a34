"""What the benchmarks share: the machine's and a process's CPU time, free ports, percentiles,
the commit measured, and the fake vLLM in a process of its own.

Imported by the scripts beside it (``python bench/<name>.py`` puts this folder on the path).
"""

from __future__ import annotations

import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return math.nan
    k = max(0, math.ceil(q / 100 * len(sorted_values)) - 1)
    return sorted_values[k]


def machine_busy_seconds() -> float:
    """Busy CPU time of the whole machine (all CPUs, steal included), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return math.nan
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU time of a process, all its live threads: ns-exact from schedstat, else utime+stime."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine() -> dict[str, Any]:
    """The machine a result was measured on."""
    return {
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
    }


def write_json(doc: dict[str, Any], path: str | Path) -> Path:
    """A result document, indented, its folder made if needed."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    return out


def git_state() -> dict[str, Any]:
    """The commit measured, and which files under src/ differed from it."""

    def git(*argv: str) -> str:
        try:
            done = subprocess.run(
                ["git", *argv], cwd=ROOT, capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return ""
        return done.stdout.strip()

    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "src_changes": git("status", "--porcelain", "--", "src").splitlines(),
    }


def start_fake(
    port: int,
    behavior: dict[str, Any],
    *,
    reply_tokens: int | None = None,
    cpu: int | None = None,
    timeout_s: float = 60.0,
) -> subprocess.Popen[bytes]:
    """``python -m tests.fakes.vllm`` in a process of its own (pinned to ``cpu`` with taskset
    when given and taskset exists), answering with ``behavior`` once it is up."""
    cmd = [sys.executable, "-m", "tests.fakes.vllm", "--port", str(port)]
    if reply_tokens is not None:
        cmd += ["--reply-tokens", str(reply_tokens)]
    if cpu is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", str(cpu), *cmd]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the fake vLLM exited with {proc.returncode}")
        try:
            httpx.get(f"{url}/v1/models", timeout=1).raise_for_status()
            httpx.post(f"{url}/_fake/behavior", json=behavior, timeout=5).raise_for_status()
            return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    proc.wait(5)
    raise RuntimeError(f"the fake vLLM did not start within {timeout_s:g} s")
