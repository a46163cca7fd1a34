"""Rollouts in flight, for clients that cannot hold a call open (start / get / cancel / list).

Every rollout the server runs is a :class:`Job`: ``run_rollout`` runs its job in the calling
handler (an MCP cancel cancels it there); ``start_rollout`` runs it in the registry's task group,
which the server owns: leaving the registry cancels every running job and waits for each to
clean up (sandbox torn down, capture session closed). A cancelled job stores nothing.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Literal

import anyio
import anyio.abc
from pydantic import BaseModel, Field

from rollwire.tools.rollouts import RolloutSummary

Status = Literal["running", "done", "failed", "cancelled"]
Runner = Callable[["Job"], Awaitable[RolloutSummary]]


class JobProgress(BaseModel):
    """Where a rollout is: ``done`` of ``total`` phases, and what it is doing."""

    done: float = 0
    total: float | None = None
    message: str = "queued"


class RolloutStatus(BaseModel):
    """What get_rollout, cancel_rollout and list_rollouts report for one rollout."""

    rollout_id: str
    task: str
    status: Status = Field(
        description="running; done (result.ok true); failed (result.ok false, see result.error);"
        " cancelled (nothing stored)"
    )
    progress: JobProgress
    started_at: float = Field(description="unix time")
    elapsed_s: float
    result: RolloutSummary | None = Field(
        default=None, description="the run_rollout result, once done or failed"
    )


class Job:
    """One rollout: its progress, its cancel scope, and its outcome."""

    def __init__(self, rollout_id: str, task: str) -> None:
        self.rollout_id = rollout_id
        self.task = task
        self.status: Status = "running"
        self.progress = JobProgress()
        self.started_at = time.time()
        self._t0 = time.perf_counter()
        self._elapsed: float | None = None
        self.summary: RolloutSummary | None = None
        self.scope = anyio.CancelScope()
        self.finished = anyio.Event()

    def report(self, done: float, total: float | None, message: str) -> None:
        """Record progress (the runner calls this)."""
        self.progress = JobProgress(done=done, total=total, message=message)

    async def run(self, runner: Runner) -> RolloutSummary | None:
        """Run to the end, or until cancelled; the outcome is recorded either way."""
        try:
            with self.scope:
                self.summary = await runner(self)
                self.status = "done" if self.summary.ok else "failed"
            if self.summary is None:
                self.status = "cancelled"
                self.progress = self.progress.model_copy(update={"message": "cancelled"})
            return self.summary
        except Exception as exc:  # the runner turns failures into results; belt and braces
            self.status = "failed"
            self.progress = self.progress.model_copy(
                update={"message": f"failed: {type(exc).__name__}: {exc}"}
            )
            raise
        except BaseException:
            if self.summary is None:
                self.status = "cancelled"
                self.progress = self.progress.model_copy(update={"message": "cancelled"})
            raise
        finally:
            self._elapsed = time.perf_counter() - self._t0
            self.finished.set()

    def view(self, *, with_result: bool = True) -> RolloutStatus:
        """The job as a status report."""
        elapsed = self._elapsed if self._elapsed is not None else time.perf_counter() - self._t0
        return RolloutStatus(
            rollout_id=self.rollout_id,
            task=self.task,
            status=self.status,
            progress=self.progress,
            started_at=round(self.started_at, 3),
            elapsed_s=round(elapsed, 3),
            result=self.summary if with_result else None,
        )


class JobRegistry:
    """Every job of this process, newest last; finished ones past ``capacity`` are forgotten."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> JobRegistry:
        self._tg = await anyio.create_task_group().__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Cancel every background job and wait for each to clean up."""
        tg, self._tg = self._tg, None
        if tg is not None:
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)

    def add(self, job: Job) -> Job:
        """Register a job (it shows in list_rollouts from now on)."""
        self._jobs[job.rollout_id] = job
        self._forget_old()
        return job

    def start(self, job: Job, runner: Runner) -> None:
        """Run ``job`` in the background, owned by this registry."""
        if self._tg is None:
            raise RuntimeError("background rollouts need a running server (enter the registry)")
        self.add(job)
        self._tg.start_soon(self._background, job, runner)

    def spawn(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work`` in the background, owned by this registry (cancelled when it closes):
        for long work that is not a rollout (a background collection)."""
        if self._tg is None:
            raise RuntimeError("background work needs a running server (enter the registry)")
        self._tg.start_soon(work)

    async def _background(self, job: Job, runner: Runner) -> None:
        try:
            await job.run(runner)
        except anyio.get_cancelled_exc_class():
            if not job.scope.cancel_called:  # the registry is shutting down: let it go
                raise

    def get(self, rollout_id: str) -> Job | None:
        """The job with this id, or None."""
        return self._jobs.get(rollout_id)

    async def cancel(self, rollout_id: str, *, wait_s: float = 60.0) -> Job | None:
        """Cancel a running job and wait (up to ``wait_s``) until it has cleaned up."""
        job = self._jobs.get(rollout_id)
        if job is None:
            return None
        if job.status == "running":
            job.scope.cancel()
            with anyio.move_on_after(wait_s):
                await job.finished.wait()
        return job

    def jobs(self) -> list[Job]:
        """Every known job, oldest first."""
        return list(self._jobs.values())

    @property
    def running(self) -> int:
        """Jobs still running."""
        return sum(job.status == "running" for job in self._jobs.values())

    def _forget_old(self) -> None:
        excess = len(self._jobs) - self.capacity
        if excess <= 0:  # the common case: no scan of every kept job on every rollout
            return
        for rollout_id in [k for k, j in self._jobs.items() if j.status != "running"][:excess]:
            del self._jobs[rollout_id]
