"""The chaos run: one collection while every part of it fails, on a seeded schedule.

Two fake engines (each its own process, each keeping a ledger of what it sampled), a loopback
Ray cluster (a head and a second node), the MCP server that runs the collection
(``rollwire serve --http --ray``, its own process, its data folder on the fault file system of
``tests/fakes/faultfs.py``), and an MCP client that calls ``collect_episodes``. At moments drawn
from a fixed seed (a count of committed episodes), the schedule:

- SIGKILLs an engine, and restarts it on the same port a tenth of the plan later (at least 40
  episodes; or when the call ends), so that faults overlap;
- SIGKILLs the second Ray node, and adds a node when the call ends (Ray adds one on the main
  thread only);
- SIGKILLs the MCP server; it is restarted and the same ``collect_episodes`` call repeated;
- fills the disk (ENOSPC); the call ends naming the file, the disk is freed and the call repeated.

A call that ends for any reason (the server killed, the disk full, both engines gone, episodes
failed) is repeated once what was broken is back, until a call finds every planned episode
collected. Then the check (:func:`verify`): exactly the planned episodes, each id once; every
failure recorded with its cause; and every stored sequence token-exact: each trainable span's ids
and logprobs are what an engine's ledger says it sampled for exactly that prompt.

Used by ``tests/chaos/test_chaos.py`` (a short schedule, in CI) and by
``python -m tests.chaos.chaos`` (the long run of docs/reliability.md).
"""

from __future__ import annotations

from tests.fakes.ray_local import LocalCluster, local_cluster  # isort: skip (before Ray)

import argparse
import contextlib
import hashlib
import json
import random
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from rollwire.collect.collection import CollectConfig, work_list
from rollwire.tools.rollouts import Limits
from tests.fakes.faultfs import FaultFS, fault_fs
from tests.fakes.spawn import FakeEngineProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
TASKS = ["reasoning_gym:chain_sum", "reasoning_gym:basic_arithmetic"]
OUT_DIR = "chaos"
KINDS = ("engine", "node", "server", "disk")


@dataclass(frozen=True)
class Event:
    at: int  # committed episodes when it fires
    kind: str  # one of KINDS
    target: int = 0  # the engine (0 or 1)
    back_after: int = 40  # a killed engine or node comes back this many episodes later

    def describe(self) -> str:
        what = {
            "engine": f"SIGKILL engine {'AB'[self.target]} (restarted on its port {self.back_after} episodes later, or when the call ends)",
            "node": "SIGKILL the second Ray node (a node added when the call ends)",
            "server": "SIGKILL the MCP server (restarted, the same call repeated)",
            "disk": "fill the disk (ENOSPC; freed when the call ends, the call repeated)",
        }[self.kind]
        return f"at {self.at} episodes: {what}"


def schedule(seed: int, episodes: int, per_kind: int) -> list[Event]:
    """``per_kind`` events of each kind, in an order and at moments drawn from ``seed``: the
    span from 5% to 95% of the plan is cut into one slot per event, and each event fires at a
    random moment of its own slot (so no two faults land on the same episode)."""
    rng = random.Random(seed)
    kinds = [kind for kind in KINDS for _ in range(per_kind)]
    rng.shuffle(kinds)
    lo, hi = episodes // 20, episodes * 19 // 20
    width = (hi - lo) / len(kinds)
    back_after = max(40, episodes // 10)
    events = []
    for slot, kind in enumerate(kinds):
        first = lo + round(slot * width)
        last = max(first, lo + round((slot + 1) * width) - 1)
        target = rng.randint(0, 1) if kind == "engine" else 0
        events.append(Event(rng.randint(first, last), kind, target, back_after))
    return events


def planned_ids(episodes: int, group_size: int, seed: int) -> set[str]:
    cfg = CollectConfig(tasks=TASKS, episodes=episodes, group_size=group_size, seed=seed)
    return {w.episode_id for w in work_list(cfg, set())}


# --------------------------------------------------------------------------------------------
# The parts


class Server:
    """``rollwire serve --http --ray ADDRESS --data-dir DIR`` on a free loopback port."""

    def __init__(self, data_dir: Path, ray_address: str, log: Path) -> None:
        self.log = log
        self._log_file = log.open("ab")
        start = log.stat().st_size
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "rollwire", "serve", "--http", "--port", "0"),
                *("--ray", ray_address, "--data-dir", str(data_dir)),
            ],
            cwd=ROOT,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 90
        while True:
            text = log.read_bytes()[start:].decode(errors="replace")
            m = re.search(r"MCP server on (http://\S+/mcp)", text)
            if m:
                self.url = m.group(1)
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"serve --http did not start: {text[-2000:]}")
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self._log_file.close()


@dataclass
class Engines:
    """Two fake engines; each incarnation keeps its own ledger file."""

    ledgers: Path
    procs: list[FakeEngineProcess | None] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    starts: Counter[int] = field(default_factory=Counter)

    def start(self, i: int) -> None:
        port = self.ports[i] if i < len(self.ports) else free_port()
        ledger = self.ledgers / f"engine-{'AB'[i]}-{self.starts[i]}.jsonl"
        self.starts[i] += 1
        proc = FakeEngineProcess("--ledger", str(ledger), port=port)
        proc.behave(tool_call_every_turn=True, delay_s=0.02)
        if i < len(self.procs):
            self.procs[i] = proc
        else:
            self.procs.append(proc)
            self.ports.append(port)

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        if proc is not None:
            proc.kill()
        self.procs[i] = None

    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}/v1" for p in self.ports]

    def stop(self) -> None:
        for i in range(len(self.procs)):
            self.kill(i)


# --------------------------------------------------------------------------------------------
# The run


@dataclass
class Outcome:
    """What happened: each event as it fired, each call's end, and the final check."""

    events: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    check: dict[str, Any] = field(default_factory=dict)


def committed(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


async def run(
    base: Path, *, episodes: int, seed: int, per_kind: int, concurrency: int = 8
) -> Outcome:
    """The chaos run under ``base`` (a fresh folder); returns what happened and the check."""
    from mcp import Client

    outcome = Outcome()
    events = schedule(seed, episodes, per_kind)
    pending = list(events)
    comebacks: list[tuple[int, str, int]] = []  # (at, kind, target): a restart mid-call
    ledgers = base / "ledgers"
    ledgers.mkdir(parents=True)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        disk: FaultFS = stack.enter_context(fault_fs(base / "disk"))
        cluster: LocalCluster = stack.enter_context(local_cluster())
        second = [cluster.cluster.list_all_nodes()[-1]]
        engines = Engines(ledgers)
        stack.callback(engines.stop)
        engines.start(0)
        engines.start(1)
        out = disk.path / OUT_DIR
        episodes_file = out / "episodes.jsonl"
        args = {
            "out_dir": OUT_DIR,
            "episodes": episodes,
            "group_size": 2,
            "tasks": TASKS,
            "llm": engines.urls(),
            "limits": Limits(max_turns=2).model_dump(),
            "concurrency": concurrency,
            "seed": seed,
        }
        server: list[Server | None] = [None]
        disk_full = [False]

        def note(text: str) -> None:
            outcome.events.append(f"{time.monotonic() - started:7.1f} s  {text}")

        def comeback(kind: str, target: int) -> None:
            if kind == "engine" and engines.procs[target] is None:
                engines.start(target)
                note(f"engine {'AB'[target]} restarted on port {engines.ports[target]}")
            elif kind == "node" and second[0] is None:
                second[0] = cluster.add_node()
                note("a second Ray node added")

        def fire(event: Event) -> None:
            note(f"[{committed(episodes_file)} committed] {event.describe()}")
            if event.kind == "engine" and engines.procs[event.target] is not None:
                engines.kill(event.target)
                comebacks.append((event.at + event.back_after, "engine", event.target))
            elif event.kind == "node" and second[0] is not None:
                cluster.kill_node(second[0])
                second[0] = None
                comebacks.append((0, "node", 0))  # when the call ends
            elif event.kind == "server" and server[0] is not None:
                server[0].kill()
                server[0] = None
            elif event.kind == "disk":
                disk.fill()
                disk_full[0] = True

        async def monitor(done: anyio.Event) -> None:
            while not done.is_set():
                n = committed(episodes_file)
                while pending and pending[0].at <= n:
                    fire(pending.pop(0))
                # A killed engine comes back mid-call (started off the event loop); a node is
                # added between calls only: Ray adds one on the main thread alone, and seconds
                # of a blocked loop here would let the faults due meanwhile fire late.
                for back in [b for b in comebacks if b[0] <= n and b[1] == "engine"]:
                    comebacks.remove(back)
                    await anyio.to_thread.run_sync(comeback, back[1], back[2])
                await anyio.sleep(0.05)

        for attempt in range(1, 50):
            # What broke comes back before the call is repeated.
            if disk_full[0]:
                disk.heal()
                disk_full[0] = False
                note("disk freed")
            for _, kind, target in comebacks:
                comeback(kind, target)
            comebacks.clear()
            if server[0] is None:
                server[0] = await anyio.to_thread.run_sync(
                    Server, disk.path, cluster.address, base / "server.log"
                )
                note(f"MCP server started ({server[0].url})")
            result: dict[str, Any] | None = None
            ended = ""
            done = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(monitor, done)
                try:
                    async with Client(server[0].url) as mcp:
                        reply = await mcp.call_tool("collect_episodes", args)
                    if reply.is_error:
                        ended = "tool error: " + reply.content[0].text
                    else:
                        result = reply.structured_content
                except Exception as exc:  # the server was killed under the call
                    ended = f"call lost: {type(exc).__name__}"
                    if server[0] is not None and server[0].proc.poll() is not None:
                        server[0] = None
                finally:
                    done.set()
            if result is not None:
                ended = (
                    f"collected {result['collected']}, skipped {result['skipped_done']}, failed "
                    f"{result['failed']}, retried {result['retried']}"
                    + (f", halted: {result['halted']}" if result["halted"] else "")
                )
            outcome.calls.append(f"call {attempt} [{committed(episodes_file)} committed]: {ended}")
            if result is not None and committed(episodes_file) >= episodes and not pending:
                break
        if server[0] is not None:
            server[0].kill()
        outcome.wall_s = round(time.monotonic() - started, 1)
        outcome.check = verify(out, ledgers, episodes, seed)
    return outcome


# --------------------------------------------------------------------------------------------
# The check


def _lines(path: Path) -> list[dict[str, Any]]:
    """The committed lines of a JSONL file (a last line without its newline is not one)."""
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_bytes().split(b"\n")[:-1]]


def _key(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()


def load_ledgers(ledgers: Path) -> dict[tuple[int, str], list[dict[str, Any]]]:
    """Every reply the engines sampled, by (prompt length, prompt digest)."""
    served: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for path in sorted(ledgers.glob("*.jsonl")):
        for raw in path.read_bytes().split(b"\n")[:-1]:  # a killed engine's torn line: skipped
            entry = json.loads(raw)
            key = (len(entry["prompt"]), _key(entry["prompt"]))
            served.setdefault(key, []).extend(entry["choices"])
    return served


def sequence_problems(
    row: dict[str, Any], served: dict[tuple[int, str], list[dict[str, Any]]]
) -> list[str]:
    """Each trainable span of the sequence against the engines' ledgers: the span's ids and
    logprobs must lie inside a reply an engine sampled for exactly the ids before that reply.

    A span starts where its turn's prompt ends, or later when the turn's first tokens were
    masked as certain; a turn with a certain token inside it gives two spans of one reply."""
    ids, mask, lps = row["input_ids"], row["loss_mask"], row["logprobs"]
    if not (len(ids) == len(mask) == len(lps)):
        return [f"{row['sequence_id']}: lengths differ"]
    problems: list[str] = []
    # The replies the current turn may be: every sampled reply for exactly the ids before it
    # whose ids are the sequence's. More than one when a group's samples share a prompt and
    # sampled the same ids (their logprobs then tell them apart).
    replies: list[tuple[int, list[int], list[float]]] = []
    prev_end = 0
    i = 0
    while i < len(mask):
        if mask[i] == 0:
            i += 1
            continue
        start = i
        while i < len(mask) and mask[i] == 1:
            i += 1
        if not replies or i > replies[0][0] + len(replies[0][1]):  # a new turn
            replies = []
            for cut in range(start, prev_end - 1, -1):
                for choice in served.get((cut, _key(ids[:cut])), []):
                    got = choice["ids"]
                    if cut + len(got) >= i and ids[cut : cut + len(got)] == got[: len(ids) - cut]:
                        replies.append((cut, got, choice["logprobs"]))
                if replies:
                    break
        if not replies:
            problems.append(f"{row['sequence_id']}: span {start}:{i} is no reply an engine sampled")
        elif not any(all(lps[k] == lp[k - cut] for k in range(start, i)) for cut, _, lp in replies):
            problems.append(f"{row['sequence_id']}: span {start}:{i} logprobs are not the engine's")
        prev_end = i
    return problems


def verify(out: Path, ledgers: Path, episodes: int, seed: int) -> dict[str, Any]:
    rows = _lines(out / "episodes.jsonl")
    failures = _lines(out / "failures.jsonl")
    ids = [r["episode_id"] for r in rows]
    served = load_ledgers(ledgers)
    problems: list[str] = []
    sequences = spans = 0
    for r in rows:
        for seq in r["sequences"]:
            sequences += 1
            mask = seq["loss_mask"]
            spans += sum(1 for k, b in enumerate(mask) if b and (k == 0 or not mask[k - 1]))
            problems += sequence_problems(seq, served)
    causes = Counter(_cause(f.get("error") or "") for f in failures)
    return {
        "episodes": len(ids),
        "unique": len(set(ids)),
        "as_planned": set(ids) == planned_ids(episodes, 2, seed),
        "failure_records": len(failures),
        "failures_without_cause": sum(1 for f in failures if not f.get("error")),
        "failure_causes": dict(causes.most_common()),
        "sequences": sequences,
        "trainable_spans": spans,
        "token_problems": problems[:20],
        "n_token_problems": len(problems),
        "replies_in_ledgers": sum(len(v) for v in served.values()),
    }


def _cause(error: str) -> str:
    """A failure's cause without its particulars (ports, ids, numbers)."""
    text = re.sub(r"https?://\S+", "<url>", error)
    text = re.sub(r"\b[0-9a-f]{8,}\b", "<id>", text)
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    return text[:140]


def main() -> None:
    parser = argparse.ArgumentParser(description="The chaos run (docs/reliability.md).")
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--per-kind", type=int, default=3, help="events of each kind")
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--base", default=None, help="a fresh folder (default: a temporary one)")
    parser.add_argument("--json", default=None, help="write the outcome here")
    args = parser.parse_args()
    import tempfile

    base = Path(args.base or tempfile.mkdtemp(prefix="rollwire-chaos-"))
    outcome = anyio.run(
        lambda: run(
            base,
            episodes=args.episodes,
            seed=args.seed,
            per_kind=args.per_kind,
            concurrency=args.concurrency,
        )
    )
    print("schedule:")
    for e in schedule(args.seed, args.episodes, args.per_kind):
        print("  " + e.describe())
    print("what happened:")
    for line in outcome.events:
        print("  " + line)
    print("calls:")
    for line in outcome.calls:
        print("  " + line)
    print(f"wall {outcome.wall_s} s; check: {json.dumps(outcome.check, indent=2)}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "schedule": [
                        e.describe() for e in schedule(args.seed, args.episodes, args.per_kind)
                    ],
                    "events": outcome.events,
                    "calls": outcome.calls,
                    "wall_s": outcome.wall_s,
                    "check": outcome.check,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
