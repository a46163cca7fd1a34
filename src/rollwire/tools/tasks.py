"""Task references and the task listing the MCP server offers.

One string names every runnable task:

- an env task: ``family:name``, e.g. ``reasoning_gym:chain_sum``, ``openspiel:tic_tac_toe``;
- a Harbor task: ``harbor:<dataset>#<task name>``, e.g. ``harbor:examples/tasks#count-errors``,
  where ``<dataset>`` is what :func:`resolve_dataset` accepts (a directory of task directories,
  one task directory, or a registry JSON file) and ``<task name>`` is the task's name in it.

``harbor`` is never an env family, so the two forms cannot collide. :func:`format_harbor_ref`
and :func:`parse_task_ref` are inverses: a reference from :func:`list_task_page` runs as is.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import anyio
from pydantic import BaseModel, Field

from rollwire.extras import install_hint
from rollwire.harnesses.envs.registry import ADAPTERS, TaskError, list_tasks, parse_task

HARBOR_PREFIX = "harbor:"


class TaskRefError(ValueError):
    """A task reference that names no runnable task; the message says why."""


@dataclass(frozen=True)
class EnvRef:
    """``family:name``."""

    family: str
    name: str

    def __str__(self) -> str:
        return f"{self.family}:{self.name}"


@dataclass(frozen=True)
class HarborRef:
    """``harbor:<dataset>#<task name>``."""

    dataset: str
    name: str

    def __str__(self) -> str:
        return format_harbor_ref(self.dataset, self.name)


def format_harbor_ref(dataset: str, name: str) -> str:
    """The reference of task ``name`` of the Harbor dataset at ``dataset``."""
    return f"{HARBOR_PREFIX}{dataset}#{name}"


def parse_task_ref(ref: str) -> EnvRef | HarborRef:
    """Parse a task reference (syntax checks only: it does not resolve the task)."""
    if ref.startswith(HARBOR_PREFIX):
        dataset, sep, name = ref[len(HARBOR_PREFIX) :].rpartition("#")
        if not sep or not dataset or not name:
            raise TaskRefError(
                f"Harbor task {ref!r} must look like 'harbor:<dataset>#<task name>', "
                "e.g. 'harbor:examples/tasks#count-errors'"
            )
        return HarborRef(dataset=dataset, name=name)
    try:
        family, name = parse_task(ref)
    except TaskError as exc:
        raise TaskRefError(
            f"{exc}; a Harbor task looks like 'harbor:<dataset>#<task name>'"
        ) from None
    if family not in ADAPTERS:
        raise TaskRefError(
            f"unknown env family {family!r} in {ref!r}; known: {sorted(ADAPTERS)}, or 'harbor:'"
        )
    return EnvRef(family=family, name=name)


class TaskItem(BaseModel):
    """One runnable task."""

    ref: str = Field(description="pass this string as run_rollout's `task`")
    kind: Literal["env", "harbor"]
    family: str = Field(description="env family, or 'harbor'")
    name: str
    description: str = ""


class TaskPage(BaseModel):
    """One page of tasks, after the query filter."""

    tasks: list[TaskItem]
    total: int = Field(description="tasks matching the query, over all pages")
    offset: int
    limit: int
    next_offset: int | None = Field(description="offset of the next page; null on the last page")
    unavailable: dict[str, str] = Field(
        default_factory=dict, description="env families that could not be listed here, and why"
    )
    skipped: list[str] = Field(
        default_factory=list, description="Harbor task dirs the dataset had to skip, and why"
    )


@functools.cache
def _env_listing(family: str | None) -> tuple[tuple[TaskItem, ...], tuple[tuple[str, str], ...]]:
    listing = list_tasks([family] if family else None)
    items = tuple(
        TaskItem(
            ref=t.task,
            kind="env",
            family=t.family,
            name=t.task.partition(":")[2],
            description=t.description,
        )
        for t in listing.tasks
    )
    return items, tuple(listing.unavailable.items())


def check_env_task(ref: EnvRef) -> None:
    """Raise :class:`TaskRefError` unless ``ref`` is a task its family lists (blocking: the
    first call per family imports it)."""
    items, unavailable = _env_listing(ref.family)
    if unavailable:
        raise TaskRefError(f"env family {ref.family!r} is not available here: {unavailable[0][1]}")
    if str(ref) not in {item.ref for item in items}:
        raise TaskRefError(
            f"unknown task {str(ref)!r}; list_tasks(source={ref.family!r}) lists the "
            f"{len(items)} tasks of {ref.family}"
        )


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0][:200] if lines else ""


def _harbor_listing(source: str) -> tuple[list[TaskItem], list[str]]:
    from rollwire.harnesses.harbor.datasets import resolve_dataset

    dataset = resolve_dataset(source)
    items = [
        TaskItem(
            ref=format_harbor_ref(source, t.name),
            kind="harbor",
            family="harbor",
            name=t.name,
            description=t.description or _first_line(t.instruction),
        )
        for t in dataset.tasks
    ]
    return items, list(dataset.skipped)


async def list_task_page(
    source: str | None = None, *, offset: int = 0, limit: int = 50, query: str | None = None
) -> TaskPage:
    """Tasks of ``source`` (None: every env family; an env family name; or a Harbor dataset).

    Raises :class:`TaskRefError` when ``source`` is neither a family nor a resolvable dataset.
    """
    unavailable: dict[str, str] = {}
    skipped: list[str] = []
    if source is None or source in ADAPTERS:
        items, missing = await anyio.to_thread.run_sync(_env_listing, source)
        tasks, unavailable = list(items), dict(missing)
    else:
        try:
            from rollwire.harnesses.harbor.datasets import DatasetError
        except ImportError as exc:  # the harbor extra is not installed
            raise TaskRefError(
                f"{source!r} is not an env family {sorted(ADAPTERS)}, and Harbor datasets need "
                f"Harbor, which is not installed here ({exc}); {install_hint('harbor')}"
            ) from None
        try:
            tasks, skipped = await anyio.to_thread.run_sync(_harbor_listing, source)
        except DatasetError as exc:
            raise TaskRefError(
                f"{exc} (source is an env family {sorted(ADAPTERS)} or a Harbor dataset path)"
            ) from None
    if query:
        needle = query.lower()
        tasks = [t for t in tasks if needle in t.ref.lower() or needle in t.description.lower()]
    page = tasks[offset : offset + limit]
    end = offset + len(page)
    return TaskPage(
        tasks=page,
        total=len(tasks),
        offset=offset,
        limit=limit,
        next_offset=end if end < len(tasks) else None,
        unavailable=unavailable,
        skipped=skipped,
    )
