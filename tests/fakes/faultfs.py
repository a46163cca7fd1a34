"""A real file system that fills up or turns read-only when a test says so (FUSE).

A size-limited tmpfs shows a real ENOSPC, but a tmpfs cannot turn read-only while a process holds
a file open for writing (``mount -o remount,ro`` answers "busy"), which is exactly what a disk
that fails mid-collection does. This is a passthrough FUSE file system over a backing folder
(fusepy over Debian's libfuse2, both installed by CI): every call reaches the kernel's VFS and
comes back through it, so the code under test sees the errno a real disk gives, from the call a
real disk gives it (``write``, ``fsync``, ``open``, ``rename``, ``mkdir``).

The test drives it through a control file outside the mount, JSON::

    {"errno": "ENOSPC", "after_bytes": 40000}   # writes succeed for 40,000 more bytes, then fail
    {"errno": "EROFS"}                           # from now on (after_bytes 0)
    {}                                           # healthy again ("space freed", "remounted rw")

A full disk (ENOSPC) still lets files be removed, truncated and renamed, as a real one does; a
read-only one refuses every change. Both fail ``fsync`` once tripped (a delayed write failing at
fsync, as ext4's delayed allocation does).

Run: ``python -m tests.fakes.faultfs BACKING MOUNTPOINT CONTROL`` (root; unmount with ``umount``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


class Faults:
    """The control file, re-read when it changes; counts bytes written since it last did."""

    def __init__(self, control: Path) -> None:
        self.control = control
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._errno = 0
        self._budget = 0

    def _reload(self) -> None:
        try:
            st = self.control.stat()
        except FileNotFoundError:
            stamp = None
        else:
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        spec: dict[str, Any] = {}
        if stamp is not None:
            with contextlib.suppress(ValueError):
                spec = json.loads(self.control.read_text() or "{}")
        name = spec.get("errno")
        self._errno = getattr(errno, name) if name else 0
        self._budget = int(spec.get("after_bytes", 0))

    def tripped(self) -> int:
        """The errno every change fails with now (0: healthy)."""
        with self._lock:
            self._reload()
            return self._errno if self._errno and self._budget <= 0 else 0

    def spend(self, n: int) -> int:
        """Account a write of ``n`` bytes: the errno if it may not happen (a write that crosses
        the budget writes nothing, as a full disk refuses the block that does not fit)."""
        with self._lock:
            self._reload()
            if not self._errno:
                return 0
            if self._budget < n:
                self._budget = 0
                return self._errno
            self._budget -= n
            return 0


def serve(backing: str, mountpoint: str, control: str) -> None:
    from fuse import FUSE, FuseOSError, Operations

    faults = Faults(Path(control))
    root = os.path.realpath(backing)

    def real(path: str) -> str:
        return os.path.join(root, path.lstrip("/"))

    def guard(*, freeing: bool = False) -> None:
        code = faults.tripped()
        if code and not (freeing and code != errno.EROFS):
            raise FuseOSError(code)

    class Passthrough(Operations):  # type: ignore[misc]
        # -- reads: always allowed
        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            st = os.lstat(real(path))
            keys = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink")
            return {k: getattr(st, k) for k in (*keys, "st_rdev", "st_size", "st_uid")}

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *os.listdir(real(path))]

        def readlink(self, path: str) -> str:
            return os.readlink(real(path))

        def access(self, path: str, amode: int) -> None:
            if not os.access(real(path), amode):
                raise FuseOSError(errno.EACCES)

        def statfs(self, path: str) -> dict[str, Any]:
            sv = os.statvfs(real(path))
            keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree")
            out = {k: getattr(sv, k) for k in (*keys, "f_files", "f_flag", "f_frsize", "f_namemax")}
            if faults.tripped() == errno.ENOSPC:
                out["f_bavail"] = out["f_bfree"] = 0
            return out

        def open(self, path: str, flags: int) -> int:
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC):
                guard(freeing=True)  # a full disk opens files; a read-only one does not
            return os.open(real(path), flags)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            return os.pread(fh, size, offset)

        def release(self, path: str, fh: int) -> None:
            os.close(fh)

        def flush(self, path: str, fh: int) -> None:
            return None

        # -- changes: refused once tripped
        def create(self, path: str, mode: int, fi: Any = None) -> int:
            guard(freeing=True)  # an empty file takes an inode, not a block
            return os.open(real(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            code = faults.spend(len(data))
            if code:
                raise FuseOSError(code)
            return os.pwrite(fh, data, offset)

        def fsync(self, path: str, datasync: int, fh: int) -> None:
            guard()
            os.fsync(fh)

        def fsyncdir(self, path: str, datasync: int, fh: int) -> None:
            guard()

        def mkdir(self, path: str, mode: int) -> None:
            guard()
            os.mkdir(real(path), mode)

        def rename(self, old: str, new: str) -> None:
            guard(freeing=True)
            os.replace(real(old), real(new))

        def truncate(self, path: str, length: int, fh: int | None = None) -> None:
            guard(freeing=True)
            with open(real(path), "r+b") as f:
                f.truncate(length)

        def unlink(self, path: str) -> None:
            guard(freeing=True)
            os.unlink(real(path))

        def rmdir(self, path: str) -> None:
            guard(freeing=True)
            os.rmdir(real(path))

        def chmod(self, path: str, mode: int) -> None:
            guard()
            os.chmod(real(path), mode)

        def chown(self, path: str, uid: int, gid: int) -> None:
            guard()
            os.chown(real(path), uid, gid)

        def utimens(self, path: str, times: tuple[float, float] | None = None) -> None:
            guard()
            os.utime(real(path), times)

        def symlink(self, target: str, source: str) -> None:
            guard()
            os.symlink(source, real(target))

        def link(self, target: str, source: str) -> None:
            guard()
            os.link(real(source), real(target))

        def mknod(self, path: str, mode: int, dev: int) -> None:
            guard()
            os.mknod(real(path), mode, dev)

    # hard_remove: a file unlinked while open goes at once, as on a disk (libfuse would keep
    # it as .fuse_hidden*, and the folder holding it could not be removed)
    # dev, suid: device files and set-uid programs work, as on a disk (debootstrap needs both)
    FUSE(
        Passthrough(),
        mountpoint,
        foreground=True,
        nothreads=False,
        hard_remove=True,
        dev=True,
        suid=True,
    )


class FaultFS:
    """A mounted fault file system: ``path`` is its mount point; ``fill(after_bytes)``,
    ``read_only()`` and ``heal()`` change what it does from the next call on."""

    def __init__(self, base: Path) -> None:
        self.backing = base / "backing"
        self.path = base / "mnt"
        self.control = base / "faults.json"
        self.backing.mkdir(parents=True)
        self.path.mkdir()
        self.control.write_text("{}")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.fakes.faultfs",
                *map(str, (self.backing, self.path, self.control)),
            ],
            cwd=ROOT,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 20
        while not os.path.ismount(self.path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = self.proc.stderr.read().decode() if self.proc.poll() is not None else ""
                self.close()
                raise RuntimeError(f"the fault file system did not mount: {err}")
            time.sleep(0.05)

    def _set(self, spec: dict[str, Any]) -> None:
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps(spec))
        os.replace(tmp, self.control)  # a new inode: the stamp changes even within one ns

    def fill(self, after_bytes: int = 0) -> None:
        """A full disk once ``after_bytes`` more bytes are written (ENOSPC)."""
        self._set({"errno": "ENOSPC", "after_bytes": after_bytes, "n": time.monotonic_ns()})

    def read_only(self, after_bytes: int = 0) -> None:
        """Read-only once ``after_bytes`` more bytes are written (EROFS)."""
        self._set({"errno": "EROFS", "after_bytes": after_bytes, "n": time.monotonic_ns()})

    def heal(self) -> None:
        """Space freed, remounted read-write."""
        self._set({"n": time.monotonic_ns()})

    def close(self) -> None:
        if os.path.ismount(self.path):
            subprocess.run(["umount", "-l", str(self.path)], check=False)
        if self.proc.poll() is None:
            self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.proc.poll() is None:
            self.proc.kill()


@contextlib.contextmanager
def fault_fs(base: Path) -> Iterator[FaultFS]:
    fs = FaultFS(base)
    try:
        yield fs
    finally:
        fs.close()


if __name__ == "__main__":
    serve(*sys.argv[1:4])
