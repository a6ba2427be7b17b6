"""The Spark connector's option checks and offset decisions, without Spark or a cluster
(spark_sps/options.py, spark_sps/offsets.py)."""

from __future__ import annotations

import pytest

from sms import seqno
from sms.types import IngestionPolicy, PartitionInfo, PartitionState, Persistence, StreamInfo, StreamStatus
from spark_sps import offsets
from spark_sps.options import sink_options, source_options

BASE = {"address": "127.0.0.1:1", "stream": "s"}


def sn(counter: int, ordinal: int = 0, ts_ms: int = 1_000) -> int:
    return seqno.make(ts_ms, counter, ordinal)


def partition(ordinal: int, *, parents=(), children=(), ending: int | None = None) -> PartitionInfo:
    return PartitionInfo(ordinal, 0, 1, 0, None, PartitionState.CLOSED if ending is not None else PartitionState.OPEN,
                         tuple(parents), tuple(children), 1, (), None, ending_sn=ending)


def stream(*partitions: PartitionInfo) -> StreamInfo:
    return StreamInfo("s", StreamStatus.ACTIVE, 1, Persistence.DISK, IngestionPolicy.AT_LEAST_ONCE_NO_DUP, 24, 1, 0,
                      tuple(partitions))


# --- options ---------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, message", [
    ({"startingoffsets": "earliest"}, "option 'startingOffsets' is Kafka's; the sms data source takes startingPosition"),
    ({"maxoffsetspertrigger": "5"}, "takes maxRecordsPerTrigger"),
    ({"endingposition": "LATEST"}, "'endingPosition' applies to spark.read.format\\('sms'\\) only"),
    ({"nosuch": "1"}, "unknown option 'nosuch'.*valid options: address, stream, caFile"),
    ({"startingposition": "AT_TIMESTAMP"}, "needs .option\\(\"startingTimestamp\""),
    ({"startingposition": "LATEST", "startingtimestamp": "5"}, "goes with startingPosition AT_TIMESTAMP"),
    ({"startingposition": "EARLIEST"}, "startingPosition 'EARLIEST'; expected one of TRIM_HORIZON"),
    ({"startingposition": '{"p0001": "12"}'}, "SN 12 belongs to partition p0012"),
    ({"failondataloss": "maybe"}, "failOnDataLoss 'maybe'; expected true or false"),
    ({"maxrecordspertrigger": "0"}, "maxRecordsPerTrigger 0; expected an integer >= 1"),
    ({"consumername": "no spaces"}, "consumerName 'no spaces'"),
])
def test_stream_source_options_are_refused_by_name(extra, message):
    with pytest.raises(ValueError, match=message):
        source_options({**BASE, **extra}, streaming=True)


def test_source_options_take_their_defaults_and_kafkas_timestamp_rule():
    opts = source_options(dict(BASE), streaming=True)
    assert (opts.starting.kind, opts.fail_on_data_loss, opts.max_records_per_trigger, opts.consumer_name) == \
        ("TRIM_HORIZON", True, None, None)
    assert source_options({**BASE, "startingtimestamp": "7"}, streaming=False).starting.timestamp_ms == 7
    positions = source_options({**BASE, "startingposition": '{"p0000": "%d", "1": "latest"}' % sn(3)},
                               streaming=True).starting
    assert positions.sns == ((0, sn(3)), (1, "LATEST"))
    with pytest.raises(ValueError, match="'maxRecordsPerTrigger' applies to spark.readStream"):
        source_options({**BASE, "maxrecordspertrigger": "5"}, streaming=False)


def test_sink_options():
    assert sink_options({**BASE, "producerid": "q", "checkpointlocation": "/cp"}, streaming=True).producer_id == "q"
    assert sink_options(dict(BASE), streaming=False).producer_id == "spark-batch"
    with pytest.raises(ValueError, match='needs .option\\("producerId"'):
        sink_options(dict(BASE), streaming=True)
    with pytest.raises(ValueError, match="'checkpointLocation' applies to df.writeStream"):
        sink_options({**BASE, "checkpointlocation": "/cp"}, streaming=False)
    with pytest.raises(ValueError, match="producerId of 60 bytes; at most 40"):
        sink_options({**BASE, "producerid": "x" * 60}, streaming=False)


# --- positions --------------------------------------------------------------------------------

def test_positions_know_the_next_record_by_its_counter():
    assert offsets.expected_counter("0") == 1
    assert offsets.expected_counter(offsets.after(sn(41))) == 42
    assert offsets.expected_counter(offsets.at(sn(41))) == 41
    assert offsets.backlog(offsets.after(sn(41)), sn(50, ts_ms=2_000)) == 9
    assert offsets.backlog(offsets.at(sn(41)), sn(50)) == 10
    assert offsets.backlog("0", sn(5)) == 5 and offsets.backlog(offsets.END, sn(5)) == 0
    assert offsets.reaches(offsets.at(sn(5)), sn(5)) and not offsets.reaches(offsets.after(sn(5)), sn(5))
    assert offsets.last_read(offsets.at(sn(5))) == sn(5) - 1


def test_the_consumer_checkpoint_protects_the_next_record():
    assert offsets.consumer_checkpoints({"0": offsets.after(sn(4)), "1": offsets.at(sn(9, 1)), "2": "0",
                                         "3": offsets.END}) == {0: str(sn(4)), 1: str(sn(9, 1) - 1), 3: "SHARD_END"}


def test_offsets_pack_with_their_consumer_and_read_the_older_flat_form():
    packed = offsets.pack("spark-1", {"10": "0", "2": "END"})
    assert list(packed["partitions"]) == ["2", "10"]
    assert offsets.unpack(packed) == ("spark-1", {"2": "END", "10": "0"})
    assert offsets.unpack({"0": "5", "1": "END"}) == (None, {"0": "5", "1": "END"})


def test_advance_reads_parents_to_their_end_before_children():
    info = stream(partition(0, children=(1, 2), ending=sn(20)), partition(1, parents=(0,)), partition(2, parents=(0,)))
    endings: dict[int, int] = {}
    end, lost = offsets.advance({"0": offsets.after(sn(10))}, info, {1: sn(3, 1), 2: 0}, endings)
    assert (end, lost) == ({"0": offsets.after(sn(20))}, [])
    end, _ = offsets.advance(end, info, {1: sn(3, 1), 2: 0}, endings)
    assert end == {"0": offsets.END}
    end, _ = offsets.advance(end, info, {1: sn(3, 1), 2: 0}, endings)
    assert end == {"0": offsets.END, "1": "0", "2": "0"}
    end, _ = offsets.advance(end, info, {1: sn(3, 1), 2: 0}, endings)
    assert end == {"0": offsets.END, "1": offsets.after(sn(3, 1)), "2": "0"}


def test_a_partition_gone_before_its_end_is_a_loss_but_not_after_it():
    info = stream(partition(1))
    end, lost = offsets.advance({"0": offsets.after(sn(5)), "1": "0"}, info, {1: 0}, {})
    assert end["0"] == offsets.END and "p0000 left the stream" in lost[0]
    end, lost = offsets.advance({"0": offsets.after(sn(5)), "1": "0"}, info, {1: 0}, {0: sn(5)})
    assert end["0"] == offsets.END and lost == []


def test_allocate_shares_a_limit_by_backlog():
    assert offsets.allocate(10, {"0": 50, "1": 50}) == {"0": 5, "1": 5}
    assert offsets.allocate(10, {"0": 3, "1": 4}) == {"0": 3, "1": 4}
    shares = offsets.allocate(10, {"0": 1, "1": 1, "2": 97})
    assert sum(shares.values()) == 10 and all(shares[k] <= n for k, n in {"0": 1, "1": 1, "2": 97}.items())
    assert sum(offsets.allocate(1, {"0": 5, "1": 5, "2": 5}).values()) == 1


def test_a_starting_cut_of_sns_must_cover_every_lineage_once():
    info = stream(partition(0, children=(2, 3), ending=sn(9)), partition(1), partition(2, parents=(0,)),
                  partition(3, parents=(0,)))
    offsets.check_cut(info, {0, 1})
    offsets.check_cut(info, {2, 3, 1})
    with pytest.raises(ValueError, match="names no position for partition p0001"):
        offsets.check_cut(info, {0})
    with pytest.raises(ValueError, match="names no position for partition p0003"):
        offsets.check_cut(info, {1, 2})
    with pytest.raises(ValueError, match="names p0002 and its ancestor p0000"):
        offsets.check_cut(info, {0, 1, 2})
    with pytest.raises(ValueError, match="names partition p0007, which the stream does not have"):
        offsets.check_cut(info, {0, 1, 7})
