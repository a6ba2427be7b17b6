"""Deleting what an archive holds for partitions and streams that are gone.

The archiver of a partition (its chain's tail) applies the archive's retention while the
partition has a chain. These cover the rest: a closed partition dropped by the control
leader once retention emptied it (control/repartition.py), and a deleted stream
(control/admin.py). Both delete the files first and then the index, in the background,
and only log a failure: a store that is down then keeps files no index names, which
`sms` never reads again (they are under the stream's creation time) and which an
operator may delete by that prefix.
"""

from __future__ import annotations

import asyncio
import logging

from archive import fragment
from sms.objectstore import open_store
from metastore import MetaStore, MetaStoreError, NoNodeError
from sms import metadata
from sms.errors import SmsError
from sms.metadata import StreamConfig

log = logging.getLogger(__name__)


async def drop_partitions(meta: MetaStore, config: StreamConfig, ordinals: list[int]) -> None:
    for ordinal in ordinals:
        prefix = fragment.partition_prefix(config.name, config.created_ms, ordinal)
        try:
            count = await asyncio.to_thread(open_store(config.archive).delete_prefix, prefix)
            await meta.delete(metadata.archive_path(config.name, ordinal), recursive=True)
        except NoNodeError:
            pass
        except (SmsError, MetaStoreError) as e:       # (logged; the files stay, unread)
            log.warning("%s p%04d: deleting its archive under %s failed: %s", config.name, ordinal, prefix, e)
        else:
            log.info("%s p%04d: its archive (%d files) deleted with the partition", config.name, ordinal, count)


async def drop_stream(config: StreamConfig) -> None:
    """The deleted stream's fragments (its index went with its metadata)."""
    prefix = f"{config.name}/{config.created_ms}/"
    try:
        count = await asyncio.to_thread(open_store(config.archive).delete_prefix, prefix)
    except SmsError as e:
        log.warning("stream %s: deleting its archive under %s%s failed: %s", config.name, config.archive, prefix, e)
    else:
        log.info("stream %s: its archive (%d files) deleted", config.name, count)
