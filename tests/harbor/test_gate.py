"""The gate: a sandbox's one way out is its own capture session's data plane.

Everything here is real: network namespaces (``unshare --net`` and the local sandbox's
bubblewrap), uvicorn on sockets made inside them, the fake vLLM as the engine and the official
OpenAI and Anthropic SDKs as clients.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anthropic
import anyio
import openai
import pytest

from rollwire.harnesses.harbor import seams
from rollwire.harnesses.harbor.datasets import resolve_dataset
from rollwire.harnesses.harbor.gate import GateError, GateSlot, gate_host, listen_in_netns
from rollwire.harnesses.harbor.rollout import run_harbor_rollout, serve_proxy
from rollwire.serving import bind, serving, url_of
from tests.fakes.vllm import DEFAULT_MODEL
from tests.harbor.helpers import EXAMPLES
from tests.harbor.probe_agent import (
    assert_only_its_own_session,
    host_targets,
    probe_seam,
    read_probe,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def netns() -> Iterator[int]:
    """A process in a network namespace of its own (loopback only): its pid."""
    proc = subprocess.Popen(
        ["unshare", "--net", "sh", "-c", "ip link set lo up 2>/dev/null; exec sleep 300"]
    )
    deadline = time.monotonic() + 5
    own = Path("/proc/self/ns/net").readlink()
    while Path(f"/proc/{proc.pid}/ns/net").readlink() == own:
        assert time.monotonic() < deadline, "unshare did not make a namespace"
        time.sleep(0.01)
    time.sleep(0.1)  # lo up
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def _inside(pid: int, code: str) -> str:
    """Run Python ``code`` in the network namespace of ``pid``; its stdout."""
    out = subprocess.run(
        ["nsenter", "-t", str(pid), "-n", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _connect_code(port: int) -> str:
    return (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=3).close(); print('open')\n"
        "except OSError as e:\n"
        "    print('refused')\n"
    )


def test_a_socket_made_in_a_namespace_is_reachable_there_and_not_from_the_host(netns):
    sock = listen_in_netns(netns, 0)
    port = sock.getsockname()[1]
    try:
        assert _inside(netns, _connect_code(port)) == "open"
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
    finally:
        sock.close()


def test_a_gate_refuses_a_process_that_shares_this_network():
    with pytest.raises(GateError, match="network namespace of its own"):
        listen_in_netns(subprocess.os.getpid(), 0)


@pytest.fixture
async def pinned(proxy) -> AsyncIterator[tuple[str, str]]:
    """The session app of one open session, served on host loopback: (url, session key)."""
    session = proxy.sessions.open()
    sock = bind("127.0.0.1", 0)
    try:
        async with serving(proxy.session_app(session.session_id), sock, stop_on_exit=True):
            yield url_of(sock), session.session_id
    finally:
        sock.close()


async def test_the_session_app_serves_its_own_session_to_the_openai_sdk(pinned, proxy):
    url, key = pinned
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0) as client:
        reply = await client.chat.completions.create(
            model=DEFAULT_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert reply.choices[0].message is not None
    assert proxy.sessions.get(key).n_calls == 1


async def test_the_session_app_serves_its_own_session_to_the_anthropic_sdk(pinned, proxy):
    url, key = pinned
    async with anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0) as client:
        await client.messages.create(
            model=DEFAULT_MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    assert proxy.sessions.get(key).n_calls == 1


async def test_the_session_app_refuses_another_sessions_key(pinned, proxy):
    url, _ = pinned
    other = proxy.sessions.open().session_id
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=other, max_retries=0) as client:
        with pytest.raises(openai.PermissionDeniedError, match="one capture session"):
            await client.chat.completions.create(
                model=DEFAULT_MODEL, messages=[{"role": "user", "content": "hi"}]
            )
    assert proxy.sessions.get(other).n_calls == 0


async def test_the_session_app_refuses_a_request_with_two_keys_one_foreign(pinned, proxy):
    import httpx

    url, key = pinned
    async with httpx.AsyncClient() as http:
        reply = await http.get(
            f"{url}/v1/models", headers={"authorization": f"Bearer {key}", "x-api-key": "other"}
        )
    assert reply.status_code == 403


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/sessions"), ("POST", "/sessions"), ("GET", "/health"), ("GET", "/metrics")],
)
async def test_the_session_app_has_no_control_plane(pinned, method, path):
    import httpx

    url, key = pinned
    async with httpx.AsyncClient() as http:
        reply = await http.request(method, url + path, headers={"authorization": f"Bearer {key}"})
    assert reply.status_code in (404, 405)


async def test_a_gate_serves_its_session_inside_the_namespace_only(proxy, netns):
    session = proxy.sessions.open()
    async with gate_host("t-gate", proxy.session_app(session.session_id)) as gate:
        await gate.attach(netns)
        code = (
            "import json, urllib.request\n"
            f"req = urllib.request.Request('{gate.url}/v1/chat/completions', method='POST',\n"
            "    data=json.dumps({'model': 'm', 'messages': [{'role': 'user', 'content': 'hi'}],"
            " 'max_tokens': 4}).encode(),\n"
            f"    headers={{'Authorization': 'Bearer {session.session_id}',"
            " 'Content-Type': 'application/json'})\n"
            "print(urllib.request.urlopen(req, timeout=30).status)\n"
        )
        assert await anyio.to_thread.run_sync(_inside, netns, code) == "200"
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", gate.port), timeout=1).close()
        await gate.detach()
        assert await anyio.to_thread.run_sync(_inside, netns, _connect_code(gate.port)) == (
            "refused"
        )
    assert session.n_calls == 1


def _host_address() -> str | None:
    """This machine's first non-loopback IPv4 address, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


@pytest.mark.slow
async def test_an_agent_in_the_local_sandbox_reaches_its_session_and_nothing_else(
    proxy, fake, monkeypatch, tmp_path
):
    """From inside a real trial: the engine, the proxy's control plane, another host port and
    the internet are refused; the gate answers only the agent's own session, whose call is
    captured."""
    monkeypatch.setitem(seams.SEAMS, "probe", probe_seam())
    other = proxy.sessions.open().session_id
    async with serve_proxy(proxy) as proxy_url:  # the control plane, served on the host
        targets = host_targets(fake.url, proxy_url)
        address = _host_address()
        if address is not None:
            targets["engine_via_host_address"] = f"{address}:{targets['engine'].split(':')[1]}"
        out = await run_harbor_rollout(
            resolve_dataset(EXAMPLES).task("count-errors"),
            harness="probe",
            proxy=proxy,
            trials_dir=tmp_path / "trials",
            agent_kwargs={"targets": targets, "other_key": other},
        )
    assert out.trial_dir is not None, out.result.error
    report = read_probe((out.trial_dir / "agent" / "probe.txt").read_text())
    assert_only_its_own_session(report, targets)
    assert proxy.sessions.get(other).n_calls == 0
    assert out.document is not None and out.document.stats.turns == 1


def test_a_gated_sandbox_cannot_also_have_the_network():
    with pytest.raises(ValueError, match="no network but its gate"):
        GateSlot("some-rollout", network=True)


async def test_a_gate_that_was_never_opened_is_an_error_naming_it():
    with pytest.raises(GateError, match="no open gate 'nobody'"):
        await GateSlot("nobody", network=False).open(1)
