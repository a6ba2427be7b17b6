"""`sms put` and `sms read`: records from arguments or stdin, read by partition, lineage or group."""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import json
import sys
import uuid
from collections.abc import Callable, Iterator

from node.cli.common import _address, _client, _emit, _progress
from sms import errors, limits


def cmd_put(args) -> int:
    if args.key == "":         # (the API refuses it: before anything is read or sent)
        raise errors.InvalidPartitionKey(f"--key ''; a partition key has {limits.PARTITION_KEY_CHARS_MIN}.."
                                         f"{limits.PARTITION_KEY_CHARS_MAX} characters (leave --key out for a "
                                         f"random key per record)")
    lines = args.data if args.data else (line.rstrip("\n") for line in sys.stdin)
    results, failed = [], 0
    with _client(args) as client, \
            _progress(f"put {args.stream}: reading stdin") if not args.data else contextlib.nullcontext() as shown:
        batch: list = []

        def flush() -> None:
            nonlocal failed
            if not batch:
                return
            out = client.put_records(args.stream, batch)
            for r in out.records:
                failed += 0 if r.ok else 1
                results.append({"partition_id": r.partition_id, "sequence_number": r.sequence_number}
                               if r.ok else {"error": r.error_name, "message": r.error_message})
            batch.clear()
            if shown:
                shown(f"put {args.stream}: {len(results):,} records sent" + (f", {failed:,} failed" if failed else ""))

        headers = _parse_headers(args.header)
        for line in lines:
            key = uuid.uuid4().hex if args.key is None else args.key
            batch.append((key, line.encode(), None, headers) if headers else (key, line.encode()))
            if len(batch) == limits.PUT_RECORDS_COUNT_MAX:
                flush()
        flush()
    human = "\n".join(f"{r['partition_id']} {r['sequence_number']}" if "error" not in r
                      else f"error: {r['error']}: {r['message']}" for r in results)
    _emit(args, results, human)
    return 1 if failed else 0


def _parse_headers(specs: list[str] | None) -> dict[str, bytes]:
    """--header NAME=VALUE options as a record's headers (checked again by the client)."""
    out: dict[str, bytes] = {}
    for spec in specs or ():
        name, sep, value = spec.partition("=")
        if not sep or not name:
            raise errors.InvalidRecordHeader(f"--header {spec!r}; expected NAME=VALUE")
        if name in out:
            raise errors.InvalidRecordHeader(f"--header {name!r} given twice")
        out[name] = value.encode()
    return out


def _text(raw: bytes) -> str:
    """Bytes for a person: valid UTF-8 as it is; anything else as Python writes bytes,
    escaped (DE AD BE EF shows as \\xde\\xad\\xbe\\xef, never as text such as "deadbeef")."""
    text = _utf8(raw)
    return repr(raw)[2:-1] if text is None else text


def _utf8(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _record_json(r) -> dict:
    """A record for `--json`: "data" holds data that is valid UTF-8, else "data_b64" holds
    it in base64 (never both); header values likewise, in "headers" or "headers_b64"."""
    out = {"partition_id": r.partition_id, "sequence_number": r.sequence_number, "partition_key": r.partition_key,
           "arrival_time_ms": r.arrival_time_ms}
    text = _utf8(r.data)
    if text is None:
        out["data_b64"] = base64.b64encode(r.data).decode("ascii")
    else:
        out["data"] = text
    for name, value in (r.headers or {}).items():
        text = _utf8(value)
        if text is None:
            out.setdefault("headers_b64", {})[name] = base64.b64encode(value).decode("ascii")
        else:
            out.setdefault("headers", {})[name] = text
    return out


def _print_record(args, r) -> None:
    if args.json:
        print(json.dumps(_record_json(r)), flush=True)
        return
    headers = r.headers
    shown = " [" + ", ".join(f"{k}={_text(v)}" for k, v in headers.items()) + "]" if headers else ""
    print(f"{r.partition_id} {r.sequence_number} {r.partition_key}{shown}: {_text(r.data)}", flush=True)


def cmd_read(args) -> int:
    from sms.types import parse_partition_id
    if args.group:
        return _read_group(args)
    if args.partition == "all":
        return _read_lineage(args)
    with _client(args) as client, _reading(args) as count:
        ordinals = [parse_partition_id(args.partition)]
        iterators = {o: client.get_iterator(args.stream, o, args.iterator_type, sequence_number=args.sequence_number,
                                            timestamp_ms=args.timestamp_ms) for o in ordinals}
        shown = 0
        while iterators and (args.max is None or shown < args.max):
            idle = True
            for o, it in list(iterators.items()):
                want = limits.GET_RECORDS_COUNT_MAX if args.max is None else min(limits.GET_RECORDS_COUNT_MAX,
                                                                                 args.max - shown)
                if want <= 0:
                    break
                res = client.get_next_records(it, max_records=want, wait_ms=limits.CLI_FOLLOW_WAIT_MS if args.follow else 0,
                                              skip_trimmed=args.skip_trimmed)
                for r in res.records:
                    _print_record(args, r)
                shown += len(res.records)
                count(shown)
                idle = idle and not res.records
                if res.next_iterator is None:
                    del iterators[o]
                else:
                    iterators[o] = res.next_iterator
            if idle and not args.follow:
                break
    return 0


@contextlib.contextmanager
def _reading(args) -> Iterator[Callable[[int], None]]:
    """`sms read` without --follow: yields count(records read so far), shown in progress
    (see `_progress`) when stdout is not a terminal."""
    progress = _progress(f"read {args.stream}", stdout_too=True) if not args.follow else contextlib.nullcontext()
    with progress as shown:
        yield (lambda n: shown(f"read {args.stream}: {n:,} records")) if shown else (lambda n: None)


def _read_group(args) -> int:
    """As a member of a consumer group: a batch counts as processed once it is printed;
    without --follow it stops when nothing came for a second (checkpointing on the way out)."""
    kind = args.iterator_type.upper()
    if args.partition != "all" or kind not in ("TRIM_HORIZON", "LATEST", "AT_TIMESTAMP"):
        raise errors.InvalidArgument("--group reads every partition, from TRIM_HORIZON, LATEST or AT_TIMESTAMP "
                                     "(for partitions the group has not read yet)")
    options = {"start": kind, "wait_ms": limits.CLI_GROUP_READ_WAIT_MS, "auto_checkpoint": args.max is None, "skip_trimmed": args.skip_trimmed}
    if kind == "AT_TIMESTAMP":
        options["timestamp_ms"] = args.timestamp_ms
    shown = 0
    with _client(args) as client, client.consumer(args.stream, args.group, **options) as consumer, \
            _reading(args) as count:
        while args.max is None or shown < args.max:
            batch = consumer.poll(None if args.follow else limits.CLI_GROUP_READ_IDLE_S)
            if batch is None:
                break
            taken = batch.records if args.max is None else batch.records[:args.max - shown]
            for r in taken:
                _print_record(args, r)
            shown += len(taken)
            count(shown)
            if args.max is not None:        # (only what was shown counts as processed)
                consumer.checkpoint(batch if len(taken) == len(batch.records)
                                    else dataclasses.replace(batch, records=taken))
    return 0


def _read_lineage(args) -> int:
    """Every partition of the stream, walking its lineage (parents before children)."""
    kind = args.iterator_type.upper()
    kwargs: dict = {"follow": args.follow, "skip_trimmed": args.skip_trimmed}
    skip_sn = None
    if kind in ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER"):
        if not args.sequence_number:
            raise errors.InvalidArgument(f"--from {kind} needs --sequence-number")
        kwargs["sequence_number"] = args.sequence_number
        skip_sn = args.sequence_number if kind == "AFTER_SEQUENCE_NUMBER" else None
    elif kind == "AT_TIMESTAMP":
        if args.timestamp_ms is None:
            raise errors.InvalidArgument("--from AT_TIMESTAMP needs --timestamp-ms")
        kwargs["timestamp_ms"] = args.timestamp_ms
    elif kind in ("TRIM_HORIZON", "LATEST"):
        kwargs["start"] = kind
    else:
        raise errors.InvalidIteratorType(f"iterator type {args.iterator_type!r}; expected TRIM_HORIZON, LATEST, "
                                         "AT_SEQUENCE_NUMBER, AFTER_SEQUENCE_NUMBER or AT_TIMESTAMP")
    from sms import aio
    address = _address(args)

    async def read(count: Callable[[int], None]) -> None:
        # asyncio: Ctrl-C cancels this task, so the read's generator is closed where it
        # runs (the sync client's generator, interrupted in another thread, could not be)
        shown = 0
        async with aio.Client(address) as client, \
                contextlib.aclosing(client.read_stream(args.stream, **kwargs)) as records:
            async for r in records:
                if skip_sn is not None and str(r.sequence_number) == str(skip_sn):
                    continue
                _print_record(args, r)
                shown += 1
                count(shown)
                if args.max is not None and shown >= args.max:
                    break

    with _reading(args) as count:
        asyncio.run(read(count))
    return 0


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    """This module's commands, on the `sms` parser's subcommands (`common`: the client options)."""
    put = sub.add_parser("put", parents=[common], help="put records from arguments or stdin lines")
    put.add_argument("stream", help="the stream's name")
    put.add_argument("data", nargs="*", help="one record each (none: one record per line of stdin)")
    put.add_argument("--key", help=f"partition key, {limits.PARTITION_KEY_CHARS_MIN}..{limits.PARTITION_KEY_CHARS_MAX} "
                                   "characters (default: a random key per record)")
    put.add_argument("--header", action="append", metavar="NAME=VALUE",
                     help="a header every record carries (repeatable; read back by `sms read`)")
    put.set_defaults(func=cmd_put)

    read = sub.add_parser("read", parents=[common], help="read records",
                          description="Print records, one a line: PARTITION SN KEY [HEADERS]: DATA. Data that is "
                                      "not valid UTF-8 shows as Python writes bytes, escaped "
                                      "(\\xde\\xad\\xbe\\xef). With --json, one object a line; data that is "
                                      "not valid UTF-8 comes in base64 as \"data_b64\" instead of \"data\" "
                                      "(header values: \"headers_b64\" instead of \"headers\"). Ctrl-C stops, "
                                      "with exit code 130.")
    read.add_argument("stream", help="the stream's name")
    read.add_argument("--partition", default="all",
                      help="one partition (e.g. p0001 or 1); default all, walking the lineage")
    read.add_argument("--from", dest="iterator_type", default="TRIM_HORIZON",
                      help="TRIM_HORIZON, LATEST, AT_SEQUENCE_NUMBER, AFTER_SEQUENCE_NUMBER or AT_TIMESTAMP")
    read.add_argument("--sequence-number", help="the SN for --from AT_SEQUENCE_NUMBER or AFTER_SEQUENCE_NUMBER")
    read.add_argument("--timestamp-ms", type=int, help="the time for --from AT_TIMESTAMP, ms since the epoch")
    read.add_argument("--max", type=int, help="stop after this many records")
    read.add_argument("--follow", action="store_true", help="keep tailing, until Ctrl-C (exit code 130)")
    read.add_argument("--skip-trimmed", action="store_true",
                      help="records deleted (retention, a trim) before they were read: go on from the oldest left "
                           "instead of failing with RecordsTrimmed")
    read.add_argument("--group", help="read as a member of this consumer group: from its checkpoints, sharing "
                                      "the partitions with its other members, checkpointing what was shown")
    read.set_defaults(func=cmd_read)
