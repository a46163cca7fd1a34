"""``rollwire demo``: the whole capture path on the embedded engine, with no GPU and no account.

Starts the reference engine on a loopback port, certifies it, drives a multi-turn tool
conversation through the capture proxy, writes the rollout document, and re-scores every
trainable token (parity). Everything it prints comes from the engine's own numbers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import orjson

from rollwire.capture.certify import render_table, validate_llm
from rollwire.capture.parity import render_report, run_parity
from rollwire.server.serving import bind, serving, url_of


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def run_demo(out: Path, *, turns: int = 3, temperature: float = 1.0, seed: int = 0) -> int:
    """Run the demo; 0 when the rollout is trainable and parity passes, else 1."""
    from rollwire.engine.model import DEFAULT_SERVED_NAME, ReferenceModel
    from rollwire.engine.server import create_engine_app

    app = create_engine_app(ReferenceModel(n_ctx=4096), served_name=DEFAULT_SERVED_NAME)
    sock = bind("127.0.0.1", 0)
    url = f"{url_of(sock)}/v1"
    async with serving(app, sock, stop_on_exit=True):
        _say(
            f"1/3 reference engine {DEFAULT_SERVED_NAME} (CPU, llama.cpp) on {url}; certifying ..."
        )
        cert = await validate_llm(url, probe_tools=False)
        print(render_table(cert), flush=True)
        _say(f"2/3 a {turns}-turn tool conversation through the capture proxy ...")
        report = await run_parity(url, turns=turns, temperature=temperature, seed=seed)
        doc = report.document
        if doc is not None:
            data = orjson.dumps(doc.model_dump(mode="json"), option=orjson.OPT_INDENT_2)
            await anyio.Path(out).write_bytes(data)
            s = doc.stats
            print(
                f"\nrollout: {s.turns} turns, {s.roots} root(s), {s.sequences} sequence(s), "
                f"{s.trainable_sequences} trainable, {s.trainable_tokens} trainable tokens, "
                f"{s.retokenized} re-tokenised -> {out}\n",
                flush=True,
            )
        _say("3/3 re-scoring every trainable token with the engine (parity) ...")
        print(render_report(report), flush=True)
    trainable = doc is not None and doc.stats.trainable_sequences > 0
    return 0 if trainable and report.verdict == "PASS" else 1
