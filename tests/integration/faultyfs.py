"""A passthrough FUSE filesystem whose fsync can be made to fail: the failing disk of
tests/integration/test_fsync_failure.py (no device-mapper on every test kernel, so the
fault is injected one level up, in a real filesystem the kernel mounts).

    python -m tests.integration.faultyfs BACKING_DIR MOUNTPOINT CONTROL_FILE

mirrors BACKING_DIR at MOUNTPOINT (in the foreground, until SIGTERM, an unmount with
`fusermount3 -u` or `umount -l`, or the death of the process that started it). Every operation goes to the backing directory, except that while
CONTROL_FILE holds `fsync` every fsync/fdatasync (and so every O_DSYNC write, which the
kernel completes with an fsync) fails with EIO, as on a disk whose writes fail. The
failure is the one Linux gives after a lost writeback (the "fsyncgate" case): the file's
writes since its last successful fsync are dropped from the backing file (reverted to
what it held then), while the kernel's page cache of the mounted file still shows them.
Truncate CONTROL_FILE (or delete it) and the disk is healthy again. Each failed fsync
adds a line to CONTROL_FILE + ".log", so a test can tell that the fault was hit.

Needs /dev/fuse, the libfuse3 library (Debian: fuse3) and the `mfusepy` package.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import sys
import threading

import mfusepy as fuse

UNDO_BYTES_MAX = 256 * 1024 * 1024      # per file: beyond this its unsynced writes are not tracked


class _Undo:
    """What a file held before its writes since the last successful fsync."""

    __slots__ = ("size", "ranges", "bytes", "overflow")

    def __init__(self, size: int):
        self.size = size
        self.ranges: list[tuple[int, bytes]] = []
        self.bytes = 0
        self.overflow = False


class FaultyFS(fuse.Operations):
    use_ns = True

    def __init__(self, backing: str, control: str):
        self.backing = os.path.realpath(backing)
        self.control = control
        self._mutex = threading.Lock()
        self.undo: dict[str, _Undo] = {}

    def _path(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def _fault(self) -> str:
        try:
            with open(self.control) as f:
                return f.read().strip()
        except FileNotFoundError:
            return ""

    # --- metadata ------------------------------------------------------------------------
    def access(self, path, amode):
        if not os.access(self._path(path), amode):
            raise fuse.FuseOSError(errno.EACCES)
        return 0

    def getattr(self, path, fh=None):
        st = os.fstat(fh) if fh is not None else os.lstat(self._path(path))
        return {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size",
                                              "st_atime_ns", "st_mtime_ns", "st_ctime_ns")} | {
            "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns}

    def chmod(self, path, mode):
        os.chmod(self._path(path), mode)
        return 0

    def chown(self, path, uid, gid):
        os.chown(self._path(path), uid, gid)
        return 0

    def utimens(self, path, times=None):
        os.utime(self._path(path), ns=times)
        return 0

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._path(path))

    def mkdir(self, path, mode):
        os.mkdir(self._path(path), mode)
        return 0

    def rmdir(self, path):
        os.rmdir(self._path(path))
        return 0

    def unlink(self, path):
        with self._mutex:
            self.undo.pop(self._path(path), None)
        os.unlink(self._path(path))
        return 0

    def rename(self, old, new):
        with self._mutex:
            self.undo.pop(self._path(old), None)
            self.undo.pop(self._path(new), None)
        os.rename(self._path(old), self._path(new))
        return 0

    def statfs(self, path):
        sv = os.statvfs(self._path(path))
        return {k: getattr(sv, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                              "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    # --- files ---------------------------------------------------------------------------
    def create(self, path, mode, fi=None):
        return os.open(self._path(path), os.O_RDWR | os.O_CREAT, mode)

    def open(self, path, flags):
        # O_DSYNC is not passed on: the kernel calls fsync after such a write, and that is
        # where the fault is; write-only opens read too (a write saves what it overwrites)
        flags &= ~(os.O_DSYNC | os.O_SYNC | os.O_APPEND)
        if flags & os.O_ACCMODE == os.O_WRONLY:
            flags = flags & ~os.O_ACCMODE | os.O_RDWR
        return os.open(self._path(path), flags)

    def read(self, path, size, offset, fh):
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        key = self._path(path)
        with self._mutex:
            undo = self.undo.get(key)
            if undo is None:
                undo = self.undo[key] = _Undo(os.fstat(fh).st_size)
            if not undo.overflow:
                old = os.pread(fh, len(data), offset) if offset < undo.size else b""
                undo.ranges.append((offset, old))
                undo.bytes += len(old)
                undo.overflow = undo.bytes > UNDO_BYTES_MAX
                if undo.overflow:
                    undo.ranges.clear()
            return os.pwrite(fh, data, offset)

    def truncate(self, path, length, fh=None):
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(self._path(path), length)
        return 0

    def flush(self, path, fh):
        return 0

    def release(self, path, fh):
        os.close(fh)
        return 0

    def fsync(self, path, datasync, fh):
        key = self._path(path)
        fault = self._fault()
        with self._mutex:
            undo = self.undo.pop(key, None)
            if fault != "fsync":
                (os.fdatasync if datasync else os.fsync)(fh)
                return 0
            if undo is not None and not undo.overflow:
                # the disk lost what was written since the last good fsync
                fd = os.open(key, os.O_WRONLY)
                try:
                    for offset, old in reversed(undo.ranges):
                        if old:
                            os.pwrite(fd, old, offset)
                    if os.fstat(fd).st_size > undo.size:
                        os.ftruncate(fd, undo.size)
                finally:
                    os.close(fd)
            with open(self.control + ".log", "a") as f:
                f.write(f"fsync failed: {path} ({len(undo.ranges) if undo else 0} writes dropped)\n")
        raise fuse.FuseOSError(errno.EIO)

    def fsyncdir(self, path, datasync, fh):
        if self._fault() == "fsync":
            raise fuse.FuseOSError(errno.EIO)
        return 0


def _exit_with_parent() -> None:
    """SIGTERM when the process that started us dies (libfuse then unmounts and exits)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)      # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(argv: list[str]) -> None:
    backing, mountpoint, control = argv
    _exit_with_parent()
    fuse.FUSE(FaultyFS(backing, control), mountpoint, foreground=True, nothreads=False,
              fsname="faultyfs", allow_other=False)


if __name__ == "__main__":
    main(sys.argv[1:])
