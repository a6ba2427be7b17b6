"""Every limit of the system, in one place.

Queues, batches, in-flight windows, sizes and timeouts are named constants here, with
the unit last in the name. Other modules import them; nothing else hard-codes a bound.
The asserts at the bottom state how the limits must relate to each other.
"""

# --- records and requests (Kinesis-shaped) -------------------------------------------
RECORD_DATA_BYTES_MAX = 1024 * 1024            # data of one record
PARTITION_KEY_CHARS_MIN = 1
PARTITION_KEY_CHARS_MAX = 256
HASH_KEY_MAX = (1 << 128) - 1                  # explicit hash keys are 0..2^128-1
PUT_RECORDS_COUNT_MAX = 500                    # records in one PutRecords request
PUT_RECORDS_BYTES_MAX = 5 * 1024 * 1024        # data + keys in one PutRecords request
STREAM_NAME_CHARS_MAX = 128
STREAM_PARTITIONS_MAX = 1024                   # partitions of one stream at creation
REPLICATION_FACTOR_MAX = 5                     # chains of length 1..5
RETENTION_HOURS_MIN = 1
RETENTION_HOURS_MAX = 24 * 365
RETENTION_HOURS_DEFAULT = 24

# --- reads ---------------------------------------------------------------------------
GET_RECORDS_COUNT_MAX = 10_000                 # max_records of one GetNextRecords
GET_RECORDS_BYTES_MAX = 10 * 1024 * 1024       # soft cap on one GetNextRecords answer
GET_RECORDS_WAIT_MS_MAX = 20_000               # longest long-poll of one GetNextRecords
ITERATOR_TTL_S = 300                           # iterator tokens expire after 5 minutes
ITERATOR_TOKEN_CHARS_MAX = 1024                # longer tokens are rejected unparsed

# --- batches on the write path --------------------------------------------------------
BATCH_RECORDS_MAX = 10_000                     # records in one chain batch
BATCH_BYTES_MAX = 8 * 1024 * 1024              # encoded bytes of one chain batch
INGEST_PENDING_RECORDS_MAX = 50_000            # records queued per partition before
                                               # PutRecords answers RESOURCE_EXHAUSTED
APPEND_INFLIGHT_BATCHES_MAX = 8                # ingestion -> head batches in flight
CHAIN_INFLIGHT_BATCHES_MAX = 16                # batches in flight on one chain link
STORAGE_WRITE_QUEUE_MAX = 256                  # appends waiting for a node's writer
STORAGE_GROUP_COMMIT_BATCHES_MAX = 64          # batches folded into one LMDB txn
APPEND_TIMEOUT_S = 10.0                        # ingestion gives up on a batch after this
PUT_TIMEOUT_S = 30.0                           # client gives up on a put after this
GRPC_MESSAGE_BYTES_MAX = 32 * 1024 * 1024

# --- storage -------------------------------------------------------------------------
LMDB_MAP_BYTES = 64 * 1024 * 1024 * 1024       # address space reserved per LMDB env
LMDB_MAX_READERS = 512
TRIM_BATCHES_PER_TXN_MAX = 1000                # deletions per LMDB txn when trimming
STORAGE_READ_BATCHES_MAX = 1000                # stored batches visited by one read

# --- metadata store ------------------------------------------------------------------
METASTORE_VALUE_BYTES_MAX = 1024 * 1024
METASTORE_MAP_BYTES = 1024 * 1024 * 1024       # LMDB map of the embedded store file
METASTORE_SESSION_TTL_S = 3.0                  # an ephemeral entry outlives its owner so long
METASTORE_HEARTBEAT_INTERVAL_S = 0.5           # renewal period of an embedded session
METASTORE_POLL_INTERVAL_S = 0.05               # embedded store: watch poll period
METASTORE_WATCHES_MAX = 10_000                 # live watches per store client

# --- cluster processes -----------------------------------------------------------------
NODE_START_TIMEOUT_S = 30.0                    # `sms up` waits this long for a node
NODE_STOP_TIMEOUT_S = 10.0                     # SIGTERM, then SIGKILL after this
PARENT_CHECK_INTERVAL_S = 0.5                  # a launched node notices its launcher died
CONFIG_REFRESH_INTERVAL_S = 1.0                # nodes re-read chain configs at least so often
RPC_TIMEOUT_S = 10.0                           # unary RPCs between processes
LINK_RETRY_INTERVAL_S = 0.2                    # a broken chain link reconnects after this
CLIENT_REDIRECT_RETRIES_MAX = 8                # re-routes of one put before giving up
CLIENT_UNAVAILABLE_RETRIES_MAX = 20

assert PARTITION_KEY_CHARS_MIN <= PARTITION_KEY_CHARS_MAX
assert RECORD_DATA_BYTES_MAX <= PUT_RECORDS_BYTES_MAX <= BATCH_BYTES_MAX
assert BATCH_BYTES_MAX < GRPC_MESSAGE_BYTES_MAX
assert GET_RECORDS_BYTES_MAX + BATCH_BYTES_MAX < GRPC_MESSAGE_BYTES_MAX
assert PUT_RECORDS_COUNT_MAX <= BATCH_RECORDS_MAX <= GET_RECORDS_COUNT_MAX
assert METASTORE_HEARTBEAT_INTERVAL_S * 3 <= METASTORE_SESSION_TTL_S
assert METASTORE_POLL_INTERVAL_S < METASTORE_HEARTBEAT_INTERVAL_S
