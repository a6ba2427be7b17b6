"""The archive tier: fragment stores (sms/objectstore.py) hold a stream's old batches, as
fragment files and payload chunks, on a shared mount or an S3-compatible object store,
so that partitions keep their records beyond what the storage nodes' disks hold.
"""
