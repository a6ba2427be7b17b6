"""node/console_history.py without a cluster: what a node samples of its own metrics
(`node_series`), its ring buffers (`History`), and how the console merges the nodes'
histories into the charts' series (`merge`): counters into rates, a restarted node's
step down dropped, samples aligned into buckets and summed across nodes."""

from __future__ import annotations

import pytest

from node.console_history import ENV_SAMPLE_S, HISTORY_SAMPLE_S, History, merge, node_series, sample_s_from


def test_a_node_sums_its_partitions_per_stream_and_consumer():
    samples = [("sms_put_records_total", {"stream": "s", "partition": "p0000"}, 10.0),
               ("sms_put_records_total", {"stream": "s", "partition": "p0001"}, 5.0),
               ("sms_read_records_total", {"stream": "s", "partition": "p0000"}, 7.0),
               ("sms_consumer_lag_records", {"stream": "s", "partition": "p0000", "consumer": "g", "kind": "group"}, 3),
               ("sms_consumer_lag_records", {"stream": "s", "partition": "p0001", "consumer": "g", "kind": "group"}, 4),
               ("sms_consumer_lag_seconds", {"stream": "s", "partition": "p0000", "consumer": "g", "kind": "group"}, 2),
               ("sms_consumer_lag_seconds", {"stream": "s", "partition": "p0001", "consumer": "g", "kind": "group"}, 9),
               ("sms_put_bytes_total", {"stream": "s", "partition": "p0000"}, 999.0)]     # (not kept)
    assert node_series(samples) == {"in:s": 15.0, "out:s": 7.0, "lag:s/g": 7.0, "lag_s:s/g": 9.0}


def test_the_history_keeps_a_point_every_sample_and_forgets_gone_series():
    history = History(sample_s=10, points_max=3, series_max=2)
    assert history.offer(0, {"in": 1, "lag:s/g": 5})
    assert not history.offer(9_999, {"in": 2})                     # (not due: dropped)
    assert history.offer(10_000, {"in": 3, "out": 4})              # ("out": a third series, over the bound)
    assert history.dropped_series == 1
    for t in (20_000, 30_000, 40_000):
        history.offer(t, {"in": t / 1000})
    series = history.snapshot()["series"]
    assert series["in"] == [[20_000, 20.0], [30_000, 30.0], [40_000, 40.0]]       # (the last points_max)
    assert "lag:s/g" not in series                                 # (not offered for points_max samples)
    assert history.snapshot(prefix="lag:")["series"] == {}


def test_a_counter_new_after_earlier_samples_starts_from_zero():
    history = History(sample_s=1, points_max=10, counters=("in:",))
    history.offer(1_000, {"lag:s/g": 1})
    history.offer(2_000, {"lag:s/g": 1, "in:s": 50, "out:s": 4})
    series = history.snapshot()["series"]
    assert series["in:s"] == [[1_000, 0.0], [2_000, 50.0]]      # (its first 50 records make a rate)
    assert series["out:s"] == [[2_000, 4.0]]                      # (not a counter prefix given here)
    fresh = History(sample_s=1, points_max=10, counters=("in:",))
    fresh.offer(1_000, {"in:s": 50})                              # (a node's first sample: no 0 before it)
    assert fresh.snapshot()["series"]["in:s"] == [[1_000, 50.0]]


def test_two_nodes_merge_into_rates_and_a_restart_drops_its_step_down():
    a = {"node_id": "n1", "series": {"in:s": [[0, 100], [10_000, 200], [20_000, 400], [30_000, 500]],
                                     "lag:s/g": [[10_000, 5], [20_000, 6]],
                                     "lag_s:s/g": [[10_000, 1.5]]}}
    # n2 restarted between 10 s and 20 s: its counter fell to 30 (no rate there), then counts on;
    # its samples came a little late (10_040 ms is still the 10 s bucket)
    b = {"node_id": "n2", "series": {"in:s": [[0, 1_000], [10_040, 1_100], [20_000, 30], [30_000, 130]],
                                     "out:s": [[0, 0], [10_000, 50]],
                                     "lag:s/g": [[10_000, 2]],
                                     "lag_s:s/g": [[10_000, 4.0]]}}
    merged = merge([a, b], sample_s=10)
    series = merged["series"]
    assert series["in:s"][0] == [10_000, pytest.approx(10 + 100 / 10.04, abs=1e-3)]
    assert series["in:s"][1:] == [[20_000, 20.0], [30_000, 20.0]]        # (n1 only at 20 s, then both)
    assert series["in"] == series["in:s"]                                # (the whole cluster: one stream)
    assert series["out"] == series["out:s"] == [[10_000, 5.0]]
    assert series["lag:s/g"] == [[10_000, 7.0], [20_000, 6.0]]           # (summed across nodes)
    assert series["lag_s:s/g"] == [[10_000, 4.0]]                        # (the largest)
    assert merged["sample_s"] == 10


def test_merge_keeps_existing_streams_the_last_points_and_skips_what_it_cannot_read():
    node = {"series": {"in:gone": [[0, 0], [10_000, 100]], "in:kept": [[0, 0], [10_000, 10]],
                       "lag:gone/g": [[10_000, 1]], "out:kept": "not points", "in:odd": [[0]]}}
    series = merge([node], sample_s=10, streams={"kept"})["series"]
    assert set(series) == {"in", "out", "in:kept"}
    assert series["in"] == [[10_000, 11.0]]                              # (a deleted stream's records count)
    many = {"series": {"in:s": [[t * 1000, t] for t in range(0, 100, 10)]}}
    assert [p[0] for p in merge([many], sample_s=10, points_max=3)["series"]["in:s"]] == [70_000, 80_000, 90_000]
    assert merge([], sample_s=10)["series"] == {"in": [], "out": []}


def test_the_sample_interval_from_the_environment():
    assert sample_s_from({}) == HISTORY_SAMPLE_S
    assert sample_s_from({ENV_SAMPLE_S: "0.5"}) == 0.5
    for bad in ("fast", "0", "-1", "nan", "100000"):
        with pytest.raises(ValueError, match=ENV_SAMPLE_S):
            sample_s_from({ENV_SAMPLE_S: bad})
