"""Collection throughput and memory: ``collect()`` into the episode store against a fake upstream.

Two measurements, both of ``reasoning_gym:chain_sum`` (``max_turns`` 2) through the real path
(``collect`` -> ``attempt`` -> the env tool loop -> the in-process capture proxy -> the fake vLLM
``FakeVLLM(tool_call_every_turn=True)`` -> the verdict -> ``EpisodeRecord`` -> ``EpisodeStore``):

1. **Episodes/s at concurrency 1, 16 and 64**, each into a fresh output directory. Baseline in
   the same run: the same episodes through bare ``attempt()`` calls (what ``collect`` runs per
   episode, the same requests and seeds, the same concurrency) with no store, no record and no
   progress. Rounds alternate bare/collect (bare first in even rounds) so noise hits both sides.
   The difference, in ms per episode, is what collecting adds on top of running: the record, its
   JSON line, the worker-thread hop, ``write`` + ``fsync`` (serialised by the store's lock), the
   manifest every 2 s and the progress report. A serial microbenchmark of the store's parts
   (record, line, ``write_episode``, ``append_episode``) on the same filesystem splits that up.
2. **Memory over 10,000 episodes** (``--quick``: 2,000) in one ``collect()`` at concurrency 16:
   VmRSS (``/proc/self/status``) sampled every 2.5% of the episodes from ``on_progress``, the
   count of gc-tracked objects (types counted at 10%, 50% and 100%); the same collection again
   in this process (does anything accumulate across collections?); then one with
   ``tracemalloc`` on (``--quick``: 1,000 episodes), its Python-heap snapshots at 10%, 50% and
   100% compared by allocation site. What is *expected* to grow:
   the ids the collector returns (``CollectResult.episode_ids``) and the store's set of done ids
   (for resume), measured here on the same number of 24-hex-digit ids.

The fake runs in its own process (pinned to CPU 0, this process to CPU 1 when ``taskset`` exists
and two CPUs are free; ``--no-pin`` turns that off) behind ``tests/fakes/serve.py``'s
``serve_in_thread``; it forgets each request after answering (its request log would otherwise
grow). ``--fake thread`` serves it from a thread of this process instead (it then shares this
process's GIL). The CPU of this process, of the fake and of other processes is reported per run,
so it is visible which one limits episodes/s.

    UV_PYTHON_DOWNLOADS=never uv run python bench/collect_throughput.py --quick   # ~1 min
    UV_PYTHON_DOWNLOADS=never uv run python bench/collect_throughput.py           # ~7-10 min

Results: markdown tables on stdout and ``bench/results/collect_throughput.json``
(``--quick``: ``collect_throughput_quick.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import gc
import linecache
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import warnings
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson

from measure import git_state
from rollwire.collect.collection import CollectConfig, CollectProgress, collect, work_list
from rollwire.datasets.records import EpisodeRecord, episode_id
from rollwire.datasets.store import EpisodeStore
from rollwire.result import RolloutResult
from rollwire.tools.endpoint import EndpointPool
from rollwire.tools.rollouts import Limits, LLMSpec, RolloutRequest, attempt, plan

THIS_FILE = Path(__file__).resolve()
ROOT = THIS_FILE.parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
TASK = "reasoning_gym:chain_sum"
MAX_TURNS = 2
FAKE_CPU = 0
BENCH_CPU = 1
MEMORY_CONCURRENCY = 16
MEMORY_SAMPLES = 40  # RSS samples over the memory run (every 2.5%)
TRACE_FRAMES = 8
TICK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- the fake upstream


def _tests_importable() -> None:
    """``tests.fakes`` lives in the repository, not in the installed package."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def fake_app() -> Any:
    """``FakeVLLM(tool_call_every_turn=True)``, wrapped to forget each request once answered
    (its ``requests``/``request_log`` lists grow by one entry per call otherwise)."""
    _tests_importable()
    from tests.fakes.vllm import FakeVLLM

    fake = FakeVLLM(tool_call_every_turn=True)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        try:
            await fake.app(scope, receive, send)
        finally:
            if scope["type"] == "http":
                fake.requests.clear()
                fake.request_log.clear()

    return app


@contextlib.contextmanager
def fake_in_thread() -> Iterator[tuple[str, Callable[[], float]]]:
    """The fake served from a thread of this process; yields (url, its CPU seconds so far)."""
    _tests_importable()
    from tests.fakes.serve import serve_in_thread

    with serve_in_thread(fake_app()) as url:
        thread = next(t for t in threading.enumerate() if t.name.startswith("uvicorn-"))
        stat = Path(f"/proc/self/task/{thread.native_id}/stat")
        yield url, lambda: _stat_cpu_s(stat)


@contextlib.contextmanager
def fake_in_process(pin: bool) -> Iterator[tuple[str, Callable[[], float], int]]:
    """The fake in its own process; yields (url, its CPU seconds so far, pid)."""
    cmd = [sys.executable, str(THIS_FILE), "--serve-fake"]
    if pin:
        cmd = ["taskset", "-c", str(FAKE_CPU), *cmd]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()  # the URL, once it accepts connections
        if not line.startswith("http://"):
            raise RuntimeError(f"the fake did not start (exit {proc.poll()}): {line!r}")
        stat = Path(f"/proc/{proc.pid}/stat")
        yield line, lambda: _stat_cpu_s(stat), proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def serve_fake_forever() -> None:
    """``--serve-fake``: print the URL, serve until SIGTERM."""
    _tests_importable()
    from tests.fakes.serve import serve_in_thread

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with serve_in_thread(fake_app()) as url:
        print(url, flush=True)
        stop.wait()


# --------------------------------------------------------------------------- /proc readings


def _stat_cpu_s(path: Path) -> float:
    """utime + stime of a /proc/<pid>[/task/<tid>]/stat file, in seconds."""
    fields = path.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _busy_ticks() -> int:
    """All CPUs' busy time (everything but idle and iowait), in clock ticks."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v) - v[3] - v[4]


def rss_kb(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


class CpuMeter:
    """CPU used by this process, by the fake, and by everything else, over one timed run."""

    def __init__(self, fake_cpu: Callable[[], float], fake_in_this_process: bool) -> None:
        self.fake_cpu = fake_cpu
        self.inside = fake_in_this_process

    def __enter__(self) -> CpuMeter:
        self.t0 = time.perf_counter()
        self.own0, self.fake0, self.busy0 = time.process_time(), self.fake_cpu(), _busy_ticks()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.t0
        own = time.process_time() - self.own0
        self.fake = self.fake_cpu() - self.fake0
        self.own = own - self.fake if self.inside else own  # rollwire's part of this process
        busy = (_busy_ticks() - self.busy0) / TICK
        self.other = max(0.0, busy - own - (0.0 if self.inside else self.fake))

    def row(self, episodes: int) -> dict[str, float]:
        return {
            "wall_s": self.wall,
            "bench_cpu_ms_per_episode": 1e3 * self.own / episodes,
            "fake_cpu_ms_per_episode": 1e3 * self.fake / episodes,
            "bench_cores": self.own / self.wall,
            "fake_cores": self.fake / self.wall,
            "other_processes_cores": self.other / self.wall,
        }


# --------------------------------------------------------------------------- the two paths


def config_for(url: str, episodes: int, concurrency: int) -> CollectConfig:
    return CollectConfig(
        tasks=[TASK],
        episodes=episodes,
        llm=LLMSpec(url=url),
        limits=Limits(max_turns=MAX_TURNS),
        concurrency=concurrency,
    )


async def bare_run(config: CollectConfig, pool: EndpointPool) -> list[RolloutResult]:
    """What ``collect`` runs per episode (the same requests and seeds) with no store, record or
    progress: an ``attempt`` per episode, all started at once behind a capacity limiter."""
    p = await anyio.to_thread.run_sync(
        plan,
        RolloutRequest(
            task=TASK, llm=config.llm, limits=config.limits, seed=config.seed, include_tokens=True
        ),
    )
    limiter = anyio.CapacityLimiter(config.concurrency)
    out: list[RolloutResult] = []

    async def one(w: Any) -> None:
        async with limiter:
            request = RolloutRequest(
                task=w.task,
                llm=config.llm,
                sampling=config.sampling.model_copy(update={"seed": w.sampling_seed}),
                limits=config.limits,
                seed=w.seed,
                task_config=config.task_config,
                reward_key=config.reward_key,
                include_tokens=True,
            )
            episode_plan = dataclasses.replace(p, seed=w.seed, sampling_seed=w.sampling_seed)
            result, _ = await attempt(request, episode_plan, w.episode_id, pool)
        out.append(result)

    async with anyio.create_task_group() as tg:
        for w in work_list(config, set()):
            tg.start_soon(one, w)
    return out


async def collect_run(
    config: CollectConfig, out_dir: Path, pool: EndpointPool, on_progress: Any = None
) -> tuple[Any, float]:
    """One ``collect`` into a fresh directory; (result, seconds from the first progress report
    to the last: the episodes only, without opening and closing the store)."""
    marks: list[float] = []

    async def progress(p: CollectProgress) -> None:
        if p.done in (0, p.total):
            marks.append(time.perf_counter())
        if on_progress is not None:
            maybe = on_progress(p)
            if isinstance(maybe, Awaitable):
                await maybe

    result = await collect(config, out_dir, pool=pool, on_progress=progress)
    return result, marks[-1] - marks[0]


# --------------------------------------------------------------------------- 1. throughput


@contextlib.contextmanager
def timed_appends() -> Iterator[list[float]]:
    """Time the store's ``_append`` (one ``write`` + ``fsync``, called with the store's lock
    held) during a run: [seconds, calls]. Instrumentation only; the store is not changed."""
    spent = [0.0, 0.0]
    original = EpisodeStore._append

    def _append(self: EpisodeStore, name: str, line: bytes) -> None:
        t0 = time.perf_counter()
        try:
            original(self, name, line)
        finally:
            spent[0] += time.perf_counter() - t0
            spent[1] += 1

    EpisodeStore._append = _append  # type: ignore[method-assign]
    try:
        yield spent
    finally:
        EpisodeStore._append = original  # type: ignore[method-assign]


async def throughput(
    args: argparse.Namespace, url: str, pool: EndpointPool, meter: Callable[[], CpuMeter]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    n = args.episodes
    for conc in args.concurrency:
        cfg = config_for(url, n, conc)
        sides: dict[str, list[dict[str, Any]]] = {"bare": [], "collect": []}
        for rnd in range(args.rounds):
            order = ("bare", "collect") if rnd % 2 == 0 else ("collect", "bare")
            for side in order:
                gc.collect()
                if side == "bare":
                    with meter() as m:
                        results = await bare_run(cfg, pool)
                    row = m.row(n)
                    row["ok"] = sum(r.ok for r in results)
                    row["episodes_per_s"] = n / m.wall
                else:
                    out_dir = Path(tempfile.mkdtemp(prefix="c", dir=args.work_dir))
                    with timed_appends() as spent, meter() as m:
                        result, steady = await collect_run(cfg, out_dir, pool)
                    row = m.row(n)
                    row["append_ms_mean"] = 1e3 * spent[0] / max(1, spent[1])
                    row["store_busy_fraction"] = spent[0] / steady
                    lines = (out_dir / "episodes.jsonl").read_bytes().count(b"\n")
                    row.update(
                        ok=result.collected,
                        failed=result.failed,
                        lines_written=lines,
                        episodes_per_s=n / m.wall,
                        steady_s=steady,
                        steady_episodes_per_s=n / steady,
                        episodes_jsonl_bytes=(out_dir / "episodes.jsonl").stat().st_size,
                    )
                    shutil.rmtree(out_dir, ignore_errors=True)
                if row["ok"] != n:
                    print(f"  warning: {side} c={conc}: {row['ok']}/{n} ok", file=sys.stderr)
                sides[side].append(row)
        out[str(conc)] = summarise_conc(conc, n, sides)
        s = out[str(conc)]
        print(
            f"  [c={conc}] bare {s['bare_eps']:.0f} eps/s, collect {s['collect_eps']:.0f} eps/s, "
            f"+{s['added_ms_per_episode']:.2f} ms/episode",
            file=sys.stderr,
            flush=True,
        )
    return out


def summarise_conc(conc: int, n: int, sides: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    med = statistics.median
    bare_s = med(r["wall_s"] for r in sides["bare"])
    coll_s = med(r["wall_s"] for r in sides["collect"])
    per_round = [
        round(1e3 * (c["wall_s"] - b["wall_s"]) / n, 3)
        for b, c in zip(sides["bare"], sides["collect"], strict=True)
    ]
    return {
        "concurrency": conc,
        "episodes": n,
        "rounds": sides,
        "bare_eps": n / bare_s,
        "collect_eps": n / coll_s,
        "collect_steady_eps": n / med(r["steady_s"] for r in sides["collect"]),
        "ratio_collect_over_bare": bare_s / coll_s,
        "added_ms_per_episode": 1e3 * (coll_s - bare_s) / n,
        "added_ms_per_episode_rounds": per_round,
        "bare_cpu_ms_per_episode": med(r["bench_cpu_ms_per_episode"] for r in sides["bare"]),
        "collect_cpu_ms_per_episode": med(r["bench_cpu_ms_per_episode"] for r in sides["collect"]),
        "added_cpu_ms_per_episode": med(r["bench_cpu_ms_per_episode"] for r in sides["collect"])
        - med(r["bench_cpu_ms_per_episode"] for r in sides["bare"]),
        "fake_cpu_ms_per_episode": med(
            r["fake_cpu_ms_per_episode"] for side in sides.values() for r in side
        ),
        "bench_cores": med(r["bench_cores"] for side in sides.values() for r in side),
        "fake_cores": med(r["fake_cores"] for side in sides.values() for r in side),
        "other_processes_cores": med(
            r["other_processes_cores"] for side in sides.values() for r in side
        ),
        "append_ms_mean": med(r["append_ms_mean"] for r in sides["collect"]),
        "store_busy_fraction": med(r["store_busy_fraction"] for r in sides["collect"]),
        "ok": [r["ok"] for side in sides.values() for r in side],
    }


async def store_parts(args: argparse.Namespace, url: str, pool: EndpointPool) -> dict[str, Any]:
    """The store's per-episode parts, serially, on real results: record, line, write + fsync."""
    cfg = config_for(url, args.store_records, 16)
    results = await bare_run(cfg, pool)
    works = {w.episode_id: w for w in work_list(cfg, set())}
    build, line, write, append = [], [], [], []
    out_dir = Path(tempfile.mkdtemp(prefix="s", dir=args.work_dir))
    records = []
    for r in results:
        w = works[r.rollout_id]
        t0 = time.perf_counter()
        rec = EpisodeRecord.from_result(
            r,
            task=w.task,
            sample_index=w.sample_index,
            seed=w.seed,
            group_id=w.group_id,
            model="smol",
        )
        t1 = time.perf_counter()
        rec.to_line()
        t2 = time.perf_counter()
        build.append(t1 - t0)
        line.append(t2 - t1)
        records.append(rec)
    half = len(records) // 2
    raw: list[float] = []
    (out_dir / "sync").mkdir()
    fd = os.open(out_dir / "sync" / "raw.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        with EpisodeStore(out_dir / "sync", config={"bench": 1}) as store:
            for rec in records[:half]:
                data = rec.to_line()
                t0 = time.perf_counter()  # the disk alone: the same line, write + fsync
                os.write(fd, data)
                os.fsync(fd)
                t1 = time.perf_counter()
                store.write_episode(rec)
                raw.append(t1 - t0)
                write.append(time.perf_counter() - t1)
    finally:
        os.close(fd)
    async with await EpisodeStore.aopen(out_dir / "async", config={"bench": 1}) as store:
        for rec in records[half:]:
            t0 = time.perf_counter()
            await store.append_episode(rec)
            append.append(time.perf_counter() - t0)
    fs = _filesystem(out_dir)
    shutil.rmtree(out_dir, ignore_errors=True)

    def ms(xs: list[float]) -> dict[str, float]:
        xs = sorted(xs)
        return {
            "median_ms": 1e3 * statistics.median(xs),
            "p90_ms": 1e3 * xs[int(0.9 * (len(xs) - 1))],
            "n": len(xs),
        }

    write_ms = ms(write)
    return {
        "filesystem": fs,
        "record_bytes_median": statistics.median(len(r.to_line()) for r in records),
        "from_result": ms(build),
        "to_line": ms(line),
        "write_episode": write_ms,
        "raw_write_fsync": ms(raw),
        "append_episode": ms(append),
        # write + fsync run under the store's lock: one at a time, whatever the concurrency
        "store_ceiling_episodes_per_s": 1e3 / write_ms["median_ms"],
    }


def _filesystem(path: Path) -> str:
    """The type and device of the mount holding ``path``."""
    best = ("", "?", "?")
    with open("/proc/mounts") as f:
        for line in f:
            dev, mnt, kind = line.split()[:3]
            if str(path).startswith(mnt) and len(mnt) > len(best[0]):
                best = (mnt, kind, dev)
    return f"{best[1]} on {best[2]} (mounted at {best[0]})"


# --------------------------------------------------------------------------- 2. memory


def expected_id_bytes(n: int) -> dict[str, float]:
    """What ``n`` written ids cost by design, built the way ``collect`` builds them and measured
    with tracemalloc: the collector's list of written ids (returned in its result; it appends
    the work item's id string, which exists from the start, so 8 bytes a slot) and the store's
    set of done ids for resume (a fresh 24-hex-digit string each: the record recomputes the id)."""
    work_ids = [episode_id(TASK, i, 10**9 + i) for i in range(n)]  # the work list's, up front
    was = tracemalloc.is_tracing()
    if not was:
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    written: list[str] = []
    for eid in work_ids:
        written.append(eid)
    mid = tracemalloc.get_traced_memory()[0]
    done: set[str] = set()
    for i in range(n):
        done.add(episode_id(TASK, i, 10**9 + i))
    after = tracemalloc.get_traced_memory()[0]
    if not was:
        tracemalloc.stop()
    del work_ids, written, done
    return {
        "list_of_ids_bytes_per_episode": (mid - before) / n,
        "set_of_ids_bytes_per_episode": (after - mid) / n,
        "total_bytes_per_episode": (after - before) / n,
    }


def _slope_kb_per_1000(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of (episodes, KB), in KB per 1000 episodes."""
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return 1e3 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def _type_counts() -> Counter[str]:
    gc.collect()
    return Counter(type(o).__qualname__ for o in gc.get_objects())


async def memory_run(
    args: argparse.Namespace, url: str, pool: EndpointPool, fake_pid: int | None, traced: bool
) -> dict[str, Any]:
    """One collection of ``args.memory_episodes`` with samples every 2.5% (``traced``: with
    tracemalloc snapshots at 10% and 100% instead of object-type counts)."""
    n = args.memory_episodes
    step = max(1, n // MEMORY_SAMPLES)
    tenth = max(1, n // 10)
    half = n // 2
    samples: list[dict[str, Any]] = []
    marks: dict[str, Any] = {}

    def sample(p: CollectProgress) -> None:
        d = p.done
        if d not in (0, 1, tenth, half) and d % step:
            return
        row: dict[str, Any] = {"done": d, "t_s": time.perf_counter(), "rss_kb": rss_kb()}
        if traced:
            row["traced_kb"] = tracemalloc.get_traced_memory()[0] / 1024
        else:
            row["gc_objects"] = len(gc.get_objects())
        if fake_pid is not None:
            row["fake_rss_kb"] = rss_kb(fake_pid)
        samples.append(row)
        if d in (tenth, half, n):
            gc.collect()
            key = {tenth: "10%", half: "50%", n: "100%"}[d]
            if traced:
                marks[key] = tracemalloc.take_snapshot()
                row["traced_kb_after_gc"] = tracemalloc.get_traced_memory()[0] / 1024
            else:
                marks[key] = _type_counts()
            row["rss_kb_after_gc"] = rss_kb()

    cfg = config_for(url, n, MEMORY_CONCURRENCY)
    out_dir = Path(tempfile.mkdtemp(prefix="m", dir=args.work_dir))
    gc.collect()
    rss_before = rss_kb()
    if traced:
        tracemalloc.start(TRACE_FRAMES)
    try:
        t0 = time.perf_counter()
        result, steady = await collect_run(cfg, out_dir, pool, sample)
        wall = time.perf_counter() - t0
        held_ids = len(result.episode_ids)
        del result
        gc.collect()
        after: dict[str, Any] = {"rss_kb": rss_kb()}
        if traced:
            after["traced_kb"] = tracemalloc.get_traced_memory()[0] / 1024
        growth = _growth(marks, n, tenth, half, traced)
    finally:
        if traced:
            tracemalloc.stop()
        lines = (out_dir / "episodes.jsonl").read_bytes().count(b"\n")
        shutil.rmtree(out_dir, ignore_errors=True)
    for row in samples:
        row["t_s"] = round(row["t_s"] - samples[0]["t_s"], 3)
    by_done = {r["done"]: r for r in samples}
    late = [r for r in samples if r["done"] >= tenth]
    doc: dict[str, Any] = {
        "episodes": n,
        "concurrency": MEMORY_CONCURRENCY,
        "traced": traced,
        "episodes_written": lines,
        "ids_in_result": held_ids,
        "wall_s": wall,
        "episodes_per_s": n / steady,
        "rss_kb_before_collect": rss_before,
        "rss_kb_at_start": by_done[0]["rss_kb"],
        "rss_kb_after_spawning_all_tasks": by_done[1]["rss_kb"],
        "rss_kb_at_10pct": by_done[tenth]["rss_kb"],
        "rss_kb_at_100pct": by_done[n]["rss_kb"],
        "rss_slope_kb_per_1000_10_to_100pct": _slope_kb_per_1000(
            [(r["done"], r["rss_kb"]) for r in late]
        ),
        "after_return": after,
        "samples": samples,
        "growth": growth,
    }
    if traced:
        doc.update(
            traced_kb_at_start=by_done[0]["traced_kb"],
            traced_kb_after_spawning_all_tasks=by_done[1]["traced_kb"],
            traced_kb_at_10pct=by_done[tenth]["traced_kb_after_gc"],
            traced_kb_at_100pct=by_done[n]["traced_kb_after_gc"],
            traced_slope_kb_per_1000_10_to_100pct=_slope_kb_per_1000(
                [(r["done"], r["traced_kb"]) for r in late]
            ),
            pending_task_bytes=1024 * (by_done[1]["traced_kb"] - by_done[0]["traced_kb"]) / n,
        )
    else:
        doc["gc_objects_slope_per_1000_10_to_100pct"] = _slope_kb_per_1000(
            [(r["done"], r["gc_objects"]) for r in late]
        )
    if fake_pid is not None:
        doc["fake_rss_kb_at_10pct_100pct"] = [
            by_done[tenth]["fake_rss_kb"],
            by_done[n]["fake_rss_kb"],
        ]
    return doc


def _growth(marks: dict[str, Any], n: int, tenth: int, half: int, traced: bool) -> dict[str, Any]:
    """What grew between the 10% and 100% marks: by allocation site (traced) or object type.
    Each also in halves (10-50%, 50-100%): a leak grows in both, a filling cache mostly early."""
    span = n - tenth
    if not traced:
        diff = marks["100%"] - marks["10%"]
        first = marks["50%"] - marks["10%"]
        shrunk = marks["10%"] - marks["100%"]
        return {
            "object_types_grown": [
                {
                    "type": t,
                    "count": c,
                    "per_1000_episodes": 1e3 * c / span,
                    "count_10_to_50pct": first.get(t, 0),
                    "count_50_to_100pct": marks["100%"].get(t, 0) - marks["50%"].get(t, 0),
                }
                for t, c in diff.most_common(12)
            ],
            "object_types_shrunk": [{"type": t, "count": c} for t, c in shrunk.most_common(8)],
        }
    keep = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, __file__)]
    old = marks["10%"].filter_traces(keep)
    mid = marks["50%"].filter_traces(keep)
    new = marks["100%"].filter_traces(keep)
    stats = new.compare_to(old, "lineno")
    by_site_mid = {s.traceback[0]: s.size for s in mid.statistics("lineno")}
    by_site_old = {s.traceback[0]: s.size for s in old.statistics("lineno")}
    grown = sorted((s for s in stats if s.size_diff > 0), key=lambda s: -s.size_diff)
    shrunk = sorted((s for s in stats if s.size_diff < 0), key=lambda s: s.size_diff)

    def site(s: Any, with_stack: bool) -> dict[str, Any]:
        frame = s.traceback[0]
        row = {
            "site": f"{_short(frame.filename)}:{frame.lineno}",
            "code": linecache.getline(frame.filename, frame.lineno).strip()[:100],
            "size_diff_kb": s.size_diff / 1024,
            "count_diff": s.count_diff,
            "bytes_per_episode": s.size_diff / span,
            "bytes_per_episode_10_to_50pct": (by_site_mid.get(frame, 0) - by_site_old.get(frame, 0))
            / (half - tenth),
            "bytes_per_episode_50_to_100pct": (s.size - by_site_mid.get(frame, 0)) / (n - half),
        }
        if with_stack:  # the call path that grew most at this site (not the biggest one)
            here = [tracemalloc.Filter(True, frame.filename, frame.lineno)]
            paths = new.filter_traces(here).compare_to(old.filter_traces(here), "traceback")
            top = max(paths, key=lambda p: p.size_diff, default=None)
            if top is not None and top.size_diff > 0:
                row["stack"] = [f"{_short(f.filename)}:{f.lineno}" for f in top.traceback]
                row["stack_size_diff_kb"] = top.size_diff / 1024
        return row

    def grown_bytes(a: Any, b: Any) -> float:
        return sum(s.size_diff for s in b.compare_to(a, "lineno") if s.size_diff > 0)

    return {
        "grown_bytes_per_episode": sum(s.size_diff for s in grown) / span,
        "grown_bytes_per_episode_10_to_50pct": grown_bytes(old, mid) / (half - tenth),
        "grown_bytes_per_episode_50_to_100pct": grown_bytes(mid, new) / (n - half),
        "sites_grown": [site(s, i < 5) for i, s in enumerate(grown[:12])],
        "sites_shrunk": [site(s, False) for s in shrunk[:8]],
        "total_grown_kb": sum(s.size_diff for s in grown) / 1024,
        "total_shrunk_kb": sum(s.size_diff for s in shrunk) / 1024,
    }


def _short(filename: str) -> str:
    for marker in ("/site-packages/", "/src/", "/lib/python3"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


# --------------------------------------------------------------------------- the run


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    pin = (
        args.fake == "process"
        and not args.no_pin
        and shutil.which("taskset") is not None
        and {FAKE_CPU, BENCH_CPU} <= os.sched_getaffinity(0)
    )
    if pin:
        os.sched_setaffinity(0, {BENCH_CPU})
    load_start = os.getloadavg()[0]
    git_start = git_state()
    started = time.monotonic()
    args.work_dir = tempfile.mkdtemp(prefix="rollwire-collect-bench-")
    fake_pid: int | None = None
    try:
        with contextlib.ExitStack() as stack:
            if args.fake == "process":
                url, fake_cpu, fake_pid = stack.enter_context(fake_in_process(pin))
            else:
                url, fake_cpu = stack.enter_context(fake_in_thread())
            llm_url = url + "/v1"
            pool = EndpointPool()
            try:
                # Certify once, and warm up (imports, first connections) outside the timing.
                await pool.endpoint(llm_url, model=None, api_key=None)
                await collect(
                    config_for(llm_url, 20, 4),
                    Path(tempfile.mkdtemp(prefix="w", dir=args.work_dir)),
                    pool=pool,
                )
                await bare_run(config_for(llm_url, 20, 4), pool)
                _cache_source()

                def meter() -> CpuMeter:
                    return CpuMeter(fake_cpu, args.fake == "thread")

                results: dict[str, Any] = {}
                results["throughput"] = await throughput(args, llm_url, pool, meter)
                results["store_parts"] = await store_parts(args, llm_url, pool)
                print("  store parts measured", file=sys.stderr, flush=True)
                if args.memory_episodes:
                    expected = expected_id_bytes(args.memory_episodes)
                    memory = {"expected_ids": expected}
                    memory["rss"] = await memory_run(args, llm_url, pool, fake_pid, traced=False)
                    # The same again in this process (as a long-lived MCP server would): does
                    # anything accumulate across collections?
                    memory["rss_again"] = await memory_run(
                        args, llm_url, pool, fake_pid, traced=False
                    )
                    print(
                        f"  memory (RSS): {memory['rss']['rss_kb_at_10pct']} -> "
                        f"{memory['rss']['rss_kb_at_100pct']} KB",
                        file=sys.stderr,
                        flush=True,
                    )
                    if args.trace_episodes:
                        targs = argparse.Namespace(**vars(args))
                        targs.memory_episodes = args.trace_episodes
                        memory["traced"] = await memory_run(
                            targs, llm_url, pool, fake_pid, traced=True
                        )
                        memory["expected_ids_traced_run"] = expected_id_bytes(args.trace_episodes)
                    results["memory"] = memory
            finally:
                await pool.aclose()
    finally:
        shutil.rmtree(args.work_dir, ignore_errors=True)
    return {
        "benchmark": "collect_throughput",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "python": platform.python_version(),
        },
        "git": git_start,
        "git_at_end": git_state(),
        "placement": {"fake": FAKE_CPU, "bench": BENCH_CPU} if pin else "unpinned",
        "params": {
            "task": TASK,
            "max_turns": MAX_TURNS,
            "fake": args.fake,
            "episodes": args.episodes,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "store_records": args.store_records,
            "memory_episodes": args.memory_episodes,
            "memory_concurrency": MEMORY_CONCURRENCY,
            "trace_episodes": args.trace_episodes,
            "trace_frames": TRACE_FRAMES,
            "quick": args.quick,
        },
        "results": results,
        "elapsed_s": round(time.monotonic() - started, 1),
        "loadavg_start_end": [load_start, os.getloadavg()[0]],
    }


def _cache_source() -> None:
    """Read the source of every loaded rollwire module now, so that the allocation sites in the
    report quote the code that ran even if someone edits src/ during the run."""
    for module in list(sys.modules.values()):
        filename = getattr(module, "__file__", None) or ""
        if "/rollwire/" in filename and filename.endswith(".py"):
            linecache.getlines(filename)


# --------------------------------------------------------------------------- report


def markdown(doc: dict[str, Any]) -> str:
    res = doc["results"]
    lines = [
        "| conc | episodes x rounds | bare eps/s (baseline) | collect eps/s | collect ÷ bare "
        "| added ms/episode (per round) | added CPU ms/episode | write+fsync ms (store busy) "
        "| bench / fake / other cores |",
        "|---:|---|---:|---:|---:|---|---:|---|---|",
    ]
    for r in res["throughput"].values():
        rounds = len(r["rounds"]["bare"])
        per_round = ", ".join(f"{x:.2f}" for x in r["added_ms_per_episode_rounds"])
        lines.append(
            f"| {r['concurrency']} | {r['episodes']} x {rounds} | {r['bare_eps']:.1f} "
            f"| {r['collect_eps']:.1f} | {r['ratio_collect_over_bare']:.2f} "
            f"| {r['added_ms_per_episode']:.2f} ({per_round}) "
            f"| {r['added_cpu_ms_per_episode']:.2f} "
            f"| {r['append_ms_mean']:.2f} ({100 * r['store_busy_fraction']:.0f}%) "
            f"| {r['bench_cores']:.2f} / {r['fake_cores']:.2f} / {r['other_processes_cores']:.2f} |"
        )
    sp = res["store_parts"]
    lines += [
        "",
        f"Store parts, serial, {sp['write_episode']['n']} + {sp['append_episode']['n']} records "
        f"of ~{sp['record_bytes_median'] / 1024:.1f} KB on {sp['filesystem']}: "
        f"EpisodeRecord.from_result {sp['from_result']['median_ms']:.3f} ms, "
        f"to_line {sp['to_line']['median_ms']:.3f} ms, "
        f"write_episode (write + fsync) {sp['write_episode']['median_ms']:.2f} ms "
        f"(p90 {sp['write_episode']['p90_ms']:.2f}; the same line written and fsynced to a "
        f"plain file, interleaved: {sp['raw_write_fsync']['median_ms']:.2f} ms, p90 "
        f"{sp['raw_write_fsync']['p90_ms']:.2f}), append_episode (worker thread) "
        f"{sp['append_episode']['median_ms']:.2f} ms (p90 {sp['append_episode']['p90_ms']:.2f}). "
        f"Writes are serialised by the store's lock: ceiling ~"
        f"{sp['store_ceiling_episodes_per_s']:.0f} episodes/s.",
    ]
    mem = res.get("memory")
    if mem:
        rss, exp = mem["rss"], mem["expected_ids"]
        lines += [
            "",
            "| run | episodes | eps/s | RSS KB: start / all tasks spawned / 10% / 100% "
            "| RSS slope KB per 1000 (10-100%) | heap KB: start / spawned / 10% / 100% "
            "| heap growth B/episode (10-50% / 50-100%) | expected B/episode (ids) |",
            "|---|---:|---:|---|---:|---|---|---:|",
        ]
        runs = [("RSS", rss, exp), ("RSS, again", mem["rss_again"], exp)]
        if "traced" in mem:
            runs.append(("tracemalloc", mem["traced"], mem["expected_ids_traced_run"]))
        for name, r, e in runs:
            heap = growth = "-"
            if r["traced"]:
                heap = (
                    f"{r['traced_kb_at_start']:.0f} / {r['traced_kb_after_spawning_all_tasks']:.0f}"
                    f" / {r['traced_kb_at_10pct']:.0f} / {r['traced_kb_at_100pct']:.0f}"
                )
                g = r["growth"]
                growth = (
                    f"{g['grown_bytes_per_episode']:.0f} "
                    f"({g['grown_bytes_per_episode_10_to_50pct']:.0f} / "
                    f"{g['grown_bytes_per_episode_50_to_100pct']:.0f})"
                )
            lines.append(
                f"| {name} | {r['episodes']} | {r['episodes_per_s']:.0f} "
                f"| {r['rss_kb_at_start']} / {r['rss_kb_after_spawning_all_tasks']} "
                f"/ {r['rss_kb_at_10pct']} / {r['rss_kb_at_100pct']} "
                f"| {r['rss_slope_kb_per_1000_10_to_100pct']:.1f} | {heap} | {growth} "
                f"| {e['total_bytes_per_episode']:.0f} |"
            )
        grown = rss["growth"]["object_types_grown"][:6]
        again = mem["rss_again"]
        lines += [
            "",
            f"RSS before the first collection {rss['rss_kb_before_collect']} KB, after it "
            f"returned {rss['after_return']['rss_kb']} KB; after the second "
            f"{again['after_return']['rss_kb']} KB.",
            "Object types grown 10% -> 100% (RSS run): "
            + ", ".join(f"{g['type']} +{g['count']}" for g in grown),
        ]
        if "traced" in mem:
            t = mem["traced"]
            lines += [
                f"Pending tasks (all spawned at start): {t['pending_task_bytes']:.0f} B each.",
                "",
                "| allocation site (grown 10% -> 100%) | KB | blocks | B/episode "
                "| B/episode 10-50% / 50-100% | code |",
                "|---|---:|---:|---:|---|---|",
            ]
            for s in t["growth"]["sites_grown"][:8]:
                lines.append(
                    f"| {s['site']} | {s['size_diff_kb']:.1f} | {s['count_diff']} "
                    f"| {s['bytes_per_episode']:.1f} | {s['bytes_per_episode_10_to_50pct']:.1f} / "
                    f"{s['bytes_per_episode_50_to_100pct']:.1f} | `{s['code']}` |"
                )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer episodes (~1 min)")
    p.add_argument("--episodes", type=int, default=200, help="episodes per timed run")
    p.add_argument("--concurrency", default="1,16,64", help="comma-separated (default 1,16,64)")
    p.add_argument("--rounds", type=int, default=3, help="alternating bare/collect rounds")
    p.add_argument("--store-records", type=int, default=200, help="records for the store parts")
    p.add_argument(
        "--memory-episodes", type=int, default=10_000, help="episodes of the memory run (0: skip)"
    )
    p.add_argument(
        "--trace-episodes",
        type=int,
        default=None,
        help="episodes of the tracemalloc run (default: as --memory-episodes; 0: skip)",
    )
    p.add_argument("--fake", choices=("process", "thread"), default="process")
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    p.add_argument("--json", default=None, help="output (default bench/results/...)")
    p.add_argument("--serve-fake", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if args.quick:
        args.episodes, args.rounds, args.store_records = 60, 2, 60
        args.memory_episodes = min(args.memory_episodes, 2_000)
    if args.trace_episodes is None:
        args.trace_episodes = (
            min(args.memory_episodes, 1_000) if args.quick else args.memory_episodes
        )
    if min(args.episodes, args.rounds, args.store_records, *args.concurrency) < 1:
        p.error("--episodes, --rounds, --store-records and --concurrency must be positive")
    if args.memory_episodes and args.memory_episodes < 40:
        p.error("--memory-episodes: 0 or at least 40")
    if args.json is None:
        name = "collect_throughput_quick.json" if args.quick else "collect_throughput.json"
        args.json = str(RESULTS_DIR / name)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_fake:
        serve_fake_forever()
        return 0
    # reasoning_gym pulls in cellpylib, whose source trips SyntaxWarnings when compiled.
    warnings.filterwarnings("ignore", category=SyntaxWarning)
    doc = anyio.run(main_async, args)
    table = markdown(doc)
    doc["markdown"] = table
    print()
    print(table)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    print(f"\nwrote {out} ({doc['elapsed_s']:.0f} s; placement: {doc['placement']})")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
