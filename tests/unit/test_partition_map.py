"""Unit tests of sms.partition_map and the records of sms.metadata (configs, names, paths)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sms import limits, metadata
from sms.errors import InvalidArgument, InvalidStreamName
from sms.hashing import HASH_SPACE
from sms.metadata import ChainConfig, StreamConfig
from sms.partition_map import PartitionEntry, PartitionMap
from sms.types import IngestionPolicy, PartitionState, Persistence, StreamStatus

NOW_MS = 1_700_000_000_000


# --- PartitionMap.even -------------------------------------------------------------------------

@pytest.mark.parametrize("n", range(1, 65))
def test_even_map_tiles_the_hash_space(n):
    pmap = PartitionMap.even(n, NOW_MS)
    entries = sorted(pmap.entries, key=lambda e: e.hash_lo)
    assert len(entries) == n
    assert [e.ordinal for e in pmap.entries] == list(range(n))
    assert pmap.next_ordinal == n
    assert entries[0].hash_lo == 0
    assert entries[-1].hash_hi == HASH_SPACE
    for prev, nxt in zip(entries, entries[1:]):
        assert prev.hash_hi == nxt.hash_lo          # no gap, no overlap
    widths = [e.hash_hi - e.hash_lo for e in entries]
    assert min(widths) >= 1
    assert max(widths) - min(widths) <= 1
    assert sum(widths) == HASH_SPACE
    for e in entries:
        assert e.state is PartitionState.OPEN
        assert e.valid_from_ms == NOW_MS and e.valid_to_ms is None
        assert e.parents == () and e.children == () and e.ending_sn is None
    assert pmap.open_entries() == list(pmap.entries)


@settings(max_examples=300)
@given(st.integers(min_value=1, max_value=64), st.integers(min_value=0, max_value=HASH_SPACE - 1))
def test_open_for_hash_finds_the_one_covering_entry(n, hash_key):
    pmap = PartitionMap.even(n, NOW_MS)
    found = pmap.open_for_hash(hash_key)
    assert found.hash_lo <= hash_key < found.hash_hi
    assert [e.ordinal for e in pmap.entries if e.covers(hash_key)] == [found.ordinal]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64])
def test_open_for_hash_at_range_edges(n):
    pmap = PartitionMap.even(n, NOW_MS)
    for e in pmap.entries:
        assert pmap.open_for_hash(e.hash_lo) == e
        assert pmap.open_for_hash(e.hash_hi - 1) == e
    assert pmap.open_for_hash(0).ordinal == 0
    assert pmap.open_for_hash(HASH_SPACE - 1).ordinal == n - 1


def test_open_for_hash_outside_the_space_raises_key_error():
    pmap = PartitionMap.even(4, NOW_MS)
    with pytest.raises(KeyError):
        pmap.open_for_hash(HASH_SPACE)
    with pytest.raises(KeyError):
        pmap.open_for_hash(-1)


def test_open_for_hash_skips_closed_entries():
    parent = PartitionEntry(0, 0, HASH_SPACE, 0, valid_to_ms=5, children=(1, 2),
                            state=PartitionState.CLOSED, ending_sn=99)
    left = PartitionEntry(1, 0, HASH_SPACE // 2, 5, parents=(0,))
    right = PartitionEntry(2, HASH_SPACE // 2, HASH_SPACE, 5, parents=(0,))
    pmap = PartitionMap((parent, left, right), next_ordinal=3)
    assert pmap.open_for_hash(0) == left
    assert pmap.open_for_hash(HASH_SPACE - 1) == right
    assert pmap.open_entries() == [left, right]
    assert pmap.entry(0) == parent
    with pytest.raises(KeyError):
        pmap.entry(3)


# --- serialisation ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 5, 64])
def test_even_map_bytes_round_trip(n):
    pmap = PartitionMap.even(n, NOW_MS)
    back = PartitionMap.from_bytes(pmap.to_bytes(), version=7)
    assert back == pmap.with_version(7)
    assert back.version == 7


def test_map_with_closed_entries_round_trips():
    parent = PartitionEntry(0, 0, HASH_SPACE, 0, valid_to_ms=5, children=(1, 2),
                            state=PartitionState.CLOSED, ending_sn=(1 << 127) + 3)
    left = PartitionEntry(1, 0, HASH_SPACE // 2, 5, parents=(0,))
    right = PartitionEntry(2, HASH_SPACE // 2, HASH_SPACE, 5, parents=(0,))
    pmap = PartitionMap((parent, left, right), version=3, next_ordinal=3)
    assert PartitionMap.from_bytes(pmap.to_bytes(), version=3) == pmap


entries_st = st.builds(
    PartitionEntry,
    ordinal=st.integers(min_value=0, max_value=2 ** 32 - 1),
    hash_lo=st.integers(min_value=0, max_value=HASH_SPACE - 1),
    hash_hi=st.integers(min_value=1, max_value=HASH_SPACE),
    valid_from_ms=st.integers(min_value=0, max_value=2 ** 48 - 1),
    valid_to_ms=st.none() | st.integers(min_value=0, max_value=2 ** 48 - 1),
    parents=st.lists(st.integers(min_value=0, max_value=1000), max_size=3).map(tuple),
    children=st.lists(st.integers(min_value=0, max_value=1000), max_size=3).map(tuple),
    state=st.sampled_from(PartitionState),
    ending_sn=st.none() | st.integers(min_value=0, max_value=2 ** 128 - 1),
)


@settings(max_examples=100)
@given(st.lists(entries_st, max_size=6).map(tuple), st.integers(min_value=0, max_value=10_000))
def test_any_map_bytes_round_trip(entries, next_ordinal):
    pmap = PartitionMap(entries, next_ordinal=next_ordinal)
    assert PartitionMap.from_bytes(pmap.to_bytes()) == pmap


def test_big_hash_bounds_are_json_strings():
    # 128-bit ints must not go through JSON numbers (other readers parse them as doubles)
    raw = PartitionMap.even(2, NOW_MS).to_bytes().decode()
    assert f'"{HASH_SPACE}"' in raw and f'"{HASH_SPACE // 2}"' in raw


# --- StreamConfig / ChainConfig ----------------------------------------------------------------

@pytest.mark.parametrize("persistence", list(Persistence))
@pytest.mark.parametrize("policy", list(IngestionPolicy))
@pytest.mark.parametrize("status", list(StreamStatus))
def test_stream_config_round_trip(persistence, policy, status):
    cfg = StreamConfig(name="orders.v1-x_y", partitions=12, replication_factor=3, persistence=persistence,
                       ingestion_policy=policy, retention_hours=48, created_ms=NOW_MS, status=status,
                       tenant="acme")
    back = StreamConfig.from_bytes(cfg.to_bytes())
    assert back == cfg
    assert back.persistence is persistence and back.ingestion_policy is policy and back.status is status


def test_stream_config_with_status_keeps_the_rest():
    cfg = StreamConfig("s", 1, 1, Persistence.DISK, IngestionPolicy.BEST_EFFORT, 24, NOW_MS)
    assert cfg.status is StreamStatus.ACTIVE and cfg.tenant == "default"
    deleting = cfg.with_status(StreamStatus.DELETING)
    assert deleting.status is StreamStatus.DELETING
    assert deleting.with_status(StreamStatus.ACTIVE) == cfg


def _chain(length: int, persistence: Persistence = Persistence.DISK) -> ChainConfig:
    members = tuple(f"node-{i}" for i in range(length))
    return ChainConfig(chain_id=metadata.chain_id("s", 4), stream="s", ordinal=4, epoch=9,
                       members=members, persistence=persistence)


@pytest.mark.parametrize("persistence", list(Persistence))
@pytest.mark.parametrize("length", range(1, 6))
def test_chain_config_round_trip(length, persistence):
    cfg = _chain(length, persistence)
    back = ChainConfig.from_bytes(cfg.to_bytes())
    assert back == cfg
    assert isinstance(back.members, tuple)


@pytest.mark.parametrize("length", range(1, 6))
def test_chain_roles_and_neighbours(length):
    cfg = _chain(length)
    members = cfg.members
    assert cfg.head == members[0] and cfg.tail == members[-1]
    for i, node in enumerate(members):
        expected_pred = members[i - 1] if i > 0 else None
        expected_succ = members[i + 1] if i + 1 < length else None
        assert cfg.predecessor_of(node) == expected_pred
        assert cfg.successor_of(node) == expected_succ
        if length == 1:
            expected_role = "head+tail"
        elif i == 0:
            expected_role = "head"
        elif i == length - 1:
            expected_role = "tail"
        else:
            expected_role = "middle"
        assert cfg.role_of(node) == expected_role
    # walking successors from the head visits the whole chain in order
    walk, node = [], cfg.head
    while node is not None:
        walk.append(node)
        node = cfg.successor_of(node)
    assert tuple(walk) == members


def test_neighbours_of_a_non_member_raise():
    cfg = _chain(3)
    with pytest.raises(ValueError):
        cfg.successor_of("stranger")
    with pytest.raises(ValueError):
        cfg.predecessor_of("stranger")


def test_chain_id_round_trips_through_parse():
    assert metadata.parse_chain_id(metadata.chain_id("my.stream-1", 17)) == ("my.stream-1", 17)
    assert metadata.chain_path(metadata.chain_id("s", 0)) == "/chains/s:0"
    assert metadata.map_path("s") == "/streams/s/map"
    assert metadata.stream_path("s") == "/streams/s"
    assert metadata.node_path("n1") == "/nodes/n1"


# --- stream names -----------------------------------------------------------------------------

_NAME_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-"


@settings(max_examples=200)
@given(st.text(alphabet=_NAME_CHARS, min_size=1, max_size=limits.STREAM_NAME_CHARS_MAX))
def test_validate_stream_name_accepts_the_allowed_alphabet(name):
    assume(name not in (".", ".."))          # (reserved: a relative path component)
    assert metadata.validate_stream_name(name) == name


@settings(max_examples=200)
@given(st.text(max_size=limits.STREAM_NAME_CHARS_MAX + 5))
def test_validate_stream_name_agrees_with_the_documented_pattern(name):
    ok = (1 <= len(name) <= limits.STREAM_NAME_CHARS_MAX and all(c in _NAME_CHARS for c in name)
          and name not in (".", ".."))
    if ok:
        assert metadata.validate_stream_name(name) == name
    else:
        with pytest.raises(InvalidStreamName):
            metadata.validate_stream_name(name)


@pytest.mark.parametrize("name", [
    "",
    "x" * (limits.STREAM_NAME_CHARS_MAX + 1),
    "has space",
    "slash/name",
    "colon:name",
    "newline\n",
    "tab\tname",
    "caf\u00e9",
    "\u0661",          # a non-ASCII digit
    "star*",
    ".",
    "..",
    None,
    42,
    b"bytes",
])
def test_validate_stream_name_rejects_others(name):
    with pytest.raises(InvalidStreamName) as info:
        metadata.validate_stream_name(name)
    assert isinstance(info.value, InvalidArgument)


def test_validate_stream_name_accepts_the_length_limit():
    name = "a" * limits.STREAM_NAME_CHARS_MAX
    assert metadata.validate_stream_name(name) == name
