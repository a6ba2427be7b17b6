"""The AWS secret access keys the endpoint verifies signatures with: each SMS key's, kept in
its entry wrapped by the cluster's master key (control/auth.py `wrap_sigv4`), unwrapped
here on the first request signed with it and kept for KEY_CACHE_TTL_S, so that a revoked
key stops working within that time, as on gRPC."""

from __future__ import annotations

import time
from collections.abc import Callable

from control import auth
from kinesis.protocol import KinesisError
from metastore import MetaStore
from sms import limits
from sms.errors import SmsError

INVALID_TOKEN = "The security token included in the request is invalid."


class SigningKeys:
    def __init__(self, store: MetaStore, master_keys, *, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.master_keys = master_keys
        self.clock = clock
        self._known: dict[str, tuple[float, str]] = {}      # key id -> (read at, secret)

    async def secret_of(self, key_id: str) -> str:
        """The key's AWS secret access key; UnrecognizedClientException for a key that does not
        exist (or was revoked), or that has no secret this node can open."""
        hit = self._known.get(key_id)
        if hit is not None and self.clock() - hit[0] < limits.KEY_CACHE_TTL_S:
            return hit[1]
        if not auth.is_key_id(key_id):
            raise KinesisError("UnrecognizedClientException", INVALID_TOKEN)
        read_at = self.clock()
        entry = await self.store.get(auth.key_path(key_id))
        if entry is None:
            self._known.pop(key_id, None)
            raise KinesisError("UnrecognizedClientException", INVALID_TOKEN)
        try:
            key = auth.KeyEntry.from_bytes(key_id, entry.value)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            raise KinesisError("UnrecognizedClientException", INVALID_TOKEN) from None
        if self.master_keys is None:
            raise KinesisError("UnrecognizedClientException",
                               f"{INVALID_TOKEN} (this node has no master key to open keys' AWS secrets with: "
                               f"encryption.master_key_file)")
        if not key.sigv4:
            raise KinesisError("UnrecognizedClientException",
                               f"{INVALID_TOKEN} (key {key_id} was made without an AWS secret access key: made before "
                               f"the Kinesis endpoint, or on a control node without the master key; make a new key)")
        try:
            secret = self.master_keys.unwrap(auth.sigv4_aad(key_id), key.sigv4).decode()
        except SmsError as e:
            raise KinesisError("UnrecognizedClientException", f"{INVALID_TOKEN} ({e.message})") from None
        if len(self._known) >= limits.AUTH_CACHE_ENTRIES_MAX:
            self._known.clear()
        self._known[key_id] = (read_at, secret)
        return secret
