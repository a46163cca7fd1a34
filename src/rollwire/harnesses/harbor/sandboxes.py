"""Which Harbor sandboxes can run here: ``local`` and every environment type Harbor registers.

A backend counts as available only when all three hold, checked in this order (the first that
fails is the ``reason``):

1. its SDK is installed (looked up with ``find_spec``, without importing it);
2. a capability check passes: for ``local`` a real throwaway bubblewrap sandbox; for ``docker``
   (and ``kata``) an answer from the Docker *daemon*, not just a client on PATH; for binaries
   (``singularity``, ``podman``, ...) the binary; for cloud and cluster backends the credentials;
3. its environment class imports and subclasses Harbor's ``BaseEnvironment`` (and the module's
   own ``_HAS_<SDK>`` flags, where Harbor keeps them, are all true); then, where Harbor's own
   ``preflight()`` only reads environment variables and files, it must pass too.

The cheap checks come first so that a backend that cannot run anyway costs no import of its
vendor SDK (boto3 or huggingface_hub alone take 0.3-0.5 s to import cold).

No check calls a cloud or cluster service: a cloud backend with its SDK and credentials is
reported available with ``live_checked=False`` and a ``reason`` saying that no live check was run
(its first sandbox start is the real test). The only socket opened is the Docker daemon's
endpoint (``$DOCKER_HOST`` or the context's, by default the unix socket). Every check is bounded
(a daemon ping waits at most 0.25 s, ``podman info`` 0.8 s), never raises, and is isolated: one backend's import error or crashing check is reported for that
backend only. Harbor's ``preflight()`` is never trusted alone: built-in preflights check
credentials, not that the backend can run (singularity's passes without its binary).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

from rollwire.harnesses.harbor.local import TYPE as LOCAL
from rollwire.harnesses.harbor.local import sandbox_problem

LOCAL_IMPORT_PATH = "rollwire.harnesses.harbor.local:LocalEnvironment"
# rollwire's own docker environment (the Engine API; Harbor's drives `docker compose` v2).
DOCKER_IMPORT_PATH = "rollwire.harnesses.harbor.docker:DockerEnvironment"
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
DOCKER_PING_TIMEOUT_SEC = 0.25
_NO_LIVE_CHECK = "no live check was run: the first sandbox start is the real test"

Kind = Literal["local", "container", "vm", "cluster", "cloud", "unknown"]


class SandboxStatus(BaseModel):
    """Whether one sandbox backend can run here, and why not.

    ``reason`` says why an unavailable backend is unavailable; for an available one it is the
    caveat of a check that stopped short of the backend itself (``live_checked=False``: e.g. a
    cloud backend whose credentials exist but which was not called), else None.
    """

    model_config = ConfigDict(frozen=True)

    name: str  # "local" or Harbor's EnvironmentType value ("docker", "e2b", ...)
    available: bool
    reason: str | None = None
    import_path: str  # "module:Class", for EnvironmentConfig(import_path=...)
    kind: Kind = "unknown"
    live_checked: bool = False  # the check exercised the backend itself (sandbox, daemon)
    extra: str | None = None  # the harbor extra that installs its SDK
    seconds: float = 0.0  # how long this backend's check took


class _Verdict(NamedTuple):
    ok: bool
    message: str | None = None  # the reason when not ok; the caveat (if any) when ok
    live: bool = False


@dataclass(frozen=True)
class _Backend:
    kind: Kind
    sdk: tuple[str, ...] = ()  # top-level modules its class needs
    extra: str | None = None
    check: Callable[[], _Verdict] | None = None  # ours; None: only Harbor's preflight
    harbor_preflight: bool = False  # Harbor's preflight only reads env vars/files: run it too


# --- capability checks -----------------------------------------------------------------------


def _which(binary: str) -> str | None:
    return shutil.which(binary)


def _env_sets(*alternatives: tuple[str, ...]) -> str | None:
    """The first set of environment variables that are all set (non-empty), as text."""
    for names in alternatives:
        if all(os.environ.get(name) for name in names):
            return " + ".join(names)
    return None


def _describe_sets(*alternatives: tuple[str, ...]) -> str:
    return " or ".join(" and ".join(names) for names in alternatives)


def _credentials(
    *alternatives: tuple[str, ...], files: tuple[str, ...] = (), how: str | None = None
) -> Callable[[], _Verdict]:
    """A check that passes when one set of env vars is set, or one of ``files`` exists."""

    def check() -> _Verdict:
        found = _env_sets(*alternatives)
        if found is None:
            found = next((f for f in files if Path(f).expanduser().is_file()), None)
        if found is not None:
            return _Verdict(True, f"credentials found ({found}); {_NO_LIVE_CHECK}")
        wanted = _describe_sets(*alternatives)
        if files:
            wanted += " (or create " + " or ".join(files) + ")"
        return _Verdict(False, f"no credentials: set {wanted}" + (f"; {how}" if how else ""))

    return check


def _harbor_preflight_only() -> _Verdict:
    """For backends whose credential check is Harbor's own preflight (run after the import)."""
    return _Verdict(True, f"credentials accepted by Harbor's preflight; {_NO_LIVE_CHECK}")


def _unconfirmable(name: str) -> Callable[[], _Verdict]:
    def check() -> _Verdict:
        return _Verdict(
            False,
            f"Harbor defines no credential check for {name} and rollwire cannot confirm its "
            "credentials without calling the service; pass it explicitly if you know it works",
        )

    return check


def _aws() -> _Verdict:
    """EC2: AWS credentials from the environment or the shared files (not the metadata service)."""
    found = _env_sets(
        ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"),
        ("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",),
        ("AWS_CONTAINER_CREDENTIALS_FULL_URI",),
    )
    if found is None:
        for var, default in (
            ("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"),
            ("AWS_CONFIG_FILE", "~/.aws/config"),
        ):
            path = Path(os.environ.get(var) or default).expanduser()
            if path.is_file():
                found = str(path)
                break
    if found is None:
        return _Verdict(
            False,
            "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or create "
            "~/.aws/credentials (an instance role is not checked: that needs the network)",
        )
    return _Verdict(True, f"AWS credentials found ({found}); {_NO_LIVE_CHECK}")


def _hf_token() -> _Verdict:
    """A Hugging Face token in the environment or in the token file (as huggingface_hub reads)."""
    found = _env_sets(("HF_TOKEN",), ("HUGGING_FACE_HUB_TOKEN",))
    if found is None:
        home = os.environ.get("HF_HOME") or str(Path("~/.cache/huggingface").expanduser())
        path = Path(os.environ.get("HF_TOKEN_PATH") or Path(home) / "token").expanduser()
        found = str(path) if path.is_file() and path.read_text().strip() else None
    if found is None:
        return _Verdict(False, "no Hugging Face token: set HF_TOKEN or run `hf auth login`")
    return _Verdict(True, f"credentials found ({found}); {_NO_LIVE_CHECK}")


def _kubeconfig() -> str | None:
    raw = os.environ.get("KUBECONFIG")
    paths = raw.split(os.pathsep) if raw else [str(Path.home() / ".kube" / "config")]
    return next((p for p in paths if p and Path(p).expanduser().is_file()), None)


def _ack() -> _Verdict:
    found = _kubeconfig()
    if found is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        token = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
        found = "in-cluster service account" if token.is_file() else None
    if found is None:
        return _Verdict(
            False, "no Kubernetes credentials: no kubeconfig ($KUBECONFIG, ~/.kube/config)"
        )
    return _Verdict(True, f"kubeconfig found ({found}); {_NO_LIVE_CHECK}")


def _openshift() -> _Verdict:
    if _which("oc") is None:
        return _Verdict(False, "the OpenShift CLI `oc` is not on PATH")
    found = _kubeconfig()
    if found is None:
        return _Verdict(False, "`oc` found but no kubeconfig: run `oc login`")
    return _Verdict(
        True, f"`oc` and a kubeconfig found ({found}); `oc whoami` (the cluster) was not called"
    )


def _singularity() -> _Verdict:
    path = _which("singularity")
    if path is not None:
        return _Verdict(True, f"singularity found at {path}; no container was started")
    apptainer = _which("apptainer")
    if apptainer is not None:
        return _Verdict(
            False,
            f"apptainer found at {apptainer}, but Harbor runs the `singularity` binary: link it "
            f"(`ln -s {apptainer} /usr/local/bin/singularity`)",
        )
    return _Verdict(
        False, "the singularity binary is not on PATH (install SingularityCE or Apptainer)"
    )


def _apple_container() -> _Verdict:
    if sys.platform != "darwin" or platform.machine() != "arm64":
        return _Verdict(
            False, f"needs macOS on Apple silicon; this is {sys.platform} {platform.machine()}"
        )
    if _which("container") is None:
        return _Verdict(False, "the `container` CLI is not on PATH")
    return _Verdict(True, "the `container` CLI found; its service was not checked")


def _kvm() -> str | None:
    """Why hardware virtualisation is unusable here (None when /dev/kvm can be opened)."""
    if not sys.platform.startswith("linux"):
        return f"needs Linux with /dev/kvm; this is {sys.platform}"
    if not os.path.exists("/dev/kvm"):
        return "/dev/kvm not found: no hardware virtualisation here"
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "/dev/kvm exists but this user cannot open it (add the user to group kvm)"
    return None


def _smol() -> _Verdict:
    if sys.platform == "darwin" and platform.machine() == "arm64":
        return _Verdict(True, "Apple silicon; no VM was booted")
    problem = _kvm()
    if problem is not None:
        return _Verdict(False, f"local SmolVMs: {problem}")
    return _Verdict(True, "/dev/kvm usable; no VM was booted (target='cloud' needs credentials)")


def _sbx() -> _Verdict:
    found = _env_sets(("SBX_TOKEN",), ("SBX_TOKEN_FILE",))
    if found is not None:
        if importlib.util.find_spec("python_multipart") is None:
            return _Verdict(
                False, "SBX_TOKEN found, but target='cloud' needs `pip install 'harbor[sbx]'`"
            )
        return _Verdict(True, f"credentials found ({found}); {_NO_LIVE_CHECK}")
    cli = _which("sbx")
    if cli is not None:
        return _Verdict(True, f"the sbx CLI found at {cli} (use target='local'); not run")
    return _Verdict(
        False, "no Docker Sandboxes access: set SBX_TOKEN (cloud) or install the sbx CLI (local)"
    )


def _podman() -> _Verdict:
    if _which("podman") is None:
        return _Verdict(False, "podman is not on PATH")
    if not any(_which(c) for c in ("podman-compose", "docker-compose")) and not _compose_plugin():
        return _Verdict(
            False, "podman found but no compose frontend (podman-compose or docker-compose)"
        )
    try:
        done = subprocess.run(["podman", "info"], capture_output=True, timeout=0.8)
    except subprocess.TimeoutExpired:
        return _Verdict(False, "`podman info` did not answer within 0.8 s")
    except OSError as exc:
        return _Verdict(False, f"`podman info` failed to run: {exc}")
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip()[-300:]
        return _Verdict(False, f"`podman info` failed: {err}")
    return _Verdict(True, None, live=True)


# --- Docker: does a daemon answer? -----------------------------------------------------------


def _docker_config_dir() -> Path:
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker").expanduser()


def docker_endpoint() -> tuple[str, str]:
    """The Docker endpoint the CLI would use, and where that choice came from.

    ``$DOCKER_HOST``, else the current context (``$DOCKER_CONTEXT`` or config.json's
    ``currentContext``), else the default socket.
    """
    host = os.environ.get("DOCKER_HOST")
    if host:
        return host, "$DOCKER_HOST"
    config = _docker_config_dir()
    name = os.environ.get("DOCKER_CONTEXT")
    if not name:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            name = json.loads((config / "config.json").read_text()).get("currentContext")
    if name and name != "default":
        meta = config / "contexts" / "meta" / hashlib.sha256(name.encode()).hexdigest()
        with contextlib.suppress(OSError, ValueError, AttributeError, KeyError, TypeError):
            host = json.loads((meta / "meta.json").read_text())["Endpoints"]["docker"]["Host"]
            if host:
                return host, f"context {name!r}"
    return DEFAULT_DOCKER_HOST, "the default socket"


def docker_request(
    endpoint: str, path: str = "/_ping", timeout: float = DOCKER_PING_TIMEOUT_SEC
) -> tuple[bytes | None, str]:
    """GET ``path`` from the Docker daemon at ``endpoint``: (body of a 200, what happened).

    Only unix sockets and plain tcp are spoken; TLS, ssh and named pipes are reported as not
    checked. Bounded by ``timeout`` for the whole exchange.
    """
    parts = urlsplit(endpoint)
    if parts.scheme == "unix":
        target: Any = parts.path
        family = socket.AF_UNIX
        where = parts.path
        if not os.path.exists(target):
            return None, f"no such socket: {where}"
    elif parts.scheme == "tcp":
        if os.environ.get("DOCKER_TLS_VERIFY") or parts.port == 2376:
            return None, f"TLS endpoint {endpoint} not checked (rollwire pings plain sockets only)"
        target = (parts.hostname or "localhost", parts.port or 2375)
        family = socket.AF_INET6 if ":" in target[0] else socket.AF_INET
        where = endpoint
    else:
        return None, f"endpoint {endpoint} not checked (rollwire pings unix and tcp sockets only)"
    deadline = time.monotonic() + timeout
    data = b""
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(target)
            sock.sendall(f"GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
            while not _complete(data):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                sock.settimeout(left)
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except TimeoutError:
        return None, f"{where} accepted a connection but did not answer in {timeout} s"
    except OSError as exc:
        return None, f"{where}: {exc.strerror or exc}"
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode(errors="replace")
    if not status.startswith("HTTP/") or status.split()[1:2] != ["200"]:
        return None, f"{where} answered {status or 'nothing'!r}, not a Docker API 200"
    return body, "ok"


def _complete(data: bytes) -> bool:
    """Whether an HTTP response with a Content-Length has fully arrived."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-length":
            with contextlib.suppress(ValueError):
                return len(body) >= int(value.strip())
    return False  # no length: read until the daemon closes (HTTP/1.0)


_COMPOSE_PLUGIN_DIRS = (
    "/usr/local/lib/docker/cli-plugins",
    "/usr/local/libexec/docker/cli-plugins",
    "/usr/lib/docker/cli-plugins",
    "/usr/libexec/docker/cli-plugins",
)


def _compose_plugin() -> str | None:
    for folder in (str(_docker_config_dir() / "cli-plugins"), *_COMPOSE_PLUGIN_DIRS):
        path = os.path.join(folder, "docker-compose")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _docker_daemon() -> tuple[_Verdict, str]:
    """(verdict on client + daemon, the endpoint)."""
    client = _which("docker")
    endpoint, source = docker_endpoint()
    where = urlsplit(endpoint).path if endpoint.startswith("unix://") else endpoint
    if client is None:
        return _Verdict(False, "docker client not found on PATH (install Docker Engine)"), endpoint
    body, detail = docker_request(endpoint)
    if body is None:
        return (
            _Verdict(
                False,
                f"docker client found ({client}) but no daemon answers at {where} "
                f"({source}: {detail})",
            ),
            endpoint,
        )
    return _Verdict(True, None, live=True), endpoint


def _docker() -> _Verdict:
    """A daemon that answers: rollwire's docker sandbox speaks its API (no CLI, no compose)."""
    endpoint, source = docker_endpoint()
    where = urlsplit(endpoint).path if endpoint.startswith("unix://") else endpoint
    body, detail = docker_request(endpoint)
    if body is None:
        return _Verdict(False, f"no Docker daemon answers at {where} ({source}: {detail})")
    return _Verdict(True, None, live=True)


def _kata() -> _Verdict:
    verdict, endpoint = _docker_daemon()
    if not verdict.ok:
        return verdict
    problem = _kvm()
    if problem is not None:
        return _Verdict(False, f"Kata Containers: {problem}")
    body, detail = docker_request(endpoint, "/info")
    try:
        runtimes = json.loads(body or b"{}").get("Runtimes") or {}
    except (ValueError, AttributeError):
        runtimes = {}
    if not any("kata" in name for name in runtimes):
        why = "" if body is not None else f" (/info: {detail})"
        return _Verdict(False, f"no Kata runtime is registered with the Docker daemon{why}")
    return _Verdict(True, None, live=True)


# --- the table -------------------------------------------------------------------------------

# Harbor's environment types, keyed by EnvironmentType value. A type missing from this table (a
# newer Harbor) is still listed, and reported unavailable: rollwire has no check for it.
_BACKENDS: dict[str, _Backend] = {
    "apple-container": _Backend("vm", check=_apple_container),
    "docker": _Backend("container", ("docker",), "harbor", check=_docker),
    "sbx": _Backend("vm", extra="sbx", check=_sbx),
    "podman": _Backend("container", check=_podman),
    "daytona": _Backend("cloud", ("daytona",), "daytona", harbor_preflight=True),
    "e2b": _Backend("cloud", ("e2b", "dockerfile_parse"), "e2b", harbor_preflight=True),
    "gke": _Backend("cluster", ("kubernetes",), "gke", harbor_preflight=True),
    "ack": _Backend("cluster", ("kubernetes",), "gke", check=_ack),
    "ec2": _Backend("cloud", ("boto3",), "ec2", check=_aws, harbor_preflight=True),
    "openshift": _Backend("cluster", check=_openshift),
    "islo": _Backend(
        "cloud", ("islo", "dockerfile_parse"), "islo", check=_credentials(("ISLO_API_KEY",))
    ),
    "modal": _Backend("cloud", ("modal", "dockerfile_parse"), "modal", harbor_preflight=True),
    "runloop": _Backend(
        "cloud", ("runloop_api_client", "dockerfile_parse"), "runloop", harbor_preflight=True
    ),
    # Harbor's langsmith preflight constructs a client; we read the variables it accepts instead.
    "langsmith": _Backend(
        "cloud",
        ("langsmith",),
        "langsmith",
        check=_credentials(("LANGSMITH_API_KEY",), ("LANGCHAIN_API_KEY",), ("LANGSMITH_PROFILE",)),
    ),
    "novita": _Backend(
        "cloud", ("novita_sandbox", "dockerfile_parse"), "novita", harbor_preflight=True
    ),
    "singularity": _Backend("container", check=_singularity),
    "tensorlake": _Backend("cloud", ("tensorlake",), "tensorlake", harbor_preflight=True),
    "cwsandbox": _Backend("cloud", ("cwsandbox",), "cwsandbox", check=_unconfirmable("cwsandbox")),
    "use-computer": _Backend("cloud", ("use_computer",), "use-computer", harbor_preflight=True),
    "cua-cloud": _Backend("cloud", ("cua_train",), "cua", harbor_preflight=True),
    "blaxel": _Backend("cloud", ("blaxel", "dockerfile_parse"), "blaxel", harbor_preflight=True),
    # Harbor's opensandbox preflight only warns; the server domain is what it needs.
    "opensandbox": _Backend(
        "cloud", ("opensandbox",), "opensandbox", check=_credentials(("OPENSANDBOX_DOMAIN",))
    ),
    "beam": _Backend("cloud", ("beam", "dockerfile_parse"), "beam", harbor_preflight=True),
    "skypilot": _Backend("cloud", ("sky", "dockerfile_parse"), "skypilot", harbor_preflight=True),
    "hf-sandbox": _Backend(
        "cloud", ("huggingface_hub",), "hf-sandbox", check=_hf_token, harbor_preflight=True
    ),
    "hyperbrowser": _Backend(
        "cloud", ("hyperbrowser", "dockerfile_parse"), "hyperbrowser", harbor_preflight=True
    ),
    "vercel": _Backend("cloud", ("vercel",), "vercel", harbor_preflight=True),
    "runta": _Backend("cloud", ("runta",), "runta", harbor_preflight=True),
    "prime": _Backend("cloud", ("prime_sandboxes",), "prime", check=_unconfirmable("prime")),
    "kata": _Backend("vm", check=_kata, harbor_preflight=False),
    "mosaic": _Backend(
        "cloud", ("mosaic_sandbox", "dockerfile_parse"), "mosaic", harbor_preflight=True
    ),
    "smol": _Backend("vm", ("smol",), "smol", check=_smol),
    "sail": _Backend("cloud", ("sail",), "sail", harbor_preflight=True),
    "kernel": _Backend("cloud", ("kernel", "dockerfile_parse"), "kernel", harbor_preflight=True),
}
_LOCAL = _Backend("local")


def _harbor_registry() -> tuple[list[str], dict[str, str], str | None]:
    """Harbor's environment type values in its own order, their import paths, and any problem."""
    try:
        from harbor.models.environment_type import EnvironmentType

        names = [member.value for member in EnvironmentType]
    except Exception as exc:
        return [], {}, f"Harbor's EnvironmentType does not import: {type(exc).__name__}: {exc}"
    try:
        from harbor.environments.factory import _ENVIRONMENT_REGISTRY

        paths = {
            getattr(key, "value", str(key)): f"{entry.module}:{entry.class_name}"
            for key, entry in _ENVIRONMENT_REGISTRY.items()
        }
    except Exception as exc:
        return names, {}, f"Harbor's environment factory registry is unreadable: {exc}"
    return names, paths, None


def sandbox_names() -> list[str]:
    """``local``, then every environment type Harbor defines, in Harbor's order."""
    names, _, _ = _harbor_registry()
    return [LOCAL, *names]


def sandbox_import_path(name: str) -> str:
    """The ``module:Class`` of a sandbox, for ``EnvironmentConfig(import_path=...)``.

    ``name`` is ``local`` or a Harbor environment type (``docker``, ``e2b``, ...); a
    ``module:Class`` path is returned as given. Raises ``ValueError`` for an unknown name.
    """
    name = str(getattr(name, "value", name))
    if name == LOCAL:
        return LOCAL_IMPORT_PATH
    if name == "docker":
        return DOCKER_IMPORT_PATH
    if ":" in name:
        return name
    names, paths, problem = _harbor_registry()
    if name in paths:
        return paths[name]
    if problem is not None:
        raise ValueError(f"cannot resolve sandbox {name!r}: {problem}")
    raise ValueError(f"unknown sandbox {name!r}; known: {', '.join([LOCAL, *names])}")


def _missing_sdk(backend: _Backend) -> str | None:
    for module in backend.sdk:
        try:
            missing = importlib.util.find_spec(module) is None
        except (ImportError, ValueError):
            missing = True
        if missing:
            how = f"`pip install 'harbor[{backend.extra}]'`" if backend.extra else "install it"
            return f"SDK not installed: no module {module!r} ({how})"
    return None


def _import_class(import_path: str) -> tuple[Any, str | None]:
    """(the class, None) or (None, why it does not import)."""
    module_name, _, class_name = import_path.partition(":")
    try:
        module = importlib.import_module(module_name)
        cls = getattr(module, class_name)
    except (Exception, SystemExit) as exc:
        return None, f"class {import_path} does not import: {type(exc).__name__}: {exc}"
    from harbor.environments.base import BaseEnvironment

    if not (isinstance(cls, type) and issubclass(cls, BaseEnvironment)):
        return None, f"{import_path} is not a Harbor BaseEnvironment subclass"
    flags = [f for f in vars(module) if f.startswith("_HAS_") and vars(module)[f] is False]
    if flags:
        return (
            None,
            f"{import_path} imports, but its SDK is incomplete ({', '.join(flags)} is False)",
        )
    return cls, None


def _run_check(check: Callable[[], _Verdict]) -> _Verdict:
    try:
        return check()
    except (Exception, SystemExit) as exc:
        return _Verdict(False, f"the capability check failed: {type(exc).__name__}: {exc}")


def _run_preflight(cls: Any) -> str | None:
    """Harbor's own preflight (credential) check: None when it passes, else its message."""
    try:
        cls.preflight()
    except SystemExit as exc:
        return f"Harbor's preflight: {exc.code}"
    except Exception as exc:
        return f"Harbor's preflight: {type(exc).__name__}: {' '.join(str(exc).split())}"
    return None


def _status(
    name: str, import_path: str, backend: _Backend | None, bwrap: str | None
) -> SandboxStatus:
    start = time.perf_counter()

    def done(available: bool, reason: str | None, live: bool = False) -> SandboxStatus:
        return SandboxStatus(
            name=name,
            available=available,
            reason=reason,
            import_path=import_path,
            kind=backend.kind if backend is not None else "unknown",
            live_checked=live,
            extra=backend.extra if backend is not None else None,
            seconds=round(time.perf_counter() - start, 4),
        )

    try:
        if backend is not None and (missing := _missing_sdk(backend)) is not None:
            return done(False, missing)
        if backend is None:
            return done(False, f"rollwire has no capability check for Harbor's {name!r} sandbox")
        if name == LOCAL:
            problem = sandbox_problem(bwrap)
            verdict = _Verdict(problem is None, problem, live=problem is None)
        else:
            verdict = _run_check(backend.check or _harbor_preflight_only)
        if not verdict.ok:
            return done(False, verdict.message)
        cls, problem = _import_class(import_path)
        if problem is not None:
            return done(False, problem)
        if backend.harbor_preflight and (problem := _run_preflight(cls)) is not None:
            return done(False, problem)
        return done(True, verdict.message, live=verdict.live)
    except (Exception, SystemExit) as exc:  # a bug in a check is that backend's problem only
        return done(False, f"availability check crashed: {type(exc).__name__}: {exc}")


def available_sandboxes(
    names: Iterable[str] | None = None, *, bwrap: str | None = None
) -> list[SandboxStatus]:
    """Every sandbox backend (or just ``names``) and whether it can run here. Never raises.

    ``bwrap`` is the bubblewrap binary for ``local`` (default ``$ROLLWIRE_BWRAP`` or PATH).
    Nothing here calls the network; a blocking call of well under a second in total (run it in
    a worker thread from async code).
    """
    try:
        harbor_names, paths, registry_problem = _harbor_registry()
    except Exception as exc:  # belt and braces: _harbor_registry already catches
        harbor_names, paths, registry_problem = [], {}, f"{type(exc).__name__}: {exc}"
    wanted = list(names) if names is not None else [LOCAL, *harbor_names]
    out: list[SandboxStatus] = []
    for raw in wanted:
        name = str(getattr(raw, "value", raw))
        if name == LOCAL:
            out.append(_status(name, LOCAL_IMPORT_PATH, _LOCAL, bwrap))
        elif name == "docker":
            out.append(_status(name, DOCKER_IMPORT_PATH, _BACKENDS.get(name), bwrap))
        elif name in paths:
            out.append(_status(name, paths[name], _BACKENDS.get(name), bwrap))
        else:
            why = registry_problem or f"Harbor has no environment type {name!r}"
            out.append(SandboxStatus(name=name, available=False, reason=why, import_path=""))
    if not out and registry_problem is not None:
        out.append(
            SandboxStatus(name="harbor", available=False, reason=registry_problem, import_path="")
        )
    return out


def format_sandboxes(statuses: Iterable[SandboxStatus]) -> str:
    """A markdown table of statuses, for logs and docs."""
    lines = ["| sandbox | kind | available | live check | reason |", "|---|---|---|---|---|"]
    for s in statuses:
        reason = (s.reason or "").replace("|", "\\|").replace("\n", " ")
        lines.append(
            f"| {s.name} | {s.kind} | {'yes' if s.available else 'no'} | "
            f"{'yes' if s.live_checked else 'no'} | {reason} |"
        )
    return "\n".join(lines)


# --- the sandboxes rollouts run in ------------------------------------------------------------


def _local_problem(environment_kwargs: dict[str, Any]) -> str | None:
    return sandbox_problem(environment_kwargs.get("bwrap"))


def _docker_problem(environment_kwargs: dict[str, Any]) -> str | None:
    from rollwire.harnesses.harbor.docker import docker_problem

    return docker_problem(environment_kwargs.get("docker_host"))


def _remote_problem(name: str) -> Callable[[dict[str, Any]], str | None]:
    """A cloud sandbox's problem: its SDK, its credentials (Harbor's own preflight), its class;
    nothing calls the service."""

    def problem(environment_kwargs: dict[str, Any]) -> str | None:
        (status,) = available_sandboxes([name])
        return None if status.available else status.reason

    return problem


class Runnable(NamedTuple):
    """A sandbox rollouts run in: its environment class and why it cannot run here."""

    import_path: str
    problem: Callable[[dict[str, Any]], str | None]
    # Runs elsewhere (a cloud service): no gate, no host mounts; an agent inside it reaches the
    # capture proxy at a public URL the caller serves it on.
    remote: bool = False


#: Cloud sandboxes run through Harbor's own environment classes (rollwire adds no code there).
REMOTE_SANDBOXES: dict[str, str] = {
    "daytona": "harbor.environments.daytona:DaytonaEnvironment",
    "modal": "harbor.environments.modal:ModalEnvironment",
    "e2b": "harbor.environments.e2b:E2BEnvironment",
    "runloop": "harbor.environments.runloop:RunloopEnvironment",
}

# name -> (the environment class, why it cannot run here given the environment kwargs, remote)
RUNNABLE: dict[str, Runnable] = {
    LOCAL: Runnable(LOCAL_IMPORT_PATH, _local_problem),
    "docker": Runnable(DOCKER_IMPORT_PATH, _docker_problem),
    **{
        name: Runnable(path, _remote_problem(name), remote=True)
        for name, path in REMOTE_SANDBOXES.items()
    },
}


def runnable_sandbox(name: str) -> Runnable:
    """The import path and problem check of a sandbox rollouts run in; ValueError otherwise."""
    entry = RUNNABLE.get(name)
    if entry is None:
        raise ValueError(
            f"sandbox {name!r}: rollouts run in {', '.join(sorted(RUNNABLE))} "
            "(every other Harbor backend is listed by `rollwire info`)"
        )
    return entry
