"""Real installed agents (claude-code, codex) in the ``local`` sandbox, through the capture proxy.

What holds here, measured (see the seams' notes):

* Harbor's own installers cannot run: on a glibc sandbox claude-code's ``install()`` pipes
  ``https://downloads.claude.ai/.../bootstrap.sh`` into bash and codex's installs nvm from
  ``raw.githubusercontent.com`` and Node from ``nodejs.org``; none of these hosts resolves here
  (only package registries are reachable). A test asserts exactly that, from inside the sandbox.
* Harbor's other branch, ``npm install -g``, writes under the host's ``/usr``, read-only in the
  local sandbox. A test asserts that too.
* So rollwire installs each agent itself (``rollwire.harnesses.harbor.installs``): from npm, on
  a Node from PyPI, into a prefix under ``$ROLLWIRE_AGENTS_DIR``, once per host, mounted
  read-only into each trial with shims where Harbor's commands look. These tests run the real
  agents that way, through ``run_harbor_rollout`` as any caller would.
* The model behind the proxy is the fake vLLM, not the reference engine: the reference engine
  serves SmolLM2-135M with ``n_ctx=4096`` and both agents' first prompt (system prompt + tool
  manifest) is far larger.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollwire.capture.proxy import CaptureProxy
from rollwire.harnesses.harbor.seams import SEAMS
from tests.fakes.vllm import FakeVLLM
from tests.harbor.helpers import EXAMPLES, run_count_errors, running

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

CA = "/etc/ssl/certs/ca-certificates.crt"


async def _sandbox_exec(tmp_path: Path, command: str, *, mounts=(), limit_s: int = 240):
    """Run ``command`` in a fresh local sandbox (count-errors' environment), network on."""
    async with running(
        tmp_path,
        EXAMPLES / "count-errors" / "environment",
        network=True,
        mounts=[{"type": "bind", **m} for m in mounts],
    ) as env:
        return await env.exec(command, timeout_sec=limit_s)


@pytest.fixture
def proxy(proxy: CaptureProxy, fake: FakeVLLM) -> CaptureProxy:
    """conftest's proxy; the fake answers the first call with a tool call (the agent's first
    tool), the call after the tool result with plain text: done."""
    fake.behavior.tool_call_every_turn = True
    return proxy


@pytest.mark.parametrize(
    ("harness", "command", "unreachable"),
    [
        (
            "claude-code",
            "curl -fsSL https://downloads.claude.ai/claude-code-releases/bootstrap.sh | bash -s --",
            "downloads.claude.ai",
        ),
        (
            "codex",
            "curl -o- https://raw.githubusercontent.com/nvm-sh/nvm/v0.40.2/install.sh | bash",
            "raw.githubusercontent.com",
        ),
    ],
)
async def test_harbors_own_installer_cannot_reach_its_host(harness, command, unreachable, tmp_path):
    """Harbor's install() for a glibc image (the local sandbox is Debian's /usr), verbatim."""
    import inspect

    from rollwire.harnesses.harbor.seams import import_agent_class

    cls = import_agent_class(SEAMS[harness].harbor_class)
    assert unreachable in inspect.getsource(cls.install)  # still what Harbor runs
    result = await _sandbox_exec(tmp_path, f"set -euo pipefail; {command}")
    assert result.return_code == 6  # curl: could not resolve host
    assert f"Could not resolve host: {unreachable}" in (result.stderr or "")


async def test_npm_install_g_into_the_hosts_usr_fails(tmp_path):
    """Harbor's other branch (``npm install -g``) writes under the host's read-only /usr."""
    result = await _sandbox_exec(
        tmp_path,
        f"NODE_EXTRA_CA_CERTS={CA} npm install -g --no-audit --no-fund @openai/codex",
    )
    assert result.return_code != 0
    assert "/usr/lib/node_modules" in (result.stdout or "") + (result.stderr or "")


async def test_claude_code_runs_through_the_anthropic_dialect_and_its_turns_link(
    proxy, fake, tmp_path
):
    """claude-code (npm, 2.1.x) installs and runs count-errors against the fake engine through
    the proxy's Anthropic dialect (its system reminders arrive as ``{"role": "system"}``
    messages, kept in place); every call is captured in the anthropic dialect."""
    out = await run_count_errors("claude-code", proxy, tmp_path)
    result = out.result
    assert '"claude_code_version"' in (out.agent_log_tail or "")  # the real agent ran
    assert fake.stats["ok"] >= 1 and result.n_turns >= 1, result.error
    doc = out.document
    assert doc is not None and {t.dialect for t in doc.turns} == {"anthropic"}
    assert doc.stats.roots == 1 and doc.stats.trainable_sequences >= 1


async def test_codex_runs_through_the_responses_dialect_and_its_turns_link(proxy, fake, tmp_path):
    """codex (npm, 0.17x) installs and runs count-errors against the fake engine through the
    proxy's Responses dialect: it tries the Responses WebSocket first (the proxy answers 403;
    codex falls back to HTTPS), declares its multi-agent tools in a ``namespace`` (flattened)
    and ``web_search`` (dropped with a note); every call is captured in the responses dialect
    and the calls link into one sequence."""
    out = await run_count_errors("codex", proxy, tmp_path)
    result = out.result
    log = out.agent_log_tail or ""
    assert "Falling back from WebSockets to HTTPS transport" in log
    assert fake.stats["ok"] >= 1 and result.n_turns >= 1, result.error
    doc = out.document
    assert doc is not None and {t.dialect for t in doc.turns} == {"responses"}
    stats = doc.stats
    assert stats.turns >= 2 and stats.roots == 1 and stats.retokenized == 0
    assert stats.trainable_sequences == 1  # the tool call and the answer after it: one sequence
