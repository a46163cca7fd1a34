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
- **Policy versions.** **weight_version** is the version of the weights that sampled the row's
  oldest trainable turn (the engine's ``GET /weight_info`` around each call, or what the trainer
  announced), **weight_versions** every version its trainable turns came from. With
  ``max_staleness=K`` a row more than K optimizer steps behind the trainer (or of no known
  version) is dropped (it trains nothing) or flagged (**stale**), and the function says how many.

**Weight sync** (:class:`WeightSync`): pushes the trainer's weights into the engine through
vLLM's RL routes after each optimizer step (``make_rollout_func(weight_sync=...)`` does it
before each batch of rollouts, when the trainer's step has moved on, as TRL syncs its own vLLM
server), and names the version ``step-<global_step>``. Transfers: ``disk`` (a checkpoint folder
on the engine's machine), ``http`` (safetensors in the requests), ``vllm_reload`` (vLLM on a
CPU: its ``reload_weights``, after checking the folder) and ``version_only`` (TRL's vLLM server
mode moved the weights over NCCL; only the version is set).

Layer: a client beside ``collect`` and ``engine`` (neither imports the other). It imports only
the base module ``checkpoints`` (a folder is checked before vLLM is asked to reload it) and
``tools.tasks``, on use, to list tasks in-process when no server URL is given; a forbidden
contract keeps torch, trl and transformers out of it.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import logging
import math
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.abc
import anyio.from_thread
import orjson

from rollwire.checkpoints import CheckpointError, folder_specs, mismatches, summary

log = logging.getLogger("rollwire.trl")

REQUIRED_KEYS = ("prompt_ids", "completion_ids", "logprobs")
EXTRA_KEYS = (
    "env_mask",
    "reward",
    "rewards",
    "ok",
    "rollout_id",
    "sequences_total",
    "seed",
    "weight_version",
    "weight_versions",
)


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


def policy_step(version: str | None) -> int | None:
    """The optimizer step a weight version names: ``step-12``, ``12`` or anything ending in a
    number gives 12; vLLM's initial ``default`` is step 0; anything else (or None) is unknown."""
    if version is None:
        return None
    if version == "default":
        return 0
    found = re.search(r"(?:^|[^0-9])(\d+)$", version)
    return int(found.group(1)) if found else None


def _trained_versions(seq: dict[str, Any]) -> list[str | None]:
    """The weight versions of a sequence's trainable turns (a turn span with a loss-mask 1),
    each once, in the order they were sampled."""
    mask = seq["loss_mask"]
    versions = seq.get("weight_versions") or []
    out: list[str | None] = []
    for (start, end), version in zip(seq.get("turn_spans") or [], versions, strict=False):
        if any(mask[start:end]) and version not in out:
            out.append(version)
    return out


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
        "weight_version": None,
        "weight_versions": [],
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
    versions = _trained_versions(chosen)
    base["weight_versions"] = versions
    base["weight_version"] = versions[0] if versions else None
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


Transfer = Literal["disk", "http", "vllm_reload", "version_only"]
TRANSFERS: tuple[Transfer, ...] = ("disk", "http", "vllm_reload", "version_only")


class WeightSyncError(RuntimeError):
    """A weight push that did not happen: the engine keeps serving the weights it had (it was
    resumed), and the trainer must not take its next samples for on-policy ones."""


@dataclass(frozen=True)
class SyncReport:
    """One push: the version set, how, and where the time went (seconds)."""

    version: str
    transfer: str
    save_s: float  # writing the checkpoint (the trainer's side)
    paused_s: float  # from pause to resume: how long rollouts waited
    total_s: float
    bytes: int


def _root_url(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class WeightSync:
    """Pushes a trainer's weights into the engine that samples its rollouts, through vLLM's RL
    routes, and names each push's version.

    ``engine_url`` is the engine's root (or ``/v1``) URL; ``admin_key`` its ``--admin-key``
    (the reference engine refuses weight routes without it). ``transfer``:

    - ``disk``: ``save_pretrained`` into ``checkpoint_dir/<version>`` (a folder the engine may
      read: inside its ``--weights-root``), then ``/update_weights {"path": ...}``;
    - ``http``: the same checkpoint in shards of ``shard_mb``, each sent as
      ``{"safetensors": <base64>}`` (a trainer on another machine);
    - ``vllm_reload``: vLLM on a CPU (``VLLM_SERVER_DEV_MODE=1``): the folder is checked
      against the one vLLM serves (every tensor present, shapes equal) before vLLM's
      ``reload_weights`` is asked to load it, since vLLM left half-loaded by a bad folder dies;
    - ``version_only``: the weights are moved by someone else (TRL's vLLM server mode, over
      NCCL on a GPU); only ``/update_weight_version`` is called.

    A push pauses the engine (``pause_mode``, vLLM's ``wait`` by default: calls in flight
    finish on the old weights), swaps, sets the version and resumes; any failure resumes the
    engine on its old weights and raises :class:`WeightSyncError`. ``keep_checkpoints``
    folders of the latest pushes are kept (the rest deleted once swapped in).
    """

    def __init__(
        self,
        engine_url: str,
        *,
        transfer: Transfer = "disk",
        admin_key: str | None = None,
        checkpoint_dir: str | Path | None = None,
        pause_mode: Literal["abort", "wait", "keep"] = "wait",
        keep_checkpoints: int = 1,
        shard_mb: int = 64,
        timeout: float = 600.0,
    ) -> None:
        import httpx2

        if transfer not in TRANSFERS:
            raise ValueError(f"transfer={transfer!r}: one of {list(TRANSFERS)}")
        if transfer in ("disk", "vllm_reload") and checkpoint_dir is None:
            raise ValueError(
                f"transfer={transfer!r} needs checkpoint_dir (a folder the engine reads)"
            )
        if keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints must be >= 1, got {keep_checkpoints}")
        self.root = _root_url(engine_url)
        self.transfer = transfer
        self.pause_mode = pause_mode
        self.checkpoint_dir = Path(checkpoint_dir).resolve() if checkpoint_dir else None
        self.keep_checkpoints = keep_checkpoints
        self.shard_mb = shard_mb
        headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
        self._http = httpx2.Client(headers=headers, timeout=timeout)
        self.history: list[SyncReport] = []
        self._kept: list[Path] = []

    def close(self) -> None:
        """Close the HTTP client."""
        self._http.close()

    # ---- the routes ---------------------------------------------------------------------------

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            reply = self._http.request(method, self.root + path, **kwargs)
        except Exception as exc:  # the engine is unreachable: say which call
            raise WeightSyncError(
                f"{method} {self.root}{path}: {type(exc).__name__}: {exc}"
            ) from exc
        if reply.status_code != 200:
            raise WeightSyncError(
                f"{method} {self.root}{path} answered {reply.status_code}: {_error_text(reply)}"
            )
        return reply.json() if reply.content else {}

    def version(self) -> str | None:
        """The engine's ``GET /weight_info`` version (None when it does not serve the route)."""
        reply = self._http.get(self.root + "/weight_info")
        if reply.status_code == 404:
            return None
        if reply.status_code != 200:
            raise WeightSyncError(
                f"GET /weight_info answered {reply.status_code}: {_error_text(reply)}"
            )
        return reply.json().get("weight_version")

    def set_version(self, version: str) -> None:
        """``/update_weight_version`` alone."""
        self._call("POST", "/update_weight_version", json={"new_version": version})

    # ---- a push -------------------------------------------------------------------------------

    def push(self, model: Any, version: str) -> SyncReport:
        """Put ``model``'s weights (a transformers ``PreTrainedModel``) into the engine as
        ``version``; raises :class:`WeightSyncError` when they did not get there."""
        started = time.perf_counter()
        if self.transfer == "version_only":
            self.set_version(version)
            now = time.perf_counter() - started
            return self._record(SyncReport(version, self.transfer, 0.0, now, now, 0))
        folder = (
            self.checkpoint_dir / version
            if self.checkpoint_dir is not None
            else Path(tempfile.mkdtemp(prefix="rollwire-weights-"))
        )
        shutil.rmtree(folder, ignore_errors=True)
        model.save_pretrained(folder, safe_serialization=True, max_shard_size=f"{self.shard_mb}MB")
        saved = time.perf_counter()
        size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        try:
            if self.transfer == "vllm_reload":
                self._check_against_served(folder)
            paused_at = time.perf_counter()
            try:
                self._call("POST", "/pause", params={"mode": self.pause_mode})
                if self.transfer == "vllm_reload":
                    self._call(
                        "POST",
                        "/collective_rpc",
                        json={"method": "reload_weights", "kwargs": {"weights_path": str(folder)}},
                    )
                    self.set_version(version)
                else:
                    self._call("POST", "/start_weight_update", json={})
                    for update_info in self._updates(folder):
                        # orjson: a shard's base64 is tens of MB, which json.dumps is slow to write
                        body = orjson.dumps({"update_info": update_info})
                        self._call("POST", "/update_weights", content=body, headers=_JSON)
                    self._call("POST", "/finish_weight_update", json={"weight_version": version})
            except BaseException:
                self._resume_after_failure()
                raise
            self._call("POST", "/resume")
            resumed = time.perf_counter()
        except BaseException:
            if self.checkpoint_dir is None or self.transfer == "http":
                shutil.rmtree(folder, ignore_errors=True)
            raise
        report = SyncReport(
            version,
            self.transfer,
            round(saved - started, 3),
            round(resumed - paused_at, 3),
            round(resumed - started, 3),
            size,
        )
        self._retire(folder)
        return self._record(report)

    def _resume_after_failure(self) -> None:
        """Resume the engine on whatever it serves after a failed push (the failure itself is
        what the caller sees)."""
        try:
            self._call("POST", "/resume")
        except WeightSyncError as exc:
            log.error("resuming %s after a failed weight push: %s", self.root, exc)

    def _updates(self, folder: Path) -> Any:
        if self.transfer == "disk":
            yield {"path": str(folder)}
            return
        for shard in sorted(folder.glob("*.safetensors")):
            yield {"safetensors": base64.b64encode(shard.read_bytes()).decode("ascii")}

    def _check_against_served(self, folder: Path) -> None:
        """vLLM must only be asked to reload a folder that fits what it serves: the served
        folder (``GET /v1/models``' root) and this one hold the same tensors, shapes and kinds."""
        cards = self._call("GET", "/v1/models").get("data") or []
        roots = {c.get("root") for c in cards if isinstance(c, dict)}
        served = next((Path(r) for r in roots if r and Path(r).is_dir()), None)
        if served is None:
            raise WeightSyncError(
                f"cannot check the checkpoint: the engine's model root {sorted(map(str, roots))} "
                "is not a folder on this machine, and vLLM must not be asked to reload an "
                "unchecked folder"
            )
        try:
            problems = mismatches(folder_specs(served), folder_specs(folder), complete=True)
        except CheckpointError as exc:
            raise WeightSyncError(str(exc)) from None
        if problems:
            raise WeightSyncError(
                f"{folder} does not fit the served {served}: {summary(problems)} (not sent)"
            )

    def _retire(self, folder: Path) -> None:
        if self.checkpoint_dir is None or self.transfer == "http":
            shutil.rmtree(folder, ignore_errors=True)
            return
        self._kept.append(folder)
        while len(self._kept) > self.keep_checkpoints:
            shutil.rmtree(self._kept.pop(0), ignore_errors=True)

    def _record(self, report: SyncReport) -> SyncReport:
        self.history.append(report)
        log.info(
            "weights %s -> %s by %s: saved in %.2f s, paused %.2f s, %d bytes",
            report.version, self.root, report.transfer, report.save_s, report.paused_s, report.bytes,
        )  # fmt: skip
        return report


_JSON = {"Content-Type": "application/json"}


def _error_text(reply: Any) -> str:
    try:
        data = reply.json()
    except ValueError:
        return reply.text[:500]
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        return str(err.get("message"))
    if isinstance(data, dict) and ("error" in data or "detail" in data):
        return str(data.get("error") or data.get("detail"))
    return str(data)[:500]


def announce_weight_version(
    server_url: str,
    version: str,
    *,
    llm: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> dict[str, Any]:
    """Tell a rollwire server which weights its engine now serves (``POST /weight_version``),
    for engines that do not report it (no ``GET /weight_info``): calls captured from then on
    record ``version``. ``server_url`` is the server's ``/mcp`` URL (or its root); ``llm`` the
    engine URL it applies to (default: the server's ``--llm-url``)."""
    import httpx2

    root = server_url.rstrip("/")
    root = root[: -len("/mcp")] if root.endswith("/mcp") else root
    body = {"weight_version": version, **({"llm_url": llm} if llm else {})}
    reply = httpx2.post(root + "/weight_version", json=body, headers=headers, timeout=timeout)
    if reply.status_code != 200:
        raise WeightSyncError(
            f"POST {root}/weight_version answered {reply.status_code}: {_error_text(reply)}"
        )
    return reply.json()


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
    weight_sync: WeightSync | None = None,
    max_staleness: int | None = None,
    stale: Literal["drop", "flag"] = "drop",
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

    ``weight_sync``: before each batch whose trainer step differs from the last one pushed, the
    trainer's model is pushed into the engine as ``step-<global_step>`` (the first batch
    included, so the engine serves exactly the weights being trained), and the version is
    announced to the rollwire server too (for engines without ``GET /weight_info``).
    ``max_staleness=K``: a row whose ``weight_version`` is more than K steps behind the
    trainer's (``trainer.state.global_step``; without a trainer, the newest version in the
    batch), or whose version is unknown, is dropped (``stale="drop"``: it trains nothing,
    reward None, ``error`` says why) or flagged (``stale="flag"``); ``stale`` marks them either
    way, each batch logs how many, and ``rollout_func.stats`` counts them over the run.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if max_staleness is not None and max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    if stale not in ("drop", "flag"):
        raise ValueError(f"stale={stale!r}: 'drop' or 'flag'")
    state: dict[str, Any] = {"client": None, "synced_step": None}
    stats = {"samples": 0, "stale": 0, "unknown_version": 0, "dropped": 0, "pushes": 0}
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

    def sync(trainer: Any, process: int) -> None:
        step = int(trainer.state.global_step)
        if weight_sync is None or state["synced_step"] == step:
            return
        if process == 0:
            accelerator = getattr(trainer, "accelerator", None)
            model = accelerator.unwrap_model(trainer.model) if accelerator else trainer.model
            version = f"step-{step}"
            weight_sync.push(model, version)
            announce_weight_version(server_url, version, llm=_llm_url(llm), headers=headers)
            stats["pushes"] += 1
        state["synced_step"] = step

    def rollout_func(prompts: list[Any], trainer: Any = None) -> dict[str, list[Any]]:
        call = next(calls)
        # Several trainer processes each get a slice of the batch: offset by the process so
        # they never draw the same seeds (keep each slice a whole number of groups).
        accelerator = getattr(trainer, "accelerator", None)
        process = int(getattr(accelerator, "process_index", 0) or 0)
        processes = int(getattr(accelerator, "num_processes", 1) or 1)
        if trainer is not None:
            sync(trainer, process)
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
        stats["samples"] += len(rows)
        flags = [False] * len(rows)
        if max_staleness is not None:
            flags = _mark_stale(rows, trainer, max_staleness, stale, stats, pad_token_id)
        out: dict[str, list[Any]] = {
            k: [row[k] for row in rows] for k in (*REQUIRED_KEYS, *EXTRA_KEYS)
        }
        out["error"] = [row["error"] for row in rows]
        out["stale"] = flags
        return out

    def close() -> None:
        with lock:
            if state["client"] is not None:
                state["client"].close()
                state["client"] = None

    rollout_func.close = close  # type: ignore[attr-defined]
    rollout_func.stats = stats  # type: ignore[attr-defined]
    return rollout_func


def _llm_url(llm: str | dict[str, Any] | None) -> str | None:
    return llm.get("url") if isinstance(llm, dict) else llm


def _mark_stale(
    rows: list[dict[str, Any]],
    trainer: Any,
    max_staleness: int,
    policy: str,
    stats: dict[str, int],
    pad_id: int,
) -> list[bool]:
    """Flag (and with ``drop``, empty) the rows more than ``max_staleness`` steps behind, or of
    no known version; one log line says how many."""
    steps = [policy_step(r["weight_version"]) for r in rows]
    if trainer is not None:
        current: int | None = int(trainer.state.global_step)
    else:
        current = max((s for s in steps if s is not None), default=None)
    flags: list[bool] = []
    unknown = 0
    for i, (row, step) in enumerate(zip(rows, steps, strict=True)):
        trains = any(row["env_mask"])
        is_stale = trains and (step is None or current is None or current - step > max_staleness)
        flags.append(is_stale)
        if not is_stale:
            continue
        unknown += step is None
        if policy == "drop":
            why = (
                f"stale: sampled by weights {row['weight_version']!r}, "
                f"{'of no known step' if step is None else f'{current - step} step(s) behind'} "
                f"(max_staleness={max_staleness})"
            )
            rows[i] = {
                **row_of(None, error=why, pad_id=pad_id),
                **{k: row[k] for k in ("rollout_id", "seed", "rewards", "sequences_total")},
                "weight_version": row["weight_version"],
                "weight_versions": row["weight_versions"],
            }
    n = sum(flags)
    stats["stale"] += n
    stats["unknown_version"] += unknown
    if policy == "drop":
        stats["dropped"] += n
    if n:
        log.warning(
            "%d of %d samples are stale (max_staleness=%d, trainer at step %s; %d of no known "
            "version): %s",
            n, len(rows), max_staleness, current, unknown,
            "dropped (they train nothing)" if policy == "drop" else "flagged",
        )  # fmt: skip
    return flags


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
    "EXTRA_KEYS",
    "REQUIRED_KEYS",
    "TRANSFERS",
    "RolloutClient",
    "SyncReport",
    "WeightSync",
    "WeightSyncError",
    "announce_weight_version",
    "choose_sequence",
    "make_rollout_func",
    "policy_step",
    "reward_from_rollout",
    "row_of",
    "task_dataset",
]
