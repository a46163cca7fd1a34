"""File transfers into and out of a running local sandbox, done by this process, no exec.

Every path is resolved *inside* the sandbox, as a process in it would resolve it: from a handle
on its root (``/proc/<pid 1>/root``, which sees its mounts too) with Linux's ``openat2`` and
``RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS``, so ``..`` and symlinks (absolute ones included)
never leave the sandbox's root, whatever a sandboxed process made or changes meanwhile. Below a
resolved directory, entries are opened one name at a time with ``O_NOFOLLOW``. Writes go through
the sandbox's mounts (a read-only ``/usr`` stays read-only) and follow its files' semantics:

- ``upload_file``: ``mkdir -p`` of the parent, then ``cat > target`` (a symlink at the target is
  followed, inside the sandbox) and ``chmod`` to the source's mode.
- ``upload_dir``: ``mkdir -p`` of the target, then what ``tar -x --no-same-owner`` of the source
  does as root: directories merged, files and symlinks replacing what is there, modes and
  modification times kept, hard links within the source kept.
- ``download_file``: ``cat`` (the source's symlinks followed inside the sandbox); only regular files.
- ``download_dir``: ``cd source && tar -cf - .`` as a tar archive (symlinks stored as links, never
  followed; FIFOs, sockets and devices left out), which the caller unpacks with its filter.

The functions block; callers run them in a thread, each on a duplicate of the root handle so that
closing the sandbox's own handle never lets a number be reused under a running transfer.
"""

from __future__ import annotations

import ctypes
import errno
import io
import os
import platform
import posixpath
import stat
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import IO

_SYS_OPENAT2 = 437  # one number on every architecture that got openat2 (Linux 5.6)
_ARCHES = {"x86_64", "aarch64", "arm64", "armv7l", "ppc64le", "s390x", "riscv64", "i686"}
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
_IN_MEMORY = 1 << 20  # files up to this size are snapshotted in memory when archived


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_syscall = None
_AVAILABLE: bool | None = None


def openat2(root: int, path: str, flags: int, mode: int = 0) -> int:
    """``path`` opened as a process whose ``/`` is ``root`` would open it (never outside it)."""
    global _syscall
    if _syscall is None:
        libc = ctypes.CDLL(None, use_errno=True)
        _syscall = libc.syscall
        _syscall.restype = ctypes.c_long
    how = _OpenHow(flags | os.O_CLOEXEC, mode, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    while True:
        fd = _syscall(
            ctypes.c_long(_SYS_OPENAT2),
            ctypes.c_int(root),
            ctypes.c_char_p(os.fsencode(path)),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return int(fd)
        code = ctypes.get_errno()
        if code not in (errno.EINTR, errno.EAGAIN):  # EAGAIN: a rename raced the lookup
            raise OSError(code, os.strerror(code), path)


def available() -> bool:
    """Whether this kernel has ``openat2`` with ``RESOLVE_IN_ROOT`` (else transfers exec)."""
    global _AVAILABLE
    if _AVAILABLE is None:
        _AVAILABLE = False
        if sys.platform.startswith("linux") and platform.machine() in _ARCHES:
            try:
                root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    os.close(openat2(root, "/", os.O_PATH | os.O_DIRECTORY))
                    _AVAILABLE = True
                finally:
                    os.close(root)
            except OSError:
                pass
    return _AVAILABLE


def open_root(pid: int) -> int:
    """A handle on the root of process ``pid`` (pid 1 of a sandbox): its files and mounts."""
    return os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def _dir(root: int, path: str) -> int:
    return openat2(root, path, os.O_RDONLY | os.O_DIRECTORY)


def make_dirs(root: int, path: str) -> int:
    """``mkdir -p path`` in the sandbox; returns the directory opened (symlinks followed inside)."""
    try:
        return _dir(root, path)
    except FileNotFoundError:
        pass
    parts = [p for p in path.split("/") if p and p != "."]
    fd = _dir(root, "/")
    try:
        for i, name in enumerate(parts):
            prefix = "/" + "/".join(parts[: i + 1])
            try:
                child = _dir(root, prefix)
            except FileNotFoundError:
                try:
                    os.mkdir(name, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass  # made meanwhile, or a dangling link: resolving it says which
                child = _dir(root, prefix)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _copy_fd(source: int, target: int) -> int:
    copied = 0
    while True:
        try:
            sent = os.sendfile(target, source, None, 1 << 30)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                raise
            while chunk := os.read(source, 1 << 20):
                os.write(target, chunk)
                copied += len(chunk)
            return copied
        if sent == 0:
            return copied
        copied += sent


def upload_file(root: int, source: IO[bytes], target: str) -> None:
    """``source`` (an open host file) to ``target``: its content and its mode."""
    mode = stat.S_IMODE(os.fstat(source.fileno()).st_mode)
    os.close(make_dirs(root, posixpath.dirname(target) or "/"))
    fd = openat2(root, target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOCTTY, 0o666)
    try:
        _copy_fd(source.fileno(), fd)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def upload_dir(root: int, source: Path, target: str) -> None:
    target_fd = make_dirs(root, target)
    links: dict[tuple[int, int], tuple[int, str]] = {}  # source inode -> (dir fd, name) landed
    try:
        _upload_entries(source, target_fd, links)
    finally:
        for fd, _ in links.values():
            os.close(fd)
        os.close(target_fd)


def _upload_entries(
    source: Path, dir_fd: int, links: dict[tuple[int, int], tuple[int, str]]
) -> None:
    # The order and the choices of GNU tar extracting, as root, an archive of `source`.
    for name in sorted(os.listdir(source)):
        path = source / name
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            _replace_non_dir(name, dir_fd)
            with _suppress_exists():
                os.mkdir(name, 0o700, dir_fd=dir_fd)
            sub = os.open(
                name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
            )
            try:
                _upload_entries(path, sub, links)
                os.fchmod(sub, stat.S_IMODE(st.st_mode))  # after its contents, as tar does
                os.utime(sub, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(sub)
            continue
        _remove_non_dir(name, dir_fd)
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and key in links and not stat.S_ISLNK(st.st_mode):
            first_dir, first_name = links[key]
            os.link(
                first_name, name, src_dir_fd=first_dir, dst_dir_fd=dir_fd, follow_symlinks=False
            )
        elif stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(path), name, dir_fd=dir_fd)
        elif stat.S_ISREG(st.st_mode):
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
            try:
                src = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    _copy_fd(src, fd)
                finally:
                    os.close(src)
                os.fchmod(fd, stat.S_IMODE(st.st_mode))
                os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(fd)
            if st.st_nlink > 1:
                links[key] = (os.dup(dir_fd), name)
        elif stat.S_ISFIFO(st.st_mode):
            os.mkfifo(name, stat.S_IMODE(st.st_mode), dir_fd=dir_fd)
        else:
            raise OSError(errno.EPERM, "device nodes and sockets cannot be uploaded", str(path))


class _suppress_exists:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is FileExistsError


def _replace_non_dir(name: str, dir_fd: int) -> None:
    """Where a directory goes, anything but a real directory (a symlink too) is removed first."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)


def _remove_non_dir(name: str, dir_fd: int) -> None:
    """A file or link replaces what is there; a directory in its way is an error, as for tar."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), name)
    os.unlink(name, dir_fd=dir_fd)


def download_file(root: int, source: str, sink: IO[bytes]) -> None:
    fd = openat2(root, source, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), source)
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file", source)
        sink.flush()
        _copy_fd(fd, sink.fileno())
    finally:
        os.close(fd)


def download_dir(root: int, source: str, archive: IO[bytes]) -> None:
    """An uncompressed tar of the directory ``source`` (its contents, relative names)."""
    fd = _dir(root, source)
    try:
        with tarfile.open(fileobj=archive, mode="w") as tar:
            _archive_entries(tar, fd, "")
    finally:
        os.close(fd)


def _archive_entries(tar: tarfile.TarFile, dir_fd: int, prefix: str) -> None:
    with os.scandir(dir_fd) as it:
        names = sorted(entry.name for entry in it)
    for name in names:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed meanwhile
        info = tarfile.TarInfo(prefix + name)
        info.mode = stat.S_IMODE(st.st_mode)
        info.mtime = st.st_mtime
        info.uid, info.gid = st.st_uid, st.st_gid
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = os.open(
                    name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
                )
            except (FileNotFoundError, NotADirectoryError):
                continue  # replaced meanwhile (by a link, never followed)
            try:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
                _archive_entries(tar, sub, f"{prefix}{name}/")
            finally:
                os.close(sub)
        elif stat.S_ISLNK(st.st_mode):
            info.type = tarfile.SYMTYPE
            info.linkname = os.readlink(name, dir_fd=dir_fd)
            tar.addfile(info)
        elif stat.S_ISREG(st.st_mode):
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
            try:
                fd = os.open(name, flags, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ELOOP):
                    continue  # removed, or replaced by a link (never followed), meanwhile
                raise
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    continue
                _add_file(tar, info, fd)
            finally:
                os.close(fd)
        # FIFOs, sockets and devices carry no content: left out.


def _add_file(tar: tarfile.TarFile, info: tarfile.TarInfo, fd: int) -> None:
    """Add what the file holds now: a snapshot, so a file that grows or shrinks meanwhile is whole."""
    size = os.fstat(fd).st_size
    if size <= _IN_MEMORY:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        data = b"".join(chunks)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        return
    with tempfile.TemporaryFile() as copy:
        info.size = _copy_fd(fd, copy.fileno())
        copy.seek(0)
        tar.addfile(info, copy)
