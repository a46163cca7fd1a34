"""TRL integration: a ``rollout_func`` for ``GRPOTrainer`` backed by a rollwire MCP server.

This module imports neither torch nor trl: it runs in a trainer's process and talks to a
rollwire server over streamable HTTP, with one long-lived MCP session held by a background
thread (its own event loop, so it also works when the caller runs one, e.g. in a notebook).

TRL calls ``rollout_func(prompts, trainer)`` with one entry per generation (each prompt repeated
``num_generations`` times, consecutively) and needs ``prompt_ids``, ``completion_ids`` and
``logprobs`` per entry; it reads ``env_mask`` and forwards every other key to the reward
functions. Each prompt here is a task reference (``task_dataset`` makes them); each entry
becomes one ``run_rollout`` on the server, and its training sequence becomes the row:

- **Which sequence.** A rollout's training data is its trainable *agent* sequences (auxiliary
  calls, discarded branches and untrusted turns are never chosen). When there are several (the
  engine re-tokenised a reply, so the conversation split into fragments), the row is the one
  with the most trainable tokens, ties going to the later one; ``sequences_total`` says how many
  there were, so fragmentation is visible in the trainer's logs.
- **prompt_ids** are the sequence's first turn's prompt; **completion_ids** everything after it:
  the sampled tokens of every turn and, between them, tool results and template tokens.
- **env_mask** is the sequence's loss mask over the completion: 1 on sampled tokens whose
  logprobs are trustworthy, 0 on tool/environment/template tokens and on anything the capture
  did not certify. **logprobs** are aligned with completion_ids, 0.0 where env_mask is 0.
- **reward** (None when the verifier never ran), **rewards**, **ok**, **rollout_id**,
  **sequences_total**, **seed** and **error** go to the reward functions. A failed rollout is a
  well-formed row with an all-zero env_mask and reward None: never an exception, never a hang.
- **Groups.** ``group_size`` consecutive entries (set it to ``num_generations``) share one task
  seed, so a GRPO group compares samples of the same task instance; each sample gets its own
  sampling seed.

Layer: a client beside ``collect`` and ``engine`` (neither imports the other). It imports only
``tools.tasks``, on use, to list tasks in-process when no server URL is given; a forbidden
contract keeps torch, trl and transformers out of it.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread

log = logging.getLogger("rollwire.trl")

REQUIRED_KEYS = ("prompt_ids", "completion_ids", "logprobs")
EXTRA_KEYS = ("env_mask", "reward", "rewards", "ok", "rollout_id", "sequences_total", "seed")


def choose_sequence(sequences: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The training sequence of a rollout: its trainable agent sequence with the most trainable
    tokens (ties: the later one), or None when it has none."""
    best: dict[str, Any] | None = None
    best_n = -1
    for seq in sequences:
        if seq.get("role") != "agent" or not seq.get("trainable"):
            continue
        n = sum(seq["loss_mask"])
        if n >= best_n:
            best, best_n = seq, n
    return best


def row_of(result: dict[str, Any] | None, *, error: str | None = None, pad_id: int = 0) -> dict:
    """One TRL row from a ``run_rollout`` result (``include_tokens``). A failed rollout, or one
    with no trainable agent sequence (e.g. a text-tier engine), gives a row that trains nothing:
    env_mask all 0 and reward None (``rewards`` still carries what the verifier said)."""
    sequences = (result or {}).get("sequences") or []
    ok = bool(result and result.get("ok"))
    chosen = choose_sequence(sequences) if ok else None
    base = {
        # A row that trains nothing must not move its group's baseline either: reward None.
        "reward": (result or {}).get("reward") if chosen is not None else None,
        "rewards": (result or {}).get("rewards") or {},
        "ok": ok,
        "rollout_id": (result or {}).get("rollout_id"),
        "sequences_total": sum(1 for s in sequences if s.get("role") == "agent"),
        "seed": (result or {}).get("seed"),
        "error": error or (result or {}).get("error"),
    }
    if chosen is None:
        if base["error"] is None:
            base["error"] = "no trainable agent sequence"
        # Shape-only filler: one prompt token, one masked completion token (no gradient).
        return {
            "prompt_ids": [pad_id],
            "completion_ids": [pad_id],
            "logprobs": [0.0],
            "env_mask": [0],
            **base,
        }
    ids, mask, logprobs = chosen["input_ids"], chosen["loss_mask"], chosen["logprobs"]
    cut = chosen["prompt_len"]
    env_mask = [int(m) for m in mask[cut:]]
    return {
        "prompt_ids": list(ids[:cut]),
        "completion_ids": list(ids[cut:]),
        "logprobs": [
            float(lp) if m else 0.0 for lp, m in zip(logprobs[cut:], env_mask, strict=True)
        ],
        "env_mask": env_mask,
        **base,
    }


def _sampling_seed(task_seed: int, index: int, call: int) -> int:
    digest = hashlib.sha256(f"{task_seed}:{call}:{index}".encode()).hexdigest()
    return int(digest[:8], 16)


class RolloutClient(AbstractContextManager["RolloutClient"]):
    """A long-lived MCP session to a rollwire server, usable from synchronous code.

    A background thread owns the event loop and the session; :meth:`run_batch` blocks the
    calling thread only. Close it (or use ``with``) to end the session.
    """

    def __init__(
        self,
        server_url: str,
        *,
        headers: dict[str, str] | None = None,
        timeout: float = 3600.0,
        concurrency: int = 8,
        pad_token_id: int = 0,
    ) -> None:
        self.server_url = server_url
        self.pad_token_id = pad_token_id
        self.headers = dict(headers or {})
        self.timeout = timeout
        self.concurrency = concurrency
        self._portal_cm = anyio.from_thread.start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        self._closed = False
        self._client: Any = None
        self._stop: anyio.Event | None = None
        try:
            # One task owns the session from start to end (its cancel scopes must be entered
            # and exited in the same task); calls run in tasks of their own on the same loop.
            self._owner, _ = self._portal.start_task(self._hold)
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            raise

    async def _hold(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        self._stop = anyio.Event()
        # No read timeout on the transport: a rollout's own limit is `timeout` (fail_after per
        # call), and the session's notification stream may stay quiet for long.
        timeouts = httpx2.Timeout(30.0, read=None)
        async with httpx2.AsyncClient(headers=self.headers, timeout=timeouts) as http:
            transport = streamable_http_client(self.server_url, http_client=http)
            async with Client(transport, read_timeout_seconds=self.timeout) as client:
                self._client = client
                task_status.started()
                await self._stop.wait()

    async def _one(self, args: dict[str, Any], limiter: anyio.CapacityLimiter) -> dict[str, Any]:
        async with limiter:
            try:
                with anyio.fail_after(self.timeout):
                    result = await self._client.call_tool("run_rollout", args)
            except TimeoutError:
                error = f"timeout: no result within {self.timeout} s"
                return row_of(None, error=error, pad_id=self.pad_token_id)
            except Exception as exc:  # the server or the network: a row that trains nothing
                error = f"{type(exc).__name__}: {exc}"
                return row_of(None, error=error, pad_id=self.pad_token_id)
            if result.is_error:
                text = " ".join(getattr(c, "text", "") for c in result.content)
                return row_of(None, error=f"tool error: {text}", pad_id=self.pad_token_id)
            return row_of(result.structured_content, pad_id=self.pad_token_id)

    async def _batch(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any] | None] = [None] * len(calls)
        limiter = anyio.CapacityLimiter(self.concurrency)

        async def run(i: int) -> None:
            rows[i] = await self._one(calls[i], limiter)

        async with anyio.create_task_group() as tg:
            for i in range(len(calls)):
                tg.start_soon(run, i)
        return [r for r in rows if r is not None]

    def run_batch(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Run ``run_rollout`` for each argument dict, concurrently; one row per call, in order."""
        if self._closed:
            raise RuntimeError("this RolloutClient is closed")
        return self._portal.call(self._batch, calls)

    def call_tool(
        self,
        name: str,
        args: dict[str, Any],
        progress: Callable[[float, float | None, str | None], None] | None = None,
    ) -> Any:
        """Any other tool, synchronously (the structured result; a tool error raises).
        ``progress(done, total, message)`` is called with the tool's progress notifications."""

        async def on_progress(done: float, total: float | None, message: str | None) -> None:
            if progress is not None:
                progress(done, total, message)

        async def call() -> Any:
            result = await self._client.call_tool(
                name, args, progress_callback=on_progress if progress else None
            )
            if result.is_error:
                text = " ".join(getattr(c, "text", "") for c in result.content)
                raise RuntimeError(f"{name}: {text}")
            return result.structured_content

        return self._portal.call(call)

    def close(self) -> None:
        """End the session and stop the background thread."""
        if self._closed:
            return
        self._closed = True

        try:
            if self._stop is not None:
                self._portal.call(self._stop.set)
                try:
                    self._owner.result(timeout=30)
                except Exception as exc:  # tearing the session down must not fail the trainer
                    log.warning("closing the MCP session to %s: %s", self.server_url, exc)
        finally:
            self._portal_cm.__exit__(None, None, None)

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_rollout_func(
    server_url: str,
    *,
    harness: str | None = None,
    sandbox: str | None = None,
    llm: str | dict[str, Any] | None = None,
    sampling: dict[str, Any] | None = None,
    limits: dict[str, Any] | None = None,
    group_size: int = 1,
    concurrency: int = 8,
    timeout: float = 3600.0,
    headers: dict[str, str] | None = None,
    seed: int = 0,
    reward_key: str | None = None,
    pad_token_id: int = 0,
    answer_mode: str | None = None,
    task_config: dict[str, Any] | None = None,
) -> Callable[..., dict[str, list[Any]]]:
    """A synchronous ``rollout_func(prompts, trainer=None) -> dict`` for ``GRPOTrainer``.

    ``server_url`` is the server's MCP endpoint (``http://host:8400/mcp``); ``headers`` carry
    e.g. ``{"Authorization": "Bearer <token>"}``. ``llm`` is the engine the agent calls (the
    trainer's vLLM server, so rollouts sample from the current policy); omitted, the server's
    ``--llm-url``. ``group_size``: set it to ``num_generations``. ``answer_mode`` (env tasks):
    ``tool`` (the server's default), ``text`` or ``either``: with ``text``/``either`` a policy
    that answers in text instead of calling the task's tool still gets the verifier's reward
    (0.0 or 1.0) rather than None. ``task_config``: env tasks' generator config (e.g.
    ``{"min_terms": 2, "max_terms": 3}``). The client connects on the first call and lives as
    long as the function (``rollout_func.close()`` ends it).
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    state: dict[str, Any] = {"client": None}
    calls = itertools.count()
    lock = threading.Lock()

    def client() -> RolloutClient:
        with lock:
            if state["client"] is None:
                state["client"] = RolloutClient(
                    server_url,
                    headers=headers,
                    timeout=timeout,
                    concurrency=concurrency,
                    pad_token_id=pad_token_id,
                )
            return state["client"]

    def rollout_func(prompts: list[Any], trainer: Any = None) -> dict[str, list[Any]]:
        call = next(calls)
        # Several trainer processes each get a slice of the batch: offset by the process so
        # they never draw the same seeds (keep each slice a whole number of groups).
        accelerator = getattr(trainer, "accelerator", None)
        process = int(getattr(accelerator, "process_index", 0) or 0)
        processes = int(getattr(accelerator, "num_processes", 1) or 1)
        groups = math.ceil(len(prompts) / group_size)
        args_list = []
        for i, prompt in enumerate(prompts):
            task = prompt if isinstance(prompt, str) else str(prompt.get("task") or prompt)
            task_seed = seed + (call * processes + process) * groups + i // group_size
            args: dict[str, Any] = {"task": task, "include_tokens": True}
            if harness not in ("oracle", "nop"):  # they sample nothing
                args["sampling"] = {
                    **(sampling or {}),
                    "seed": _sampling_seed(task_seed, i, call * processes + process),
                }
            if not task.startswith("harbor:"):
                args["seed"] = task_seed
            env_only = (
                (("answer_mode", answer_mode), ("task_config", task_config))
                if not task.startswith("harbor:")
                else ()
            )
            for key, value in (
                ("harness", harness),
                ("sandbox", sandbox),
                ("llm", llm),
                ("limits", limits),
                ("reward_key", reward_key),
                *env_only,
            ):
                if value is not None:
                    args[key] = value
            args_list.append(args)
        rows = client().run_batch(args_list)
        out: dict[str, list[Any]] = {
            k: [row[k] for row in rows] for k in (*REQUIRED_KEYS, *EXTRA_KEYS)
        }
        out["error"] = [row["error"] for row in rows]
        return out

    def close() -> None:
        with lock:
            if state["client"] is not None:
                state["client"].close()
                state["client"] = None

    rollout_func.close = close  # type: ignore[attr-defined]
    return rollout_func


def reward_from_rollout(
    prompts: list[Any] | None = None,
    completions: list[Any] | None = None,
    reward: list[float | None] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """A TRL reward function that returns the verifier's reward forwarded by ``rollout_func``
    (None where the verifier never ran: TRL treats it as missing, not as 0)."""
    if reward is None:
        raise ValueError("reward_from_rollout needs the `reward` column that rollout_func returns")
    return list(reward)


def task_dataset(
    source: str | None = None,
    *,
    query: str | None = None,
    limit: int | None = None,
    repeat: int = 1,
    server_url: str | None = None,
    headers: dict[str, str] | None = None,
) -> Any:
    """A ``datasets.Dataset`` whose ``prompt`` column holds task references, for
    ``GRPOTrainer(train_dataset=...)``: from ``list_tasks`` (``source``/``query`` as the tool),
    asked of the server at ``server_url`` or listed locally; ``repeat`` copies each task."""
    import datasets

    refs: list[str] = []
    offset: int | None = 0
    if server_url is not None:
        with RolloutClient(server_url, headers=headers) as c:
            while offset is not None and (limit is None or len(refs) < limit):
                args = {"source": source, "query": query, "offset": offset, "limit": 500}
                page = c.call_tool("list_tasks", {k: v for k, v in args.items() if v is not None})
                refs += [t["ref"] for t in page["tasks"]]
                offset = page["next_offset"]
    else:
        from rollwire.tools.tasks import list_task_page

        async def listing() -> list[str]:
            found: list[str] = []
            at: int | None = 0
            while at is not None and (limit is None or len(found) < limit):
                page = await list_task_page(source, offset=at, limit=500, query=query)
                found += [t.ref for t in page.tasks]
                at = page.next_offset
            return found

        refs = anyio.run(listing)
    refs = refs[:limit] if limit is not None else refs
    if not refs:
        raise ValueError(f"no task matches source={source!r} query={query!r}")
    return datasets.Dataset.from_dict({"prompt": [r for r in refs for _ in range(repeat)]})


__all__ = [
    "RolloutClient",
    "choose_sequence",
    "make_rollout_func",
    "reward_from_rollout",
    "row_of",
    "task_dataset",
]
