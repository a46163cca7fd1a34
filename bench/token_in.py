"""Token-in continuation: fragmentation and added latency, token-in off against on, in one run.

Fragmentation = broken links / links: a conversation of T calls has T-1 links; every extra root
of its rollout graph (a call whose prompt does not extend its parent's prompt + sampled ids) is a
broken link. Two engines:

* the fake vLLM (``tests.fakes.vllm``) with a sampler that splits one word into two pieces the
  re-tokeniser would not produce, and a template that drops tool calls from history (both
  measured on real vLLM with SmolLM2, see shared/FACTS.md): multi-turn tool conversations;
* the reference engine (SmolLM2-135M on CPU, llama.cpp): ``rollwire parity``'s tool
  conversation (4 calls) at T=1.0 and T=1.3, seeds 0..N-1.

Token-in is measured by each engine path (``rollwire.capture.token_paths``): ``vllm_chat``
(``kv_transfer_params.prompt_token_ids`` on chat) and ``completions`` (``/v1/completions`` with a
token prompt, tool calls parsed by the proxy), against off.

Added latency: per-call median of the proxied call with token-in on minus off, on the fake
(alternating rounds; on costs two ``/tokenize`` calls per continuing call).

Run from the repository root::

    UV_PYTHON_DOWNLOADS=never uv run python bench/token_in.py           # ~5-8 min
    UV_PYTHON_DOWNLOADS=never uv run python bench/token_in.py --quick   # ~1-2 min

Targets: fragmentation 0% with token-in on, on both engines; added latency <= 2 ms per call on
the fake. Results: a markdown table and ``bench/results/token_in.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM

from measure import free_port, start_fake
from rollwire.capture.parity import run_parity
from rollwire.capture.proxy import CaptureProxy, ProxyConfig
from rollwire.capture.rollout import CaptureLevel
from rollwire.serving import bind, serving, url_of

# label -> (token_in, token_in_path); an engine is measured by the paths it certifies
MODES: dict[str, tuple[str, str | None]] = {
    "off": ("off", None),
    "vllm_chat": ("auto", "vllm_chat"),
    "sglang_chat": ("auto", "sglang_chat"),
    "completions": ("auto", "completions"),
}
# the fake answers as vLLM: its chat takes kv_transfer_params, its completions a token prompt
FAKE_MODES = {k: v for k, v in MODES.items() if k != "sglang_chat"}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
]

ADMIN_KEY = "bench-admin-key"  # the proxy's control plane always needs one


def fragmentation(docs: list[dict[str, Any]]) -> tuple[int, int]:
    """(broken links, links) over rollout documents."""
    broken = sum(d["stats"]["roots"] - 1 for d in docs)
    links = sum(d["stats"]["turns"] - 1 for d in docs)
    return broken, links


def answer(
    messages: list[dict[str, Any]], message: dict[str, Any], result: str, follow_up: str
) -> None:
    """The harness's side of a turn: the reply into history, then each tool call's result, or
    a follow-up user message when the model called no tool."""
    said = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        said["tool_calls"] = message["tool_calls"]
    messages.append(said)
    for call in message.get("tool_calls") or []:
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    if not message.get("tool_calls"):
        messages.append({"role": "user", "content": follow_up})


def summary(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """One table row: fragmentation over the documents, sampled tool calls, token-in modes."""
    broken, links = fragmentation(docs)
    return {
        "conversations": len(docs),
        "links": links,
        "broken": broken,
        "fragmentation": broken / links if links else 0.0,
        "sampled_tool_calls": sum(
            1 for d in docs for turn in d["turns"] if (turn["reply"] or {}).get("tool_calls")
        ),
        "token_in": [d["stats"]["token_in"] for d in docs],
    }


async def fake_conversation(
    http: httpx.AsyncClient, root: str, turns: int, timings: list[float], seed: int
) -> dict[str, Any]:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    sid = (await http.post(f"{root}/sessions", headers=admin)).json()["session_id"]
    headers = {"Authorization": f"Bearer {sid}"}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"Tell me about hypotheses and theories, case {seed}."}
    ]
    for turn in range(turns):
        body = {"model": "x", "messages": messages, "tools": TOOLS, "max_tokens": 24, "seed": turn}
        start = time.perf_counter()
        reply = (await http.post(f"{root}/v1/chat/completions", json=body, headers=headers)).json()
        if turn:  # first calls are rendered either way
            timings.append((time.perf_counter() - start) * 1000)
        answer(messages, reply["choices"][0]["message"], "a guess", f"Go on ({turn}).")
    doc = (await http.get(f"{root}/sessions/{sid}/rollout", headers=admin)).json()
    await http.delete(f"{root}/sessions/{sid}", headers=admin)
    return doc


FAKE_BEHAVIOR = {
    "noncanonical_split": True,
    "tool_call_every_turn": True,
    "drop_tool_calls_in_history": True,
    "tools_in_prompt": True,  # so the completions route sees the tools, as a Hermes template
}


@contextlib.contextmanager
def fake_upstream(in_process: bool) -> Iterator[str]:
    """The fake vLLM's URL: served from a thread of this process (it then shares the GIL with
    the proxies and the client, so its /tokenize work counts as proxy latency), or from a
    process of its own, as a real engine is."""
    if in_process:
        fake = FakeVLLM()
        fake.behavior.update(**FAKE_BEHAVIOR)
        with serve_in_thread(fake.app) as url:
            yield url
        return
    port = free_port()
    proc = start_fake(port, FAKE_BEHAVIOR)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def bench_fake(
    conversations: int, turns: int, rounds: int, *, in_process: bool = True
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with fake_upstream(in_process) as upstream:
        proxies = {}
        for label, (mode, path) in FAKE_MODES.items():
            config = ProxyConfig(
                llm_url=upstream + "/v1",
                capture_level=CaptureLevel.TOKENS,
                token_in=mode,
                token_in_path=path,
                admin_key=ADMIN_KEY,
            )
            proxies[label] = (CaptureProxy(config), bind("127.0.0.1", 0))
        docs: dict[str, list[dict[str, Any]]] = {label: [] for label in FAKE_MODES}
        timings: dict[str, list[float]] = {label: [] for label in FAKE_MODES}
        async with contextlib.AsyncExitStack() as stack:
            for proxy, sock in proxies.values():
                await stack.enter_async_context(serving(proxy.app, sock, stop_on_exit=True))
            http = await stack.enter_async_context(httpx.AsyncClient(timeout=60))
            labels = list(FAKE_MODES)
            for r in range(rounds):
                order = labels if r % 2 == 0 else labels[::-1]
                for label in order:
                    root = url_of(proxies[label][1])
                    for c in range(conversations):
                        docs[label].append(
                            await fake_conversation(http, root, turns, timings[label], c)
                        )
        for label in FAKE_MODES:
            broken, links = fragmentation(docs[label])
            out[label] = {
                "conversations": len(docs[label]),
                "links": links,
                "broken": broken,
                "fragmentation": broken / links if links else 0.0,
                "median_ms": statistics.median(timings[label]),
                "spliced": sum(d["stats"]["token_in"].get("spliced", 0) for d in docs[label]),
            }
        for label in FAKE_MODES:
            if label != "off":
                out[label]["added_ms"] = out[label]["median_ms"] - out["off"]["median_ms"]
    return out


async def bench_engine(
    seeds: int, temperatures: list[float], turns: int, llm_url: str | None = None
) -> dict[str, Any]:
    """The reference engine, or the engine at ``llm_url`` (e.g. a real vLLM)."""
    async with contextlib.AsyncExitStack() as stack:
        if llm_url is None:
            from rollwire.engine.model import DEFAULT_SERVED_NAME, ReferenceModel
            from rollwire.engine.server import create_engine_app

            app = create_engine_app(ReferenceModel(n_ctx=4096), served_name=DEFAULT_SERVED_NAME)
            sock = bind("127.0.0.1", 0)
            await stack.enter_async_context(serving(app, sock, stop_on_exit=True))
            llm_url = url_of(sock) + "/v1"
        return await _engine_rows(llm_url, seeds, temperatures, turns)


async def tool_conversation(url: str, mode: str, path: str | None, t: float, seed: int) -> Any:
    """Three calls whose first is a forced (named) tool call, so the history holds a tool call
    the model sampled and the template re-renders (SmolLM2's drops it, fixture 05b); then the
    tool result and a follow-up. Returns the rollout document."""
    from rollwire.capture.certify import TOOL_MANIFEST, validate_llm
    from rollwire.capture.proxy import certified_config

    cert = await validate_llm(url, probe_tools=False)
    proxy = CaptureProxy(certified_config(url, cert, token_in=mode, token_in_path=path))
    named = {"type": "function", "function": {"name": TOOL_MANIFEST[0]["function"]["name"]}}
    async with proxy.app.router.lifespan_context(proxy.app):
        session = proxy.sessions.open(metadata={"purpose": "bench"})
        headers = {"Authorization": f"Bearer {session.session_id}"}
        transport = httpx.ASGITransport(app=proxy.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://p", timeout=600) as c:
            messages: list[dict[str, Any]] = [
                {"role": "user", "content": "What is the weather in Paris?"}
            ]
            for k in range(3):
                body = {
                    "model": cert.model,
                    "messages": messages,
                    "tools": TOOL_MANIFEST,
                    "max_tokens": 128 if k == 0 else 40,
                    "temperature": t,
                    "seed": seed * 10 + k,
                }
                if k == 0:
                    body["tool_choice"] = named
                reply = (await c.post("/v1/chat/completions", json=body, headers=headers)).json()
                result = '{"sky": "cloudy", "temperature_c": 18}'
                answer(messages, reply["choices"][0]["message"], result, "And tomorrow?")
        return session.document()


async def _certified_modes(url: str) -> dict[str, tuple[str, str | None]]:
    from rollwire.capture.certify import validate_llm

    cert = await validate_llm(url, probe_tools=False)
    return {k: (m, p) for k, (m, p) in MODES.items() if p is None or p in cert.token_in_paths}


async def _tool_rows(url: str, seeds: int, t: float) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for label, (mode, path) in (await _certified_modes(url)).items():
        docs = [
            (await tool_conversation(url, mode, path, t, s)).model_dump(mode="json")
            for s in range(seeds)
        ]
        row[label] = summary(docs)
    return row


async def _engine_rows(
    url: str, seeds: int, temperatures: list[float], turns: int
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    modes = await _certified_modes(url)
    for t in temperatures:
        row: dict[str, Any] = {}
        for label, (mode, path) in modes.items():
            docs = []
            for seed in range(seeds):
                report = await run_parity(
                    url,
                    temperature=t,
                    turns=turns,
                    seed=seed,
                    rescore_tokens=False,
                    token_in=mode,
                    token_in_path=path,
                )
                assert report.document is not None, report.findings
                docs.append(report.document.model_dump(mode="json"))
            row[label] = summary(docs)
        out[f"T={t}"] = row
    out["tool T=1.3"] = await _tool_rows(url, seeds, 1.3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-engine", action="store_true", help="skip the reference engine")
    parser.add_argument(
        "--llm-url",
        help="measure this engine (e.g. a real vLLM at http://127.0.0.1:8023/v1) instead of the "
        "reference engine",
    )
    parser.add_argument("--seeds", type=int, help="conversations per temperature and mode")
    args = parser.parse_args()
    conversations, rounds, seeds = (4, 2, 2) if args.quick else (10, 4, 6)
    start = time.perf_counter()
    load_start = os.getloadavg()
    fake = asyncio.run(bench_fake(conversations, 5, rounds))
    # the same with the fake in a process of its own: what the proxy adds, the engine's own
    # /tokenize work then runs beside it (as a real engine's does)
    fake_apart = asyncio.run(bench_fake(conversations, 5, rounds, in_process=False))
    seeds = args.seeds or seeds
    engine = (
        None
        if args.no_engine
        else asyncio.run(bench_engine(seeds, [1.0, 1.3], 4, llm_url=args.llm_url))
    )
    engine_name = "reference" if args.llm_url is None else args.llm_url
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    result = {
        "date": dt.date.today().isoformat(),
        "commit": commit,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "quick": args.quick,
        "fake": fake,
        "fake_process": fake_apart,
        "engine": engine,
        "engine_url": args.llm_url,
        "wall_s": round(time.perf_counter() - start, 1),
        "loadavg_start": [round(x, 2) for x in load_start],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }
    name = "token_in_quick.json" if args.quick else "token_in.json"
    if args.no_engine:
        name = name.replace(".json", "_fake_only.json")
    elif args.llm_url:
        name = name.replace(".json", "_external.json")
    out = Path(__file__).resolve().parent / "results" / name
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("| engine | T | token-in | conversations | links | broken | fragmentation |")
    print("|---|---|---|---|---|---|---|")
    for label in FAKE_MODES:
        f = fake[label]
        print(
            f"| fake | 1.0 | {label} | {f['conversations']} | {f['links']} | {f['broken']} | "
            f"{f['fragmentation']:.1%} |"
        )
    for key, row in (engine or {}).items():
        for label, e in row.items():
            print(
                f"| {engine_name} | {key.replace('T=', '')} | {label} | {e['conversations']} | {e['links']} | "
                f"{e['broken']} | {e['fragmentation']:.1%} |"
            )
    print("\nadded latency per continuing call on the fake (median, on - off):")
    for where, run in (("in this process", fake), ("in its own process", fake_apart)):
        for label in FAKE_MODES:
            if label != "off":
                f = run[label]
                print(
                    f"  fake {where}, {label}: {f['added_ms']:+.2f} ms "
                    f"(off {run['off']['median_ms']:.2f} ms, on {f['median_ms']:.2f} ms, "
                    f"{f['fragmentation']:.0%} fragmentation)"
                )
    print(f"wall {result['wall_s']} s -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
