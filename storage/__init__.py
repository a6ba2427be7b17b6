"""Storage nodes: LMDB partition logs and the chain-replication protocol."""
