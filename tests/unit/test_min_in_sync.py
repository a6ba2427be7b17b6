"""Unit tests of the stream setting `min_in_sync` outside the replica (tests/unit/test_replica.py
has the head's refusals): where it is stored (StreamConfig, ChainConfig, and their old
JSON without it), how a create request is validated, the error a producer sees, and how
it crosses the protobuf edge and shows in `sms stream describe`."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter

import grpc
import pytest

from control import chains
from control.admin import validate_create
from node import cli
from node.cli import streams
from sms import convert, errors, metadata
from sms.aio import Client
from sms.metadata import ChainConfig, StreamConfig
from sms.types import ChainMember, IngestionPolicy, PartitionInfo, PartitionState, Persistence, StreamInfo, StreamStatus

NOW_MS = 1_700_000_000_000


def _chain(members=("n1", "n2", "n3"), **kw) -> ChainConfig:
    return ChainConfig(chain_id=metadata.chain_id("s", 0), stream="s", ordinal=0, epoch=4, members=tuple(members),
                       persistence=Persistence.DISK, **kw)


def _create(rf: int = 3, min_in_sync: int = 0) -> StreamConfig:
    return validate_create("s", 1, rf, "disk", "", 24, 0, min_in_sync)


# --- stored configs -------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [1, 2, 3])
def test_chain_config_round_trip_keeps_min_in_sync(value):
    cfg = _chain(min_in_sync=value, learners=("n4",))
    assert ChainConfig.from_bytes(cfg.to_bytes()) == cfg


def test_chain_config_stored_before_min_in_sync_decodes_as_one():
    old = _chain().to_bytes()
    d = json.loads(old)
    assert "min_in_sync" not in d                  # the default is not written: old readers see old JSON
    d.pop("min_in_sync", None)
    assert ChainConfig.from_bytes(json.dumps(d).encode()).min_in_sync == 1
    assert json.loads(_chain(min_in_sync=2).to_bytes())["min_in_sync"] == 2


def test_stream_config_round_trip_and_old_json():
    cfg = _create(min_in_sync=2)
    assert StreamConfig.from_bytes(cfg.to_bytes()) == cfg and cfg.min_in_sync == 2
    d = json.loads(cfg.to_bytes())
    del d["min_in_sync"]
    assert StreamConfig.from_bytes(json.dumps(d).encode()).min_in_sync == 1


@pytest.mark.parametrize("members, learners, below", [
    (("n1",), (), True), (("n1",), ("n2", "n3"), True), (("n1", "n2"), (), False), (("n1", "n2", "n3"), (), False)])
def test_a_chain_is_below_min_in_sync_by_its_members_only(members, learners, below):
    assert _chain(members, learners=learners, min_in_sync=2).below_min_in_sync is below
    assert not _chain(members, learners=learners).below_min_in_sync


def test_chain_changes_carry_min_in_sync():
    cfg = _chain(("n1", "n2", "n3"), min_in_sync=2, incarnations=(("n1", 1), ("n2", 2), ("n3", 3)))
    removed = chains.plan(cfg, {"n1": 1, "n3": 3, "n4": 4}, 3, Counter(), {}, NOW_MS)
    assert removed.members == ("n1", "n3") and removed.min_in_sync == 2
    added = chains.plan(removed, {"n1": 1, "n3": 3, "n4": 4}, 3, Counter(), {}, NOW_MS)
    assert added.learners == ("n4",) and added.min_in_sync == 2


# --- validation ------------------------------------------------------------------------------------

def test_min_in_sync_defaults_to_one():
    assert _create().min_in_sync == 1                       # 0: the field was not set
    assert _create(rf=1).min_in_sync == 1


@pytest.mark.parametrize("rf, value", [(3, 1), (3, 2), (3, 3), (5, 5), (1, 1)])
def test_min_in_sync_up_to_the_replication_factor_is_taken(rf, value):
    assert _create(rf, value).min_in_sync == value


@pytest.mark.parametrize("rf, value", [(3, 4), (1, 2), (2, -1), (3, 99)])
def test_min_in_sync_outside_one_to_the_replication_factor_is_refused(rf, value):
    with pytest.raises(errors.InvalidStreamConfig, match=rf"min_in_sync {value}; expected 1\.\.{rf}") as e:
        _create(rf, value)
    assert isinstance(e.value, errors.InvalidArgument) and e.value.code is grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("value", [0, -1, 1.5, "2", True, None])
def test_the_client_refuses_a_bad_min_in_sync_before_calling(value):
    async def scenario():
        client = Client("127.0.0.1:1")            # nothing listens: a call would fail otherwise
        try:
            with pytest.raises(errors.InvalidStreamConfig, match="min_in_sync"):
                await client.create_stream("s", 1, 3, min_in_sync=value)
        finally:
            await client.close()

    asyncio.run(scenario())


# --- the error ------------------------------------------------------------------------------------

def test_not_enough_replicas_is_named_retriable_and_keeps_the_map():
    cls = errors.registry()["NotEnoughReplicas"]
    assert cls is errors.NotEnoughReplicas
    assert cls.code is grpc.StatusCode.UNAVAILABLE and cls.retriable and not cls.refresh_map
    rebuilt = errors.from_name("NotEnoughReplicas", "s:0: the chain has 1 member(s)")
    assert type(rebuilt) is cls and rebuilt.message.startswith("s:0")


# --- the edge and the CLI -------------------------------------------------------------------------

def _info(min_in_sync: int, chain=("n1", "n2")) -> StreamInfo:
    p = PartitionInfo(ordinal=0, hash_lo=0, hash_hi=1 << 128, valid_from_ms=NOW_MS, valid_to_ms=None,
                      state=PartitionState.OPEN, parents=(), children=(), chain_epoch=2,
                      chain=tuple(ChainMember(n, f"127.0.0.1:{i}", "") for i, n in enumerate(chain)),
                      ingestion_owner=None)
    return StreamInfo(name="s", status=StreamStatus.ACTIVE, replication_factor=3, persistence=Persistence.DISK,
                      ingestion_policy=IngestionPolicy.AT_LEAST_ONCE_NO_DUP, retention_hours=24, map_version=1,
                      created_ms=NOW_MS, partitions=(p,), min_in_sync=min_in_sync)


def test_stream_description_carries_min_in_sync():
    info = _info(2)
    assert convert.stream_from_pb(convert.stream_to_pb(info)) == info
    old = convert.stream_to_pb(dataclasses.replace(info, min_in_sync=1))
    old.ClearField("min_in_sync")                # a node that predates the field says nothing
    assert convert.stream_from_pb(old).min_in_sync == 1


def test_describe_shows_min_in_sync_and_a_partition_that_refuses_records():
    degraded = streams._describe_text(streams._describe(_info(3, chain=("n1", "n2"))))
    assert "replication 3 (min in-sync 3)" in degraded
    assert "refusing new records (NotEnoughReplicas): 2 member(s), min in-sync 3" in degraded
    whole = streams._describe_text(streams._describe(_info(2, chain=("n1", "n2"))))
    assert "(min in-sync 2)" in whole and "refusing" not in whole
    assert streams._describe(_info(2))["min_in_sync"] == 2


def test_create_parser_takes_min_in_sync():
    args = cli.build_parser().parse_args(["stream", "create", "s", "--rf", "3", "--min-in-sync", "2"])
    assert args.min_in_sync == 2
    assert cli.build_parser().parse_args(["stream", "create", "s"]).min_in_sync == 1
