"""Charts of a bench/run.py result: PNGs drawn with matplotlib (Agg backend).

- throughput_vs_partitions.png: SMS ingest records/s against partitions (the full mode's
  partitions sweep; in quick mode the points there are, i.e. the reference point), with the
  baselines' ingest / append rates as horizontal reference lines;
- latency_vs_load.png: SMS ack latency p50 / p99 / p99.9 against the offered load (% of
  the measured max), the end-to-end latency as points, and the baselines' batch ack p99
  (each at 50 % of its own max) as horizontal reference lines.

    .venv/bin/python -m bench.chart [bench/results/latest.json] [--out DIR]
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench.common import dig  # noqa: E402


_get = dig


def _baseline_rates(result: dict) -> list[tuple[str, float, str]]:
    b = result.get("baselines") or {}
    lines = [("raw LMDB sync append", _get(b, "raw_lmdb", "append_records_per_s"), "tab:gray"),
             ("gRPC echo (best mode)", _get(b, "grpc_echo", "best_records_per_s"), "tab:purple"),
             ("Redis Streams (appendfsync always), redis-py", _get(b, "redis_streams", "ingest_records_per_s"),
              "tab:red"),
             ("Redis Streams (appendfsync always), redis-benchmark",
              _get(b, "redis_streams", "redis_benchmark", "records_per_s"), "tab:brown"),
             ("NATS JetStream R1", _get(b, "nats_js", "r1", "ingest_records_per_s"), "tab:olive"),
             ("NATS JetStream R3", _get(b, "nats_js", "r3", "ingest_records_per_s"), "tab:green")]
    return [(n, v, c) for n, v, c in lines if isinstance(v, (int, float)) and v > 0]


def _throughput_points(result: dict) -> list[tuple[int, float]]:
    sms = result.get("sms") or {}
    pts = [(e["value"], e["records_per_s"]) for e in _get(sms, "sweeps", "partitions") or []
           if isinstance(e, dict) and e.get("records_per_s")]
    if not pts:
        rate = _get(sms, "reference", "ingest", "records_per_s")
        parts = _get(result, "parameters", "reference", "partitions") or _get(sms, "reference", "config", "partitions")
        if rate and parts:
            pts = [(parts, rate)]
    return sorted(pts)


def throughput_chart(result: dict, path: str) -> str:
    pts = _throughput_points(result)
    ref = _get(result, "parameters", "reference") or {}
    fig, ax = plt.subplots(figsize=(8, 5))
    if pts:
        xs, ys = zip(*pts)
        ax.plot(xs, ys, "o-", color="tab:blue", lw=2, label="SMS ingest (dedup on, RF %s, %s)"
                % (ref.get("replication", "?"), ref.get("persistence", "?")))
        for x, y in pts:
            ax.annotate(f"{y:,.0f}", (x, y), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs])
    else:
        ax.text(0.5, 0.5, "no SMS ingest figure", transform=ax.transAxes, ha="center")
    for name, value, color in _baseline_rates(result):
        ax.axhline(value, ls="--", lw=1, color=color, label=f"{name}: {value:,.0f}")
    ax.set_yscale("log")
    ax.set_xlabel("partitions")
    ax.set_ylabel("records/s (log)")
    ax.set_title(f"Ingest throughput vs partitions ({result.get('mode', '?')} run; "
                 f"{ref.get('size', '?')} B records, batches of {ref.get('batch', '?')}, "
                 f"{ref.get('producers', '?')} producers)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency_chart(result: dict, path: str) -> str:
    ref = _get(result, "sms", "reference") or {}
    acks = ref.get("ack_latency") if isinstance(ref.get("ack_latency"), list) else []
    acks = sorted((a for a in acks if _get(a, "latency", "count")), key=lambda a: a["fraction_of_max"])
    fig, ax = plt.subplots(figsize=(8, 5))
    if acks:
        xs = [100 * a["fraction_of_max"] for a in acks]
        for q, style, label in (("p50_ms", "o-", "p50"), ("p99_ms", "s-", "p99"), ("p999_ms", "^-", "p99.9")):
            ax.plot(xs, [a["latency"][q] for a in acks], style, lw=2, label=f"SMS batch ack {label}")
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x:.0f}%\n{a['offered_records_per_s']:,} rec/s" for x, a in zip(xs, acks)],
                           fontsize=8)
    else:
        ax.text(0.5, 0.5, "no SMS ack latency figure", transform=ax.transAxes, ha="center")
    e2e = ref.get("end_to_end_latency") or {}
    if _get(e2e, "latency", "count") and e2e.get("fraction_of_max") is not None:
        x = 100 * e2e["fraction_of_max"]
        ax.plot([x, x], [e2e["latency"]["p50_ms"], e2e["latency"]["p99_ms"]], "D", color="tab:cyan",
                label=f"SMS end-to-end p50 / p99 ({e2e['offered_records_per_s']:,} rec/s)")
    b = result.get("baselines") or {}
    for name, lat, color in (("Redis Streams", _get(b, "redis_streams", "batch_ack_latency"), "tab:red"),
                             ("NATS R1", _get(b, "nats_js", "r1", "batch_ack_latency"), "tab:olive"),
                             ("NATS R3", _get(b, "nats_js", "r3", "batch_ack_latency"), "tab:green")):
        p99 = _get(lat, "latency", "p99_ms")
        if p99:
            frac = 100 * (lat.get("fraction_of_max") or 0.5)
            ax.axhline(p99, ls="--", lw=1, color=color,
                       label=f"{name} batch ack p99 at {frac:.0f}% of its max "
                             f"({lat.get('offered_per_s', 0) * lat.get('records_per_call', 1):,.0f} rec/s): {p99} ms")
            ax.plot([frac], [p99], "x", color=color)
    ax.set_yscale("log")
    ax.set_xlabel("offered load (% of the measured max)")
    ax.set_ylabel("latency, ms (log)")
    ax.set_title(f"Ack latency vs offered load ({result.get('mode', '?')} run; open loop, one call = one batch)",
                 fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def charts(result: dict, out_dir: str) -> list[str]:
    """Draws every chart of `result` into `out_dir`; returns the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    return [throughput_chart(result, os.path.join(out_dir, "throughput_vs_partitions.png")),
            latency_chart(result, os.path.join(out_dir, "latency_vs_load.png"))]


def main() -> None:
    import argparse
    import json
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("result", nargs="?", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                             "results", "latest.json"))
    p.add_argument("--out", default=None, help="default: the result's directory")
    a = p.parse_args()
    with open(a.result) as f:
        result = json.load(f)
    for path in charts(result, a.out or os.path.dirname(os.path.abspath(a.result))):
        print(path)


if __name__ == "__main__":
    main()
