"""Logprob parity: are the captured numbers the engine's numbers, at the right positions?

A real multi-turn tool conversation goes through the capture proxy; every trainable turn's ids
are then re-scored by the same engine (``/v1/completions`` with ``prompt_logprobs``) and the
captured logprobs are compared position by position. Two negative controls show what a
misalignment looks like next to the honest residual: the prompt short by one token, and the
completion rotated by one.
"""

from __future__ import annotations

import math
from typing import Any

import httpx
from pydantic import BaseModel, Field

from rollwire.capture.certify import TOOL_MANIFEST, Verdict, validate_llm
from rollwire.capture.export import RolloutDocument
from rollwire.capture.findings import Finding, fatal, warn
from rollwire.capture.proxy import CaptureProxy, certified_config
from rollwire.capture.upstream import Upstream, UpstreamError

SYSTEM = "You are a helpful assistant. Use the get_weather tool when asked about weather."
QUESTIONS = [
    "What is the weather like in Paris today?",
    "Thanks. And how would you describe Paris in one sentence?",
    "Which city should I visit next, and why?",
    "Summarise our conversation in one line.",
]
TOOL_RESULT = '{"city": "Paris", "temperature_c": 18, "sky": "cloudy"}'
PRIOR_CALL = {
    "id": "call_0",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


class Residuals(BaseModel):
    """Captured minus re-scored logprob over a set of positions, in nats."""

    check: str
    positions: int
    mean_signed: float
    mean_abs: float
    max_abs: float


class ParityReport(BaseModel):
    """What ``rollwire parity`` measured."""

    llm_url: str
    model: str | None = None
    verdict: str = "NOT RUN"  # PASS, FAIL, NOT RUN
    temperature: float = 1.0
    turns: int = 0
    tool_calls: int = 0
    trainable_tokens: int = 0
    honest: Residuals | None = None
    controls: list[Residuals] = Field(default_factory=list)
    tolerance: float = 0.0
    findings: list[Finding] = Field(default_factory=list)
    document: RolloutDocument | None = Field(default=None, exclude=True)  # the captured rollout


def residuals(check: str, captured: list[float], rescored: list[float]) -> Residuals:
    """Summary statistics of ``captured - rescored``."""
    diffs = [c - r for c, r in zip(captured, rescored, strict=True)]
    n = len(diffs)
    return Residuals(
        check=check,
        positions=n,
        mean_signed=sum(diffs) / n if n else 0.0,
        mean_abs=sum(abs(d) for d in diffs) / n if n else 0.0,
        max_abs=max((abs(d) for d in diffs), default=0.0),
    )


class RescoreUnsupported(Exception):
    """The engine offers no re-scoring parity can use."""


async def rescore(
    upstream: Upstream, model: str, ids: list[int], start: int, temperature: float
) -> list[float]:
    """The engine's logprob of ``ids[i]`` for ``i >= start`` (vLLM ``prompt_logprobs``)."""
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": 1,
        "temperature": temperature,
        "prompt_logprobs": 0,
        "sequential_from": start,  # the reference engine's exact mode; vLLM ignores it
    }
    reply = await upstream.request_json("POST", "/completions", body)
    entries = reply["choices"][0].get("prompt_logprobs")
    if not isinstance(entries, list):
        raise RescoreUnsupported(
            "the engine's /v1/completions returned no prompt_logprobs (vLLM's re-scoring field; "
            "SGLang 0.5.23 answers without it and re-scores only on its native /generate)"
        )
    out: list[float] = []
    for i in range(start, len(ids)):
        entry = entries[i]
        value = entry[str(ids[i])]
        out.append(float(value["logprob"] if isinstance(value, dict) else value))
    return out


async def _rescore_ignores_temperature(
    upstream: Upstream, model: str, doc: RolloutDocument
) -> str | None:
    """When a trainable turn was sampled at T != 1, re-score it at that T and at T=1: equal
    numbers mean the engine's ``prompt_logprobs`` ignore the temperature (real vLLM 0.32,
    fixture 12f2), so no re-score can check a capture at T != 1. Returns what was seen."""
    for turn in doc.turns:
        t = float(turn.applied_params.get("temperature", 1.0))
        if not turn.trainable or not turn.completion_token_ids or t == 1.0:
            continue
        ids = turn.prompt_token_ids + turn.completion_token_ids
        start = len(turn.prompt_token_ids)
        at_t = await rescore(upstream, model, ids, start, t)
        at_1 = await rescore(upstream, model, ids, start, 1.0)
        if at_t == at_1:
            return f"{len(at_t)} positions re-scored at T={t:g} and T=1 are identical"
        return None
    return None


async def _converse(
    client: httpx.AsyncClient,
    session_id: str,
    model: str,
    turns: int,
    temperature: float,
    seed: int,
) -> int:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTIONS[0]},
        # A tool exchange the harness already ran: tool-call and tool-result rendering are in
        # every prompt, whether or not this small model calls a tool itself.
        {"role": "assistant", "content": "", "tool_calls": [PRIOR_CALL]},
        {"role": "tool", "tool_call_id": PRIOR_CALL["id"], "content": TOOL_RESULT},
    ]
    calls = 0
    for k in range(turns):
        resp = await client.post(
            "/v1/chat/completions",
            headers={"Authorization": f"Bearer {session_id}"},
            json={
                "model": model,
                "messages": messages,
                "tools": TOOL_MANIFEST,
                "temperature": temperature,
                "seed": seed + k,
                "max_tokens": 48,
            },
        )
        resp.raise_for_status()
        message = resp.json()["choices"][0]["message"]
        said = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            said["tool_calls"] = message["tool_calls"]
        messages.append(said)
        for call in message.get("tool_calls") or []:
            calls += 1
            messages.append(
                {"role": "tool", "tool_call_id": call.get("id"), "content": TOOL_RESULT}
            )
        if not message.get("tool_calls"):
            messages.append({"role": "user", "content": QUESTIONS[(k + 1) % len(QUESTIONS)]})
    return calls


async def run_parity(
    llm_url: str,
    *,
    model: str | None = None,
    api_key: str | None = None,
    temperature: float = 1.0,
    turns: int = 3,
    seed: int = 0,
    tolerance: float = 1e-3,
    rescore_tokens: bool = True,
    token_in: str = "auto",
    token_in_path: str | None = None,
) -> ParityReport:
    """Capture a conversation through the proxy and re-score it (unless ``rescore_tokens`` is
    False: then only the capture). Never raises for engine trouble."""
    report = ParityReport(llm_url=llm_url, temperature=temperature, tolerance=tolerance)
    cert = await validate_llm(llm_url, model=model, api_key=api_key, probe_tools=False)
    report.model = cert.model
    if cert.verdict is not Verdict.TRAIN or cert.model is None:
        report.findings = [
            *cert.findings,
            fatal("not_train", f"the endpoint certifies {cert.verdict.value}, not TRAIN"),
        ]
        return report
    upstream = Upstream(llm_url, api_key=api_key)
    proxy = CaptureProxy(
        certified_config(llm_url, cert, token_in=token_in, token_in_path=token_in_path),
        upstream=upstream,
    )
    try:
        session = proxy.sessions.open(metadata={"purpose": "parity"})
        transport = httpx.ASGITransport(app=proxy.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://proxy", timeout=600
        ) as client:
            report.tool_calls = await _converse(
                client, session.session_id, cert.model, turns, temperature, seed
            )
        doc = session.document()
    except (UpstreamError, httpx.HTTPError, KeyError, IndexError, TypeError) as exc:
        report.findings.append(fatal("parity_failed", f"{type(exc).__name__}: {exc}"))
        await upstream.aclose()
        return report
    try:
        if not rescore_tokens:
            report.document, report.turns = doc, doc.stats.turns
            return report
        return await score_document(report, upstream, cert.model, doc)
    finally:
        await upstream.aclose()


async def score_document(
    report: ParityReport, upstream: Upstream, model: str, doc: RolloutDocument
) -> ParityReport:
    """Re-score every trainable turn of ``doc`` with the engine and fill ``report``."""
    tolerance = report.tolerance
    report.document = doc
    report.turns = doc.stats.turns
    captured: list[float] = []
    honest: list[float] = []
    short: list[float] = []
    rotated: list[float] = []
    try:
        blind = await _rescore_ignores_temperature(upstream, model, doc)
        if blind is not None:
            report.findings.append(
                fatal(
                    "rescore_ignores_temperature",
                    f"the engine re-scores at T=1 whatever the request says ({blind}): vLLM "
                    "computes prompt_logprobs before temperature, so captures made at "
                    f"T={report.temperature:g} cannot be compared; run parity at --temperature 1",
                )
            )
            return report
        for turn in doc.turns:
            if (
                not turn.trainable
                or turn.logprobs is None
                or not turn.prompt_token_ids
                or not turn.completion_token_ids
            ):
                continue
            prompt, done = turn.prompt_token_ids, turn.completion_token_ids
            t = float(turn.applied_params.get("temperature", report.temperature))
            # Forced (constrained) positions are masked in training data: compare the rest.
            forced = set(turn.constrained_positions)
            keep = [i for i in range(len(done)) if i not in forced]
            rot = done[1:] + done[:1]
            runs = [
                (honest, prompt + done, len(prompt)),
                (short, prompt[:-1] + done, len(prompt) - 1),
                (rotated, prompt + rot, len(prompt)),
            ]
            captured += [turn.logprobs[i] for i in keep]
            for sink, ids, start in runs:
                scored = await rescore(upstream, model, ids, start, t)
                sink += [scored[i] for i in keep]
        report.findings.extend(f for f in doc.findings if f.level != "INFO")
    except RescoreUnsupported as exc:
        report.findings.append(fatal("rescore_unsupported", str(exc)))
        return report
    except (UpstreamError, httpx.HTTPError, KeyError, IndexError, TypeError) as exc:
        report.findings.append(fatal("parity_failed", f"{type(exc).__name__}: {exc}"))
        return report
    report.trainable_tokens = len(captured)
    if not captured:
        report.findings.append(
            fatal("nothing_to_compare", "the conversation produced no trainable tokens")
        )
        report.verdict = "FAIL"
        return report
    report.honest = residuals("honest", captured, honest)
    report.controls = [
        residuals("control: prompt short by one token", captured, short),
        residuals("control: completion rotated by one", captured, rotated),
    ]
    separated = all(
        c.mean_abs > 10 * max(report.honest.mean_abs, tolerance) for c in report.controls
    )
    ok = (
        report.honest.max_abs <= tolerance and separated and all(math.isfinite(x) for x in captured)
    )
    if not separated:
        report.findings.append(
            warn(
                "controls_not_separated", "a negative control is within 10x of the honest residual"
            )
        )
    report.verdict = "PASS" if ok else "FAIL"
    return report


def render_report(report: ParityReport) -> str:
    """The human table."""
    lines = [
        f"parity {report.verdict}: {report.llm_url} ({report.model}), T={report.temperature:g}, "
        f"{report.turns} turns, {report.tool_calls} tool calls, {report.trainable_tokens} trainable tokens re-scored",
    ]
    if report.document is not None:
        paths = sorted({t.token_in_path for t in report.document.turns if t.token_in_path})
        lines.append(
            f"token-in: {dict(report.document.stats.token_in)}"
            + (f" by {', '.join(paths)}" if paths else "")
        )
    rows = [r for r in [report.honest, *report.controls] if r is not None]
    if rows:
        lines.append(
            f"{'check':38} {'positions':>9} {'mean signed':>12} {'mean |r|':>10} {'max |r|':>10}  (nats)"
        )
        for r in rows:
            lines.append(
                f"{r.check:38} {r.positions:>9} {r.mean_signed:>12.3e} {r.mean_abs:>10.3e} {r.max_abs:>10.3e}"
            )
        lines.append(f"tolerance on the honest max |r|: {report.tolerance:g}")
    for f in report.findings:
        lines.append(f"  [{f.level}] {f.code}: {f.message}")
    return "\n".join(lines)
