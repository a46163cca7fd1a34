"""The read-only web UI at ``/ui``: rollouts (live), one rollout's graph, turns and token strip,
collections under ``--data-dir`` (an eval's report, and two evals compared), and the capture
sessions of the server's proxies.

The front end is three static files (``ui_static/``: no build, no CDN, no external font); this
module serves them and the JSON they read (``/ui/api/...``). Every view is computed from what the
server already holds: the rollout store's documents (compacted per rollout, never sent whole
unless asked for), the collections' own files, the proxies' session stores. Token text comes
from the engine that served the rollout (``/detokenize``, one id at a time, cached).

Auth: with a server token, ``/ui?token=<token>`` once sets an HttpOnly cookie (and redirects to
the same URL without the token); the ``Authorization: Bearer`` header works too; anything else
is a 401 that serves nothing of the UI. On loopback without a token, requests must name a
loopback host (DNS-rebinding protection, as the MCP endpoint has).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import Route, Router

from rollwire import bounds
from rollwire.capture.export import RolloutDocument, TrainingSequence, TurnRecord
from rollwire.capture.findings import Finding
from rollwire.capture.upstream import UpstreamError
from rollwire.collect.evaluation import EVAL_FILE, EvalReport, compare_reports, load_report
from rollwire.datasets.store import (
    EPISODES_FILE,
    FAILURES_FILE,
    CollectionError,
    Manifest,
    read_manifest,
)
from rollwire.roots import OutsideRoots

if TYPE_CHECKING:
    from rollwire.server.mcp_app import ServerState
    from rollwire.tools.rollouts import StoredRollout

STATIC = Path(__file__).with_name("ui_static")
COOKIE = "rollwire_ui"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}
MAX_FAILURES_SHOWN = 200
MAX_COLLECTIONS = 500
HISTOGRAM_BINS = 10
DETOKENIZE_CONCURRENCY = 16
MAX_CACHED_PIECES = 500_000


def cookie_value(token: str) -> str:
    """What the UI cookie holds: a MAC of the token, not the token itself."""
    return hmac.new(token.encode(), b"rollwire-ui-cookie/1", hashlib.sha256).hexdigest()


def masked_session(session_id: str) -> str:
    """A session's id is the key its agent calls with: the UI shows a digest of it."""
    return "rw-" + hashlib.sha256(session_id.encode()).hexdigest()[:10]


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _error(status: int, message: str) -> Response:
    return _json({"error": message}, status)


# --- pure views ------------------------------------------------------------------------------


def turn_row(turn: TurnRecord, more: Sequence[Finding] = ()) -> dict[str, Any]:
    """One turn without its token arrays (the graph and the turn list); ``more``: findings the
    document attaches to this turn besides its own (re-tokenised, discarded, ...)."""
    own = {(f.level, f.code, f.message) for f in turn.findings}
    findings = [*turn.findings, *(f for f in more if (f.level, f.code, f.message) not in own)]
    return {
        "node_id": turn.node_id,
        "parent_id": turn.parent_id,
        "retokenized_from": turn.retokenized_from,
        "role": turn.role.value,
        "trainable": turn.trainable,
        "auxiliary": turn.auxiliary,
        "prompt_len": None if turn.prompt_token_ids is None else len(turn.prompt_token_ids),
        "completion_len": None
        if turn.completion_token_ids is None
        else len(turn.completion_token_ids),
        "finish_reason": turn.finish_reason,
        "token_in_mode": turn.token_in_mode,
        "token_in_path": turn.token_in_path,
        "parent_call_id": turn.parent_call_id,
        "carried_len": turn.carried_len,
        "dialect": turn.dialect,
        "model": turn.model,
        "created_at": turn.created_at,
        "findings": [f.model_dump(mode="json") for f in findings],
        "has_top_logprobs": turn.top_logprobs is not None,
    }


def sequence_row(seq: TrainingSequence) -> dict[str, Any]:
    """One sequence without its arrays."""
    return {
        "sequence_id": seq.sequence_id,
        "node_ids": seq.node_ids,
        "role": seq.role.value,
        "trainable": seq.trainable,
        "length": len(seq.input_ids),
        "n_trainable_tokens": seq.n_trainable_tokens,
        "turn_spans": [s.model_dump() for s in seq.turn_spans],
        "findings": [f.model_dump(mode="json") for f in seq.findings],
    }


def document_view(document: RolloutDocument) -> dict[str, Any]:
    """The document as the rollout page needs it: everything but the token arrays. Findings
    naming a turn are shown at that turn; the rest are the rollout's."""
    by_turn: dict[str, list[Finding]] = {}
    for finding in document.findings:
        if finding.node_id is not None:
            by_turn.setdefault(finding.node_id, []).append(finding)
    return {
        "version": document.version,
        "capture_level": document.capture_level.value,
        "rollout_type": document.rollout_type.value,
        "stats": document.stats.model_dump(),
        "findings": [f.model_dump(mode="json") for f in document.findings if f.node_id is None],
        "metadata": document.metadata,
        "turns": [turn_row(t, by_turn.get(t.node_id, [])) for t in document.turns],
        "sequences": [sequence_row(s) for s in document.sequences],
    }


def sequence_tokens(document: RolloutDocument, seq: TrainingSequence) -> dict[str, Any]:
    """One sequence's arrays, and each position's top candidates where its turn kept them."""
    turns = {t.node_id: t for t in document.turns}
    # The candidates are passed as they are held (orjson writes the pairs as arrays): building
    # a new list per position cost 0.4 s on a 128k-token rollout, mostly in the collector.
    top: dict[str, Any] = {}
    for span in seq.turn_spans:
        turn = turns.get(span.node_id)
        if turn is None or turn.top_logprobs is None:
            continue
        for offset, candidates in enumerate(turn.top_logprobs[: span.end - span.start]):
            if candidates:
                top[str(span.start + offset)] = candidates
    return {
        "sequence_id": seq.sequence_id,
        "input_ids": seq.input_ids,
        "loss_mask": seq.loss_mask,
        "logprobs": seq.logprobs,
        "turn_spans": [s.model_dump() for s in seq.turn_spans],
        "top": top,
    }


def turn_detail(turn: TurnRecord) -> dict[str, Any]:
    """One turn's messages and reply (its prompt ids stay out: they can be 100k long)."""
    return {
        "node_id": turn.node_id,
        "messages": turn.messages,
        "reply": turn.reply,
        "requested_params": turn.requested_params,
        "applied_params": turn.applied_params,
        "usage": turn.usage,
        "finish_reason": turn.finish_reason,
        "findings": [f.model_dump(mode="json") for f in turn.findings],
        "completion_token_ids": turn.completion_token_ids,
        "logprobs": turn.logprobs,
    }


def reward_histogram(rewards: list[float | None], bins: int = HISTOGRAM_BINS) -> dict[str, Any]:
    """Counts of rewards in ``bins`` equal bins over [min(0, lo), max(1, hi)]; None counted
    apart (a verifier that never ran is not a reward of 0)."""
    values = [r for r in rewards if r is not None and math.isfinite(r)]
    lo = min([0.0, *values])
    hi = max([1.0, *values])
    width = (hi - lo) / bins
    counts = [0] * bins
    for r in values:
        counts[min(int((r - lo) / width), bins - 1)] += 1
    return {
        "bins": [
            {"lo": lo + i * width, "hi": lo + (i + 1) * width, "count": c}
            for i, c in enumerate(counts)
        ],
        "none": len(rewards) - len(values),
    }


def _scan_lines(path: Path, visit: Callable[[dict[str, Any]], None]) -> None:
    if not path.exists():
        return
    with path.open("rb") as fh:
        for line in fh:
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # a torn last line (the store repairs it on its next run)
            if isinstance(obj, dict):
                visit(obj)


def collection_view(name: str, path: Path) -> dict[str, Any] | None:
    """Progress, reward histogram, per-task success and failures of one collection directory
    (None when it holds no manifest)."""
    manifest = read_manifest(path)
    if manifest is None:
        return None
    rewards: list[float | None] = []
    tasks: dict[str, dict[str, Any]] = {}

    def episode(obj: dict[str, Any]) -> None:
        reward = obj.get("reward")
        reward = float(reward) if isinstance(reward, int | float) else None
        rewards.append(reward)
        row = tasks.setdefault(
            str(obj.get("task")), {"episodes": 0, "successes": 0, "reward_sum": 0.0, "scored": 0}
        )
        row["episodes"] += 1
        if reward is not None:
            row["scored"] += 1
            row["reward_sum"] += reward
            row["successes"] += reward > 0

    failures: list[dict[str, Any]] = []
    count = 0

    def failure(obj: dict[str, Any]) -> None:
        nonlocal count
        count += 1
        failures.append(
            {
                k: obj.get(k)
                for k in (
                    "episode_id",
                    "task",
                    "sample_index",
                    "error",
                    "exception_type",
                    "engine",
                    "node",
                    "created_at",
                )
            }
        )
        del failures[:-MAX_FAILURES_SHOWN]

    _scan_lines(path / manifest.files.get("episodes", EPISODES_FILE), episode)
    _scan_lines(path / manifest.files.get("failures", FAILURES_FILE), failure)
    counts = manifest.counts
    return {
        "name": name,
        "eval": is_eval(path, manifest),
        "manifest": manifest.model_dump(mode="json", by_alias=True),
        "progress": {
            "done": counts.collected + counts.filtered + counts.failed,
            "total": manifest.planned,
        },
        "reward_histogram": reward_histogram(rewards),
        "tasks": [
            {
                "task": task,
                "episodes": row["episodes"],
                "successes": row["successes"],
                "mean_reward": row["reward_sum"] / row["scored"] if row["scored"] else None,
            }
            for task, row in sorted(tasks.items())
        ],
        "failures": list(reversed(failures)),
        "failure_count": count,
    }


def find_collections(data_dir: Path, limit: int = MAX_COLLECTIONS) -> list[tuple[str, Path]]:
    """Directories under ``data_dir`` (three levels at most) that hold a manifest."""
    root = data_dir.expanduser().resolve()
    found: list[tuple[str, Path]] = []
    if not root.is_dir():
        return found
    for dirpath, dirnames, filenames in os.walk(root):
        depth = len(Path(dirpath).relative_to(root).parts)
        if "manifest.json" in filenames and depth > 0:
            found.append((Path(dirpath).relative_to(root).as_posix(), Path(dirpath)))
            dirnames[:] = []
        if depth >= 3:
            dirnames[:] = []
        dirnames.sort()
        if len(found) >= limit:
            break
    return found


def collection_row(name: str, path: Path) -> dict[str, Any] | None:
    manifest = read_manifest(path)
    if manifest is None:
        return None
    c = manifest.counts
    return {
        "name": name,
        "eval": is_eval(path, manifest),
        "model": manifest.model,
        "engine_tier": manifest.engine_tier,
        "episodes": manifest.planned,
        "done": c.collected + c.filtered + c.failed,
        "collected": c.collected,
        "filtered": c.filtered,
        "failed": c.failed,
        "reward_mean": manifest.reward.mean,
        "updated_at": manifest.updated_at,
    }


# --- evals -----------------------------------------------------------------------------------


class NotAnEval(LookupError):
    """A folder that is no eval: no ``eval.json``, and not a collection made as an eval."""


class UnreadableEval(Exception):
    """An eval whose report cannot be read (a damaged ``eval.json`` or collection file)."""


def is_eval(path: Path, manifest: Manifest | None) -> bool:
    """An eval folder: ``rollwire eval`` wrote its ``eval.json``, or it is a collection made as
    an eval (``collect_episodes`` with ``eval``, or a ``rollwire eval`` still running)."""
    if (path / EVAL_FILE).is_file():
        return True
    return manifest is not None and manifest.config.get("purpose") == "eval"


def read_eval(name: str, path: Path) -> tuple[EvalReport, str]:
    """An eval folder's report (``load_report``: its ``eval.json``, else the folder summarised
    at pass@1) and where it came from (``eval.json`` or ``folder``). Raises
    :class:`NotAnEval` or :class:`UnreadableEval`, each naming the folder."""
    try:
        manifest = read_manifest(path)
        if not is_eval(path, manifest):
            raise NotAnEval(
                f"{name!r} holds no eval (no {EVAL_FILE}, and no collection made as an eval)"
            )
        source = EVAL_FILE if (path / EVAL_FILE).is_file() else "folder"
        return load_report(path), source
    except (CollectionError, ValueError) as exc:
        raise UnreadableEval(f"{name!r}: {exc}") from None


def eval_view(name: str, path: Path) -> dict[str, Any]:
    """One eval as its page shows it: the report without its per-problem scores (a
    comparison reads those on the server), and how many problems it holds (blocking)."""
    report, source = read_eval(name, path)
    return {
        "name": name,
        "source": source,
        "report": report.model_dump(mode="json", by_alias=True, exclude={"problems"}),
        "problem_count": len(report.problems),
    }


def comparison_view(a: tuple[str, Path], b: tuple[str, Path]) -> dict[str, Any]:
    """B against A, paired by problem, at the ks both report (as ``rollwire eval --compare``;
    blocking). Raises :class:`NotAnEval` or :class:`UnreadableEval` for a folder, and
    :class:`EvalMismatch` (a ValueError) when the two do not pair."""
    report_a, _ = read_eval(*a)
    report_b, _ = read_eval(*b)
    result = compare_reports(report_a, report_b, (a[0], b[0]))
    return {
        **result.model_dump(mode="json"),
        "pass_threshold": report_a.metrics.pass_threshold,
        "models": {"a": report_a.model, "b": report_b.model},
    }


# --- token text ------------------------------------------------------------------------------


class PieceCache:
    """Each token id's text as its engine detokenises it alone, per (engine URL, model)."""

    def __init__(self) -> None:
        self._pieces: dict[tuple[str, str], dict[int, str]] = {}
        self._size = 0
        self._lock = threading.Lock()

    async def pieces(
        self,
        key: tuple[str, str],
        ids: list[int],
        detokenize: Callable[[list[int]], Awaitable[str]],
    ) -> tuple[dict[int, str], str | None]:
        """The text of each id (known ones from the cache); the first error, if any."""
        known = self._pieces.setdefault(key, {})
        out = {i: known[i] for i in ids if i in known}
        missing = [i for i in ids if i not in out]
        errors: list[str] = []
        limiter = anyio.CapacityLimiter(DETOKENIZE_CONCURRENCY)

        async def one(token: int) -> None:
            async with limiter:
                if errors:
                    return
                try:
                    out[token] = await detokenize([token])
                except UpstreamError as exc:
                    errors.append(f"the engine's /detokenize failed: {exc.message}")

        async with anyio.create_task_group() as tg:
            for token in missing:
                tg.start_soon(one, token)
        with self._lock:
            if self._size > MAX_CACHED_PIECES:
                self._pieces = {key: known}
                self._size = len(known)
            for token in missing:
                if token in out and token not in known:
                    known[token] = out[token]
                    self._size += 1
        return out, errors[0] if errors else None


# --- the app ---------------------------------------------------------------------------------


class UI:
    """The ``/ui`` routes over one server state."""

    def __init__(self, state: ServerState, *, token: str | None, loopback: bool) -> None:
        self.state = state
        self.token = token
        self.loopback = loopback
        self.pieces = PieceCache()
        self._views: OrderedDict[str, tuple[RolloutDocument, dict[str, Any]]] = OrderedDict()
        self.router = Router(
            routes=[
                Route("/api/rollouts", self.rollouts),
                Route("/api/rollouts/{rollout_id}", self.rollout),
                Route("/api/rollouts/{rollout_id}/document", self.document),
                Route("/api/rollouts/{rollout_id}/turns/{node_id}", self.turn),
                Route("/api/rollouts/{rollout_id}/sequences/{sequence_id}", self.sequence),
                Route("/api/rollouts/{rollout_id}/pieces", self.token_pieces, methods=["POST"]),
                Route("/api/collections", self.collections),
                Route("/api/collections/{name:path}", self.collection),
                Route("/api/evals/{name:path}", self.eval),
                Route("/api/compare", self.compare_evals),
                Route("/api/sessions", self.sessions),
                Route("/api/{rest:path}", self.no_api),
                Route("/static/{name}", self.static),
                Route("/{rest:path}", self.page),
            ]
        )

    # -- ASGI entry: host check, auth, headers --

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope)
        refused = self._refuse(request)
        if refused is not None:
            response = refused
        else:
            response = self._login(request)
        if response is not None:
            response.headers.update(SECURITY_HEADERS)
            await response(scope, receive, send)
            return

        async def send_with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.router(scope, receive, send_with_headers)

    def _refuse(self, request: Request) -> Response | None:
        if self.loopback and self.token is None:
            host = (request.headers.get("host") or "").rsplit(":", 1)[0]
            if host and host not in LOOPBACK_HOSTS:
                return Response(
                    f"host {host!r} is not this loopback server's", 421, media_type="text/plain"
                )
        if self.token is None:
            return None
        expected = f"Bearer {self.token}"
        if hmac.compare_digest(request.headers.get("authorization", ""), expected):
            return None
        if hmac.compare_digest(request.cookies.get(COOKIE, ""), cookie_value(self.token)):
            return None
        given = request.query_params.get("token")
        if given is not None and hmac.compare_digest(given, self.token):
            return None  # _login sets the cookie
        return Response(
            "unauthorized: open the UI with the URL the server printed (?token=...) or send "
            "Authorization: Bearer <token>\n",
            401,
            media_type="text/plain",
            headers={"www-authenticate": "Bearer"},
        )

    def _login(self, request: Request) -> Response | None:
        """A good token in the URL: set the cookie and drop the token from the URL."""
        if self.token is None or "token" not in request.query_params:
            return None
        rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            COOKIE,
            cookie_value(self.token),
            httponly=True,
            samesite="strict",
            path="/ui",
            secure=request.url.scheme == "https",
        )
        return response

    # -- pages and assets --

    async def page(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8")

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        types = {
            "app.js": "text/javascript; charset=utf-8",
            "app.css": "text/css; charset=utf-8",
            "icon.svg": "image/svg+xml",
        }
        if name not in types:
            return Response("not found", 404, media_type="text/plain")
        return FileResponse(STATIC / name, media_type=types[name])

    async def no_api(self, request: Request) -> Response:
        return _error(404, f"no UI API route {request.url.path!r}")

    # -- rollouts --

    async def rollouts(self, request: Request) -> Response:
        status = request.query_params.get("status") or None
        task = request.query_params.get("task") or None
        if status not in (None, "running", "done", "failed", "cancelled"):
            return _error(400, f"status: {status!r} is not running, done, failed or cancelled")
        jobs = self.state.jobs.jobs()
        counts: dict[str, int] = {}
        rows = []
        for job in reversed(jobs):
            counts[job.status] = counts.get(job.status, 0) + 1
            if status not in (None, job.status) or (task and task not in job.task):
                continue
            view = job.view(with_result=False)
            s = job.summary
            rows.append(
                {
                    "rollout_id": job.rollout_id,
                    "task": job.task,
                    "status": job.status,
                    "progress": view.progress.model_dump(),
                    "started_at": view.started_at,
                    "elapsed_s": view.elapsed_s,
                    "harness": s.harness if s else None,
                    "reward": s.reward if s else None,
                    "tier": s.tier if s else None,
                    "ok": s.ok if s else None,
                    "error": s.error if s else None,
                    "stop_reason": s.stop_reason if s else None,
                    "counts": s.counts.model_dump() if s else None,
                    "has_document": s.has_document if s else False,
                }
            )
        return _json({"rollouts": rows, "counts": counts})

    def _stored(self, request: Request) -> StoredRollout | None:
        return self.state.store.get(request.path_params["rollout_id"])

    async def _view(self, rollout_id: str, document: RolloutDocument) -> dict[str, Any]:
        cached = self._views.get(rollout_id)
        if cached is not None and cached[0] is document:
            return cached[1]
        view = await anyio.to_thread.run_sync(document_view, document)
        self._views[rollout_id] = (document, view)
        while len(self._views) > 16:
            self._views.popitem(last=False)
        return view

    async def rollout(self, request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]
        job = self.state.jobs.get(rollout_id)
        stored = self.state.store.get(rollout_id)
        if job is None and stored is None:
            return _error(404, f"no rollout {rollout_id!r} on this server")
        summary = job.summary if job is not None else None
        if summary is None and stored is not None:
            from rollwire.tools.rollouts import summary_of

            summary = summary_of(
                stored.result, include_tokens=False, has_document=stored.document is not None
            )
        document = stored.document if stored is not None else None
        body = {
            "rollout_id": rollout_id,
            "task": job.task if job is not None else summary.task if summary else None,
            "status": job.status
            if job is not None
            else ("done" if summary.ok else "failed")
            if summary
            else None,
            "progress": job.progress.model_dump() if job is not None else None,
            "summary": summary.model_dump(mode="json", exclude={"sequences"}) if summary else None,
            "document_url": f"/ui/api/rollouts/{rollout_id}/document" if document else None,
            "document": await self._view(rollout_id, document) if document else None,
        }
        return await self._dumped(body)

    async def _dumped(self, body: Any) -> Response:
        data = await anyio.to_thread.run_sync(orjson.dumps, body)
        return Response(data, media_type="application/json")

    async def document(self, request: Request) -> Response:
        stored = self._stored(request)
        if stored is None or stored.document is None:
            return _error(404, "no rollout document with this id on this server")
        document = stored.document
        data = await anyio.to_thread.run_sync(
            lambda: orjson.dumps(document.model_dump(mode="json"))
        )
        return Response(data, media_type="application/json")

    async def turn(self, request: Request) -> Response:
        stored = self._stored(request)
        if stored is None or stored.document is None:
            return _error(404, "no rollout document with this id on this server")
        node_id = request.path_params["node_id"]
        for turn in stored.document.turns:
            if turn.node_id == node_id:
                return await self._dumped(turn_detail(turn))
        return _error(404, f"no turn {node_id!r} in this rollout")

    async def sequence(self, request: Request) -> Response:
        stored = self._stored(request)
        if stored is None or stored.document is None:
            return _error(404, "no rollout document with this id on this server")
        sequence_id = request.path_params["sequence_id"]
        document = stored.document
        for seq in document.sequences:
            if seq.sequence_id == sequence_id:
                return await self._dumped(sequence_tokens(document, seq))
        return _error(404, f"no sequence {sequence_id!r} in this rollout")

    async def token_pieces(self, request: Request) -> Response:
        stored = self._stored(request)
        if stored is None:
            return _error(404, "no rollout with this id on this server")
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return _error(400, 'body: not JSON; send {"ids": [token ids]}')
        ids = body.get("ids") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
        ):
            return _error(400, "ids: a list of token ids (integers >= 0)")
        distinct = list(dict.fromkeys(ids))
        if len(distinct) > bounds.MAX_UI_PIECES:
            return _error(
                400, f"ids: {len(distinct)} distinct ids; at most {bounds.MAX_UI_PIECES} at once"
            )
        llm = stored.llm
        endpoint = None
        if llm is not None:
            endpoint = next(
                (
                    e
                    for e in self.state.pool.endpoints()
                    if e.proxy.config.llm_url == llm.url
                    and e.certification.model is not None
                    and llm.model in (None, e.certification.model)
                ),
                None,
            )
        if endpoint is None or endpoint.certification.model is None:
            return _json({"pieces": {}, "error": "no engine of this rollout is connected"})
        model = endpoint.certification.model
        upstream = endpoint.upstream
        found, error = await self.pieces.pieces(
            (llm.url if llm else "", model),
            distinct,
            lambda tokens: upstream.detokenize(model, tokens),
        )
        return _json({"pieces": {str(k): v for k, v in found.items()}, "error": error})

    # -- collections --

    async def collections(self, request: Request) -> Response:
        data_dir = self.state.data_dir

        def rows() -> list[dict[str, Any]]:
            out = []
            for name, path in find_collections(data_dir):
                row = collection_row(name, path)
                if row is not None:
                    out.append(row)
            return out

        found = await anyio.to_thread.run_sync(rows)
        return _json({"data_dir": str(data_dir.resolve()), "collections": found})

    async def collection(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            path = self.state.roots.collection("name", name)
        except OutsideRoots as exc:
            return _error(400, str(exc))
        view = await anyio.to_thread.run_sync(collection_view, name, path)
        if view is None:
            return _error(404, f"{name!r} holds no collection (no manifest.json)")
        view["data_dir"] = str(self.state.data_dir.resolve())
        return _json(view)

    # -- evals --

    async def eval(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            path = self.state.roots.collection("name", name)
        except OutsideRoots as exc:
            return _error(400, str(exc))
        try:
            view = await anyio.to_thread.run_sync(eval_view, name, path)
        except NotAnEval as exc:
            return _error(404, str(exc))
        except UnreadableEval as exc:
            return _error(422, str(exc))
        view["data_dir"] = str(self.state.data_dir.resolve())
        return _json(view)

    async def compare_evals(self, request: Request) -> Response:
        """``?a=NAME&b=NAME``: B minus A. Two evals that do not pair are a 409 saying what
        differs (other tasks, problems, samples per problem or pass threshold)."""
        runs: list[tuple[str, Path]] = []
        for field in ("a", "b"):
            name = request.query_params.get(field) or ""
            if not name:
                return _error(400, f"{field}: name an eval folder (?a=NAME&b=NAME)")
            try:
                runs.append((name, self.state.roots.collection(field, name)))
            except OutsideRoots as exc:
                return _error(400, str(exc))
        try:
            view = await anyio.to_thread.run_sync(comparison_view, runs[0], runs[1])
        except NotAnEval as exc:
            return _error(404, str(exc))
        except UnreadableEval as exc:
            return _error(422, str(exc))
        except ValueError as exc:  # EvalMismatch, or a k above some problem's samples
            return _error(409, f"these evals do not pair: {exc}")
        return _json(view)

    # -- capture sessions --

    async def sessions(self, request: Request) -> Response:
        rows = []
        for endpoint in self.state.pool.endpoints():
            for session in endpoint.proxy.sessions.all():
                summary = session.summary()
                summary["session"] = masked_session(summary.pop("session_id"))
                summary["endpoint"] = endpoint.proxy.config.llm_url
                rows.append(summary)
        return _json({"sessions": rows})


def ui_app(state: ServerState, *, token: str | None, loopback: bool) -> UI:
    """The ASGI app to mount at ``/ui``."""
    return UI(state, token=token, loopback=loopback)
