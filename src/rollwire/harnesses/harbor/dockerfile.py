"""A task's ``environment/Dockerfile`` as a plan the local sandbox can carry out without Docker.

Honoured: ``FROM`` (recorded; the sandbox runs on the host's ``/usr``, not the image), ``WORKDIR``,
``COPY``/``ADD`` from the task's environment directory (``.dockerignore`` respected, local tar
archives unpacked by ``ADD``), ``ENV``, ``ARG`` (for substitution) and ``USER``. ``RUN`` cannot
run without Docker: a Dockerfile with one fails with :class:`UnsupportedDockerfileError` naming
the line, except the steps in :data:`ALLOWED_RUN` (no-ops and ``mkdir -p``, which is emulated).
Instructions with no effect on a running sandbox (``CMD``, ``EXPOSE``, ...) are recorded as ignored.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from harbor.environments.base import SandboxBuildFailedError


class UnsupportedDockerfileError(SandboxBuildFailedError):
    """The task's environment cannot be built without Docker; the message names the line."""


# RUN steps that are provably no-ops (or, for mkdir -p, emulated exactly) and so are allowed.
ALLOWED_RUN: dict[str, str] = {
    "true": "no-op",
    ":": "no-op",
    "exit 0": "no-op",
    "mkdir -p <absolute paths>": "emulated: the directories are created in the sandbox root",
}

# Instructions that change nothing a command in the running sandbox could see.
IGNORED: dict[str, str] = {
    "CMD": "Harbor keeps the container alive itself",
    "ENTRYPOINT": "Harbor keeps the container alive itself",
    "EXPOSE": "metadata",
    "LABEL": "metadata",
    "MAINTAINER": "metadata",
    "HEALTHCHECK": "Harbor runs [environment.healthcheck] itself",
    "STOPSIGNAL": "the sandbox is always killed with SIGKILL",
    "VOLUME": "the sandbox root is already persistent for the trial",
    "SHELL": "affects RUN only",
    "ONBUILD": "affects later builds only",
}

_ADD_ARCHIVES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MKDIR_PATH = re.compile(r"/[A-Za-z0-9_./@+-]*")


@dataclass(frozen=True)
class MakeDir:
    """Create a directory (and its parents) in the sandbox."""

    path: str
    line: int


@dataclass(frozen=True)
class CopyFiles:
    """``COPY``/``ADD`` host files from the build context to a sandbox path."""

    sources: tuple[Path, ...]
    dest: str
    into_dir: bool  # the destination names a directory (trailing slash or several sources)
    chmod: int | None
    extract: bool  # ADD of a local tar archive: unpack it
    line: int


@dataclass(frozen=True)
class DockerfilePlan:
    """What building the image would have done, in order, plus the image's runtime settings."""

    base_image: str | None
    workdir: str
    env: dict[str, str]
    user: str | None
    steps: tuple[MakeDir | CopyFiles, ...]
    ignored: tuple[str, ...] = ()
    context: Path = field(default=Path("."))


def plan_dockerfile(environment_dir: Path) -> DockerfilePlan:
    """Read ``environment_dir/Dockerfile`` into a plan, or raise naming the line that cannot run."""
    path = environment_dir / "Dockerfile"
    if not path.is_file():
        raise UnsupportedDockerfileError(f"{path} not found: the local sandbox needs a Dockerfile")
    instructions = _instructions(path.read_text(), path)
    ignore = _DockerIgnore(environment_dir)
    env: dict[str, str] = {}
    args: dict[str, str] = {}
    workdir = "/"
    user: str | None = None
    base_image: str | None = None
    steps: list[MakeDir | CopyFiles] = []
    ignored: list[str] = []

    for line, keyword, text in instructions:
        where = f"{path}:{line}: {keyword} {text}".rstrip()
        scope = {**args, **env}
        if keyword == "FROM":
            if base_image is not None:
                raise UnsupportedDockerfileError(
                    f"{where}: multi-stage builds need Docker; the local sandbox takes one FROM"
                )
            words = [w for w in _words(text, args, where) if not w.startswith("--")]
            base_image = words[0] if words else None
        elif keyword == "RUN":
            steps.extend(_allowed_run(text, workdir, line, where))
        elif keyword == "WORKDIR":
            workdir = _absolute(" ".join(_words(text, scope, where)), workdir)
            steps.append(MakeDir(workdir, line))
        elif keyword == "ENV":
            env.update(_env_pairs(text, scope, where))
        elif keyword == "ARG":
            for word in _words(text, scope, where):
                name, _, default = word.partition("=")
                args.setdefault(name, default)
        elif keyword == "USER":
            user = " ".join(_words(text, scope, where)) or None
        elif keyword in ("COPY", "ADD"):
            steps.append(_copy(keyword, text, scope, workdir, environment_dir, ignore, line, where))
        elif keyword in IGNORED:
            ignored.append(f"{keyword} (line {line}): {IGNORED[keyword]}")
        else:
            raise UnsupportedDockerfileError(f"{where}: unknown instruction {keyword}")
    if base_image is None:
        raise UnsupportedDockerfileError(f"{path}: no FROM instruction")
    return DockerfilePlan(
        base_image=base_image,
        workdir=workdir,
        env=env,
        user=user,
        steps=tuple(steps),
        ignored=tuple(ignored),
        context=environment_dir,
    )


def apply_plan(plan: DockerfilePlan, root: Path, *, read_only: Iterable[str]) -> None:
    """Carry out the plan's steps in a sandbox root on the host (before anything runs in it)."""
    guard = _RootGuard(root, tuple(read_only))
    ignore = _DockerIgnore(plan.context)
    for step in plan.steps:
        if isinstance(step, MakeDir):
            guard.host_path(step.path, f"line {step.line}").mkdir(parents=True, exist_ok=True)
        else:
            _apply_copy(step, guard, plan.context, ignore)


def make_dir(root: Path, sandbox_path: str, *, read_only: Iterable[str], where: str) -> None:
    """Create a directory in a sandbox root, refusing paths that leave it or are read-only."""
    guard = _RootGuard(root, tuple(read_only))
    guard.host_path(sandbox_path, where).mkdir(parents=True, exist_ok=True)


# --- parsing -------------------------------------------------------------------------------


def _instructions(source: str, path: Path) -> list[tuple[int, str, str]]:
    """(line number, KEYWORD, arguments) per instruction, continuations joined, comments dropped."""
    lines = source.splitlines()
    for raw in lines:
        directive = re.match(r"#\s*escape\s*=\s*(\S)", raw.strip(), re.IGNORECASE)
        if directive and directive.group(1) != "\\":
            raise UnsupportedDockerfileError(
                f"{path}: escape={directive.group(1)} is not supported (only the default '\\')"
            )
        if raw.strip() and not raw.strip().startswith("#"):
            break
    out: list[tuple[int, str, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(lines, start=1):
        stripped = raw.strip()
        if stripped.startswith("#") or (pending and not stripped):
            continue
        if not pending:
            if not stripped:
                continue
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1])
            continue
        pending.append(stripped)
        text = " ".join(part.strip() for part in pending).strip()
        pending = []
        keyword, _, rest = text.partition(" ")
        out.append((start, keyword.upper(), rest.strip()))
    if pending:
        text = " ".join(part.strip() for part in pending).strip()
        keyword, _, rest = text.partition(" ")
        out.append((start, keyword.upper(), rest.strip()))
    return out


def _words(text: str, scope: dict[str, str], where: str) -> list[str]:
    """Docker's word rules: quotes removed, ``$VAR``/``${VAR:-x}`` expanded, whitespace splits."""
    words: list[str] = []
    current: list[str] = []
    started = False
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            if started:
                words.append("".join(current))
                current, started = [], False
            i += 1
        elif ch == "\\" and i + 1 < len(text):
            current.append(text[i + 1])
            started = True
            i += 2
        elif ch == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise UnsupportedDockerfileError(f"{where}: unterminated single quote")
            current.append(text[i + 1 : end])
            started = True
            i = end + 1
        elif ch == '"':
            i += 1
            started = True
            while True:
                if i >= len(text):
                    raise UnsupportedDockerfileError(f"{where}: unterminated double quote")
                ch = text[i]
                if ch == '"':
                    i += 1
                    break
                if ch == "\\" and i + 1 < len(text) and text[i + 1] in '"$\\':
                    current.append(text[i + 1])
                    i += 2
                elif ch == "$":
                    value, i = _variable(text, i, scope, where)
                    current.append(value)
                else:
                    current.append(ch)
                    i += 1
        elif ch == "$":
            value, i = _variable(text, i, scope, where)
            current.append(value)
            started = True
        else:
            current.append(ch)
            started = True
            i += 1
    if started:
        words.append("".join(current))
    return words


def _variable(text: str, i: int, scope: dict[str, str], where: str) -> tuple[str, int]:
    """Expand the variable reference starting at ``text[i] == '$'``; return (value, next index)."""
    if text.startswith("${", i):
        end = text.find("}", i)
        if end < 0:
            raise UnsupportedDockerfileError(f"{where}: unterminated ${{")
        body = text[i + 2 : end]
        match = _NAME.match(body)
        if not match:
            raise UnsupportedDockerfileError(f"{where}: bad variable ${{{body}}}")
        name, modifier = match.group(0), body[match.end() :]
        value = scope.get(name)
        if not modifier:
            return value or "", end + 1
        for op in (":-", ":+", "-", "+"):
            if modifier.startswith(op):
                word = modifier[len(op) :]
                if op == ":-":
                    return (value if value else word), end + 1
                if op == ":+":
                    return (word if value else ""), end + 1
                if op == "-":
                    return (value if value is not None else word), end + 1
                return (word if value is not None else ""), end + 1
        raise UnsupportedDockerfileError(f"{where}: unsupported substitution ${{{body}}}")
    match = _NAME.match(text, i + 1)
    if not match:
        return "$", i + 1
    return scope.get(match.group(0), ""), match.end()


def _env_pairs(text: str, scope: dict[str, str], where: str) -> dict[str, str]:
    """``ENV A=1 B="two words"`` or the legacy ``ENV A some value``.

    As in Docker, the whole line is expanded with the values from before it.
    """
    first = text.split(None, 1)[0] if text.strip() else ""
    if not first:
        raise UnsupportedDockerfileError(f"{where}: ENV needs a name")
    if "=" not in first:
        rest = text[len(first) :].strip()
        return {first: " ".join(_words(rest, scope, where))}
    pairs: dict[str, str] = {}
    for word in _words(text, scope, where):
        name, sep, value = word.partition("=")
        if not sep or not _NAME.fullmatch(name):
            raise UnsupportedDockerfileError(f"{where}: {word!r} is not NAME=value")
        pairs[name] = value
    return pairs


def _allowed_run(text: str, workdir: str, line: int, where: str) -> list[MakeDir]:
    """The steps an allowed RUN stands for, or raise naming the line."""
    command = _json_array(text)
    words = command if command is not None else text.split()
    joined = " ".join(words).strip()
    if joined in ("true", ":", "exit 0", "/bin/true"):
        return []
    if len(words) >= 3 and words[:2] == ["mkdir", "-p"]:
        if all(_MKDIR_PATH.fullmatch(w) for w in words[2:]):
            return [MakeDir(_absolute(w, workdir), line) for w in words[2:]]
    raise UnsupportedDockerfileError(
        f"{where}: RUN steps need Docker and cannot run in the local sandbox. "
        "Build the files into environment/ and COPY them, or use a Docker-backed sandbox "
        f"(allowed RUN steps: {', '.join(ALLOWED_RUN)})"
    )


def _json_array(text: str) -> list[str] | None:
    if not text.startswith("["):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


def _copy(
    keyword: str,
    text: str,
    scope: dict[str, str],
    workdir: str,
    context: Path,
    ignore: _DockerIgnore,
    line: int,
    where: str,
) -> CopyFiles:
    words = _json_array(text)
    if words is None:
        words = _words(text, scope, where)
    chmod: int | None = None
    while words and words[0].startswith("--"):
        flag, _, value = words.pop(0).partition("=")
        if flag == "--chmod":
            try:
                chmod = int(value, 8)
            except ValueError as exc:
                raise UnsupportedDockerfileError(f"{where}: --chmod={value} is not octal") from exc
        elif flag in ("--chown", "--link"):
            continue  # ownership: everything in the sandbox belongs to the sandbox user
        elif flag == "--from":
            raise UnsupportedDockerfileError(
                f"{where}: {keyword} --from needs Docker (another image or stage)"
            )
        else:
            raise UnsupportedDockerfileError(f"{where}: {keyword} {flag} is not supported")
    if len(words) < 2:
        raise UnsupportedDockerfileError(f"{where}: {keyword} needs a source and a destination")
    *patterns, dest = words
    sources: list[Path] = []
    context_real = context.resolve()
    for pattern in patterns:
        if re.match(r"^[a-z][a-z0-9+.-]*://", pattern) or pattern.startswith("git@"):
            raise UnsupportedDockerfileError(
                f"{where}: {keyword} from a URL needs the network; the local sandbox is offline"
            )
        if pattern.startswith("<<"):
            raise UnsupportedDockerfileError(f"{where}: heredocs need Docker")
        matches = sorted(glob.glob(pattern.lstrip("/"), root_dir=context, include_hidden=True))
        matches = [m for m in matches if not ignore.excluded(os.path.normpath(m))]
        if not matches:
            raise UnsupportedDockerfileError(
                f"{where}: {pattern!r} matches nothing in {context} (after .dockerignore)"
            )
        for match in matches:
            source = (context / match).resolve()
            if not source.is_relative_to(context_real):
                raise UnsupportedDockerfileError(
                    f"{where}: {match!r} is outside the build context {context}"
                )
            sources.append(context / os.path.normpath(match))
    into_dir = dest.endswith("/") or len(sources) > 1
    if len(sources) > 1 and not dest.endswith("/"):
        raise UnsupportedDockerfileError(
            f"{where}: with several sources the destination must end with '/'"
        )
    extract = keyword == "ADD" and any(str(s).endswith(_ADD_ARCHIVES) for s in sources)
    return CopyFiles(
        sources=tuple(sources),
        dest=_absolute(dest, workdir),
        into_dir=into_dir,
        chmod=chmod,
        extract=extract,
        line=line,
    )


def _absolute(path: str, workdir: str) -> str:
    """A sandbox path made absolute against the current WORKDIR and normalised."""
    joined = PurePosixPath(workdir) / path
    return os.path.normpath(str(joined)).replace("//", "/")


# --- applying ------------------------------------------------------------------------------


class _RootGuard:
    """Maps sandbox paths to host paths inside one root, refusing anything that leaves it."""

    def __init__(self, root: Path, read_only: tuple[str, ...]):
        self.root = root
        self.real_root = Path(os.path.realpath(root))
        self.read_only = read_only

    def host_path(self, sandbox_path: str, where: str) -> Path:
        self._refuse_read_only(sandbox_path, where)
        host = self.root / sandbox_path.lstrip("/")
        self.check(host, where)
        return host

    def check(self, host: Path, where: str) -> None:
        """Raise unless ``host`` (through any symlinks already in the root) stays writable."""
        real = Path(os.path.realpath(host))
        if not real.is_relative_to(self.real_root):
            raise UnsupportedDockerfileError(
                f"{where}: {host} resolves outside the sandbox root (through a symlink)"
            )
        self._refuse_read_only("/" + str(real.relative_to(self.real_root)), where)

    def _refuse_read_only(self, sandbox_path: str, where: str) -> None:
        path = PurePosixPath(os.path.normpath(sandbox_path))
        for prefix in self.read_only:
            if path == PurePosixPath(prefix) or path.is_relative_to(prefix):
                raise UnsupportedDockerfileError(
                    f"{where}: {sandbox_path} is under {prefix}, which the local sandbox "
                    "mounts read-only from the host"
                )


def _apply_copy(step: CopyFiles, guard: _RootGuard, context: Path, ignore: _DockerIgnore) -> None:
    where = f"{context / 'Dockerfile'}:{step.line}"
    dest = guard.host_path(step.dest, where)
    for source in step.sources:
        if step.extract and str(source).endswith(_ADD_ARCHIVES):
            dest.mkdir(parents=True, exist_ok=True)
            guard.check(dest, where)
            with tarfile.open(source) as archive:
                archive.extractall(dest, filter="data")
            continue
        if source.is_dir():
            target = dest
            target.mkdir(parents=True, exist_ok=True)
            guard.check(target, where)
            _copy_tree(source, target, guard, context, ignore, step.chmod, where)
            continue
        if step.into_dir or dest.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
            target = dest / source.name
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            target = dest
        guard.check(target.parent, where)
        _copy_file(source, target, step.chmod)


def _copy_tree(
    source: Path,
    target: Path,
    guard: _RootGuard,
    context: Path,
    ignore: _DockerIgnore,
    chmod: int | None,
    where: str,
) -> None:
    """Copy a directory's contents; symlinks stay symlinks; nothing is written outside the root."""
    for dirpath, dirnames, filenames in os.walk(source):
        here = Path(dirpath)
        rel_dir = here.relative_to(source)
        out_dir = target / rel_dir
        kept = []
        for name in dirnames:
            rel = os.path.normpath(str((here / name).relative_to(context)))
            if ignore.excluded(rel):
                continue
            if (here / name).is_symlink():
                filenames.append(name)  # copy the link itself, never descend through it
                continue
            kept.append(name)
        dirnames[:] = kept
        out_dir.mkdir(parents=True, exist_ok=True)
        guard.check(out_dir, where)
        if chmod is not None:
            out_dir.chmod(chmod)
        for name in filenames:
            rel = os.path.normpath(str((here / name).relative_to(context)))
            if ignore.excluded(rel):
                continue
            _copy_file(here / name, out_dir / name, chmod)


def _copy_file(source: Path, target: Path, chmod: int | None) -> None:
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        target.unlink()
    if source.is_symlink():
        os.symlink(os.readlink(source), target)
        return
    shutil.copy2(source, target, follow_symlinks=False)
    if chmod is not None:
        target.chmod(chmod)


class _DockerIgnore:
    """``.dockerignore`` patterns: ``*``, ``?``, ``**``, ``!`` exceptions; the last match wins."""

    def __init__(self, context: Path):
        self.rules: list[tuple[re.Pattern[str], bool]] = []
        path = context / ".dockerignore"
        if not path.is_file():
            return
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            pattern = os.path.normpath(line.lstrip("!").strip().lstrip("/"))
            self.rules.append((re.compile(_glob_regex(pattern)), negate))

    def excluded(self, rel_path: str) -> bool:
        if not self.rules:
            return False
        parts = rel_path.split("/")
        candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        verdict = False
        for regex, negate in self.rules:
            if any(regex.fullmatch(c) for c in candidates):
                verdict = not negate
        return verdict


def _glob_regex(pattern: str) -> str:
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)
