"""``rollwire engine``: an OpenAI-spec server on CPU whose replies have vLLM's shape exactly.

It answers as vLLM does with ``--return-tokens-as-token-ids --logprobs-mode processed_logprobs``:
top-level ``prompt_token_ids``, ``choices[].token_ids``, logprob entries whose ``token`` reads
``token_id:N``. A dev/test/demo engine: production points ``--llm-url`` at vLLM or SGLang.

The model behind it (:mod:`rollwire.engine.model`) is a GGUF through llama.cpp (the embedded
SmolLM2 by default) or a Hugging Face folder on torch (a fine-tuned checkpoint); it renders the
chat template, tool manifest included, and samples; this module only shapes vLLM's replies.

It also serves vLLM's RL routes (``/pause``, ``/resume``, ``/is_paused``,
``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``,
``/finish_weight_update``, ``/update_weight_version``, ``GET /weight_info``,
``/weight_checker``) with vLLM's request and reply shapes (:mod:`rollwire.engine.weights` holds
the state). Every POST among them changes what the engine serves, so each needs
``Authorization: Bearer <admin key>`` (``--admin-key``; without one they are refused);
``GET /weight_info`` and ``GET /is_paused`` are open, as the capture proxy reads the version
around every call.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from rollwire.capture.dialects.hermes import ToolFormatError, parse_calls
from rollwire.engine.model import EngineError, EngineModel, Generation
from rollwire.engine.weights import PAUSE_MODES, WeightUpdateError, WeightUpdates

FINGERPRINT = "rollwire-reference-engine"
MAX_TOP_LOGPROBS = 20
# The engine samples the full distribution only; anything else would be a silent lie in its logprobs.
_FULL_DISTRIBUTION = {
    "top_p": (1.0, None),
    "top_k": (-1, 0, None),
    "min_p": (0.0, None),
    "repetition_penalty": (1.0, None),
    "presence_penalty": (0.0, None),
    "frequency_penalty": (0.0, None),
}


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _error(
    status: int, message: str, *, param: str | None = None, type_: str = "BadRequestError"
) -> Response:
    return _json(
        {"error": {"message": message, "type": type_, "param": param, "code": status}}, status
    )


def _num(body: dict[str, Any], key: str, default: float, *, lo: float | None = None) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EngineError(f"'{key}' must be a number, got {value!r}", param=key)
    if lo is not None and value < lo:
        raise EngineError(f"'{key}' must be >= {lo}, got {value!r}", param=key)
    return float(value)


def _int(body: dict[str, Any], key: str, default: int | None, *, lo: int = 0) -> int | None:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise EngineError(f"'{key}' must be an integer >= {lo}, got {value!r}", param=key)
    return value


class ReferenceEngine:
    """The Starlette app around one :class:`~rollwire.engine.model.EngineModel` (llama.cpp or
    torch: the model renders, tokenises, samples and scores; this shapes vLLM's replies)."""

    def __init__(
        self,
        model: EngineModel,
        *,
        served_name: str,
        raw_logprobs: bool = False,
        admin_key: str | None = None,
        weights_roots: list[Path] | None = None,
    ) -> None:
        self.model = model
        self.served_name = served_name
        self.raw_logprobs = raw_logprobs
        self.created = int(time.time())
        self.admin_key = admin_key
        self.weights = WeightUpdates(model, roots=weights_roots)
        self._limiter = anyio.CapacityLimiter(1)  # one model context: one request at a time
        keyed = {
            "/pause": self.pause,
            "/resume": self.resume,
            "/init_weight_transfer_engine": self.init_weight_transfer_engine,
            "/start_weight_update": self.start_weight_update,
            "/update_weights": self.update_weights,
            "/finish_weight_update": self.finish_weight_update,
            "/update_weight_version": self.update_weight_version,
            "/weight_checker": self.weight_checker,
        }
        self.app = Starlette(
            routes=[
                Route("/health", self.health, methods=["GET"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/tokenize", self.tokenize, methods=["POST"]),
                Route("/detokenize", self.detokenize, methods=["POST"]),
                Route("/weight_info", self.weight_info, methods=["GET"]),
                Route("/is_paused", self.is_paused, methods=["GET"]),
                *(
                    Route(path, self._keyed(handler), methods=["POST"])
                    for path, handler in keyed.items()
                ),
            ]
        )

    # ---- helpers ------------------------------------------------------------------------------

    async def _body(self, request: Request) -> dict[str, Any]:
        raw = await request.body()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise EngineError(f"JSON decode error: {exc}", param="body") from None
        if not isinstance(body, dict):
            raise EngineError("the request body must be a JSON object", param="body")
        model = body.get("model")
        if model not in (None, self.served_name):
            raise _NotFound(
                f"The model `{model}` does not exist. Valid aliases: {self.served_name}."
            )
        return body

    def _check_sampling(self, body: dict[str, Any]) -> None:
        for knob, allowed in _FULL_DISTRIBUTION.items():
            if knob in body and body[knob] not in allowed:
                raise EngineError(
                    f"{knob}={body[knob]!r}: the reference engine samples the full distribution only "
                    f"(accepted: {[a for a in allowed if a is not None]})",
                    param=knob,
                )
        if body.get("logit_bias"):
            raise EngineError(
                "logit_bias is not supported by the reference engine", param="logit_bias"
            )

    def _logprob_entry(
        self, token_id: int, logprob: float, top: list[tuple[int, float]]
    ) -> dict[str, Any]:
        return {
            "token": f"token_id:{token_id}",
            "logprob": logprob,
            "bytes": list(self.model.piece_bytes(token_id)),
            "top_logprobs": [
                {"token": f"token_id:{t}", "logprob": v, "bytes": list(self.model.piece_bytes(t))}
                for t, v in top
            ],
        }

    async def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs), limiter=self._limiter)

    def _gated_generate(self, prompt_ids: list[int], **kwargs: Any) -> Generation:
        """One generation admitted by the pause gate, checking it before every token."""
        with self.weights.gate.admitted() as checkpoint:
            return self.model.generate(prompt_ids, checkpoint=checkpoint, **kwargs)

    def _completion_logprobs(self, gen: Generation) -> dict[str, Any]:
        """vLLM's completions logprobs: per position the sampled token's logprob, and a dict of
        the sampled token plus the top alternatives, keyed ``token_id:N``."""
        tokens, values, tops, offsets = [], [], [], []
        offset = 0
        for s in gen.steps:
            tokens.append(f"token_id:{s.token_id}")
            values.append(s.logprob)
            top = {f"token_id:{s.token_id}": s.logprob}
            top.update({f"token_id:{t}": v for t, v in s.top})
            tops.append(top)
            offsets.append(offset)
            offset += len(self.model.piece(s.token_id))
        return {
            "text_offset": offsets,
            "token_logprobs": values,
            "tokens": tokens,
            "top_logprobs": tops,
        }

    async def _generate(
        self, prompt_ids: list[int], body: dict[str, Any], index: int, **constraint: Any
    ) -> Generation:
        temperature = _num(body, "temperature", 1.0, lo=0.0)
        n_ctx = self.model.n_ctx
        cap = _int(body, "max_completion_tokens", None, lo=1)
        cap = _int(body, "max_tokens", cap, lo=1)
        if len(prompt_ids) >= n_ctx:
            raise EngineError(
                f"This model's maximum context length is {n_ctx} tokens. However, your request "
                f"has {len(prompt_ids)} input tokens. Please reduce the length of the input messages.",
                param="messages",
            )
        if cap is None:
            cap = n_ctx - len(prompt_ids)
        if len(prompt_ids) + cap > n_ctx:
            raise EngineError(
                f"max_tokens={cap} cannot be greater than max_model_len={n_ctx} minus the "
                f"{len(prompt_ids)}-token prompt. Please request fewer output tokens. "
                f"(parameter=max_tokens, value={cap})",
                param="max_tokens",
            )
        seed = _int(body, "seed", None)
        top = 0
        if body.get("logprobs"):
            top = _int(body, "top_logprobs", 0) or 0
            if top > MAX_TOP_LOGPROBS:
                raise EngineError(
                    f"Requested sample logprobs of {top}, which is greater than max allowed: {MAX_TOP_LOGPROBS} "
                    f"(parameter=logprobs, value={top})",
                    param="logprobs",
                )
        stop = body.get("stop")
        stops = [stop] if isinstance(stop, str) else [s for s in (stop or []) if isinstance(s, str)]
        gen: Generation = await self._run(
            self._gated_generate,
            prompt_ids,
            max_tokens=cap,
            temperature=temperature,
            seed=None if seed is None else seed + index,
            top_logprobs=top,
            stop=stops or None,
            ignore_eos=bool(body.get("ignore_eos")),
            report_temperature=1.0 if self.raw_logprobs else temperature,
            **constraint,
        )
        return gen

    # ---- routes -------------------------------------------------------------------------------

    async def health(self, _request: Request) -> Response:
        """Liveness."""
        return _json({"status": "ok", "model": self.served_name})

    async def models(self, _request: Request) -> Response:
        """``GET /v1/models`` in vLLM's shape."""
        return _json(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.served_name,
                        "object": "model",
                        "created": self.created,
                        "owned_by": "rollwire",
                        "root": str(self.model.path),
                        "parent": None,
                        "max_model_len": self.model.n_ctx,
                        "permission": [],
                    }
                ],
            }
        )

    def _token_prompt(self, given: Any) -> list[int]:
        n_vocab = self.model.n_vocab
        if (
            not isinstance(given, list)
            or not given
            or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_vocab for t in given
            )
        ):
            raise EngineError(
                f"kv_transfer_params.prompt_token_ids must be a non-empty list of ids in [0, {n_vocab})",
                param="kv_transfer_params",
            )
        return list(given)

    async def tokenize(self, request: Request) -> Response:
        """``POST /tokenize`` with ``messages`` (chat template) or ``prompt`` (raw text)."""
        try:
            body = await self._body(request)
            if "messages" in body:
                text = self.model.render(
                    body["messages"],
                    body.get("tools") or None,
                    add_generation_prompt=bool(body.get("add_generation_prompt", True)),
                )
            elif isinstance(body.get("prompt"), str):
                text = body["prompt"]
            else:
                raise EngineError("send 'messages' or a string 'prompt'", param="messages")
            ids = self.model.tokenize(text)
        except (EngineError, ToolFormatError) as exc:
            return _error(400, exc.message, param=exc.param)
        except _NotFound as exc:
            return _error(404, str(exc), param="model", type_="NotFoundError")
        return _json(
            {
                "count": len(ids),
                "max_model_len": self.model.n_ctx,
                "tokens": ids,
                "token_strs": None,
            }
        )

    async def detokenize(self, request: Request) -> Response:
        """``POST /detokenize``: ``{"tokens": [...]}`` -> ``{"prompt": text}``."""
        try:
            body = await self._body(request)
            tokens = body.get("tokens")
            n_vocab = self.model.n_vocab
            if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in tokens
            ):
                raise EngineError("'tokens' must be a list of integers", param="tokens")
            if not all(0 <= t < n_vocab for t in tokens):
                raise EngineError(f"token ids must be in [0, {n_vocab})", param="tokens")
        except (EngineError, ToolFormatError) as exc:
            return _error(400, exc.message, param=exc.param)
        except _NotFound as exc:
            return _error(404, str(exc), param="model", type_="NotFoundError")
        return _json({"prompt": self.model.detokenize(tokens)})

    async def chat(self, request: Request) -> Response:
        """``POST /v1/chat/completions``, vLLM-shaped, optionally streamed."""
        try:
            body = await self._body(request)
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise EngineError("'messages' must be a non-empty list", param="messages")
            tools = body.get("tools")
            if tools is not None and (not isinstance(tools, list) or not tools):
                raise EngineError(
                    "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely. (parameter=tools)",
                    param="tools",
                )
            choice = body.get("tool_choice")
            forced = forced_tool(choice, tools)
            self._check_sampling(body)
            n = _int(body, "n", 1, lo=1) or 1
            offered = tools if choice != "none" else None
            text = self.model.render(messages, offered)
            prompt_ids = self.model.tokenize(text)
            given = (body.get("kv_transfer_params") or {}).get("prompt_token_ids")
            if given is not None:
                # vLLM's pre-tokenized chat prompt (token-in continuation): the ids are the
                # prompt verbatim; the messages still drive tool parsing.
                prompt_ids = self._token_prompt(given)
            constraint: dict[str, Any] = {}
            if forced is not None:
                # Constrained like vLLM's named tool_choice: the call's frame is forced, the
                # arguments are sampled. No trailing space, so the frame tokenises as history does.
                constraint = {
                    "forced_prefix": self.model.tokenize(
                        f'<tool_call>\n{{"name": "{forced}", "arguments":'
                    ),
                    "close_json_with": self.model.tokenize("}\n</tool_call>"),
                }
            gens = [await self._generate(prompt_ids, body, i, **constraint) for i in range(n)]
        except (EngineError, ToolFormatError) as exc:
            return _error(400, exc.message, param=exc.param)
        except _NotFound as exc:
            return _error(404, str(exc), param="model", type_="NotFoundError")
        reply = self._chat_reply(body, prompt_ids, gens, parse_tools=bool(offered))
        if body.get("stream"):
            return StreamingResponse(
                self._stream(body, reply, gens), media_type="text/event-stream"
            )
        return _json(reply)

    def _chat_reply(
        self,
        body: dict[str, Any],
        prompt_ids: list[int],
        gens: list[Generation],
        *,
        parse_tools: bool,
    ) -> dict[str, Any]:
        want_ids = bool(body.get("return_token_ids"))
        choices = []
        for i, gen in enumerate(gens):
            ids = gen.token_ids
            visible = (
                ids[:-1]
                if ids and ids[-1] in self.model.eos_ids and gen.stop_reason is None
                else ids
            )
            content = self.model.detokenize(visible)
            if isinstance(gen.stop_reason, str):
                content = (
                    content[: content.find(gen.stop_reason)]
                    if gen.stop_reason in content
                    else content
                )
            calls: list[dict[str, Any]] = []
            if parse_tools:
                content, calls = parse_calls(content)
            message: dict[str, Any] = {
                "role": "assistant",
                "content": content,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "tool_calls": calls,
                "reasoning": None,
            }
            choices.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": (
                        {
                            "content": [
                                self._logprob_entry(s.token_id, s.logprob, s.top) for s in gen.steps
                            ]
                        }
                        if body.get("logprobs")
                        else None
                    ),
                    "finish_reason": "tool_calls" if calls else gen.finish_reason,
                    "stop_reason": gen.stop_reason,
                    "token_ids": ids if want_ids else None,
                    "routed_experts": None,
                }
            )
        completion = sum(len(g.steps) for g in gens)
        return {
            "id": f"chatcmpl-{secrets.token_hex(8)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.served_name,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": FINGERPRINT,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "total_tokens": len(prompt_ids) + completion,
                "completion_tokens": completion,
                "prompt_tokens_details": None,
                "completion_tokens_details": None,
            },
            "prompt_logprobs": None,
            "prompt_token_ids": prompt_ids if want_ids else None,
            "prompt_text": None,
            "kv_transfer_params": None,
        }

    def _stream(
        self, body: dict[str, Any], reply: dict[str, Any], gens: list[Generation]
    ) -> Iterator[bytes]:
        base = {k: reply[k] for k in ("id", "created", "model")} | {
            "object": "chat.completion.chunk"
        }
        want_ids = bool(body.get("return_token_ids"))
        for choice, gen in zip(reply["choices"], gens, strict=True):
            first: dict[str, Any] = {
                **base,
                "choices": [
                    {
                        "index": choice["index"],
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
            if want_ids:
                first["prompt_token_ids"] = reply["prompt_token_ids"]
            yield b"data: " + orjson.dumps(first) + b"\n\n"
            delta: dict[str, Any] = {"content": choice["message"]["content"]}
            if choice["message"]["tool_calls"]:
                delta["tool_calls"] = [
                    {"index": j, **c} for j, c in enumerate(choice["message"]["tool_calls"])
                ]
            chunk = {
                "index": choice["index"],
                "delta": delta,
                "logprobs": choice["logprobs"],
                "finish_reason": choice["finish_reason"],
                "stop_reason": gen.stop_reason,
            }
            if want_ids:
                chunk["token_ids"] = gen.token_ids
            yield b"data: " + orjson.dumps({**base, "choices": [chunk]}) + b"\n\n"
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            yield (
                b"data: " + orjson.dumps({**base, "choices": [], "usage": reply["usage"]}) + b"\n\n"
            )
        yield b"data: [DONE]\n\n"

    async def completions(self, request: Request) -> Response:
        """``POST /v1/completions``: a token-id or text prompt; ``prompt_logprobs`` re-scores it.

        ``sequential_from`` (an extension; vLLM ignores unknown fields) evaluates positions below it
        in one batch and the rest one token at a time, exactly as a chat generation did, so a
        captured turn re-scores without batching noise.
        """
        try:
            body = await self._body(request)
            prompt = body.get("prompt")
            if isinstance(prompt, str):
                ids = self.model.tokenize(prompt)
            elif (
                isinstance(prompt, list)
                and prompt
                and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
            ):
                ids = list(prompt)
                if not all(0 <= t < self.model.n_vocab for t in ids):
                    raise EngineError(
                        f"prompt token ids must be in [0, {self.model.n_vocab})", param="prompt"
                    )
            else:
                raise EngineError(
                    "'prompt' must be a string or a non-empty list of token ids", param="prompt"
                )
            self._check_sampling(body)
            temperature = _num(body, "temperature", 1.0, lo=0.0)
            want_prompt_lps = body.get("prompt_logprobs") is not None
            scores: list[tuple[float, int]] = []
            start = 1
            if want_prompt_lps:
                start = _int(body, "sequential_from", 1, lo=1) or 1
                scores = await self._run(self.model.score, ids, start, temperature)
            max_tokens = _int(body, "max_tokens", 16, lo=0) or 0
            # Completions' ``logprobs`` is the number of alternatives (0: the sampled token's
            # own logprob only); null asks for none.
            top = _int(body, "logprobs", None, lo=0)
            sampling = {
                **body,
                "max_tokens": max_tokens,
                "logprobs": top is not None,
                "top_logprobs": top or 0,
            }
            gen = await self._generate(ids, sampling, 0) if max_tokens else None
        except (EngineError, ToolFormatError) as exc:
            return _error(400, exc.message, param=exc.param)
        except _NotFound as exc:
            return _error(404, str(exc), param="model", type_="NotFoundError")
        prompt_lps: list[Any] | None = None
        if want_prompt_lps:
            prompt_lps = [None] * start
            for tid, (lp, rank) in zip(ids[start:], scores, strict=True):
                prompt_lps.append(
                    {
                        str(tid): {
                            "logprob": lp,
                            "rank": rank,
                            "decoded_token": self.model.piece(tid),
                        }
                    }
                )
        sampled = gen.token_ids if gen else []
        choice = {
            "index": 0,
            "text": self.model.detokenize(sampled) if sampled else "",
            "logprobs": self._completion_logprobs(gen) if gen and top is not None else None,
            "finish_reason": gen.finish_reason if gen else "length",
            "stop_reason": gen.stop_reason if gen else None,
            "token_ids": sampled if body.get("return_token_ids") else None,
            "prompt_logprobs": prompt_lps,
            "prompt_token_ids": ids if body.get("return_token_ids") else None,
        }
        return _json(
            {
                "id": f"cmpl-{secrets.token_hex(8)}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.served_name,
                "choices": [choice],
                "service_tier": None,
                "system_fingerprint": FINGERPRINT,
                "usage": {
                    "prompt_tokens": len(ids),
                    "total_tokens": len(ids) + len(sampled),
                    "completion_tokens": len(sampled),
                },
            }
        )

    # ---- vLLM's RL routes: weight sync and its pause ------------------------------------------

    def _keyed(self, handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
        """A route that changes what the engine serves: the admin key first, then ``handler``,
        whose refusals (:class:`WeightUpdateError`) become errors naming the field."""

        async def route(request: Request) -> Response:
            if self.admin_key is None:
                return _error(
                    403,
                    f"{request.url.path} changes the served weights: start rollwire engine with "
                    "--admin-key KEY and send 'Authorization: Bearer KEY'",
                    type_="PermissionDenied",
                )
            given = request.headers.get("authorization", "")
            token = given[7:] if given[:7].lower() == "bearer " else ""
            if not secrets.compare_digest(token.encode(), self.admin_key.encode()):
                return _error(
                    401, "wrong or missing admin key (Authorization: Bearer KEY)",
                    type_="Unauthorized",
                )  # fmt: skip
            try:
                return await handler(request)
            except WeightUpdateError as exc:
                return _error(exc.status, exc.message, param=exc.param)
            except EngineError as exc:
                return _error(400, exc.message, param=exc.param)

        return route

    async def _fields(self, request: Request, *names: str) -> dict[str, Any]:
        """The JSON body's named fields (vLLM's ``Body(embed=True)``); an empty body is ``{}``."""
        raw = await request.body()
        if not raw.strip():
            return {}
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise WeightUpdateError(f"JSON decode error: {exc}", param="body") from None
        if not isinstance(body, dict):
            raise WeightUpdateError("the request body must be a JSON object", param="body")
        unknown = sorted(set(body) - set(names))
        if unknown:
            raise WeightUpdateError(
                f"unknown field(s) {unknown}; {request.url.path} takes {list(names)}",
                param=unknown[0],
            )
        return body

    @staticmethod
    async def _off_loop(fn: Any, *args: Any) -> Any:
        # Not the model's limiter: a generation holds it, and a pause must reach that call.
        return await anyio.to_thread.run_sync(lambda: fn(*args))

    async def weight_info(self, _request: Request) -> Response:
        """``GET /weight_info``: ``{"weight_version": ...}`` (``"default"`` before any update)."""
        return _json({"weight_version": self.weights.version})

    async def is_paused(self, _request: Request) -> Response:
        """``GET /is_paused``."""
        return _json({"is_paused": self.weights.gate.paused})

    async def pause(self, request: Request) -> Response:
        """``POST /pause?mode=abort|wait|keep`` (vLLM's default: abort)."""
        mode = request.query_params.get("mode", "abort")
        if mode not in PAUSE_MODES:
            raise WeightUpdateError(f"mode={mode!r}: one of {list(PAUSE_MODES)}", param="mode")
        await self._off_loop(self.weights.gate.pause, mode)
        return _json({"status": "paused"})

    async def resume(self, _request: Request) -> Response:
        """``POST /resume``."""
        self.weights.gate.resume()
        return _json({"status": "resumed"})

    async def init_weight_transfer_engine(self, request: Request) -> Response:
        """``POST /init_weight_transfer_engine`` ``{"init_info": {...}}``."""
        body = await self._fields(request, "init_info")
        await self._off_loop(self.weights.init_transfer, body.get("init_info", {}))
        return _json({"message": "Weight transfer initialized"})

    async def start_weight_update(self, request: Request) -> Response:
        """``POST /start_weight_update``."""
        await self._fields(request)
        await self._off_loop(self.weights.start)
        return _json({"message": "Weight update started"})

    async def update_weights(self, request: Request) -> Response:
        """``POST /update_weights`` ``{"update_info": {"path": DIR} | {"safetensors": B64}}``."""
        body = await self._fields(request, "update_info")
        if "update_info" not in body:
            raise WeightUpdateError("update_info is required", param="update_info")
        await self._off_loop(self.weights.stage, body["update_info"])
        return _json({"message": "Weights updated"})

    async def finish_weight_update(self, request: Request) -> Response:
        """``POST /finish_weight_update`` ``{"weight_version": "..."}`` (optional)."""
        body = await self._fields(request, "weight_version")
        await self._off_loop(self.weights.finish, body.get("weight_version"))
        return _json({"message": "Weight update finished"})

    async def update_weight_version(self, request: Request) -> Response:
        """``POST /update_weight_version`` ``{"new_version": "..."}``."""
        body = await self._fields(request, "new_version")
        version = self.weights.set_version(body.get("new_version"))
        return _json({"success": True, "new_version": version})

    async def weight_checker(self, request: Request) -> Response:
        """``POST /weight_checker`` ``{"action": "checksum"|"reset"|"compare", "baseline"}``."""
        body = await self._fields(request, "action", "baseline")
        action = body.get("action")
        if action == "reset":
            await self._off_loop(self.weights.reset)
            return _json({"status": "reset"})
        if action not in ("checksum", "compare"):
            raise WeightUpdateError(
                f"action={action!r}: one of checksum, reset, compare", param="action"
            )
        baseline = body.get("baseline")
        if action == "compare" and not isinstance(baseline, dict):
            raise WeightUpdateError(
                "action='compare' requires a 'baseline' object", param="baseline"
            )
        checksums = await self._off_loop(self.weights.checksums)
        if action == "checksum":
            return _json({"checksums": checksums})
        assert isinstance(baseline, dict)
        mismatched = sorted(
            k for k in checksums.keys() | baseline.keys() if checksums.get(k) != baseline.get(k)
        )
        return _json({"match": not mismatched, "mismatches": mismatched})


class _NotFound(Exception):
    pass


def forced_tool(choice: Any, tools: list[dict[str, Any]] | None) -> str | None:
    """The function a ``tool_choice`` forces (``required``: the first tool), or None."""
    names = [(t.get("function") or {}).get("name") for t in tools or []]
    if choice in (None, "auto", "none"):
        return None
    if not names:
        raise EngineError(f"tool_choice={choice!r} needs a non-empty 'tools'", param="tool_choice")
    if choice == "required":
        return names[0]
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        if name in names:
            return name
        raise EngineError(
            f"tool_choice names {name!r}, which is not among the tools {names}", param="tool_choice"
        )
    raise EngineError(
        f"tool_choice={choice!r} must be auto, none, required or a named function",
        param="tool_choice",
    )


def create_engine_app(
    model: EngineModel,
    *,
    served_name: str,
    raw_logprobs: bool = False,
    admin_key: str | None = None,
    weights_roots: list[Path] | None = None,
) -> Starlette:
    """The engine as an ASGI app (its :class:`ReferenceEngine` at ``app.state.engine``)."""
    engine = ReferenceEngine(
        model,
        served_name=served_name,
        raw_logprobs=raw_logprobs,
        admin_key=admin_key,
        weights_roots=weights_roots,
    )
    engine.app.state.engine = engine
    return engine.app
