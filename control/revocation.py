"""Revoked certificates: serial numbers that no cluster port serves any more.

A node certificate whose key leaked would let its holder call the cluster's own
protocols (append, replication, node status) until it expires. `sms certs revoke`
records its serial under /revoked_certs (admins of the default tenant only); every
node re-reads the set every REVOCATION_REFRESH_S and its cluster port answers a call
made with that certificate PermissionDenied (node/tls.py ClusterPortGuard).

If the metadata store does not answer, a node keeps the set it read last: the cluster
keeps replicating through a metadata outage. (A node that has never read it serves the
cluster's own certificates meanwhile, and says so in its log.)
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from metastore import MetaStore, MetaStoreError, NodeExistsError, NoNodeError
from sms import limits, metadata
from kernel.aiotools import cancel_and_wait
from sms.errors import FailedPrecondition, InvalidArgument, LimitExceeded

log = logging.getLogger(__name__)

SERIAL_HEX_CHARS_MAX = 40          # X.509 serials are at most 20 octets


def parse_serial(serial: str) -> int:
    """A certificate serial number given in hex (colons allowed, as openssl prints them)."""
    text = serial.strip().lower().replace(":", "")
    text = text[2:] if text.startswith("0x") else text
    if not text or len(text) > SERIAL_HEX_CHARS_MAX or any(c not in "0123456789abcdef" for c in text):
        raise InvalidArgument(f"certificate serial {serial[:60]!r}; expected up to {SERIAL_HEX_CHARS_MAX} hex digits "
                              "(sms certs revoke CERT.pem reads it from the file)")
    return int(text, 16)


def _path(serial: int) -> str:
    return f"{metadata.REVOKED_CERTS}/{serial:x}"


async def revoke(store: MetaStore, serial: str, reason: str = "") -> None:
    number = parse_serial(serial)
    if len(reason) > limits.REVOCATION_REASON_CHARS_MAX:
        raise InvalidArgument(f"a reason of {len(reason)} characters; at most {limits.REVOCATION_REASON_CHARS_MAX}")
    if len(await store.children(metadata.REVOKED_CERTS)) >= limits.REVOKED_CERTS_MAX:
        raise LimitExceeded(f"{limits.REVOKED_CERTS_MAX} certificates are revoked already; a new CA would do better")
    entry = json.dumps({"revoked_ms": int(time.time() * 1000), "reason": reason}).encode()
    try:
        await store.create(_path(number), entry)
    except NodeExistsError:
        raise FailedPrecondition(f"certificate {number:x} is revoked already") from None


async def list_revoked(store: MetaStore) -> list[tuple[str, int, str]]:
    """(serial in hex, revoked at ms, reason) of every revoked certificate."""
    out = []
    for child in sorted(await store.children(metadata.REVOKED_CERTS)):
        entry = await store.get(f"{metadata.REVOKED_CERTS}/{child}")
        if entry is not None:
            d = json.loads(entry.value or b"{}")
            out.append((child, int(d.get("revoked_ms", 0)), str(d.get("reason", ""))))
    return out


class RevokedCerts:
    """A node's copy of the revoked serials, refreshed in the background."""

    def __init__(self, store: MetaStore):
        self.store = store
        self.serials: frozenset[int] = frozenset()
        self.read = False
        self._task: asyncio.Task | None = None

    def __contains__(self, serial: int) -> bool:
        return serial in self.serials

    async def refresh(self) -> None:
        try:
            async with asyncio.timeout(limits.METADATA_READ_WAIT_S):
                children = await self.store.children(metadata.REVOKED_CERTS)
        except NoNodeError:
            children = []                 # (a store from before revocation existed)
        serials = frozenset(int(c, 16) for c in children if all(ch in "0123456789abcdef" for ch in c))
        if serials != self.serials:
            log.info("revoked certificates: %d (%s)", len(serials), ", ".join(f"{s:x}" for s in sorted(serials)[:5]))
        self.serials = serials
        self.read = True

    async def start(self) -> None:
        try:
            await self.refresh()
        except (TimeoutError, MetaStoreError) as e:
            log.warning("revoked certificates cannot be read yet (%s): the cluster port serves every node "
                        "certificate of the CA until they are", e)
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="revoked-certs")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(limits.REVOCATION_REFRESH_S)
            try:
                await self.refresh()
            except (TimeoutError, MetaStoreError) as e:
                log.debug("revoked certificates not re-read: %s", e)

    async def close(self) -> None:
        await cancel_and_wait(self._task)
