"""Publish a collection to the Hugging Face Hub as a dataset repository, in one commit.

What is sent: ``README.md`` (a dataset card whose YAML ``configs`` make
``load_dataset(repo_id)`` load the episodes as the ``train`` split from
``data/train-*.parquet``), the Parquet shards, and ``manifest.json`` (config redacted), plus
``failures.jsonl`` when asked. ``dry_run=True`` builds all of it locally and sends nothing.

Endpoint: the ``endpoint`` argument, else ``HF_ENDPOINT`` read at call time (``huggingface_hub``
reads it once, at import, into ``constants.ENDPOINT``; this module passes the endpoint to
``HfApi`` explicitly so a later change of the variable is honoured), else the library default.
Token: the ``token`` argument, else ``huggingface_hub.get_token()`` (``HF_TOKEN``, then the
saved login). The token goes only into the ``Authorization`` header: it is never logged, never in
a plan, a result or an error message.

``huggingface_hub`` and ``pyarrow`` come with the ``rollwire[datasets]`` extra and are imported
only when called.
"""

from __future__ import annotations

import math
import os
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio.to_thread
import orjson
from pydantic import BaseModel

from rollwire.datasets.export import COLUMNS, DEFAULT_DATA_DIR, PARQUET_PREFIX, export_collection
from rollwire.datasets.stats import RunningStats
from rollwire.datasets.store import FAILURES_FILE, Manifest, read_manifest

PARQUET_GLOB = f"{DEFAULT_DATA_DIR}/{PARQUET_PREFIX}-*.parquet"
REDACTED = "<redacted>"
_SECRET_KEY = re.compile(
    r"(api[_-]?key|token|secret|password|passwd|authorization|credential)", re.I
)


class HubError(Exception):
    """Publishing failed; the message names the problem (never the token)."""


class HubAuthError(HubError):
    """No token, or the Hub refused it (401/403)."""


class HubConflictError(HubError):
    """The Hub reported a conflict (409/412): e.g. the name is taken by another repo type, or
    the branch moved during the commit."""


class PlannedFile(BaseModel):
    path_in_repo: str
    size: int


class PushPlan(BaseModel):
    """Exactly what a push sends (the file contents aside): a dry run returns this."""

    endpoint: str
    repo_id: str
    repo_type: str = "dataset"
    private: bool
    commit_message: str
    files: list[PlannedFile]
    card: str
    n_rows: int
    token_found: bool

    def describe(self) -> str:
        """The plan as text for a person (no token, ever)."""
        lines = [
            f"repo: {self.endpoint}/datasets/{self.repo_id} "
            f"({'private' if self.private else 'public'})",
            f"commit message: {self.commit_message}",
            f"token: {'found' if self.token_found else 'NOT FOUND (set HF_TOKEN)'}",
            f"episodes: {self.n_rows}",
            "files:",
            *(f"  {f.path_in_repo}  {f.size} bytes" for f in self.files),
            "card:",
            self.card,
        ]
        return "\n".join(lines)


class PushResult(BaseModel):
    """A push's outcome: ``sent`` is False for a dry run (and the URLs are None)."""

    plan: PushPlan
    sent: bool
    repo_url: str | None = None
    commit_url: str | None = None
    commit_oid: str | None = None


class HistogramBin(BaseModel):
    label: str
    low: float
    high: float
    count: int


# --------------------------------------------------------------------------------------------
# Pure pieces: redaction, histogram, card


def redact(value: Any) -> Any:
    """A copy of ``value`` with the values of secret-looking keys (api_key, token, password...)
    replaced, at any depth. The published card and manifest carry only this."""
    if isinstance(value, Mapping):
        return {
            k: (REDACTED if _SECRET_KEY.search(str(k)) and v is not None else redact(v))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return value


def reward_histogram(rewards: Sequence[float], *, bins: int = 10) -> list[HistogramBin]:
    """A small histogram: one row per distinct value when there are at most ``bins`` of them
    (rewards are often 0/1), else ``bins`` equal-width bins over [min, max]."""
    import numpy as np

    values = np.asarray(rewards, dtype=np.float64)
    if values.size == 0:
        return []
    distinct, counts = np.unique(values, return_counts=True)
    if distinct.size <= bins:
        return [
            HistogramBin(label=f"{v:g}", low=float(v), high=float(v), count=int(c))
            for v, c in zip(distinct, counts, strict=True)
        ]
    counts, edges = np.histogram(values, bins=bins)
    out = []
    for i, c in enumerate(counts):
        lo, hi = float(edges[i]), float(edges[i + 1])
        closing = "]" if i == bins - 1 else ")"
        out.append(
            HistogramBin(label=f"[{lo:.4g}, {hi:.4g}{closing}", low=lo, high=hi, count=int(c))
        )
    return out


def _size_category(n: int) -> str:
    bounds = [(1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K")]
    bounds += [(1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M")]
    for limit, label in bounds:
        if n < limit:
            return label
    return "n>1T" if n > 10**12 else "100M<n<1B" if n < 10**9 else "1B<n<10B"


def _cell(value: Any) -> str:
    text = "—" if value is None else (f"{value:.4g}" if isinstance(value, float) else str(value))
    return text.replace("|", "\\|").replace("\n", " ")


def _fenced(text: str, lang: str = "") -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text}\n{fence}"


def _yaml_str(text: str) -> str:
    return orjson.dumps(text).decode()  # a JSON string is a valid YAML double-quoted scalar


def render_card(
    manifest: Manifest,
    *,
    repo_id: str,
    n_rows: int,
    rewards: Sequence[float],
    pretty_name: str | None = None,
) -> str:
    """The dataset card (README.md): YAML front matter with the ``train`` config, then the
    collection's config (redacted), model, counts, reward distribution and schema.

    ``rewards`` are the non-null rewards of the ``n_rows`` published rows: the card's reward
    numbers describe exactly what is published, even if the manifest lags a live collection.
    """
    stats = RunningStats()
    for value in rewards:
        stats.update(value)
    r = stats.summary()
    histogram = reward_histogram(rewards)
    name = pretty_name or repo_id.split("/")[-1]
    front = "\n".join(
        [
            "---",
            f"pretty_name: {_yaml_str(name)}",
            "tags:",
            "- rollwire",
            "- reinforcement-learning",
            "- agent-rollouts",
            "size_categories:",
            f"- {_size_category(n_rows)}",
            "configs:",
            "- config_name: default",
            "  data_files:",
            "  - split: train",
            f"    path: {_yaml_str(PARQUET_GLOB)}",
            "---",
        ]
    )
    c = manifest.counts
    body = [
        f"# {name}",
        "",
        "Agent rollouts collected with [rollwire](https://pypi.org/project/rollwire/): each row is "
        "one episode with its reward and, for `train` rollouts, the engine's own token ids, loss "
        "mask and logprobs per training sequence.",
        "",
        "```python",
        "from datasets import load_dataset",
        "",
        f'episodes = load_dataset("{repo_id}", split="train")',
        "```",
        "",
        "## Collection",
        "",
        "| | |",
        "|---|---|",
        f"| model | {_cell(manifest.model)} |",
        f"| engine tier | {_cell(manifest.engine_tier)} |",
        f"| fingerprint | `{manifest.fingerprint}` |",
        f"| rollwire | {_cell(manifest.rollwire_version)} |",
        f"| created | {_cell(manifest.created_at)} |",
        f"| updated | {_cell(manifest.updated_at)} |",
        "",
        "## Counts",
        "",
        "| episodes (rows) | filtered out | failed | trainable tokens |",
        "|---|---|---|---|",
        f"| {n_rows} | {c.filtered} | {c.failed} | {manifest.trainable_tokens} |",
        "",
        "## Reward",
        "",
        "| count | mean | std | min | max | no reward (verifier never ran) |",
        "|---|---|---|---|---|---|",
        f"| {r.count} | {_cell(r.mean)} | {_cell(r.std)} | {_cell(r.min)} | {_cell(r.max)} "
        f"| {n_rows - r.count} |",
        "",
    ]
    if histogram:
        peak = max(b.count for b in histogram) or 1
        body += ["| reward | episodes | |", "|---|---|---|"]
        for b in histogram:
            bar = "█" * math.ceil(20 * b.count / peak) if b.count else ""
            body.append(f"| {_cell(b.label)} | {b.count} | {bar} |")
        body.append("")
    config_json = orjson.dumps(
        redact(manifest.config), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
    ).decode()
    body += ["## Config", "", _fenced(config_json, "json"), "", "## Schema", ""]
    body += ["| column | type | meaning |", "|---|---|---|"]
    body += [f"| `{col}` | {kind} | {_cell(doc)} |" for col, (kind, doc) in COLUMNS.items()]
    body += [
        "",
        "`rewards`, `findings`, `messages` and `timings` are JSON text (`json.loads` them).",
        "",
    ]
    return front + "\n\n" + "\n".join(body)


# --------------------------------------------------------------------------------------------
# Endpoint, token, errors


def resolve_endpoint(endpoint: str | None = None) -> str:
    """The Hub endpoint: the argument, else ``HF_ENDPOINT`` now, else huggingface_hub's."""
    if endpoint:
        return endpoint.rstrip("/")
    env = os.environ.get("HF_ENDPOINT")
    if env:
        return env.rstrip("/")
    from huggingface_hub import constants

    return constants.ENDPOINT.rstrip("/")


def _resolve_token(token: str | None) -> str | None:
    if token:
        return token
    from huggingface_hub import get_token

    return get_token()


def _scrub(text: str, token: str | None) -> str:
    return text.replace(token, "***") if token else text


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection-level errors of whichever HTTP library this huggingface_hub uses (requests
    before 1.0, httpx or httpx2 after): only a library already imported can have raised."""
    types: list[type[BaseException]] = [OSError]
    for module, name in (
        ("httpx", "HTTPError"),
        ("httpx2", "HTTPError"),
        ("requests", "RequestException"),
    ):
        error = getattr(sys.modules.get(module), name, None)
        if isinstance(error, type) and issubclass(error, BaseException):
            types.append(error)
    return tuple(types)


def _hub_error(
    exc: BaseException, *, action: str, repo_id: str, endpoint: str, token: str | None
) -> HubError:
    from huggingface_hub.utils import HfHubHTTPError

    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        server = _scrub(getattr(exc, "server_message", None) or "", token)
        detail = f": {server}" if server else ""
        where = f"{endpoint} ({action} {repo_id})"
        if status in (401, 403):
            return HubAuthError(
                f"the Hub refused the token ({status}) at {where}: it needs write access to "
                f"the namespace of {repo_id}{detail}"
            )
        if status in (409, 412):
            return HubConflictError(f"the Hub reported a conflict ({status}) at {where}{detail}")
        if status == 404:
            return HubError(f"not found (404) at {where}: check the repo id{detail}")
        return HubError(f"the Hub answered {status} at {where}{detail}")
    if isinstance(exc, ValueError):
        return HubError(f"{action} {repo_id} was refused: {_scrub(str(exc), token)}")
    return HubError(
        f"cannot reach the Hub at {endpoint} ({action} {repo_id}): "
        f"{type(exc).__name__}: {_scrub(str(exc), token)}"
    )


# --------------------------------------------------------------------------------------------
# Push


def _plan_files(
    collection_dir: Path, staging: Path, manifest: Manifest, card: str, include_failures: bool
) -> list[tuple[str, Path]]:
    files: list[tuple[str, Path]] = []
    (staging / "README.md").write_text(card, encoding="utf-8")
    files.append(("README.md", staging / "README.md"))
    published = manifest.model_copy(update={"config": redact(manifest.config)})
    (staging / "manifest.json").write_bytes(
        published.model_dump_json(by_alias=True, indent=2).encode() + b"\n"
    )
    files.append(("manifest.json", staging / "manifest.json"))
    for shard in sorted((staging / DEFAULT_DATA_DIR).glob(f"{PARQUET_PREFIX}-*.parquet")):
        files.append((f"{DEFAULT_DATA_DIR}/{shard.name}", shard))
    failures = collection_dir / FAILURES_FILE
    if include_failures and failures.exists() and failures.stat().st_size > 0:
        files.append((FAILURES_FILE, failures))
    return files


def push_collection(
    collection_dir: str | os.PathLike[str],
    repo_id: str,
    *,
    private: bool = True,
    token: str | None = None,
    endpoint: str | None = None,
    commit_message: str | None = None,
    pretty_name: str | None = None,
    include_failures: bool = False,
    dry_run: bool = False,
    rows_per_shard: int = 50_000,
) -> PushResult:
    """Push a collection directory to the dataset repo ``repo_id`` in one commit.

    Creates the repo if needed (``private`` applies only then: the Hub keeps an existing repo's
    visibility), exports the episodes to Parquet in a temporary folder, and commits the card,
    the shards and the manifest. With ``dry_run`` nothing is sent and no token is needed: the
    result's ``plan`` says what would be. Raises ``HubAuthError`` (no token, 401/403),
    ``HubConflictError`` (409/412) or ``HubError``.
    """
    src = Path(collection_dir)
    manifest = read_manifest(src)
    if manifest is None:
        raise HubError(f"{src} has no manifest.json: it is not a rollwire collection")
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise HubError(f"repo_id {repo_id!r} must be 'namespace/name'")
    url = resolve_endpoint(endpoint)
    resolved_token = _resolve_token(token)
    import numpy as np
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="rollwire-push-") as tmp:
        staging = Path(tmp)
        exported = export_collection(
            src, staging / DEFAULT_DATA_DIR, jsonl=False, rows_per_shard=rows_per_shard
        )
        shard_paths = [staging / DEFAULT_DATA_DIR / name for name in exported.parquet_files]
        rewards = np.concatenate(
            [
                pq.read_table(shard, columns=["reward"]).column("reward").drop_null().to_numpy()
                for shard in shard_paths
            ]
        )
        card = render_card(
            manifest,
            repo_id=repo_id,
            n_rows=exported.n_rows,
            rewards=rewards.tolist(),
            pretty_name=pretty_name,
        )
        files = _plan_files(src, staging, manifest, card, include_failures)
        message = commit_message or (
            f"rollwire collection {manifest.fingerprint}: {exported.n_rows} episodes"
            + (f" of {manifest.model}" if manifest.model else "")
        )
        plan = PushPlan(
            endpoint=url,
            repo_id=repo_id,
            private=private,
            commit_message=message,
            files=[PlannedFile(path_in_repo=p, size=f.stat().st_size) for p, f in files],
            card=card,
            n_rows=exported.n_rows,
            token_found=resolved_token is not None,
        )
        if dry_run:
            return PushResult(plan=plan, sent=False)
        if resolved_token is None:
            raise HubAuthError(
                "no Hugging Face token: set HF_TOKEN, run `hf auth login`, or pass token="
            )
        return _send(plan, files, resolved_token)


def _send(plan: PushPlan, files: list[tuple[str, Path]], token: str) -> PushResult:
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.utils import HfHubHTTPError

    api = HfApi(endpoint=plan.endpoint, token=token)
    caught = (HfHubHTTPError, ValueError, *_transport_errors())
    action = "creating"
    try:
        repo_url = api.create_repo(
            plan.repo_id, repo_type="dataset", private=plan.private, exist_ok=True
        )
        action = "committing to"
        info = api.create_commit(
            plan.repo_id,
            [CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(f)) for p, f in files],
            commit_message=plan.commit_message,
            repo_type="dataset",
        )
    except caught as exc:
        raise _hub_error(
            exc, action=action, repo_id=plan.repo_id, endpoint=plan.endpoint, token=token
        ) from exc
    return PushResult(
        plan=plan,
        sent=True,
        repo_url=str(repo_url),
        commit_url=info.commit_url,
        commit_oid=info.oid,
    )


async def apush_collection(
    collection_dir: str | os.PathLike[str], repo_id: str, **kwargs: Any
) -> PushResult:
    """``push_collection`` in a worker thread (export and upload block)."""
    return await anyio.to_thread.run_sync(
        lambda: push_collection(collection_dir, repo_id, **kwargs)
    )
