"""A Harbor agent that probes, from inside its sandbox, every way out a rollout must not have.

It runs host-side like any Harbor agent and does its work through ``environment.exec``, so each
probe is made by a process in the sandbox with nothing but bash (``/dev/tcp``): the same script
works in the ``local`` sandbox (the host's /usr) and in a minimal Docker image. It reads its base
URL and key as an installed agent does (``OPENAI_BASE_URL``/``OPENAI_API_KEY``, which the seam
sets) and reports one line per probe, ``name: result``, in ``/logs/agent/probe.txt``.
"""

from __future__ import annotations

import os
import shlex
from typing import Any
from urllib.parse import urlsplit

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

# bash only: open a TCP connection (or fail), send a request, print the status line.
_HTTP = r"""
http() {  # method host port path key body -> the status code, or the connect error
  local method=$1 host=$2 port=$3 path=$4 key=$5 body=$6
  if ! exec 3<>"/dev/tcp/$host/$port" 2>/dev/null; then echo refused; return; fi
  printf '%s %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %s\r\nConnection: close\r\n\r\n%s' \
    "$method" "$path" "$host" "$key" "${#body}" "$body" >&3
  local status
  IFS= read -r -t 20 status <&3 || status="no answer"
  exec 3<&-
  echo "$status" | awk '{print $2}'
}
connect() {  # host port -> open | refused
  if timeout 5 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; then echo open; else echo refused; fi
}
"""


class ProbeAgent(BaseAgent):
    """``targets``: {name: "host:port"} to try to connect to; ``other_key``: a key that is not
    this session's. Probes its own session (a chat call, which must be captured) too."""

    def __init__(self, *args: Any, targets: dict[str, str] | None = None,
                 other_key: str = "not-my-session", **kwargs: Any) -> None:  # fmt: skip
        super().__init__(*args, **kwargs)
        self.targets = dict(targets or {})
        self.other_key = other_key

    @staticmethod
    def name() -> str:
        return "rollwire-probe"

    def version(self) -> str | None:
        return "1"

    async def setup(self, environment: BaseEnvironment) -> None:
        return None

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        base = os.environ["OPENAI_BASE_URL"]
        key = os.environ["OPENAI_API_KEY"]
        parts = urlsplit(base)
        host, port, prefix = parts.hostname, parts.port, parts.path.rstrip("/")
        body = '{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4}'
        lines = [
            f'echo "own_chat: $(http POST {host} {port} {prefix}/chat/completions {key} {shlex.quote(body)})"',
            f'echo "own_models: $(http GET {host} {port} {prefix}/models {key} "")"',
            f'echo "other_key_chat: $(http POST {host} {port} {prefix}/chat/completions {self.other_key} {shlex.quote(body)})"',
            f'echo "no_key_models: $(http GET {host} {port} {prefix}/models "" "")"',
            f'echo "gate_sessions: $(http GET {host} {port} /sessions {key} "")"',
            f'echo "gate_health: $(http GET {host} {port} /health {key} "")"',
            'echo "internet: $(connect 151.101.0.223 443)"',
            'echo "dns: $(getent hosts pypi.org >/dev/null 2>&1 && echo resolved || echo none)"',
        ]
        for name, target in self.targets.items():
            t_host, _, t_port = target.rpartition(":")
            lines.append(f'echo "{name}: $(connect {t_host} {t_port})"')
        script = _HTTP + "\n".join(lines)
        result = await environment.exec(
            f"mkdir -p /logs/agent && {{ {script}\n}} > /logs/agent/probe.txt 2>&1",
            timeout_sec=120,
        )
        if result.return_code != 0:
            raise RuntimeError(f"probe script failed: {result.stdout} {result.stderr}")


def read_probe(text: str) -> dict[str, str]:
    """``name: result`` lines as a dict."""
    out = {}
    for line in text.splitlines():
        name, sep, value = line.partition(": ")
        if sep:
            out[name.strip()] = value.strip()
    return out


def probe_seam() -> Any:
    """The probe as an in-sandbox harness: it gets a gate, like claude-code or codex."""
    import dataclasses

    from rollwire.harnesses.harbor.seams import import_path_seam

    seam = import_path_seam("tests.harbor.probe_agent:ProbeAgent")
    return dataclasses.replace(seam, name="probe", sandbox_network=True)


def host_targets(engine_url: str, proxy_url: str) -> dict[str, str]:
    """The engine's and the host-side proxy's loopback ports, as probe targets."""
    return {
        "engine": "127.0.0.1:" + urlsplit(engine_url).netloc.rsplit(":", 1)[1],
        "host_proxy": "127.0.0.1:" + urlsplit(proxy_url).netloc.rsplit(":", 1)[1],
    }


def assert_only_its_own_session(report: dict[str, str], targets: dict[str, str]) -> None:
    """The gate answered the agent's own session and nothing else was reachable."""
    assert report["own_chat"] == "200" and report["own_models"] == "200", report
    assert report["other_key_chat"] == "403" and report["no_key_models"] == "403", report
    assert report["gate_sessions"] == "404" and report["gate_health"] == "404", report
    assert report["internet"] == "refused" and report["dns"] == "none", report
    for name in targets:
        assert report[name] == "refused", (name, report)
