"""The seam table: every harness says how it reaches the proxy, and Harbor agrees."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from harbor.agents.factory import AgentFactory

from rollwire.harnesses.harbor import seams
from rollwire.harnesses.harbor.seams import (
    ENVIRON_LOCK,
    SEAMS,
    Endpoint,
    UnknownHarness,
    available_harnesses,
    environ_scope,
    get_seam,
    served_dialects,
)

ENDPOINT = Endpoint(url="http://127.0.0.1:4599", api_key="rw-session-key", model="smol")
OPERATOR_KEY = "sk-operator-real-key"  # what the machine's own environment holds
INSTALLED = [s for s in SEAMS.values() if s.kind == "installed"]


def rows() -> dict[str, tuple[bool, str]]:
    return {name: (ok, why) for name, ok, why in available_harnesses()}


def test_every_entry_has_the_fields_a_caller_needs() -> None:
    assert {"terminus-2", "oracle", "nop"} <= set(SEAMS)
    assert {
        "codex",
        "claude-code",
        "opencode",
        "goose",
        "gemini-cli",
        "mini-swe-agent",
        "openhands",
        "qwen-coder",
        "aider",
    } <= set(SEAMS)
    for name, seam in SEAMS.items():
        assert seam.name == name
        module, _, cls = seam.harbor_class.partition(":")
        assert module.startswith("harbor.") and cls, seam
        if seam.kind == "none":
            assert not seam.needs_llm and seam.dialect is None and not seam.reads_environ
            continue
        assert seam.needs_llm
        assert seam.dialect in ("chat", "responses", "anthropic", "google")
        assert seam.api_key_env or seam.config_fields, f"{name}: no way to carry the key"
        carriers = seam.base_url_env or seam.config_file or seam.config_fields
        assert carriers, f"{name}: no way to carry the base URL"
        assert seam.notes
    assert SEAMS["terminus-2"].host_side and not SEAMS["terminus-2"].reads_environ
    assert SEAMS["terminus-2"].agent_kwargs["collect_rollout_details"] is True


def test_unavailable_seams_give_a_reason_and_the_served_ones_are_available() -> None:
    table = rows()
    assert set(table) == set(SEAMS)
    for name, seam in SEAMS.items():
        ok, why = table[name]
        assert why, name
        if seam.dialect is not None and seam.dialect not in served_dialects():
            assert not ok and seam.dialect in why and "does not serve" in why, (name, why)
        else:
            assert ok, (name, why)
    assert table["terminus-2"][1].startswith("validated")


def test_the_served_dialects_are_chat_and_every_dialect_module() -> None:
    from rollwire.capture.dialects import DIALECT_MODULES, load_dialects

    assert served_dialects() == {"chat", *(d.name for d in load_dialects())}
    assert {d.name for d in load_dialects()} <= set(DIALECT_MODULES)
    for name in ("codex", "claude-code", "gemini-cli"):
        assert (SEAMS[name].dialect in served_dialects()) is rows()[name][0], name


def test_a_broken_import_path_seam_is_unavailable_and_the_others_are_not(tmp_path, monkeypatch):
    (tmp_path / "explodes_on_import.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    extra = (
        "nope.module:Class",
        "explodes_on_import:Agent",
        "collections:OrderedDict",
        "harbor.agents.nop:NopAgent",
    )
    table = {name: (ok, why) for name, ok, why in available_harnesses(extra)}
    assert table["nope.module:Class"] == (
        False,
        "cannot import nope.module:Class: ModuleNotFoundError: No module named 'nope'",
    )
    assert not table["explodes_on_import:Agent"][0]
    assert "RuntimeError: boom at import" in table["explodes_on_import:Agent"][1]
    assert not table["collections:OrderedDict"][0]
    assert "not a Harbor agent" in table["collections:OrderedDict"][1]
    assert table["harbor.agents.nop:NopAgent"][0]
    for name, seam in SEAMS.items():  # nothing else moved
        assert table[name][0] is (seam.dialect in (None, *served_dialects())), name


def test_a_built_in_seam_whose_class_moved_takes_out_only_itself(monkeypatch) -> None:
    moved = dataclasses.replace(SEAMS["goose"], harbor_class="harbor.agents.installed.gone:Goose")
    monkeypatch.setitem(SEAMS, "goose", moved)
    table = rows()
    assert not table["goose"][0] and "ModuleNotFoundError" in table["goose"][1]
    assert table["terminus-2"][0] and table["aider"][0] and table["oracle"][0]


def test_a_missing_host_tool_is_a_reason(monkeypatch) -> None:
    monkeypatch.setattr(seams.shutil, "which", lambda tool: None)
    ok, why = rows()["terminus-2"]
    assert not ok and "tmux" in why and "apt-get install tmux" in why


def test_unknown_names_are_refused_naming_the_known_ones() -> None:
    with pytest.raises(UnknownHarness, match="terminus-2") as err:
        get_seam("claude")
    assert "module:Class" in str(err.value)
    seam = get_seam("my.pkg:Agent")
    assert seam.kind == "import" and seam.reads_environ and seam.dialect == "chat"


@pytest.mark.parametrize("seam", INSTALLED, ids=lambda s: s.name)
def test_installed_seams_match_what_harbors_wrapper_reads(seam, monkeypatch, tmp_path) -> None:
    """Harbor's own resolver, given the seam's AgentConfig, delivers the proxy URL and the
    session key to the variables the table names, and never the operator's key."""
    for name in {*seam.api_key_env, "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"}:
        monkeypatch.setenv(name, OPERATOR_KEY)
    config = seam.agent_config(ENDPOINT)
    agent = AgentFactory.create_agent_from_config(config, logs_dir=tmp_path)
    connection = agent.model_connection
    base = ENDPOINT.base(seam.base_url_suffix)
    assert connection.api_key == ENDPOINT.api_key
    assert connection.execution_base_url == base
    # A class that refuses base_url (cline-cli) gets the URL in its env, as the sandbox sees it.
    delivered = connection.env if config.base_url is not None else agent.extra_env
    for name in seam.base_url_env:
        assert delivered.get(name) == base, (name, delivered)
    assert OPERATOR_KEY not in connection.env.values()
    assert set(seam.api_key_env) <= set(config.env)
    assert seam.reads_environ and seam.sandbox_network


def test_terminus2_gets_the_key_and_base_url_explicitly(monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPERATOR_KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", "https://api.openai.com/v1")
    config = SEAMS["terminus-2"].agent_config(
        ENDPOINT, kwargs={"max_turns": 3, "llm_kwargs": {"max_retries": 0}}, timeout_sec=30
    )
    assert config.name == "terminus-2" and config.model_name == "openai/smol"
    assert config.base_url == "http://127.0.0.1:4599/v1"
    assert config.env == {}  # the key never enters the sandbox's shell environment
    assert config.override_timeout_sec == 30
    kwargs = config.kwargs
    assert kwargs["llm_kwargs"] == {"max_retries": 0, "api_key": "rw-session-key"}
    assert kwargs["collect_rollout_details"] and kwargs["max_turns"] == 3
    assert kwargs["enable_summarize"] is False and kwargs["record_terminal_session"] is False
    agent = AgentFactory.create_agent_from_config(config, logs_dir=Path(tempfile.mkdtemp()))
    llm = agent._llm  # what litellm will be called with
    assert llm._llm_kwargs["api_key"] == "rw-session-key"
    assert llm._api_base == "http://127.0.0.1:4599/v1"
    assert agent._extra_env == {}


def test_model_free_seams_need_no_endpoint() -> None:
    config = SEAMS["oracle"].agent_config(None, timeout_sec=5)
    assert config.name == "oracle" and config.model_name is None and config.base_url is None
    with pytest.raises(ValueError, match="needs an endpoint"):
        SEAMS["terminus-2"].agent_config(None)


def test_the_environ_lock_is_a_threading_lock() -> None:
    assert isinstance(ENVIRON_LOCK, type(threading.Lock()))
    assert {s.name for s in SEAMS.values() if s.reads_environ} == {s.name for s in INSTALLED}


def test_environ_reading_harnesses_are_serialised_across_event_loops(monkeypatch) -> None:
    """Eight rollouts of an env-reading harness, each on its own thread and event loop: one at
    a time, each sees its own key for its whole run, and the operator's key comes back."""
    monkeypatch.setenv("OPENAI_API_KEY", OPERATOR_KEY)
    monkeypatch.delenv("OPENAI_HOST", raising=False)
    seam = SEAMS["goose"]
    active = 0
    most = 0
    seen: list[tuple[str, set[str]]] = []
    guard = threading.Lock()

    async def rollout(i: int) -> None:
        nonlocal active, most
        key = f"rw-key-{i}"
        async with environ_scope(seam, dataclasses.replace(ENDPOINT, api_key=key)):
            with guard:
                active += 1
                most = max(most, active)
            keys = set()
            for _ in range(3):
                keys.add(os.environ["OPENAI_API_KEY"])
                await asyncio.sleep(0.005)
            assert os.environ["OPENAI_HOST"] == ENDPOINT.url
            with guard:
                active -= 1
            seen.append((key, keys))

    threads = [threading.Thread(target=asyncio.run, args=(rollout(i),)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(seen) == 8 and most == 1
    assert all(keys == {key} for key, keys in seen)
    assert os.environ["OPENAI_API_KEY"] == OPERATOR_KEY and "OPENAI_HOST" not in os.environ
    assert not ENVIRON_LOCK.locked()


def test_a_cancelled_waiter_does_not_keep_the_lock() -> None:
    seam = SEAMS["aider"]

    async def main() -> None:
        holder_in = asyncio.Event()
        release = asyncio.Event()

        async def holder() -> None:
            async with environ_scope(seam, ENDPOINT):
                holder_in.set()
                await release.wait()

        hold = asyncio.create_task(holder())
        await holder_in.wait()
        waiter = asyncio.create_task(_enter(seam))
        await asyncio.sleep(0.05)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        release.set()
        await hold
        assert not ENVIRON_LOCK.locked()
        await asyncio.wait_for(_enter(seam), 1)  # the lock is free again

    asyncio.run(main())


async def _enter(seam) -> None:
    async with environ_scope(seam, ENDPOINT):
        pass


def test_harnesses_that_do_not_read_the_environment_run_side_by_side() -> None:
    async def main() -> float:
        async def one() -> None:
            async with environ_scope(SEAMS["terminus-2"], ENDPOINT):
                await asyncio.sleep(0.2)

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(5)))
        return time.perf_counter() - start

    assert asyncio.run(main()) < 0.6
    assert "OPENAI_API_KEY" not in os.environ or os.environ["OPENAI_API_KEY"] != "rw-session-key"


def test_importing_the_table_imports_no_agent() -> None:
    """The table itself is data: agents (and litellm) load when a seam is checked or used."""
    code = (
        "import sys; import rollwire.harnesses.harbor.seams; "
        "print(any(m.startswith(('harbor.agents.terminus_2', 'harbor.agents.installed', "
        "'litellm')) for m in sys.modules))"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
