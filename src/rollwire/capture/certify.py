"""Endpoint certification (``validate_llm``): may this endpoint produce training data?

``tokens`` needs evidence: prompt ids, sampled ids and logprobs aligned per position, and the
logprobs shown to be *processed* (post-temperature). The evidence for the last part: a processed
logprob is ``log_softmax(logits / T)``, so the gap between two candidates at the same position
doubles when T halves; a raw logprob does not move. Anything unknown or ambiguous is ``text``.

A provider that answers 400 naming one parameter gets exactly that parameter dropped, the request
retried, and the edit listed in ``param_fixes``. A name is only ever taken from the request itself:
never invented from an error's prose.
"""

from __future__ import annotations

import json
import re
import time
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field

from rollwire.capture.dialects.chat import NO_OP_SAMPLING
from rollwire.capture.findings import Finding, fatal, has_fatal, info, warn
from rollwire.capture.ingest import check_logprobs
from rollwire.capture.rollout import CaptureLevel
from rollwire.capture.token_paths import (
    CLOSE_TEXT,
    PATH_ORDER,
    PATHS,
    TOOL_PARSERS,
    Parsers,
    normalise_reply,
)
from rollwire.capture.upstream import Upstream, UpstreamError

PROBE_MESSAGES = [{"role": "user", "content": "Name one colour of the sky."}]
TOOL_PROBE_MESSAGES = [
    {"role": "user", "content": "What is the weather in Paris? Use the get_weather tool."}
]
TOOL_MANIFEST = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name"}},
                "required": ["city"],
            },
        },
    }
]
_GAP_FLOOR = 1e-3  # below this a gap ratio is noise
_MAX_FIXES = 6
_UNFIXABLE = frozenset({"model", "messages"})  # without these there is no request at all


class Verdict(StrEnum):
    """The one-word answer in the table."""

    TRAIN = "TRAIN"
    EVAL_ONLY = "EVAL ONLY"
    NOT_USABLE = "NOT USABLE"


class ParamFix(BaseModel):
    """One parameter the provider rejected, dropped from every request sent to it."""

    param: str
    action: Literal["drop"] = "drop"
    provider_message: str


class Certification(BaseModel):
    """What ``validate_llm`` found about one endpoint."""

    llm_url: str
    reachable: bool
    served_models: list[str] = Field(default_factory=list)
    model: str | None = None
    capture_level: CaptureLevel = CaptureLevel.TEXT
    verdict: Verdict = Verdict.NOT_USABLE
    gap_ratio: float | None = None
    tool_calls: Literal["supported", "not_called", "rejected", "unknown"] = "unknown"
    param_fixes: list[ParamFix] = Field(default_factory=list)
    token_in: bool = Field(
        default=False,
        description="the engine takes a token prompt on chat (kv_transfer_params."
        "prompt_token_ids, echoed back): token-in continuation can splice",
    )
    token_in_reason: str | None = None
    tool_parser: str | None = Field(
        default=None,
        description="the tool parser (rollwire.capture.token_paths.TOOL_PARSERS) that reads the "
        "engine's own tool calls as the engine does, checked when the completions path works "
        "(on that path the proxy parses replies itself)",
    )
    token_in_paths: list[str] = Field(
        default_factory=list,
        description="the ways this engine takes a token prompt, best first "
        "(rollwire.capture.token_paths: vllm_chat, sglang_chat, completions); the proxy uses "
        "the first unless told otherwise",
    )
    close_token_id: int | None = Field(
        default=None, description="the token the model ends its turn with (seen at a stop)"
    )
    weight_info: bool = Field(
        default=False,
        description="the engine reports the version of the weights it serves (vLLM's GET "
        "/weight_info): the capture proxy reads it around every call and records it per turn",
    )
    weight_version: str | None = Field(
        default=None, description="the version GET /weight_info reported at certification"
    )
    findings: list[Finding] = Field(default_factory=list)
    elapsed_s: float = 0.0


def rejected_param(error: Any, body: dict[str, Any]) -> str | None:
    """The one request field a 400 names, or None when it names none of the request's fields."""
    err = error.get("error", error) if isinstance(error, dict) else error
    candidates: list[str] = []
    if isinstance(err, dict):
        param = err.get("param")
        if isinstance(param, str) and param in body:
            return param
        message = str(err.get("message") or err.get("detail") or "")
    else:
        message = str(err or "")
    for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", message):
        if word in body and word not in _UNFIXABLE and word not in candidates:
            candidates.append(word)
    return candidates[0] if len(candidates) == 1 else None


class _Prober:
    """Sends probe requests, applying and learning parameter fixes as it goes."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.fixes: list[ParamFix] = []

    async def chat(self, body: dict[str, Any]) -> Any:
        body = dict(body)
        for _ in range(_MAX_FIXES + 1):
            for fix in self.fixes:
                body.pop(fix.param, None)
            try:
                reply = await self.upstream.request_json("POST", "/chat/completions", body)
                return normalise_reply(reply)
            except UpstreamError as exc:
                if exc.kind != "http" or exc.status not in (400, 422):
                    raise
                param = rejected_param(exc.body, body)
                if param is None or param in _UNFIXABLE or len(self.fixes) >= _MAX_FIXES:
                    raise
                self.fixes.append(ParamFix(param=param, provider_message=exc.message))
        raise AssertionError("unreachable: the loop returns or raises")


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
        # SGLang's names (vLLM ignores them): prompt ids on the choice, sampled logprobs by id
        "return_prompt_token_ids": True,
        "return_meta_info": True,
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


async def _probe_tier(
    prober: _Prober, model: str
) -> tuple[CaptureLevel, float | None, list[Finding]]:
    findings: list[Finding] = []
    text = CaptureLevel.TEXT
    hot = await prober.chat(_probe_body(model, 1.0))
    dropped = {f.param for f in prober.fixes}
    if dropped & {"return_token_ids", "logprobs", "top_logprobs"}:
        msg = f"the endpoint rejects {sorted(dropped)}: it cannot return token ids and logprobs"
        findings.append(warn("no_token_ids", msg))
        return text, None, findings
    choice = (hot.get("choices") or [None])[0] if isinstance(hot, dict) else None
    prompt_ids = hot.get("prompt_token_ids") if isinstance(hot, dict) else None
    sampled = choice.get("token_ids") if isinstance(choice, dict) else None
    if not isinstance(prompt_ids, list) or not isinstance(sampled, list) or not prompt_ids:
        msg = "the endpoint returns no prompt_token_ids / token_ids (return_token_ids ignored)"
        findings.append(warn("no_token_ids", msg))
        return text, None, findings
    lp_obj = choice.get("logprobs")
    content = lp_obj.get("content") if isinstance(lp_obj, dict) else lp_obj
    checked = check_logprobs(sampled, content, "probe")
    findings.extend(f.model_copy(update={"node_id": None}) for f in checked.findings)
    if checked.values is None:
        msg = "token ids are returned but the logprobs do not align with them per position"
        findings.append(warn("logprobs_unaligned", msg))
        return text, None, findings
    cold = await prober.chat(_probe_body(model, 0.5))
    ratio = gap_ratio(_first_position(cold), _first_position(hot))
    if ratio is None:
        msg = "could not compare logprob gaps at T=1.0 and T=0.5 (too few candidates)"
        findings.append(warn("logprob_mode_unknown", msg))
        return text, None, findings
    if 1.8 <= ratio <= 2.2:
        msg = (
            f"logprobs are processed: the top-candidate gap scales x{ratio:.3f} from T=1.0 to T=0.5"
        )
        findings.append(info("logprobs_processed", msg))
        return CaptureLevel.TOKENS, ratio, findings
    if 0.9 <= ratio <= 1.1:
        msg = (
            f"logprobs are raw (pre-temperature): the gap moved x{ratio:.3f} when T halved; "
            "serve vLLM with --logprobs-mode processed_logprobs"
        )
        findings.append(warn("logprobs_raw", msg))
    else:
        findings.append(warn("logprob_mode_unknown", f"gap ratio x{ratio:.3f} is neither 1 nor 2"))
    return text, ratio, findings


async def _probe_tools(prober: _Prober, model: str) -> tuple[str, list[Finding]]:
    body = {
        "model": model,
        "messages": TOOL_PROBE_MESSAGES,
        "tools": TOOL_MANIFEST,
        "max_tokens": 64,
    }
    body["temperature"] = 0.0
    try:
        reply = await prober.chat(body)
    except UpstreamError as exc:
        msg = (
            f"the endpoint rejects a tool manifest ({exc.message}): tool-using harnesses will fail"
        )
        return "rejected", [warn("tools_rejected", msg)]
    if "tools" in {f.param for f in prober.fixes}:
        return "rejected", [warn("tools_rejected", "the endpoint rejects the 'tools' field")]
    try:
        calls = reply["choices"][0]["message"].get("tool_calls")
    except (KeyError, IndexError, TypeError, AttributeError):
        calls = None
    if calls:
        return "supported", [
            info("tools_supported", "the model answered a tool manifest with a tool call")
        ]
    msg = (
        "the endpoint accepts a tool manifest but the model did not call the tool "
        "(for vLLM: --enable-auto-tool-choice --tool-call-parser ...)"
    )
    return "not_called", [warn("tools_not_called", msg)]


async def validate_llm(
    llm_url: str,
    *,
    model: str | None = None,
    api_key: str | None = None,
    timeout_s: float = 120.0,
    probe_tools: bool = True,
) -> Certification:
    """Certify one endpoint. Never raises for endpoint trouble: that is what the result says."""
    start = time.perf_counter()
    try:
        upstream = Upstream(llm_url, api_key=api_key, timeout_s=timeout_s)
    except ValueError as exc:
        return Certification(
            llm_url=llm_url, reachable=False, findings=[fatal("bad_url", str(exc))]
        )
    try:
        cert = await _certify(upstream, model, probe_tools)
    finally:
        await upstream.aclose()
    cert.elapsed_s = round(time.perf_counter() - start, 3)
    return cert


async def _certify(upstream: Upstream, model: str | None, probe_tools: bool) -> Certification:
    cert = Certification(llm_url=upstream.base_url, reachable=True)
    try:
        cert.served_models = await upstream.served_models()
    except UpstreamError as exc:
        if exc.kind in ("connect", "timeout"):
            cert.reachable = False
            cert.findings.append(fatal("not_reachable", f"not reachable: {exc.message}"))
            return cert
        cert.findings.append(warn("no_model_list", f"GET /models failed: {exc.message}"))
    if model:
        if cert.served_models and model not in cert.served_models:
            msg = f"model {model!r} is not served; the endpoint serves {cert.served_models}"
            cert.findings.append(fatal("model_not_served", msg))
            return cert
        cert.model = model
    elif len(cert.served_models) == 1:
        cert.model = cert.served_models[0]
    elif not cert.served_models:
        cert.findings.append(
            fatal("model_unknown", "the endpoint lists no models: name one with --model")
        )
        return cert
    else:
        msg = f"the endpoint serves {len(cert.served_models)} models {cert.served_models} and none was named: pass --model"
        cert.findings.append(warn("model_ambiguous", msg))
        cert.verdict = Verdict.EVAL_ONLY
        return cert

    prober = _Prober(upstream)
    try:
        level, ratio, tier_findings = await _probe_tier(prober, cert.model)
    except UpstreamError as exc:
        cert.findings.append(fatal("chat_failed", f"a plain chat request failed: {exc.message}"))
        cert.param_fixes = prober.fixes
        return cert
    cert.capture_level, cert.gap_ratio = level, ratio
    cert.findings.extend(tier_findings)
    if probe_tools:
        cert.tool_calls, tool_findings = await _probe_tools(prober, cert.model)
        cert.findings.extend(tool_findings)
    if cert.capture_level is CaptureLevel.TOKENS:
        cert.token_in_paths, cert.token_in_reason = await _probe_token_in(prober, cert.model)
        if "completions" in cert.token_in_paths:
            cert.tool_parser, parser_finding = await _probe_tool_parser(prober, cert.model)
            cert.findings.append(parser_finding)
            if cert.tool_parser is None and parser_finding.level == "WARN":
                cert.token_in_paths.remove("completions")
        cert.token_in = bool(cert.token_in_paths)
        if cert.token_in:
            cert.close_token_id = await _probe_close_token(prober, cert.model)
        level = "INFO" if cert.token_in else "WARN"
        message = (
            f"token-in continuation: the engine takes a token prompt by {cert.token_in_paths} "
            f"(using {cert.token_in_paths[0]}): conversations stay one training sequence"
            if cert.token_in
            else f"no token-in continuation ({cert.token_in_reason}): turns link by exact "
            "token prefix and a re-tokenised reply starts a new sequence"
        )
        cert.findings.append((info if level == "INFO" else warn)("token_in", message))
    cert.weight_info, cert.weight_version = await probe_weight_info(upstream)
    cert.findings.append(
        info(
            "weight_version",
            f"the engine reports its weight version (GET /weight_info: {cert.weight_version!r}): "
            "every captured call records the version that sampled it",
        )
        if cert.weight_info
        else info(
            "weight_version",
            "the engine does not report a weight version (no GET /weight_info): captured calls "
            "record the version a trainer announces (POST /weight_version), else none",
        )
    )
    cert.param_fixes = prober.fixes
    for fix in prober.fixes:
        msg = f"the endpoint rejected {fix.param!r}; it is dropped from every request ({fix.provider_message})"
        cert.findings.append(warn("param_fix", msg))
    if has_fatal(cert.findings):
        cert.verdict = Verdict.NOT_USABLE
    elif cert.capture_level is CaptureLevel.TOKENS:
        cert.verdict = Verdict.TRAIN
    else:
        cert.verdict = Verdict.EVAL_ONLY
    return cert


async def probe_weight_info(upstream: Upstream) -> tuple[bool, str | None]:
    """Does the engine serve vLLM's ``GET /weight_info`` (``{"weight_version": "..."}``), and
    what does it say now?"""
    try:
        data = await upstream.request_json("GET", upstream.root_url + "/weight_info")
    except UpstreamError:
        return False, None
    version = data.get("weight_version") if isinstance(data, dict) else None
    return (True, version) if isinstance(version, str) else (False, None)


async def _probe_token_in(prober: _Prober, model: str) -> tuple[list[str], str | None]:
    """Which token-in paths does the engine honour? Each is sent the ids of one conversation
    with the messages of another: a path the engine uses echoes exactly those ids (and, on
    completions, samples after them). Returns the paths that work, best first, and why the
    others did not."""
    asked = [{"role": "user", "content": "Say yes."}]
    other = [{"role": "user", "content": "Say no, please."}]
    try:
        ids = await prober.upstream.tokenize(
            {"model": model, "messages": other, "add_generation_prompt": True}
        )
    except UpstreamError as exc:
        return [], f"no /tokenize: {exc.message}"
    chat_body = {
        "model": model,
        "messages": asked,
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
    }
    works: list[str] = []
    why: list[str] = []
    for name in PATH_ORDER:
        path = PATHS[name]
        body = path.request(chat_body, list(ids), None)
        for fix in prober.fixes:
            if fix.param not in ("kv_transfer_params", "input_ids", "prompt"):
                body.pop(fix.param, None)
        try:
            reply = await prober.upstream.request_json("POST", path.route, body)
        except UpstreamError as exc:
            why.append(f"{name}: {exc.message}")
            continue
        if path.echoed(reply) != ids:
            why.append(f"{name}: the engine ignored the token prompt (it echoed other ids)")
            continue
        sampled = normalise_reply(path.to_chat(reply, chat_body, Parsers()))
        choice = (sampled.get("choices") or [None])[0] if isinstance(sampled, dict) else None
        if not isinstance(choice, dict) or not isinstance(choice.get("token_ids"), list):
            why.append(f"{name}: no sampled token ids came back")
            continue
        lps = choice.get("logprobs")
        content = lps.get("content") if isinstance(lps, dict) else None
        if check_logprobs(choice["token_ids"], content, "probe").values is None:
            # e.g. SGLang's completions name tokens by text: ids and logprobs cannot be paired
            why.append(f"{name}: its logprobs are not given per token id")
            continue
        works.append(name)
    return works, None if works else "; ".join(why)


async def _probe_tool_parser(prober: _Prober, model: str) -> tuple[str | None, Finding]:
    """Which of our tool parsers reads the engine's own tool call as the engine does? Force a
    call on chat, detokenize what the model sampled, parse it with each parser and compare
    with the engine's ``tool_calls`` (name and arguments as JSON). The completions path needs
    one: there the proxy, not the engine, parses the reply."""
    # The smallest manifest: a forced call is spelled out token by token (05c: 48 tokens cut it)
    # and a small model without a grammar rambles on a richer schema.
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    body = {
        "model": model,
        "messages": TOOL_PROBE_MESSAGES,
        "tools": [tool],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 256,
        "temperature": 0.0,
        "return_token_ids": True,
        "skip_special_tokens": False,
    }
    try:
        reply = await prober.chat(body)
        choice = reply["choices"][0]
        engine_calls = choice["message"].get("tool_calls") or []
        ids = choice.get("token_ids")
        if not engine_calls or not isinstance(ids, list):
            raise KeyError("no tool call with token ids")
        text = await prober.upstream.detokenize(model, ids)
    except (UpstreamError, KeyError, IndexError, TypeError, AttributeError) as exc:
        msg = (
            f"could not check the tool parser for the completions token-in path ({exc}): "
            "tool calls there are read with the configured parser, unverified"
        )
        return None, info("tool_parser_unverified", msg)
    want = [_call_key(c) for c in engine_calls]
    text = CLOSE_TEXT.sub("", text)
    for parser_name, parser in TOOL_PARSERS.items():
        _, calls = parser(text)
        if calls and [_call_key(c) for c in calls] == want:
            msg = f"the {parser_name!r} tool parser reads the engine's tool calls as it does"
            return parser_name, info("tool_parser", msg)
    msg = (
        f"none of the tool parsers {sorted(TOOL_PARSERS)} reads the engine's own tool call "
        f"({text[:120]!r}) as it does: the completions token-in path is not offered"
    )
    return None, warn("tool_parser_unknown", msg)


def _call_key(call: Any) -> tuple[Any, Any]:
    fn = call.get("function") or {} if isinstance(call, dict) else {}
    args = fn.get("arguments")
    try:
        args = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        pass
    return fn.get("name"), args


async def _probe_close_token(prober: _Prober, model: str) -> int | None:
    """The turn-close token: the last sampled id of a reply that stopped by itself (engines
    return it in ``token_ids``, as vLLM does). None when the probe never stops."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Reply with the single word yes."}],
        "max_tokens": 32,
        "temperature": 0,
        "return_token_ids": True,
    }
    try:
        reply = await prober.chat(body)
        choice = reply["choices"][0]
    except (UpstreamError, KeyError, IndexError, TypeError):
        return None
    ids = choice.get("token_ids")
    if choice.get("finish_reason") == "stop" and isinstance(ids, list) and ids:
        last = ids[-1]
        return last if isinstance(last, int) and not isinstance(last, bool) else None
    return None


def render_table(cert: Certification) -> str:
    """The human table: one row for the endpoint, the verdict in the last column, then findings."""
    tier = cert.capture_level.value if cert.model else "-"
    header = [
        "endpoint",
        "reachable",
        "model",
        "tier",
        "gap T1/T0.5",
        "tool calls",
        "param fixes",
        "token-in",
        "weight version",
        "verdict",
    ]
    row = [
        cert.llm_url,
        "yes" if cert.reachable else "no",
        cert.model
        or ("(ambiguous: " + ", ".join(cert.served_models) + ")" if cert.served_models else "-"),
        tier,
        f"{cert.gap_ratio:.3f}" if cert.gap_ratio is not None else "-",
        cert.tool_calls,
        ", ".join(f"drop {f.param}" for f in cert.param_fixes) or "none",
        ",".join(cert.token_in_paths) or "no",
        cert.weight_version if cert.weight_info else "not reported",
        cert.verdict.value,
    ]
    widths = [max(len(h), len(v)) for h, v in zip(header, row, strict=True)]
    lines = [
        "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip(),
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip(),
    ]
    if cert.findings:
        lines.append("findings:")
        lines.extend(f"  [{f.level}] {f.code}: {f.message}" for f in cert.findings)
    return "\n".join(lines)
