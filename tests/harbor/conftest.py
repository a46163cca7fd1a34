"""Fixtures of the harbor tests that call a model: the fake vLLM and a capture proxy on it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from rollwire.capture.proxy import CaptureProxy, ProxyConfig
from rollwire.capture.rollout import CaptureLevel
from rollwire.capture.upstream import Upstream
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import DEFAULT_MODEL, FakeVLLM


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeVLLM]:
    vllm = FakeVLLM(max_model_len=200_000)
    with serve_in_thread(vllm.app) as url:
        vllm.url = url  # type: ignore[attr-defined]
        yield vllm


@pytest.fixture
async def proxy(fake) -> AsyncIterator[CaptureProxy]:
    """A capture proxy on the fake (reset per test), its upstream owned here."""
    fake.reset()
    upstream = Upstream(fake.url)
    config = ProxyConfig(llm_url=fake.url, model=DEFAULT_MODEL, capture_level=CaptureLevel.TOKENS)
    try:
        yield CaptureProxy(config, upstream=upstream)
    finally:
        await upstream.aclose()
