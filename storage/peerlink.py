"""One replication stream per (node, successor node), carrying every chain link between them.

The chain link protocol is storage/link.py: a `Sender` per (chain, successor) on the
predecessor, a `Receiver` per incoming hello on the successor. This module is their gRPC
driver. A node opens one `ReplicateLinks` stream to each node that is the successor (or,
for a chain it is the tail of, a learner) of any of its replicas:

- `PeerLink` (predecessor side): one task per successor node polls the senders whose
  replica moved (`Replica.watchers`), whose timer is due or whose acks came in, and writes
  what they send as `LinkFrame`s: many chains' batches in one message, one write.
- `IncomingLinks` (successor side, one per incoming stream): takes a frame, feeds each
  item to its chain's receiver, stores the frame's batches of different chains at once (so
  the node's group commit folds them into one LMDB transaction and one fsync) and those
  of one chain in order, and answers with `LinkAckFrame`s: every chain's acks together.

Each chain's messages keep their order on the stream. A hello starts a *session* of its
chain (numbered by the predecessor); every item names its chain and session, and what
arrives for a session that ended is dropped, as a message of a closed stream was before.
A session ends with an `end` item from either side, or with the stream. Losing the stream
breaks every session on it; each sender reconnects after LINK_RETRY_INTERVAL_S with a new
hello, as before.

Liveness: the predecessor pings (an empty `LinkFrame`) every LINK_KEEPALIVE_INTERVAL_S and
the successor answers each ping (an empty `LinkAckFrame`) at once; each end keeps a
`link.Keepalive`. A predecessor that heard nothing for LINK_ACK_TIMEOUT_S, or could not write
a frame in that time, ends the stream as silent: every chain link on it breaks
(`link.Silent`). A sender whose successor owes it an answer past LINK_ACK_TIMEOUT_S breaks
the same way on its own (`Sender.ack_deadline`). Either way the links are reported to the
chain manager as unresponsive, in one report per turn (`StorageNode.link_unresponsive`,
direction "successor"). A successor that heard nothing from a predecessor that pings for
LINK_ACK_TIMEOUT_S reports the chains of the stream the same way (direction "predecessor"):
that finds a paused or cut-off predecessor on an idle link too.

Bounds (sms/limits.py): per chain, CHAIN_INFLIGHT_BATCHES_MAX and CHAIN_INFLIGHT_BYTES_MAX;
per stream, LINK_INFLIGHT_BYTES_MAX over all its chains (`link.LinkBudget`) and
LINK_FRAME_BYTES_MAX per frame. The successor takes one frame at a time, so gRPC's flow
control holds back a predecessor that outruns its disk.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import logging
from collections.abc import Callable

import grpc

from kernel import audit
from sms import limits, security, seqno
from kernel.aiotools import cancel_and_wait, raise_if_cancelling, wait_event
from sms.proto import sms_pb2, sms_pb2_grpc
from storage import link, linkdriver
from storage.replica import Replica

log = logging.getLogger(__name__)

_STREAM_ERRORS = (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError, ConnectionError)
_ITEM_OVERHEAD_BYTES = 64          # a frame item's fields besides its batch (for LINK_FRAME_BYTES_MAX)


# --- the wire form of link messages --------------------------------------------------------

def down_to_pb(m: link.Down, session: int) -> sms_pb2.ReplicateRequest:
    if isinstance(m, link.Batch):
        return sms_pb2.ReplicateRequest(chain_id=m.chain_id, epoch=m.epoch, batch=m.batch, session=session,
                                        committed_sn=seqno.to_bytes(m.committed_sn))
    return sms_pb2.ReplicateRequest(chain_id=m.chain_id, epoch=m.epoch, session=session,
                                    hello=isinstance(m, link.Hello), reset=isinstance(m, link.Reset),
                                    verified=isinstance(m, link.Verified))


def down_from_pb(pb: sms_pb2.ReplicateRequest) -> link.Down | link.End:
    if pb.end:
        return link.End(pb.chain_id)
    if pb.hello:
        return link.Hello(pb.chain_id, pb.epoch)
    if pb.reset:
        return link.Reset(pb.chain_id, pb.epoch)
    if pb.verified:
        return link.Verified(pb.chain_id, pb.epoch)
    return link.Batch(pb.chain_id, pb.epoch, pb.batch, seqno.from_bytes(pb.committed_sn))


def up_to_pb(m: link.Up, session: int) -> sms_pb2.ReplicateAck:
    if isinstance(m, link.Refusal):
        return sms_pb2.ReplicateAck(chain_id=m.chain_id, session=session, epoch=m.epoch,
                                    error_name=m.error_name, error_message=m.error_message)
    if isinstance(m, link.Answer):
        return sms_pb2.ReplicateAck(chain_id=m.chain_id, session=session, epoch=m.epoch, answer=True,
                                    last_sn=seqno.to_bytes(m.last_sn), committed_sn=seqno.to_bytes(m.committed_sn),
                                    last_first_sn=seqno.to_bytes(m.last_first_sn), last_checksum=m.last_checksum)
    return sms_pb2.ReplicateAck(chain_id=m.chain_id, session=session, epoch=m.epoch,
                                last_sn=seqno.to_bytes(m.last_sn), committed_sn=seqno.to_bytes(m.committed_sn))


def up_from_pb(pb: sms_pb2.ReplicateAck) -> link.Up | link.End:
    if pb.end:
        return link.End(pb.chain_id)
    if pb.error_name:
        return link.Refusal(pb.chain_id, pb.epoch, pb.error_name, pb.error_message)
    if pb.answer:
        return link.Answer(pb.chain_id, pb.epoch, seqno.from_bytes(pb.last_sn), seqno.from_bytes(pb.committed_sn),
                           seqno.from_bytes(pb.last_first_sn), pb.last_checksum)
    return link.Ack(pb.chain_id, pb.epoch, seqno.from_bytes(pb.last_sn), seqno.from_bytes(pb.committed_sn))


def _item_bytes(pb) -> int:
    return len(pb.batch) + _ITEM_OVERHEAD_BYTES if isinstance(pb, sms_pb2.ReplicateRequest) else _ITEM_OVERHEAD_BYTES


def frames(items: list, make) -> list:
    """`items` cut into frames of at most LINK_FRAME_BYTES_MAX (one item always goes)."""
    out, cut, size = [], 0, 0
    for i, pb in enumerate(items):
        n = _item_bytes(pb)
        if i > cut and size + n > limits.LINK_FRAME_BYTES_MAX:
            out.append(make(items[cut:i]))
            cut, size = i, 0
        size += n
    if cut < len(items):
        out.append(make(items[cut:]))
    return out


def _ago(at: float | None) -> float:
    """Seconds since `at` on the loop's clock (-1.0: never)."""
    return -1.0 if at is None else max(0.0, asyncio.get_running_loop().time() - at)


def _describe(e: Exception) -> str:
    if isinstance(e, grpc.aio.AioRpcError):
        return f"{e.code().name}: {e.details()}"
    return f"{type(e).__name__}: {e}"


# --- the predecessor's side ----------------------------------------------------------------

class ChainSend:
    """One replica's link to one successor, carried by that successor's `PeerLink`: what
    `Replica.links` holds. It is the sender's transport (storage/linkdriver.py): a session
    on the peer's stream."""

    __slots__ = ("peer", "replica", "sender", "driver", "session", "armed", "quiet")

    def __init__(self, peer: "PeerLink", replica: Replica, learner: bool):
        self.peer = peer
        self.replica = replica
        self.sender = link.Sender(replica, peer.peer_id, learner, peer.budget,
                                  ack_timeout_s=limits.LINK_ACK_TIMEOUT_S,
                                  batch_ack_timeout_s=limits.LINK_BATCH_ACK_TIMEOUT_S,
                                  stale_retry_s=limits.LINK_STALE_RETRY_S)
        self.driver = linkdriver.SenderDriver(self.sender, replica, self)
        self.session = 0            # its session on the current stream (0: none)
        self.armed: float | None = None   # the sender's ack deadline a timer is set for
        self.quiet = False          # breaks are logged by the stream (it was lost): not per chain

    @property
    def acked_sn(self) -> int:
        """The successor's last stored SN (retention keeps the batch it ends with)."""
        return self.sender.acked_sn

    async def stop(self) -> None:
        self.peer.remove(self)

    # --- the transport (linkdriver.SenderTransport) ----------------------------------------
    def current(self) -> bool:
        return self.peer.chains.get(self.replica.chain_id) is self

    def send(self, message: link.Down) -> None:
        if self.session:
            self.peer._out.append(down_to_pb(message, self.session))

    def open(self) -> object:
        peer = self.peer
        if not peer._open_stream():
            return f"no address known for {peer.peer_id}"
        peer._next_session += 1
        self.session = peer._next_session
        return linkdriver.OPENED

    def close(self, action: link.Close) -> None:
        peer, cid = self.peer, self.replica.chain_id
        if self.session and peer._call is not None:
            peer._out.append(sms_pb2.ReplicateRequest(chain_id=cid, session=self.session, end=True))
        self.session = 0
        if not self.quiet and self.sender.state is not link.SenderState.STOPPED:
            log.info("link %s broken: %s", self.sender.name(), action.reason)
        if action.silent:
            peer._silenced.append((cid, self.sender.epoch))
            peer._silence_reason = action.reason
        elif action.suspect and peer.on_broken is not None:
            peer.on_broken(action.suspect)

    def set_timer(self, at: float) -> None:
        heapq.heappush(self.peer._timers, (at, self.replica.chain_id))


class PeerLink:
    """This node's stream to one successor node, and the senders of every chain link it
    carries. One task: it feeds the senders what came in, polls those whose replica moved
    or whose timer is due, carries out their actions and writes what they send, a frame at
    a time."""

    def __init__(self, node_id: str, peer_id: str, address_fn: Callable[[], str | None],
                 channel_fn: Callable[[str], grpc.aio.Channel], on_broken: Callable[[str], None] | None = None,
                 on_silent: Callable[[str, str, list[tuple[str, int]], str], None] | None = None):
        self.node_id = node_id
        self.peer_id = peer_id
        self.address_fn = address_fn
        self.channel_fn = channel_fn
        self.on_broken = on_broken          # (peer id) -> None: a link to it broke (failure detection)
        # (peer id, "successor", [(chain id, epoch)], reason) -> None: links to it went unanswered
        self.on_silent = on_silent
        self.keepalive: link.Keepalive | None = None     # the current stream's
        self.heard_at: float | None = None                # a frame last came from the peer (any stream)
        self._ping = False                                # a ping goes out with the next flush
        self._silenced: list[tuple[str, int]] = []        # chain links broken as silent, not yet reported
        self._silence_reason = ""
        self.budget = link.LinkBudget(limits.LINK_INFLIGHT_BYTES_MAX)
        self.chains: dict[str, ChainSend] = {}
        self.task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._dirty: dict[str, None] = {}                 # chains to poll (ordered)
        self._timers: list[tuple[float, str]] = []        # (when, chain id): a sender's deadline
        self._starved: set[str] = set()                   # chains held back by the stream's budget
        self._inbox: collections.deque = collections.deque()   # (stream number, ack items | reason lost)
        self._out: list[sms_pb2.ReplicateRequest] = []
        self._call = None
        self._reader: asyncio.Task | None = None
        self._stream = 0                                  # numbers streams: what an old one's reader left is dropped
        self._next_session = 0
        self._next_full_poll = 0.0
        self.frames = self.items = self.streams = 0

    # --- chains ------------------------------------------------------------------------
    def add(self, replica: Replica, learner: bool) -> ChainSend:
        chain = ChainSend(self, replica, learner)
        old = self.chains.get(replica.chain_id)
        if old is not None:
            self.remove(old)
        self.chains[replica.chain_id] = chain
        replica.watchers.add(self._watch)
        self._dirty[replica.chain_id] = None
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run(), name=f"peer-link-{self.peer_id}")
        self._wake.set()              # the task starts the sender
        return chain

    def remove(self, chain: ChainSend) -> None:
        """Stop a chain's link: its session ends (an `end` item tells the successor)."""
        cid = chain.replica.chain_id
        if self.chains.get(cid) is chain:
            del self.chains[cid]
        chain.replica.watchers.discard(self._watch)
        chain.sender.stop()
        if chain.session and self._call is not None:
            self._out.append(sms_pb2.ReplicateRequest(chain_id=cid, session=chain.session, end=True))
            self._wake.set()
        chain.session = 0

    def _watch(self, chain_id: str) -> None:          # Replica.notify
        self._dirty[chain_id] = None
        self._wake.set()

    @property
    def connected(self) -> bool:
        return self._call is not None

    async def stop(self) -> None:
        for chain in list(self.chains.values()):
            chain.sender.stop()
            chain.replica.watchers.discard(self._watch)
        self.chains.clear()
        await cancel_and_wait(self.task)
        await self._close_stream()

    # --- the task ----------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                await self._turn(loop)
            except asyncio.CancelledError:
                raise
            except Exception:      # a bug in one turn must not end every chain link to the peer
                raise_if_cancelling()
                log.exception("link to %s: a turn failed; the stream starts again", self.peer_id)
                await self._lost("the link's driver failed", loop.time())
                await asyncio.sleep(limits.LINK_RETRY_INTERVAL_S)

    async def _turn(self, loop) -> None:
        if not (self._inbox or self._dirty or self._out):
            timeout = max(0.0, self._next_full_poll - loop.time())
            if self._timers:
                timeout = min(timeout, max(0.0, self._timers[0][0] - loop.time()))
            if self.keepalive is not None:
                timeout = min(timeout, max(0.0, self.keepalive.next_check(loop.time()) - loop.time()))
            await wait_event(self._wake, timeout)
            # one more turn of the event loop: appends that finished together (one group
            # commit) and acks read together wake us once, and go out in one frame
            await asyncio.sleep(0)
        self._wake.clear()
        now = loop.time()
        while self._inbox:
            stream, what = self._inbox.popleft()
            if stream != self._stream:
                continue                           # left by a stream that ended
            if isinstance(what, str):
                await self._lost(what, now)
                continue
            blocked = not self.budget.room()
            for pb in what:
                chain = self.chains.get(pb.chain_id)
                if chain is None or pb.session != chain.session:
                    continue                       # a session that ended
                await self._act(chain, chain.sender.receive(up_from_pb(pb), now), now)
            if blocked and self.budget.room():
                for cid in self._starved:
                    self._dirty[cid] = None
                self._starved.clear()
        while self._timers and self._timers[0][0] <= now:
            when, cid = heapq.heappop(self._timers)
            chain = self.chains.get(cid)
            if chain is not None and chain.armed is not None and when >= chain.armed:
                chain.armed = None                 # (polled below; armed again if it still waits)
            self._dirty[cid] = None
        if self.keepalive is not None and self._call is not None:
            if self.keepalive.poll(now) is link.KeepaliveState.SILENT:
                await self._lost(f"nothing heard from {self.peer_id} for {self.keepalive.silent_for(now):.2f}s "
                                 f"(bound {limits.LINK_ACK_TIMEOUT_S}s)", now, silent=True)
            elif self.keepalive.ping_due(now):
                self.keepalive.pinged(now)
                self._ping = True
        if now >= self._next_full_poll:            # the safety net: every chain now and then
            self._next_full_poll = now + limits.LINK_IDLE_CHECK_S
            for cid in self.chains:
                self._dirty[cid] = None
        dirty, self._dirty = self._dirty, {}
        for cid in dirty:
            chain = self.chains.get(cid)
            if chain is None:
                continue
            sender = chain.sender
            await self._act(chain, sender.start(now) if sender.state is link.SenderState.IDLE else sender.poll(now),
                            now)
            if sender.state is link.SenderState.STREAMING and sender.view.last_sn > sender.sent_sn \
                    and not self.budget.room():
                self._starved.add(cid)
        await self._flush(now)
        self._report_silence()

    def _arm(self, chain: ChainSend) -> None:
        """A timer for the sender's ack deadline (one per chain at a time: when it fires
        early, because acks came meanwhile, the poll arms the next)."""
        at = chain.sender.ack_deadline
        if at is not None and (chain.armed is None or at < chain.armed):
            chain.armed = at
            heapq.heappush(self._timers, (at, chain.replica.chain_id))

    def _report_silence(self) -> None:
        if not self._silenced:
            return
        links, self._silenced = self._silenced, []
        log.warning("links to %s unanswered (%d chains): %s; reported", self.peer_id, len(links),
                    self._silence_reason)
        if self.on_silent is not None:
            self.on_silent(self.peer_id, "successor", links, self._silence_reason)

    async def _act(self, chain: ChainSend, actions: list, now: float, quiet: bool = False) -> None:
        chain.quiet = quiet
        try:
            await chain.driver.act(actions, now)
        finally:
            chain.quiet = False
        self._arm(chain)

    def _open_stream(self) -> bool:
        if self._call is not None:
            return True
        address = self.address_fn()
        if not address:
            return False
        self._stream += 1
        self.streams += 1
        self.keepalive = link.Keepalive(asyncio.get_running_loop().time(), pings=True,
                                        timeout_s=limits.LINK_ACK_TIMEOUT_S, interval_s=limits.LINK_KEEPALIVE_INTERVAL_S)
        compression = grpc.Compression.Gzip if limits.REPLICATION_COMPRESSION == "gzip" else None
        self._call = sms_pb2_grpc.StorageStub(self.channel_fn(address)).ReplicateLinks(compression=compression)
        self._reader = asyncio.get_running_loop().create_task(self._read(self._call, self._stream),
                                                              name=f"peer-link-acks-{self.peer_id}")
        return True

    async def _flush(self, now: float) -> None:
        if not (self._out or self._ping) or self._call is None:
            self._out.clear()
            self._ping = False
            return
        items, self._out = self._out, []
        call = self._call
        out = frames(items, lambda part: sms_pb2.LinkFrame(from_node=self.node_id, items=part))
        if self._ping:
            self._ping = False
            out.append(sms_pb2.LinkFrame(from_node=self.node_id))      # a ping: no items
        for frame in out:
            try:
                # a write that does not go through in time: the successor reads nothing
                # (paused, or the network drops what we send), and flow control holds us
                async with asyncio.timeout(limits.LINK_ACK_TIMEOUT_S):
                    await call.write(frame)
            except TimeoutError:
                if call is self._call:
                    await self._lost(f"a frame to {self.peer_id} was not taken in {limits.LINK_ACK_TIMEOUT_S}s",
                                     now, silent=True)
                return
            except _STREAM_ERRORS as e:
                raise_if_cancelling()
                if call is self._call:
                    await self._lost(_describe(e), now)
                return
            self.frames += 1
            self.items += len(frame.items)

    async def _lost(self, reason: str, now: float, silent: bool = False) -> None:
        """The stream ended (`silent`: we end it, the successor answers nothing): every
        session on it broke. One line in the log, not one per chain."""
        had = [c for c in self.chains.values() if c.session]
        await self._close_stream()
        self._out.clear()
        if had:
            log.info("stream to %s %s (%d chain links break): %s", self.peer_id, "silent" if silent else "lost",
                     len(had), reason)
        event = link.Silent if silent else link.Lost
        for chain in had:
            chain.session = 0
            await self._act(chain, chain.sender.receive(event(chain.replica.chain_id, reason), now), now,
                            quiet=True)
        self._report_silence()

    async def _read(self, call, stream: int) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                frame = await call.read()
                if frame is grpc.aio.EOF:
                    self._inbox.append((stream, "the successor ended the stream"))
                    break
                self.heard_at = loop.time()
                if stream == self._stream and self.keepalive is not None:
                    self.keepalive.heard(loop.time(), keepalive=not frame.items)
                if not frame.items:
                    continue                          # the answer to a ping
                self._inbox.append((stream, frame.items))
                self._wake.set()
        except _STREAM_ERRORS as e:
            raise_if_cancelling()
            self._inbox.append((stream, _describe(e)))
        self._wake.set()

    async def _close_stream(self) -> None:
        reader, call = self._reader, self._call
        self._reader = self._call = None
        self.keepalive = None
        self._ping = False
        self._stream += 1
        if call is not None:
            call.cancel()
        if reader is not None and reader is not asyncio.current_task():
            await cancel_and_wait(reader)

    def status(self) -> sms_pb2.PeerLinkStatus:
        return sms_pb2.PeerLinkStatus(peer=self.peer_id, outgoing=True, chains=len(self.chains), frames=self.frames,
                                      items=self.items, streams=self.streams, connected=self.connected,
                                      heard_ago_s=_ago(self.heard_at))


# --- the successor's side ------------------------------------------------------------------

class _Session:
    """One chain's session on an incoming stream: the receiver's transport
    (storage/linkdriver.py), answering on that stream."""

    __slots__ = ("links", "chain_id", "session", "receiver", "replica", "driver", "ended_by_peer")

    def __init__(self, links: "IncomingLinks", chain_id: str, session: int, receiver: link.Receiver,
                 replica: Replica | None):
        self.links = links
        self.chain_id = chain_id
        self.session = session
        self.receiver = receiver
        self.replica = replica             # captured at the hello (None: not held here)
        self.driver = linkdriver.ReceiverDriver(receiver, replica, self)
        self.ended_by_peer = False

    # --- the transport (linkdriver.LinkTransport) ------------------------------------------
    def send(self, message: link.Up) -> None:
        links = self.links
        if isinstance(message, link.Refusal) and message.error_name in AUDITED_REFUSALS:
            audit.event(audit.REPLICATION_REFUSED, self.chain_id, message.error_name,
                        {"node": links.sender} if links.sender else {}, links.peer, message.error_message)
        links._out.append(up_to_pb(message, self.session))

    def close(self, action: link.Close) -> None:
        links = self.links
        if links.sessions.get(self.chain_id) is self:
            del links.sessions[self.chain_id]
        if self.replica is not None and not any(o.replica is self.replica for o in links.sessions.values()):
            self.replica.watchers.discard(links._watch)
        if not self.ended_by_peer:
            links._out.append(sms_pb2.ReplicateAck(chain_id=self.chain_id, session=self.session, end=True))
        if action.suspect:
            links.node.suspect(action.suspect)


# refusals of a replication session that go to the audit log (kernel/audit.py): a caller
# that is not the chain's predecessor, a batch no reader could decode. (StaleEpoch and
# WrongOwner follow every restart and chain change: routine, not audited.)
AUDITED_REFUSALS = frozenset({"PermissionDenied", "CorruptBatch"})


class IncomingLinks:
    """The successor's side of one `ReplicateLinks` stream: a `link.Receiver` per session.
    A reader task takes frames in and carries out what the receivers ask of the replicas;
    the handler's own loop writes the acks, every chain's together."""

    def __init__(self, node, registry: dict):
        self.node = node                   # storage.service.StorageNode: replicas, suspect()
        self.registry = registry           # every IncomingLinks of the node (NodeStatus)
        self.peer = ""
        self.sender = ""
        self.sessions: dict[str, _Session] = {}
        self._out: list[sms_pb2.ReplicateAck] = []
        self._dirty: dict[str, None] = {}
        self._wake = asyncio.Event()
        self._taking = False              # a frame's actions are under way
        self._pongs = 0                   # pings to answer
        self.keepalive: link.Keepalive | None = None
        self.heard_at: float | None = None  # a frame last came from the predecessor
        self.frames = self.items = 0

    def _watch(self, chain_id: str) -> None:          # Replica.notify
        self._dirty[chain_id] = None
        self._wake.set()

    async def serve(self, context) -> None:
        # on a TLS cluster's cluster port, the predecessor as its certificate names it: a
        # hello from any other node is refused (link.Receiver), whatever its frames say
        self.sender = security.peer_node_id(context) or ""
        self.peer = self.sender
        self.registry[id(self)] = self
        loop = asyncio.get_running_loop()
        self.keepalive = link.Keepalive(loop.time(), pings=False, timeout_s=limits.LINK_ACK_TIMEOUT_S,
                                        interval_s=limits.LINK_KEEPALIVE_INTERVAL_S)
        reader = loop.create_task(self._take(context), name="incoming-links")
        reader.add_done_callback(lambda _t: self._wake.set())
        watchdog = loop.create_task(self._watch_silence(), name="incoming-links-watchdog")
        try:
            while True:
                await self._write(context)
                if reader.done():
                    reader.result()
                    return
                if self._taking:
                    # a frame is being stored: its acks go out together, once it is
                    self._wake.clear()
                    await wait_event(self._wake, limits.LINK_IDLE_CHECK_S)
                    continue
                if not (self._dirty or self._out or self._pongs):
                    await wait_event(self._wake, limits.LINK_IDLE_CHECK_S)
                self._wake.clear()
                dirty, self._dirty = self._dirty, {}
                for cid in dirty:
                    s = self.sessions.get(cid)
                    if s is not None and s.driver.due():
                        s.driver.poll()
        finally:
            # the stream ended, or the call was cancelled under us (the predecessor went away,
            # or we are stopping): every session still open ends with it
            reader.cancel()
            watchdog.cancel()
            self._end_all(lost="stream ended")
            self.registry.pop(id(self), None)

    async def _write(self, context) -> None:
        pongs, self._pongs = self._pongs, 0
        for _ in range(min(pongs, 1)):                 # (pings queued together: one answer does)
            await context.write(sms_pb2.LinkAckFrame())
        if not self._out:
            return
        items, self._out = self._out, []
        for frame in frames(items, lambda part: sms_pb2.LinkAckFrame(items=part)):
            await context.write(frame)

    async def _watch_silence(self) -> None:
        """A predecessor that pings and then goes silent for LINK_ACK_TIMEOUT_S (paused,
        or cut off, maybe one way) is reported, with the chains it feeds here, as often as
        StorageNode.link_unresponsive lets it while the silence lasts."""
        loop = asyncio.get_running_loop()
        while True:
            # (until the bound would pass since the last frame: then the silence is found at once)
            await asyncio.sleep(max(0.01, self.keepalive.next_check(loop.time()) - loop.time()))
            now = loop.time()
            if self.keepalive.poll(now) is not link.KeepaliveState.SILENT or not self.peer:
                continue
            links = [(s.chain_id, s.receiver.epoch) for s in self.sessions.values()
                     if s.receiver.state in (link.ReceiverState.VERIFYING, link.ReceiverState.STREAMING)]
            if links:
                self.node.link_unresponsive(self.peer, "predecessor", links,
                                            f"nothing heard from {self.peer} for {self.keepalive.silent_for(now):.2f}s "
                                            f"(bound {limits.LINK_ACK_TIMEOUT_S}s)")

    async def _take(self, context) -> None:
        while True:
            try:
                frame = await context.read()
            except asyncio.CancelledError:
                raise
            except Exception as e:    # the stream failed under us: the predecessor went away
                raise_if_cancelling()
                self._end_all(lost=f"{type(e).__name__}: {e}")
                return
            if frame is grpc.aio.EOF:
                # a predecessor never ends its stream on purpose (it cancels it when it
                # stops), and a killed one shows as an end here: its node is suspected
                self._end_all(lost="the predecessor's stream ended")
                return
            self.peer = self.sender or frame.from_node or self.peer
            self.heard_at = asyncio.get_running_loop().time()
            self.keepalive.heard(self.heard_at, keepalive=not frame.items)
            if not frame.items:                   # a ping: answered at once
                self._pongs += 1
                self._wake.set()
                continue
            self.frames += 1
            self.items += len(frame.items)
            work: dict[str, list] = {}          # chain id -> [(session, actions)], in order
            for pb in frame.items:
                cid = pb.chain_id
                s = self.sessions.get(cid)
                if pb.hello:
                    if s is not None:           # (the predecessor ends a session before its next hello)
                        s.ended_by_peer = True
                        work.setdefault(cid, []).append((s, s.receiver.receive(link.End(cid), s.replica)))
                    replica = self.node.replicas.get(cid)
                    s = _Session(self, cid, pb.session, link.Receiver(self.node.node_id, self.sender),
                                 replica if replica is not None and replica.active else None)
                    self.sessions[cid] = s
                    if s.replica is not None:
                        s.replica.watchers.add(self._watch)
                elif s is None or s.session != pb.session:
                    continue                    # a session that ended here
                elif pb.end:
                    s.ended_by_peer = True
                message = down_from_pb(pb)
                work.setdefault(cid, []).append((s, s.receiver.receive(message, s.replica)))
            self._taking = True
            try:
                if len(work) == 1:
                    for s, actions in next(iter(work.values())):
                        await s.driver.act(actions)
                elif work:
                    # chains at once (one group commit), each chain's actions in order
                    await asyncio.gather(*(self._perform_all(steps) for steps in work.values()))
            finally:
                self._taking = False
            self._wake.set()

    @staticmethod
    async def _perform_all(steps: list) -> None:
        for s, actions in steps:
            await s.driver.act(actions)

    def _end_all(self, lost: str) -> None:
        """The stream ended or was lost: every session on it, each suspecting its predecessor."""
        for s in list(self.sessions.values()):
            s.ended_by_peer = True
            s.driver.end(link.Lost(s.chain_id, lost))
        self.sessions.clear()

    def status(self) -> sms_pb2.PeerLinkStatus:
        return sms_pb2.PeerLinkStatus(peer=self.peer, outgoing=False, chains=len(self.sessions), frames=self.frames,
                                      items=self.items, connected=True, heard_ago_s=_ago(self.heard_at))
