"""Encryption at rest: streams whose batches are stored sealed with AES-256-GCM.

A stream created or updated with `encryption="aes-256-gcm"` gets a **data key** (32 random
bytes), kept in its config wrapped by the cluster's current **master key**
(`StreamConfig.data_key`: "<master key id>:<base64 of nonce + sealed key>"; AES-GCM with
the stream's stored name as associated data, so a wrapped key cannot be moved to another
stream). Master keys come from a key file (JSON `{"current": ID, "keys": {ID: hex}}`, mode
0600; `sms up` makes one) or from $SMS_MASTER_KEY (the same JSON, or one key in hex).
Rotating: add a key to the file and make it current on every host, then have the control
leader re-wrap every data key (`rewrap`); the old key may go once that is done.

**Batches.** The head seals each batch right after it sequenced it (storage/replica.py):
the header stays as it is (SNs, count, origin, the chain's checksums) and says
`FLAG_SEALED`; the body becomes salt(16) + AES-GCM ciphertext + tag, under a key derived
per batch from the data key and the salt (HKDF-SHA256), with the header's fields as
associated data (a batch cannot be moved to another position). Its checksum covers the
stored (sealed) bytes, so replicas, learners, the archive and every check of stored
batches work on them without the key. Readers never see a sealed batch: the retrieval
role opens each before it answers (`open_batch`), giving the batch as it was sequenced.
A per-batch key (2^128 salts) sidesteps AES-GCM's limit of 2^32 random nonces per key.

`StreamKeys` is a node's cache of the streams' data keys (from their configs, re-read at
most every ENCRYPTION_CONFIG_REFRESH_S): the key to seal with (the stream is encrypted now)
and the key to open with (a stream that was encrypted once keeps its data key).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
import secrets
import time
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from metastore import MetaStore, MetaStoreError
from sms import limits, metadata, wire
from sms.errors import EncryptionUnavailable, InvalidStreamConfig, Unavailable
from sms.wire import CorruptBatch
from sms.metadata import StreamConfig

ALGORITHM = "aes-256-gcm"
ALGORITHMS = ("none", ALGORITHM)
ENV_MASTER_KEY = "SMS_MASTER_KEY"
KEY_BYTES = 32
SALT_BYTES = 16
NONCE_BYTES = 12
_ZERO_NONCE = bytes(NONCE_BYTES)          # (each batch has a key of its own)
_BATCH_INFO = b"sms batch key v1"
_AAD = wire.HEADER_AAD


def validate_algorithm(value: str | None) -> str | None:
    """`value` if it names a mode ("none", "aes-256-gcm"; None: unchanged)."""
    if value is None or value in ALGORITHMS:
        return value
    raise InvalidStreamConfig(f"encryption {str(value)[:32]!r}; expected one of {', '.join(ALGORITHMS)}")


# --- master keys --------------------------------------------------------------------------

@dataclass(frozen=True)
class MasterKeys:
    """The master keys this process holds, by id, and the one new data keys are wrapped by."""

    keys: dict[str, bytes]
    current: str = ""
    source: str = ""                       # the file (or $SMS_MASTER_KEY) they came from

    @classmethod
    def none(cls) -> "MasterKeys":
        return cls({}, "", "")

    @classmethod
    def load(cls, path: str = "", env: dict[str, str] | None = None) -> "MasterKeys":
        """From the key file at `path`, else $SMS_MASTER_KEY, else none. ValueError names a
        key file or value that cannot be used."""
        env = os.environ if env is None else env
        if path:
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except OSError as e:
                raise ValueError(f"master key file {path}: {e.strerror or e}") from None
            return cls._parse(text, path)
        text = env.get(ENV_MASTER_KEY, "").strip()
        return cls._parse(text, f"${ENV_MASTER_KEY}") if text else cls.none()

    @classmethod
    def _parse(cls, text: str, source: str) -> "MasterKeys":
        text = text.strip()
        if text and not text.startswith("{"):          # one key in hex
            return cls({"k1": _hex_key(text, source, "k1")}, "k1", source)
        try:
            doc = json.loads(text)
            raw_keys, current = doc["keys"], doc["current"]
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{source}: expected JSON {{\"current\": ID, \"keys\": {{ID: 64 hex digits}}}}") from None
        if not isinstance(raw_keys, dict) or not raw_keys or current not in raw_keys:
            raise ValueError(f"{source}: the current key {current!r} is not among its keys")
        keys = {}
        for key_id, value in raw_keys.items():
            if not isinstance(key_id, str) or not key_id or ":" in key_id or len(key_id) > 64:
                raise ValueError(f"{source}: key id {str(key_id)[:70]!r}; expected 1..64 characters, no ':'")
            keys[key_id] = _hex_key(value, source, key_id)
        return cls(keys, current, source)

    def wrap(self, stream: str, data_key: bytes) -> str:
        """`data_key` sealed by the current master key, bound to the stream's stored name."""
        if not self.current:
            raise InvalidStreamConfig("encryption needs a master key on the control node (the key file of "
                                      "`encryption.master_key_file`, or $SMS_MASTER_KEY); none is configured")
        nonce = os.urandom(NONCE_BYTES)
        sealed = AESGCM(self.keys[self.current]).encrypt(nonce, data_key, stream.encode())
        return f"{self.current}:{base64.b64encode(nonce + sealed).decode()}"

    def unwrap(self, stream: str, wrapped: str) -> bytes:
        """The stream's data key. EncryptionUnavailable without the master key it names;
        CorruptBatch-like InvalidStreamConfig for a wrapped key that does not open."""
        key_id, sep, blob = wrapped.partition(":")
        master = self.keys.get(key_id)
        if not sep or master is None:
            raise EncryptionUnavailable(f"stream {stream!r}: its data key is wrapped by master key {key_id!r}, "
                                        f"which this node does not hold ({self.source or 'no key file'})")
        try:
            raw = base64.b64decode(blob, validate=True)
            return AESGCM(master).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], stream.encode())
        except (binascii.Error, ValueError, InvalidTag):
            raise InvalidStreamConfig(f"stream {stream!r}: its data key does not open with master key "
                                      f"{key_id!r} (a damaged config, or a key file of another cluster)") from None


def _hex_key(value: object, source: str, key_id: str) -> bytes:
    try:
        key = bytes.fromhex(str(value).strip())
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise ValueError(f"{source}: master key {key_id!r}: expected {2 * KEY_BYTES} hex digits")
    return key


def write_key_file(path: str, doc: dict) -> None:
    """Write a key file, mode 0600 (atomically: a temp file renamed over it)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def new_key_file(path: str) -> None:
    """A key file with one new master key, unless one is there already."""
    if not os.path.exists(path):
        write_key_file(path, {"current": "k1", "keys": {"k1": secrets.token_hex(KEY_BYTES)}})


def add_master_key(path: str) -> str:
    """Rotation, step one: a new master key in the key file, made current (the older ones
    stay until every data key is re-wrapped). Returns its id."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    n = len(doc["keys"]) + 1
    while f"k{n}" in doc["keys"]:
        n += 1
    key_id = f"k{n}"
    doc["keys"][key_id] = secrets.token_hex(KEY_BYTES)
    doc["current"] = key_id
    write_key_file(path, doc)
    return key_id


# --- batches --------------------------------------------------------------------------------

def _batch_aead(data_key: bytes, salt: bytes) -> AESGCM:
    return AESGCM(HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=salt, info=_BATCH_INFO).derive(data_key))


def seal_batch(batch: bytes, data_key: bytes) -> bytes:
    """A sequenced clear batch, sealed: same header fields, FLAG_SEALED, the body encrypted,
    the checksum over the stored bytes (so the chain's checksums hold on sealed batches)."""
    h = wire.read_header(batch)
    salt = os.urandom(SALT_BYTES)
    raw_sn = bytes(batch[8:24])
    aad = _AAD.pack(h.count, raw_sn, h.origin_id, h.origin_seq, h.prev_checksum)
    sealed = _batch_aead(data_key, salt).encrypt(_ZERO_NONCE, bytes(memoryview(batch)[wire.HEADER_BYTES:]), aad)
    return wire.seal(h.count, h.first_sn, salt + sealed, h.origin_id, h.origin_seq, h.prev_checksum,
                     flags=wire.FLAG_SEALED)


def open_batch(batch: bytes, data_key: bytes) -> bytes:
    """A sealed batch as it was sequenced (flags 0, its checksum over the clear body);
    CorruptBatch when it does not open (a damaged batch, or not this stream's key)."""
    h = wire.read_header(batch)
    body = memoryview(batch)[wire.HEADER_BYTES:]
    raw_sn = bytes(batch[8:24])
    aad = _AAD.pack(h.count, raw_sn, h.origin_id, h.origin_seq, h.prev_checksum)
    try:
        clear = _batch_aead(data_key, bytes(body[:SALT_BYTES])).decrypt(_ZERO_NONCE, bytes(body[SALT_BYTES:]), aad)
    except (InvalidTag, ValueError):
        raise CorruptBatch(f"batch first_sn {h.first_sn}: sealed, and it does not open with the stream's "
                           "data key") from None
    return wire.seal(h.count, h.first_sn, clear, h.origin_id, h.origin_seq, h.prev_checksum)


def is_sealed(batch: bytes | memoryview) -> bool:
    return len(batch) > 1 and bool(batch[1] & wire.FLAG_SEALED)


# --- a node's view of the streams' keys -------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Keys:
    seal: bytes | None            # the data key new batches are sealed with (None: stored clear)
    open: bytes | None            # the data key sealed batches open with (None: never encrypted)
    read_s: float                 # monotonic time of the config read


class StreamKeys:
    """A node's data keys by stream, from the streams' configs and its master keys; each
    stream's config is read again at most every ENCRYPTION_CONFIG_REFRESH_S (a stream
    updated to encrypt seals its new batches within that)."""

    def __init__(self, store: MetaStore, masters: MasterKeys, master_key_file: str = ""):
        self.store = store
        self.masters = masters
        self.master_key_file = master_key_file
        self._known: dict[str, _Keys] = {}
        self._reads: dict[str, asyncio.Future[_Keys]] = {}
        self._reloaded_s = 0.0

    async def sealing_key(self, stream: str) -> bytes | None:
        """The data key to seal the stream's new batches with (None: the stream is not
        encrypted). EncryptionUnavailable when this node cannot unwrap it."""
        return (await self._keys(stream)).seal

    async def opening_key(self, stream: str, fresh: bool = False) -> bytes:
        """The data key the stream's sealed batches open with (`fresh`: read its config again
        first). EncryptionUnavailable when this node holds none for it."""
        keys = await self._keys(stream, fresh)
        if keys.open is None and not fresh:
            keys = await self._keys(stream, True)
        if keys.open is None:
            raise EncryptionUnavailable(f"stream {stream!r} holds sealed batches but no data key")
        return keys.open

    async def open_batches(self, stream: str, batches: list[bytes]) -> list[bytes]:
        """Each batch as a reader gets it: sealed ones opened."""
        if not any(is_sealed(b) for b in batches):
            return batches
        key = await self.opening_key(stream)
        return [open_batch(b, key) if is_sealed(b) else b for b in batches]

    async def _keys(self, stream: str, fresh: bool = False) -> _Keys:
        known = self._known.get(stream)
        if known is not None and not fresh and time.monotonic() - known.read_s < limits.ENCRYPTION_CONFIG_REFRESH_S:
            return known
        pending = self._reads.get(stream)
        if pending is None:
            pending = self._reads[stream] = asyncio.get_running_loop().create_future()
            try:
                keys = await self._read(stream)
            except BaseException as e:
                pending.set_exception(e)
                pending.exception()
                raise
            finally:
                del self._reads[stream]
            pending.set_result(keys)
            return keys
        return await asyncio.shield(pending)

    async def _read(self, stream: str) -> _Keys:
        started = time.monotonic()
        try:
            entry = await self.store.get(metadata.stream_path(stream))
        except MetaStoreError as e:
            raise Unavailable(f"stream {stream!r}: its config could not be read: {e}") from None
        config = StreamConfig.from_bytes(entry.value) if entry is not None and entry.value else None
        if config is None or not config.data_key:
            keys = _Keys(None, None, started)
        else:
            data_key = self._unwrap(stream, config.data_key)
            keys = _Keys(data_key if config.encryption == ALGORITHM else None, data_key, started)
        if len(self._known) >= limits.ENCRYPTION_STREAMS_CACHED_MAX:
            self._known.clear()
        self._known[stream] = keys
        return keys

    def _unwrap(self, stream: str, wrapped: str) -> bytes:
        try:
            return self.masters.unwrap(stream, wrapped)
        except EncryptionUnavailable:
            # a master key added since this node started (a rotation): read the file again,
            # at most every ENCRYPTION_CONFIG_REFRESH_S
            now = time.monotonic()
            if not self.master_key_file or now - self._reloaded_s < limits.ENCRYPTION_CONFIG_REFRESH_S:
                raise
            self._reloaded_s = now
            try:
                self.masters = MasterKeys.load(self.master_key_file)
            except ValueError as e:
                raise EncryptionUnavailable(str(e)) from None
            return self.masters.unwrap(stream, wrapped)
