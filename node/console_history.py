"""The web console's short memory (node/console.py): a ring buffer per series of numbers --
records/s written and read, cluster-wide and per stream, and each consumer group's lag --
so the page can draw the last hour without a Prometheus.

A plain synchronous class with no I/O and no clock of its own: the console hands it each
reading with its time (`offer`), and it keeps one point every `sample_s` (the others are
dropped), at most `points_max` points a series and at most `series_max` series (a series
not offered for `points_max` samples is forgotten, so deleted streams go). The console
reads the cluster with the viewer's key only while a page polls it, so the history has
gaps where nobody watched: the points say when they were taken.
"""

from __future__ import annotations

from collections import deque

HISTORY_SAMPLE_S = 10.0         # one point every so often
HISTORY_POINTS_MAX = 360        # points kept a series: an hour at HISTORY_SAMPLE_S
HISTORY_SERIES_MAX = 400        # series kept (per stream and group); past it, new series are not kept


class History:
    """Series name -> deque of (time ms, value), each bounded."""

    def __init__(self, sample_s: float = HISTORY_SAMPLE_S, points_max: int = HISTORY_POINTS_MAX,
                 series_max: int = HISTORY_SERIES_MAX):
        assert sample_s > 0 and points_max > 0 and series_max > 0
        self.sample_s = sample_s
        self.points_max = points_max
        self.series_max = series_max
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
        self.last_sample_ms = now_ms
        self.samples += 1
        for name, value in values.items():
            points = self.series.get(name)
            if points is None:
                if len(self.series) >= self.series_max:
                    self.dropped_series += 1
                    continue
                points = self.series[name] = deque(maxlen=self.points_max)
            points.append((now_ms, float(value)))
            self.last_offered[name] = self.samples
        for name in [n for n, at in self.last_offered.items() if self.samples - at >= self.points_max]:
            del self.series[name], self.last_offered[name]        # (not seen for an hour's samples)
        return True

    def snapshot(self, prefix: str = "") -> dict:
        """The series (those whose name starts with `prefix`) as JSON-able lists of
        [time ms, value]."""
        return {"sample_s": self.sample_s, "points_max": self.points_max,
                "series": {name: [list(p) for p in points] for name, points in sorted(self.series.items())
                           if name.startswith(prefix)}}
