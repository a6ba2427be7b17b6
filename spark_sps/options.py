"""The options of the `sms` Spark data source, checked once, at the edge.

`source_options` and `sink_options` turn Spark's option map (case-insensitive: Spark
hands it over with lower-cased keys) into frozen dataclasses, or raise `OptionError` (a
ValueError that Spark shows as its one line) that names the option and what it takes. An option the mode does not know is refused by
name, with the list of valid ones; Kafka's names for the same ideas (`startingOffsets`,
`maxOffsetsPerTrigger`...) are refused with a pointer to this source's own. No I/O: the
data source (spark_sps/datasource.py) calls these on the driver before it contacts the
cluster, and docs/sps.md ("Spark connector") documents every option.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping

from sms import limits, seqno
from sms.errors import SmsError
from sms.types import parse_partition_id

TRIM_HORIZON = "TRIM_HORIZON"
LATEST = "LATEST"
AT_TIMESTAMP = "AT_TIMESTAMP"
STARTING_KINDS = (TRIM_HORIZON, LATEST, AT_TIMESTAMP)
ENDING_KINDS = (LATEST, AT_TIMESTAMP)

HIDE_TRACEBACK_ENV = "SPARK_HIDE_TRACEBACK"     # what pyspark's workers read (pyspark.util.handle_worker_exception)


class OptionError(ValueError):
    """A bad option of the sms data source: shown as its one line, not a Python traceback.

    Spark runs the data source in a Python worker, and the worker sends the driver the
    whole traceback of an exception unless $SPARK_HIDE_TRACEBACK is set when it handles
    it (Spark sets that for every worker with the session conf
    spark.sql.execution.pyspark.udf.hideTraceback.enabled: too much to change for one
    data source). So raising one sets the variable in this process, and formatting it
    (the worker's handler reads the variable, then formats the exception: `__str__`)
    puts the variable back as it was: the next error of this worker shows its traceback
    as before. Where nothing formats it (caught and dropped), the variable stays set
    until the next OptionError is formatted."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._hidden = HIDE_TRACEBACK_ENV not in os.environ
        if self._hidden:
            os.environ[HIDE_TRACEBACK_ENV] = "1"

    def __str__(self) -> str:
        if self._hidden:
            self._hidden = False
            os.environ.pop(HIDE_TRACEBACK_ENV, None)
        return super().__str__()


# Options common to every mode, then those of each mode; canonical spelling (Spark lower-cases keys).
CONNECTION = ("address", "stream", "caFile", "token")
SOURCE_COMMON = CONNECTION + ("startingPosition", "startingTimestamp", "failOnDataLoss")
STREAM_SOURCE = SOURCE_COMMON + ("maxRecordsPerTrigger", "consumerName")
BATCH_SOURCE = SOURCE_COMMON + ("endingPosition", "endingTimestamp")
STREAM_SINK = CONNECTION + ("producerId", "checkpointLocation")
BATCH_SINK = CONNECTION + ("producerId",)

# Kafka's names for what this source calls otherwise: refused, with a pointer.
KAFKA_NAMES = {
    "startingOffsets": "startingPosition (TRIM_HORIZON, LATEST, AT_TIMESTAMP or JSON of SNs per partition)",
    "startingOffsetsByTimestamp": "startingPosition AT_TIMESTAMP with startingTimestamp",
    "endingOffsets": "endingPosition (LATEST, AT_TIMESTAMP or JSON of SNs per partition)",
    "endingOffsetsByTimestamp": "endingPosition AT_TIMESTAMP with endingTimestamp",
    "maxOffsetsPerTrigger": "maxRecordsPerTrigger",
    "subscribe": "stream", "assign": "stream", "topic": "stream",
    "kafka.bootstrap.servers": "address",
    "kafka.group.id": "consumerName", "groupIdPrefix": "consumerName",
    "includeHeaders": "nothing: the headers column is always there",
}

# producer ids: "<producerId>:<partition index>" (stream sink), "<producerId>:<write id>:<partition index>" (batch)
PARTITION_SUFFIX_BYTES_MAX = 1 + 10
WRITE_ID_HEX_CHARS = 12
BATCH_PRODUCER_ID_DEFAULT = "spark-batch"
CONSUMER_NAME = re.compile(r"[A-Za-z0-9_.-]{1,%d}" % limits.STREAM_NAME_CHARS_MAX)


@dataclasses.dataclass(frozen=True, slots=True)
class Position:
    """Where a read starts or ends, before it is resolved against the stream.

    kind: TRIM_HORIZON, LATEST, AT_TIMESTAMP (with `timestamp_ms`), or "SN" with `sns`:
    per partition ordinal an SN (int) or the word TRIM_HORIZON / LATEST. A starting SN
    means "at or after": the record with that SN is the first read if it exists, else the
    first one after it. An ending SN is exclusive: records before it are read."""

    kind: str
    timestamp_ms: int | None = None
    sns: tuple[tuple[int, int | str], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Connection:
    address: str
    stream: str
    credentials: tuple[tuple[str, str | None], ...]     # aio.Client keyword arguments

    def client_kwargs(self) -> dict:
        return dict(self.credentials)


@dataclasses.dataclass(frozen=True, slots=True)
class SourceOptions:
    connection: Connection
    starting: Position
    fail_on_data_loss: bool
    max_records_per_trigger: int | None = None      # streaming
    consumer_name: str | None = None                # streaming; None: "spark-<random>", kept in the offsets
    ending: Position = Position(LATEST)             # batch


@dataclasses.dataclass(frozen=True, slots=True)
class SinkOptions:
    connection: Connection
    producer_id: str


def _lower(names) -> dict[str, str]:
    return {n.lower(): n for n in names}


def _check_names(options: Mapping[str, str], valid: tuple[str, ...], what: str,
                 other: tuple[str, ...], other_what: str) -> None:
    """Every option is one `valid` for `what`; else ValueError naming it (and, for an
    option of the other mode `other_what`, saying where it applies)."""
    known = _lower(valid)
    kafka = _lower(KAFKA_NAMES)
    elsewhere = _lower(n for n in other if n not in valid)
    listing = ", ".join(valid)
    for key in options:
        low = key.lower()
        if low in known:
            continue
        if low in kafka:
            name = kafka[low]
            raise OptionError(f"option {name!r} is Kafka's; the sms data source takes {KAFKA_NAMES[name]} "
                             f"(valid options for {what}: {listing})")
        if low in elsewhere:
            raise OptionError(f"option {elsewhere[low]!r} applies to {other_what} only, not to {what} "
                             f"(valid options: {listing})")
        raise OptionError(f"unknown option {key!r} for {what}; valid options: {listing}")


def _get(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name.lower())
    return None if value is None else str(value)


def _required(options: Mapping[str, str], name: str) -> str:
    value = _get(options, name)
    if not value:
        raise OptionError(f'the sms data source needs .option("{name}", ...)')
    return value


def _connection(options: Mapping[str, str]) -> Connection:
    """`caFile` and `token` (docs/security.md); absent: $SMS_CA_FILE and $SMS_TOKEN."""
    return Connection(_required(options, "address"), _required(options, "stream"),
                      (("ca_file", _get(options, "caFile")), ("token", _get(options, "token"))))


def _int(options: Mapping[str, str], name: str, *, low: int) -> int | None:
    text = _get(options, name)
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise OptionError(f"option {name} {text[:64]!r}; expected an integer >= {low}") from None
    if value < low:
        raise OptionError(f"option {name} {value}; expected an integer >= {low}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = _get(options, name)
    if text is None:
        return default
    if text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"
    raise OptionError(f"option {name} {text[:64]!r}; expected true or false")


def _partition_sns(name: str, text: str, words: tuple[str, ...]) -> tuple[tuple[int, int | str], ...]:
    """JSON {"<partition id>": "<SN>" | word}: partition ids like "p0003" or "3"."""
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(f"option {name} {text[:80]!r}; expected {' | '.join(words)} or JSON like "
                         '{"p0000": "<SN>", "p0001": "LATEST"}')
    out: dict[int, int | str] = {}
    for pid, value in parsed.items():
        try:
            ordinal = parse_partition_id(str(pid))
        except SmsError as e:
            raise OptionError(f"option {name}: {e.message}") from None
        if isinstance(value, str) and value.strip().upper() in words:
            out[ordinal] = value.strip().upper()
            continue
        try:
            sn = seqno.parse(value if isinstance(value, int) else str(value).strip())
        except SmsError:
            raise OptionError(f"option {name}: partition {pid!r} has {str(value)[:64]!r}; expected an SN "
                             f"(a decimal string) or one of {', '.join(words)}") from None
        if seqno.ordinal_of(sn) != ordinal:
            raise OptionError(f"option {name}: SN {sn} belongs to partition p{seqno.ordinal_of(sn):04d}, "
                             f"not {pid!r}")
        out[ordinal] = sn
    return tuple(sorted(out.items()))


def _position(options: Mapping[str, str], name: str, timestamp_name: str, kinds: tuple[str, ...],
              default: str) -> Position:
    text = _get(options, name)
    ts = _int(options, timestamp_name, low=0)
    kind = default if text is None else text.strip()
    if kind.upper() in kinds:
        kind = kind.upper()
    elif kind.startswith("{"):
        sn_words = (TRIM_HORIZON, LATEST) if name == "startingPosition" else (LATEST,)
        if ts is not None:
            raise OptionError(f"option {timestamp_name} goes with {name} AT_TIMESTAMP, not with JSON positions")
        return Position("SN", sns=_partition_sns(name, kind, sn_words))
    else:
        raise OptionError(f"option {name} {kind[:64]!r}; expected one of {', '.join(kinds)} or JSON of SNs per "
                         'partition like {"p0000": "<SN>"}')
    if ts is not None and text is None:
        kind = AT_TIMESTAMP                  # (as Kafka: the timestamp alone says where to start)
    if kind == AT_TIMESTAMP and ts is None:
        raise OptionError(f"option {name} AT_TIMESTAMP needs .option(\"{timestamp_name}\", <ms since the epoch>)")
    if kind != AT_TIMESTAMP and ts is not None:
        raise OptionError(f"option {timestamp_name} goes with {name} AT_TIMESTAMP, not with {kind}")
    return Position(kind, timestamp_ms=ts)


def source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    stream_what, batch_what = "spark.readStream.format('sms')", "spark.read.format('sms')"
    if streaming:
        _check_names(options, STREAM_SOURCE, stream_what, BATCH_SOURCE, batch_what)
    else:
        _check_names(options, BATCH_SOURCE, batch_what, STREAM_SOURCE, stream_what)
    starting = _position(options, "startingPosition", "startingTimestamp", STARTING_KINDS, TRIM_HORIZON)
    fail = _bool(options, "failOnDataLoss", True)
    if streaming:
        name = _get(options, "consumerName")
        if name is not None and not CONSUMER_NAME.fullmatch(name):
            raise OptionError(f"option consumerName {name[:80]!r}; expected [A-Za-z0-9_.-]{{1,"
                             f"{limits.STREAM_NAME_CHARS_MAX}}}")
        return SourceOptions(_connection(options), starting, fail,
                             max_records_per_trigger=_int(options, "maxRecordsPerTrigger", low=1),
                             consumer_name=name)
    ending = _position(options, "endingPosition", "endingTimestamp", ENDING_KINDS, LATEST)
    return SourceOptions(_connection(options), starting, fail, ending=ending)


def sink_options(options: Mapping[str, str], *, streaming: bool) -> SinkOptions:
    stream_what, batch_what = "df.writeStream.format('sms')", "df.write.format('sms')"
    if streaming:
        _check_names(options, STREAM_SINK, stream_what, BATCH_SINK, batch_what)
    else:
        _check_names(options, BATCH_SINK, batch_what, STREAM_SINK, stream_what)
    if streaming:
        producer_id = _required(options, "producerId")
        room = limits.PRODUCER_ID_BYTES_MAX - PARTITION_SUFFIX_BYTES_MAX
    else:
        producer_id = _get(options, "producerId") or BATCH_PRODUCER_ID_DEFAULT
        room = limits.PRODUCER_ID_BYTES_MAX - PARTITION_SUFFIX_BYTES_MAX - 1 - WRITE_ID_HEX_CHARS
    if len(producer_id.encode()) > room:
        raise OptionError(f"option producerId of {len(producer_id.encode())} bytes; at most {room} "
                         f"(the sink appends the Spark partition to it)")
    return SinkOptions(_connection(options), producer_id)
