"""Web UI: how long the rollout page takes to open in a real browser, on an 800-turn, 128k-token
rollout, against a 2-turn one in the same run (the baseline: the page's fixed cost).

The big rollout is built by the capture path itself: every turn is a vLLM-shaped reply (the
same generator as ``bench/graph_ingest.py``: prompts growing to ``--final-tokens``, 64 sampled
ids per turn, one top candidate per position) put through ``ingest_chat_reply`` and the
linker, then ``export_rollout``. It is stored in a server state as a finished rollout and
served by the real ``http_app`` (uvicorn on loopback); Debian's Chromium (Playwright) opens
``/ui/rollouts/<id>`` with a cold cache, ``--rounds`` times.

Timed in the browser (``performance.now()``, from navigation start):

* ``strip_ms``: until the token strip is drawn with its trained-token count (the page's
  graph, turn list and the sequence's arrays are all loaded by then);
* ``end_ms``: after that, scrolling the strip to its last row until the last token's cell is
  drawn.

Target: ``strip_ms`` under 2,000 for the big rollout. Run from the repository root::

    UV_PYTHON_DOWNLOADS=never uv run python bench/ui_open.py

Results: a markdown table on stdout and ``bench/results/ui_open.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from graph_ingest import linear_rollout, reply_bytes
from rollwire.capture.export import RolloutDocument, export_rollout
from rollwire.capture.ingest import ingest_chat_reply
from rollwire.capture.rollout import CaptureLevel, RolloutGraph, RolloutType
from rollwire.result import RolloutResult
from rollwire.server.mcp_app import ServerState, build_server, http_app
from rollwire.tools.rollouts import StoredRollout

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "ui_open.json"
TARGET_MS = 2000.0
CHROMIUM = "/usr/bin/chromium"


def build(turns: int, final_tokens: int, seed: int = 0) -> RolloutDocument:
    """A linear rollout of ``turns`` calls whose last prompt is ``final_tokens`` long."""
    rng = np.random.default_rng(seed)
    graph = RolloutGraph(CaptureLevel.TOKENS)
    for spec in linear_rollout(turns, final_tokens, min(512, final_tokens // 4), 64, seed):
        reply = orjson.loads(reply_bytes(spec, rng))
        ingested = ingest_chat_reply(spec.node_id, reply, capture_level=CaptureLevel.TOKENS)
        assert ingested.turn is not None
        graph.add(ingested.turn)
    return export_rollout(graph)


def stored(rollout_id: str, document: RolloutDocument) -> StoredRollout:
    stats = document.stats
    result = RolloutResult(
        ok=True,
        rollout_id=rollout_id,
        task="bench:linear",
        harness="bench",
        reward=1.0,
        rollout_type=RolloutType.TRAIN,
        capture_level=CaptureLevel.TOKENS,
        n_turns=stats.turns,
        n_roots=stats.roots,
        n_trainable_sequences=stats.trainable_sequences,
        n_trainable_tokens=stats.trainable_tokens,
    )
    return StoredRollout(result=result, document=document)


class Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:
        pass


def serve(app: Any) -> tuple[Server, str]:
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = Server(uvicorn.Config(app, log_level="warning", access_log=False))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.02)
    return server, f"http://127.0.0.1:{sock.getsockname()[1]}"


def open_page(browser: Any, url: str, length: int) -> dict[str, float]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_selector("[data-testid=strip][data-trained]", timeout=60_000)
    strip_ms = page.evaluate("performance.now()")
    page.evaluate(
        "() => { const s = document.querySelector('[data-testid=strip]');"
        " (s.closest('[data-scroll]') || s.parentElement).scrollTop = 1e9;"
        " s.scrollTop = 1e9; }"
    )
    page.wait_for_selector(f'[data-testid=token][data-pos="{length - 1}"]', timeout=60_000)
    end_ms = page.evaluate("performance.now()") - strip_ms
    trained = int(page.get_attribute("[data-testid=strip]", "data-trained") or -1)
    context.close()
    if errors:
        raise RuntimeError(f"page errors: {errors}")
    return {"strip_ms": strip_ms, "end_ms": end_ms, "trained": trained}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--turns", type=int, default=800)
    p.add_argument("--final-tokens", type=int, default=128_000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)

    from playwright.sync_api import sync_playwright

    t0 = time.perf_counter()
    big = build(args.turns, args.final_tokens)
    build_s = time.perf_counter() - t0
    small = build(2, 1024)
    state = ServerState()
    state.store.put(stored("big", big))
    state.store.put(stored("small", small))
    server, root = serve(http_app(build_server(state)))
    rows: dict[str, list[dict[str, float]]] = {"small": [], "big": []}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            for _ in range(args.rounds):
                for name, doc in (("small", small), ("big", big)):
                    seq = doc.sequences[0]
                    got = open_page(browser, f"{root}/ui/rollouts/{name}", len(seq.input_ids))
                    if got["trained"] != sum(seq.loss_mask):
                        raise RuntimeError(f"{name}: the strip shows {got['trained']} trained")
                    rows[name].append(got)
            browser.close()
    finally:
        server.should_exit = True

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[name])

    out = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "command": "uv run python bench/ui_open.py " + " ".join(argv or sys.argv[1:]),
        "big": {
            "turns": big.stats.turns,
            "tokens": len(big.sequences[0].input_ids),
            "trainable_tokens": big.stats.trainable_tokens,
            "build_s": round(build_s, 2),
            "strip_ms_median": round(med("big", "strip_ms"), 1),
            "end_ms_median": round(med("big", "end_ms"), 1),
            "rounds": rows["big"],
        },
        "small": {
            "turns": small.stats.turns,
            "tokens": len(small.sequences[0].input_ids),
            "strip_ms_median": round(med("small", "strip_ms"), 1),
            "end_ms_median": round(med("small", "end_ms"), 1),
            "rounds": rows["small"],
        },
        "ratio_big_over_small": round(med("big", "strip_ms") / med("small", "strip_ms"), 2),
        "target_ms": TARGET_MS,
        "met": med("big", "strip_ms") < TARGET_MS,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
    print("| rollout | turns | tokens | strip drawn (median ms) | scroll to end (median ms) |")
    print("|---|---|---|---|---|")
    for name in ("small", "big"):
        r = out[name]
        print(
            f"| {name} | {r['turns']} | {r['tokens']:,} | {r['strip_ms_median']:,.0f} | "
            f"{r['end_ms_median']:,.0f} |"
        )
    print(
        f"\nbig / small: {out['ratio_big_over_small']}x; target < {TARGET_MS:,.0f} ms: "
        f"{'met' if out['met'] else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
