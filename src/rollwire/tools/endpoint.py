"""Endpoints the MCP server talks to: certified once per endpoint, one capture proxy each.

A usable certification is cached per (llm_url, model, api_key); one that was not usable is not
cached, so an engine that comes up later is certified on the next call. Each usable endpoint
gets one in-process :class:`CaptureProxy` (and one upstream client) shared by every rollout.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from rollwire.capture.certify import Certification, Verdict, validate_llm
from rollwire.capture.proxy import CaptureProxy, certified_config
from rollwire.capture.upstream import Upstream, normalise_base_url

log = logging.getLogger("rollwire.mcp")

EndpointKey = tuple[str, str | None, str | None]


@dataclass
class Endpoint:
    """A certified endpoint and the capture proxy in front of it."""

    certification: Certification
    proxy: CaptureProxy
    upstream: Upstream


class EndpointNotUsable(RuntimeError):
    """Certification said NOT USABLE; ``certification`` says why."""

    def __init__(self, certification: Certification) -> None:
        reasons = "; ".join(
            f"{f.code}: {f.message}" for f in certification.findings if f.level.value == "FATAL"
        ) or "; ".join(f"{f.code}: {f.message}" for f in certification.findings)
        super().__init__(
            f"{certification.llm_url} is {certification.verdict.value}"
            + (f" ({reasons})" if reasons else "")
        )
        self.certification = certification


class EndpointPool:
    """Certifications and capture proxies, keyed by endpoint.

    Used as an async context manager, the pool also owns one loopback HTTP server per proxy
    (:meth:`served_url`) for agents that run as separate programs, and stops them on exit.
    """

    def __init__(
        self, *, admin_key: str | None = None, token_in: str = "auto", **proxy_settings: Any
    ) -> None:
        self.admin_key = admin_key
        self.token_in = token_in
        # More ProxyConfig settings for every proxy made (token_in_path, tool_parser, ...).
        self.proxy_settings = {k: v for k, v in proxy_settings.items() if v is not None}
        self._certs: dict[EndpointKey, Certification] = {}
        self._endpoints: dict[EndpointKey, Endpoint] = {}
        self._locks: dict[EndpointKey, anyio.Lock] = {}
        self._urls: dict[int, str] = {}
        self._serve_lock = anyio.Lock()
        self._tg: anyio.abc.TaskGroup | None = None
        self.certify_calls = 0  # how many certifications actually ran (cache misses)
        self._announced: dict[str, str] = {}  # engine URL -> the weight version announced

    async def __aenter__(self) -> EndpointPool:
        self._tg = await anyio.create_task_group().__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        tg, self._tg = self._tg, None
        try:
            if tg is not None:
                tg.cancel_scope.cancel()
                await tg.__aexit__(None, None, None)
        finally:
            self._urls.clear()
            await self.aclose()

    async def served_url(self, endpoint: Endpoint) -> str | None:
        """The root URL of ``endpoint``'s proxy on a loopback port, started on first use;
        None when the pool is not entered (then a caller serves the proxy itself)."""
        if self._tg is None:
            return None
        async with self._serve_lock:
            url = self._urls.get(id(endpoint.proxy))
            if url is None:
                url = await self._tg.start(_serve, endpoint.proxy)
                self._urls[id(endpoint.proxy)] = url
                log.info("capture proxy for %s on %s", endpoint.proxy.config.llm_url, url)
            return url

    async def certify(
        self, llm_url: str, *, model: str | None, api_key: str | None, probe_tools: bool = True
    ) -> Certification:
        """Certify now (no cache read); a usable result is remembered for rollouts."""
        self.certify_calls += 1
        cert = await validate_llm(llm_url, model=model, api_key=api_key, probe_tools=probe_tools)
        if cert.verdict is not Verdict.NOT_USABLE and cert.model is not None:
            self._certs[(llm_url, model, api_key)] = cert
        return cert

    async def endpoint(self, llm_url: str, *, model: str | None, api_key: str | None) -> Endpoint:
        """The endpoint's proxy, certifying it first when no usable certification is cached.

        Raises :class:`EndpointNotUsable` when the endpoint is not usable.
        """
        key = (llm_url, model, api_key)
        lock = self._locks.setdefault(key, anyio.Lock())
        async with lock:
            made = self._endpoints.get(key)
            if made is not None:
                return made
            cert = self._certs.get(key)
            if cert is None:
                cert = await self.certify(llm_url, model=model, api_key=api_key, probe_tools=False)
            if cert.verdict is Verdict.NOT_USABLE or cert.model is None:
                raise EndpointNotUsable(cert)
            log.info("%s certified %s (%s)", llm_url, cert.verdict.value, cert.model)
            upstream = Upstream(llm_url, api_key=api_key)
            proxy = CaptureProxy(
                certified_config(
                    llm_url,
                    cert,
                    admin_key=self.admin_key,
                    token_in=self.token_in,
                    **self.proxy_settings,
                ),
                upstream=upstream,
            )
            proxy.announced_version = self._announced.get(normalise_base_url(llm_url))
            made = Endpoint(certification=cert, proxy=proxy, upstream=upstream)
            self._endpoints[key] = made
            return made

    def announce(self, llm_url: str, version: str) -> list[dict[str, Any]]:
        """A trainer says which weights the engine at ``llm_url`` now serves: every proxy in
        front of it (now and later) records ``version`` on the calls it captures, unless the
        engine reports its own (``GET /weight_info``). Returns the endpoints it applies to."""
        url = normalise_base_url(llm_url)
        self._announced[url] = version
        applied = []
        for (endpoint_url, model, _), made in self._endpoints.items():
            if normalise_base_url(endpoint_url) == url:
                made.proxy.announced_version = version
                applied.append(
                    {
                        "llm_url": endpoint_url,
                        "model": model or made.certification.model,
                        "engine_reports_version": made.certification.weight_info,
                    }
                )
        return applied

    def announced(self) -> dict[str, str]:
        """The versions announced so far, by engine URL."""
        return dict(self._announced)

    def endpoints(self) -> list[Endpoint]:
        """Every endpoint made so far (its proxy's live sessions are in ``proxy.sessions``)."""
        return list(self._endpoints.values())

    @property
    def n_proxies(self) -> int:
        """Capture proxies built so far (one per endpoint)."""
        return len(self._endpoints)

    async def aclose(self) -> None:
        """Close every upstream client."""
        endpoints, self._endpoints = list(self._endpoints.values()), {}
        for made in endpoints:
            await made.upstream.aclose()


async def _serve(proxy: CaptureProxy, *, task_status: anyio.abc.TaskStatus[str]) -> None:
    from rollwire.harnesses.harbor.rollout import serve_proxy

    async with serve_proxy(proxy) as url:
        task_status.started(url)
        await anyio.sleep_forever()
