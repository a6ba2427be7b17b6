"""A stream's tags and shard-level metrics: kept in its config (through JSON and back), and
changed with the limits Kinesis has (control/admin.py `changed_tags`)."""

from __future__ import annotations

import pytest

from control.admin import changed_tags
from kinesis.mapping import stream_id
from sms import limits
from sms.errors import InvalidStreamConfig, LimitExceeded
from sms.metadata import StreamConfig
from sms.types import IngestionPolicy, Persistence


def _config(**kw) -> StreamConfig:
    return StreamConfig(name="s", partitions=1, replication_factor=1, persistence=Persistence.DISK,
                        ingestion_policy=IngestionPolicy.AT_LEAST_ONCE_NO_DUP, retention_hours=24, created_ms=1, **kw)


def test_tags_and_metrics_survive_the_config_round_trip():
    config = _config(tags=(("a", "1"), ("b", "")), shard_metrics=("IncomingBytes",))
    again = StreamConfig.from_bytes(config.to_bytes())
    assert again == config
    assert StreamConfig.from_bytes(_config().to_bytes()).tags == ()          # (a config written before tags)


def test_tags_are_set_replaced_and_removed():
    assert changed_tags((), None, None) is None and changed_tags((), {}, []) is None
    tags = changed_tags((("a", "1"),), {"b": "2", "a": "3"}, None)
    assert tags == (("a", "3"), ("b", "2"))
    assert changed_tags(tags, None, ["a", "missing"]) == (("b", "2"),)
    assert changed_tags(tags, {"c": "x y/z=+-@%:._"}, None)[-1] == ("c", "x y/z=+-@%:._")


@pytest.mark.parametrize("bad", [{"": "x"}, {"k" * 129: "x"}, {"k": "v" * 257}, {"aws:name": "x"},
                                 {"AWS:name": "x"}, {"a\x00": "x"}, {"a": "\n"}, {"a": "<script>"}])
def test_bad_tags_are_refused_by_name(bad):
    with pytest.raises(InvalidStreamConfig):
        changed_tags((), bad, None)


def test_a_stream_has_at_most_fifty_tags():
    full = tuple((f"k{i:02d}", "") for i in range(limits.STREAM_TAGS_MAX))
    assert changed_tags(full, {"k00": "new"}, None)[0] == ("k00", "new")      # a change, not one more
    with pytest.raises(LimitExceeded):
        changed_tags(full, {"one-more": ""}, None)


def test_a_stream_id_has_the_models_form_and_differs_per_incarnation():
    import re
    first = stream_id("clicks", 1000)
    assert re.fullmatch(r"[a-z0-9]{20}-[a-z0-9]{3}", first)
    assert first == stream_id("clicks", 1000) != stream_id("clicks", 1001) != stream_id("clicks2", 1000)
