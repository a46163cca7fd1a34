"""Endpoint certification: which capture tier an endpoint earns, decided by probing.

``tokens`` needs evidence: prompt ids, sampled ids and logprobs aligned per position, and the
logprobs shown to be *processed* (post-temperature). The evidence for the last part: a processed
logprob is ``log_softmax(logits / T)``, so the gap between two candidates at the same position
doubles when T halves; a raw logprob does not move. Anything unknown or ambiguous is ``text``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from rollwire.capture.dialects.chat import NO_OP_SAMPLING
from rollwire.capture.findings import Finding, fatal, info, warn
from rollwire.capture.ingest import check_logprobs
from rollwire.capture.rollout import CaptureLevel
from rollwire.capture.upstream import Upstream, UpstreamError

PROBE_MESSAGES = [{"role": "user", "content": "Name one colour of the sky."}]
_GAP_FLOOR = 1e-3  # below this a gap ratio is noise


class TierEvidence(BaseModel):
    """What the probes showed, and the tier it earns."""

    capture_level: CaptureLevel
    gap_ratio: float | None = None
    findings: list[Finding] = Field(default_factory=list)


def _probe_body(model: str, temperature: float) -> dict[str, Any]:
    return {
        "model": model,
        "messages": PROBE_MESSAGES,
        "max_tokens": 4,
        "temperature": temperature,
        "seed": 1234,
        "logprobs": True,
        "top_logprobs": 5,
        "return_token_ids": True,
        **NO_OP_SAMPLING,
    }


def _first_position(reply: Any) -> dict[str, float]:
    """token -> logprob among the first position's top candidates."""
    try:
        entry = reply["choices"][0]["logprobs"]["content"][0]
        return {
            str(a["token"]): float(a["logprob"])
            for a in entry["top_logprobs"]
            if isinstance(a, dict) and isinstance(a.get("logprob"), int | float)
        }
    except (KeyError, IndexError, TypeError):
        return {}


def gap_ratio(cold: dict[str, float], hot: dict[str, float]) -> float | None:
    """Ratio of the same two candidates' logprob gap at T=0.5 over T=1.0 (2.0 when processed)."""
    shared = [t for t in cold if t in hot]
    if len(shared) < 2:
        return None
    shared.sort(key=lambda t: hot[t], reverse=True)
    a, b = shared[0], shared[-1]
    gap_hot = hot[a] - hot[b]
    gap_cold = cold[a] - cold[b]
    if abs(gap_hot) < _GAP_FLOOR:
        return None
    return gap_cold / gap_hot


async def probe_tier(upstream: Upstream, model: str) -> TierEvidence:
    """Probe one endpoint/model pair for the tokens tier; any doubt gives ``text``."""
    findings: list[Finding] = []
    try:
        hot = await upstream.request_json("POST", "/chat/completions", _probe_body(model, 1.0))
    except UpstreamError as exc:
        findings.append(fatal("probe_failed", f"the probe request failed: {exc.message}"))
        return TierEvidence(capture_level=CaptureLevel.TEXT, findings=findings)
    choice = (hot.get("choices") or [None])[0] if isinstance(hot, dict) else None
    prompt_ids = hot.get("prompt_token_ids") if isinstance(hot, dict) else None
    sampled = choice.get("token_ids") if isinstance(choice, dict) else None
    if not isinstance(prompt_ids, list) or not isinstance(sampled, list) or not prompt_ids:
        msg = "the endpoint returns no prompt_token_ids / token_ids (return_token_ids ignored): eval only"
        findings.append(warn("no_token_ids", msg))
        return TierEvidence(capture_level=CaptureLevel.TEXT, findings=findings)
    lp_obj = choice.get("logprobs")
    content = lp_obj.get("content") if isinstance(lp_obj, dict) else lp_obj
    values, lp_findings = check_logprobs(sampled, content, "probe")
    findings.extend(lp_findings)
    if values is None:
        msg = "token ids are returned but logprobs do not align with them per position: eval only"
        findings.append(warn("logprobs_unaligned", msg))
        return TierEvidence(capture_level=CaptureLevel.TEXT, findings=findings)
    try:
        cold = await upstream.request_json("POST", "/chat/completions", _probe_body(model, 0.5))
    except UpstreamError as exc:
        findings.append(warn("probe_failed", f"the T=0.5 probe failed: {exc.message}: eval only"))
        return TierEvidence(capture_level=CaptureLevel.TEXT, findings=findings)
    ratio = gap_ratio(_first_position(cold), _first_position(hot))
    if ratio is None:
        msg = "could not compare logprob gaps at T=1.0 and T=0.5 (too few candidates): eval only"
        findings.append(warn("logprob_mode_unknown", msg))
        return TierEvidence(capture_level=CaptureLevel.TEXT, findings=findings)
    if 1.8 <= ratio <= 2.2:
        findings.append(
            info("logprobs_processed", f"top-candidate gap scales x{ratio:.3f} from T=1.0 to T=0.5")
        )
        return TierEvidence(capture_level=CaptureLevel.TOKENS, gap_ratio=ratio, findings=findings)
    if 0.9 <= ratio <= 1.1:
        msg = (
            f"logprobs are raw (pre-temperature): the gap moved x{ratio:.3f} when T halved; "
            "serve vLLM with --logprobs-mode processed_logprobs: eval only"
        )
        findings.append(warn("logprobs_raw", msg))
    else:
        findings.append(
            warn("logprob_mode_unknown", f"gap ratio x{ratio:.3f} is neither 1 nor 2: eval only")
        )
    return TierEvidence(capture_level=CaptureLevel.TEXT, gap_ratio=ratio, findings=findings)
