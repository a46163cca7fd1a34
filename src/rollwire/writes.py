"""Writing files so that a failed write is seen, named and leaves nothing torn.

A full disk (ENOSPC, EDQUOT), a file system turned read-only (EROFS) or a failing device (EIO)
surfaces from ``os.write``, ``fsync``, ``rename`` or ``open`` as an ``OSError`` that often names
no file at all ("[Errno 28] No space left on device"). Every writer of rollwire's outputs (the
episode store, exports, rollout documents, image builds) turns it into a :class:`WriteFailed`
that names the path it was writing, the cause and what the user can do, in one line.

A base module: it imports nothing of rollwire's, and every layer may use it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

#: errno -> what a user should do about it (the kernel's own words say what happened)
ADVICE = {
    errno.ENOSPC: "free space on that file system",
    errno.EDQUOT: "free space (the disk quota is used up)",
    errno.EROFS: "the file system is read-only: remount it read-write",
    errno.EIO: "the device reported an I/O error: check it",
    errno.EFBIG: "the file is larger than the file system allows",
    errno.EACCES: "this process may not write there",
    errno.EPERM: "this process may not write there",
}


class WriteFailed(OSError):
    """A write to ``path`` failed with ``cause``; ``then`` says what was kept and what to do.

    An ``OSError`` (its ``errno``, ``strerror`` and ``filename`` are the cause's, with the path
    written), so code that catches ``OSError`` keeps working; ``str()`` is one line."""

    def __init__(self, path: str | os.PathLike[str], cause: OSError, then: str = "") -> None:
        # The kernel's words for the errno, not a library's wrapping of them (pyarrow says
        # "Error writing bytes to file. Detail: [errno 28] No space left on device").
        words = os.strerror(cause.errno) if cause.errno else (cause.strerror or str(cause))
        super().__init__(cause.errno, words, str(path))
        self.path = Path(path)
        self.cause = cause
        self.then = then

    @property
    def code(self) -> str:
        """The errno's name (``ENOSPC``), or its number when it has none."""
        return errno.errorcode.get(self.errno or 0, str(self.errno))

    def __str__(self) -> str:
        advice = ADVICE.get(self.errno or 0)
        return (
            f"cannot write {self.path}: {self.strerror} ({self.code})"
            + (f"; {advice}" if advice else "")
            + (f"; {self.then}" if self.then else "")
        )

    def with_then(self, then: str) -> WriteFailed:
        """The same failure, saying ``then`` (what was kept, how to go on)."""
        return WriteFailed(self.path, self.cause, then)


def disk_fault_in(exc: BaseException) -> OSError | None:
    """The ``OSError`` of a disk fault (an errno of ``ADVICE``) that ``exc`` wraps, if any: a
    library may raise its own error from one (``datasets``' ``DatasetGenerationError``)."""
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        if isinstance(at, OSError) and at.errno in ADVICE:
            return at
        at = at.__cause__ or at.__context__
    return None


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn an ``OSError`` raised inside, or a library's error raised from a disk fault, into a
    :class:`WriteFailed` naming ``path`` (one that is a ``WriteFailed`` already, naming a more
    exact path, passes as it is)."""
    try:
        yield
    except WriteFailed:
        raise
    except OSError as exc:
        raise WriteFailed(path, exc) from exc
    except Exception as exc:
        cause = disk_fault_in(exc)
        if cause is None:
            raise
        raise WriteFailed(path, cause) from exc


def fsync_dir(path: Path) -> None:
    """fsync a directory, so that a rename or a new file in it survives a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that readers see the old file or the new, never a part.

    Writes a temporary file in the same directory, fsyncs it, ``os.replace``s it over ``path``
    and fsyncs the directory. On any failure the temporary file is removed, ``path`` is as it
    was, and an ``OSError`` is a :class:`WriteFailed` naming ``path``.
    """
    with writing(path):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        fsync_dir(path.parent)


def probe_writable(folder: Path, size: int = 64 * 1024) -> None:
    """Raise :class:`WriteFailed` when ``folder`` cannot take a small write now (a full or
    read-only disk): for a tool that failed and said why only in words of its own (debootstrap
    says "Couldn't download" when its disk is full)."""
    probe = folder / ".rollwire-write-probe"
    with writing(folder):
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, bytes(size))
                os.fsync(fd)
            finally:
                os.close(fd)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(probe)


def free_mib(folder: Path) -> float | None:
    """Free space under ``folder`` for this process, in MiB (None when unknown)."""
    try:
        sv = os.statvfs(folder)
    except OSError:
        return None
    return sv.f_bavail * sv.f_frsize / 2**20
