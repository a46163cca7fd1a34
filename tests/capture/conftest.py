"""A real uvicorn-served fake vLLM and a real uvicorn-served capture proxy in front of it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from rollwire.capture.proxy import CaptureProxy, ProxyConfig
from rollwire.capture.rollout import CaptureLevel
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM

# The control plane always takes a key: the one every proxy started here is given by default.
ADMIN_KEY = "test-admin-key"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@dataclass
class Upstream:
    fake: FakeVLLM
    url: str


@dataclass
class Proxy:
    proxy: CaptureProxy
    url: str
    upstream: Upstream

    @property
    def admin(self) -> dict[str, str]:
        """The control plane's auth header, with the key this proxy runs under."""
        return {"Authorization": f"Bearer {self.proxy.admin_key}"}

    def open_session(self, **body) -> str:
        resp = httpx.post(f"{self.url}/sessions", json=body or None, headers=self.admin)
        resp.raise_for_status()
        return resp.json()["session_id"]

    def client(self, session_id: str, **kw) -> openai.OpenAI:
        kw.setdefault("max_retries", 0)
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=session_id, **kw)

    def async_client(self, session_id: str, **kw) -> openai.AsyncOpenAI:
        kw.setdefault("max_retries", 0)
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=session_id, **kw)

    def rollout(self, session_id: str) -> dict:
        resp = httpx.get(f"{self.url}/sessions/{session_id}/rollout", headers=self.admin)
        resp.raise_for_status()
        return resp.json()


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    fake = FakeVLLM()
    with serve_in_thread(fake.app) as url:
        yield Upstream(fake, url)


def start_proxy(upstream_url: str, **config) -> tuple[CaptureProxy, object]:
    config.setdefault("capture_level", CaptureLevel.TOKENS)
    config.setdefault("admin_key", ADMIN_KEY)
    proxy = CaptureProxy(ProxyConfig(llm_url=upstream_url, **config))
    return proxy, serve_in_thread(proxy.app)


@pytest.fixture
def proxy(upstream: Upstream) -> Iterator[Proxy]:
    cap, server = start_proxy(f"{upstream.url}/v1")
    with server as url:
        yield Proxy(cap, url, upstream)
