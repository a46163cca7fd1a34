"""A collection as a supervised fine-tuning dataset that TRL's ``SFTTrainer`` trains on as-is.

One row per kept episode (``--min-reward`` keeps those at or above it; an episode whose verifier
never ran has no reward and is not kept then), in the columns TRL 1.x's ``SFTTrainer`` reads
(checked against ``trl/trainer/sft_trainer.py``, ``_prepare_dataset``):

- ``messages``: the conversation in the conversational format (system, user, assistant turns
  with ``tool_calls`` whose ``arguments`` are objects, as chat templates expect, and ``tool``
  results), and ``tools``: the tools the agent was offered (OpenAI function format; null when
  none). TRL renders them with the student's chat template (``tools=`` included).
- For a token-tier collection also ``input_ids`` and ``assistant_masks``: the episode's captured
  training sequence verbatim (the exact ids the engine saw and produced; the mask is the
  capture's loss mask: 1 on sampled tokens). With an ``input_ids`` column TRL skips its own
  tokenisation and trains on these ids, masking with ``assistant_masks``: rejection-sampling
  fine-tuning on the model's own samples. Those ids are the collecting engine's: drop them
  (``messages_only``) to fine-tune a different model on the same conversations. An episode
  whose conversation split into several training sequences (see ``RolloutStats.retokenized``)
  cannot be one row of ids and is skipped, counted as ``fragmented``.
- ``episode_id``, ``group_id``, ``task``, ``seed``, ``reward``: where each row came from (TRL
  drops columns its model does not take).

The split is by task instance, never by row: every episode of one ``(task, seed)`` goes to the
same split, chosen by a hash of the pair (``split_of``), so no instance is in both and a growing
collection never moves an instance from one split to the other. ``split.json`` records the rule,
the fraction and the instances of each split. ``messages`` and ``tools`` use ``datasets``'
``Json`` feature, which keeps every message exactly as written (no keys merged across rows, no
nulls added), and the ``README.md`` card names the splits, so ``datasets.load_dataset(OUT)``
gives ``train`` (and ``eval`` when it has rows).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, Field

from rollwire.capture.dialects.hermes import template_arguments
from rollwire.capture.export import Role
from rollwire.capture.rollout import RolloutType
from rollwire.datasets.export import ExportError, iter_episodes
from rollwire.datasets.records import EpisodeRecord, SequenceRow, canonical_json
from rollwire.writes import writing

DEFAULT_SFT_DIR = "sft"
SPLIT_FILE = "split.json"
SPLITS = ("train", "eval")
DEFAULT_EVAL_FRACTION = 0.1
SPLIT_RULE = (
    "an instance (task, seed) is in eval when int(sha256(canonical_json([task, seed]))[:8], 16) "
    "/ 2**32 < eval_fraction, else in train"
)

Split = Literal["train", "eval"]


class SftExportResult(BaseModel):
    """What an SFT export wrote (paths relative to ``out_dir``) and what it left out, by reason."""

    out_dir: str
    files: list[str]
    rows: dict[str, int] = Field(description="rows per split")
    token_columns: bool = Field(description="input_ids and assistant_masks were written")
    skipped: dict[str, int] = Field(
        default_factory=dict,
        description="episodes not exported: below_min_reward, no_conversation, fragmented",
    )
    eval_fraction: float


def split_of(task: str, seed: int | None, eval_fraction: float) -> Split:
    """The split of one task instance (pure, and stable: it depends on nothing else)."""
    digest = hashlib.sha256(canonical_json([task, seed]).encode()).hexdigest()
    return "eval" if int(digest[:8], 16) / 2**32 < eval_fraction else "train"


def training_sequence(record: EpisodeRecord) -> SequenceRow | None:
    """The episode's one trainable agent sequence, or None when it has none or several."""
    found = [s for s in record.sequences if s.role is Role.AGENT and s.trainable]
    return found[0] if len(found) == 1 else None


def sft_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates (and TRL) read them: tool-call arguments as objects (see
    ``hermes.template_arguments``: rendered by the chat template of ``rollwire convert``, they
    give the very text the engine saw)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        m = dict(message)
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {
                    **call,
                    "function": {
                        **(call.get("function") or {}),
                        "arguments": template_arguments(
                            (call.get("function") or {}).get("arguments")
                        ),
                    },
                }
                for call in m["tool_calls"]
            ]
        out.append(m)
    return out


def sft_row(record: EpisodeRecord, *, token_columns: bool) -> dict[str, Any] | str:
    """One episode as an SFT row, or the reason it cannot be one (pure)."""
    row: dict[str, Any] = {
        "messages": sft_messages(record.messages) if record.messages else None,
        "tools": record.tools,
    }
    if token_columns:
        seq = training_sequence(record)
        if seq is None:
            return "fragmented"
        row["input_ids"] = list(seq.input_ids)
        row["assistant_masks"] = [int(m) for m in seq.loss_mask]
    elif row["messages"] is None:
        return "no_conversation"
    row |= {
        "episode_id": record.episode_id,
        "group_id": record.group_id,
        "task": record.task,
        "seed": record.seed,
        "reward": record.reward,
        "weight_versions": list(record.weight_versions),
    }
    return row


def sft_features(token_columns: bool) -> Any:
    """The ``datasets`` features of an SFT export."""
    from datasets import Features, Json, List, Value

    columns: dict[str, Any] = {"messages": List(Json()), "tools": List(Json())}
    if token_columns:
        columns |= {"input_ids": List(Value("int64")), "assistant_masks": List(Value("int64"))}
    columns |= {
        "episode_id": Value("string"),
        "group_id": Value("string"),
        "task": Value("string"),
        "seed": Value("int64"),
        "reward": Value("float64"),
        "weight_versions": List(Value("string")),
    }
    return Features(columns)


def _card(splits: list[str], result: SftExportResult) -> str:
    files = "\n".join(f"  - split: {s}\n    path: {s}-*.parquet" for s in splits)
    columns = "`messages`, `tools`" + (
        ", `input_ids`, `assistant_masks`" if result.token_columns else ""
    )
    return (
        "---\nconfigs:\n- config_name: default\n  data_files:\n"
        f"{files}\n---\n"
        "# SFT export of a rollwire collection\n\n"
        f"Rows: {', '.join(f'{s} {result.rows[s]}' for s in splits)}. Columns {columns} are "
        "what TRL's `SFTTrainer` reads; `episode_id`, `group_id`, `task`, `seed` and `reward` "
        "say where each row came from.\n\n"
        f"The split is by task instance: {SPLIT_RULE} (eval_fraction {result.eval_fraction}); "
        f"`{SPLIT_FILE}` lists the instances of each split.\n"
    )


def export_sft(
    collection_dir: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    *,
    min_reward: float | None = None,
    eval_fraction: float = DEFAULT_EVAL_FRACTION,
    messages_only: bool = False,
) -> SftExportResult:
    """Write the SFT dataset of a collection to ``out`` (default ``<collection_dir>/sft``).

    Token columns are written when every kept episode is token-tier (train) and
    ``messages_only`` is off. The files are built beside ``out`` and moved in at the end,
    replacing an earlier SFT export there; a failed export leaves the earlier one as it was.
    Raises :class:`ExportError` when nothing is left to export.
    """
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    import datasets

    src = Path(collection_dir)
    dest = Path(out) if out is not None else src / DEFAULT_SFT_DIR
    skipped = {"below_min_reward": 0, "no_conversation": 0, "fragmented": 0}

    # First pass: which episodes are kept, their split and tier (a few values per episode).
    plan: list[tuple[Split, RolloutType, bool, bool] | None] = []
    for record in iter_episodes(src):
        if min_reward is not None and (record.reward is None or record.reward < min_reward):
            skipped["below_min_reward"] += 1
            plan.append(None)
            continue
        split = split_of(record.task, record.seed, eval_fraction)
        one = training_sequence(record) is not None
        plan.append((split, record.rollout_type, bool(record.messages), one))
    tiers = {entry[1] for entry in plan if entry is not None}
    token_columns = not messages_only and tiers == {RolloutType.TRAIN}
    rows: dict[Split, int] = {"train": 0, "eval": 0}
    for entry in plan:
        if entry is None:
            continue
        split, _, has_messages, one = entry
        if token_columns and not one:
            skipped["fragmented"] += 1
        elif not token_columns and not has_messages:
            skipped["no_conversation"] += 1
        else:
            rows[split] += 1
    groups: dict[Split, set[tuple[str, int | None]]] = {"train": set(), "eval": set()}

    def split_rows(split: Split) -> Iterator[dict[str, Any]]:
        # Only the episodes the first pass saw (a running collection may have appended since).
        for record, entry in zip(islice(iter_episodes(src), len(plan)), plan, strict=True):
            if entry is None or entry[0] != split:
                continue
            row = sft_row(record, token_columns=token_columns)
            if isinstance(row, str):
                continue  # counted in the first pass
            groups[split].add((record.task, record.seed))
            yield row

    with writing(dest):  # a full or read-only disk: the error names the dataset's folder
        dest.parent.mkdir(parents=True, exist_ok=True)
        prefix = f".sft-{dest.name}-"
        for stale in dest.parent.glob(prefix + "*"):  # left by an export a read-only disk stopped
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=prefix, dir=dest.parent))
        try:
            features = sft_features(token_columns)
            written: list[str] = []
            if not rows["train"] and not rows["eval"]:
                raise ExportError(
                    f"{src}: no episode to export ({skipped['below_min_reward']} below min_reward "
                    f"{min_reward}, {skipped['no_conversation']} without a recorded conversation, "
                    f"{skipped['fragmented']} fragmented)"
                )
            for split in SPLITS:
                if not rows[split]:
                    continue  # an empty split is not written
                name = f"{split}-00000-of-00001.parquet"
                with _quiet(datasets):
                    datasets.Dataset.from_generator(
                        split_rows,
                        gen_kwargs={"split": split},
                        features=features,
                        cache_dir=str(staging / ".cache"),
                    ).to_parquet(str(staging / name))
                written.append(name)
            result = SftExportResult(
                out_dir=str(dest),
                files=[*written, SPLIT_FILE, "README.md"],
                rows=dict(rows),
                token_columns=token_columns,
                skipped=skipped,
                eval_fraction=eval_fraction,
            )
            record = {
                "rule": SPLIT_RULE,
                "eval_fraction": eval_fraction,
                "min_reward": min_reward,
                "token_columns": token_columns,
                "skipped": skipped,
                **{
                    split: {"rows": rows[split], "instances": sorted(groups[split], key=_order)}
                    for split in SPLITS
                },
            }
            (staging / SPLIT_FILE).write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2))
            (staging / "README.md").write_text(
                _card([s for s in SPLITS if rows[s]], result), encoding="utf-8"
            )
            shutil.rmtree(staging / ".cache", ignore_errors=True)
            dest.mkdir(parents=True, exist_ok=True)
            for old in [*dest.glob("train-*.parquet"), *dest.glob("eval-*.parquet")]:
                old.unlink()
            for name in result.files:
                os.replace(staging / name, dest / name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # a read-only disk keeps it: see above
        return result


@contextlib.contextmanager
def _quiet(datasets: Any) -> Iterator[None]:
    """No ``datasets`` progress bars while exporting (restored afterwards)."""
    was_off = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_off:
            datasets.enable_progress_bars()


def _order(instance: tuple[str, int | None]) -> tuple[str, int]:
    task, seed = instance
    return task, -1 if seed is None else seed
