"""Harbor datasets resolved offline: a directory of task directories, or a registry JSON file.

Each task gets a stable id ``<dataset>/<task name>`` (the task name is its directory name, or the
``name`` a registry gives it), its instruction and its path. A task directory that Harbor would
not accept is skipped and listed in ``Dataset.skipped`` with the reason, never dropped silently.
Resolved datasets are cached until a task's files change. ``name@version`` and ``org/name``
datasets live on Harbor's hub and need the network: they are refused with a clear error here.
"""

from __future__ import annotations

import fnmatch
import json
import threading
from collections.abc import Sequence
from pathlib import Path

from harbor.models.registry import DatasetSpec
from harbor.models.task.id import GitTaskId
from harbor.models.task.task import Task
from pydantic import BaseModel, ConfigDict, ValidationError


class DatasetError(ValueError):
    """A dataset reference that cannot be resolved offline; the message says why."""


class TaskEntry(BaseModel):
    """One task of a dataset: what a caller lists, picks and runs."""

    model_config = ConfigDict(frozen=True)

    id: str  # "<dataset>/<task name>", stable across runs and machines
    dataset: str
    name: str
    path: Path
    instruction: str  # for a multi-step task, the first step's
    description: str = ""
    n_steps: int = 0  # 0 for a single-step task


class Dataset(BaseModel):
    """A resolved dataset: its tasks in a stable order, and the task dirs it had to skip."""

    model_config = ConfigDict(frozen=True)

    name: str
    version: str | None = None
    source: str
    tasks: tuple[TaskEntry, ...]
    skipped: tuple[str, ...] = ()

    def task(self, ref: str) -> TaskEntry:
        """The task with this id or name; raises :class:`DatasetError` naming some that exist."""
        for entry in self.tasks:
            if ref in (entry.id, entry.name):
                return entry
        known = ", ".join(e.id for e in self.tasks[:5])
        raise DatasetError(f"no task {ref!r} in dataset {self.name!r} (it has e.g. {known})")


_CACHE: dict[tuple[str, str | None], tuple[tuple[object, ...], Dataset]] = {}
_CACHE_LOCK = threading.Lock()


def resolve_dataset(
    source: str | Path,
    *,
    dataset: str | None = None,
    task_names: Sequence[str] | None = None,
) -> Dataset:
    """Resolve a local dataset offline.

    ``source`` is a directory of task directories, a single task directory, or a registry JSON
    file (then ``dataset`` picks ``name`` or ``name@version`` when it holds more than one).
    ``task_names`` keeps only tasks whose name matches one of these glob patterns.
    """
    path = Path(source).expanduser()
    if not path.exists():
        text = str(source)
        if "@" in text or (text.count("/") == 1 and not text.startswith((".", "/", "~"))):
            raise DatasetError(
                f"{text!r} names a dataset on Harbor's registry, which needs the network to "
                "resolve; download it first (`harbor download`) and pass its directory, or pass "
                "a registry JSON file"
            )
        raise DatasetError(f"dataset {text!r} not found: expected a task directory or a .json")
    key = (str(path.resolve()), dataset)
    fingerprint = _fingerprint(path)
    with _CACHE_LOCK:
        cached = _CACHE.get(key)
    if cached is not None and cached[0] == fingerprint:
        resolved = cached[1]
    else:
        if path.is_file():
            resolved = _from_registry(path, dataset)
        elif dataset is not None:
            raise DatasetError(f"dataset={dataset!r} applies to a registry JSON file, not {path}")
        else:
            resolved = _from_directory(path)
        with _CACHE_LOCK:
            _CACHE[key] = (fingerprint, resolved)
    if not task_names:
        return resolved
    kept = tuple(t for t in resolved.tasks if any(fnmatch.fnmatch(t.name, p) for p in task_names))
    if not kept:
        names = ", ".join(t.name for t in resolved.tasks[:5])
        raise DatasetError(
            f"no task of {resolved.name!r} matches {list(task_names)} (e.g. {names})"
        )
    return resolved.model_copy(update={"tasks": kept})


def clear_dataset_cache() -> None:
    """Forget every resolved dataset."""
    with _CACHE_LOCK:
        _CACHE.clear()


def _from_directory(path: Path) -> Dataset:
    if (path / "task.toml").is_file():  # one task: its dataset is the directory above it
        dataset = path.resolve().parent.name
        entry, problem = _entry(path, dataset, path.resolve().name)
        if entry is None:
            raise DatasetError(f"{path} is not a valid Harbor task: {problem}")
        return Dataset(name=dataset, source=str(path), tasks=(entry,))
    dataset = path.resolve().name
    tasks: list[TaskEntry] = []
    skipped: list[str] = []
    for child in sorted(p for p in path.iterdir() if p.is_dir()):
        if not (child / "task.toml").is_file():
            continue
        entry, problem = _entry(child, dataset, child.name)
        if entry is None:
            skipped.append(f"{child.name}: {problem}")
        else:
            tasks.append(entry)
    if not tasks:
        detail = f"; skipped: {'; '.join(skipped)}" if skipped else ""
        raise DatasetError(f"{path} holds no valid Harbor task directories{detail}")
    return Dataset(name=dataset, source=str(path), tasks=tuple(tasks), skipped=tuple(skipped))


def _from_registry(path: Path, dataset: str | None) -> Dataset:
    try:
        rows = json.loads(path.read_text())
        specs = [DatasetSpec.model_validate(row) for row in rows]
    except (ValueError, TypeError, ValidationError) as exc:
        raise DatasetError(f"{path} is not a Harbor registry JSON file: {exc}") from exc
    spec = _pick_spec(specs, dataset, path)
    tasks: list[TaskEntry] = []
    skipped: list[str] = []
    for item in spec.tasks:
        if item.git_url is not None:
            local = GitTaskId(
                git_url=item.git_url, git_commit_id=item.git_commit_id, path=item.path
            ).get_local_path()
            if not local.is_dir():
                skipped.append(
                    f"{item.name}: lives in {item.git_url} and is not in Harbor's task cache; "
                    "fetching it needs the network"
                )
                continue
        else:
            # Relative task paths are read from the registry file's directory, not the cwd.
            local = item.path if item.path.is_absolute() else path.parent / item.path
        entry, problem = _entry(local, spec.name, item.name)
        if entry is None:
            skipped.append(f"{item.name}: {problem}")
        else:
            tasks.append(entry)
    if not tasks:
        raise DatasetError(
            f"dataset {spec.name}@{spec.version} in {path} has no task usable offline; "
            f"skipped: {'; '.join(skipped)}"
        )
    return Dataset(
        name=spec.name,
        version=spec.version,
        source=str(path),
        tasks=tuple(tasks),
        skipped=tuple(skipped),
    )


def registry_task_paths(path: Path) -> list[Path]:
    """The local task directories a registry JSON file names, over all its datasets (tasks
    fetched by git live in Harbor's own cache and are not listed). Raises DatasetError."""
    try:
        rows = json.loads(Path(path).read_text())
        specs = [DatasetSpec.model_validate(row) for row in rows]
    except (ValueError, TypeError, ValidationError) as exc:
        raise DatasetError(f"{path} is not a Harbor registry JSON file: {exc}") from exc
    return [
        item.path if item.path.is_absolute() else Path(path).parent / item.path
        for spec in specs
        for item in spec.tasks
        if item.git_url is None
    ]


def _pick_spec(specs: list[DatasetSpec], dataset: str | None, path: Path) -> DatasetSpec:
    available = [f"{s.name}@{s.version}" for s in specs]
    if dataset is None:
        if len(specs) == 1:
            return specs[0]
        raise DatasetError(
            f"{path} holds several datasets {available}: pass dataset=name[@version]"
        )
    name, _, version = dataset.partition("@")
    matches = [s for s in specs if s.name == name and (not version or s.version == version)]
    if not matches:
        raise DatasetError(f"no dataset {dataset!r} in {path}; it holds {available}")
    if len(matches) > 1:
        raise DatasetError(
            f"{path} holds several versions of {name!r} "
            f"{[s.version for s in matches]}: pass dataset={name}@<version>"
        )
    return matches[0]


def _entry(task_dir: Path, dataset: str, name: str) -> tuple[TaskEntry | None, str | None]:
    """The task's entry, or None and the reason Harbor would not take it."""
    if not task_dir.is_dir():
        return None, f"{task_dir} does not exist"
    try:
        task = Task(task_dir)
    except (OSError, ValueError, RuntimeError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    steps = task.config.steps or []
    instruction = task.step_instruction(steps[0].name) if steps else task.instruction
    description = task.config.task.description if task.config.task is not None else ""
    return (
        TaskEntry(
            id=f"{dataset}/{name}",
            dataset=dataset,
            name=name,
            path=task.paths.task_dir,
            instruction=instruction,
            description=description,
            n_steps=len(steps),
        ),
        None,
    )


def _fingerprint(path: Path) -> tuple[object, ...]:
    """Changes whenever a task is added, removed or has its config or instruction edited."""
    marks: list[object] = [path.stat().st_mtime_ns]
    if path.is_file():
        try:
            rows = json.loads(path.read_text())
            dirs = [
                path.parent / task["path"]
                for row in rows
                for task in row.get("tasks", [])
                if not task.get("git_url")
            ]
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            dirs = []
    elif (path / "task.toml").is_file():
        dirs = [path]
    else:
        dirs = sorted(path.iterdir())
    for task_dir in dirs:
        for name in ("task.toml", "instruction.md"):
            try:
                marks.append((str(task_dir), name, (task_dir / name).stat().st_mtime_ns))
            except OSError:
                continue
    return tuple(marks)
