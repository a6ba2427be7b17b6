"""What an operator tunes: a TOML file, environment overrides, each value checked.

The constants in sms/limits.py are the defaults. A node process (`sms serve`, and the
nodes `sms up` starts) reads, each over the one before:

1. the defaults;
2. the TOML file named by `--config FILE`, else $SMS_CONFIG (none by default);
3. the environment: `SMS_<SECTION>_<KEY>`, e.g. SMS_STORAGE_SIZE_CAP_BYTES=10737418240;
4. for the addresses, and what identifies the node (`--node-id`, `--metastore`,
   `--data-dir`, `--roles`, the TLS files), the command line, when given.

Every value is checked when the process starts: an unknown key, a value of the wrong
type, or one out of range stops it with one line naming the key, the value and where it
came from (ConfigError). `sms config show [--config FILE]` prints what is in force and
where each value came from.

The TOML file:

    [storage]
    size_cap_bytes = 68719476736    # an LMDB environment grows to at most this

    [metastore]
    session_ttl_s = 3.0

    [timeouts]
    append_s = 10.0

    [node]
    id = "n1"                       # `sms serve` may take these from the file alone
    data_dir = "/var/lib/sms/n1"
    listen = "10.0.0.1:7401"
    metrics_listen = "10.0.0.1:9401"

    [log]
    format = "json"

    [archive]
    flush_s = 60.0
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass
from typing import Any

from node import logs
from sms import limits

ENV_CONFIG = "SMS_CONFIG"


class ConfigError(ValueError):
    """A setting that cannot be used: the message names it, its value and its source."""


@dataclass(frozen=True)
class Setting:
    key: str                      # "section.name"
    kind: type                    # int, float or str
    default: Any
    help: str
    limit: str = ""               # the sms/limits.py constant it sets, if any
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()

    @property
    def env(self) -> str:
        return "SMS_" + self.key.replace(".", "_").upper()


def _address_ok(value: str) -> bool:
    host, sep, port = value.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 <= int(port) <= 65535)


GiB = 1024 ** 3
SETTINGS: tuple[Setting, ...] = (
    Setting("storage.size_cap_bytes", int, limits.LMDB_MAP_BYTES,
            "an LMDB environment (one per persistence) grows to at most this; appends past it fail with "
            "StorageFull", "LMDB_MAP_BYTES", 64 * 1024 * 1024, 1024 * GiB),
    Setting("storage.write_queue_max", int, limits.STORAGE_WRITE_QUEUE_MAX,
            "appends waiting for a node's LMDB writer", "STORAGE_WRITE_QUEUE_MAX", 1, 100_000),
    Setting("storage.group_commit_batches_max", int, limits.STORAGE_GROUP_COMMIT_BATCHES_MAX,
            "stored batches folded into one LMDB write transaction (one fsync)", "STORAGE_GROUP_COMMIT_BATCHES_MAX",
            1, 4096),
    Setting("metastore.session_ttl_s", float, limits.METASTORE_SESSION_TTL_S,
            "a node's metadata session (its registration) outlives it so long: the failure detection time; "
            "the same on every node of a cluster", "METASTORE_SESSION_TTL_S",
            3 * limits.METASTORE_HEARTBEAT_INTERVAL_S, 60.0),
    Setting("timeouts.rpc_s", float, limits.RPC_TIMEOUT_S, "a call between nodes", "RPC_TIMEOUT_S", 0.5, 300.0),
    Setting("timeouts.append_s", float, limits.APPEND_TIMEOUT_S,
            "PutRecords answers Unavailable when its records are not committed within this", "APPEND_TIMEOUT_S",
            0.5, 300.0),
    Setting("timeouts.metadata_read_s", float, limits.METADATA_READ_WAIT_S,
            "a call waits so long for the metadata store, then answers Unavailable (default: the session TTL)",
            "METADATA_READ_WAIT_S", 0.5, 300.0),
    Setting("timeouts.repartition_s", float, limits.REPARTITION_WAIT_S,
            "a repartition returns, or times out, within this, on the control node (a client waits "
            "REPARTITION_WAIT_S + its own timeout)", "REPARTITION_WAIT_S", 5.0, 3600.0),
    Setting("timeouts.node_stop_s", float, limits.NODE_STOP_TIMEOUT_S,
            "a stopping node is killed after this", "NODE_STOP_TIMEOUT_S", 1.0, 600.0),
    Setting("ingestion.pending_records_max", int, limits.INGEST_PENDING_RECORDS_MAX,
            "records queued per partition before PutRecords is throttled", "INGEST_PENDING_RECORDS_MAX",
            limits.PUT_RECORDS_COUNT_MAX, 10_000_000),
    Setting("ingestion.pending_bytes_max", int, limits.INGEST_PENDING_BYTES_MAX,
            "bytes of records queued per partition before PutRecords is throttled", "INGEST_PENDING_BYTES_MAX",
            limits.PUT_RECORDS_BYTES_MAX, 64 * 1024 ** 3),
    Setting("kinesis.inflight_bytes_max", int, limits.KINESIS_INFLIGHT_BYTES_MAX,
            "request bodies the Kinesis endpoint serves at once (more wait, unread)", "KINESIS_INFLIGHT_BYTES_MAX",
            limits.KINESIS_REQUEST_BYTES_MAX, 64 * 1024 ** 3),
    Setting("queues.window_records_max", int, limits.QUEUE_WINDOW_RECORDS_MAX,
            "records of a queue's partition fetched and not done (available or in flight): its memory",
            "QUEUE_WINDOW_RECORDS_MAX", limits.QUEUE_RECEIVE_RECORDS_MAX, 10_000_000),
    Setting("queues.log_flush_ms", int, limits.QUEUE_LOG_FLUSH_MS,
            "a queue owner writes its changes to the queue's state log this often (an ack waits for it)",
            "QUEUE_LOG_FLUSH_MS", 1, 10_000),
    Setting("queues.snapshot_changes", int, limits.QUEUE_SNAPSHOT_CHANGES,
            "changes of a queue's partition between two snapshots in its state log (a new owner replays at "
            "most about this many)", "QUEUE_SNAPSHOT_CHANGES", 1, 100_000_000),
    Setting("queues.snapshot_interval_s", float, limits.QUEUE_SNAPSHOT_INTERVAL_S,
            "... or this long, when anything changed (keep it well under the stream's retention)",
            "QUEUE_SNAPSHOT_INTERVAL_S", 0.1, 86_400.0),
    Setting("channels.file_records_max", int, limits.CHANNEL_FILE_RECORDS_MAX,
            "records of one channel commit (a Parquet file, a table append) at most: a fuller buffer commits "
            "before its data_freshness_s", "CHANNEL_FILE_RECORDS_MAX", 1, 100_000_000),
    Setting("channels.file_bytes_max", int, limits.CHANNEL_FILE_BYTES_MAX,
            "... and bytes of data at most (a worker holds up to this per partition it delivers)",
            "CHANNEL_FILE_BYTES_MAX", 1024, 4 * GiB),
    Setting("channels.catalog_uri", str, "",
            "the Iceberg catalog of channels that name none: sqlite:////shared/path.db or an http(s):// REST "
            "catalog, the same on every node (default: sqlite under this node's data directory; `sms up`: the "
            "cluster's)", "CHANNEL_CATALOG_URI"),
    Setting("channels.warehouse", str, "",
            "... and its warehouse: file:///shared/dir or s3://bucket/prefix", "CHANNEL_WAREHOUSE"),
    Setting("channels.tenant_url_prefixes", str, "",
            "where the channels of tenants' keys may write (the nodes write with their own file system and "
            "credentials): comma-separated url prefixes such as s3://lake/tenants/; empty: tenants deliver into "
            "the cluster's catalog only (the cluster's admins anywhere)", "CHANNEL_TENANT_URL_PREFIXES"),
    Setting("retention.check_interval_s", float, limits.RETENTION_CHECK_INTERVAL_S,
            "nodes apply retention this often", "RETENTION_CHECK_INTERVAL_S", 0.1, 3600.0),
    Setting("replication.compression", str, limits.REPLICATION_COMPRESSION,
            "compress the replication streams this node opens to its successors: none or gzip (gRPC's; "
            "worth it between sites, not on a LAN)", "REPLICATION_COMPRESSION", choices=("none", "gzip")),
    Setting("replication.link_ack_timeout_s", float, limits.LINK_ACK_TIMEOUT_S,
            "a chain link whose other end owes an answer (or sent nothing) so long is reported unresponsive, and "
            "the chain manager takes one end out of the chain: the failure detection time of partial cuts and "
            "pauses; raise it where pauses of that length are normal", "LINK_ACK_TIMEOUT_S", 0.2, 60.0),
    Setting("replication.link_keepalive_interval_s", float, limits.LINK_KEEPALIVE_INTERVAL_S,
            "each end of a replication stream pings the other this often (less than half the link ack timeout)",
            "LINK_KEEPALIVE_INTERVAL_S", 0.01, 30.0),
    Setting("archive.check_interval_s", float, limits.ARCHIVE_CHECK_INTERVAL_S,
            "a storage node archives (and verifies, and expires) this often", "ARCHIVE_CHECK_INTERVAL_S", 0.1, 3600.0),
    Setting("archive.flush_s", float, limits.ARCHIVE_FLUSH_S,
            "a run of batches shorter than a fragment is archived once it waited this long past archive_after_s",
            "ARCHIVE_FLUSH_S", 0.0, 86400.0),
    Setting("archive.fragment_bytes_target", int, limits.ARCHIVE_FRAGMENT_RAW_BYTES_TARGET,
            "a fragment holds batches up to about this (before compression)", "ARCHIVE_FRAGMENT_RAW_BYTES_TARGET",
            64 * 1024, limits.ARCHIVE_FRAGMENT_RAW_BYTES_MAX),
    Setting("archive.verify_ahead_s", float, limits.ARCHIVE_VERIFY_AHEAD_S,
            "fragments are read back and checked this long before local copies of their records may go",
            "ARCHIVE_VERIFY_AHEAD_S", 0.0, 86400.0),
    Setting("archive.payload_grace_s", float, limits.PAYLOAD_GRACE_S,
            "a payload upload no record claimed is deleted after this", "PAYLOAD_GRACE_S", 1.0, 30 * 86400.0),
    Setting("archive.payload_gc_interval_s", float, limits.PAYLOAD_GC_INTERVAL_S,
            "a stream's payloads are looked at for deletion this often", "PAYLOAD_GC_INTERVAL_S", 0.1, 86400.0),
    Setting("archive.zstd_level", int, limits.ARCHIVE_ZSTD_LEVEL, "zstd's level for fragments (1 fast .. 19 small)",
            "ARCHIVE_ZSTD_LEVEL", 1, 19),
    Setting("archive.cache_bytes_max", int, limits.ARCHIVE_CACHE_BYTES_MAX,
            "decoded fragments a node keeps for readers of the archive", "ARCHIVE_CACHE_BYTES_MAX",
            16 * 1024 * 1024, 64 * GiB),
    Setting("metrics.scrape_timeout_s", float, limits.METRICS_SCRAPE_TIMEOUT_S,
            "a metrics scrape reads the node's state within this", "METRICS_SCRAPE_TIMEOUT_S", 0.1, 60.0),
    Setting("metrics.lag_refresh_s", float, limits.METRICS_LAG_REFRESH_S,
            "consumer lag (metadata reads) is computed at most this often per node; scrapes between reuse it",
            "METRICS_LAG_REFRESH_S", 0.5, 3600.0),
    Setting("encryption.master_key_file", str, "",
            "the cluster's master keys (JSON, mode 0600): they wrap encrypted streams' data keys; every node "
            "needs the same file (else $SMS_MASTER_KEY; `sms up` makes DIR/tls/master.key)"),
    Setting("node.id", str, "", "this node's id in the cluster, unique and stable (--node-id wins)"),
    Setting("node.roles", str, "storage,ingestion,retrieval", "comma-separated: control, storage, ingestion, "
                                                              "retrieval (--roles wins)"),
    Setting("node.data_dir", str, "", "this node's data directory (--data-dir wins)"),
    Setting("node.bootstrap_token_file", str, "", "the token of the cluster's first admin key, made an admin key once "
                                                  "in the cluster's life (`sms admin bootstrap`; "
                                                  "--bootstrap-token-file wins)"),
    Setting("metastore.url", str, "", "zk://host:port[,host:port...]/prefix, or embedded:///path/meta.lmdb "
                                      "(--metastore wins)"),
    Setting("tls.ca_file", str, "", "the cluster CA's certificate, PEM (--ca-file wins)"),
    Setting("tls.cert_file", str, "", "this node's certificate, PEM, from `sms certs issue --node ID` "
                                      "(--cert-file wins)"),
    Setting("tls.key_file", str, "", "this node's private key, PEM (--key-file wins)"),
    Setting("node.listen", str, "", "the client port, HOST:PORT (--listen wins)"),
    Setting("node.cluster_listen", str, "", "the cluster port of a TLS node, HOST:PORT (--cluster-listen wins)"),
    Setting("node.metrics_listen", str, "", "/metrics, HOST:PORT (--metrics-listen wins; default: the client "
                                            "port + METRICS_PORT_OFFSET, or any free port when it is 0)"),
    Setting("node.kinesis_listen", str, "", "the Kinesis Data Streams endpoint, HOST:PORT, or off (--kinesis-listen "
                                            "wins; default: the --listen host, any free port)"),
    Setting("log.level", str, "INFO", "DEBUG, INFO, WARNING or ERROR", choices=logs.LEVELS),
    Setting("log.format", str, "text", "text or json", choices=logs.FORMATS),
    Setting("log.file", str, "", "a file to log to, rotated (default: standard error)"),
    Setting("log.file_bytes_max", int, limits.LOG_FILE_BYTES_MAX, "a log file is rotated at this size",
            "LOG_FILE_BYTES_MAX", 64 * 1024, 100 * GiB),
    Setting("log.file_backups", int, limits.LOG_FILE_BACKUPS, "old log files kept (at least 1: with none, "
            "Python's rotation never rotates)", "LOG_FILE_BACKUPS", 1, 1000),
    Setting("log.audit_file", str, "", "the node's audit log (kernel/audit.py; default: audit.log in its --data-dir)"),
    Setting("log.audit_file_bytes_max", int, limits.AUDIT_FILE_BYTES_MAX, "the audit log is rotated at this size",
            "AUDIT_FILE_BYTES_MAX", 64 * 1024, 100 * GiB),
    Setting("log.audit_file_backups", int, limits.AUDIT_FILE_BACKUPS, "old audit log files kept (at least 1)",
            "AUDIT_FILE_BACKUPS", 1, 1000),
)
BY_KEY = {s.key: s for s in SETTINGS}
_LOG_ENV = {"log.level": logs.ENV_LEVEL, "log.format": logs.ENV_FORMAT, "log.file": logs.ENV_FILE}


@dataclass(frozen=True)
class Value:
    setting: Setting
    value: Any
    source: str                   # "default", "FILE", "$SMS_...", "--flag"


def _check(setting: Setting, raw: Any, source: str) -> Any:
    where = f"{setting.key} = {raw!r} (from {source})"
    kind = setting.kind
    if isinstance(raw, str) and kind is not str:      # (the environment's values are text)
        try:
            raw = kind(raw.strip().replace("_", ""))
        except ValueError:
            raise ConfigError(f"{where}: expected {'an integer' if kind is int else 'a number'}") from None
    if kind is float and isinstance(raw, int) and not isinstance(raw, bool):
        raw = float(raw)
    if not isinstance(raw, kind) or isinstance(raw, bool):
        raise ConfigError(f"{where}: expected {kind.__name__}")
    if kind is float and not math.isfinite(raw):
        raise ConfigError(f"{where}: expected a finite number")
    if kind is str:
        raw = raw.strip()
        if setting.choices:
            match = next((c for c in setting.choices if c.lower() == raw.lower()), None)
            if match is None:
                raise ConfigError(f"{where}: expected one of {', '.join(setting.choices)}")
            raw = match
        elif setting.key.endswith("listen") and raw and not _address_ok(raw) \
                and not (setting.key == "node.kinesis_listen" and raw == "off"):
            raise ConfigError(f"{where}: expected HOST:PORT")
        return raw
    if (setting.lo is not None and raw < setting.lo) or (setting.hi is not None and raw > setting.hi):
        bounds = f"{setting.lo:.0f}..{setting.hi:.0f}" if kind is int else f"{setting.lo:g}..{setting.hi:g}"
        raise ConfigError(f"{where}: expected {bounds}")
    return raw


def load(path: str | None = None, env=None, flags: dict[str, str] | None = None) -> dict[str, Value]:
    """Every setting's value in force, and its source; raises ConfigError."""
    env = os.environ if env is None else env
    path = path if path is not None else env.get(ENV_CONFIG, "")
    out = {s.key: Value(s, s.default, "default") for s in SETTINGS}
    if path:
        try:
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except OSError as e:
            raise ConfigError(f"cannot read the configuration {path!r}: {e.strerror or e}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
        for section, table in doc.items():
            if not isinstance(table, dict):
                raise ConfigError(f"{path}: {section!r} is not a [section]; sections: "
                                  f"{', '.join(sorted({k.split('.')[0] for k in BY_KEY}))}")
            for name, raw in table.items():
                setting = BY_KEY.get(f"{section}.{name}")
                if setting is None:
                    known = sorted(k for k in BY_KEY if k.startswith(section + "."))
                    raise ConfigError(f"{path}: unknown setting {section}.{name}"
                                      + (f"; [{section}] has {', '.join(known)}" if known else
                                         f"; sections: {', '.join(sorted({k.split('.')[0] for k in BY_KEY}))}"))
                out[setting.key] = Value(setting, _check(setting, raw, path), path)
    for setting in SETTINGS:
        names = [setting.env] + ([_LOG_ENV[setting.key]] if setting.key in _LOG_ENV else [])
        for name in names:
            if env.get(name, "").strip():
                out[setting.key] = Value(setting, _check(setting, env[name], f"${name}"), f"${name}")
                break
    for key, (flag, raw) in (flags or {}).items():
        if raw:
            out[key] = Value(BY_KEY[key], _check(BY_KEY[key], raw, flag), flag)
    ack, keepalive = out["replication.link_ack_timeout_s"], out["replication.link_keepalive_interval_s"]
    if not 2 * keepalive.value < ack.value:
        raise ConfigError(f"replication.link_keepalive_interval_s = {keepalive.value} (from {keepalive.source}) must "
                          f"be less than half replication.link_ack_timeout_s = {ack.value} (from {ack.source})")
    ttl = out["metastore.session_ttl_s"]
    if ttl.source != "default" and out["timeouts.metadata_read_s"].source == "default":
        out["timeouts.metadata_read_s"] = Value(BY_KEY["timeouts.metadata_read_s"], ttl.value,
                                                f"metastore.session_ttl_s ({ttl.source})")
    return out


# `sms serve`: the settings its command line may leave to the configuration (the flag, the
# attribute of its arguments), and those it cannot run without
SERVE_FLAGS = {"node.id": ("--node-id", "node_id"), "node.roles": ("--roles", "roles"),
               "node.data_dir": ("--data-dir", "data_dir"), "metastore.url": ("--metastore", "metastore"),
               "node.bootstrap_token_file": ("--bootstrap-token-file", "bootstrap_token_file"),
               "tls.ca_file": ("--ca-file", "ca_file"), "tls.cert_file": ("--cert-file", "cert_file"),
               "tls.key_file": ("--key-file", "key_file")}
SERVE_REQUIRED = ("node.id", "metastore.url", "node.data_dir")


def serve_args(args, env=None) -> None:
    """Fill in what `sms serve`'s command line (`args`) leaves out from its configuration
    (--config FILE, else $SMS_CONFIG, and the environment): a node may run from its file
    alone (`sms serve --config /etc/sms/storage.toml`). The flags win. ConfigError when
    the node id, the metastore or the data directory is nowhere."""
    flags = {key: (flag, getattr(args, attr, None)) for key, (flag, attr) in SERVE_FLAGS.items()}
    values = load(getattr(args, "config", None), env=env, flags=flags)
    for key, (_flag, attr) in SERVE_FLAGS.items():
        setattr(args, attr, values[key].value or None)
    missing = [f"{SERVE_FLAGS[k][0]} (or {k} in the configuration)" for k in SERVE_REQUIRED if not values[k].value]
    if missing:
        raise ConfigError(f"no {', no '.join(missing)}")


# the settings this process applied (`apply`): a node answers them to `sms config show --node`
APPLIED: dict[str, Value] = {}


def apply(values: dict[str, Value]) -> None:
    """Set the sms/limits.py constants in force (at a process's start, before the node's
    modules use them), and the log settings' environment (node/logs.py reads it)."""
    APPLIED.clear()
    APPLIED.update(values)
    for v in values.values():
        if v.setting.limit:
            setattr(limits, v.setting.limit, v.value)
    ttl = values["metastore.session_ttl_s"].value
    limits.CLIENT_LEADER_WAIT_S = 4 * ttl              # (derived in sms/limits.py)
    bad = limits.broken()
    if bad:
        raise ConfigError("the configuration breaks how limits must relate (sms/limits.py): " + "; ".join(bad))
    for key, name in _LOG_ENV.items():
        if values[key].source != "default":
            os.environ[name] = str(values[key].value)


def show(values: dict[str, Value]) -> list[dict]:
    """What `sms config show` prints: each setting, its value, where it came from."""
    return [{"key": v.setting.key, "value": v.value, "source": v.source, "env": v.setting.env,
             "limit": v.setting.limit, "help": v.setting.help} for v in values.values()]
