"""The faulty disks of the disk-fault trials (tests/diskfault/trials.py), as context
managers a trial runner can use outside pytest.

`Tmpfs` is the full disk of tests/integration/test_disk_full.py: a tmpfs of a few MB
mounted over a storage node's data directory, filled by a ballast file that leaves a
little headroom, emptied again by deleting it (that test mounts it in a pytest fixture,
which nothing else can call). The failing disk is that test file's sibling's
`FaultyDisk` (tests/integration/test_fsync_failure.py, a FUSE mount of
tests/integration/faultyfs.py), used as it is. `commits_beyond_stored` is the full-disk
test's invariant -- a head never commits beyond what a full middle or tail stored --
as a function that reports instead of asserting.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess

from tests.integration.test_disk_full import TMPFS_BYTES, _can_mount, _replicas, _sn

MOUNT_TIMEOUT_S = 30.0


def tmpfs_unavailable() -> str:
    """Why a tmpfs cannot be mounted here ("" if it can)."""
    return _can_mount()


BALLAST_CHUNK_BYTES = 1 << 20        # the ballast is written a MB at a time


class Tmpfs:
    """A tmpfs of `size_bytes` at `mountpoint` (created if missing), unmounted on exit."""

    def __init__(self, mountpoint, size_bytes: int = TMPFS_BYTES):
        self.mountpoint = str(mountpoint)
        self.size_bytes = size_bytes
        self.ballast = os.path.join(self.mountpoint, "ballast")
        self.mounted = False

    def __enter__(self) -> "Tmpfs":
        reason = tmpfs_unavailable()
        if reason:
            raise RuntimeError(f"cannot mount a tmpfs: {reason}")
        os.makedirs(self.mountpoint, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size_bytes}", "tmpfs", self.mountpoint],
                       check=True, capture_output=True, timeout=MOUNT_TIMEOUT_S)
        self.mounted = True
        return self

    def __exit__(self, *exc) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", self.mountpoint], check=False, capture_output=True,
                           timeout=MOUNT_TIMEOUT_S)
            self.mounted = False

    def fill(self, headroom_bytes: int) -> int:
        """Write a ballast that leaves `headroom_bytes` free; its size. The node writes to
        the same disk meanwhile (under load): if it takes the headroom before the ballast
        is written, the disk is full sooner, which is the fault anyway, so a ballast write
        refused for space ends the ballast there."""
        size = max(0, shutil.disk_usage(self.mountpoint).free - headroom_bytes)
        written = 0
        with open(self.ballast, "wb", buffering=0) as f:
            while written < size:
                chunk = min(BALLAST_CHUNK_BYTES, size - written)
                try:
                    f.write(b"\0" * chunk)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
                written += chunk
        return written

    def free(self) -> None:
        """Space returns: the ballast goes."""
        os.unlink(self.ballast)


def commits_beyond_stored(client, cluster, victim: str, heads: dict[str, str]) -> list[str]:
    """For each chain (id -> head node) in which `victim` is a middle or tail: a message
    if its head's commit watermark is beyond the last SN the victim stored (a record the
    victim lacks was committed). The heads are read first: the victim's last SN only
    grows meanwhile."""
    committed = {cid: _sn(_replicas(client, cluster, head)[cid]["committed_sn"]) for cid, head in heads.items()}
    stored = {cid: _sn(r["last_sn"]) for cid, r in _replicas(client, cluster, victim).items()}
    return [f"{cid}: head {heads[cid]} committed SN {committed[cid]} beyond what {victim} stored "
            f"({stored.get(cid, 0)})" for cid in heads if committed[cid] > stored.get(cid, 0)]
