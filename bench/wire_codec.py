"""CPU per record of sms/wire.py's hot functions, the compiled implementation beside the
pure-Python reference, in this one process (no I/O). Prints one JSON document.

    .venv/bin/python -m bench.wire_codec [--records 500] [--size 100] [--repeats 200]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from sms import wire
from sms.records import encode_put


class _Stored:
    """A record as ingestion hands it to `stored_entries`."""

    __slots__ = ("key", "data", "producer_id", "sssn", "dedup_key", "session_ordinal", "headers")

    def __init__(self, key: bytes, data: bytes, sssn: int):
        self.key, self.data, self.producer_id, self.sssn = key, data, b"bench-producer", sssn
        self.dedup_key = self.session_ordinal = None
        self.headers = b""


def _us_per_record(fn, records: int, repeats: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return round((time.perf_counter() - t0) / repeats / records * 1e6, 4)


def measure(impl, records: int, size: int, repeats: int) -> dict:
    keys = [f"key-{i % 1000}".encode() for i in range(records)]
    data = os.urandom(size)
    blob = b"".join(wire.encode_session_entry(k, data, i, 1_700_000_000_000) for i, k in enumerate(keys))
    stored = [_Stored(k, data, i) for i, k in enumerate(keys)]
    body = impl.stored_entries(stored)
    unsequenced = wire.seal(records, 0, body, 1, 1)
    batch = wire.sequence(unsequenced, 1 << 100)
    puts = [(k.decode(), data) for k in keys]
    out = {
        "parse_put": _us_per_record(lambda: impl.parse_put(records, blob, b"bench-producer"), records, repeats),
        "stored_entries": _us_per_record(lambda: impl.stored_entries(stored), records, repeats),
        "check_framing": _us_per_record(lambda: impl.check_framing(unsequenced, records, wire.HEADER_BYTES),
                                        records, repeats),
        "decode_records": _us_per_record(lambda: impl.decode_records(batch, 0, records, 0), records, repeats),
        "session_fields": _us_per_record(lambda: impl.session_fields(batch, 0, records), records, repeats),
        "encode_puts": _us_per_record(lambda: impl.encode_puts(puts, encode_put), records, repeats),
        "columns": _us_per_record(lambda: impl.columns(batch, 0, records), records, repeats),
    }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=500)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args(argv)
    result = {"records_per_call": args.records, "record_bytes": args.size, "unit": "us per record",
              "python": sys.version.split()[0], "implementation_in_force": wire.IMPLEMENTATION,
              "reference": measure(wire.reference, args.records, args.size, max(1, args.repeats // 10))}
    if wire.compiled is not None:
        result["compiled"] = measure(wire.compiled, args.records, args.size, args.repeats)
        result["speedup"] = {k: round(result["reference"][k] / v, 1) if v else None
                             for k, v in result["compiled"].items()}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
