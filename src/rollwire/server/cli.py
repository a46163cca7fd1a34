"""The ``rollwire`` command line."""

from __future__ import annotations

import argparse
import functools
import ipaddress
import logging
import socket
import sys
from collections.abc import Sequence

import anyio
import httpx
import uvicorn

from rollwire.capture.certify import Certification, Verdict, render_table, validate_llm
from rollwire.capture.proxy import CaptureProxy, ProxyConfig
from rollwire.capture.rollout import CaptureLevel

log = logging.getLogger("rollwire")

DEFAULT_PROXY_PORT = 8300


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def _preflight(args: argparse.Namespace) -> Certification:
    cert = await validate_llm(args.llm_url, model=args.model, api_key=args.api_key)
    for finding in cert.findings:
        _say(f"  [{finding.level}] {finding.code}: {finding.message}")
    if cert.verdict is Verdict.NOT_USABLE or cert.model is None:
        raise SystemExit(
            f"rollwire proxy: cannot use {args.llm_url}: {cert.verdict.value}; see above"
        )
    return cert


def _bind(host: str, port: int) -> socket.socket:
    """Bind the listening socket here, so a taken port is a clear error rather than a traceback."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on connections of such a listener.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        msg = f"rollwire proxy: cannot bind {host}:{port} ({exc.strerror}); choose another --port"
        raise SystemExit(msg) from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


async def _serve_proxy(args: argparse.Namespace) -> None:
    cert = await _preflight(args)
    model, level = cert.model, cert.capture_level
    proxy = CaptureProxy(
        ProxyConfig(
            llm_url=args.llm_url,
            model=model,
            api_key=args.api_key,
            admin_key=args.admin_key,
            capture_level=level,
            max_body_bytes=int(args.max_body_mb * 1024 * 1024),
            param_fixes=tuple(f.param for f in cert.param_fixes),
        )
    )
    sock = _bind(args.host, args.port)
    config = uvicorn.Config(proxy.app, log_level="warning", lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        while not server.started:
            if server.should_exit:
                return
            await anyio.sleep(0.05)
        host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
        port = sock.getsockname()[1]
        url = f"http://{host}:{port}"
        # A healthy answer from someone else's server on our port would mint sessions nobody honours.
        async with httpx.AsyncClient(timeout=5.0) as client:
            health = (await client.get(f"{url}/health")).json()
        if health.get("instance_id") != proxy.instance_id:
            server.should_exit = True
            raise SystemExit(
                f"rollwire proxy: {url} is answered by another process; choose another --port"
            )
        verdict = "TRAIN" if level is CaptureLevel.TOKENS else "EVAL ONLY"
        _say(
            f"rollwire proxy on {url} -> {proxy.config.llm_url} (model {model}, tier {level.value}: {verdict})"
        )
        _say(
            f"  open a session: curl -X POST {url}/sessions ; then use its session_id as the API key"
        )


def _cmd_proxy(args: argparse.Namespace) -> int:
    if not _is_loopback(args.host) and not args.admin_key:
        _say(f"rollwire proxy: --host {args.host} is reachable from outside: set --admin-key")
        return 2
    anyio.run(_serve_proxy, args)
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    cert = anyio.run(
        functools.partial(
            validate_llm,
            args.llm_url,
            model=args.model,
            api_key=args.api_key,
            timeout_s=args.timeout,
            probe_tools=not args.no_tools,
        )
    )
    if args.json:
        print(cert.model_dump_json(indent=2))
    else:
        print(render_table(cert))
    if cert.verdict is Verdict.NOT_USABLE:
        return 1
    if args.require_train and cert.verdict is not Verdict.TRAIN:
        return 3
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(prog="rollwire", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "proxy",
        help="run the capture proxy in front of an OpenAI-spec endpoint",
        description=(
            "Capture proxy: agents call it with a session id as their API key; it records the "
            "engine's token ids and logprobs of every call. The capture tier is probed at start."
        ),
    )
    p.add_argument(
        "--llm-url",
        required=True,
        help="the engine's OpenAI base URL, e.g. http://127.0.0.1:8000/v1",
    )
    p.add_argument(
        "--model", help="served model to use (required when the endpoint serves several)"
    )
    p.add_argument("--api-key", help="API key for the upstream endpoint, if it needs one")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument(
        "--port", type=int, default=DEFAULT_PROXY_PORT, help=f"port (default {DEFAULT_PROXY_PORT})"
    )
    p.add_argument(
        "--admin-key", help="bearer key for the /sessions control routes (required off loopback)"
    )
    p.add_argument(
        "--max-body-mb", type=float, default=8.0, help="largest request body accepted (default 8)"
    )
    p.set_defaults(func=_cmd_proxy)

    v = sub.add_parser(
        "validate",
        help="certify an endpoint: TRAIN, EVAL ONLY or NOT USABLE",
        description=(
            "Probe an OpenAI-spec endpoint: reachability, served models, capture tier (tokens "
            "only with evidence of aligned ids and processed logprobs), tool calls, parameter "
            "fixes. Exit 0 when usable, 1 when not usable, 3 with --require-train and no TRAIN."
        ),
    )
    v.add_argument("--llm-url", required=True, help="the engine's OpenAI base URL")
    v.add_argument("--model", help="served model to certify (required when several are served)")
    v.add_argument("--api-key", help="API key for the endpoint, if it needs one")
    v.add_argument("--json", action="store_true", help="print the result as JSON")
    v.add_argument("--no-tools", action="store_true", help="skip the tool-call probe")
    v.add_argument("--timeout", type=float, default=120.0, help="seconds per request (default 120)")
    v.add_argument(
        "--require-train", action="store_true", help="exit 3 unless the verdict is TRAIN"
    )
    v.set_defaults(func=_cmd_validate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rollwire`` console script."""
    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
