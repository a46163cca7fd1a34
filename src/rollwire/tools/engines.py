"""Many engines behind one collection: certified together, one per rollout, drained on failure.

A collection given several engine URLs (``--llm-url`` repeated, MCP ``llm`` as a list) needs
them to be one model: every engine is certified, and they must agree on the served model, the
capture tier, token-in, the close token, the tool parser and, where the engines tokenize
(``/tokenize``), on the token ids of a probe conversation. Any difference is a refusal naming
the field and both values.

Each rollout is pinned to one engine for its whole life (its prefix cache, and token-in
continuation, live on that engine): :meth:`EngineSet.lease` picks the live engine with the
fewest model calls in flight (then the fewest pinned rollouts) when the rollout starts. An
engine whose exchanges fail at the transport level ``DRAIN_AFTER`` times in a row (refused,
unreachable, timed out, closed mid-reply) is drained: no new rollout goes to it, and the
rollouts pinned to it end as failed results through their own model calls' errors (no retry
on another engine: a rollout's tokens come from one engine). When every engine is drained,
:meth:`lease` raises :class:`NoEngineLeft`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from pydantic import BaseModel, Field

from rollwire.capture.upstream import UpstreamError
from rollwire.tools.endpoint import Endpoint, EndpointNotUsable, EndpointPool

log = logging.getLogger("rollwire.engines")

#: transport failures in a row (no reply at all) after which an engine takes no new rollouts
DRAIN_AFTER = 3

#: the conversation every engine tokenizes when they are compared
_PROBE = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "Add 12 and 30; answer with the number only."},
]


class EnginesDiffer(ValueError):
    """The engines are not one model (or one is not usable); the message starts with ``llm``."""


class NoEngineLeft(RuntimeError):
    """Every engine of the set is drained."""


class EngineUse(BaseModel):
    """What one engine did in a run."""

    url: str
    rollouts: int = Field(default=0, description="rollouts started on it")
    failed: int = Field(default=0, description="of those, failed")
    drained: str | None = Field(default=None, description="why it takes no new rollouts")


@dataclass
class Engine:
    """One certified engine and its capture proxy."""

    index: int
    url: str
    model: str | None
    api_key: str | None
    endpoint: Endpoint
    pinned: int = 0
    rollouts: int = 0
    failed: int = 0
    drained: str | None = None

    def load(self) -> tuple[int, int, int]:
        return (self.endpoint.upstream.in_flight, self.pinned, self.index)

    def check_health(self) -> None:
        upstream = self.endpoint.upstream
        if self.drained is None and upstream.transport_failures_in_a_row >= DRAIN_AFTER:
            self.drained = (
                f"{upstream.transport_failures_in_a_row} exchanges in a row got no reply "
                f"(last: {upstream.last_transport_error})"
            )
            log.warning("engine %s drained: %s", self.url, self.drained)


def _fingerprint(endpoint: Endpoint) -> dict[str, Any]:
    cert = endpoint.certification
    return {
        "model": cert.model,
        "capture tier": cert.capture_level.value,
        "token-in": cert.token_in,
        "token-in path": cert.token_in_paths[0] if cert.token_in_paths else None,
        "close token": cert.close_token_id,
        "tool parser": cert.tool_parser,
    }


async def _probe_ids(endpoint: Endpoint) -> list[int] | None:
    """The engine's token ids of the probe conversation, or None when it does not tokenize."""
    body = {
        "model": endpoint.certification.model,
        "messages": _PROBE,
        "add_generation_prompt": True,
    }
    try:
        return await endpoint.upstream.tokenize(body)
    except UpstreamError:
        return None


class EngineSet:
    """Engines serving one model; rollouts are leased one engine each."""

    def __init__(self, engines: Sequence[Engine]) -> None:
        if not engines:
            raise ValueError("an engine set needs at least one engine")
        self.engines = list(engines)

    @classmethod
    async def certify(
        cls, pool: EndpointPool, specs: Sequence[tuple[str, str | None, str | None]]
    ) -> EngineSet:
        """Certify ``specs`` ((url, model, api_key) each) together. Raises
        :class:`EnginesDiffer` when one is not usable or they are not one model."""
        if len({url for url, _, _ in specs}) != len(specs):
            raise EnginesDiffer(f"llm: an engine URL is given twice: {[s[0] for s in specs]}")
        endpoints: list[Endpoint | None] = [None] * len(specs)
        errors: list[str] = []

        async def one(i: int, url: str, model: str | None, api_key: str | None) -> None:
            try:
                endpoints[i] = await pool.endpoint(url, model=model, api_key=api_key)
            except EndpointNotUsable as exc:
                errors.append(f"llm: {exc}")

        async with anyio.create_task_group() as tg:
            for i, (url, model, api_key) in enumerate(specs):
                tg.start_soon(one, i, url, model, api_key)
        if errors:
            raise EnginesDiffer("; ".join(sorted(errors)))
        made = [
            Engine(index=i, url=url, model=model, api_key=key, endpoint=e)
            for i, ((url, model, key), e) in enumerate(zip(specs, endpoints, strict=True))
            if e is not None
        ]
        if len(made) > 1:
            await _same_model(made)
        return cls(made)

    @property
    def first(self) -> Engine:
        return self.engines[0]

    @contextlib.contextmanager
    def lease(self) -> Iterator[Engine]:
        """The live engine with the least load, pinned for the ``with`` block (one rollout).
        Raises :class:`NoEngineLeft` when every engine is drained."""
        for engine in self.engines:
            engine.check_health()
        live = [e for e in self.engines if e.drained is None]
        if not live:
            reasons = "; ".join(f"{e.url}: {e.drained}" for e in self.engines)
            raise NoEngineLeft(f"every engine is drained ({reasons})")
        engine = min(live, key=Engine.load)
        engine.pinned += 1
        engine.rollouts += 1
        try:
            yield engine
        finally:
            engine.pinned -= 1
            engine.check_health()

    def use(self) -> list[EngineUse]:
        """Per-engine counts so far."""
        return [
            EngineUse(url=e.url, rollouts=e.rollouts, failed=e.failed, drained=e.drained)
            for e in self.engines
        ]


async def _same_model(engines: list[Engine]) -> None:
    base = engines[0]
    want = _fingerprint(base.endpoint)
    for other in engines[1:]:
        got = _fingerprint(other.endpoint)
        for field, value in want.items():
            if got[field] != value:
                raise EnginesDiffer(
                    f"llm: the engines are not one model: {field} is {value!r} at {base.url} "
                    f"but {got[field]!r} at {other.url}"
                )
    ids = [await _probe_ids(e.endpoint) for e in engines]
    if all(x is None for x in ids):
        log.info("engines do not tokenize (/tokenize): compared by certification only")
        return
    ref = next(i for i, x in enumerate(ids) if x is not None)
    for engine, got_ids in zip(engines, ids, strict=True):
        if got_ids is None:
            raise EnginesDiffer(
                f"llm: {engine.url} does not tokenize (/tokenize) but {engines[ref].url} does: "
                "cannot check that they share a tokenizer"
            )
        if got_ids != ids[ref]:
            raise EnginesDiffer(
                f"llm: the engines' tokenizers differ: {engines[ref].url} gives {len(ids[ref])} "
                f"ids for the probe conversation, {engine.url} {len(got_ids)} (first difference "
                f"at position {_first_difference(ids[ref], got_ids)})"
            )


def _first_difference(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


__all__ = [
    "DRAIN_AFTER",
    "Engine",
    "EngineSet",
    "EngineUse",
    "EnginesDiffer",
    "NoEngineLeft",
]
