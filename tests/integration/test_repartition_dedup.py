"""De-duplication across a repartition (issue 5), through real processes.

A producer's session is (producer id, partition). When a partition P is split or merged,
the producer's records of P that may be stored in P go, still in their session with P,
to the child that now covers each one's hash. A request names each record's session
partition, either per request (`PutRecordsRequest.session_ordinals`, 4 bytes
little-endian per record: what `sms/producer.py` sends) or in the entry's meta
(`wire.TAG_SESSION_ORDINAL`, 4 bytes big-endian); the HWM map is keyed by P. A record
that names neither is in the session with the partition it routes to now. A child's
dedup table is seeded with its ancestors' records of the dedup window, so:

- a retry of a record that P committed (its ack lost) is answered duplicate with P's SN
  and not stored again, wherever it lands: in the child, or at P's old owner;
- while P is sealed, its head answers PartitionClosed and stores nothing;
- a record P never stored is stored once in the child, and its retries are duplicates
  of the child's SN;
- an un-tagged record in the child is the producer's new session with the child, not
  confused with its session with P;
- a bad session partition fails the request (InvalidArgument) and stores nothing.

The high-level Producer keeps every record exactly once, per key in order, across a
split under way, and a hot partition is split automatically when the stream asks for it.

The wire is spoken directly (explicit producer id, SSSNs, submit times, HWMs, session
partitions), and every answer is checked against the stream read back (`read_stream`,
which walks the lineage).
"""

from __future__ import annotations

import collections
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import grpc
import pytest

import sms
from sms import wire, errors, hashing, limits, metadata, rpc, seqno
from node.launcher import LocalCluster
from sms.proto import sms_pb2
from sms.types import PartitionState, Record, StreamInfo
from tests.conftest import wait_until
from tests.integration.session_wire import Ack, Answer, Channels, Submit, encode, now_ms

pytestmark = pytest.mark.integration

A = b"producer-a"
HALF = 2 ** 127                 # the default split point of a 1-partition stream
SETTLE_TIMEOUT_S = 60           # a child answers (chain up, table rebuilt) by then
NODE_MAP_TIMEOUT_S = 20         # a node's cached map shows a committed repartition by then
SEAL_TIMEOUT_S = 10             # a requested split seals its parent by then
AUTO_SPLIT_TIMEOUT_S = 30       # the deadline for an automatic split under load
NO_SPLIT_OBSERVE_S = 5          # how long the load runs with the policy off (asserts absence)
AUTO_SPLIT_RATE = 50            # the threshold (records/s) of the automatic split tests
LOAD_RATE_MIN = 2 * AUTO_SPLIT_RATE   # the load must be well above it (a few hundred/s when idle)
_ORDINAL = struct.Struct("<I")

# How a record names its session partition on the wire.
META_TAG = "meta_tag"                   # wire.TAG_SESSION_ORDINAL in the entry
REQUEST_FIELD = "session_ordinals"      # PutRecordsRequest.session_ordinals


# --- the wire --------------------------------------------------------------------------------

def entry(s: Submit, *, tag: int | None = None, raw_tag: bytes | None = None) -> bytes:
    """The wire entry of a session record; `tag` names its session partition in the meta
    (4 bytes big-endian), `raw_tag` puts those bytes there instead (bad input)."""
    fields = {wire.TAG_SSSN: s.sssn.to_bytes(8, "big"), wire.TAG_SUBMIT_MS: s.submit_ms.to_bytes(8, "big")}
    if raw_tag is not None:
        fields[wire.TAG_SESSION_ORDINAL] = raw_tag
    elif tag is not None:
        fields[wire.TAG_SESSION_ORDINAL] = tag.to_bytes(4, "big")
    return encode(s, fields=fields)


def put(channels: Channels, address: str, stream: str, producer_id: bytes, entries: Sequence[bytes],
        hwm: Mapping[int, int] | None = None, session_ordinals: Sequence[int] | bytes | None = None) -> Answer:
    """One PutRecords to `address`, answered per record; `session_ordinals` is a list (one
    per record) or raw bytes (bad input). A whole-request error is raised as its SmsError."""
    if session_ordinals is None:
        raw = b""
    elif isinstance(session_ordinals, bytes):
        raw = session_ordinals
    else:
        raw = b"".join(_ORDINAL.pack(o) for o in session_ordinals)
    request = sms_pb2.PutRecordsRequest(stream=stream, count=len(entries), entries=b"".join(entries),
                                        producer_id=producer_id, hwm=dict(hwm or {}), session_ordinals=raw)
    try:
        resp = channels.stub(address).PutRecords(request, timeout=limits.PUT_TIMEOUT_S)
    except grpc.RpcError as e:
        raise rpc.to_sms_error(e) from None
    assert len(resp.sequence_numbers) == 16 * len(entries) and len(resp.ordinals) == 4 * len(entries), resp
    failed = {e.index: e for e in resp.errors}
    duplicates = set(resp.duplicates)
    assert not duplicates & failed.keys(), f"records {duplicates & failed.keys()} both duplicate and failed"
    acks = []
    for i in range(len(entries)):
        err = failed.get(i)
        acks.append(Ack(sn=seqno.from_bytes(resp.sequence_numbers[16 * i:16 * i + 16]), duplicate=i in duplicates,
                        error_name=err.name if err else "", error_message=err.message if err else "",
                        ordinal=_ORDINAL.unpack_from(resp.ordinals, 4 * i)[0]))
        if err is not None:
            assert acks[-1].sn == 0, f"record {i} failed with {err.name} yet carries SN {acks[-1].sn}"
    return Answer(tuple(acks), {m.ordinal: tuple(m.sssns) for m in resp.missing})


def in_session(channels: Channels, address: str, stream: str, records: Sequence[Submit], session: int | None,
               form: str, hwm: Mapping[int, int] | None = None) -> Answer:
    """Send `records` of producer A's session with partition `session` (None: no session
    partition named) to `address`, naming it the way `form` says."""
    if session is None:
        return put(channels, address, stream, A, [entry(r) for r in records], hwm)
    if form == META_TAG:
        return put(channels, address, stream, A, [entry(r, tag=session) for r in records], hwm)
    assert form == REQUEST_FIELD, form
    return put(channels, address, stream, A, [entry(r) for r in records], hwm, [session] * len(records))


# --- helpers ---------------------------------------------------------------------------------

def key_in(lo: int, hi: int, prefix: str) -> str:
    """A partition key (starting with `prefix`) whose hash is in [lo, hi)."""
    for i in range(100_000):
        key = f"{prefix}-{i}"
        if lo <= hashing.hash_key_of(key) < hi:
            return key
    raise AssertionError(f"no key with prefix {prefix!r} hashes into [{lo}, {hi})")


def owner_of(info: StreamInfo, ordinal: int) -> str:
    owner = info.partition(ordinal).ingestion_owner
    assert owner is not None and owner.address, f"p{ordinal} has no ingestion owner: {info.partition(ordinal)}"
    return owner.address


def child_of(info: StreamInfo, key: str) -> int:
    return info.open_partition_for_hash(hashing.hash_key_of(key)).ordinal


def settle(client, stream: str, send: Callable[[StreamInfo], Answer], what: str,
           timeout_s: float = SETTLE_TIMEOUT_S) -> Answer:
    """Send the same request (built by `send` from a fresh map) until no record of it is
    answered with a retriable error (a child's chain may still be starting, its table
    rebuilding); whole-request retriable errors are retried too. The last answer."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            answer = send(client.get_stream_info(stream))
            if not answer.retriable:
                return answer
            last = [(a.error_name, a.error_message) for a in answer.acks if a.retriable][:3]
        except errors.SmsError as e:
            if not e.retriable:
                raise
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still answered retriable after {timeout_s}s: {last}")
        time.sleep(0.05)


def assert_acked(answer: Answer, *, duplicate: bool) -> None:
    bad = [(i, a.error_name, a.error_message) for i, a in enumerate(answer.acks) if not a.ok or a.sn == 0]
    assert not bad, f"records not acknowledged with an SN: {bad}"
    flags = [a.duplicate for a in answer.acks]
    assert flags == [duplicate] * len(flags), f"duplicate flags {flags}; expected all {duplicate}"


def read_all(client, stream: str) -> list[Record]:
    return list(client.read_stream(stream))


def copies(records: Sequence[Record], s: Submit) -> list[tuple[int, int, int | None]]:
    """(SN, partition, stored session partition) of every stored copy of `s`."""
    return [(r.sn, r.partition_ordinal, session_ordinal_of(r)) for r in records
            if r.partition_key == s.key and r.data == s.data]


def session_ordinal_of(record: Record) -> int | None:
    meta = wire.decode_meta(record.meta) if record.meta else {}
    raw = meta.get(wire.TAG_SESSION_ORDINAL)
    return None if raw is None else int.from_bytes(raw, "big")


def described(records: Sequence[Record]) -> list:
    return [(r.partition_key, r.data, r.sn, r.partition_ordinal) for r in records]


def wait_node_map(address: str, stream: str, version: int) -> None:
    """Wait until the node at `address` routes by map version >= `version` (it answers
    DescribeStream from the same cached view PutRecords routes by)."""
    with sms.Client(address) as node:
        wait_until(lambda: node.get_stream_info(stream).map_version >= version, NODE_MAP_TIMEOUT_S,
                   f"node {address} to see map version {version} of {stream}")


def split_in_half(client, stream: str) -> StreamInfo:
    info = client.split(stream, 0)
    parent = info.partition(0)
    assert parent.state is PartitionState.CLOSED and len(parent.children) == 2, parent
    lo, hi = (info.partition(o) for o in parent.children)
    assert (lo.hash_lo, lo.hash_hi, hi.hash_lo, hi.hash_hi) == (0, HALF, HALF, 2 * HALF), (lo, hi)
    return info


def assert_not_stored_again(answer: Ack, original_sn: int, where: str) -> None:
    """A resend of a record stored under `original_sn` either learns that SN (duplicate)
    or is refused with a "refresh your map" error; it never gets an SN of its own."""
    if answer.ok:
        assert answer.duplicate and answer.sn == original_sn, \
            f"{where}: resend acked {answer}, not as a duplicate of SN {original_sn}"
    else:
        assert answer.error_name in ("PartitionClosed", "WrongOwner"), f"{where}: resend answered {answer}"


@pytest.fixture
def channels() -> Iterator[Channels]:
    c = Channels()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def single_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sms.Client]:
    """A client of a dedicated 1-node cluster: every chain's head (and so every partition's
    ingestion owner) is that node, so P's old owner always heads its children too."""
    local = LocalCluster(str(tmp_path_factory.mktemp("single-node")), nodes=1, port=0)
    local.start()
    try:
        c = sms.Client(local.address)
        try:
            yield c
        finally:
            c.close()
    finally:
        local.stop()


# --- 1. a retry of a record the parent committed ------------------------------------------------

SAFE_PAUSE_S = 2.0      # a node paused so long keeps its session (TTL 3 s, heartbeat 0.5 s)
SEALED_WINDOW_ATTEMPTS = 3


def _sealed_window(local: LocalCluster, client, channels: Channels, stream: str) -> dict | None:
    """Producer A's SSSN 0 in flight in p0 (its tail paused, so uncommitted) while p0 is
    split; while p0 is sealed, SSSN 0 resent and SSSN 1 sent for the first time; then the
    tail resumed. What happened, or None when the precondition did not hold: the tail was
    paused too long (past SAFE_PAUSE_S; its session may have expired, its chain changed)."""
    client.create_stream(stream, partitions=1, replication_factor=3)
    p0 = client.get_stream_info(stream).partition(0)
    head, tail = p0.chain[0], p0.chain[-1]
    lost = Submit(0, key_in(0, HALF, "lost"), b"in flight at the seal", now_ms())
    late = Submit(1, key_in(HALF, 2 * HALF, "late"), b"first sent to the sealed head", now_ms())
    first: dict[str, object] = {}
    split: dict[str, object] = {}

    def write() -> None:
        try:
            first["answer"] = put(channels, head.address, stream, A, [entry(lost)])
        except BaseException as e:
            first["error"] = e

    def do_split() -> None:
        try:
            split["info"] = client.split(stream, 0)
        except BaseException as e:
            split["error"] = e

    def in_flight() -> bool:
        return any(r["chain_id"] == metadata.chain_id(stream, 0) and int(r["last_sn"]) > int(r["committed_sn"])
                   for r in client.node_status(head.address)["replicas"])

    writer, splitter = threading.Thread(target=write), threading.Thread(target=do_split)
    with sms.Client(head.address) as at_head:        # DescribeStream from the head's own view
        local.signal(tail.node_id, signal.SIGSTOP)
        paused_at = time.monotonic()
        try:
            writer.start()
            wait_until(in_flight, 10, "SSSN 0 to be held uncommitted by p0's head")
            splitter.start()
            wait_until(lambda: at_head.get_stream_info(stream).partition(0).sealed, SEAL_TIMEOUT_S,
                       "p0 sealed in its head's view")
            during = put(channels, head.address, stream, A, [entry(lost), entry(late)], {0: -1})
            paused_s = time.monotonic() - paused_at
        finally:
            local.signal(tail.node_id, signal.SIGCONT)
    writer.join(60)
    splitter.join(limits.REPARTITION_WAIT_S + 30)
    assert not writer.is_alive() and not splitter.is_alive()
    if paused_s > SAFE_PAUSE_S or isinstance(split.get("error"), errors.NotEnoughNodes):
        print(f"{stream}: tail paused {paused_s:.2f}s (split: {split}); attempt void")
        return None
    assert "error" not in first and "error" not in split, (first, split)
    print(f"{stream}: tail paused {paused_s:.2f}s")
    return {"lost": lost, "late": late, "head": head, "during": during, "original": first["answer"].acks[0],
            "info": split["info"]}


def test_retry_whose_ack_was_lost_before_the_seal_is_stored_once(make_cluster, channels):
    """The issue's test, deterministic: producer A's SSSN 0 is in flight in p0 (its tail is
    paused, so it is not committed) when p0 is split; the ack of that write is never seen.

    While p0 is sealed, the producer resends SSSN 0, and sends SSSN 1 for the first time:
    p0's head answers both PartitionClosed and stores nothing. The split commits once SSSN 0
    does. Then (a) SSSN 0 resent to p0's old owner, in its session with p0, is not stored
    again; (b) SSSN 0 resent to the child covering it is a duplicate with p0's SN; SSSN 1,
    which p0 never stored, is stored once in its child, and its retry is a duplicate of
    that child SN. The stream holds each exactly once.

    The window needs the tail paused for less than a session; on a machine so loaded that
    it is not, the attempt is void and repeated on a new stream once the node is back."""
    local = make_cluster()
    with sms.Client(local.address) as client:
        for attempt in range(SEALED_WINDOW_ATTEMPTS):
            stream = f"sealed-window-{attempt}-{now_ms()}"
            seen = _sealed_window(local, client, channels, stream)
            if seen is not None:
                break
            wait_until(lambda: sum("storage" in n.roles for n in client.describe_cluster().nodes) == 3, 60,
                       "the paused node to be registered again")
        else:
            pytest.fail(f"the tail stayed paused longer than {SAFE_PAUSE_S}s in {SEALED_WINDOW_ATTEMPTS} attempts")
        lost, late, head, original, info = seen["lost"], seen["late"], seen["head"], seen["original"], seen["info"]
        assert [(a.error_name, a.sn) for a in seen["during"].acks] == [("PartitionClosed", 0)] * 2, \
            f"sealed p0's head answered {seen['during'].acks}"
        assert original.ok and not original.duplicate and original.ordinal == 0, original   # the lost ack

        assert info.partition(0).state is PartitionState.CLOSED and len(info.partition(0).children) == 2
        wait_node_map(head.address, stream, info.map_version)
        at_old_owner = in_session(channels, head.address, stream, [lost], 0, REQUEST_FIELD, {0: -1})
        assert_not_stored_again(at_old_owner.acks[0], original.sn, "p0's old owner")

        for form in (REQUEST_FIELD, META_TAG):
            retry = settle(client, stream, lambda i, form=form: in_session(
                channels, owner_of(i, child_of(i, lost.key)), stream, [lost], 0, form, {0: -1}), "retry of SSSN 0")
            assert_acked(retry, duplicate=True)
            assert (retry.acks[0].sn, retry.acks[0].ordinal) == (original.sn, 0), \
                f"{form}: retry of SSSN 0 acked {retry.acks[0]}, not p0's SN {original.sn}"

        late_child = child_of(info, late.key)
        stored_late = settle(client, stream, lambda i: in_session(
            channels, owner_of(i, late_child), stream, [late], 0, REQUEST_FIELD, {0: -1}), "SSSN 1 in the child")
        assert_acked(stored_late, duplicate=False)
        late_sn = stored_late.acks[0].sn
        assert stored_late.acks[0].ordinal == late_child and seqno.ordinal_of(late_sn) == late_child, stored_late
        for form in (META_TAG, REQUEST_FIELD):
            retry = settle(client, stream, lambda i, form=form: in_session(
                channels, owner_of(i, late_child), stream, [late], 0, form, {0: -1}), "retry of SSSN 1")
            assert_acked(retry, duplicate=True)
            assert retry.acks[0].sn == late_sn, f"{form}: retry of SSSN 1 acked {retry.acks[0]}, not {late_sn}"

        stored = read_all(client, stream)
        assert copies(stored, lost) == [(original.sn, 0, None)], described(stored)
        assert copies(stored, late) == [(late_sn, late_child, 0)], described(stored)
        assert len(stored) == 2, described(stored)
        assert not local.exited(), local.exited()


@pytest.mark.parametrize("form", [REQUEST_FIELD, META_TAG])
def test_retry_of_record_committed_before_split_is_duplicate_in_child_and_stored_once(
        client, unique_stream, channels, form):
    """SSSNs 0 and 1 (one key per future child) are committed in p0, acks lost; p0 is
    split. Resent to p0's old owner in their session with p0, they are not stored again;
    resent to the child covering each, they are duplicates with p0's original SNs (twice:
    a retry of the retry). The stream holds each once, in p0."""
    client.create_stream(unique_stream, partitions=1, replication_factor=3)
    info = client.get_stream_info(unique_stream)
    old_owner = owner_of(info, 0)
    batch = [Submit(0, key_in(0, HALF, "lo"), b"lost ack lo", now_ms()),
             Submit(1, key_in(HALF, 2 * HALF, "hi"), b"lost ack hi", now_ms())]
    first = put(channels, old_owner, unique_stream, A, [entry(r) for r in batch])
    assert_acked(first, duplicate=False)
    assert [a.ordinal for a in first.acks] == [0, 0]

    info = split_in_half(client, unique_stream)
    wait_node_map(old_owner, unique_stream, info.map_version)
    at_old_owner = in_session(channels, old_owner, unique_stream, batch, 0, form, {0: -1})
    for a, original in zip(at_old_owner.acks, first.acks):
        assert_not_stored_again(a, original.sn, "p0's old owner")
    for r, original in zip(batch, first.acks):
        child = child_of(info, r.key)
        assert child in info.partition(0).children
        for attempt in range(2):
            retry = settle(client, unique_stream, lambda i, r=r, child=child: in_session(
                channels, owner_of(i, child), unique_stream, [r], 0, form, {0: -1}),
                f"retry of SSSN {r.sssn} in p{child}")
            assert_acked(retry, duplicate=True)
            assert (retry.acks[0].sn, retry.acks[0].ordinal) == (original.sn, 0), \
                f"attempt {attempt}: retry in p{child} acked {retry.acks[0]}, not p0's SN {original.sn}"
            assert retry.missing == {}

    stored = read_all(client, unique_stream)
    for r, original in zip(batch, first.acks):
        assert copies(stored, r) == [(original.sn, 0, None)], f"SSSN {r.sssn}: {described(stored)}"
    assert len(stored) == 2, described(stored)


def test_retries_of_records_committed_in_merged_parents_are_duplicates_in_merge_child_and_stored_once(
        client, unique_stream, channels):
    """Merge variant: producer A's sessions with p0 and p1 both hold an SSSN 0 (different
    data), committed, acks lost; p0 and p1 are merged into p2; each is resent to p2 in its
    own parent's session (one by the request field, one by the meta tag, then both in one
    request). Each is a duplicate of its own parent's SN: the child's table does not
    confuse the two parent sessions. Each is stored once."""
    client.create_stream(unique_stream, partitions=2, replication_factor=3)
    info = client.get_stream_info(unique_stream)
    in_p0 = Submit(0, key_in(0, HALF, "m0"), b"sssn 0 of p0", now_ms())
    in_p1 = Submit(0, key_in(HALF, 2 * HALF, "m1"), b"sssn 0 of p1", now_ms())
    first0 = put(channels, owner_of(info, 0), unique_stream, A, [entry(in_p0)])
    first1 = put(channels, owner_of(info, 1), unique_stream, A, [entry(in_p1)])
    assert_acked(first0, duplicate=False)
    assert_acked(first1, duplicate=False)
    sn0, sn1 = first0.acks[0].sn, first1.acks[0].sn
    assert (first0.acks[0].ordinal, first1.acks[0].ordinal) == (0, 1)

    info = client.merge(unique_stream, 0, 1)
    p0, p1 = info.partition(0), info.partition(1)
    assert p0.state is PartitionState.CLOSED and p1.state is PartitionState.CLOSED, (p0, p1)
    assert p0.children == p1.children and len(p0.children) == 1, (p0, p1)
    child = p0.children[0]
    assert info.partition(child).parents == (0, 1)

    for parent, r, sn, form in ((0, in_p0, sn0, REQUEST_FIELD), (1, in_p1, sn1, META_TAG)):
        retry = settle(client, unique_stream, lambda i, parent=parent, r=r, form=form: in_session(
            channels, owner_of(i, child), unique_stream, [r], parent, form, {parent: -1}),
            f"retry of p{parent}'s SSSN 0 in p{child}")
        assert_acked(retry, duplicate=True)
        assert (retry.acks[0].sn, retry.acks[0].ordinal) == (sn, parent), \
            f"p{parent}'s SSSN 0 retried in p{child}: acked {retry.acks[0]}, expected p{parent}'s SN {sn}"
    both = settle(client, unique_stream, lambda i: put(
        channels, owner_of(i, child), unique_stream, A, [entry(in_p1), entry(in_p0)], {0: -1, 1: -1}, [1, 0]),
        f"both retries in p{child}")
    assert_acked(both, duplicate=True)
    assert [a.sn for a in both.acks] == [sn1, sn0], both

    stored = read_all(client, unique_stream)
    assert copies(stored, in_p0) == [(sn0, 0, None)], described(stored)
    assert copies(stored, in_p1) == [(sn1, 1, None)], described(stored)
    assert len(stored) == 2, described(stored)


@pytest.mark.parametrize("op", ["split", "merge"])
def test_resend_in_parent_session_to_old_owner_heading_the_child_is_a_duplicate(single_node, channels, op):
    """P's old owner also heads the child covering the record (always so on one node): a
    resend in the session with the closed P, routed there by a producer whose map is
    stale, is answered from the child's table as a duplicate with P's SN; not stored."""
    client = single_node
    stream = f"old-owner-{op}-{now_ms()}"
    client.create_stream(stream, partitions=1 if op == "split" else 2, replication_factor=1)
    info = client.get_stream_info(stream)
    old_owner = owner_of(info, 0)
    record = Submit(0, key_in(0, HALF, "k"), b"committed before the repartition", now_ms())
    first = put(channels, old_owner, stream, A, [entry(record)])
    assert_acked(first, duplicate=False)
    info = client.split(stream, 0) if op == "split" else client.merge(stream, 0, 1)
    assert info.partition(0).state is PartitionState.CLOSED
    wait_node_map(old_owner, stream, info.map_version)
    resend = settle(client, stream, lambda i: in_session(channels, old_owner, stream, [record], 0, REQUEST_FIELD,
                                                         {0: -1}), "resend to the old owner")
    assert_acked(resend, duplicate=True)
    assert (resend.acks[0].sn, resend.acks[0].ordinal) == (first.acks[0].sn, 0), resend
    stored = read_all(client, stream)
    assert copies(stored, record) == [(first.acks[0].sn, 0, None)], described(stored)
    assert len(stored) == 1, described(stored)


# --- 2. a record the parent never stored ---------------------------------------------------

def test_record_of_parent_session_never_stored_in_parent_is_stored_once_in_child(client, unique_stream, channels):
    """SSSN 0 of A's session with p0 is committed and acked (HWM 0). SSSNs 1 and 2 are first
    sent after p0 was split: each goes to the child covering its hash, in the session with
    p0. Each is written in its child (a child SN; the session partition is stored with
    it), and a retry (in the other wire form) is a duplicate of that SN. A child that
    never saw its sibling's SSSN does not report it missing."""
    client.create_stream(unique_stream, partitions=1, replication_factor=3)
    info = client.get_stream_info(unique_stream)
    r0 = Submit(0, key_in(0, HALF, "n0"), b"sssn 0 in p0", now_ms())
    first = put(channels, owner_of(info, 0), unique_stream, A, [entry(r0)])
    assert_acked(first, duplicate=False)

    info = split_in_half(client, unique_stream)
    lo, hi = info.partition(0).children
    later = [(Submit(2, key_in(HALF, 2 * HALF, "n2"), b"sssn 2, never in p0", now_ms()), hi, REQUEST_FIELD),
             (Submit(1, key_in(0, HALF, "n1"), b"sssn 1, never in p0", now_ms()), lo, META_TAG)]
    written: dict[int, int] = {}
    for r, child, form in later:
        answer = settle(client, unique_stream, lambda i, r=r, child=child, form=form: in_session(
            channels, owner_of(i, child), unique_stream, [r], 0, form, {0: 0}), f"SSSN {r.sssn} in p{child}")
        assert_acked(answer, duplicate=False)
        assert answer.acks[0].ordinal == child and seqno.ordinal_of(answer.acks[0].sn) == child, answer
        assert answer.missing == {}, f"p{child} reported {answer.missing} missing for p0's session"
        written[r.sssn] = answer.acks[0].sn
    for r, child, form in later:
        other = META_TAG if form == REQUEST_FIELD else REQUEST_FIELD
        retry = settle(client, unique_stream, lambda i, r=r, child=child, other=other: in_session(
            channels, owner_of(i, child), unique_stream, [r], 0, other, {0: 0}), f"retry of SSSN {r.sssn}")
        assert_acked(retry, duplicate=True)
        assert retry.acks[0].sn == written[r.sssn], \
            f"retry of SSSN {r.sssn} acked {retry.acks[0].sn}, not the child's SN {written[r.sssn]}"

    stored = read_all(client, unique_stream)
    assert copies(stored, r0) == [(first.acks[0].sn, 0, None)], described(stored)
    for r, child, _form in later:
        assert copies(stored, r) == [(written[r.sssn], child, 0)], \
            f"SSSN {r.sssn}: expected once in p{child} with session partition p0; {described(stored)}"
    assert len(stored) == 3, described(stored)


# --- 3. sessions are per partition ---------------------------------------------------------

@pytest.mark.parametrize("naming", ["unnamed", "named_child"])
def test_record_in_child_session_is_not_confused_with_parents_session(client, unique_stream, channels, naming):
    """A's session with p0 holds SSSN 0 (key k). After the split, A sends SSSN 0 with the
    same key k and other data to the child covering k, not tagged (or naming the child
    itself as its session partition): it is A's session with the child, so it is stored
    (no SessionConflict with p0's SSSN 0). Retries of each are duplicates of their own SN."""
    client.create_stream(unique_stream, partitions=1, replication_factor=3)
    info = client.get_stream_info(unique_stream)
    key = key_in(HALF, 2 * HALF, "same")
    parents = Submit(0, key, b"sssn 0 of the session with p0", now_ms())
    first = put(channels, owner_of(info, 0), unique_stream, A, [entry(parents)])
    assert_acked(first, duplicate=False)

    info = split_in_half(client, unique_stream)
    child = child_of(info, key)
    childs = Submit(0, key, b"sssn 0 of the session with the child", now_ms())
    session = None if naming == "unnamed" else child
    new = settle(client, unique_stream, lambda i: in_session(
        channels, owner_of(i, child), unique_stream, [childs], session, REQUEST_FIELD, {child: -1}),
        "child's SSSN 0")
    assert_acked(new, duplicate=False)
    assert new.acks[0].ordinal == child and seqno.ordinal_of(new.acks[0].sn) == child, new

    both = settle(client, unique_stream, lambda i: put(
        channels, owner_of(i, child), unique_stream, A, [entry(parents), entry(childs)], {0: -1, child: -1},
        [0, child]), "retries of both SSSN 0")
    assert_acked(both, duplicate=True)
    assert [(a.sn, a.ordinal) for a in both.acks] == [(first.acks[0].sn, 0), (new.acks[0].sn, child)], both

    stored = read_all(client, unique_stream)
    assert copies(stored, parents) == [(first.acks[0].sn, 0, None)], described(stored)
    assert copies(stored, childs) == [(new.acks[0].sn, child, None)], described(stored)
    assert len(stored) == 2, described(stored)


# --- 4. bad session partitions --------------------------------------------------------------

def test_bad_session_partitions_are_invalid_argument_and_store_nothing(client, unique_stream, channels):
    """A session partition whose hash range does not cover the record's key fails the
    whole request (a well-formed record in it is not stored either), whether named by the
    meta tag or the request field; so does a meta tag that is not 4 bytes, a request field
    that is not 4 bytes per record, and either without a producer session. Afterwards
    the session works."""
    client.create_stream(unique_stream, partitions=1, replication_factor=3)
    info = client.get_stream_info(unique_stream)
    in_p0 = Submit(0, key_in(0, HALF, "p0"), b"committed in p0", now_ms())
    assert_acked(put(channels, owner_of(info, 0), unique_stream, A, [entry(in_p0)]), duplicate=False)
    info = split_in_half(client, unique_stream)
    lo, hi = info.partition(0).children
    hi_key = key_in(HALF, 2 * HALF, "hi")
    good = Submit(0, hi_key, b"a well-formed record", now_ms())
    bad = Submit(1, hi_key, b"in a session whose partition does not cover its key", now_ms())
    no_session = wire.encode_entry(bad.key.encode(), bad.data, b"")

    cases: dict[str, tuple[bytes, list[bytes], Mapping[int, int], object]] = {
        # what: (producer id, entries, HWM, session_ordinals)
        "meta tag: sibling does not cover the key": (A, [entry(good), entry(bad, tag=lo)], {hi: -1, lo: -1}, None),
        "meta tag: sibling, alone": (A, [entry(bad, tag=lo)], {lo: -1}, None),
        "request field: sibling does not cover the key": (A, [entry(good), entry(bad)], {hi: -1, lo: -1}, [hi, lo]),
        "meta tag of 3 bytes": (A, [entry(good), entry(bad, raw_tag=b"\x00\x00\x00")], {hi: -1}, None),
        "meta tag of 5 bytes": (A, [entry(bad, raw_tag=b"\x00\x00\x00\x00\x00")], {0: -1}, None),
        "empty meta tag": (A, [entry(bad, raw_tag=b"")], {0: -1}, None),
        "meta tag without a producer session": (b"", [wire.encode_entry(bad.key.encode(), bad.data, wire.encode_meta(
            {wire.TAG_SESSION_ORDINAL: (0).to_bytes(4, "big")}))], {}, None),
        "request field of 4 bytes for 2 records": (A, [entry(good), entry(bad)], {0: -1}, _ORDINAL.pack(0)),
        "request field of 3 bytes": (A, [entry(bad)], {0: -1}, b"\x00\x00\x00"),
        "request field without a producer session": (b"", [no_session], {}, [0]),
    }
    for what, (producer_id, entries, hwm, session_ordinals) in cases.items():
        with pytest.raises(errors.InvalidArgument) as caught:
            settle(client, unique_stream, lambda i, p=producer_id, e=entries, h=hwm, so=session_ordinals: put(
                channels, owner_of(i, hi), unique_stream, p, e, h, so), what)
        print(f"{what}: {caught.value.message}")

    ok = put(channels, owner_of(info, hi), unique_stream, A, [entry(good)], {hi: -1})
    assert_acked(ok, duplicate=False)
    stored = read_all(client, unique_stream)
    assert sorted((x.partition_key, x.data) for x in stored) == sorted(
        [(in_p0.key, in_p0.data), (good.key, good.data)]), f"rejected requests stored something: {described(stored)}"
    assert copies(stored, good) == [(ok.acks[0].sn, hi, None)]


# --- 5. the Producer across a split ----------------------------------------------------------

def test_producer_across_a_split_under_way_stores_every_record_once(client, unique_stream):
    """Producer "p1" sends records on a few keys; p0 is split while it sends (records in
    flight are refused by the sealed head and resent to the children); after a flush every
    future has a result, and the stream holds each (key, data) exactly once, each key's
    records in the order they were sent."""
    client.create_stream(unique_stream, partitions=1, replication_factor=3)
    keys = [f"key-{i}" for i in range(6)]
    assert {hashing.hash_key_of(k) < HALF for k in keys} == {True, False}, "keys on both sides of the split"
    before, after = 300, 900
    sent: list[tuple[str, bytes, object]] = []
    split_done = threading.Event()
    split_error: list[BaseException] = []

    def do_split() -> None:
        try:
            client.split(unique_stream, 0)
        except BaseException as e:      # reported by the test thread
            split_error.append(e)
        finally:
            split_done.set()

    producer = client.producer(unique_stream, "p1")
    splitter = threading.Thread(target=do_split, name="splitter")
    try:
        for n in range(before + after):
            key = keys[n % len(keys)]
            data = f"{key} #{n}".encode()
            sent.append((key, data, producer.send(data, key)))
            if n == before:
                wait_until(lambda: sum(f.done() for _k, _d, f in sent) >= before // 2, 30,
                           "the first records to be acked before the split")
                splitter.start()
            if n == before + after // 3:
                # keep sending while the split goes on, but let it end before the last two thirds
                wait_until(split_done.is_set, limits.REPARTITION_WAIT_S + 30, "the split to end")
        producer.flush()
        results = [(k, d, f.result(timeout=0)) for k, d, f in sent]
        stats = producer.statistics()
    finally:
        producer.close()
        splitter.join(timeout=limits.REPARTITION_WAIT_S + 30)
    assert not split_error, f"split failed: {split_error[0]!r}"
    print(f"producer statistics: {stats}")

    info = client.get_stream_info(unique_stream)
    assert info.partition(0).state is PartitionState.CLOSED and len(info.partition(0).children) == 2
    landed = {r.partition_ordinal for _k, _d, r in results}
    assert 0 in landed and landed & set(info.partition(0).children), f"records landed in {landed}"

    stored = read_all(client, unique_stream)
    counts = collections.Counter((x.partition_key, x.data) for x in stored)
    twice = {k: n for k, n in counts.items() if n > 1}
    assert not twice, f"{len(twice)} records stored more than once: {sorted(twice.items())[:5]}"
    expected = {(k, d) for k, d, _f in sent}
    assert counts.keys() == expected, (f"missing {sorted(expected - counts.keys())[:5]}, "
                                       f"unexpected {sorted(counts.keys() - expected)[:5]}")
    by_sn = {x.sn: x for x in stored}
    for k, d, r in results:
        if r.sn is not None:
            assert r.sn in by_sn and (by_sn[r.sn].partition_key, by_sn[r.sn].data) == (k, d), \
                f"{d!r} acked with SN {r.sn}, which holds {by_sn.get(r.sn)}"
    for key in keys:
        order = [x.data for x in stored if x.partition_key == key]
        assert order == [d for k, d, _f in sent if k == key], f"{key}: stored out of send order"


def test_producer_with_a_stale_map_keeps_delivering_when_the_old_owner_heads_the_children(single_node):
    """Regression: after a split, a producer whose map is stale sends p0's records to p0's
    old owner, which (on one node) heads both children and so never answers WrongOwner.
    The records must still land in the producer's session with p0 (whose HWM the producer
    sends and which is pruned by it), not in sessions with the children that nothing
    prunes: well over a session's bound of un-pruned entries all get delivered, once."""
    client = single_node
    stream = f"producer-old-owner-{now_ms()}"
    client.create_stream(stream, partitions=1, replication_factor=1)
    keys = [f"key-{i}" for i in range(6)]
    assert {hashing.hash_key_of(k) < HALF for k in keys} == {True, False}, "keys on both sides of the split"
    after = 2 * limits.DEDUP_ENTRIES_PER_SESSION_MAX + 400     # > the bound, whichever child gets most
    sent: list[tuple[str, bytes, object]] = []
    with client.producer(stream, "p1", delivery_timeout_s=30) as producer:
        for n in range(300):
            data = f"before #{n}".encode()
            sent.append((keys[n % 6], data, producer.send(data, keys[n % 6])))
        producer.flush()
        old_owner = owner_of(client.get_stream_info(stream), 0)
        info = client.split(stream, 0)
        wait_node_map(old_owner, stream, info.map_version)
        for n in range(after):
            data = f"after #{n}".encode()
            sent.append((keys[n % 6], data, producer.send(data, keys[n % 6])))
        producer.flush()
        stats = producer.statistics()
    print(f"producer statistics: {stats}")
    failed = collections.Counter(type(f.exception()).__name__ for _k, _d, f in sent if f.exception() is not None)
    assert not failed, f"records failed: {dict(failed)} (producer statistics {stats})"
    counts = collections.Counter((x.partition_key, x.data) for x in read_all(client, stream))
    assert counts == collections.Counter((k, d) for k, d, _f in sent), "not every record stored exactly once"


# --- 6. automatic splitting -----------------------------------------------------------------

class SteadyWriter:
    """Writes `per_batch` records every `interval_s` with put_records on a thread until
    stopped (a few hundred records/s); keeps every record's result."""

    def __init__(self, client, stream: str, per_batch: int = 30, interval_s: float = 0.1):
        self.client, self.stream = client, stream
        self.per_batch, self.interval_s = per_batch, interval_s
        self.stop_event = threading.Event()
        self.results: list[tuple[str, bytes, object]] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"writer-{stream}")

    def _run(self) -> None:
        n = 0
        try:
            while not self.stop_event.is_set():
                t = time.monotonic()
                batch = [(f"key-{(n + i) % 16}", f"record {n + i}".encode()) for i in range(self.per_batch)]
                result = self.client.put_records(self.stream, batch)
                self.results.extend((k, d, r) for (k, d), r in zip(batch, result.records))
                n += self.per_batch
                self.stop_event.wait(max(0.0, self.interval_s - (time.monotonic() - t)))
        except BaseException as e:
            self.error = e

    def __enter__(self) -> "SteadyWriter":
        self.started = time.monotonic()
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "writer did not stop"
        self.elapsed = time.monotonic() - self.started

    def check(self) -> None:
        assert self.error is None, f"writer failed: {self.error!r}"
        failed = [(k, r.error_name, r.error_message) for k, _d, r in self.results if not r.ok]
        assert not failed, f"{len(failed)} of {len(self.results)} records failed: {failed[:5]}"


def test_hot_partition_is_split_automatically(client, unique_stream):
    client.create_stream(unique_stream, partitions=1, replication_factor=3)
    info = client.update_stream(unique_stream, auto_split_records_per_s=AUTO_SPLIT_RATE, auto_split_period_s=2)
    assert (info.auto_split_records_per_s, info.auto_split_period_s) == (AUTO_SPLIT_RATE, 2)

    def split_automatically() -> StreamInfo | None:
        i = client.get_stream_info(unique_stream)
        p0 = i.partition(0)
        if p0.state is PartitionState.CLOSED and len(p0.children) == 2 and (i.repartition or {}).get("auto"):
            return i
        return None

    with SteadyWriter(client, unique_stream) as writer:
        info = wait_until(split_automatically, AUTO_SPLIT_TIMEOUT_S, "an automatic split of p0")
    client.update_stream(unique_stream, auto_split_records_per_s=0)      # no more splits of the children
    writer.check()
    rate = len(writer.results) / writer.elapsed
    print(f"auto split after {writer.elapsed:.1f} s at {rate:.0f} records/s: {info.repartition}")
    assert rate >= LOAD_RATE_MIN, f"the load was only {rate:.0f} records/s"
    assert info.repartition["op"] == "split" and info.repartition["partition"] == 0, info.repartition
    for c in info.partition(0).children:
        assert info.partition(c).parents == (0,) and info.partition(c).state is PartitionState.OPEN

    stored = read_all(client, unique_stream)
    counts = collections.Counter((x.partition_key, x.data) for x in stored)
    assert counts == collections.Counter((k, d) for k, d, _r in writer.results), \
        "the records written across the automatic split are not stored exactly once"


def test_no_automatic_split_with_the_policy_off(client, unique_stream):
    """The same load with the default policy (off): p0 stays open and no repartition is
    recorded. Asserts an absence, so it watches for a bounded time."""
    info = client.create_stream(unique_stream, partitions=1, replication_factor=3)
    assert info.auto_split_records_per_s == 0
    with SteadyWriter(client, unique_stream) as writer:
        deadline = time.monotonic() + NO_SPLIT_OBSERVE_S
        while time.monotonic() < deadline:
            info = client.get_stream_info(unique_stream)
            assert [p.ordinal for p in info.partitions] == [0] and info.repartition is None, \
                f"split with the policy off: {info.repartition}, partitions {info.partitions}"
            writer.stop_event.wait(0.2)
    writer.check()
    rate = len(writer.results) / writer.elapsed
    print(f"no split in {writer.elapsed:.1f} s at {rate:.0f} records/s")
    assert rate >= LOAD_RATE_MIN, f"the load was only {rate:.0f} records/s"
    info = client.get_stream_info(unique_stream)
    assert [(p.ordinal, p.state) for p in info.partitions] == [(0, PartitionState.OPEN)], info.partitions
    assert info.repartition is None, info.repartition
