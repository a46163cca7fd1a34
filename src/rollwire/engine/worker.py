"""The child process the reference engine runs in (``python -m rollwire.engine.worker FD``).

Started by :func:`rollwire.engine.process.running_engine`, never by hand: ``FD`` is the listening
socket its owner bound; the first line of stdin is the :class:`~rollwire.engine.process.
EngineSpec`; the owner stops it with SIGTERM, and its death stops it too. Reports go
to the original stdout as JSON lines (``library`` before the model loads, ``ready`` once it
serves); everything else this process prints goes to stderr.

Before the model loads it refuses, in one line and exit code 2, a CPU without AVX2 and a
library built for instruction sets this CPU does not enable; once loaded it decodes one token,
so a library that crashes on this CPU crashes here, before the owner relies on it.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from rollwire.engine.process import (
    FAULT_ENV,
    REBUILD,
    REFUSED,
    EngineSpec,
    library_features,
    no_avx2_line,
    parse_fault,
    read_cpu_flags,
    unsupported_features,
)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _report(out: BinaryIO, event: str, **fields: Any) -> None:
    out.write(orjson.dumps({"event": event, **fields}) + b"\n")
    out.flush()


def _lifeline(owner: int) -> None:
    """Once the owner is gone (this process re-parented: it died without stopping us, even by
    SIGKILL), stop this process as SIGTERM does. (Not stdin's end: under uvloop the child
    inherits the owner's end of its stdin socket pair, so that end never comes.)"""
    while os.getppid() == owner:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)


def _inject_fault(model: Any, value: str | None) -> None:
    """The hidden fault switch: signal this process in the Nth model call, mid-request."""
    fault = parse_fault(value)
    if fault is None:
        return
    sig, nth = fault
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file for a drill
    signal.signal(sig, signal.SIG_DFL)  # here: the model runs in a worker thread
    start = model._start
    calls = 0

    def faulty_start(prompt_ids: list[int]) -> None:
        nonlocal calls
        calls += 1
        if calls == nth:
            os.kill(os.getpid(), sig)
        start(prompt_ids)

    model._start = faulty_start


def _check_library(spec: EngineSpec, out: BinaryIO) -> int | None:
    """Load llama.cpp (no model yet), report its instruction sets; refuse what cannot run."""
    flags = read_cpu_flags()
    line = no_avx2_line(flags)
    if line is not None:
        _say(line)
        return REFUSED
    try:
        import llama_cpp
    except ImportError as exc:
        _say(
            f"rollwire engine: llama-cpp-python is not installed ({exc}); install the engine "
            "extra: rollwire[engine]"
        )
        return REFUSED
    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    features = library_features(info)
    _report(out, "library", system_info=info)
    if spec.verbose:
        _say(f"rollwire engine: llama.cpp {llama_cpp.__version__}: {info.strip()}")
    missing = unsupported_features(features, flags or set())
    if flags and missing:
        _say(
            f"rollwire: the reference engine's llama.cpp is built for {', '.join(missing)}, "
            f"which this CPU does not enable (/proc/cpuinfo flags); {REBUILD}"
        )
        return REFUSED
    return None


def main(argv: list[str]) -> int:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # as the CLI: `kill -USR1` shows stacks
    fd = int(argv[1])
    status = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the library's and uvicorn's prints go to stderr; stdout is for reports
    owner = os.getppid()
    spec = EngineSpec.from_json(sys.stdin.buffer.readline())
    threading.Thread(target=_lifeline, args=(owner,), name="lifeline", daemon=True).start()
    from rollwire.engine.model import load_model, model_kind

    try:
        gguf = model_kind(spec.model_path) == "gguf"
    except FileNotFoundError as exc:
        _say(f"rollwire engine: {exc}")
        return REFUSED
    if gguf:
        refused = _check_library(spec, status)
        if refused is not None:
            return refused
    from rollwire.engine.server import create_engine_app

    try:
        model = load_model(spec.model_path, n_ctx=spec.n_ctx, n_threads=spec.n_threads)
    except ImportError as exc:
        hint = "" if "rollwire[" in str(exc) else " (install the engine extra: rollwire[engine])"
        _say(f"rollwire engine: {exc}{hint}")
        return REFUSED
    except (FileNotFoundError, ValueError) as exc:
        _say(f"rollwire engine: {exc}")
        return REFUSED
    model.next_logprobs(model.tokenize("Hello"))  # one decode: a crash on this CPU happens here
    _inject_fault(model, os.environ.get(FAULT_ENV))
    app = create_engine_app(
        model,
        served_name=spec.served_name,
        raw_logprobs=spec.raw_logprobs,
        admin_key=spec.admin_key,
        weights_roots=[Path(r) for r in spec.weights_roots],
    )
    sock = socket.socket(fileno=fd)
    return _serve(app, sock, model, status)


def _serve(app: Any, sock: socket.socket, model: Any, status: BinaryIO) -> int:
    from rollwire.serving import run_server, serving, settle_gc, url_of

    url = url_of(sock)

    async def serve() -> None:
        async with serving(app, sock, stop_on_exit=False):
            settle_gc()
            _report(
                status,
                "ready",
                url=url,
                pid=os.getpid(),
                backend=model.backend,
                path=str(model.path),
                supports_weight_updates=model.supports_weight_updates,
            )
        # the block ends when uvicorn stops: SIGTERM (the lifeline's too) or SIGINT

    try:
        run_server(serve)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    # not sys.exit: nothing is left to finalize, and the lifeline thread sleeps on
    # ("could not acquire lock for <stdin>" aborted a finalizing interpreter once)
    os._exit(code)
