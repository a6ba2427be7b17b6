"""The source's offsets and the decisions made on them: plain functions, no I/O.

An offset (what Spark checkpoints, as JSON) is {"consumer": <name>, "partitions": {<ordinal>:
<position>}}; a position is a string:

- "<sn>": the SN of the last record read ("0": none yet: the next is the partition's
  first record ever). Counters in SNs are consecutive within a partition (sms/seqno.py:
  the head gives each record the next counter, and retention never deletes a
  partition's newest batch), so the next record must carry counter(sn) + 1: a reader
  that meets a higher one knows exactly that records were trimmed before it read them.
- "@<sn>": the next record to read is the one with this SN, which existed when the
  query resolved its starting position (TRIM_HORIZON, AT_TIMESTAMP, an SN).
- "END": a closed partition read to its ending SN.

A partition is in the offset once the query reads it: the starting cut, then each child
in the micro-batch after all its parents reached END (so per key, records come in SN
order across splits and merges). `advance` computes the next offset from the map and the
commit watermarks; `allocate` shares a read limit among partitions by their backlog.
Before the nesting under "partitions" (and the consumer name), an offset was the flat
map of positions: `unpack` still reads that.
"""

from __future__ import annotations

from sms import seqno
from sms.types import PartitionState, StreamInfo
from spark_sps.options import OptionError

END = "END"
NONE_READ = "0"


def after(sn: int) -> str:
    return str(sn)


def at(sn: int) -> str:
    return f"@{sn}"


def parse(position: str) -> tuple[str, int]:
    """("after", sn) | ("at", sn) | ("end", 0)."""
    if position == END:
        return "end", 0
    if position.startswith("@"):
        return "at", int(position[1:])
    return "after", int(position)


def expected_counter(position: str) -> int:
    """The counter the next record of the partition must carry."""
    kind, sn = parse(position)
    if kind == "at":
        return seqno.counter_of(sn)
    return seqno.counter_of(sn) + 1 if sn else 1


def last_read(position: str) -> int:
    """The SN up to which everything is read at `position` (for "@sn", just below sn)."""
    kind, sn = parse(position)
    return sn - 1 if kind == "at" else sn


def reaches(position: str, upto_sn: int) -> bool:
    """Whether records may lie after `position` up to and including `upto_sn`."""
    kind, sn = parse(position)
    if kind == "end":
        return False
    return upto_sn >= sn if kind == "at" else upto_sn > sn


def backlog(position: str, upto_sn: int) -> int:
    """How many records follow `position` up to and including `upto_sn` (a record's SN)."""
    kind, _sn = parse(position)
    if kind == "end" or not upto_sn:
        return 0
    return max(0, seqno.counter_of(upto_sn) - expected_counter(position) + 1)


def pack(consumer: str | None, partitions: dict[str, str]) -> dict:
    out: dict = {"partitions": dict(sorted(partitions.items(), key=lambda kv: int(kv[0])))}
    if consumer:
        out["consumer"] = consumer
    return out


def unpack(offset: dict) -> tuple[str | None, dict[str, str]]:
    if "partitions" in offset:
        return offset.get("consumer"), dict(offset["partitions"])
    return None, {k: v for k, v in offset.items() if k.isdigit()}      # (the flat, older form)


def consumer_checkpoints(partitions: dict[str, str]) -> dict[int, str]:
    """What the query has read, as checkpoint_consumer takes it: the last SN read (for
    "@sn" the SN below it, so that record stays protected), or SHARD_END."""
    out: dict[int, str] = {}
    for key, position in partitions.items():
        kind, sn = parse(position)
        if kind == "end":
            out[int(key)] = "SHARD_END"
        elif kind == "at":
            out[int(key)] = str(sn - 1)
        elif sn:
            out[int(key)] = str(sn)
    return out


def advance(start: dict[str, str], info: StreamInfo, marks: dict[int, int],
            endings: dict[int, int]) -> tuple[dict[str, str], list[str]]:
    """The positions every partition can be read to now: (end, lost).

    `marks`: the commit watermark of each open partition; `endings`: ending SNs seen for
    closed partitions so far (a partition retention dropped after the query read it to
    its end is not a loss). `lost`: a description of each partition that vanished from
    the map before the query read it to its end (retention dropped it); it goes to END."""
    by = {p.ordinal: p for p in info.partitions}
    for p in info.partitions:
        if p.state is PartitionState.CLOSED:
            endings[p.ordinal] = p.ending_sn or 0
    end = dict(start)
    lost: list[str] = []
    for key, position in start.items():
        if position == END:
            continue
        ordinal = int(key)
        kind, sn = parse(position)
        p = by.get(ordinal)
        if p is None or p.state is PartitionState.CLOSED:
            ending = endings.get(ordinal)
            if ending is None:
                lost.append(f"partition p{ordinal:04d} left the stream (retention dropped it) before the query "
                            f"read it to its end; it had read up to {position}")
                end[key] = END
            elif kind == "after" and sn >= ending or kind == "at" and sn > ending or not ending:
                end[key] = END
            else:
                end[key] = after(ending)
        elif ordinal in marks:
            mark = marks[ordinal]
            if kind == "after" and mark > sn or kind == "at" and mark >= sn:
                end[key] = after(mark)
    # a child joins once every parent was at END when this batch started (a parent no
    # longer in the map counts as read): parents are read to their end before children
    done = {int(k) for k, v in start.items() if v == END}
    for p in info.partitions:
        if str(p.ordinal) in end or not any(str(q) in start for q in p.parents):
            continue
        if all(q in done or q not in by for q in p.parents):
            end[str(p.ordinal)] = NONE_READ
    return end, lost


def allocate(budget: int, backlogs: dict[str, int]) -> dict[str, int]:
    """At most `budget` records shared among partitions in proportion to their backlogs
    (largest remainders get the rest), as Kafka's maxOffsetsPerTrigger does."""
    total = sum(backlogs.values())
    if total <= budget:
        return dict(backlogs)
    shares = {k: budget * n // total for k, n in backlogs.items()}
    rest = budget - sum(shares.values())
    by_remainder = sorted(backlogs, key=lambda k: (-(budget * backlogs[k] % total), int(k)))
    for k in by_remainder[:rest]:
        shares[k] += 1
    return shares


def descendants(info: StreamInfo, ordinals) -> set[int]:
    """The partitions after `ordinals` in the lineage (children, their children...)."""
    by = {p.ordinal: p for p in info.partitions}
    out: set[int] = set()
    todo = [c for o in ordinals if o in by for c in by[o].children]
    while todo:
        o = todo.pop()
        if o in out or o not in by:
            continue
        out.add(o)
        todo.extend(by[o].children)
    return out


def ancestors(info: StreamInfo, ordinal: int) -> set[int]:
    by = {p.ordinal: p for p in info.partitions}
    out: set[int] = set()
    todo = list(by[ordinal].parents) if ordinal in by else []
    while todo:
        o = todo.pop()
        if o in out or o not in by:
            continue
        out.add(o)
        todo.extend(by[o].parents)
    return out


def check_cut(info: StreamInfo, named: set[int]) -> None:
    """A startingPosition of SNs per partition must say where every partition starts:
    each is named, or comes before a named one in its lineage (not read), or after one
    (read from its first record, once its parents are read). A partition named with one
    of its ancestors is ambiguous. ValueError otherwise."""
    present = {p.ordinal for p in info.partitions}
    for o in sorted(named):
        if o not in present:
            raise OptionError(f"startingPosition names partition p{o:04d}, which the stream does not have "
                             f"(now: {', '.join(f'p{q:04d}' for q in sorted(present))})")
        both = ancestors(info, o) & named
        if both:
            raise OptionError(f"startingPosition names p{o:04d} and its ancestor p{min(both):04d}; name one "
                             f"position per lineage (a partition after a named one is read from its start)")
    after_named = descendants(info, named)
    before_named = set().union(*(ancestors(info, o) for o in named)) if named else set()
    missing = sorted(present - named - after_named - before_named)
    if missing:
        raise OptionError(f"startingPosition names no position for partition p{missing[0]:04d}, nor for a partition "
                         f"before or after it in its lineage: name it too (an SN, \"TRIM_HORIZON\" or \"LATEST\")")
