"""A disk that fills up or turns read-only mid-write: every writer of rollwire's outputs says so
in one line naming the file and the cause, exits non-zero, leaves no partial file a reader would
take for whole, keeps what it committed readable, and once the disk is writable again the same
command finishes the job exactly.

The disks are real file systems the tests mount: a size-limited tmpfs (a real ENOSPC) and the
fault file system of ``tests/fakes/faultfs.py`` (FUSE), which can also turn read-only while files
are open for writing, as a failing disk does and a tmpfs cannot. The image build runs the real
debootstrap against the Debian mirror apt uses (CI's own base image is built the same way).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pyarrow.parquet as pq
import pytest
from mcp import Client

from rollwire.collect.collection import CollectConfig, collect, work_list
from rollwire.datasets.export import export_collection, iter_episodes
from rollwire.datasets.sft import export_sft
from rollwire.datasets.store import read_manifest
from rollwire.harnesses.harbor.images import ImageError, build_base
from rollwire.server.mcp_app import ServerState, build_server
from rollwire.tools.rollouts import Limits, LLMSpec
from rollwire.writes import WriteFailed
from tests.fakes.faultfs import FaultFS, fault_fs
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM

ROOT = Path(__file__).resolve().parents[2]
TASKS = ["reasoning_gym:chain_sum", "reasoning_gym:basic_arithmetic"]
N = 24
CAUSES = {"fill": "No space left on device (ENOSPC)", "read_only": "Read-only file system (EROFS)"}
#: what a collection directory holds: nothing else (no temporary file) after a fault
STORE_FILES = {".lock", "episodes.jsonl", "failures.jsonl", "filtered.jsonl", "manifest.json"}


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    with serve_in_thread(FakeVLLM(tool_call_every_turn=True).app) as url:
        yield url + "/v1"


@pytest.fixture
def disk(tmp_path) -> Iterator[FaultFS]:
    with fault_fs(tmp_path / "disk") as fs:
        yield fs


def rollwire(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollwire", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def collect_cmd(url: str, out: Path) -> list[str]:
    tasks = [a for t in TASKS for a in ("--task", t)]
    sizes = ["-n", str(N), "--group-size", "2", "--concurrency", "4", "--max-turns", "2"]
    return ["collect", "--llm-url", url, *tasks, *sizes, "--out", str(out), "--no-progress"]


def last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


def committed_ids(out: Path) -> list[str]:
    """The ids of the committed (newline-terminated) lines of episodes.jsonl: each parses, and
    each id is there once. A last line without its newline is a write the disk stopped and the
    store could not undo (a read-only disk refuses the truncation too): no reader takes it."""
    data = (out / "episodes.jsonl").read_bytes()
    ids = [json.loads(line)["episode_id"] for line in data.split(b"\n")[:-1]]
    assert len(ids) == len(set(ids))
    return ids


def torn_tail(out: Path) -> bool:
    data = (out / "episodes.jsonl").read_bytes()
    return bool(data) and not data.endswith(b"\n")


def planned_ids() -> set[str]:
    cfg = CollectConfig(tasks=TASKS, episodes=N, group_size=2)
    return {w.episode_id for w in work_list(cfg, set())}


@pytest.mark.parametrize("fault", ["fill", "read_only"])
def test_a_collection_whose_disk_fails_mid_write_stops_naming_the_file_and_resumes_exactly(
    fault, engine, disk
):
    out = disk.path / "c"
    getattr(disk, fault)(after_bytes=30_000)  # a few episodes fit, then the disk fails

    first = rollwire(*collect_cmd(engine, out))

    assert first.returncode == 1, first.stderr
    line = last_line(first.stderr)
    assert line.startswith(f"rollwire collect: cannot write {out}/"), line
    assert CAUSES[fault] in line and "run the same collection again" in line, line
    assert "Traceback" not in first.stderr and "WARNING" not in first.stderr  # one line, once
    kept = committed_ids(out)
    assert 0 < len(kept) < N
    assert {p.name for p in out.iterdir()} == STORE_FILES  # no temporary file left behind
    assert [r.episode_id for r in iter_episodes(out)] == kept  # readable while still failing
    torn = torn_tail(out)
    assert fault == "read_only" or not torn  # a full disk still truncates a partial line away

    disk.heal()
    again = rollwire(*collect_cmd(engine, out), "--json")

    assert again.returncode == 0, again.stderr
    assert ("was cut short" in again.stderr) == torn  # the resume repairs it, and says so
    result = json.loads(again.stdout)
    assert result["skipped_done"] == len(kept) and result["collected"] == N - len(kept)
    ids = committed_ids(out)
    assert ids[: len(kept)] == kept and set(ids) == planned_ids()
    assert read_manifest(out).counts.collected == N


@pytest.fixture
async def tmpfs(tmp_path) -> AsyncIterator[Path]:
    mnt = tmp_path / "small"
    mnt.mkdir()
    await anyio.run_process(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)])
    try:
        yield mnt
    finally:
        await anyio.run_process(["umount", "-l", str(mnt)])


@pytest.mark.anyio
async def test_collect_episodes_on_a_full_disk_is_a_tool_error_naming_the_file_and_the_same_call_resumes(
    engine, tmpfs
):
    args = {
        "out_dir": "c",
        "episodes": N,
        "group_size": 2,
        "tasks": TASKS,
        "llm": engine,
        "limits": {"max_turns": 2},
        "concurrency": 4,
    }
    async with ServerState(data_dir=tmpfs) as state, Client(build_server(state)) as mcp:
        full = await mcp.call_tool("collect_episodes", args)

        assert full.is_error
        text = full.content[0].text
        assert f"cannot write {tmpfs / 'c'}/" in text and CAUSES["fill"] in text, text
        kept = committed_ids(tmpfs / "c")
        assert 0 < len(kept) < N

        await anyio.run_process(["mount", "-o", "remount,size=4m", str(tmpfs)])  # space freed
        done = await mcp.call_tool("collect_episodes", args)

    result = done.structured_content
    assert result["skipped_done"] == len(kept) and result["collected"] == N - len(kept)
    assert set(committed_ids(tmpfs / "c")) == planned_ids()


@pytest.fixture(scope="module")
def collection(engine, tmp_path_factory) -> Path:
    """A small finished collection on a healthy disk: what the exports read."""
    out = tmp_path_factory.mktemp("collection") / "c"
    cfg = CollectConfig(
        tasks=TASKS, episodes=12, group_size=2, llm=LLMSpec(url=engine), limits=Limits(max_turns=2)
    )
    result = anyio.run(collect, cfg, out)
    assert result.collected == 12
    return out


def _export(fmt: str, src: Path, dest: Path) -> list[str]:
    """Export ``src`` to ``dest`` in ``fmt``; the names of the files a reader loads."""
    if fmt == "sft":
        return export_sft(src, dest).files
    result = export_collection(src, dest, parquet=fmt == "parquet", jsonl=fmt == "jsonl")
    return result.parquet_files + ([result.jsonl_file] if result.jsonl_file else [])


@pytest.mark.parametrize("fault", ["fill", "read_only"])
@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "sft"])
def test_an_export_whose_disk_fails_leaves_the_earlier_export_whole_and_reruns(
    fmt, fault, collection, disk
):
    dest = disk.path / "export"
    earlier = {name: (dest / name).read_bytes() for name in _export(fmt, collection, dest)}
    getattr(disk, fault)(after_bytes=2_000)

    with pytest.raises(WriteFailed) as failed:
        _export(fmt, collection, dest)

    assert str(failed.value).startswith(f"cannot write {dest}: {CAUSES[fault]}"), failed.value
    loadable = {p.name: p.read_bytes() for p in dest.iterdir() if not p.name.startswith(".")}
    assert loadable == earlier  # what a reader globs is the earlier export, byte for byte

    disk.heal()
    files = _export(fmt, collection, dest)

    assert not [p for p in dest.parent.rglob(".*") if p.name.startswith((".export-", ".sft-"))]
    if fmt == "parquet":
        assert sum(pq.read_table(dest / f).num_rows for f in files) == 12
    elif fmt == "jsonl":
        assert len((dest / files[0]).read_text().splitlines()) == 12


def test_the_export_command_on_a_full_disk_says_so_in_one_line(collection, disk):
    dest = disk.path / "export"
    disk.fill()

    done = rollwire("export", str(collection), "--format", "parquet", "--out", str(dest))

    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"rollwire export: cannot write {dest}: {CAUSES['fill']}; free space on that file system"
    )


def test_a_rollout_document_on_a_full_disk_is_named_and_never_half_written(engine, disk):
    docs = disk.path / "docs"
    docs.mkdir()
    disk.fill()

    done = rollwire(
        "rollout", "--llm-url", engine, "--task", TASKS[0], "--max-turns", "2", "--out", str(docs)
    )

    assert done.returncode == 1, done.stderr
    line = last_line(done.stderr)
    assert line.startswith(f"rollwire rollout: cannot write {docs}/"), line
    assert line.split(":")[1].strip().endswith(".json") and CAUSES["fill"] in line, line
    assert list(docs.iterdir()) == []  # neither a partial document nor its temporary file

    disk.heal()
    again = rollwire(
        "rollout", "--llm-url", engine, "--task", TASKS[0], "--max-turns", "2", "--out", str(docs)
    )

    assert again.returncode == 0, again.stderr
    [document] = docs.iterdir()
    assert json.loads(document.read_text())["turns"]  # whole


@pytest.mark.parametrize("fault", ["fill", "read_only"])
def test_an_image_build_whose_disk_fails_names_the_disk_and_imports_nothing(fault, disk):
    getattr(disk, fault)(after_bytes=2_000_000)  # the Release files fit, the package lists not

    with pytest.raises(ImageError) as failed:  # debootstrap itself says "Couldn't download"
        build_base("debian:bookworm-slim", client=None, workdir=disk.path)

    message = str(failed.value)
    assert message.startswith(
        f"cannot build debian:bookworm-slim: cannot write {disk.path}/rollwire-image-"
    ), message
    assert CAUSES[fault] in message and "nothing was imported" in message, message
    if fault == "fill":
        assert list(disk.path.iterdir()) == []  # its work folder is removed


def test_a_store_that_could_not_undo_a_failed_write_still_releases_its_folder(engine, disk):
    """Found by the chaos run: a read-only disk refuses the truncation of a failed line too; the
    store then refuses further writes, but it must still let go of its folder (its lock), or
    the same server's next call is refused until the server restarts."""
    out = disk.path / "c"
    cfg = CollectConfig(
        tasks=TASKS, episodes=N, group_size=2, llm=LLMSpec(url=engine), limits=Limits(max_turns=2)
    )
    disk.read_only(after_bytes=30_000)
    with pytest.raises(WriteFailed, match=r"\(EROFS\)"):  # its truncation refused as well
        anyio.run(collect, cfg, out)

    disk.heal()
    result = anyio.run(collect, cfg, out)  # the same process opens the folder again

    assert result.skipped_done + result.collected == N
    assert set(committed_ids(out)) == planned_ids()
