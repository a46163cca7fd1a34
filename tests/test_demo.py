"""The README's main job: ``rollwire demo`` on the embedded engine, end to end (slow: it loads the
real CPU engine in its own process)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def test_demo_runs_a_real_rollout_through_mcp_and_reports_where_the_document_is(tmp_path):
    out = tmp_path / "rollout.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rollwire", "demo", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MCP validate_llm" in proc.stderr and "MCP run_rollout" in proc.stderr
    line = next(s for s in proc.stdout.splitlines() if s.startswith("rollout "))
    assert "reasoning_gym:chain_sum: reward " in line and "tier tokens" in line
    reward = line.split(": reward ")[1].split(",")[0]
    assert reward in ("0.0", "1.0"), line  # the verifier ran: a verified reward, never None
    assert "stop text_answer" in line and "answer mode text" in line
    assert " trainable tokens" in line
    assert f"rollout document -> {out}" in proc.stdout
    assert "parity PASS" in proc.stdout
    after = proc.stdout.split("\nnext:\n", 1)[1]  # it ends saying where to look next
    assert str(out) in after and "rollwire demo --http" in after
    pages = re.findall(r"\((docs/[\w/.-]+\.md)\)", after)
    assert len(pages) == 3, after  # each pointer names a page of the docs, and the page exists
    assert all((ROOT / page).is_file() for page in pages), pages
    document = json.loads(out.read_text())
    assert document["version"] == "rollwire.rollout/1"
    assert document["stats"]["trainable_tokens"] > 0
    reported = int(line.split(" trainable tokens")[0].rsplit(" ", 1)[1])
    assert reported == document["stats"]["trainable_tokens"]


@pytest.mark.parametrize(
    "sigint_at_start",
    [signal.SIG_DFL, signal.SIG_IGN],
    ids=["sigint-default", "sigint-ignored-as-in-a-background-job"],
)
def test_demo_over_http_prints_the_web_ui_url_of_its_rollout_and_serves_it(
    tmp_path, sigint_at_start
):
    """Ctrl-C ends it, also where SIGINT was ignored when it started (a job a non-interactive shell
    started with ``&``, as CI runners and ``nohup ... &`` do): the demo then once stopped both its
    servers and waited forever on a re-raised SIGINT that was ignored."""
    import time

    import httpx

    out = tmp_path / "rollout.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollwire", "demo", "--http", "--out", str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, sigint_at_start),
    )
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "".join(lines) + proc.stderr.read()
            lines.append(line)
            if line.startswith("parity "):
                break
        ui = next(s for s in lines if s.startswith("web UI: ")).split(": ", 1)[1].strip()
        rollout_id = next(s for s in lines if s.startswith("rollout ")).split()[1]
        assert ui.startswith("http://127.0.0.1:") and ui.endswith(f"/ui/rollouts/{rollout_id}")
        page = httpx.get(ui, timeout=30)
        assert page.status_code == 200 and "/ui/static/app.js" in page.text
        api = ui.replace("/ui/rollouts/", "/ui/api/rollouts/")
        view = httpx.get(api, timeout=30).json()
        assert view["status"] == "done" and view["document"]["turns"]
        document = json.loads(out.read_text())
        assert view["document"]["stats"] == document["stats"]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # the CLI prints every thread's stack on it
            time.sleep(3)
            proc.kill()
            proc.wait()
            pytest.fail(
                "demo --http did not stop within 60 s of SIGINT; its stderr, stacks last:\n"
                + proc.stderr.read()[-8000:]
            )
    stderr = proc.stderr.read()
    assert code == 0, stderr
    assert "rollwire demo: stopped" in stderr, stderr
