"""The web console of a control node: a page to watch and run the cluster from -- nodes up,
down and draining with their disks, replicas and replication links; streams with their
partitions drawn as the lineage DAG, their rates, sizes, retention and archive lag;
consumer groups, SPS stages, registered consumers, queues and channels with their lag;
a message browser; charts of the last hour; and actions (create, update, delete and
repartition a stream, reset a consumer group, drain, undrain and remove a node).

A WSGI application that node/metrics.py's HTTP(S) server hands every path but /metrics
(so the console has the metrics port's TLS: HTTPS with the node's certificate on a secure
cluster). `/` redirects to `/console/`; `/console/` serves the plain files of
node/console_static/ (no build step, nothing from the network, a strict CSP);

- `GET /api/state`: JSON of everything the page shows, which the page polls;
- `GET /api/history`: the series the charts draw: every live node's own `/history`
  (node/metrics.py), read with the caller's token and merged into records/s and lag
  (node/console_history.py), so the charts cover the last hour whether or not a page
  was open, and survive a restart or failover of the control node;
- `GET /api/records?stream=&partition=&from=...`: a page of records for the browser;
- `POST /api/actions/<action>`: the actions (`ACTIONS`), with a JSON body.

What the metadata store holds (chains, leases, checkpoints, channels, draining marks) is
read on the node's event loop as before, by the node itself, for a caller whose key is a
cluster admin's. What only the nodes hold (their replicas' last SNs and sizes, their peer
links, their disks, the read and write counters of their /metrics, their /history) and
every action goes to the cluster through a client of the cluster with no credentials of
its own (this node's CA to trust, no certificate, no token): each call carries the caller's token
(sms.aio.transport.CALL_TOKEN), so the cluster's own auth checks and audits it exactly as
it would the same Control RPC from `sms` (a key that may not is refused with its named
error, shown in the page). The console keeps no token past a request.

Actions are guarded against cross-site requests: the token only in an `Authorization:
Bearer` header (no cookie, no ?token=), a JSON body (`Content-Type: application/json`,
which a form cannot send), and no `Origin` but this page's own. Bad input answers 400 with
the named error and changes nothing.

A request gathers the state within limits.CONSOLE_STATE_TIMEOUT_S, else it answers 503. A
standby control node serves the console too, marked as standby. With `keys` (a
control/auth.py KeyTable), the GET endpoints want a cluster admin's key, as
`Authorization: Bearer <token>` (or `?token=` for /api/state and /api/history).

The console's own bounds are the constants below (not in sms/limits.py).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import logging
import os
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Callable

from control import auth, chains
from control.channels import from_bytes as channel_from_bytes, progress_from_bytes
from metastore import MetaStoreError, NoNodeError, reads
from node.console_history import HISTORY_SAMPLE_S, merge, sample_s_from
from sms import metadata, seqno
from sms import limits
from sms.errors import InvalidArgument, SmsError
from sms.hashing import HASH_SPACE
from sms.leases import SHARD_END, Lease
from sms.metadata import ConsumerRecord
from sms.types import ChannelInfo, PartitionState, StreamInfo, partition_id

log = logging.getLogger(__name__)

# --- the console's limits ---------------------------------------------------------------
BROWSE_RECORDS_MAX = 100           # records a page of the message browser shows, at most
BROWSE_RECORDS_DEFAULT = 20        # ... when the page does not say
BROWSE_DATA_BYTES_MAX = 16 * 1024  # bytes of a record's data sent to the page (the rest is cut, and said so)
BROWSE_SKIP_RECORDS_MAX = 20_000   # records read past to find the start of "the last n" (LATEST-n)
BROWSE_PROBES_MAX = 40             # time probes (an iterator and one record each) to find that start
ACTION_BODY_BYTES_MAX = 16 * 1024  # the JSON body of an action
ACTION_TIMEOUT_S = 60.0            # an action's calls (create waits for ACTIVE, repartition for its map)
LIVE_REFRESH_S = 5.0               # the nodes' status and /metrics are read at most this often
RATE_WINDOW_S = 5.0                # a group's records/s: its checkpoints' progress over at least this long
NODE_CALL_TIMEOUT_S = 3.0          # one node's NodeStatus, or one scrape of its /metrics
NODES_READ_MAX = 64                # nodes whose status and metrics a refresh reads
SCRAPE_BYTES_MAX = 16 * 1024 * 1024   # one node's /metrics answer, at most
SCRAPE_THREADS = 4                 # scrapes at once
HISTORY_BYTES_MAX = 16 * 1024 * 1024  # one node's /history answer, at most
HISTORY_REUSE_S = 5.0              # a merged history this young is answered again (the page asks every 10 s)
NAME_CHARS_MAX = 256               # a name in an action (the cluster checks the rest)

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "console_static")
STATIC_FILES = {"index.html": "text/html; charset=utf-8",
                "console.js": "text/javascript; charset=utf-8",
                "console.css": "text/css; charset=utf-8"}
SECURITY_HEADERS = [("X-Content-Type-Options", "nosniff"), ("X-Frame-Options", "DENY"),
                    ("Referrer-Policy", "no-referrer"),
                    ("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                                                "script-src 'self'; connect-src 'self'; object-src 'none'; "
                                                "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")]
HTTP_OF_CODE = {"INVALID_ARGUMENT": "400 Bad Request", "OUT_OF_RANGE": "400 Bad Request",
                "NOT_FOUND": "404 Not Found", "ALREADY_EXISTS": "409 Conflict",
                "FAILED_PRECONDITION": "409 Conflict", "ABORTED": "409 Conflict",
                "PERMISSION_DENIED": "403 Forbidden", "UNAUTHENTICATED": "401 Unauthorized",
                "RESOURCE_EXHAUSTED": "429 Too Many Requests", "UNAVAILABLE": "503 Service Unavailable",
                "DEADLINE_EXCEEDED": "504 Gateway Timeout"}
# the counters of the nodes' /metrics the console turns into rates, by (stream, partition)
RATE_COUNTERS = {"sms_put_records_total": "in_records", "sms_put_bytes_total": "in_bytes",
                 "sms_read_records_total": "out_records", "sms_read_bytes_total": "out_bytes"}
RATE_KINDS = tuple(RATE_COUNTERS.values())
DISK_GAUGES = ("sms_lmdb_used_bytes", "sms_lmdb_map_bytes", "sms_disk_free_bytes", "sms_disk_bytes")


class Console:
    """The WSGI application. Called on the HTTP server's threads; reads the cluster on
    `loop`. `address`: this node's client address, and `ca` the cluster CA (None: a
    plaintext cluster), for the client that makes the callers' calls."""

    def __init__(self, loop: asyncio.AbstractEventLoop, node_id: str, view, groups,
                 is_leader: Callable[[], bool], keys: auth.KeyTable | None = None,
                 address: str = "", ca: bytes | None = None):
        self.loop = loop
        self.node_id = node_id
        self.view = view                  # metastore.view.ClusterView
        self.groups = groups              # control.groups.Groups
        self.is_leader = is_leader
        self.keys = keys
        self.address = address
        self.ca = ca
        self._client = None               # sms.aio.Client, made on the loop at its first call
        self._lock = threading.Lock()
        self._last: tuple[float, bytes] | None = None     # (monotonic time, the JSON answered)
        self._live: dict | None = None                    # the nodes' last status and metrics (_read_live)
        self._counters: dict | None = None                # (monotonic time, counters) of the refresh before
        self._checkpoints: dict = {}          # (stream, group, ordinal) -> (monotonic, counter, records/s then)
        self._history_lock = threading.Lock()
        self._history_last: tuple[float, dict] | None = None   # (monotonic time, the merged history answered)
        try:
            self.sample_s = sample_s_from(os.environ)        # (the nodes' own, node/metrics.py)
        except ValueError:                                  # (serve_metrics says why and stops the node)
            self.sample_s = HISTORY_SAMPLE_S
        self._scrapes = concurrent.futures.ThreadPoolExecutor(SCRAPE_THREADS, thread_name_prefix="console-scrape")

    # --- HTTP -------------------------------------------------------------------------

    def __call__(self, environ, start_response):
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO", "") or "/"
        if method == "POST" and path.startswith("/api/actions/"):
            return self._action(environ, start_response, path[len("/api/actions/"):])
        if method not in ("GET", "HEAD"):
            allow = "POST" if path.startswith("/api/actions/") else "GET, HEAD"
            return _answer(start_response, "405 Method Not Allowed", f"{path} answers {allow} only\n".encode(),
                           "text/plain; charset=utf-8", [("Allow", allow)], method)
        if path in ("/", "/console"):
            return _answer(start_response, "302 Found", b"", "text/plain", [("Location", "/console/")], method)
        if path == "/api/state":
            return self._state(environ, start_response, method)
        if path == "/api/history":
            return self._history(environ, start_response, method)
        if path == "/api/records":
            return self._records(environ, start_response, method)
        if path.startswith("/api/actions/"):
            return _json(start_response, "405 Method Not Allowed", {"error": "MethodNotAllowed",
                                                                    "message": "actions are POST"}, method,
                         [("Allow", "POST")])
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
        token = _token(environ, query=True)
        with self._lock:                 # (one gathering at a time; the others take its answer)
            if self._last is None or time.monotonic() - self._last[0] > limits.CONSOLE_STATE_REUSE_S:
                try:
                    live = self._read_live(token)
                    state = self._on_loop(self.snapshot(live))
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
        token = _token(environ, query=True)
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

    def _on_loop(self, coroutine, timeout_s: float = limits.CONSOLE_STATE_TIMEOUT_S):
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout=timeout_s)
        except BaseException:
            future.cancel()
            raise

    # --- the callers' calls -------------------------------------------------------------

    def client(self):
        """The client of the cluster that makes the callers' calls: this node's CA, and no
        certificate or token of its own (each call carries its caller's). On the loop."""
        if self._client is None:
            from sms import aio
            from sms.security import TlsConfig
            tls = TlsConfig(ca=self.ca) if self.ca is not None else None
            self._client = aio.Client(self.address, ca_file="", token="", tls_config=tls,
                                      timeout_s=NODE_CALL_TIMEOUT_S)
        return self._client

    async def _as(self, token: str, call: Callable):
        """`call(client)`, with every RPC it makes carrying `token` (a task of its own: the
        context variable goes no further)."""
        from sms.aio.transport import CALL_TOKEN
        CALL_TOKEN.set(token or None)
        return await call(self.client())

    def _action(self, environ, start_response, name: str):
        method = "POST"
        refused = _cross_site(environ)
        if refused:
            return _json(start_response, "403 Forbidden", {"error": "CrossSiteRequest", "message": refused}, method)
        content_type = environ.get("CONTENT_TYPE", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            return _json(start_response, "415 Unsupported Media Type",
                         {"error": "InvalidArgument", "message": "an action's body is JSON: Content-Type: "
                                                                 "application/json"}, method)
        token = _token(environ, query=False)
        if self.ca is not None and not token:
            return _json(start_response, "401 Unauthorized",
                         {"error": "Unauthenticated", "message": "an action wants a key's token in the header "
                                                                 "Authorization: Bearer <token>"},
                         method, [("WWW-Authenticate", 'Bearer realm="sms console"')])
        handler = ACTIONS.get(name)
        if handler is None:
            return _json(start_response, "404 Not Found", {"error": "NotFound", "message": f"no action {name[:64]!r}; "
                         f"the actions are: {', '.join(sorted(ACTIONS))}"}, method)
        try:
            body = _body(environ)
            call = handler(body)                 # (checks the input; InvalidArgument before any call)
            result = self._on_loop(self._as(token, call), ACTION_TIMEOUT_S)
        except SmsError as e:
            return _json(start_response, HTTP_OF_CODE.get(e.code.name, "500 Internal Server Error"),
                         {"error": e.name, "message": e.message}, method)
        except (TimeoutError, concurrent.futures.TimeoutError):
            return _json(start_response, "504 Gateway Timeout",
                         {"error": "Timeout", "message": f"the action took longer than {ACTION_TIMEOUT_S} s; "
                                                         "see the state for what it did"}, method)
        with self._lock:
            self._last = None               # (the next state shows what it did)
            self._live = None
        log.info("console: action %s done", name)
        return _json(start_response, "200 OK", {"ok": True, "action": name, **(result or {})}, method)

    def _records(self, environ, start_response, method: str):
        token = _token(environ, query=False)
        if self.ca is not None and not token:
            return _json(start_response, "401 Unauthorized",
                         {"error": "Unauthenticated", "message": "the browser wants a key's token in the header "
                                                                 "Authorization: Bearer <token>"},
                         method, [("WWW-Authenticate", 'Bearer realm="sms console"')])
        query = {k: v[0] for k, v in urllib.parse.parse_qs(environ.get("QUERY_STRING", "")).items()}
        try:
            call = browse(query)
            result = self._on_loop(self._as(token, call), ACTION_TIMEOUT_S)
        except SmsError as e:
            return _json(start_response, HTTP_OF_CODE.get(e.code.name, "500 Internal Server Error"),
                         {"error": e.name, "message": e.message}, method)
        except (TimeoutError, concurrent.futures.TimeoutError):
            return _json(start_response, "504 Gateway Timeout", {"error": "Timeout", "message": "no answer in time"},
                         method)
        return _json(start_response, "200 OK", result, method)

    # --- what only the nodes hold (with the caller's token) ---------------------------------

    def _read_live(self, token: str) -> dict:
        """Each node's status (NodeStatus) and /metrics, at most every LIVE_REFRESH_S; the
        rates of the counters since the refresh before. A node that does not answer (with
        its error) is not a failure of the console."""
        now = time.monotonic()
        if self._live is not None and now - self._live["at"] < LIVE_REFRESH_S:
            return self._live
        nodes = self._on_loop(self.view.nodes())
        targets = sorted(nodes.values(), key=lambda n: n.node_id)[:NODES_READ_MAX]
        scrapes = {n.node_id: self._scrapes.submit(self._scrape, n.metrics_address, token)
                   for n in targets if n.metrics_address}
        status = self._on_loop(self._as(token, lambda client: _statuses(client, targets)))
        metrics = {}
        deadline = time.monotonic() + NODE_CALL_TIMEOUT_S + 1       # (for them all: they ran meanwhile)
        for node_id, future in scrapes.items():
            try:
                metrics[node_id] = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except Exception as e:            # noqa: BLE001 (shown as that node's error)
                metrics[node_id] = f"{type(e).__name__}: {e}"
        counters: dict = defaultdict(float)
        for m in metrics.values():
            if isinstance(m, dict):
                for key, value in m["counters"].items():
                    counters[key] += value
        rates: dict = {}
        if self._counters is not None and now > self._counters[0]:
            before, seconds = self._counters[1], now - self._counters[0]
            for key, value in counters.items():
                rates[key] = max(0.0, value - before.get(key, value)) / seconds
        self._counters = (now, dict(counters))
        self._live = {"at": now, "status": status, "metrics": metrics, "rates": rates, "counters": dict(counters)}
        return self._live

    def _scrape(self, metrics_address: str, token: str) -> dict:
        """What the console takes from one node's /metrics: its disk gauges, the read and
        write counters by (kind, stream, partition), its queues' records."""
        from prometheus_client.parser import text_string_to_metric_families
        scheme = "https" if self.ca is not None else "http"
        request = urllib.request.Request(f"{scheme}://{metrics_address}/metrics",
                                         headers={"Authorization": f"Bearer {token}"} if token else {})
        context = ssl.create_default_context(cadata=self.ca.decode()) if self.ca is not None else None
        with urllib.request.urlopen(request, context=context, timeout=NODE_CALL_TIMEOUT_S) as answer:
            text = answer.read(SCRAPE_BYTES_MAX).decode("utf-8", "replace")
        disk: dict = defaultdict(float)
        counters: dict = {}
        queues: dict = defaultdict(dict)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name, labels = sample.name, sample.labels
                if name in DISK_GAUGES:
                    disk[name] += sample.value
                elif name in RATE_COUNTERS:
                    counters[(RATE_COUNTERS[name], labels.get("stream", ""), labels.get("partition", ""))] = \
                        sample.value
                elif name == "sms_queue_records":
                    queues[(labels["queue"], labels["stream"], labels["partition"])][labels["state"]] = sample.value
                elif name == "sms_queue_oldest_age_seconds":
                    queues[(labels["queue"], labels["stream"], labels["partition"])]["oldest_age_s"] = sample.value
        return {"disk": dict(disk), "counters": counters, "queues": dict(queues)}

    # --- the charts' history: the nodes' own (with the caller's token) ----------------------

    def _history(self, environ, start_response, method: str):
        token = _token(environ, query=True)
        if self.keys is not None:
            refused = self._refusal(environ)
            if refused:
                return _json(start_response, "401 Unauthorized", {"error": refused}, method,
                             [("WWW-Authenticate", 'Bearer realm="sms console"')])
        try:
            answer = self.read_history(token)
        except Exception as e:                   # noqa: BLE001 (the console never fails the node)
            log.warning("console: the nodes' history could not be read: %s: %s", type(e).__name__, e)
            return _json(start_response, "503 Service Unavailable",
                         {"error": f"the nodes' history could not be read: {type(e).__name__}"}, method)
        return _json(start_response, "200 OK", answer, method)

    def read_history(self, token: str) -> dict:
        """The charts' series: every live node's /history (at most NODES_READ_MAX, read with
        `token`, within NODE_CALL_TIMEOUT_S, SCRAPE_THREADS at once), merged
        (console_history.merge: records/s in and out, cluster-wide and per stream that
        exists; lag per stream and consumer), with the nodes that answered and the errors
        of those that did not. A whole answer is reused for HISTORY_REUSE_S."""
        with self._history_lock:
            if self._history_last is not None and time.monotonic() - self._history_last[0] < HISTORY_REUSE_S:
                return self._history_last[1]
            nodes, streams = self._on_loop(self._nodes_and_streams())
            targets = sorted(nodes.values(), key=lambda n: n.node_id)[:NODES_READ_MAX]
            reads_of = {n.node_id: self._scrapes.submit(self._fetch_history, n.metrics_address, token)
                        for n in targets if n.metrics_address}
            answers, errors = {}, {}
            deadline = time.monotonic() + NODE_CALL_TIMEOUT_S + 1       # (for them all: they ran meanwhile)
            for node_id, future in reads_of.items():
                try:
                    answers[node_id] = future.result(timeout=max(0.0, deadline - time.monotonic()))
                except Exception as e:            # noqa: BLE001 (said in the answer, per node)
                    errors[node_id] = f"{type(e).__name__}: {e}"
            merged = merge(answers.values(), self.sample_s, streams=set(streams))
            merged.update(nodes=sorted(answers), errors=errors)
            self._history_last = (time.monotonic(), merged) if not errors else None
            return merged

    async def _nodes_and_streams(self) -> tuple[dict, list]:
        return await self.view.nodes(), await self.view.list_streams()

    def _fetch_history(self, metrics_address: str, token: str) -> dict:
        """One node's /history (node/metrics.py HistorySampler), at most HISTORY_BYTES_MAX."""
        scheme = "https" if self.ca is not None else "http"
        request = urllib.request.Request(f"{scheme}://{metrics_address}/history",
                                         headers={"Authorization": f"Bearer {token}"} if token else {})
        context = ssl.create_default_context(cadata=self.ca.decode()) if self.ca is not None else None
        with urllib.request.urlopen(request, context=context, timeout=NODE_CALL_TIMEOUT_S) as answer:
            raw = answer.read(HISTORY_BYTES_MAX + 1)
        if len(raw) > HISTORY_BYTES_MAX:
            raise ValueError(f"a /history answer of more than {HISTORY_BYTES_MAX} bytes")
        body = json.loads(raw)
        if not isinstance(body, dict) or not isinstance(body.get("series"), dict):
            raise ValueError("a /history answer without series")
        return body

    # --- the state (on the event loop) ---------------------------------------------------

    async def snapshot(self, live: dict | None = None) -> dict:
        """Everything the page shows, as JSON-able values (SNs and hashes as strings: they
        exceed a JavaScript number). `live`: what the nodes answered (_read_live)."""
        live = live or {"status": {}, "metrics": {}, "rates": {}, "counters": {}}
        nodes = await self.view.nodes()
        names = sorted(await self.view.list_streams())
        replicas = _replicas_by_chain(live["status"])
        streams, changes = [], []
        chains_of: dict[str, list] = defaultdict(list)
        for name in names[:limits.CONSOLE_STREAMS_MAX]:
            try:
                info = await self.view.describe_stream(name)
            except (SmsError, MetaStoreError):          # deleted meanwhile
                continue
            streams.append(await self._stream(info, nodes, replicas, live["rates"]))
            await asyncio.sleep(0)          # (the node's other work runs between streams)
            for p in info.partitions:
                pid = partition_id(p.ordinal)
                for m in p.chain:
                    chains_of[m.node_id].append({"stream": name, "partition": pid, "role": m.role,
                                                 "epoch": p.chain_epoch, "state": p.state.value})
                for m in p.learners:
                    chains_of[m.node_id].append({"stream": name, "partition": pid, "role": "learner",
                                                 "epoch": p.chain_epoch, "state": p.state.value})
                changes += [{"stream": name, "partition": pid, **c} for c in p.history]
        changes.sort(key=lambda c: (c["at_ms"], c["epoch"]), reverse=True)
        changes_of: dict[str, list] = defaultdict(list)       # (one pass, newest first)
        for c in changes:
            if len(changes_of[c["node"]]) < limits.CONSOLE_NODE_CHANGES_MAX:
                changes_of[c["node"]].append(c)
        store = self.view.store
        draining = await reads.draining(store)
        try:
            disk_failed = set(await store.children(metadata.DISK_FAILED))
        except NoNodeError:
            disk_failed = set()
        node_list = [_node(node_id, nodes.get(node_id), chains_of.get(node_id, []), changes_of.get(node_id, []),
                           node_id in draining, node_id in disk_failed, live["status"].get(node_id),
                           live["metrics"].get(node_id))
                     for node_id in sorted(set(nodes) | set(chains_of) | set(draining) | disk_failed)]
        short = [{"stream": s["name"], "partition": p["partition"], "live_members": p["live_members"],
                  "replication_factor": s["replication_factor"]}
                 for s in streams for p in s["partitions"] if p["under_replicated"]]
        channel_list, channels_total = await self._channels(nodes)
        rates = live["rates"]
        state = {"node": {"node_id": self.node_id, "leader": bool(self.is_leader()),
                         "leader_address": await self.view.control_address()},
                "generated_ms": int(time.time() * 1000),
                "nodes": node_list, "streams": streams, "changes": changes[:limits.CONSOLE_CHANGES_MAX],
                "under_replicated": short,
                "totals": {kind + "_per_s": round(sum(v for k, v in rates.items() if k[0] == kind), 3)
                           for kind in RATE_KINDS},
                "queues": _queues(live["metrics"]),
                "streams_total": len(names), "streams_shown": min(len(names), limits.CONSOLE_STREAMS_MAX),
                "channels": channel_list, "channels_total": channels_total}
        return state

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

    async def _stream(self, info: StreamInfo, registered, replicas: dict, rates: dict) -> dict:
        by_ordinal = {p.ordinal: p for p in info.partitions}
        rf = info.replication_factor
        now = time.monotonic()
        ends = {}                 # ordinal -> (committed SN, first SN): where each partition stands
        partitions = []
        for p in info.partitions:
            pid = partition_id(p.ordinal)
            held = replicas.get(metadata.chain_id(info.name, p.ordinal), {})
            head = held.get(p.chain[0].node_id) if p.chain else None
            tail = held.get(p.chain[-1].node_id) if p.chain else None
            committed = int(head["committed_sn"] or 0) if head else 0
            if p.state is PartitionState.CLOSED and p.ending_sn is not None:
                committed = committed or p.ending_sn
            first = int((head or tail or {}).get("first_sn") or 0)
            if head is not None or p.state is PartitionState.CLOSED:     # (else: unknown, not 0)
                ends[p.ordinal] = (committed, first)
            archive = (tail or {}).get("archive")
            partitions.append({
                "partition": pid, "ordinal": p.ordinal, "state": p.state.value,
                "hash_lo": str(p.hash_lo), "hash_hi": str(p.hash_hi),
                "lo": p.hash_lo / HASH_SPACE, "hi": p.hash_hi / HASH_SPACE,
                "parents": [partition_id(o) for o in p.parents], "children": [partition_id(o) for o in p.children],
                "epoch": p.chain_epoch, "sealed": p.sealed,
                "chain": [{"node_id": m.node_id, "role": m.role} for m in p.chain],
                "learners": [m.node_id for m in p.learners],
                "live_members": sum(1 for m in p.chain if m.node_id in registered),
                "under_replicated": chains.under_replicated([m.node_id for m in p.chain], rf, registered),
                "valid_from_ms": p.valid_from_ms, "valid_to_ms": p.valid_to_ms,
                "ending_sn": None if p.ending_sn is None else str(p.ending_sn),
                "records": tail["records"] if tail else None, "committed_sn": str(committed), "first_sn": str(first),
                "archive_lag_ms": archive["lag_ms"] if archive else None,
                "archive_error": archive["error"] if archive else "",
                **{kind + "_per_s": round(rates.get((kind, info.name, pid), 0.0), 3) for kind in RATE_KINDS}})
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
            groups.append(self._group(info.name, group, leases, members, by_ordinal, ends, now))
        consumers = []
        for name in info.consumers:
            entry = await self.view.store.get(metadata.consumer_path(info.name, name))
            if entry is None:
                continue
            record = ConsumerRecord.from_bytes(entry.value)
            done = dict(record.checkpoints)
            lag = {}
            for p in info.partitions:
                if p.ordinal not in ends:
                    lag[partition_id(p.ordinal)] = None
                elif p.ordinal in done or p.state is PartitionState.OPEN:
                    behind = seqno.behind(_sn_text(done[p.ordinal]) if p.ordinal in done else "TRIM_HORIZON",
                                          p.ordinal, *ends[p.ordinal])
                    lag[partition_id(p.ordinal)] = None if behind is None else behind[0]
            consumers.append({"consumer": name, "group": name in group_names,
                              "checkpoints": {partition_id(o): _sn_text(sn) for o, sn in record.checkpoints},
                              "lag_records": lag,
                              "lag_records_total": sum(v for v in lag.values() if v is not None)})
        shown = [p for p in partitions if p["records"] is not None]
        return {"name": info.name, "status": info.status.value, "replication_factor": rf,
                "persistence": info.persistence.value,
                "map_version": info.map_version, "created_ms": info.created_ms,
                "retention_s": info.retention_s, "protect_unread": info.protect_unread,
                "write_records_per_s_limit": info.write_records_per_s,
                "archive": info.archive, "archive_after_s": info.archive_after_s, "encryption": info.encryption,
                "archive_lag_ms": max((p["archive_lag_ms"] for p in partitions if p["archive_lag_ms"] is not None),
                                      default=None),
                "records": sum(p["records"] for p in shown) if shown else None,
                **{kind + "_per_s": round(sum(p[kind + "_per_s"] for p in partitions), 3) for kind in RATE_KINDS},
                "partitions": partitions, "groups": groups, "consumers": consumers}

    def _group(self, stream: str, name: str, leases: list, members: list, by_ordinal: dict, ends: dict,
               now: float) -> dict:
        """One consumer group (or SPS stage: a group named after the stage, on each of its
        input streams): its members and, per partition, its lease, its lag in records and
        seconds (seqno.behind: the checkpoint against the partition's commit point on its
        head), and records/s (its checkpoint's progress since the refresh before)."""
        now_ms = int(time.time() * 1000)
        rows = []
        for key, value, version in sorted(leases, key=lambda e: int(e[0]) if e[0].isdigit() else -1):
            try:
                lease = Lease.from_bytes(value, version)
            except (ValueError, KeyError, TypeError):
                continue                                   # (the server validates what it writes)
            behind = None
            if lease.checkpoint == SHARD_END:
                behind = (0, 0)
            elif lease.ordinal in ends:
                behind = seqno.behind(lease.checkpoint, lease.ordinal, *ends[lease.ordinal])
            rows.append({"partition": partition_id(lease.ordinal), "owner": lease.owner,
                         "checkpoint": lease.checkpoint, "records": lease.records,
                         "rate": self._rate(stream, name, lease, now),
                         "lag_records": None if behind is None else behind[0],
                         "lag_ms": None if behind is None else behind[1],
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
        known = [r for r in rows if r["lag_records"] is not None]
        return {"group": name, "members": member_rows, "leases": rows,
                "lag_records": sum(r["lag_records"] for r in known),
                "lag_ms": max((r["lag_ms"] for r in known), default=0),
                "rate": round(sum(r["rate"] for r in rows), 3),
                "failures": sum(r["failures"] for r in rows), "dead_letters": sum(r["dead_letters"] for r in rows)}

    def _rate(self, stream: str, group: str, lease: Lease, now: float) -> float:
        """Records/s a group's checkpoint of a partition moved over the last RATE_WINDOW_S
        or more (a lease's own `rate` is what its owner last wrote, which lags while it
        reads; a shorter window would swing between 0 and bursts with each checkpoint)."""
        key = (stream, group, lease.ordinal)
        done = lease.checkpoint
        if not (done.isdigit() and int(done) and seqno.ordinal_of(int(done)) == lease.ordinal):
            self._checkpoints.pop(key, None)
            return float(lease.rate or 0)
        counter = seqno.counter_of(int(done))
        before = self._checkpoints.get(key)
        if before is None:
            self._checkpoints[key] = (now, counter, float(lease.rate or 0))
            return float(lease.rate or 0)
        since, counted, rate = before
        if now - since >= RATE_WINDOW_S:
            rate = round(max(0, counter - counted) / (now - since), 3)
            self._checkpoints[key] = (now, counter, rate)
        return rate


# --- the nodes' answers ----------------------------------------------------------------------

async def _statuses(client, targets: list) -> dict:
    """node id -> NodeStatus (as sms.aio's dict), or the error text of a node that did not
    answer; storage nodes only, all at once."""
    async def one(n):
        try:
            return n.node_id, await asyncio.wait_for(client.node_status(n.address), NODE_CALL_TIMEOUT_S)
        except SmsError as e:
            return n.node_id, f"{e.name}: {e.message}"
        except (asyncio.TimeoutError, OSError) as e:
            return n.node_id, f"{type(e).__name__}: no answer within {NODE_CALL_TIMEOUT_S} s"
    answers = await asyncio.gather(*(one(n) for n in targets if "storage" in n.roles))
    return dict(answers)


def _replicas_by_chain(status: dict) -> dict:
    """chain id -> node id -> that node's replica status."""
    out: dict = defaultdict(dict)
    for node_id, answer in status.items():
        if isinstance(answer, dict):
            for r in answer["replicas"]:
                out[r["chain_id"]][node_id] = r
    return out


def _node(node_id: str, info, chains_of: list, changes: list, draining: bool, disk_failed: bool, status,
          metrics) -> dict:
    """One node's line (up or down, draining, its share of chains, disk, links) and details
    (its replicas, recent changes)."""
    live = None
    if isinstance(status, dict):
        live = {"replicas": len(status["replicas"]),
                "heads": sum(1 for r in status["replicas"] if r["role"] == "head"),
                "write_failures": status["storage_write_failures"], "last_error": status["storage_last_error"],
                "links": [{"peer": link["peer"], "direction": link["direction"], "connected": link["connected"],
                           "chains": link["chains"], "heard_ago_s": link.get("heard_ago_s")}
                          for link in status["links"]]}
    disk = metrics["disk"] if isinstance(metrics, dict) else None
    links = (live or {}).get("links", [])
    return {"node_id": node_id, "registered": info is not None, "up": info is not None, "draining": draining,
            "disk_failed": disk_failed,
            "address": info.address if info else "", "roles": list(info.roles) if info else [],
            "metrics_address": info.metrics_address if info else "", "started_ms": info.started_ms if info else 0,
            "replicas": sum(1 for c in chains_of if c["role"] != "learner"),
            "heads": sum(1 for c in chains_of if c["role"] == "head"),
            "learners": sum(1 for c in chains_of if c["role"] == "learner"),
            "links_down": sum(1 for link in links if not link["connected"]),
            "live": live, "status_error": status if isinstance(status, str) else "",
            "disk": {"lmdb_used_bytes": disk.get("sms_lmdb_used_bytes"), "lmdb_map_bytes": disk.get("sms_lmdb_map_bytes"),
                     "disk_free_bytes": disk.get("sms_disk_free_bytes"), "disk_bytes": disk.get("sms_disk_bytes")}
            if disk else None,
            "metrics_error": metrics if isinstance(metrics, str) else "",
            "chains": chains_of, "changes": changes}


def _queues(metrics: dict) -> list[dict]:
    """Each queue partition's records by state (from the /metrics of the node owning it)."""
    rows = []
    for m in metrics.values():
        if isinstance(m, dict):
            for (queue, stream, pid), v in m["queues"].items():
                rows.append({"queue": queue, "stream": stream, "partition": pid,
                             "available": int(v.get("available", 0)), "in_flight": int(v.get("in_flight", 0)),
                             "dead": int(v.get("dead", 0)), "oldest_age_s": round(v.get("oldest_age_s", 0.0), 1)})
    return sorted(rows, key=lambda r: (r["queue"], r["partition"]))


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


def _sn_text(sn: int) -> str:
    return SHARD_END if sn == ConsumerRecord.SHARD_END_SN else str(sn)


# --- the actions: each checks its input, then makes one call as its caller -----------------

def _text(body: dict, key: str, required: bool = True, default: str = "") -> str:
    value = body.get(key, None)
    if value is None or value == "":
        if required:
            raise InvalidArgument(f"{key} is required")
        return default
    if not isinstance(value, str) or len(value) > NAME_CHARS_MAX:
        raise InvalidArgument(f"{key} {str(value)[:64]!r}; expected a text of at most {NAME_CHARS_MAX} characters")
    return value


def _int(body: dict, key: str, lo: int, hi: int, default: int | None = None) -> int | None:
    value = body.get(key, None)
    if value is None or value == "":
        if default is None:
            raise InvalidArgument(f"{key} is required")
        return default
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidArgument(f"{key} {str(value)[:64]!r}; expected a whole number in {lo}..{hi}")
    return value


def _only(body: dict, *keys: str) -> None:
    unknown = sorted(set(body) - set(keys))
    if unknown:
        raise InvalidArgument(f"unknown field(s) {', '.join(unknown)}; expected: {', '.join(keys)}")


def _create_stream(body: dict):
    _only(body, "name", "partitions", "replication_factor", "retention_hours")
    name = _text(body, "name")
    partitions = _int(body, "partitions", 1, limits.STREAM_PARTITIONS_MAX, 1)
    rf = _int(body, "replication_factor", 1, limits.REPLICATION_FACTOR_MAX, 1)
    hours = _int(body, "retention_hours", 0, 100 * 365 * 24, 0)

    async def call(client):
        info = await client.create_stream(name, partitions, rf, retention_hours=hours)
        return {"stream": info.name, "partitions": len(info.partitions)}
    return call


def _update_stream(body: dict):
    _only(body, "name", "retention_hours", "retention_s")
    name = _text(body, "name")
    if ("retention_hours" in body) == ("retention_s" in body):
        raise InvalidArgument("give retention_hours or retention_s (one of them)")
    hours = _int(body, "retention_hours", 1, 100 * 365 * 24) if "retention_hours" in body else None
    seconds = _int(body, "retention_s", 1, 100 * 365 * 24 * 3600) if "retention_s" in body else None

    async def call(client):
        info = await client.update_retention(name, hours=hours, seconds=seconds)
        return {"stream": info.name, "retention_s": info.retention_s}
    return call


def _delete_stream(body: dict):
    _only(body, "name")
    name = _text(body, "name")

    async def call(client):
        await client.delete_stream(name)
        return {"stream": name}
    return call


def _repartition(body: dict):
    _only(body, "name", "op", "partition", "partitions", "at_hash", "target_partitions")
    name = _text(body, "name")
    op = _text(body, "op")
    kwargs: dict = {}
    if op == "split":
        kwargs["partitions"] = [_text(body, "partition")]
        at = _text(body, "at_hash", required=False)
        if at:
            if not at.isdigit():
                raise InvalidArgument(f"at_hash {at[:64]!r}; expected a decimal hash")
            kwargs["at_hash"] = at
    elif op == "merge":
        pair = body.get("partitions")
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) and p for p in pair)):
            raise InvalidArgument("a merge wants partitions: two partition ids, [\"p0001\", \"p0002\"]")
        kwargs["partitions"] = pair
    elif op == "scale":
        kwargs["target_partitions"] = _int(body, "target_partitions", 1, limits.STREAM_PARTITIONS_MAX)
    else:
        raise InvalidArgument(f"op {op[:64]!r}; expected split, merge or scale")

    async def call(client):
        info = await client.repartition_stream(name, op, **kwargs)
        return {"stream": info.name, "open": [partition_id(p.ordinal) for p in info.partitions
                                              if p.state is PartitionState.OPEN]}
    return call


def _reset_group(body: dict):
    """The plan first (`execute` false: nothing changes), as `sms consumer reset` shows it
    (node/cli/groups.py `reset_plan`); with `execute`, the reset."""
    from node.cli.groups import reset_plan
    _only(body, "stream", "group", "to", "timestamp_ms", "sequence_numbers", "execute")
    stream, group = _text(body, "stream"), _text(body, "group")
    to = _text(body, "to", required=False) or None
    if to not in (None, "TRIM_HORIZON", "LATEST"):
        raise InvalidArgument(f"to {to[:64]!r}; expected TRIM_HORIZON or LATEST (or timestamp_ms, "
                              "or sequence_numbers)")
    timestamp_ms = _int(body, "timestamp_ms", 0, seqno.TS_MAX) if body.get("timestamp_ms") not in (None, "") \
        else None
    sns = body.get("sequence_numbers") or {}
    if not isinstance(sns, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in sns.items()):
        raise InvalidArgument("sequence_numbers: {\"p0000\": \"<sn>\", ...}")
    for sn in sns.values():
        seqno.parse(sn)                               # (InvalidSequenceNumber: a 400 before any call)
    if sum(x is not None and x != {} for x in (to, timestamp_ms, sns or None)) > 1:
        raise InvalidArgument("give one of to, timestamp_ms and sequence_numbers")
    execute = body.get("execute", False)
    if not isinstance(execute, bool):
        raise InvalidArgument("execute: true or false")

    async def call(client):
        described = await client.describe_group(stream, group)        # (GroupNotFound before any plan)
        target_to, target, plan = reset_plan(described, to, timestamp_ms, sns)
        if execute:
            await client.reset_group(stream, group, to=target_to, timestamp_ms=timestamp_ms or 0,
                                     sequence_numbers=sns)
        return {"stream": stream, "group": group, "to": target_to or sns, "target": target, "plan": plan,
                "executed": execute}
    return call


def _drain_node(body: dict):
    _only(body, "node_id", "undo")
    node_id = _text(body, "node_id")
    undo = body.get("undo", False)
    if not isinstance(undo, bool):
        raise InvalidArgument("undo: true or false")

    async def call(client):
        loads = await client.drain_node(node_id, undo=undo)
        return {"node_id": node_id, "draining": not undo, "nodes": [n.node_id for n in loads]}
    return call


def _remove_node(body: dict):
    _only(body, "node_id")
    node_id = _text(body, "node_id")

    async def call(client):
        await client.remove_node(node_id)
        return {"node_id": node_id, "removed": True}
    return call


ACTIONS: dict[str, Callable[[dict], Callable]] = {
    "create-stream": _create_stream, "update-stream": _update_stream, "delete-stream": _delete_stream,
    "repartition": _repartition, "reset-group": _reset_group, "drain-node": _drain_node,
    "remove-node": _remove_node}


# --- the message browser -----------------------------------------------------------------------

def browse(query: dict):
    """A page of one partition's records from a position (`from`: TRIM_HORIZON, LATEST,
    LATEST_N (the last `n`), AT_SEQUENCE_NUMBER, AT_TIMESTAMP), or from a page's
    `iterator`; at most `limit` (BROWSE_RECORDS_MAX) records."""
    _only(query, "stream", "partition", "from", "n", "sequence_number", "timestamp_ms", "iterator", "limit")
    limit = _int(query, "limit", 1, BROWSE_RECORDS_MAX, BROWSE_RECORDS_DEFAULT)
    iterator = _text(query, "iterator", required=False)
    if len(query.get("iterator", "")) > 4096:
        raise InvalidArgument("iterator too long")
    stream = partition = kind = ""
    n = sn = ts = None
    if not iterator:
        stream, partition = _text(query, "stream"), _text(query, "partition")
        kind = _text(query, "from", required=False, default="TRIM_HORIZON")
        if kind == "LATEST_N":
            n = _int(query, "n", 1, BROWSE_SKIP_RECORDS_MAX, limit)
        elif kind == "AT_SEQUENCE_NUMBER":
            sn = str(seqno.parse(_text(query, "sequence_number")))
        elif kind == "AT_TIMESTAMP":
            ts = _int(query, "timestamp_ms", 0, seqno.TS_MAX)
        elif kind not in ("TRIM_HORIZON", "LATEST"):
            raise InvalidArgument(f"from {kind[:64]!r}; expected TRIM_HORIZON, LATEST, LATEST_N, "
                                  "AT_SEQUENCE_NUMBER or AT_TIMESTAMP")

    async def call(client):
        skip_below = 0                      # (LATEST_N: records of counters below this are read past)
        it = iterator
        name = stream or _stream_of(iterator)
        if not it:
            if kind == "LATEST_N":
                it, skip_below = await _last_n(client, stream, partition, n)
            else:
                it = await client.get_iterator(stream, partition, kind, sequence_number=sn, timestamp_ms=ts)
        records, page, read = [], None, 0
        while len(records) < limit and it:
            page = await client.get_next_records(it, max_records=limit if not skip_below else
                                                 min(limits.GET_RECORDS_COUNT_MAX, limit + BROWSE_SKIP_RECORDS_MAX),
                                                 skip_trimmed=True)
            read += len(page.records)
            taken = [r for r in page.records if seqno.counter_of(r.sn) >= skip_below]
            room = limit - len(records)
            records += taken[:room]
            if len(taken) > room:           # (the next page starts after the last record shown)
                it = await client.get_iterator(name, records[-1].partition_ordinal, "AFTER_SEQUENCE_NUMBER",
                                               sequence_number=records[-1].sn)
                break
            it = page.next_iterator
            if not page.records or read >= BROWSE_SKIP_RECORDS_MAX:
                break
        return {"records": [_record(r) for r in records], "next_iterator": it or None, "limit": limit,
                "millis_behind_latest": page.millis_behind_latest if page else 0,
                "child_partitions": list(page.child_partitions) if page else []}
    return call


def _stream_of(iterator: str) -> str:
    from sms.tokens import peek
    return peek(iterator).stream


async def _last_n(client, stream: str, partition: str, n: int) -> tuple[str, int]:
    """An iterator at or before the n-th record from the partition's end, and the counter of
    that record (records below it are read past): records' times are in their SNs and
    their counters consecutive, so a search by time (AT_TIMESTAMP, one record read each)
    finds the latest time whose first record is at or before it."""
    from sms.tokens import peek
    latest = await client.get_iterator(stream, partition, "LATEST")
    committed = peek(latest).position_sn - 1
    if committed <= 0:
        return latest, 0
    first_page = await client.get_next_records(await client.get_iterator(stream, partition, "TRIM_HORIZON"),
                                               max_records=1, skip_trimmed=True)
    if not first_page.records:
        return latest, 0
    first = first_page.records[0].sn
    target = seqno.counter_of(committed) - n + 1
    if target <= seqno.counter_of(first):
        return await client.get_iterator(stream, partition, "TRIM_HORIZON"), 0
    lo, hi = seqno.timestamp_ms_of(first), seqno.timestamp_ms_of(committed)
    for _ in range(BROWSE_PROBES_MAX):
        if lo >= hi:
            break
        mid = (lo + hi + 1) // 2
        page = await client.get_next_records(await client.get_iterator(stream, partition, "AT_TIMESTAMP",
                                                                       timestamp_ms=mid), max_records=1,
                                             skip_trimmed=True)
        if page.records and seqno.counter_of(page.records[0].sn) <= target:
            lo = mid
        else:
            hi = mid - 1
    return await client.get_iterator(stream, partition, "AT_TIMESTAMP", timestamp_ms=lo), target


def _record(r) -> dict:
    """One record for the page: its data as pretty JSON when it parses, else as text when it
    is printable UTF-8, else binary (base64, which the page shows as hex or base64); at
    most BROWSE_DATA_BYTES_MAX bytes of it."""
    data = r.data
    shown = data[:BROWSE_DATA_BYTES_MAX]
    out = {"sequence_number": str(r.sn), "partition": r.partition_id, "arrival_ms": seqno.timestamp_ms_of(r.sn),
           "partition_key": r.partition_key, "bytes": len(data), "cut": len(data) > len(shown),
           "base64": base64.b64encode(shown).decode(), "kind": "binary", "text": "",
           "headers": {k: _header_text(v) for k, v in r.headers.items()}}
    text = _printable(shown)
    if text is not None:
        out["kind"], out["text"] = "text", text
        if not out["cut"]:
            try:
                out["text"] = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
                out["kind"] = "json"
            except ValueError:
                pass
    return out


def _printable(raw: bytes) -> str | None:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if all(c.isprintable() or c in "\n\r\t" for c in text) else None


def _header_text(value: bytes) -> str:
    text = _printable(value)
    return text if text is not None else "base64:" + base64.b64encode(value).decode()


# --- HTTP helpers ------------------------------------------------------------------------------

def _token(environ, query: bool) -> str:
    """The caller's token: `Authorization: Bearer`, else (`query`) ?token=."""
    scheme, _, token = environ.get("HTTP_AUTHORIZATION", "").strip().partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else ""
    if not token and query:
        token = urllib.parse.parse_qs(environ.get("QUERY_STRING", "")).get("token", [""])[0]
    return token


def _cross_site(environ) -> str:
    """Why an action's request looks cross-site ("": it does not): an Origin other than
    this host, or a browser saying it comes from another site."""
    origin = environ.get("HTTP_ORIGIN", "")
    host = environ.get("HTTP_HOST", "")
    if origin and (origin == "null" or urllib.parse.urlsplit(origin).netloc != host):
        return f"an action from origin {origin[:128]!r}; only this console's own page ({host}) may act"
    site = environ.get("HTTP_SEC_FETCH_SITE", "")
    if site and site not in ("same-origin", "none"):
        return f"an action from a {site} page; only this console's own page may act"
    return ""


def _body(environ) -> dict:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise InvalidArgument("Content-Length is not a number") from None
    if not 0 < length <= ACTION_BODY_BYTES_MAX:
        raise InvalidArgument(f"an action's body of {length} bytes; expected 1..{ACTION_BODY_BYTES_MAX}")
    raw = environ["wsgi.input"].read(length)
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise InvalidArgument(f"the body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise InvalidArgument("the body is a JSON object")
    return body


def _json(start_response, status: str, obj, method: str, headers: list | None = None):
    return _answer(start_response, status, json.dumps(obj).encode(), "application/json",
                   [("Cache-Control", "no-store")] + (headers or []), method)


def _answer(start_response, status: str, body: bytes, content_type: str, headers: list, method: str):
    start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body)))]
                   + SECURITY_HEADERS + headers)
    return [b"" if method == "HEAD" else body]
