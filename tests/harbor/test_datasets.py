"""Datasets resolved offline: stable ids, instructions, registry files, the cache, clear refusals."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from rollwire.harnesses.harbor.datasets import (
    DatasetError,
    clear_dataset_cache,
    resolve_dataset,
)
from tests.harbor.helpers import EXAMPLES, make_task

BUNDLED = [
    "count-errors",
    "fix-median",
    "inventory-steps",
    "organize-files",
    "sales-report",
    "token-relay",
]


def test_bundled_directory_resolves_to_its_tasks() -> None:
    dataset = resolve_dataset(EXAMPLES)
    assert dataset.name == "tasks"
    assert [t.name for t in dataset.tasks] == BUNDLED
    assert [t.id for t in dataset.tasks] == [f"tasks/{n}" for n in BUNDLED]
    entry = dataset.task("count-errors")
    assert entry.path == (EXAMPLES / "count-errors").resolve()
    assert "LOG_FILE" in entry.instruction
    assert entry.description.startswith("A shell one-liner")
    assert dataset.skipped == ()
    steps = dataset.task("inventory-steps")
    assert steps.n_steps == 2 and "names of the `.dat` files" in steps.instruction


def test_bundled_registry_names_the_dataset() -> None:
    dataset = resolve_dataset(EXAMPLES / "registry.json")
    assert (dataset.name, dataset.version) == ("rollwire-examples", "1.0")
    assert [t.id for t in dataset.tasks] == [f"rollwire-examples/{n}" for n in BUNDLED]
    assert dataset.task("rollwire-examples/fix-median").name == "fix-median"


def test_a_single_task_directory_is_a_dataset_of_one() -> None:
    dataset = resolve_dataset(EXAMPLES / "token-relay")
    assert [t.id for t in dataset.tasks] == ["tasks/token-relay"]


def test_registry_picks_a_dataset_by_name_and_version(tmp_path: Path) -> None:
    make_task(tmp_path / "tasks", "alpha")
    make_task(tmp_path / "tasks", "beta")
    registry = tmp_path / "registry.json"
    registry.write_text(
        json.dumps(
            [
                {"name": "demo", "version": "1", "description": "", "tasks": [
                    {"name": "alpha", "path": "tasks/alpha"}]},
                {"name": "demo", "version": "2", "description": "", "tasks": [
                    {"name": "alpha", "path": "tasks/alpha"},
                    {"name": "beta", "path": "tasks/beta"}]},
            ]
        )
    )  # fmt: skip
    assert [t.id for t in resolve_dataset(registry, dataset="demo@2").tasks] == [
        "demo/alpha",
        "demo/beta",
    ]
    with pytest.raises(DatasetError, match=r"several datasets \['demo@1', 'demo@2'\]"):
        resolve_dataset(registry)
    with pytest.raises(DatasetError, match="several versions"):
        resolve_dataset(registry, dataset="demo")
    with pytest.raises(DatasetError, match="no dataset 'other'"):
        resolve_dataset(registry, dataset="other")


def test_git_tasks_not_in_the_cache_are_skipped_with_the_reason(tmp_path: Path) -> None:
    make_task(tmp_path / "tasks", "local-one")
    registry = tmp_path / "registry.json"
    registry.write_text(
        json.dumps(
            [{"name": "mixed", "version": "1", "description": "", "tasks": [
                {"name": "local-one", "path": "tasks/local-one"},
                {"name": "remote", "git_url": "https://example.com/r.git", "path": "tasks/remote"},
            ]}]
        )
    )  # fmt: skip
    dataset = resolve_dataset(registry)
    assert [t.name for t in dataset.tasks] == ["local-one"]
    assert len(dataset.skipped) == 1 and "needs the network" in dataset.skipped[0]


@pytest.mark.parametrize("ref", ["terminal-bench@2.0", "laude-institute/terminal-bench"])
def test_hub_datasets_are_refused_as_needing_the_network(ref: str) -> None:
    with pytest.raises(DatasetError, match="needs the network"):
        resolve_dataset(ref)


def test_missing_path_and_invalid_tasks_are_named(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not found"):
        resolve_dataset(tmp_path / "nope")
    good = make_task(tmp_path / "ds", "good")
    broken = make_task(tmp_path / "ds", "broken")
    (broken / "instruction.md").unlink()
    dataset = resolve_dataset(good.parent)
    assert [t.name for t in dataset.tasks] == ["good"]
    assert dataset.skipped[0].startswith("broken: ") and "instruction.md" in dataset.skipped[0]


def test_task_names_filter_by_glob() -> None:
    dataset = resolve_dataset(EXAMPLES, task_names=["*-report", "fix-*"])  # globs, any order
    assert [t.name for t in dataset.tasks] == ["fix-median", "sales-report"]
    with pytest.raises(DatasetError, match="no task"):
        resolve_dataset(EXAMPLES, task_names=["zzz*"])


def test_resolved_datasets_are_cached_until_a_task_changes(tmp_path: Path) -> None:
    clear_dataset_cache()
    copy = tmp_path / "ds"
    shutil.copytree(EXAMPLES, copy)
    first = resolve_dataset(copy)
    assert resolve_dataset(copy) is first
    instruction = copy / "fix-median" / "instruction.md"
    instruction.write_text("Fix the median function.\n")
    stat = instruction.stat()
    os.utime(instruction, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    second = resolve_dataset(copy)
    assert second is not first
    assert second.task("fix-median").instruction == "Fix the median function.\n"
