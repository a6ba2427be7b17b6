"""A wake-up when a file is written: Linux inotify, through ctypes (no dependency).

The embedded store's processes share one LMDB file, and learn of each other's writes by
polling it (metastore/embedded.py). Every write transaction writes the file, so an inotify
watch on it (IN_MODIFY) wakes a poller at once, and the poll period is only the fallback:
a new chain reaches its nodes in a millisecond instead of up to METASTORE_POLL_INTERVAL_S.
Where inotify is missing (not Linux, no libc, the per-user watch limit reached),
`FileWatch.open` answers None and the poll goes on alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

_IN_MODIFY = 0x00000002
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_READ_BYTES = 4096


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        return libc
    except (OSError, AttributeError):
        return None


class FileWatch:
    """A readable file descriptor whenever `path` has been written since the last `drain`."""

    def __init__(self, fd: int):
        self.fd = fd

    @classmethod
    def open(cls, path: str) -> "FileWatch | None":
        libc = _libc()
        if libc is None:
            return None
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            log.info("no inotify for %s (errno %d): polling only", path, ctypes.get_errno())
            return None
        if libc.inotify_add_watch(fd, os.fsencode(path), _IN_MODIFY) < 0:
            log.info("no inotify watch on %s (errno %d): polling only", path, ctypes.get_errno())
            os.close(fd)
            return None
        return cls(fd)

    def drain(self) -> None:
        """Read the events that made the descriptor readable (their content is not needed)."""
        try:
            while os.read(self.fd, _READ_BYTES):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
