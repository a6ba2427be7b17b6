"""Every limit of the system, in one place.

Queues, batches, in-flight windows, sizes and timeouts are named constants here, with
the unit last in the name. Other modules import them; nothing else hard-codes a bound.
`relation(...)` lines state how limits must relate to each other: each is checked when
this module loads (an `invariant`, which `python -O` keeps), and again by `broken()` after
the configuration overrode some (node/config.py refuses a configuration that breaks one).
"""

from sms.errors import invariant

RELATIONS: list[str] = []          # each a Python expression over this module's names


def relation(expression: str) -> None:
    """How limits must relate: `expression` holds now, and is kept for `broken()`."""
    RELATIONS.append(expression)
    invariant(eval(expression, globals()), f"the limits break {expression}")


def broken() -> list[str]:
    """The relations the limits in force break (after configuration overrides)."""
    return [expression for expression in RELATIONS if not eval(expression, globals())]


# --- records and requests (Kinesis-shaped) -------------------------------------------
RECORD_DATA_BYTES_MAX = 1024 * 1024            # data of one record
PARTITION_KEY_CHARS_MIN = 1
PARTITION_KEY_CHARS_MAX = 256
HASH_CACHE_KEYS_MAX = 65_536                  # partition keys whose hash a process remembers (sms/hashing.py)
HASH_KEY_MAX = (1 << 128) - 1                  # explicit hash keys are 0..2^128-1
PUT_RECORDS_COUNT_MAX = 500                    # records in one PutRecords request
PUT_RECORDS_BYTES_MAX = 5 * 1024 * 1024        # data + keys + headers in one PutRecords request
RECORD_HEADERS_MAX = 16                        # named attributes (headers) of one record
RECORD_HEADER_NAME_BYTES_MAX = 64              # a header's name: 1..64 bytes of UTF-8
RECORD_HEADERS_BYTES_MAX = 4096                # names + values of one record's headers
STREAM_NAME_CHARS_MAX = 128
STREAM_PARTITIONS_MAX = 1024                   # open partitions of one stream, at creation and after
REPARTITIONS_PER_DAY_MAX = 100                 # splits + merges of one stream in a rolling day
MAP_ENTRIES_MAX = 8 * STREAM_PARTITIONS_MAX    # entries (open + closed) in one stream's map
REPLICATION_FACTOR_MAX = 5                     # chains of length 1..5
RETENTION_HOURS_MIN = 1
RETENTION_HOURS_MAX = 24 * 365
RETENTION_HOURS_DEFAULT = 24
RETENTION_S_MIN = 10                           # update_retention(seconds=...) for short-lived streams
STREAM_TAGS_MAX = 50                           # tags of one stream (as Kinesis)
STREAM_TAG_KEY_CHARS_MAX = 128                 # a tag's key: 1..128 characters (as Kinesis)
STREAM_TAG_VALUE_CHARS_MAX = 256               # a tag's value: 0..256 characters (as Kinesis)
STREAM_SHARD_METRICS_MAX = 16                  # names of shard-level metrics a stream keeps (Kinesis has 7)
STREAM_SHARD_METRIC_CHARS_MAX = 64             # ... each of at most this many letters

# --- repartitioning and retention (control/repartition.py, storage/service.py) ----------
REPARTITION_DRAIN_TIMEOUT_S = 30.0             # a sealed head must commit all it holds in this
REPARTITION_POLL_INTERVAL_S = 0.02             # the driver re-checks a sealed head this often
REPARTITION_WAIT_S = 120.0                     # repartition_stream returns (or times out) within
REPARTITION_HISTORY_MAX = REPARTITIONS_PER_DAY_MAX   # recent repartition times kept per stream
RETENTION_CHECK_INTERVAL_S = 1.0               # storage nodes and control apply retention this often
RETENTION_REPLICAS_PER_S = 1_000               # ... a node with more replicas looks at this many a second
CONSUMERS_PER_STREAM_MAX = 64                  # registered consumers that protect unread records
AUTO_SPLIT_SAMPLE_INTERVAL_S = 1.0             # the chain manager samples write rates this often
AUTO_SPLIT_PERIOD_S_DEFAULT = 30               # a rate must stay above the threshold so long
AUTO_SPLIT_PERIOD_S_MIN = 2

# --- reads ---------------------------------------------------------------------------
GET_RECORDS_COUNT_MAX = 10_000                 # max_records of one GetNextRecords
GET_RECORDS_BYTES_MAX = 10 * 1024 * 1024       # soft cap on one GetNextRecords answer
GET_RECORDS_WAIT_MS_MAX = 20_000               # longest long-poll of one GetNextRecords
ITERATOR_TTL_S = 300                           # iterator tokens expire after 5 minutes
ITERATOR_TOKEN_CHARS_MAX = 1024                # longer tokens are rejected unparsed
SUBSCRIBE_SESSION_S = 300.0                    # a Subscribe stream ends after this; the client resumes
SUBSCRIBE_HEARTBEAT_S = 5.0                    # an empty event at least this often while nothing commits
SUBSCRIBE_EMPTY_PAGE_PAUSE_S = 0.05            # a Subscribe loop that found nothing without waiting pauses so long
SUBSCRIBE_RECORDS_MAX_DEFAULT = 1000           # records per Subscribe event unless the client asks

# --- batches on the write path --------------------------------------------------------
BATCH_RECORDS_MAX = 10_000                     # records in one chain batch
BATCH_BYTES_MAX = 8 * 1024 * 1024              # encoded bytes of one chain batch
INGEST_PENDING_RECORDS_MAX = 50_000            # records queued per partition before
                                               # PutRecords answers RESOURCE_EXHAUSTED
INGEST_PENDING_BYTES_MAX = 64 * 1024 * 1024    # ... and their bytes (Throttled beyond; one chunk always goes)
APPEND_INFLIGHT_BATCHES_MAX = 1                # ingestion -> head batches in flight per partition: the
                                               # next batch fills while one commits (docs/performance.md)
CHAIN_INFLIGHT_BATCHES_MAX = 16                # batches in flight on one chain link
CHAIN_INFLIGHT_BYTES_MAX = 32 * 1024 * 1024    # and their bytes (one batch always goes: storage/link.py)
REPLICA_RECENT_BATCHES_MAX = CHAIN_INFLIGHT_BATCHES_MAX * 4   # newest batches a replica keeps in memory
REPLICA_RECENT_BYTES_MAX = 16 * 1024 * 1024    # ... and their bytes (older ones are read from the log)
relation("BATCH_BYTES_MAX <= REPLICA_RECENT_BYTES_MAX")
LINK_INFLIGHT_BYTES_MAX = 64 * 1024 * 1024     # batch bytes in flight on one node's stream to a successor
                                               # node, all its chains together (storage/peerlink.py)
LINK_FRAME_BYTES_MAX = 4 * 1024 * 1024         # link messages sent as one frame of that stream (one item
                                               # always goes, so a frame is at most this plus one batch)
STORAGE_WRITE_QUEUE_MAX = 256                  # appends waiting for a node's writer
STORAGE_GROUP_COMMIT_BATCHES_MAX = 64          # batches folded into one LMDB txn
STORAGE_FULL_FREE_BYTES = 16 * 1024 * 1024      # an LMDB I/O error with less room than this: the disk is full
APPEND_TIMEOUT_S = 10.0                        # PutRecords answers Unavailable after this
HEAD_ORIGIN_BATCHES_MAX = 64                   # recent batches per writer a head remembers
HEAD_ORIGINS_MAX = 64                          # writers per partition a head remembers
PUT_TIMEOUT_S = 30.0                           # client gives up on a put after this
GRPC_MESSAGE_BYTES_MAX = 32 * 1024 * 1024
ERROR_MESSAGE_CHARS_MAX = 1000                  # an error's text as a caller gets it (gRPC's metadata holds 16 KiB,
                                                # percent-encoded: an echoed hostile value must not overflow it)

# --- storage -------------------------------------------------------------------------
LMDB_MAP_BYTES = 64 * 1024 * 1024 * 1024       # address space reserved per LMDB env
LMDB_MAX_READERS = 512
TRIM_BATCHES_PER_TXN_MAX = 1000                # deletions per LMDB txn when trimming
STORAGE_READ_BATCHES_MAX = 1000                # stored batches visited by one read

# --- process tuning ------------------------------------------------------------------
SERVER_GC_THRESHOLDS = (50_000, 20, 100)       # gc.set_threshold of servers (node/server.py)
LOG_FILE_BYTES_MAX = 50 * 1024 * 1024          # a node's log file (SMS_LOG_FILE; `sms up`) is rotated at this size
LOG_FILE_BACKUPS = 5                            # ... keeping so many old files (NODE.log.1 the newest)
AUDIT_FILE_BYTES_MAX = 20 * 1024 * 1024        # a node's audit log (kernel/audit.py) is rotated at this size
AUDIT_FILE_BACKUPS = 5                          # ... keeping so many old files (audit.log.1 the newest)
AUDIT_LINE_BYTES_MAX = 2048                     # one audit line (its detail, then its target, cut to fit)
AUDIT_READ_EVENTS_MAX = 10_000                  # audit lines one ReadAudit answers (`sms audit --limit`)
relation("AUDIT_READ_EVENTS_MAX * AUDIT_LINE_BYTES_MAX < GRPC_MESSAGE_BYTES_MAX")
METRICS_PORT_OFFSET = 1000                     # a node on port P serves /metrics on P + this unless told (7401: 8401)
METRICS_SCRAPE_TIMEOUT_S = 5.0                  # a metrics scrape reads the node's state within this (node/metrics.py)
METRICS_REQUEST_TIMEOUT_S = 10.0                # one HTTP(S) request to a node's metrics port (its TLS handshake too)
METRICS_LAG_REFRESH_S = 10.0                    # consumer lag (metadata reads) is computed at most this often per node

# --- metadata store ------------------------------------------------------------------
METASTORE_VALUE_BYTES_MAX = 1024 * 1024
METASTORE_MAP_BYTES = 1024 * 1024 * 1024       # LMDB map of the embedded store file
METASTORE_SESSION_TTL_S = 3.0                  # an ephemeral entry outlives its owner so long
METASTORE_HEARTBEAT_INTERVAL_S = 0.5           # renewal period of an embedded session
METASTORE_POLL_INTERVAL_S = 0.05               # embedded store: watch poll period
METASTORE_WAKE_INTERVAL_S = 0.01               # ... and this long after a write to its file woke it (inotify):
                                               # at most one scan per this, however many writes
relation("METASTORE_WAKE_INTERVAL_S < METASTORE_POLL_INTERVAL_S")
METASTORE_WATCHES_MAX = 10_000                 # live watches per store client

# --- cluster processes -----------------------------------------------------------------
NODE_START_TIMEOUT_S = 30.0                    # `sms up` waits this long for a node
NODE_STOP_TIMEOUT_S = 10.0                     # SIGTERM, then SIGKILL after this
PARENT_CHECK_INTERVAL_S = 0.5                  # a launched node notices its launcher died
CONFIG_REFRESH_INTERVAL_S = 1.0                # nodes re-read chain configs at least so often
VIEW_MISS_REFRESH_S = 0.2                     # a partition a cached map lacks is looked for in a map read this recently
RPC_TIMEOUT_S = 10.0                           # unary RPCs between processes
LINK_RETRY_INTERVAL_S = 0.2                    # a broken chain link reconnects after this
METADATA_READ_WAIT_S = METASTORE_SESSION_TTL_S      # client calls wait so long for metadata, then Unavailable
APPEND_RESEND_DELAY_S = 0.02                   # an append stream ended by a new epoch or a head handover resends after this
LINK_IDLE_CHECK_S = 10.0                       # an idle chain link looks at its state at least so often
LINK_RESET_TIMEOUT_S = 10.0                    # a link that sent a reset waits so long for its successor to end the stream
GRPC_STREAMS_PER_CONNECTION_MAX = 65_536        # a node's links to one peer share one connection: a stream each
PEER_RECONNECT_BACKOFF_MS_MAX = 1_000          # a peer's shared channel retries its connection at least so often
CLIENT_SHUN_S = 10.0                           # a node that failed a discovery call is asked last so long
CLIENT_REDIRECT_RETRIES_MAX = 8                # re-routes of one put before giving up
CLIENT_UNAVAILABLE_RETRIES_MAX = 20
READ_STREAM_PAGES_QUEUED_MAX = 16             # read_stream: pages fetched ahead of the caller
READ_STREAM_RETRIES_MAX = 10                  # read_stream: retriable failures in a row of one partition's read

# --- de-duplication (ingestion/dedup.py) ---------------------------------------------
DEDUP_WINDOW_MS_DEFAULT = 5 * 60 * 1000        # a stream's dedup window unless configured
DEDUP_WINDOW_MS_MIN = 60 * 1000
DEDUP_WINDOW_MS_MAX = 24 * 60 * 60 * 1000
DEDUP_CLOCK_SKEW_MS_MAX = 5_000                # submit_ms may run ahead of our clock so far
DEDUP_KEY_BYTES_MAX = 128
PRODUCER_ID_BYTES_MAX = 64
PRODUCER_EPOCH_SUFFIX_BYTES = 9                # a session of an epoch is named: the id, NUL, the epoch (8 bytes)
SESSION_KEY_BYTES_MAX = PRODUCER_ID_BYTES_MAX + PRODUCER_EPOCH_SUFFIX_BYTES + 4   # + the session's partition ordinal
DEDUP_SIGNATURE_BYTES_MAX = 32                 # computed by the ingestion node
SSSN_MAX = (1 << 64) - 1                       # SSSNs travel as 8 bytes
DEDUP_SESSIONS_PER_PARTITION_MAX = 1024        # producer sessions one table tracks
DEDUP_ENTRIES_PER_SESSION_MAX = 2 * PUT_RECORDS_COUNT_MAX   # un-pruned entries
DEDUP_KEYS_PER_PARTITION_MAX = 100_000         # dedup keys remembered within the window
DEDUP_WAITERS_PER_ENTRY_MAX = 16               # retries queued behind one pending write
DEDUP_MISSING_SSSNS_MAX = 100                  # SSSNs listed as missing in one answer
DEDUP_PRUNE_INTERVAL_MS = 1_000                # the service calls prune() this often

relation("DEDUP_CLOCK_SKEW_MS_MAX < DEDUP_WINDOW_MS_MIN <= DEDUP_WINDOW_MS_DEFAULT <= DEDUP_WINDOW_MS_MAX")
relation("DEDUP_PRUNE_INTERVAL_MS < DEDUP_WINDOW_MS_MIN")
relation("PUT_TIMEOUT_S * 1000 < DEDUP_WINDOW_MS_MIN")   # a client's retries fall inside the window
relation("DEDUP_KEY_BYTES_MAX < 256 and PRODUCER_ID_BYTES_MAX < 256")   # one wire meta value each
relation("PUT_RECORDS_COUNT_MAX <= DEDUP_ENTRIES_PER_SESSION_MAX")
relation("RECORD_HEADER_NAME_BYTES_MAX < 256 and RECORD_HEADERS_BYTES_MAX < 65_536 - 1")   # sms/wire.py's TLV lengths

# --- producers (sms/producer.py) ----------------------------------------------------
PRODUCER_LINGER_MS = 5                              # wait for more records this long
PRODUCER_LINGER_MS_MAX = 1_000
PRODUCER_PENDING_PER_PARTITION_MAX = 10_000         # un-settled records per partition
PRODUCER_PENDING_BYTES_MAX = 64 * 1024 * 1024       # un-settled keys+meta+data, all partitions
PRODUCER_RETRY_BACKOFF_MS = 50                      # first backoff of a session
PRODUCER_RETRY_BACKOFF_MS_CAP = 500                 # default: backoff doubles up to this (a failover takes a session TTL)
PRODUCER_RETRY_BACKOFF_MS_MAX = 10_000              # the largest backoff a producer may be configured with
PRODUCER_DELIVERY_TIMEOUT_S = 120.0                 # send() to settled, at most
PRODUCER_SYNC_HANDOFF_RECORDS_MAX = 5_000          # a SyncProducer's records sent by threads, not yet
PRODUCER_SYNC_HANDOFF_BYTES_MAX = 8 * 1024 * 1024  # taken by its loop: send() waits beyond either
PRODUCER_SYNC_WAIT_CHECK_S = 0.5                   # a send() waiting for room looks whether the loop still runs
PRODUCER_DEDUP_WINDOW_MARGIN_S = 10.0               # last resend this long before the
                                                    # stream's dedup window (plus clock skew) would reject it
PRODUCER_SESSION_WINDOW_MAX = DEDUP_ENTRIES_PER_SESSION_MAX   # SSSNs sent above
                                                    # the HWM; never more than the owner's table holds per session
PRODUCER_ID_RANDOM_BYTES = 16
PRODUCER_OWNER_CHECK_S = 0.15                       # a request unanswered so long looks for a new owner
                                                    # of its records, and again every so long
PRODUCER_EPOCH_MAX = (1 << 63) - 1                  # epochs travel as 8 bytes
PRODUCER_EPOCH_VERDICT_S = 1.0                      # an ingestion node trusts an epoch it checked so long; so
                                                    # InitProducer of an id opened before answers after this
PRODUCER_EPOCHS_CACHED_MAX = 100_000                # (stream, producer id) epochs one ingestion node remembers
METASTORE_CAS_ATTEMPTS_MAX = 16                     # read-check-write rounds of one conditional update

relation("PARTITION_KEY_CHARS_MIN <= PARTITION_KEY_CHARS_MAX")
relation("RECORD_DATA_BYTES_MAX <= PUT_RECORDS_BYTES_MAX <= BATCH_BYTES_MAX")
relation("BATCH_BYTES_MAX < GRPC_MESSAGE_BYTES_MAX")
relation("BATCH_BYTES_MAX <= CHAIN_INFLIGHT_BYTES_MAX <= LINK_INFLIGHT_BYTES_MAX")
relation("LINK_FRAME_BYTES_MAX + BATCH_BYTES_MAX + 64 * 1024 < GRPC_MESSAGE_BYTES_MAX")
relation("GET_RECORDS_BYTES_MAX + BATCH_BYTES_MAX < GRPC_MESSAGE_BYTES_MAX")
relation("PUT_RECORDS_COUNT_MAX <= BATCH_RECORDS_MAX <= GET_RECORDS_COUNT_MAX")
relation("APPEND_INFLIGHT_BATCHES_MAX < HEAD_ORIGIN_BATCHES_MAX")   # every resendable batch is remembered
relation("METASTORE_HEARTBEAT_INTERVAL_S * 3 <= METASTORE_SESSION_TTL_S")
relation("METASTORE_POLL_INTERVAL_S < METASTORE_HEARTBEAT_INTERVAL_S")

# --- chain manager (control/chains.py, control/manager.py) ---------------------------
CHAIN_MANAGER_INTERVAL_S = 0.25                # the leader re-checks chains so often while learners copy
CHAIN_MANAGER_IDLE_ROUND_S = 5.0               # and at least so often when nothing changes
CHAIN_CONFIGS_FULL_READ_S = 30.0               # chain configs are read again so often even without a change
CHAIN_HISTORY_MAX = 16                         # changes kept in a chain config
CHAINS_NOTE_IDS_MAX = 2_048                    # chain ids one /chains change note names (more: read all)
LEARNER_PROMOTE_LAG_RECORDS = 5_000            # a learner joins as tail once this close
LEARNERS_PER_NODE_MAX = 8                      # chains one node copies at a time
REBALANCE_MOVES_MAX = 8                        # replica moves under way at once, cluster-wide
REBALANCE_IMBALANCE_MIN = 2                    # a replica moves only from a node holding this many more
HEAD_IMBALANCE_MIN = 2                         # a head role moves only from a node heading this many more
HANDOFF_TIMEOUT_MS = 5_000                     # a head handoff not ready in this time is called off
HANDOFF_POLL_S = 0.05                          # the chain manager looks so often while a head handoff waits
REBALANCE_SETTLE_MS = 10_000                   # a chain changed more recently is not moved for balance
DORMANT_LOG_KEEP_S = 120.0                     # a removed replica's log is kept so long for a rejoin
CHAIN_RESTORE_WAIT_MS = 10_000                 # every member of a chain failed (a whole-cluster restart): the
                                               # members back wait so long for the others, then go on without them
DORMANT_CHECK_INTERVAL_S = 10.0                # a node looks for logs to drop so often when no config changes
# failure detection faster than the metadata session (control/detector.py): a node whose link
# to a peer breaks probes the peer's port; a refused connection (nothing listens: the process
# is gone) is reported under /suspects, and the chain manager removes the peer from its chains
# once its own probes are refused too. A paused or cut-off node does not refuse (the kernel
# still accepts, or nothing answers): it is left to the session TTL, so a GC pause never
# removes a healthy node.
FAILURE_PROBE_TIMEOUT_S = 0.25                 # one TCP connect to a suspect's port
FAILURE_PROBE_ATTEMPTS = 2                     # the chain manager's refused probes before it acts
FAILURE_PROBE_INTERVAL_S = 0.05                # between those probes
SUSPECT_PROBE_INTERVAL_S = 0.1                 # a node probes one peer at most this often
SUSPECT_PROBE_ATTEMPTS = 6                     # probes of one suspicion, until one is refused: a killed
SUSPECT_PROBE_RETRY_S = 0.1                    # process's connections can end before its listening socket
SUSPECT_REPORT_INTERVAL_S = 1.0                # and reports it (refused) at most this often
SUSPECTS_MAX = 1_000                           # reports the chain manager looks at per round
# link liveness (storage/link.py): a successor owes an answer (to a hello, or an ack of batches in
# flight) within LINK_ACK_TIMEOUT_S, and each end of a replication stream hears from the other at
# least that often (the predecessor pings every LINK_KEEPALIVE_INTERVAL_S, the successor answers);
# else the link is reported unresponsive and the chain manager takes one end out of the chain
LINK_ACK_TIMEOUT_S = 0.4
LINK_KEEPALIVE_INTERVAL_S = 0.1
LINK_BATCH_ACK_TIMEOUT_S = 2.0                 # batches in flight unacked so long break the link, however
                                               # lively the successor's stream (a stuck disk): a slow store is
                                               # not silence, which the keepalive finds within LINK_ACK_TIMEOUT_S
LINK_STALE_RETRY_S = 0.05                      # a hello refused for its epoch (a node has yet to apply a new
                                               # chain config: a failover under way) is tried again after this
LINK_RECOVERY_GRACE_S = 0.15                   # both ends of a reported link answer the manager: it asks the
LINK_RECOVERY_POLL_S = 0.04                    # reporter (so often, so long) whether it heard the peer since
LINK_PROBE_TIMEOUT_S = 0.15                    # the chain manager's NodeStatus probe of a reported link's ends
PROBE_CHANNELS_MAX = 1_024                     # (on a channel the manager keeps to each node: no handshake)
LINK_REMOVAL_INTERVAL_S = 30.0                 # a node a link report took out of a chain stays out of it so
                                               # long, and that link removes nobody else from the chain meanwhile
relation("2 * LINK_KEEPALIVE_INTERVAL_S < LINK_ACK_TIMEOUT_S")
DISK_FAILED_REPORT_ATTEMPTS = 50               # a node whose disk failed tries so often to say so
CONTROL_ELECTION_RETRY_S = 0.2                 # a standby control node retries the leader entry
CLIENT_LEADER_WAIT_S = 4 * METASTORE_SESSION_TTL_S   # admin calls wait so long for a new control leader

# --- stream processing (sps/) ---------------------------------------------------------
GROUPS_PER_STREAM_MAX = 64                     # consumer groups of one stream (control/groups.py)
GROUP_MEMBERS_MAX = 256                        # members of one group
GROUP_MEMBER_CHARS_MAX = 128                   # a member id
GROUP_ENTRY_BYTES_MAX = 4096                   # one lease or member entry
CONSUMER_FAILOVER_S_DEFAULT = 10.0             # a member's lease not renewed for so long is taken
CONSUMER_FAILOVER_S_MIN = 1.0
CONSUMER_BATCHES_QUEUED_MAX = 8                # batches read ahead per consumer, over its partitions
CONSUMER_RELEASE_WAIT_S = 5.0                  # a stopping member releases its leases within this
CONSUMER_STALE_FRACTION = 0.8                  # a lease not renewed for this part of failover_s: stop reading it
CONSUMER_CATCHUP_ROUND_S = 0.2                 # a member below its share looks for released leases so often
                                               # (for at most failover_s; else every failover_s / 3)
GROUP_MEMBER_STALE_S = 3600.0                  # a member entry not written for so long (wall clock) is removed
CLI_GROUP_READ_IDLE_S = 1.5                    # `sms read --group` without --follow stops after so long idle
SPS_FAILOVER_S_DEFAULT = 10.0                  # a lease not renewed for so long is taken
SPS_FAILOVER_S_MIN = 1.0
SPS_LEASES_TAKEN_PER_ROUND_MAX = 4             # claims of one worker in one balancing round
SPS_CHECKPOINT_RECORDS_DEFAULT = 1000          # a checkpoint every N records ...
SPS_CHECKPOINT_INTERVAL_S_DEFAULT = 5.0        # ... or T seconds, whichever comes first
SPS_CHECKPOINT_INTERVAL_S_MAX = 30.0           # well inside the dedup window: replays are recognised
SPS_OUTPUTS_PER_BATCH_MAX = 1 << 16            # output records of one batch (SSSN = batch << 16 | index)
SPS_BATCH_RECORDS_MAX = 10_000                 # input records of one batch
SPS_FILTER_HEADERS_MAX = 16                    # header names in one output filter (a record can carry fewer:
SPS_FILTER_VALUES_MAX = 100                    # `exists: false`); conditions on one name, or strings in one anything-but
SPS_WARM_UP_ROUNDS = 5                         # a Spark worker runs its operation on made-up batches so often,
SPS_WARM_UP_RECORDS = 5_000                    # ... of so many records, before it claims partitions
SPS_REPORT_S = 10.0                            # a worker logs its micro-batches' figures this often
SPS_MICRO_BATCH_GATHER_S = 0.05               # a micro-batch waits so long for partitions' reads about to be ready
SPS_MIN_BATCH_IDLE_MS = 500                    # a batch short of min_batch_records ends when no record came for so long
SPS_RECORD_ATTEMPTS_MAX = 3                    # a failing record is tried so often, then dead-lettered
SPS_RETRY_BACKOFF_S = 0.2                      # ... waiting this, doubled each time, between tries
SPS_APPLY_BUDGET_S = 20.0                      # retries and isolation of one batch's failures, at most
SPS_ERROR_CHARS_MAX = 500                      # an error kept in a lease or a dead letter
SPS_RECLAIM_BACKOFF_S = 1.0                    # a partition whose processing failed is claimed again
SPS_RECLAIM_BACKOFF_S_MAX = 60.0               # ... after this, doubled per failure in a row, up to this
SPS_PARTITION_REFRESH_S = 10.0                 # workers re-read the input partitions this often
SPS_OUTPUT_RETRY_DEADLINE_S = 60.0             # a batch's outputs must be acknowledged within this
SPS_STATE_ENTRIES_MAX = 1_000_000             # keyed-state entries of one input partition (a watermark bounds them)
SPS_STATE_KEY_COLUMNS_MAX = 8                  # columns of a state key
SPS_STATE_AGGREGATES_MAX = 16                  # aggregates of one stateful stage
SPS_STATE_COLUMN_CHARS_MAX = 128               # a key column's or aggregate's name
SPS_STATE_WINDOW_S_MAX = 7 * 24 * 3600         # an event-time window's size, or a watermark's delay
SPS_STATE_SNAPSHOT_EVERY_DEFAULT = 100         # batches of a partition between full snapshots in the changelog
SPS_STATE_SNAPSHOT_EVERY_MAX = 100_000
SPS_STATE_CHANGELOG_RECORD_BYTES = 256 * 1024  # one changelog record (a batch's changes come in parts of this)
SPS_STATE_HAND_DOWN_DEPTH_MAX = 64             # generations of partitions that ended unprocessed, passing state on
STAGES_PER_GRAPH_MAX = 64
SPARK_READ_WAIT_MS = 200                       # a Spark read task's long-poll for records not yet there
SPARK_READ_STALL_S_MAX = 60.0                  # ... and how long its replica may stay behind the batch's end
relation("SPS_CHECKPOINT_INTERVAL_S_MAX * 1000 < DEDUP_WINDOW_MS_MIN")
relation("(SPS_CHECKPOINT_INTERVAL_S_MAX + SPS_APPLY_BUDGET_S) * 1000 < DEDUP_WINDOW_MS_MIN")

# credentials (control/auth.py): keys checked on every call to a TLS node's client port
KEY_CACHE_TTL_S = 1.0                          # a node re-reads a key so often: a revoked key stops within it
REVOCATION_REFRESH_S = 1.0                     # a node re-reads the revoked certificates so often
REVOKED_CERTS_MAX = 10_000
KEY_STALE_MAX_S = 30.0                         # a node cut off from the metadata store still takes a key
                                               # it confirmed this recently (a revoked one too, meanwhile)
AUTH_CACHE_ENTRIES_MAX = 10_000                # verdicts on tokens a node keeps (then it starts afresh)
AUTH_TOKEN_CHARS_MAX = 256                     # a longer credential is malformed
KEY_STREAMS_MAX = 1_000                        # streams one key may be limited to
KEY_NAME_CHARS_MAX = 200                       # a key's free-text name

# encryption at rest (kernel/encryption.py)
ENCRYPTION_CONFIG_REFRESH_S = 5.0               # a node re-reads a stream's encryption setting and data key so often
ENCRYPTION_STREAMS_CACHED_MAX = 10_000          # streams whose data keys a node keeps unwrapped (then it starts afresh)
KEYS_LISTED_MAX = 10_000                       # keys `sms key list` shows
TENANT_NAME_CHARS_MAX = 32                     # [a-z0-9-]
TENANTS_MAX = 10_000
KEYS_PER_TENANT_MAX = 1_000
TENANT_WRITE_RECORDS_PER_S_MAX = 100_000_000
TENANT_BYTES_PER_S_MAX = 100 << 30
TENANT_STREAMS_MAX = 100_000                   # the largest streams_max a tenant may be given
TENANT_PARTITIONS_MAX = 1_000_000              # ... partitions_max
TENANT_LIMITS_REFRESH_S = 1.0                  # an ingestion node re-reads a tenant's limits so often

# per-partition limits (sms/ratelimit.py; StreamConfig.write_records_per_s and the others)
PARTITION_WRITE_RECORDS_PER_S_MAX = 10_000_000     # a larger limit is a mistake, refused
PARTITION_BYTES_PER_S_MAX = 10 << 30               # 10 GiB/s
PARTITION_LIMIT_BURST_S = 1.0                      # a partition may take this many seconds' worth at once
READ_BUCKETS_MAX = 100_000                         # partitions a node keeps read buckets of (then afresh)
READ_THROTTLE_WAIT_S_MAX = 5.0                     # a read over its limit waits at most this long, then
                                                   # answers Throttled

# --- the CLI ---
CLI_CONNECT_TIMEOUT_S = 1.0                    # a client command first connects (TCP) to the cluster's address;
                                               # none accepting within this: "no cluster answers" (exit 1)

# --- sms up's supervision ---
NODE_RESTARTS_MAX = 5                          # `sms up` restarts a node that died at most this often ...
NODE_RESTART_WINDOW_S = 300.0                  # ... within this window; past that it stays down (logged once)
NODE_SUPERVISE_POLL_S = 0.5                    # `sms up` looks for nodes that exited this often
UP_WATCH_INTERVAL_S = 2.0                      # `sms up` looks at drains and chains short of replicas this often
relation("NODE_SUPERVISE_POLL_S < NODE_START_TIMEOUT_S < NODE_RESTART_WINDOW_S")

# --- the archive tier (archive/; issue 18) ---
ARCHIVE_URL_CHARS_MAX = 1024                   # a stream's archive url (file:///path or s3://bucket/prefix)
ARCHIVE_NAME_CHARS_MAX = 512                   # an object's name in a fragment store (relative path)
ARCHIVE_S3_KEY_BYTES_MAX = 1024                # S3's own bound on a key: the url's prefix + "/" + a name
ARCHIVE_S3_DELETE_BATCH_MAX = 1000             # keys in one S3 DeleteObjects call (S3's own bound)
ARCHIVE_STORE_CONNECT_TIMEOUT_S = 5.0          # an S3 store's client connects within this ...
ARCHIVE_STORE_READ_TIMEOUT_S = 30.0            # ... and waits this long for bytes of an answer
ARCHIVE_STORE_RETRY_ATTEMPTS = 3               # retries (after the first try) of one S3 call, boto3's standard mode
ARCHIVE_STORE_PUT_ATTEMPTS = 3                 # a file store's put retries a directory pruned under it so often
relation("ARCHIVE_NAME_CHARS_MAX < ARCHIVE_S3_KEY_BYTES_MAX")
# writing (storage/archiver.py): a partition's chain tail archives its old batches
ARCHIVE_AFTER_S_DEFAULT = 3600                 # committed records older than this go to the archive (archive_after_s)
LOCAL_RETENTION_S_DEFAULT = 24 * 3600          # replicas keep records so long, once archived (local_retention_s)
ARCHIVE_CHECK_INTERVAL_S = 1.0                 # an archiver pass over the partitions this node is the tail of
ARCHIVE_FLUSH_S = 60.0                         # a run shorter than a fragment is written once it waited this long
ARCHIVE_FRAGMENT_RAW_BYTES_TARGET = 8 << 20    # a fragment holds batches up to about this (before compression)
ARCHIVE_FRAGMENT_RAW_BYTES_MAX = 64 << 20      # a fragment read claiming more than twice this is corrupt
ARCHIVE_FRAGMENT_BATCHES_MAX = 4096            # batches in one fragment
ARCHIVE_FRAGMENTS_PER_PASS = 8                 # fragments one partition writes in one pass
ARCHIVE_WRITE_THREADS = 2                      # threads encoding and putting fragments, per node
ARCHIVE_ZSTD_LEVEL = 3                         # zstd's level for fragments (its default: fast; 5.6x on JSON clicks)
ARCHIVE_VERIFY_AHEAD_S = 10.0                   # fragments are read back this long before local copies may go
ARCHIVE_VERIFY_PER_PASS = 8                    # fragments one partition verifies in one pass
ARCHIVE_EXPIRE_PER_PASS = 100                  # fragments (and orphan files) one partition deletes in one pass
ARCHIVE_ORPHAN_SCAN_S = 600.0                  # a partition's store listing is scanned for orphans this often
ARCHIVE_CONFIG_REFRESH_S = 5.0                 # the archiver reads a stream's settings again at most this often
ARCHIVE_STORE_CALL_TIMEOUT_S = 120.0           # one store call (a fragment put, get, list) of the archiver
ARCHIVE_RETRY_S_MAX = 30.0                     # a failed archive step is retried with backoff up to this
# reading (archive/reader.py): retrieval below the local trim point
ARCHIVE_READ_THREADS = 4                       # threads fetching and decoding fragments, per node
ARCHIVE_CACHE_BYTES_MAX = 128 << 20            # decoded fragments a node keeps for readers (least recent out)
ARCHIVE_PREFETCH_FRAGMENTS = 2                 # a read of fragment k fetches the next ones meanwhile
ARCHIVE_PREFETCH_TASKS_MAX = 16                # prefetches in flight per node
ARCHIVE_INDEX_REFRESH_S = 0.5                  # a partition's fragment list is read again at most this often
ARCHIVE_INDEXES_MAX = 10_000                   # partitions whose fragment lists a node keeps
relation("ARCHIVE_FRAGMENT_RAW_BYTES_TARGET <= ARCHIVE_FRAGMENT_RAW_BYTES_MAX")
relation("ARCHIVE_CACHE_BYTES_MAX >= (ARCHIVE_PREFETCH_FRAGMENTS + 2) * 2 * ARCHIVE_FRAGMENT_RAW_BYTES_TARGET")
# payloads by reference (sms/payloads.py): records over RECORD_DATA_BYTES_MAX, kept in the archive store
PAYLOAD_CHUNK_BYTES = 4 << 20                  # a payload is uploaded and read in chunks of this
PAYLOAD_BYTES_MAX = 5 << 30                    # the largest payload a record may carry by reference
PAYLOAD_GRACE_S = 3600.0                       # an upload never claimed for a record is deleted after this
PAYLOAD_INLINE_READ_BYTES_MAX = 64 << 20       # readers get payloads up to this in Record.data; larger ones
                                               # stay references (Record.payload; open_payload streams them)
PAYLOAD_INLINE_PAGE_BYTES_MAX = 256 << 20      # payloads read into one page's records at most; the rest next page
PAYLOAD_GC_INTERVAL_S = 60.0                   # a stream's archiver looks for payloads to delete this often
relation("RECORD_DATA_BYTES_MAX < PAYLOAD_CHUNK_BYTES <= PAYLOAD_INLINE_READ_BYTES_MAX "
         "<= PAYLOAD_INLINE_PAGE_BYTES_MAX")
relation("PAYLOAD_INLINE_READ_BYTES_MAX <= PAYLOAD_BYTES_MAX")
# replication traffic (storage/peerlink.py): "none", or "gzip" (gRPC's own message compression)
REPLICATION_COMPRESSION = "none"

# --- the producer's (sms/producer.py) -------------------------------------------------------
# A record's last resend reaches the owner before the default dedup window forgets its first.
relation("(PRODUCER_DELIVERY_TIMEOUT_S + PRODUCER_DEDUP_WINDOW_MARGIN_S) * 1000 + DEDUP_CLOCK_SKEW_MS_MAX "
         "< DEDUP_WINDOW_MS_DEFAULT")
# Even the shortest window leaves a record some time to be delivered.
relation("PRODUCER_DEDUP_WINDOW_MARGIN_S * 1000 + DEDUP_CLOCK_SKEW_MS_MAX < DEDUP_WINDOW_MS_MIN")
# One full request fits in a session's window; the owner's table never refuses the lowest SSSN.
relation("PUT_RECORDS_COUNT_MAX <= PRODUCER_SESSION_WINDOW_MAX <= DEDUP_ENTRIES_PER_SESSION_MAX")
relation("RECORD_DATA_BYTES_MAX < PRODUCER_PENDING_BYTES_MAX")
relation("RECORD_DATA_BYTES_MAX < PRODUCER_SYNC_HANDOFF_BYTES_MAX")
relation("PRODUCER_RETRY_BACKOFF_MS <= PRODUCER_RETRY_BACKOFF_MS_CAP <= PRODUCER_RETRY_BACKOFF_MS_MAX")
relation("0 < PRODUCER_ID_RANDOM_BYTES <= PRODUCER_ID_BYTES_MAX")

# --- moved here from the modules that use them (issue 31: every limit in one place) ---------
# metastore/zookeeper/
ZK_CONNECT_TIMEOUT_S = 15.0          # start(): the first session is up within this
ZK_OPERATION_TIMEOUT_S = 30.0        # one operation, reconnect waits included
ZK_NEW_SESSION_WAIT_S = 5.0          # SessionExpiredError waits this for the fresh one
ZK_RECONNECT_DELAY_S = 0.05          # first delay between connection attempts...
ZK_RECONNECT_DELAY_MAX_S = 0.5       # ...doubling up to this, well inside the TTL
ZK_RETRY_DELAY_S = 0.02              # before an operation's retry after a reconnect
ZK_RETRIES_MAX = 100                 # optimistic rounds of one operation
ZK_MULTI_OPS_MAX = 1000              # ops in one multi of a recursive delete
ZK_JUTE_MAXBUFFER_BYTES = 8 * 1024 * 1024   # servers must run with at least this
ZK_REQUEST_BYTES_MAX = ZK_JUTE_MAXBUFFER_BYTES - 64 * 1024   # one commit, estimated
ZK_OP_OVERHEAD_BYTES = 64            # per op of a multi, for the estimate
# metastore/embedded.py (a path is an LMDB key there, at most 511 bytes with the session's id)
METASTORE_PATH_BYTES_MAX = 400                 # UTF-8 bytes of one path, embedded store
# node/console.py
CONSOLE_STATE_TIMEOUT_S = 5.0      # gathering /api/state on the event loop, at most
CONSOLE_STATE_REUSE_S = 1.0        # a state this young is answered again (several viewers, one gathering)
CONSOLE_STREAMS_MAX = 200          # streams shown (by name); the state says when there are more
CONSOLE_CHANNELS_MAX = 200         # channels shown (by name), likewise
CONSOLE_CHANGES_MAX = 50           # recent chain changes listed for the cluster
CONSOLE_NODE_CHANGES_MAX = 10      # ... and for each node
# node/cli/
NODE_DRAIN_WAIT_S = 600.0                # `sms node drain --wait` gives up after this
NODE_DRAIN_POLL_S = 1.0                  # ... and looks again this often
CLI_FOLLOW_WAIT_MS = 200                 # `sms read --follow` waits so long for records on each partition in turn
CLI_GROUP_READ_WAIT_MS = 1000            # `sms read --group` waits so long for records
REPARTITION_PHASE_POLL_S = 0.5      # how often a repartition shown in progress reads the stream's phase
# storage/head.py
HEAD_COMMIT_POLL_S = 0.5      # an ack's wait re-checks that its replica is still active this often
# ingestion/partition.py
DEDUP_REBUILD_TIMEOUT_S = 30.0      # a partition answers Unavailable until its table is rebuilt
# control/admin.py
STREAM_READY_POLL_FIRST_S = 0.005       # CreateStream asks the members again this soon, then twice as late each time
STREAM_READY_TIMEOUT_S = 30.0            # CreateStream answers once every chain member holds its replica, or fails
# sms/aio/
CLIENT_REDIRECT_BACKOFF_S = 0.05         # a client sent elsewhere (a new leader, owner) waits this before it retries
# sms/partition_map.py
PARTITION_MAP_INDEXES_CACHED_MAX = 256   # partition maps whose lookup index a process keeps
# node/backup.py
EXPORT_PAGE_RECORDS = 10_000          # records per read while exporting
EXPORT_EMPTY_WAIT_MS = 500            # an empty page is read again, waiting so long for records
EXPORT_CLOSED_WAIT_S = 60.0           # a partition must be read to its end (open: its commit point) within this
EXPORT_PARTITIONS_CONCURRENT = 16     # partitions an export reads at once
SPARK_WORKER_PYTHON_CHECK_S = 30.0    # spark_sps.register: the chosen worker interpreter imports the package within
# node/certs.py
CA_VALID_DAYS = 3650                   # the CA's validity
CERT_VALID_DAYS = 825                  # a node's or client's certificate (the CA/Browser Forum's old cap)
CERT_RENEW_BEFORE_DAYS = 30           # `sms up` issues a node certificate anew this long before it expires
# node/launcher.py
NODE_STACK_DUMP_WAIT_S = 0.5          # a hung node writes its stacks to its log in this time, then is killed
UP_STREAMS_NAMED_MAX = 8              # streams `sms up` names in its line about replicas
# node/server.py
TASK_STACK_FRAMES_MAX = 12         # frames of each asyncio task in a SIGUSR1 dump
# control/revocation.py
REVOCATION_REASON_CHARS_MAX = 200        # the reason given for a revoked certificate
# kinesis/ (the Kinesis Data Streams endpoint)
SIGV4_CLOCK_SKEW_S = 300                 # a signed request's time may differ from the server's by this (as Kinesis)
SIGV4_AUTHORIZATION_CHARS_MAX = 4096     # an Authorization header longer than this is refused
SIGV4_SIGNED_HEADERS_MAX = 64            # signed header names in one request
# a Kinesis request body: PutRecords' PUT_RECORDS_BYTES_MAX of data, base64 (4/3), with its JSON around it
KINESIS_REQUEST_BYTES_MAX = PUT_RECORDS_BYTES_MAX * 4 // 3 + 1024 * 1024
KEY_DELEGATION_TTL_S = 60                # a token for calls made on a key's behalf (the Kinesis endpoint's) lives so long
KINESIS_REPLICATION_FACTOR_DEFAULT = 3   # CreateStream's chains: this many replicas, or every storage node if fewer
KINESIS_ON_DEMAND_SHARDS = 4             # an ON_DEMAND stream starts with this many shards (as Kinesis)
KINESIS_DESCRIBE_SHARDS_MAX = 100        # DescribeStream's shards per page without a Limit (as Kinesis)
KINESIS_LIST_STREAMS_MAX = 100           # ListStreams' names per page without a Limit
KINESIS_LIST_SHARDS_MAX = 1000           # ListShards' shards per page without MaxResults (as Kinesis)
KINESIS_GET_RECORDS_DEFAULT = 10_000     # GetRecords' records without a Limit (as Kinesis)
KINESIS_LISTEN_BACKLOG = 512             # connections waiting to be accepted by the endpoint
KINESIS_KEEPALIVE_S = 60                 # an idle HTTP connection to the endpoint is closed after this
KINESIS_HEADER_BYTES_MAX = 64 * 1024     # a request's line and headers
KINESIS_GRACEFUL_S = 5                   # requests under way when a node stops get this long to finish
KINESIS_ACCOUNT_ID = "000000000000"      # the account of the cluster's ARNs (StreamARN, ConsumerARN)
KINESIS_NESTING_MAX = 32                 # a request's values nested deeper are refused (SerializationException)
KINESIS_TAGS_PER_CALL_MAX = 10           # AddTagsToStream / TagResource: tags in one call (as Kinesis)
KINESIS_STREAM_ID_SCAN_INTERVAL_S = 1.0  # an endpoint scans the streams for an unknown StreamId at most this often
KINESIS_STREAM_IDS_CACHED_MAX = 10_000   # StreamId -> name pairs an endpoint remembers
KINESIS_CONSUMERS_MAX = 20               # registered consumers per stream (as Kinesis)
KINESIS_LIST_CONSUMERS_MAX = 100         # ListStreamConsumers' consumers per page without MaxResults
KINESIS_SUBSCRIPTION_TAKEOVER_S = 5       # a second SubscribeToShard of a consumer and shard is refused so
                                         # long after the first's start, then takes over (as Kinesis)
KINESIS_SUBSCRIPTION_S = 300             # a SubscribeToShard call streams this long, then ends (as Kinesis)
KINESIS_ON_DEMAND_SPLIT_RECORDS_PER_S = 1000   # an ON_DEMAND stream splits a shard that takes more (a Kinesis shard's write limit)
KINESIS_INFLIGHT_BYTES_MAX = 32 * 1024 * 1024   # request bodies an endpoint serves at once (more wait unread)
KINESIS_INFLIGHT_WAIT_S = 10.0           # ... for at most this, then answered 503 (the SDKs retry)
KINESIS_BODY_READ_S = 30.0               # a request's body must arrive within this (else 408, retried)
KINESIS_SEND_TIMEOUT_S = 30.0            # a SubscribeToShard event the client does not take within this ends it
relation("KINESIS_REQUEST_BYTES_MAX <= KINESIS_INFLIGHT_BYTES_MAX")
KINESIS_DRAIN_BYTES_MAX = 4 * KINESIS_REQUEST_BYTES_MAX   # an oversized body is read and dropped up to this, then cut

# --- queues: per-record delivery on a stream (queues/, docs/queues.md) ---------------------
QUEUE_RECEIVE_RECORDS_MAX = 10           # records one receive returns (as Kinesis and SQS)
QUEUE_WAIT_S_MAX = 20                    # a receive's long poll (as Kinesis and SQS)
QUEUE_VISIBILITY_S_DEFAULT = 30          # a queue's visibility timeout unless configured (as Kinesis)
QUEUE_VISIBILITY_S_MAX = 43_200          # 12 hours (as Kinesis and SQS)
QUEUE_MAX_RECEIVE_COUNT_DEFAULT = 6      # receives before a record becomes a dead letter (as Kinesis)
QUEUE_MAX_RECEIVE_COUNT_MAX = 1000
QUEUE_WINDOW_RECORDS_MAX = 20_000        # records of one partition fetched and not done (available or in
                                         # flight): a queue's memory per partition is bounded by it
QUEUE_DEAD_LETTERS_MAX = 10_000          # dead letters one partition keeps (more go round again)
QUEUE_HANDLE_CHARS_MAX = 1024            # a receipt handle (as the Kinesis model)
relation("QUEUE_RECEIVE_RECORDS_MAX <= QUEUE_WINDOW_RECORDS_MAX")
QUEUE_NAME_CHARS_MAX = 128               # (as the Kinesis model)
QUEUES_PER_STREAM_MAX = 20               # (Kinesis: a queue counts as one of a stream's 20 registered consumers)
QUEUES_MAX = 10_000                      # queues in a cluster (each is one metadata entry)
QUEUE_FETCH_RECORDS_MAX = 1000           # records one owner fetches into a partition's state at once
QUEUE_FETCH_WAIT_MS = 500                # ... long-polling the partition this long for new ones
QUEUE_WINDOW_BYTES_MAX = 16 * 1024 * 1024   # data of a partition's live records held for delivery
QUEUE_LOG_FLUSH_MS = 50                 # an owner writes changes no call waits for (receives under its lease) this often
QUEUE_LOG_CHANGES_MAX = 4096             # ... or as soon as this many are waiting
QUEUE_LOG_RECORD_BYTES_MAX = 512 * 1024  # one record of a state log
relation("QUEUE_LOG_RECORD_BYTES_MAX <= RECORD_DATA_BYTES_MAX")
QUEUE_SNAPSHOT_CHANGES = 50_000          # changes between two snapshots of a partition's state
QUEUE_SNAPSHOT_INTERVAL_S = 60           # ... or this long, when anything changed
QUEUE_OWNER_CHECK_S = 1.0                # a node looks this often for owners whose partition or queue left
QUEUE_POLL_INTERVAL_MS = 100             # a long-polling receive looks again at least this often
QUEUE_CONFIG_CACHE_S = 1.0               # a node re-reads a queue's settings at most this often
QUEUE_CLIENT_WAIT_SLICE_MS = 250         # a client's long poll over several owner nodes waits at each this long in turn
QUEUE_CLIENT_RETRY_S = 30.0              # a client sends a settle whose owner moved or did not answer again so long
QUEUE_CHECKPOINT_INTERVAL_S = 5.0        # a queue owner records its partition's checkpoint (retention) this often
QUEUE_LOG_PARTITIONS_MAX = 16            # partitions of a queue's state log (one per partition of its stream, up to this)
QUEUE_LOG_LINGER_MS = 5                  # ... a write a call waits for lingers this long for the calls behind it
QUEUE_OWNER_LEASE_S = 2.0                # a queue owner answers receives before their write for so long after a write
                                         # of its began; a new owner waits it out before it serves
relation("QUEUE_LOG_FLUSH_MS / 1000 < QUEUE_OWNER_LEASE_S")

# --- channels: a stream delivered into Parquet files or an Iceberg table (delivery/, docs/channels.md)
CHANNEL_NAME_CHARS_MAX = 128             # (as the Kinesis model)
CHANNELS_PER_STREAM_MAX = 20             # (each is one of the stream's registered consumers)
CHANNELS_MAX = 1000                      # channels in a cluster
CHANNEL_FRESHNESS_S_DEFAULT = 60         # a record reaches the destination within about this (Kinesis's default: 900)
CHANNEL_FRESHNESS_S_MIN = 1
CHANNEL_FRESHNESS_S_MAX = 900            # (as the Kinesis model)
CHANNEL_FILE_RECORDS_MAX = 1_000_000     # one commit (one Parquet file, one Iceberg append) holds at most this ...
CHANNEL_FILE_BYTES_MAX = 64 * 1024 * 1024   # ... and about this much data (held per partition delivered); a full buffer commits at once
CHANNEL_READ_RECORDS = 10_000            # a worker reads its partition this many records a page
CHANNEL_READ_WAIT_MS = 500               # ... long-polling this long when caught up
CHANNEL_CHECK_S = 1.0                    # a node looks this often for channel partitions whose head it is (or was)
CHANNEL_CONFIG_REFRESH_S = 10.0          # ... and reads the channels' settings again at most this often (made or deleted: at once)
CHANNEL_RETRY_S = 1.0                    # a worker whose destination or stream failed tries again after this ...
CHANNEL_RETRY_S_MAX = 30.0               # ... doubling up to this
CHANNEL_STATUS_INTERVAL_S = 1.0          # a worker records its partition's progress at most this often
CHANNEL_RESUME_PROBES_MAX = 10_000       # commits a worker finds in the destination beyond its recorded progress
CHANNEL_TEMPLATE_CHARS_MAX = 512         # a files destination's key template
CHANNEL_SCHEMA_COLUMNS_MAX = 256         # columns of a JSON channel's schema
CHANNEL_COMMIT_ATTEMPTS_MAX = 20         # an Iceberg commit that meets a concurrent one (another partition's) tries again this often
CHANNEL_CATALOG_URI = ""                 # the Iceberg catalog of channels that name none ("": under the node's data directory)
CHANNEL_WAREHOUSE = ""                   # ... its warehouse
CHANNEL_TENANT_URL_PREFIXES = ""         # where tenants' channels may write, comma-separated ("": only the cluster's catalog)
CHANNEL_STORE_TIMEOUT_S = 60.0           # one write to the destination (a file, a commit) gives up after this
