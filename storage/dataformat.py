"""The format of a storage node's data directory, and its upgrades.

A data directory carries its format in DIR/storage/FORMAT (JSON: `{"format": N,
"written_by": VERSION}`). A node opens it before anything else:

- no FORMAT file and no logs: a new directory, which gets the current format;
- no FORMAT file but logs: format 1, what every release before the marker wrote; it is
  upgraded in place to the current format (each step below, in order; FORMAT is written
  last, atomically, so a node killed mid-upgrade redoes the steps, which are idempotent);
- the current format: opened as is;
- a newer format than this release knows: refused with `DataFormatTooNew`, naming both,
  and nothing is touched. Downgrading is not supported; restore a backup instead
  (docs/operations.md, "Upgrades").

Stored batches also carry a version byte each (sms/wire.py); this is about the
directory's layout: which LMDB environments and databases exist, and what their keys mean.

Formats:
1. `log-disk.lmdb` and `log-disk_async.lmdb`, each with databases `batches`, `partitions`
   and `names`, no marker.
2. The same, with the FORMAT marker.
"""

from __future__ import annotations

import json
import logging
import os

log = logging.getLogger(__name__)

CURRENT = 2
FILE = "FORMAT"
_LOGS = ("log-disk.lmdb", "log-disk_async.lmdb")


class DataFormatError(RuntimeError):
    """The data directory cannot be opened by this release (the message says why)."""

    name = "DataFormatError"


class DataFormatTooNew(DataFormatError):
    name = "DataFormatTooNew"


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("sms-sps")
    except Exception:                         # noqa: BLE001 (not installed: a source tree)
        return "source"


def read(storage_dir: str) -> int | None:
    """The directory's format; None for a new directory (nothing in it yet)."""
    path = os.path.join(storage_dir, FILE)
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        return 1 if any(os.path.exists(os.path.join(storage_dir, name)) for name in _LOGS) else None
    except (OSError, ValueError) as e:
        raise DataFormatError(f"{path}: cannot be read ({e}); is this a storage data directory?") from None
    fmt = doc.get("format") if isinstance(doc, dict) else None
    if not isinstance(fmt, int) or fmt < 1:
        raise DataFormatError(f"{path}: no format number in {doc!r}")
    return fmt


def _write(storage_dir: str, fmt: int) -> None:
    path = os.path.join(storage_dir, FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"format": fmt, "written_by": _version()}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(storage_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _from_1(storage_dir: str) -> None:
    """1 -> 2: the layout is unchanged; the marker (written by open_dir) is the change."""


UPGRADES = {1: _from_1}       # format N -> N + 1


def open_dir(storage_dir: str) -> int:
    """Check the directory's format before a node opens it, upgrading an older one;
    returns the format it had (CURRENT for a new one). Raises DataFormatTooNew or
    DataFormatError."""
    os.makedirs(storage_dir, exist_ok=True)
    found = read(storage_dir)
    if found is None:
        _write(storage_dir, CURRENT)
        return CURRENT
    if found > CURRENT:
        raise DataFormatTooNew(f"{storage_dir} is in data format {found}, written by a newer release; this release "
                               f"({_version()}) reads formats 1..{CURRENT}. Run the newer release, or restore a "
                               "backup made for this one")
    if found < CURRENT:
        log.info("upgrading the data directory %s from format %d to %d", storage_dir, found, CURRENT)
        for fmt in range(found, CURRENT):
            UPGRADES[fmt](storage_dir)
        _write(storage_dir, CURRENT)
        log.info("the data directory %s is in format %d", storage_dir, CURRENT)
    return found
