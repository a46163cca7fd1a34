"""What the example tests share: the fake engine and a real ``rollwire serve --http`` process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeVLLM, str]]:
    vllm = FakeVLLM(tool_call_every_turn=True)
    with serve_in_thread(vllm.app) as url:
        yield vllm, url + "/v1"


class ServeProcess:
    """A ``python -m rollwire serve --http`` process; stdout and stderr go to files. Its URL is
    read from the banner it prints on stderr."""

    def __init__(
        self,
        tmp: Path,
        llm_url: str,
        token: str,
        *,
        data_dir: Path | None = None,
        python: str = sys.executable,
    ) -> None:
        self.data_dir = data_dir
        self.stdout, self.stderr = tmp / "stdout", tmp / "stderr"
        env = {
            **os.environ,
            "ROLLWIRE_TRIALS_DIR": str(tmp / "trials"),
            "HARBOR_TELEMETRY": "0",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "PYTHONUNBUFFERED": "1",  # anything printed to stdout shows at once
        }
        argv = ["serve", "--http", "--port", "0", "--token", token, "--llm-url", llm_url]
        if data_dir is not None:
            argv += ["--data-dir", str(data_dir)]
        with self.stdout.open("w") as out, self.stderr.open("w") as err:
            self.proc = subprocess.Popen(
                [python, "-m", "rollwire", *argv], cwd=ROOT, stdout=out, stderr=err, env=env
            )
        self.url = self._banner_url()

    def _banner_url(self) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for line in self.stderr.read_text().splitlines():
                if line.startswith("rollwire MCP server on "):
                    return line.split(" on ", 1)[1].split()[0]
            assert self.proc.poll() is None, self.stderr.read_text()
            time.sleep(0.05)
        raise TimeoutError(self.stderr.read_text())

    def stdout_text(self) -> str:
        return self.stdout.read_text()

    def stop(self) -> None:
        """Terminate it; its stdout must have stayed empty (logs go to stderr)."""
        self.proc.terminate()
        self.proc.wait(timeout=20)
        assert self.stdout_text() == ""
