"""How the engine's names, states and errors appear in Kinesis terms (docs/kinesis.md,
"Mapping").

- A shard is a partition: `shardId-` and the ordinal in 12 digits. A shard id given
  without the prefix, or with fewer digits, is taken too (`shardId-1`, `1`).
- A stream's ARN is `arn:aws:kinesis:<region>:<account>:stream/<name>`; a registered
  consumer's is the stream's with `/consumer/<name>:<creation epoch seconds>`. The
  region is the one the client signed for; the account is the cluster's
  (KINESIS_ACCOUNT_ID unless configured).
- Sequence numbers and hash keys are the engine's own 128-bit values, in decimal.
- A stream's status follows the engine's: CREATING, ACTIVE, UPDATING (while it
  repartitions), DELETING.
- Errors: each engine error by name becomes the Kinesis error type an SDK maps to its
  exception class, with the service's wording where clients match it.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re

from kinesis.protocol import KinesisError
from sms import errors

SHARD_PREFIX = "shardId-"
_SHARD_ID = re.compile(r"^(?:shardId-)?(\d{1,12})$")
_STREAM_ARN = re.compile(r"^arn:aws[a-z-]*:kinesis:([a-z0-9-]+):(\d{12}):stream/([a-zA-Z0-9_.-]{1,128})$")
_CONSUMER_ARN = re.compile(r"^arn:aws[a-z-]*:kinesis:([a-z0-9-]+):(\d{12}):stream/([a-zA-Z0-9_.-]{1,128})"
                           r"/consumer/([a-zA-Z0-9_.-]{1,128}):(\d+)$")


@functools.lru_cache(maxsize=4096)
def shard_id(ordinal: int) -> str:
    return f"{SHARD_PREFIX}{ordinal:012d}"


def ordinal_of(shard: str) -> int:
    """The partition ordinal of a shard id; ResourceNotFoundException for one no stream
    can have (as the service answers a shard it does not know)."""
    m = _SHARD_ID.match(shard or "")
    if m is None:
        raise KinesisError("ResourceNotFoundException", f"Shard {shard[:128]} does not exist.")
    return int(m.group(1))


def stream_arn(region: str, account: str, stream: str) -> str:
    return f"arn:aws:kinesis:{region}:{account}:stream/{stream}"


def consumer_arn(region: str, account: str, stream: str, consumer: str, created_s: int) -> str:
    return f"{stream_arn(region, account, stream)}/consumer/{consumer}:{created_s}"


def stream_of(params: dict, account: str) -> str:
    """The stream an operation names: StreamName, or the name in StreamARN (both given:
    they must agree). InvalidArgumentException when neither names one, or the ARN is
    another account's."""
    name, arn = params.get("StreamName"), params.get("StreamARN")
    if arn:
        m = _STREAM_ARN.match(arn)
        if m is None:
            raise KinesisError("InvalidArgumentException", f"StreamARN {arn[:200]} is not a stream ARN of the form "
                                                           f"arn:aws:kinesis:<region>:<account>:stream/<name>")
        if m.group(2) != account:
            raise KinesisError("AccessDeniedException", f"StreamARN {arn[:200]} belongs to account {m.group(2)}, "
                                                        f"not this cluster's {account}")
        if name and name != m.group(3):
            raise KinesisError("InvalidArgumentException",
                               f"StreamName {name} and StreamARN {arn[:200]} name different streams")
        return m.group(3)
    if not name:
        raise KinesisError("InvalidArgumentException", "Either StreamName or StreamARN must be provided.")
    return name


def stream_id(name: str, created_ms: int) -> str:
    """A stream's StreamId, of the model's form (20 + 3 characters of [a-z0-9]): derived from
    its name and creation time, so a stream made again under the same name has another."""
    digest = base64.b32encode(hashlib.blake2b(f"{name}\n{created_ms}".encode(), digest_size=15).digest())
    text = digest.decode().lower()
    return f"{text[:20]}-{text[20:23]}"


def consumer_of(arn: str, account: str) -> tuple[str, str, int]:
    """(stream, consumer name, creation seconds) of a consumer ARN."""
    m = _CONSUMER_ARN.match(arn or "")
    if m is None:
        raise KinesisError("InvalidArgumentException", f"ConsumerARN {arn[:200]} is not a consumer ARN")
    if m.group(2) != account:
        raise KinesisError("AccessDeniedException", f"ConsumerARN {arn[:200]} belongs to account {m.group(2)}")
    return m.group(3), m.group(4), int(m.group(5))


STATUS = {"CREATING": "CREATING", "ACTIVE": "ACTIVE", "REPARTITIONING": "UPDATING", "UPDATING": "UPDATING",
          "DELETING": "DELETING"}


def stream_status(engine_status: str, repartitioning: bool = False) -> str:
    if repartitioning and engine_status == "ACTIVE":
        return "UPDATING"
    return STATUS.get(engine_status, "ACTIVE")


# the engine's errors by name -> (Kinesis error type, HTTP status); the first match along
# the error's class hierarchy wins
_ERRORS: dict[str, tuple[str, int]] = {
    "StreamNotFound": ("ResourceNotFoundException", 400),
    "PartitionNotFound": ("ResourceNotFoundException", 400),
    "GroupNotFound": ("ResourceNotFoundException", 400),
    "QueueNotFound": ("ResourceNotFoundException", 400),
    "QueueAlreadyExists": ("ResourceInUseException", 400),
    "ChannelNotFound": ("ResourceNotFoundException", 400),
    "ChannelAlreadyExists": ("ResourceInUseException", 400),
    "RecordNotFound": ("ResourceNotFoundException", 400),
    "StreamAlreadyExists": ("ResourceInUseException", 400),
    "StreamNotActive": ("ResourceInUseException", 400),
    "StreamInUse": ("ResourceInUseException", 400),
    "RepartitionInProgress": ("ResourceInUseException", 400),
    "PartitionClosed": ("ResourceInUseException", 400),
    "ExpiredIterator": ("ExpiredIteratorException", 400),
    "InvalidArgument": ("InvalidArgumentException", 400),
    "FailedPrecondition": ("InvalidArgumentException", 400),
    "Throttled": ("ProvisionedThroughputExceededException", 400),
    "LimitExceeded": ("LimitExceededException", 400),
    "RecordsTrimmed": ("InvalidArgumentException", 400),
    "Unauthenticated": ("UnrecognizedClientException", 400),
    "PermissionDenied": ("AccessDeniedException", 400),
    "EncryptionUnavailable": ("KMSInvalidStateException", 400),
    "Unavailable": ("ServiceUnavailableException", 503),
    "NotEnoughReplicas": ("ServiceUnavailableException", 503),
    "Timeout": ("ServiceUnavailableException", 503),
}


def error_of(e: errors.SmsError, account: str = "") -> KinesisError:
    """The Kinesis error an engine error answers as."""
    for cls in type(e).__mro__:
        hit = _ERRORS.get(cls.__name__)
        if hit is not None:
            return KinesisError(hit[0], e.message, hit[1])
    return KinesisError("InternalFailureException", e.message, 500)
