"""The reference engine in a child process of its own: a native crash ends the engine only.

llama.cpp is native code. A fault inside it (``SIGSEGV``; ``SIGILL`` on an instruction the CPU or
its hypervisor does not enable; the OOM killer's ``SIGKILL``) ends the process it runs in, with no
Python exception to catch. So every caller that embeds the engine (``rollwire demo``,
``rollwire engine``, ``rollwire serve --embedded-engine``, the test fixtures) runs it here, in
:mod:`rollwire.engine.worker`, and talks to it over HTTP as to any engine. When the child dies,
the caller says so in one line that names the engine, the signal and what to try
(:func:`describe_exit`), and goes on: an MCP server keeps answering, and a tool call that was
waiting on the engine ends in a tool error (:meth:`EngineProcess.guarded`).

The protocol between the two is small. The owner binds the listening socket (a taken port is
its own clear error) and hands it to the child (``pass_fds``); the child reads its
:class:`EngineSpec` from the first line of its stdin, reports on its stdout in JSON lines (the
library's instruction-set report before the model loads, then ``ready``) and writes everything
else to stderr. The owner stops it with SIGTERM; an owner that dies without doing so (even by
SIGKILL) leaves the child re-parented, and the child then stops itself.

The pure part (:func:`describe_exit`, :func:`library_features`, :func:`unsupported_features`,
:data:`PORTABLE_FEATURES`) imports nothing native, so the one line can be written without the
library the crash came from.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
import orjson

from rollwire.serving import bind, url_of

T = TypeVar("T")

LLAMA_CPP_VERSION = "0.3.36"
# The instruction-set features the reference engine's llama.cpp may be built with: the x86-64
# AVX2 level (Haswell, 2013, and every x86-64 CPU a cloud sells since), nothing beyond. What the
# library reports (llama_print_system_info) is checked against this by the tests, so a native
# build (AVX-512, AMX, AVX-VNNI) cannot slip back in. LLAMAFILE, OPENMP and REPACK are code
# paths, not instruction sets; they appear in the same report.
PORTABLE_FEATURES = frozenset({"SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2"})
NOT_INSTRUCTION_SETS = frozenset({"LLAMAFILE", "OPENMP", "REPACK", "KLEIDIAI"})
# Each feature llama.cpp reports, as /proc/cpuinfo names the CPU flag it needs.
CPU_FLAGS = {
    "SSE3": "pni",
    "SSSE3": "ssse3",
    "AVX": "avx",
    "AVX2": "avx2",
    "F16C": "f16c",
    "FMA": "fma",
    "BMI2": "bmi2",
    "AVX_VNNI": "avx_vnni",
    "AVX512": "avx512f",
    "AVX512_VBMI": "avx512vbmi",
    "AVX512_VNNI": "avx512_vnni",
    "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
    "AMX_BF16": "amx_bf16",
}
# How to get the portable build, in a clone (pyproject.toml's CMAKE_ARGS) and with pip.
REBUILD = (
    "rebuild llama-cpp-python portable: in a clone `uv sync --refresh-package llama-cpp-python "
    "--reinstall-package llama-cpp-python`, "
    'with pip `CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF" pip install --force-reinstall '
    f"--no-cache-dir llama-cpp-python=={LLAMA_CPP_VERSION}`"
)
# The engine's exit code when it refuses to start (a CPU without AVX2, a bad model path): it has
# said why on stderr already.
REFUSED = 2
# The hidden fault-injection switch (tests only; docs/development.md): ``SIGSEGV@2`` makes the
# engine send itself SIGSEGV in its 2nd model call, while the HTTP request waits on it.
FAULT_ENV = "ROLLWIRE_ENGINE_FAULT"
# The CPU flags' file the engine reads (tests only): a copy without ``avx2`` plays a CPU that
# lacks it.
CPUINFO_ENV = "ROLLWIRE_CPUINFO"


# ---- the pure part ---------------------------------------------------------------------------


def library_features(system_info: str) -> set[str]:
    """The features llama.cpp's ``llama_print_system_info()`` reports as on (``AVX2 = 1``)."""
    on: set[str] = set()
    for part in system_info.split("|"):
        name, sep, value = part.strip().partition(" = ")
        name = name.rpartition(":")[2].strip()  # the first one carries its backend: "CPU : SSE3"
        if sep and value.strip() == "1" and name:
            on.add(name)
    return on


def beyond_portable(features: Iterable[str]) -> list[str]:
    """The instruction sets among ``features`` that the portable build does not use."""
    return sorted(set(features) - PORTABLE_FEATURES - NOT_INSTRUCTION_SETS)


def cpu_flags(cpuinfo: str) -> set[str]:
    """The first CPU's ``flags`` from the text of /proc/cpuinfo (what the kernel enables)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return set(value.split())
    return set()


def unsupported_features(features: Iterable[str], flags: set[str]) -> list[str]:
    """The features the library uses that the CPU's flags do not enable (unknown ones aside)."""
    return sorted(f for f in features if f in CPU_FLAGS and CPU_FLAGS[f] not in flags)


def read_cpu_flags() -> set[str] | None:
    """This machine's CPU flags, or None where /proc/cpuinfo is not there to say (not Linux)."""
    try:
        path = Path(os.environ.get(CPUINFO_ENV) or "/proc/cpuinfo")
        return cpu_flags(path.read_text(errors="replace"))
    except OSError:
        return None


def no_avx2_line(flags: set[str] | None) -> str | None:
    """The one line for an x86-64 CPU without AVX2 (the portable build's floor), else None."""
    if flags is None or not flags or "avx2" in flags:
        return None
    if not {"sse2", "lm"} & flags:  # not an x86-64 CPU's flags at all: nothing to say here
        return None
    return (
        "rollwire: the reference engine needs a CPU with AVX2 (x86-64 since 2013) and this one "
        "does not enable it (/proc/cpuinfo flags); point --llm-url at an engine elsewhere instead"
    )


_SIGNAL_CAUSES = {
    signal.SIGSEGV: "a native crash inside llama.cpp",
    signal.SIGBUS: "a native crash inside llama.cpp",
    signal.SIGILL: "an instruction this CPU or its hypervisor does not enable",
    signal.SIGFPE: "a native arithmetic fault inside llama.cpp",
    signal.SIGABRT: "llama.cpp aborted (its own message is above)",
    signal.SIGKILL: "killed: the kernel's OOM killer, if nobody else sent it (`dmesg` says)",
}


def describe_exit(
    returncode: int, *, pid: int, backend: str = "llama.cpp", features: Iterable[str] = ()
) -> str:
    """The one line for an engine process that ended on its own, from its exit status (a
    negative ``returncode`` is the signal that ended it, as :mod:`subprocess` reports it)."""
    who = f"rollwire: the reference engine ({backend}, pid {pid})"
    beyond = beyond_portable(features)
    built = f"its llama.cpp is built with {', '.join(beyond)}; " if beyond else ""
    if returncode >= 0:
        return f"{who} exited with code {returncode}; its own message is above"
    try:
        sig = signal.Signals(-returncode)
    except ValueError:
        return f"{who} died of signal {-returncode}; rerun with -v for its log"
    cause = _SIGNAL_CAUSES.get(sig)
    if sig is signal.SIGKILL:
        todo = "try: a smaller --max-model-len, fewer engines at once, or more memory"
    elif cause is not None:
        todo = f"{built}try: {REBUILD}"
    else:
        cause, todo = "sent by another process", "try: rerun it; nothing in rollwire sends it"
    return f"{who} died of {sig.name} ({cause}); {todo}"


def parse_fault(value: str | None) -> tuple[signal.Signals, int] | None:
    """The fault switch's ``NAME@N`` (signal NAME in the Nth model call), or None when unset."""
    if not value:
        return None
    name, _, nth = value.partition("@")
    try:
        sig = signal.Signals[name.strip().upper()]
        n = int(nth) if nth else 1
    except (KeyError, ValueError):
        raise ValueError(f"{FAULT_ENV}={value!r}: expected NAME@N, e.g. SIGSEGV@2") from None
    if n < 1:
        raise ValueError(f"{FAULT_ENV}={value!r}: N counts model calls from 1")
    return sig, n


# ---- the owner's side ------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineSpec:
    """What the child engine serves; the first line of its stdin, as JSON."""

    model_path: str | None = None  # None: the embedded GGUF
    n_ctx: int = 4096
    n_threads: int | None = None
    served_name: str = "SmolLM2-135M-Instruct"
    raw_logprobs: bool = False
    admin_key: str | None = None
    weights_roots: tuple[str, ...] = ()
    # Announce the library's instruction sets on stderr before the model loads (``-v``).
    verbose: bool = False

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, raw: bytes) -> EngineSpec:
        data = orjson.loads(raw)
        data["weights_roots"] = tuple(data.get("weights_roots") or ())
        return cls(**data)


def engine_death(exc: BaseException) -> EngineDied | None:
    """The :class:`EngineDied` that ended a block, also from inside the exception groups of
    the task groups it passed through (an MCP client's, a server's); None if it is not one."""
    if isinstance(exc, EngineDied):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = engine_death(inner)
            if found is not None:
                return found
    return None


def exit_for_death(exc: BaseException, say: Callable[[str], None]) -> int:
    """For a command whose block ``exc`` ended: an engine's death is said in its one line (a
    refusal said why in its own line already) and its exit code returned; anything else is
    raised again."""
    death = engine_death(exc)
    if death is None:
        raise exc
    if not death.refused:
        say(str(death))
    return death.exit_code


class EngineDied(Exception):
    """The engine process ended on its own. ``str()`` is the one line to print; ``exit_code`` is
    what a command that owned it exits with (2: it refused to start and said why in its own
    line, ``refused``; else 1)."""

    def __init__(self, line: str, returncode: int) -> None:
        super().__init__(line)
        self.returncode = returncode
        self.refused = returncode == REFUSED
        self.exit_code = REFUSED if self.refused else 1


@dataclass
class EngineProcess:
    """A running child engine: its URL, what it reported, and how it ended (once it has)."""

    url: str  # http://127.0.0.1:PORT (the OpenAI routes are under /v1)
    pid: int
    info: dict[str, Any] = field(default_factory=dict)  # the child's ``ready`` report
    features: set[str] = field(default_factory=set)  # the library's instruction sets
    died: anyio.Event = field(default_factory=anyio.Event)
    death: EngineDied | None = None
    stopping: bool = False

    @property
    def backend(self) -> str:
        return str(self.info.get("backend") or "llama.cpp")

    def alive(self) -> bool:
        """Whether the child still runs (not a zombie): a crash closes its sockets a moment
        before the owner's event loop hears of it, and a caller that saw the connection drop
        asks here first."""
        if self.died.is_set():
            return False
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except FileNotFoundError:
            return False
        except OSError:
            return True  # no procfs (not Linux): the exit watcher is the only word
        return stat.rpartition(")")[2].split()[:1] not in (["Z"], ["X"])

    async def guarded(self, fn: Callable[[], Awaitable[T]]) -> T:
        """``await fn()``, unless the engine dies first: then ``fn`` is cancelled and
        :class:`EngineDied` raised. A call that ended because the engine's connection dropped
        under it (its result or its error) counts as cut off by the death too. Once the engine
        is dead, ``fn`` runs unguarded: what does not need the engine still works."""
        if self.died.is_set():
            return await fn()
        outcome: list[tuple[bool, Any]] = []
        async with anyio.create_task_group() as tg:

            async def body() -> None:
                try:
                    outcome.append((True, await fn()))
                except Exception as exc:  # re-raised below, outside the task group
                    outcome.append((False, exc))
                tg.cancel_scope.cancel()

            async def watch() -> None:
                await self.died.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(body)
            tg.start_soon(watch)
        if not outcome or not self.alive():
            with anyio.fail_after(10):  # dead, or dying: its exit status is on its way
                await self.died.wait()
            assert self.death is not None
            raise self.death
        ok, value = outcome[0]
        if not ok:
            raise value
        return value


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


@contextlib.asynccontextmanager
async def running_engine(
    spec: EngineSpec,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    env: Mapping[str, str] | None = None,
    startup_timeout_s: float = 300.0,
) -> AsyncIterator[EngineProcess]:
    """Start the engine in a child process and yield it once it serves. It raises
    :class:`EngineDied` when the child ends before it serves; a death later sets
    :attr:`EngineProcess.died` (and ``death``) for the owner to act on. On exit the child is
    terminated (SIGTERM: its server shuts down), then killed."""
    sock = bind(host, port)
    url = url_of(sock)
    try:
        proc = await anyio.open_process(
            [sys.executable, "-m", "rollwire.engine.worker", str(sock.fileno())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
            pass_fds=(sock.fileno(),),
            # its own session: a terminal's Ctrl-C reaches the owner only, which stops the child
            # (SIGTERM); a signal the child gets is then one somebody sent it
            start_new_session=True,
            env=dict(env) if env is not None else _child_env(),
        )
    finally:
        sock.close()  # the child holds its own copy
    assert proc.stdin is not None and proc.stdout is not None
    engine = EngineProcess(url=url, pid=proc.pid)
    try:
        await proc.stdin.send(spec.to_json() + b"\n")
        await _await_ready(proc, engine, startup_timeout_s)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_watch_exit, proc, engine)
                try:
                    yield engine
                finally:
                    engine.stopping = True
                    tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # the watcher raises nothing: a group of one is the block's own exception, passed
            # on as the block raised it
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
    finally:
        engine.stopping = True
        if proc.returncode is None:
            with anyio.CancelScope(shield=True):
                await _stop(proc)


async def _await_ready(proc: Any, engine: EngineProcess, timeout_s: float) -> None:
    """Read the child's reports until ``ready``; its end before that is :class:`EngineDied`."""
    buffer = b""
    with anyio.fail_after(timeout_s):
        while True:
            try:
                chunk = await proc.stdout.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                break
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                event = orjson.loads(line)
                if event.get("event") == "library":
                    engine.features = library_features(event.get("system_info", ""))
                elif event.get("event") == "ready":
                    engine.info = event
                    return
        code = await proc.wait()
    line = describe_exit(code, pid=proc.pid, backend="llama.cpp", features=engine.features)
    raise EngineDied(line, code)


async def _watch_exit(proc: Any, engine: EngineProcess) -> None:
    code = await proc.wait()
    if not engine.stopping:
        line = describe_exit(code, pid=proc.pid, backend=engine.backend, features=engine.features)
        engine.death = EngineDied(line, code)
        engine.died.set()


async def _stop(proc: Any, grace_s: float = 10.0) -> None:
    """SIGTERM (the child's server shuts down), then SIGKILL after ``grace_s``; always reaped."""
    with contextlib.suppress(Exception):
        await proc.stdin.aclose()
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    with anyio.move_on_after(grace_s):
        await proc.wait()
        return
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    await proc.wait()
