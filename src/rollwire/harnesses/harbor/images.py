"""Base images without a registry: what ``rollwire images build`` can make on this machine.

A Docker task's ``FROM`` must exist in the daemon before its build (nothing is pulled: the
docker sandbox never reaches a registry). Where no registry is reachable at all, Debian's own
tools make Debian's images from the Debian mirror apt already uses: ``debootstrap`` writes a
root file system, and the daemon imports it as an image (``docker import``) with the config the
official image carries (``CMD ["bash"]``, the usual ``PATH``). Any other image comes from
``docker load -i image.tar`` or a registry the daemon can reach.

The table :data:`BASES` says which references can be made and how; everything else is refused
with that advice.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rollwire.writes import WriteFailed, free_mib, probe_writable, writing

log = logging.getLogger("rollwire.images")

DEBIAN_MIRROR = "http://deb.debian.org/debian"
_SOURCES = ("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list")
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Base:
    """How one image reference is made here: a Debian suite through debootstrap."""

    suite: str
    variant: str  # debootstrap --variant: minbase is what the -slim images hold
    note: str


BASES: dict[str, Base] = {}
for _suite, _numbers in (("bookworm", ("12",)), ("trixie", ("13",))):
    for _name in (_suite, *_numbers):
        BASES[f"debian:{_name}-slim"] = Base(_suite, "minbase", "Debian's minimal base system")
        BASES[f"debian:{_name}"] = Base(_suite, "minbase", "Debian's minimal base system")


class ImageError(RuntimeError):
    """An image could not be made; the message says why and what to do instead."""


def how_to_provide(ref: str) -> str:
    """What a user can do about a missing image ``ref``."""
    if ref in BASES:
        return f"build it here with `rollwire images build {ref}` (debootstrap, no registry)"
    return (
        f"load it into the daemon with `docker load -i <image.tar>` (saved elsewhere with "
        f"`docker save {ref}`), or point the daemon at a registry that has it; "
        f"`rollwire images build` makes only {', '.join(sorted(BASES))}"
    )


def apt_mirror() -> str:
    """The Debian mirror apt on this machine uses (debootstrap's source), else Debian's CDN."""
    for path in _SOURCES:
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        for match in re.finditer(r"^(?:URIs:\s*|deb\s+(?:\[[^\]]*\]\s+)?)(\S+)", text, re.M):
            uri = match.group(1).rstrip("/")
            if uri.endswith("/debian"):
                return uri
    return DEBIAN_MIRROR


def debootstrap_problem() -> str | None:
    """Why debootstrap cannot run here, or None."""
    if shutil.which("debootstrap") is None:
        return "debootstrap is not installed (apt-get install debootstrap)"
    if os.geteuid() != 0:
        return "debootstrap needs root"
    return None


def build_base(
    ref: str,
    client: object,
    *,
    mirror: str | None = None,
    workdir: str | Path | None = None,
    say: Callable[[str], None] = log.info,
) -> str:
    """Make image ``ref`` (a key of :data:`BASES`) in the daemon ``client`` talks to.

    Returns the image id. Raises :class:`ImageError` naming the reason when it cannot.
    """
    base = BASES.get(ref)
    if base is None:
        raise ImageError(f"cannot build {ref!r} here: {how_to_provide(ref)}")
    problem = debootstrap_problem()
    if problem is not None:
        raise ImageError(f"cannot build {ref}: {problem}")
    mirror = mirror or apt_mirror()
    repository, _, tag = ref.partition(":")
    # ignore_cleanup_errors: a read-only disk cannot have the folder removed, and that must not
    # hide why the build stopped
    with (
        _disk_faults(ref, workdir or tempfile.gettempdir()),
        tempfile.TemporaryDirectory(
            prefix="rollwire-image-", dir=workdir, ignore_cleanup_errors=True
        ) as tmp,
    ):
        root = Path(tmp) / "root"
        say(f"debootstrap --variant={base.variant} {base.suite} from {mirror} (about 1-2 min)")
        start = time.monotonic()
        done = subprocess.run(
            ["debootstrap", f"--variant={base.variant}", base.suite, str(root), mirror],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            output = (done.stderr or done.stdout).strip()
            fault = _disk_fault_words(output)
            if fault is not None:  # a tool's words for it, deep in debootstrap's log
                raise WriteFailed(root, OSError(fault, os.strerror(fault)))
            probe_writable(Path(tmp))  # or only "Couldn't download": is it the disk?
            tail = output.splitlines()[-5:]
            free = free_mib(Path(tmp))
            raise ImageError(
                f"debootstrap {base.suite} from {mirror} failed (exit {done.returncode}): "
                + " | ".join(tail)
                + (f" ({free:.0f} MiB free in {tmp})" if free is not None else "")
            )
        _slim(root)
        archive = Path(tmp) / "root.tar"
        with writing(archive), tarfile.open(archive, "w") as tar:
            for entry in sorted(root.iterdir()):
                tar.add(entry, arcname=entry.name)
        say(f"root file system ready in {time.monotonic() - start:.0f} s; importing as {ref}")
        api = client.api  # type: ignore[attr-defined]
        answer = api.import_image_from_file(
            str(archive),
            repository=repository,
            tag=tag or "latest",
            changes=[f"ENV PATH={_PATH}", 'CMD ["bash"]'],
        )
    image = client.images.get(ref)  # type: ignore[attr-defined]
    log.debug("import answered %s", answer)
    return str(image.id)


@contextlib.contextmanager
def _disk_faults(ref: str, workdir: str | Path) -> Iterator[None]:
    """A full or read-only disk under ``workdir`` as an :class:`ImageError` naming the file."""
    try:
        yield
    except WriteFailed as exc:
        then = f"nothing was imported (the build works in {workdir}; TMPDIR moves it)"
        raise ImageError(f"cannot build {ref}: {exc.with_then(then)}") from exc


def _disk_fault_words(output: str) -> int | None:
    """The errno of a full or read-only disk named in a tool's output, if any."""
    for code in (errno.ENOSPC, errno.EROFS, errno.EDQUOT):
        if os.strerror(code) in output:
            return code
    return None


def _slim(root: Path) -> None:
    """Drop what the official -slim images drop: apt lists, caches, docs and man pages."""
    for rel in ("var/lib/apt/lists", "var/cache/apt/archives", "usr/share/doc", "usr/share/man"):
        path = root / rel
        if path.is_dir():
            for child in path.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                elif child.name != "lock" and child.name != "partial":
                    child.unlink(missing_ok=True)
