"""The history behind the console's charts (node/console.py): records written and read,
cluster-wide and per stream, and each consumer's lag, over the last hour, without a
Prometheus.

Each node keeps its own (node/metrics.py `HistorySampler`): every HISTORY_SAMPLE_S it
reads its own counters and lag gauges in process (`node_series`, no credentials, no
metadata read beyond what a scrape makes) into a `History`, and serves it on its metrics
port as `GET /history`. The console reads every live node's with the viewer's key and
`merge`s them: counters into rates between consecutive samples (a step down, a restarted
node, is dropped), the samples aligned into HISTORY_SAMPLE_S buckets, summed across nodes.
So the charts cover the hour before a page was opened, and survive a control failover.

Plain synchronous code with no I/O and no clock of its own: the sampler hands `History`
each reading with its time (`offer`), and it keeps one point every `sample_s`, at most
`points_max` points a series and at most `series_max` series (a series not offered for
`points_max` samples is forgotten).
"""

from __future__ import annotations

import math
import os
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping

ENV_SAMPLE_S = "SMS_HISTORY_SAMPLE_S"   # overrides HISTORY_SAMPLE_S in a node's environment (tests: 0.5)
HISTORY_SAMPLE_S = 10.0         # one point every so often
HISTORY_SAMPLE_S_MIN = 0.1      # ... at least this long ($SMS_HISTORY_SAMPLE_S)
HISTORY_SAMPLE_S_MAX = 3600.0
HISTORY_POINTS_MAX = 360        # points kept a series: an hour at HISTORY_SAMPLE_S
HISTORY_SERIES_MAX = 400        # series kept (per stream and consumer); past it, new series are not kept

# what a node keeps: series name prefix -> the metric it sums (over the partitions it holds)
COUNTERS = {"in:": "sms_put_records_total", "out:": "sms_read_records_total"}     # cumulative: rates in merge()
LAG_RECORDS = "sms_consumer_lag_records"       # "lag:<stream>/<consumer>": summed over partitions
LAG_SECONDS = "sms_consumer_lag_seconds"       # "lag_s:<stream>/<consumer>": the largest


def sample_s_from(env: Mapping[str, str] = os.environ) -> float:
    """HISTORY_SAMPLE_S, or $SMS_HISTORY_SAMPLE_S; ValueError naming it when out of bounds."""
    raw = env.get(ENV_SAMPLE_S, "").strip()
    if not raw:
        return HISTORY_SAMPLE_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"${ENV_SAMPLE_S} {raw[:32]!r}; expected seconds") from None
    if not (math.isfinite(value) and HISTORY_SAMPLE_S_MIN <= value <= HISTORY_SAMPLE_S_MAX):
        raise ValueError(f"${ENV_SAMPLE_S} {raw[:32]!r}; expected {HISTORY_SAMPLE_S_MIN:g}..{HISTORY_SAMPLE_S_MAX:g} s")
    return value


class History:
    """Series name -> deque of (time ms, value), each bounded. `counters`: prefixes of the
    series that count from 0 (a counter's first point after earlier samples gets a 0 at
    the sample before, so its first records are not lost to the rates)."""

    def __init__(self, sample_s: float = HISTORY_SAMPLE_S, points_max: int = HISTORY_POINTS_MAX,
                 series_max: int = HISTORY_SERIES_MAX, counters: tuple[str, ...] = ()):
        assert sample_s > 0 and points_max > 1 and series_max > 0
        self.sample_s = sample_s
        self.points_max = points_max
        self.series_max = series_max
        self.counters = counters
        self.series: dict[str, deque] = {}
        self.last_offered: dict[str, int] = {}          # series -> the sample index it last had a point at
        self.samples = 0                                # samples taken
        self.last_sample_ms: int | None = None
        self.dropped_series = 0                         # series not kept (series_max reached)

    def due(self, now_ms: int) -> bool:
        """Whether a reading at `now_ms` becomes a point."""
        return self.last_sample_ms is None or now_ms - self.last_sample_ms >= self.sample_s * 1000

    def offer(self, now_ms: int, values: dict[str, float]) -> bool:
        """Keep `values` (series -> value) as one sample at `now_ms` when one is due;
        whether it was kept."""
        if not self.due(now_ms):
            return False
        before_ms = self.last_sample_ms
        self.last_sample_ms = now_ms
        self.samples += 1
        for name, value in values.items():
            points = self.series.get(name)
            if points is None:
                if len(self.series) >= self.series_max:
                    self.dropped_series += 1
                    continue
                points = self.series[name] = deque(maxlen=self.points_max)
                if before_ms is not None and name.startswith(self.counters):
                    points.append((before_ms, 0.0))     # (not counted yet at the sample before)
            points.append((now_ms, float(value)))
            self.last_offered[name] = self.samples
        for name in [n for n, at in self.last_offered.items() if self.samples - at >= self.points_max]:
            del self.series[name], self.last_offered[name]        # (not seen for an hour's samples)
        return True

    def snapshot(self, prefix: str = "") -> dict:
        """The series (those whose name starts with `prefix`) as JSON-able lists of
        [time ms, value]."""
        return {"sample_s": self.sample_s, "points_max": self.points_max, "dropped_series": self.dropped_series,
                "series": {name: [list(p) for p in points] for name, points in sorted(self.series.items())
                           if name.startswith(prefix)}}


# --- on a node: what it samples of its own metrics -------------------------------------------

def node_series(samples: Iterable[tuple[str, Mapping[str, str], float]]) -> dict[str, float]:
    """One reading of a node's own metric samples (name, labels, value) as the history's
    series: "in:<stream>" and "out:<stream>" (records written and read, cumulative, summed
    over the partitions this node counts), "lag:<stream>/<consumer>" (records behind,
    summed over the partitions this node heads) and "lag_s:<stream>/<consumer>" (the
    largest, in seconds). Other samples are ignored."""
    prefix_of = {metric: prefix for prefix, metric in COUNTERS.items()}
    out: dict[str, float] = defaultdict(float)
    for name, labels, value in samples:
        prefix = prefix_of.get(name)
        if prefix is not None:
            out[prefix + labels.get("stream", "")] += value
        elif name == LAG_RECORDS:
            out[f"lag:{labels.get('stream', '')}/{labels.get('consumer', '')}"] += value
        elif name == LAG_SECONDS:
            key = f"lag_s:{labels.get('stream', '')}/{labels.get('consumer', '')}"
            out[key] = max(out[key], value)
    return dict(out)


# --- on the console: the nodes' histories as the charts' series --------------------------------

def merge(histories: Iterable[Mapping], sample_s: float = HISTORY_SAMPLE_S, points_max: int = HISTORY_POINTS_MAX,
          series_max: int = HISTORY_SERIES_MAX, streams: set[str] | None = None) -> dict:
    """The charts' series from the nodes' /history answers: each node's counters ("in:",
    "out:") as rates between its consecutive samples (records/s; a step down, a node
    that restarted, gives no rate), every point put in the `sample_s` bucket nearest its
    time, then summed across nodes per bucket ("lag_s:" the largest). "in" and "out" are
    the whole cluster's. `streams`: keep only these streams' own series (the others were
    deleted). The last `points_max` buckets, at most `series_max` series."""
    step_ms = sample_s * 1000
    merged: dict[str, dict[int, float]] = defaultdict(dict)      # series -> bucket -> value
    for answer in histories:
        for name, points in (answer.get("series") or {}).items():
            try:
                by_bucket = _node_buckets(name, points, step_ms)
            except (TypeError, ValueError, IndexError):   # (a node's answer we cannot read: skip that series)
                continue
            into = merged[name]
            combine = max if name.startswith("lag_s:") else (lambda a, b: a + b)
            for bucket, value in by_bucket.items():
                into[bucket] = combine(into[bucket], value) if bucket in into else value
    for total in ("in", "out"):
        into = merged[total]
        for name in [n for n in merged if n.startswith(total + ":")]:
            for bucket, value in merged[name].items():
                into[bucket] = into.get(bucket, 0.0) + value
    last = max((b for buckets in merged.values() for b in buckets), default=0)
    names = ["in", "out"] + sorted(n for n in merged if n not in ("in", "out")
                                   and (streams is None or _stream_of(n) in streams))
    series = {}
    for name in names[:series_max]:
        points = [[int(b * step_ms), round(v, 3)] for b, v in sorted(merged[name].items()) if b > last - points_max]
        if points or name in ("in", "out"):
            series[name] = points
    return {"sample_s": sample_s, "points_max": points_max, "series": series}


def _node_buckets(name: str, points: list, step_ms: float) -> dict[int, float]:
    """One node's series as bucket -> value: a counter's rates (the mean of those that fall
    in one bucket), a gauge's last value in each bucket."""
    pairs = sorted((int(t), float(v)) for t, v in points)
    out: dict[int, float] = {}
    if not name.startswith(tuple(COUNTERS)):
        for t, v in pairs:
            out[round(t / step_ms)] = v
        return out
    rates: dict[int, list[float]] = defaultdict(list)
    for (t0, v0), (t1, v1) in zip(pairs, pairs[1:]):
        if t1 > t0 and v1 >= v0:                         # (a step down: the node restarted, its counters at 0)
            rates[round(t1 / step_ms)].append((v1 - v0) * 1000 / (t1 - t0))
    return {bucket: sum(values) / len(values) for bucket, values in rates.items()}


def _stream_of(series: str) -> str:
    """The stream a series is of ("lag:orders/billing": orders)."""
    _kind, _, rest = series.partition(":")
    return rest.split("/", 1)[0] if series.startswith(("lag:", "lag_s:")) else rest
