"""A node's Prometheus metrics that count events (prometheus_client), in one place.

Each is counted once per batch or call, never per record (STYLE: no per-record Python on a
server). What a node holds rather than does (replicas, de-dup tables, LMDB, peer links,
chains) is read when Prometheus scrapes, by node/metrics.py's collector. node/metrics.py
also serves them over HTTP(S); docs/operations.md lists them all, with alerts.

Labels: `stream` and `partition` (p0000) where a metric is per partition; `method` is a
gRPC method (`PutRecords`); `error` an error's name from sms/errors.py.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

# A registry of the node's own, not prometheus_client's default one: a process that imports
# server modules (kernel/rpc.py imports this one; an application never needs to: the client,
# sms/, imports no kernel module) must not add server metrics to its own /metrics. node/metrics.py serves this registry, with the process collectors.
REGISTRY = CollectorRegistry(auto_describe=True)

# (seconds: from a millisecond to the longest a call may wait, GET_RECORDS_WAIT_MS_MAX)
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_RECORD_BUCKETS = (1, 10, 50, 100, 500, 1_000, 5_000, 10_000, 50_000)

RPC_SECONDS = Histogram("sms_rpc_seconds", "Time a node took to answer a gRPC call, by method",
                        ["method"], buckets=LATENCY_BUCKETS_S, registry=REGISTRY)
RPC_ERRORS = Counter("sms_rpc_errors", "gRPC calls answered with an error, by method and error name",
                     ["method", "error"], registry=REGISTRY)

PUT_RECORDS = Counter("sms_put_records", "Records written and acknowledged (not duplicates), per partition",
                      ["stream", "partition"], registry=REGISTRY)
PUT_BYTES = Counter("sms_put_bytes", "Bytes of record data (and keys) written and acknowledged, per partition",
                    ["stream", "partition"], registry=REGISTRY)
PUT_DUPLICATES = Counter("sms_put_duplicates", "Records answered as duplicates by de-duplication", ["stream"], registry=REGISTRY)
PUT_RECORD_ERRORS = Counter("sms_put_record_errors",
                            "Records of a PutRecords call that failed on their own (throttled, partition closed...)",
                            ["stream", "error"], registry=REGISTRY)
PUT_BATCH_RECORDS = Histogram("sms_put_batch_records", "Records per PutRecords call", ["stream"],
                              buckets=BATCH_RECORD_BUCKETS, registry=REGISTRY)
COMMIT_SECONDS = Histogram("sms_commit_seconds",
                           "PutRecords from arrival to every record's outcome: replicated to the tail and "
                           "acknowledged", ["stream"], buckets=LATENCY_BUCKETS_S, registry=REGISTRY)

READ_RECORDS = Counter("sms_read_records", "Records returned to readers, per partition", ["stream", "partition"], registry=REGISTRY)
READ_BYTES = Counter("sms_read_bytes", "Bytes of stored batches read for readers, per partition",
                     ["stream", "partition"], registry=REGISTRY)

STORAGE_COMMIT_SECONDS = Histogram("sms_storage_commit_seconds",
                                   "One LMDB write transaction of a group of batches, its fsync included (not "
                                   "for persistence disk_async)", ["persistence"], buckets=LATENCY_BUCKETS_S, registry=REGISTRY)
STORAGE_COMMIT_BATCHES = Histogram("sms_storage_commit_batches", "Stored batches per LMDB write transaction",
                                   ["persistence"], buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=REGISTRY)

CHAIN_CHANGES = Counter("sms_chain_changes", "Chain membership changes made by the chain manager, by action",
                        ["action"], registry=REGISTRY)

# the archive tier (archive/): written by a partition's archiver (its chain's tail), read
# by retrieval below the local trim point
ARCHIVE_FRAGMENTS = Counter("sms_archive_fragments", "Fragments written to a stream's archive and indexed",
                            ["stream"], registry=REGISTRY)
ARCHIVE_WRITE_RECORDS = Counter("sms_archive_write_records", "Records written to a stream's archive",
                                ["stream"], registry=REGISTRY)
ARCHIVE_WRITE_BYTES = Counter("sms_archive_write_bytes",
                              "Bytes of fragments written to a stream's archive (after compression)",
                              ["stream"], registry=REGISTRY)
ARCHIVE_RAW_BYTES = Counter("sms_archive_raw_bytes", "Bytes of batches archived (before compression)",
                            ["stream"], registry=REGISTRY)
ARCHIVE_ERRORS = Counter("sms_archive_errors",
                         "Failed archive steps (write, verify, expire) by error name; each is retried",
                         ["stream", "step", "error"], registry=REGISTRY)
ARCHIVE_REPAIRS = Counter("sms_archive_repairs",
                          "Fragments found corrupt or missing by verification and rewritten from local data",
                          ["stream"], registry=REGISTRY)
ARCHIVE_EXPIRED = Counter("sms_archive_expired_fragments", "Fragments deleted by the archive's retention",
                          ["stream"], registry=REGISTRY)
ARCHIVE_READ_RECORDS = Counter("sms_archive_read_records", "Records returned to readers from the archive",
                               ["stream"], registry=REGISTRY)
ARCHIVE_READ_BYTES = Counter("sms_archive_read_bytes", "Bytes of archived batches returned to readers",
                             ["stream"], registry=REGISTRY)
ARCHIVE_FETCH_SECONDS = Histogram("sms_archive_fetch_seconds",
                                  "Fetching, decompressing and verifying one fragment for readers",
                                  buckets=LATENCY_BUCKETS_S, registry=REGISTRY)
ARCHIVE_CACHE = Counter("sms_archive_cache",
                        "Fragment lookups of readers: hit (cached), shared (being fetched), miss (fetched)",
                        ["result"], registry=REGISTRY)
PAYLOADS_DELETED = Counter("sms_payloads_deleted", "Payload uploads deleted: past retention, or never claimed by a "
                           "record within PAYLOAD_GRACE_S", ["stream"], registry=REGISTRY)
