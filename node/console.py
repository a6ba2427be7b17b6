"""The web console of a control node: a read-only page of what the cluster holds -- nodes
with their chains, roles, epochs and chain changes; streams with their partitions drawn as
the lineage DAG; the partitions short of replicas (control/chains.py `under_replicated`);
consumer groups and SPS stages with their leases; channels with each partition's delivery
progress (control/channels.py: what the workers record in the metadata store) -- updated
live.

A WSGI application that node/metrics.py's HTTP(S) server hands every path but /metrics
(so the console has the metrics port's TLS: HTTPS with the node's certificate on a secure
cluster). `/` redirects to `/console/`; `/console/` serves the plain files of
node/console_static/ (no build step, nothing from the network); `/api/state` answers
JSON of everything the page shows, which the page polls.

The state belongs to the node's event loop (the cluster view, the metadata store): a
request gathers it there (`run_coroutine_threadsafe`) within limits.CONSOLE_STATE_TIMEOUT_S,
else it answers 503. A standby control node serves the console too, marked as standby.
Nothing here changes anything: only GET and HEAD are answered. With `keys` (a
control/auth.py KeyTable), /api/state wants a cluster admin's key, as
`Authorization: Bearer <token>` or `?token=<token>`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Callable

from control import auth, chains
from control.channels import from_bytes as channel_from_bytes, progress_from_bytes
from metastore import MetaStoreError, NoNodeError
from sms import metadata, seqno
from sms import limits
from sms.errors import SmsError
from sms.hashing import HASH_SPACE
from sms.leases import SHARD_END, Lease
from sms.metadata import ConsumerRecord
from sms.types import ChannelInfo, PartitionState, StreamInfo, partition_id

log = logging.getLogger(__name__)



STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "console_static")
STATIC_FILES = {"index.html": "text/html; charset=utf-8",
                "console.js": "text/javascript; charset=utf-8",
                "console.css": "text/css; charset=utf-8"}
SECURITY_HEADERS = [("X-Content-Type-Options", "nosniff"), ("X-Frame-Options", "DENY"),
                    ("Referrer-Policy", "no-referrer"),
                    ("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'")]


class Console:
    """The WSGI application. Called on the HTTP server's threads; reads the cluster on
    `loop`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, node_id: str, view, groups,
                 is_leader: Callable[[], bool], keys: auth.KeyTable | None = None):
        self.loop = loop
        self.node_id = node_id
        self.view = view                  # metastore.view.ClusterView
        self.groups = groups              # control.groups.Groups
        self.is_leader = is_leader
        self.keys = keys
        self._lock = threading.Lock()
        self._last: tuple[float, bytes] | None = None     # (monotonic time, the JSON answered)

    # --- HTTP -------------------------------------------------------------------------

    def __call__(self, environ, start_response):
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO", "") or "/"
        if method not in ("GET", "HEAD"):
            return _answer(start_response, "405 Method Not Allowed", b"the console is read-only\n",
                           "text/plain; charset=utf-8", [("Allow", "GET, HEAD")], method)
        if path in ("/", "/console"):
            return _answer(start_response, "302 Found", b"", "text/plain", [("Location", "/console/")], method)
        if path == "/api/state":
            return self._state(environ, start_response, method)
        if path.startswith("/console/"):
            name = path[len("/console/"):] or "index.html"
            if name in STATIC_FILES:          # (a fixed list: no path from the request reaches the disk)
                with open(os.path.join(STATIC_DIR, name), "rb") as f:
                    body = f.read()
                return _answer(start_response, "200 OK", body, STATIC_FILES[name], [("Cache-Control", "no-cache")],
                               method)
        return _answer(start_response, "404 Not Found", b"not found\n", "text/plain; charset=utf-8", [], method)

    def _state(self, environ, start_response, method: str):
        if self.keys is not None:
            refused = self._refusal(environ)
            if refused:
                return _json(start_response, "401 Unauthorized", {"error": refused}, method,
                             [("WWW-Authenticate", 'Bearer realm="sms console"')])
        with self._lock:                 # (one gathering at a time; the others take its answer)
            if self._last is None or time.monotonic() - self._last[0] > limits.CONSOLE_STATE_REUSE_S:
                try:
                    state = self._on_loop(self.snapshot())
                except Exception as e:           # noqa: BLE001 (the console never fails the node)
                    log.warning("console: the cluster's state could not be read: %s: %s", type(e).__name__, e)
                    return _json(start_response, "503 Service Unavailable",
                                 {"error": f"the state could not be read within {limits.CONSOLE_STATE_TIMEOUT_S} s "
                                           f"({type(e).__name__})"}, method)
                self._last = (time.monotonic(), json.dumps(state).encode())
            body = self._last[1]
        return _answer(start_response, "200 OK", body, "application/json", [("Cache-Control", "no-store")], method)

    def _refusal(self, environ) -> str:
        """Why the request may not read the state ("": it may)."""
        token = ""
        header = environ.get("HTTP_AUTHORIZATION", "")
        if header.startswith("Bearer "):
            token = header[len("Bearer "):].strip()
        if not token:
            token = urllib.parse.parse_qs(environ.get("QUERY_STRING", "")).get("token", [""])[0]
        if not token:
            return "the console wants a cluster admin's key: ?token=<token> or Authorization: Bearer <token>"
        try:
            principal = self._on_loop(self.keys.authenticate(token))
        except SmsError as e:
            return e.message
        except Exception as e:                   # noqa: BLE001 (a timeout: refuse, and say why)
            return f"the key could not be checked ({type(e).__name__})"
        if not principal.allows(auth.CLUSTER, None):
            return f"key {principal.key_id} is not a cluster admin's"
        return ""

    def _on_loop(self, coroutine):
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout=limits.CONSOLE_STATE_TIMEOUT_S)
        except BaseException:
            future.cancel()
            raise

    # --- the state (on the event loop) ---------------------------------------------------

    async def snapshot(self) -> dict:
        """Everything the page shows, as JSON-able values (SNs and hashes as strings: they
        exceed a JavaScript number)."""
        nodes = await self.view.nodes()
        names = sorted(await self.view.list_streams())
        streams, changes = [], []
        chains_of: dict[str, list] = defaultdict(list)
        for name in names[:limits.CONSOLE_STREAMS_MAX]:
            try:
                info = await self.view.describe_stream(name)
            except (SmsError, MetaStoreError):          # deleted meanwhile
                continue
            streams.append(await self._stream(info, nodes))
            await asyncio.sleep(0)          # (the node's other work runs between streams)
            for p in info.partitions:
                pid = partition_id(p.ordinal)
                for m in p.chain + p.learners:
                    chains_of[m.node_id].append({"stream": name, "partition": pid, "role": m.role,
                                                 "epoch": p.chain_epoch, "state": p.state.value})
                changes += [{"stream": name, "partition": pid, **c} for c in p.history]
        changes.sort(key=lambda c: (c["at_ms"], c["epoch"]), reverse=True)
        changes_of: dict[str, list] = defaultdict(list)       # (one pass, newest first)
        for c in changes:
            if len(changes_of[c["node"]]) < limits.CONSOLE_NODE_CHANGES_MAX:
                changes_of[c["node"]].append(c)
        node_list = []
        for node_id in sorted(set(nodes) | set(chains_of)):
            n = nodes.get(node_id)
            node_list.append({
                "node_id": node_id, "registered": n is not None,
                "address": n.address if n else "", "roles": list(n.roles) if n else [],
                "metrics_address": n.metrics_address if n else "", "started_ms": n.started_ms if n else 0,
                "chains": chains_of.get(node_id, []),
                "changes": changes_of.get(node_id, [])})
        short = [{"stream": s["name"], "partition": p["partition"], "live_members": p["live_members"],
                  "replication_factor": s["replication_factor"]}
                 for s in streams for p in s["partitions"] if p["under_replicated"]]
        channel_list, channels_total = await self._channels(nodes)
        return {"node": {"node_id": self.node_id, "leader": bool(self.is_leader()),
                         "leader_address": await self.view.control_address()},
                "generated_ms": int(time.time() * 1000),
                "nodes": node_list, "streams": streams, "changes": changes[:limits.CONSOLE_CHANGES_MAX],
                "under_replicated": short,
                "streams_total": len(names), "streams_shown": min(len(names), limits.CONSOLE_STREAMS_MAX),
                "channels": channel_list, "channels_total": channels_total}

    async def _channels(self, registered) -> tuple[list[dict], int]:
        """Each channel (by stored name, at most limits.CONSOLE_CHANNELS_MAX) with its partitions'
        progress as their workers last recorded it (delivery/worker.py), and how many
        channels there are."""
        store = self.view.store
        try:
            names = sorted(await store.children(metadata.CHANNELS))
        except NoNodeError:                             # (no channel made yet: no /channels)
            return [], 0
        out = []
        for name in names[:limits.CONSOLE_CHANNELS_MAX]:
            path = metadata.channel_path(name)
            try:
                entry = await store.get(path)
                if entry is None:
                    continue                            # deleted meanwhile
                channel = channel_from_bytes(entry.value)
                children = sorted(await store.children(path))
                progress = []
                for child in children:
                    raw = await store.get(f"{path}/{child}")
                    if raw is not None:
                        progress.append(progress_from_bytes(raw.value))
            except NoNodeError:                         # deleted meanwhile
                continue
            except (ValueError, KeyError, TypeError):   # (the server validates what it writes)
                continue
            out.append(_channel(channel, progress, registered))
            await asyncio.sleep(0)
        return out, len(names)

    async def _stream(self, info: StreamInfo, registered) -> dict:
        by_ordinal = {p.ordinal: p for p in info.partitions}
        rf = info.replication_factor
        partitions = [{
            "partition": partition_id(p.ordinal), "ordinal": p.ordinal, "state": p.state.value,
            "hash_lo": str(p.hash_lo), "hash_hi": str(p.hash_hi),
            "lo": p.hash_lo / HASH_SPACE, "hi": p.hash_hi / HASH_SPACE,
            "parents": [partition_id(o) for o in p.parents], "children": [partition_id(o) for o in p.children],
            "epoch": p.chain_epoch, "sealed": p.sealed,
            "chain": [{"node_id": m.node_id, "role": m.role} for m in p.chain],
            "learners": [m.node_id for m in p.learners],
            "live_members": sum(1 for m in p.chain if m.node_id in registered),
            "under_replicated": chains.under_replicated([m.node_id for m in p.chain], rf, registered),
            "valid_from_ms": p.valid_from_ms, "valid_to_ms": p.valid_to_ms,
            "ending_sn": None if p.ending_sn is None else str(p.ending_sn)} for p in info.partitions]
        groups = []
        try:
            group_names = await self.groups.list(info.name)
        except (SmsError, MetaStoreError):               # deleted meanwhile
            group_names = []
        for group in group_names:
            try:
                leases, members = await self.groups.state(info.name, group)
            except (SmsError, MetaStoreError):
                continue
            groups.append(_group(group, leases, members, by_ordinal))
        consumers = []
        for name in info.consumers:
            entry = await self.view.store.get(metadata.consumer_path(info.name, name))
            if entry is None:
                continue
            record = ConsumerRecord.from_bytes(entry.value)
            consumers.append({"consumer": name, "group": name in group_names,
                              "checkpoints": {partition_id(o): _sn_text(sn) for o, sn in record.checkpoints}})
        return {"name": info.name, "status": info.status.value, "replication_factor": rf,
                "persistence": info.persistence.value,
                "map_version": info.map_version, "created_ms": info.created_ms,
                "retention_s": info.retention_s, "protect_unread": info.protect_unread,
                "write_records_per_s_limit": info.write_records_per_s,
                "partitions": partitions, "groups": groups, "consumers": consumers}


def _group(name: str, leases: list, members: list, by_ordinal: dict) -> dict:
    """One consumer group (or SPS stage: a group named after the stage, on each of its
    input streams): its members and, per partition, its lease."""
    now_ms = int(time.time() * 1000)
    rows = []
    for key, value, version in sorted(leases, key=lambda e: int(e[0]) if e[0].isdigit() else -1):
        try:
            lease = Lease.from_bytes(value, version)
        except (ValueError, KeyError, TypeError):
            continue                                   # (the server validates what it writes)
        rows.append({"partition": partition_id(lease.ordinal), "owner": lease.owner,
                     "checkpoint": lease.checkpoint, "records": lease.records, "rate": lease.rate,
                     "lag_ms": _lag_ms(lease, by_ordinal.get(lease.ordinal)),
                     "failures": lease.failures, "dead_letters": lease.dead_letters,
                     "last_error": lease.last_error, "state_snapshot": lease.state,
                     "heartbeat_age_ms": max(0, now_ms - lease.heartbeat_ms) if lease.heartbeat_ms else None})
    member_rows = []
    for key, value, _version in members:
        try:
            d = json.loads(value)
        except ValueError:
            d = {}
        beat = int(d.get("heartbeat_ms", 0) or 0)
        member_rows.append({"member": key, "host": str(d.get("host", "")),
                            "heartbeat_age_ms": max(0, now_ms - beat) if beat else None})
    return {"group": name, "members": member_rows, "leases": rows,
            "failures": sum(r["failures"] for r in rows), "dead_letters": sum(r["dead_letters"] for r in rows)}


def _channel(channel: ChannelInfo, progress: list, registered) -> dict:
    """One channel: where it delivers and, per partition, how far (ChannelPartition)."""
    now_ms = int(time.time() * 1000)
    d = channel.destination
    where = d.url if d.kind == "FILES" else f"{d.namespace}.{d.table}"
    rows = [{"partition": partition_id(p.ordinal), "ordinal": p.ordinal, "position": p.position,
             "records": p.records, "files": p.files, "dead_letters": p.dead_letters,
             "last_commit_age_ms": max(0, now_ms - p.last_commit_ms) if p.last_commit_ms else None,
             "lag_ms": p.lag_ms, "node": p.node, "node_registered": not p.node or p.node in registered,
             "error": p.error} for p in sorted(progress, key=lambda p: p.ordinal)]
    return {"channel": channel.name, "stream": channel.stream, "status": channel.status.value,
            "kind": d.kind, "destination": where, "catalog_uri": d.catalog_uri,
            "data_freshness_s": channel.data_freshness_s, "record_format": channel.record_format,
            "partitions": rows, "records": sum(r["records"] for r in rows),
            "errors": sum(1 for r in rows if r["error"])}


def _lag_ms(lease: Lease, partition) -> int | None:
    """How far the checkpoint is behind the partition's end, where the control node knows
    the end: a closed partition's ending SN. None for an open partition (its last SN is
    on its chain, not in the metadata)."""
    if lease.checkpoint == SHARD_END:
        return 0
    if partition is None or partition.state is not PartitionState.CLOSED or partition.ending_sn is None:
        return None
    end = partition.ending_sn
    done = int(lease.checkpoint) if lease.checkpoint.isdigit() else 0
    if end == 0 or done >= end:
        return 0
    since = seqno.timestamp_ms_of(done) if done else partition.valid_from_ms
    return max(0, seqno.timestamp_ms_of(end) - since)


def _sn_text(sn: int) -> str:
    return SHARD_END if sn == ConsumerRecord.SHARD_END_SN else str(sn)


def _json(start_response, status: str, obj, method: str, headers: list | None = None):
    return _answer(start_response, status, json.dumps(obj).encode(), "application/json",
                   [("Cache-Control", "no-store")] + (headers or []), method)


def _answer(start_response, status: str, body: bytes, content_type: str, headers: list, method: str):
    start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body)))]
                   + SECURITY_HEADERS + headers)
    return [b"" if method == "HEAD" else body]
