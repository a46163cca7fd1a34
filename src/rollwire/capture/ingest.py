"""Checks on every upstream reply, on ingest, before anything becomes a node.

Pure functions over the parsed reply: ids and logprobs arrive on two channels joined by index,
and equal length is not alignment, so every position is compared. A turn whose logprobs fail
keeps its ids (they are context for later turns) and is masked; it never ships zero-filled
logprobs that a trainer would read as p=1.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from rollwire.capture.findings import Finding, fatal, info, warn
from rollwire.capture.rollout import CaptureLevel, TopCandidates, Turn, ids_array

_TOKEN_ID_PREFIX = "token_id:"


@dataclass(frozen=True)
class Ingested:
    """The outcome of ingesting one reply: a turn, or no turn and the reason why."""

    turn: Turn | None
    findings: list[Finding]


def engine_ids(value: Any) -> np.ndarray | None:
    """Engine token ids as an array, or None unless ``value`` is a list of non-negative ints.

    ``.get(key, default)`` gives None for a present null, and bools and floats are not ids:
    ``ids_array`` checks the types and converts in one C-level pass, the sign is checked on
    the array (per-id Python work on a 128k-id prompt dominated ingest: bench/README.md,
    graph_ingest).
    """
    if not isinstance(value, list):
        return None
    arr = ids_array(value)
    if arr is None or (len(arr) and arr.min() < 0):
        return None
    return arr


@dataclass(frozen=True)
class CheckedLogprobs:
    """Per-position logprobs that passed every check (None when any failed), and which
    positions are certain: logprob exactly 0.0, i.e. forced by constrained decoding."""

    values: np.ndarray | None
    certain: np.ndarray | None
    findings: list[Finding]
    # Per position, the engine's top candidates, when the reply carried them with ids
    # (``token_id:N``); None when it carried none, or any could not be read.
    top: TopCandidates | None = None


def _masked(code: str, message: str, node_id: str) -> CheckedLogprobs:
    return CheckedLogprobs(None, None, [warn(code, message, node_id)])


def top_candidates(content: list[Any]) -> TopCandidates | None:
    """The ``top_logprobs`` of each entry, by id; None when no entry has any or any candidate
    does not name its token by id (for inspection only: never trained on)."""
    fast = _top_candidates_fast(content)
    return fast if fast is not _SLOW else _top_candidates_slow(content)


_SLOW: Any = object()  # "the fast path cannot decide": the per-entry reading decides
# ``token_id:N`` lines, N short enough for int64 (a longer one takes the per-entry reading).
_TOKEN_ID_LINES = re.compile(r"token_id:[0-9]{1,18}(?:\ntoken_id:[0-9]{1,18})*")


def _ids_named(tokens: list[Any]) -> np.ndarray | None:
    """The N of every ``token_id:N`` in ``tokens`` in C-level passes; None unless every one is
    a string of exactly that form."""
    if not tokens:
        return np.empty(0, dtype=np.int64)
    try:
        joined = "\n".join(tokens)
    except TypeError:  # a non-string
        return None
    if not _TOKEN_ID_LINES.fullmatch(joined):
        return None
    ids = np.fromstring(joined.replace(_TOKEN_ID_PREFIX, ""), dtype=np.int64, sep="\n")
    return ids if len(ids) == len(tokens) else None


def _float_array(values: list[Any]) -> np.ndarray | None:
    """``values`` as float64 when every one is a finite float; else None."""
    if values and set(map(type, values)) != {float}:
        return None
    arr = np.array(values, dtype=np.float64)
    return arr if np.isfinite(arr).all() else None


def _top_candidates_fast(content: list[Any]) -> Any:
    """Every candidate of the common shape (dicts named ``token_id:N`` with finite float
    logprobs) read in a few C-level passes; ``_SLOW`` for anything else."""
    try:
        rows = [entry.get("top_logprobs") or () for entry in content]
        counts = list(map(len, rows))
        cands = [cand for row in rows for cand in row]
        tokens = [cand["token"] for cand in cands]
        lps = [cand["logprob"] for cand in cands]
    except (AttributeError, TypeError, KeyError):
        return _SLOW
    if not cands:
        return None
    ids, values = _ids_named(tokens), _float_array(lps)
    if ids is None or values is None:
        return _SLOW
    return TopCandidates.from_counts(counts, ids, values)


def _top_candidates_slow(content: list[Any]) -> TopCandidates | None:
    ids: list[int] = []
    lps: list[float] = []
    counts: list[int] = []
    for entry in content:
        tops = entry.get("top_logprobs") if isinstance(entry, dict) else None
        n = 0
        for cand in tops or ():
            token = cand.get("token") if isinstance(cand, dict) else None
            lp = cand.get("logprob") if isinstance(cand, dict) else None
            if not (isinstance(token, str) and token.startswith(_TOKEN_ID_PREFIX)):
                return None
            if isinstance(lp, bool) or not isinstance(lp, int | float) or not math.isfinite(lp):
                return None
            try:
                ids.append(int(token[len(_TOKEN_ID_PREFIX) :]))
            except ValueError:
                return None
            lps.append(float(lp))
            n += 1
        counts.append(n)
    if not ids:
        return None
    return TopCandidates.from_counts(counts, ids, lps)


def check_logprobs(
    sampled_ids: list[int] | np.ndarray, content: Any, node_id: str
) -> CheckedLogprobs:
    """Per-position checks of ``choices[0].logprobs.content`` against the sampled ids."""
    if content is None:
        return _masked("missing_logprobs", "the engine returned no logprobs: turn masked", node_id)
    if not isinstance(content, list):
        msg = f"logprobs.content is {type(content).__name__}, not a list: turn masked"
        return _masked("logprobs_malformed", msg, node_id)
    if len(content) != len(sampled_ids):
        msg = (
            f"{len(content)} logprob entries for {len(sampled_ids)} sampled ids: "
            "turn masked (ids kept as context)"
        )
        return _masked("logprob_length_mismatch", msg, node_id)
    values = _checked_values_fast(sampled_ids, content)
    if values is None:
        values = _checked_values_slow(sampled_ids, content, node_id)
        if isinstance(values, CheckedLogprobs):
            return values
    values.flags.writeable = False
    # Exactly 0.0 is a forced step (vLLM shows grammar-masked alternatives at -9999.0): no
    # policy information, and a trainer re-scoring without the grammar would disagree.
    certain = values == 0.0
    certain.flags.writeable = False
    findings: list[Finding] = []
    if certain.any():
        msg = (
            f"{int(certain.sum())} of {len(sampled_ids)} tokens have logprob 0.0 (forced by "
            "constrained decoding): masked, they carry no policy information"
        )
        findings.append(info("constrained_positions", msg, node_id))
    return CheckedLogprobs(values, certain, findings, top_candidates(content))


def _checked_values_fast(sampled_ids: Any, content: list[Any]) -> np.ndarray | None:
    """The logprobs when every entry has the common shape and passes (``token_id:N`` naming
    exactly the sampled id, a finite float <= 0), in C-level passes; None when any entry
    needs the per-entry reading (which then names what is wrong)."""
    try:
        tokens = [entry["token"] for entry in content]
        lps = [entry["logprob"] for entry in content]
    except (TypeError, KeyError):
        return None
    named = _ids_named(tokens)
    if named is None or not np.array_equal(named, sampled_ids):
        return None
    values = _float_array(lps)
    if values is None or not (values <= 0).all():
        return None
    return values


def _checked_values_slow(
    sampled_ids: list[int], content: list[Any], node_id: str
) -> np.ndarray | CheckedLogprobs:
    values = np.empty(len(content), dtype=np.float64)
    for i, (entry, tid) in enumerate(zip(content, sampled_ids, strict=True)):
        if not isinstance(entry, dict):
            msg = f"logprob entry {i} is {entry!r}: turn's logprobs dropped, ids kept as context"
            return _masked("null_logprob_entry", msg, node_id)
        token = entry.get("token")
        if not (isinstance(token, str) and token.startswith(_TOKEN_ID_PREFIX)):
            msg = (
                f"logprob entry {i} names token {token!r}, not 'token_id:N', so it cannot be "
                "checked against token_ids (serve vLLM with --return-tokens-as-token-ids): "
                "turn masked"
            )
            return _masked("logprob_tokens_not_ids", msg, node_id)
        try:
            entry_id = int(token[len(_TOKEN_ID_PREFIX) :])
        except ValueError:
            return _masked("logprob_id_unparsable", f"entry {i}: {token!r}", node_id)
        if entry_id != tid:
            msg = (
                f"position {i}: logprob entry is for token {entry_id}, token_ids[{i}] is {tid}: "
                "ids and logprobs are misaligned; turn masked"
            )
            return _masked("logprob_id_mismatch", msg, node_id)
        lp = entry.get("logprob")
        if (
            isinstance(lp, bool)
            or not isinstance(lp, int | float)
            or not math.isfinite(lp)
            or lp > 0
        ):
            msg = f"position {i}: logprob {lp!r} is not a finite number <= 0; turn masked"
            return _masked("logprob_invalid", msg, node_id)
        values[i] = lp
    return values


def reply_message(choice: dict[str, Any]) -> dict[str, Any]:
    """The assistant message of a choice, as the agent will send it back (compact)."""
    message = choice.get("message") or {}
    out: dict[str, Any] = {"role": message.get("role") or "assistant"}
    out["content"] = message.get("content")
    for key in ("tool_calls", "reasoning", "reasoning_content"):
        if message.get(key):
            out[key] = message[key]
    return out


def ingest_chat_reply(
    node_id: str,
    reply: Any,
    *,
    capture_level: CaptureLevel,
    request_messages: list[dict[str, Any]] | None = None,
    requested_params: dict[str, Any] | None = None,
    applied_params: dict[str, Any] | None = None,
    auxiliary: bool = False,
    request_findings: list[Finding] | None = None,
    token_in: dict[str, Any] | None = None,
    dialect: str = "chat",
) -> Ingested:
    """Turn one parsed chat-completions reply into a checked :class:`Turn` (or no turn)."""
    if not isinstance(reply, dict):
        return Ingested(
            None, [warn("reply_not_object", f"upstream reply is {type(reply).__name__}")]
        )
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        msg = "upstream answered 200 with no choices: not recorded as a turn"
        return Ingested(None, [warn("no_choices", msg)])
    choice = choices[0]
    findings: list[Finding] = list(request_findings or [])
    tokens = capture_level is CaptureLevel.TOKENS
    prompt_ids = engine_ids(reply.get("prompt_token_ids")) if tokens else None
    sampled_ids = engine_ids(choice.get("token_ids")) if tokens else None
    logprobs: np.ndarray | None = None
    certain: np.ndarray | None = None
    top: TopCandidates | None = None
    if tokens:
        if prompt_ids is None or sampled_ids is None:
            missing = [
                name
                for name, v in (
                    ("prompt_token_ids", prompt_ids),
                    ("choices[0].token_ids", sampled_ids),
                )
                if v is None
            ]
            msg = (
                f"the engine returned no {' or '.join(missing)} (is return_token_ids ignored?): "
                "this turn cannot be trained on or linked"
            )
            findings.append(fatal("missing_token_ids", msg, node_id))
        else:
            lp_obj = choice.get("logprobs")
            content = lp_obj.get("content") if isinstance(lp_obj, dict) else lp_obj
            checked = check_logprobs(sampled_ids, content, node_id)  # the array made above
            logprobs, certain, top = checked.values, checked.certain, checked.top
            findings.extend(checked.findings)
    finish = choice.get("finish_reason")
    if finish == "length":
        msg = "turn cut by the output cap (finish_reason=length): its tokens are real, its ending is not"
        findings.append(warn("truncated_by_length", msg, node_id))
    elif finish == "abort":
        msg = (
            "turn stopped by the engine (finish_reason=abort: a pause for a weight update "
            "aborted it): its tokens are real, its ending is not"
        )
        findings.append(warn("aborted_by_engine", msg, node_id))
    if auxiliary:
        findings.append(
            info("auxiliary_call", "marked auxiliary: context only, never a target", node_id)
        )
    usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else None
    turn = Turn(
        node_id=node_id,
        prompt_ids=prompt_ids,
        sampled_ids=sampled_ids,
        sampled_logprobs=logprobs,
        certain=certain,
        top_logprobs=top,
        finish_reason=finish if isinstance(finish, str) else None,
        model=reply.get("model") if isinstance(reply.get("model"), str) else None,
        auxiliary=auxiliary,
        requested_params=dict(requested_params or {}),
        applied_params=dict(applied_params or {}),
        findings=findings,
        messages=request_messages if capture_level is CaptureLevel.TEXT else None,
        reply=reply_message(choice),
        usage=usage,
        dialect=dialect,
        **(token_in or {}),
    )
    return Ingested(turn, [])
