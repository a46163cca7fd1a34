"""Many engines behind one collection: certified together, one engine per rollout, the least
loaded first, a dead engine drained with only its own rollouts failing, and a halt (then a
resume) when no engine is left. The engines are the vLLM-shaped fake, each its own process."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest

from rollwire.collect.collection import CollectConfig, CollectInputError, CollectProgress, collect
from rollwire.tools.endpoint import EndpointPool
from rollwire.tools.engines import DRAIN_AFTER, Engine, EngineSet, NoEngineLeft
from rollwire.tools.rollouts import Limits, LLMSpec
from tests.fakes.spawn import fake_engine, two_engines

pytestmark = pytest.mark.anyio

TASKS = ["reasoning_gym:chain_sum", "reasoning_gym:basic_arithmetic"]


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def config(urls: list[str], **kw) -> CollectConfig:
    return CollectConfig(
        tasks=TASKS,
        episodes=kw.pop("episodes", 24),
        llm=[LLMSpec(url=u) for u in urls],
        limits=Limits(max_turns=2),
        concurrency=kw.pop("concurrency", 4),
        **kw,
    )


def _engine(index: int, in_flight: int, pinned: int = 0, failures: int = 0) -> Engine:
    upstream = SimpleNamespace(
        in_flight=in_flight, transport_failures_in_a_row=failures, last_transport_error="refused"
    )
    endpoint = SimpleNamespace(upstream=upstream)
    return Engine(index, f"http://e{index}/v1", None, None, endpoint, pinned=pinned)  # type: ignore[arg-type]


def test_a_new_rollout_goes_to_the_engine_with_the_fewest_calls_in_flight():
    engines = EngineSet([_engine(0, in_flight=5), _engine(1, in_flight=2), _engine(2, 3)])
    with engines.lease() as chosen:
        assert chosen.index == 1 and chosen.pinned == 1
    assert chosen.pinned == 0 and chosen.rollouts == 1


def test_equal_calls_in_flight_are_split_by_pinned_rollouts():
    engines = EngineSet([_engine(0, 0), _engine(1, 0)])
    with engines.lease() as a, engines.lease() as b, engines.lease() as c:
        assert [a.index, b.index, c.index] == [0, 1, 0]


def test_an_engine_failing_without_reply_in_a_row_is_drained_and_the_last_one_halts():
    engines = EngineSet([_engine(0, 0, failures=DRAIN_AFTER), _engine(1, 9)])
    with engines.lease() as chosen:
        assert chosen.index == 1  # the idle engine 0 is drained, not chosen
    assert engines.engines[0].drained and "refused" in engines.engines[0].drained
    engines.engines[1].endpoint.upstream.transport_failures_in_a_row = DRAIN_AFTER
    with pytest.raises(NoEngineLeft, match="every engine is drained"), engines.lease():
        pass


async def test_a_collection_over_two_engines_pins_each_rollout_to_one_and_uses_both(tmp_path):
    with two_engines(delay_s=0.02) as (a, b):
        pool = EndpointPool()
        try:
            result = await collect(config([a.url, b.url]), tmp_path / "c", pool=pool)
            calls = {a.url: a.stats()["chat_completions"], b.url: b.stats()["chat_completions"]}
        finally:
            await pool.aclose()
    episodes = lines(tmp_path / "c" / "episodes.jsonl")
    assert result.collected + result.failed == 24 and result.halted is None
    uses = {u.url: u for u in result.engines}
    assert uses[a.url].rollouts > 0 and uses[b.url].rollouts > 0  # spread over both
    assert uses[a.url].rollouts + uses[b.url].rollouts == 24
    # Pinned: each engine served exactly the model calls of the episodes recorded on it (plus
    # certification's probes before the first episode).
    turns = Counter()
    for e in episodes:
        turns[e["engine"]] += e["n_turns"]
    assert result.failed == 0
    for url in (a.url, b.url):
        probes = calls[url] - turns[url]
        assert 0 < probes <= 12, (url, calls[url], turns[url])


async def test_engines_serving_different_models_are_refused_naming_the_difference(tmp_path):
    with (
        fake_engine("--served-model-name", "model-a") as a,
        fake_engine("--served-model-name", "model-b") as b,
    ):
        pool = EndpointPool()
        try:
            with pytest.raises(CollectInputError, match=r"^llm: .*model is 'model-a'.*'model-b'"):
                await collect(config([a.url, b.url]), tmp_path / "c", pool=pool)
        finally:
            await pool.aclose()
    assert not (tmp_path / "c").exists()  # refused before anything was written


async def test_a_killed_engine_fails_only_its_own_rollouts_and_the_rest_finish_on_the_other(
    tmp_path,
):
    n = 40
    with two_engines() as (a, b):

        def kill_b(p: CollectProgress) -> None:
            if p.done >= 8:
                b.kill()

        pool = EndpointPool()
        try:
            with anyio.fail_after(120):  # never hangs
                result = await collect(
                    config([a.url, b.url], episodes=n),
                    tmp_path / "c",
                    pool=pool,
                    on_progress=kill_b,
                )
        finally:
            await pool.aclose()
    episodes = lines(tmp_path / "c" / "episodes.jsonl")
    failures = lines(tmp_path / "c" / "failures.jsonl")
    assert result.halted is None
    assert result.collected + result.failed == n == len(episodes) + len(failures)
    assert 1 <= result.failed <= 4 + DRAIN_AFTER  # the ones pinned to b when it died
    assert all(f["engine"] == b.url for f in failures)  # only b's rollouts failed
    assert all(b.url.split("//")[1] in f["error"] for f in failures)
    uses = {u.url: u for u in result.engines}
    assert uses[b.url].drained and uses[a.url].drained is None
    assert uses[b.url].failed == result.failed
    assert Counter(e["engine"] for e in episodes)[a.url] >= n - 8 - result.failed


async def test_when_every_engine_is_drained_the_collection_halts_and_resumes_later(tmp_path):
    n = 30
    out = tmp_path / "c"
    with fake_engine(tool_call_every_turn=True, delay_s=0.05) as a:

        def kill_a(p: CollectProgress) -> None:
            if p.done >= 6:
                a.kill()

        pool = EndpointPool()
        try:
            with anyio.fail_after(120):
                first = await collect(
                    config([a.url], episodes=n), out, pool=pool, on_progress=kill_a
                )
        finally:
            await pool.aclose()
    assert first.halted and "every engine is drained" in first.halted
    assert first.collected + first.failed < n  # the rest was not run, nor written as failures
    with fake_engine(port=a.port, tool_call_every_turn=True) as again:  # the engine is back
        pool = EndpointPool()
        try:
            second = await collect(config([again.url], episodes=n), out, pool=pool)
        finally:
            await pool.aclose()
    assert second.halted is None and second.failed == 0
    episodes = lines(out / "episodes.jsonl")
    ids = [e["episode_id"] for e in episodes]
    assert len(ids) == len(set(ids)) == n  # each episode exactly once
    assert second.skipped_done == first.collected


def test_cli_collect_takes_llm_url_repeated_and_names_a_bad_ray_address(tmp_path, capsys):
    from rollwire.server import cli

    with fake_engine(tool_call_every_turn=True) as a, fake_engine(tool_call_every_turn=True) as b:
        argv = ["collect", "--llm-url", a.url, "--llm-url", b.url, "--task", TASKS[0]]
        argv += ["-n", "6", "--max-turns", "2", "--out", str(tmp_path / "c"), "--no-progress"]
        assert cli.main([*argv, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["collected"] == 6 and {e["url"] for e in out["engines"]} == {a.url, b.url}
        bad = ["collect", "--llm-url", a.url, "--task", TASKS[0], "-n", "2"]
        bad += ["--out", str(tmp_path / "d"), "--no-progress", "--ray", "127.0.0.1:9"]
        assert cli.main(bad) == 2
    err = capsys.readouterr().err
    assert "ray: nothing answers at 127.0.0.1:9" in err
    assert not (tmp_path / "d").exists()  # nothing written


async def test_mcp_collect_episodes_takes_a_list_of_engines(tmp_path):
    from mcp import Client

    from rollwire.server.mcp_app import ServerState, build_server

    with fake_engine(tool_call_every_turn=True) as a, fake_engine(tool_call_every_turn=True) as b:
        state = ServerState(data_dir=tmp_path / "data")
        async with state, Client(build_server(state)) as client:
            args = {
                "out_dir": "two",
                "episodes": 8,
                "tasks": TASKS,
                "llm": [a.url, {"url": b.url}],
                "limits": {"max_turns": 2},
            }
            result = await client.call_tool("collect_episodes", args)
            out = result.structured_content
            assert not result.is_error and out["collected"] == 8, out
            assert {e["url"] for e in out["engines"] if e["rollouts"]} == {a.url, b.url}
            both = await client.call_tool("collect_episodes", {**args, "llm_url": a.url})
            assert both.is_error and "llm" in str(both.content[0].text)


def test_serve_ray_gives_collect_episodes_its_cluster(tmp_path):
    from rollwire.server.cli import _server_state, build_parser

    args = build_parser().parse_args(
        ["serve", "--http", "--ray", "10.0.0.5:6379", "--data-dir", str(tmp_path)]
    )
    assert _server_state(args).ray_address == "10.0.0.5:6379"
    plain = build_parser().parse_args(["serve", "--http", "--data-dir", str(tmp_path)])
    assert _server_state(plain).ray_address is None
