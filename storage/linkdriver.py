"""The one driver of the chain link machines: what their actions mean, for every transport.

storage/link.py's `Sender` and `Receiver` say what to do (actions); this module does it.
The code that carries out those actions exists once, here, written against a small
transport interface, and three transports plug into it:

- gRPC (storage/peerlink.py): `ChainSend` for one chain's sender on a `PeerLink` stream,
  `_Session` for one chain's receiver on an `IncomingLinks` stream;
- the simulation (tests/sim/harness.py), which carries messages over a simulated network
  with drops, reorders and duplicates;
- the unit tests' in-memory wire (tests/unit/test_link.py).

So a fix to what an action means is made once, and the simulation's sweep exercises the
code that production runs.

What the driver does with each action:

    Sender                                   Receiver
    Send        transport.send(message)      Send      transport.send(message)
    Open        transport.open(): OPENED ->  Close     transport.close(action)
                  sender.opened(), PENDING   Store     skipped once the receiver closed;
                  -> later `opened()`, a               else replica.apply; a failure goes
                  reason -> open_failed()              back in as `store_failed`
    Close       transport.close(action)      ResetLog, MarkVerified  replica.apply
    SetTimer    transport.set_timer(at)
    Commit, LearnerAcked  replica.apply, while the link is still the replica's
                (transport.current())
    FinishSending  nothing: after a reset the successor ends the session itself

An action the driver does not know is a bug (`invariant`).
"""

from __future__ import annotations

import collections
from typing import Protocol

from sms.errors import invariant
from storage import link

PENDING = object()        # LinkTransport.open: the stream opens later; the transport calls opened()
OPENED = None             # LinkTransport.open: the stream is open now


class LinkTransport(Protocol):
    """What a link's driver needs from its transport: one chain's end of a stream."""

    def send(self, message) -> None:
        """Put a message on the chain's current session (dropped when it has none)."""

    def close(self, action: link.Close) -> None:
        """End the chain's session; report `action.suspect` / `action.silent` as the node does."""


class SenderTransport(LinkTransport, Protocol):
    def open(self) -> object:
        """Open a session: OPENED (now), PENDING (the transport calls `opened` later) or a
        reason it cannot (str)."""

    def set_timer(self, at: float) -> None:
        """Poll the sender at `at` (the driver's clock) or soon after."""

    def current(self) -> bool:
        """This link is still the one its replica has (a replaced link applies nothing)."""


class Observer:
    """Optional hooks around each replica change (the simulation keeps its story and
    statistics with them); the defaults do nothing."""

    def before_apply(self, action) -> None:
        pass

    def after_apply(self, action, error) -> None:
        pass


_QUIET = Observer()


class SenderDriver:
    """Carries out one `link.Sender`'s actions on its replica and its transport."""

    __slots__ = ("sender", "replica", "transport", "observer")

    def __init__(self, sender: link.Sender, replica, transport: SenderTransport, observer: Observer | None = None):
        self.sender = sender
        self.replica = replica
        self.transport = transport
        self.observer = observer or _QUIET

    async def start(self, now: float) -> None:
        await self.act(self.sender.start(now), now)

    async def poll(self, now: float) -> None:
        await self.act(self.sender.poll(now), now)

    async def receive(self, message, now: float) -> None:
        await self.act(self.sender.receive(message, now), now)

    async def opened(self, now: float) -> None:
        """The transport opened the session it answered PENDING for."""
        await self.act(self.sender.opened(now), now)

    async def act(self, actions: list, now: float) -> None:
        pending = collections.deque(actions)
        sender, transport = self.sender, self.transport
        while pending:
            action = pending.popleft()
            if isinstance(action, link.Send):
                transport.send(action.message)
            elif isinstance(action, link.Open):
                if not transport.current():
                    continue
                opened = transport.open()
                if opened is OPENED:
                    pending.extend(sender.opened(now))
                elif opened is not PENDING:
                    pending.extend(sender.open_failed(now, str(opened)))
            elif isinstance(action, link.Close):
                transport.close(action)
            elif isinstance(action, link.SetTimer):
                transport.set_timer(action.at)
            elif isinstance(action, (link.Commit, link.LearnerAcked)):
                if transport.current():
                    self.observer.before_apply(action)
                    error = await self.replica.apply(action)
                    self.observer.after_apply(action, error)
            elif not isinstance(action, link.FinishSending):
                invariant(False, f"a sender's action no driver knows: {type(action).__name__}")


class ReceiverDriver:
    """Carries out one `link.Receiver`'s actions on its replica (None: not held here; then
    the receiver only refuses) and its transport."""

    __slots__ = ("receiver", "replica", "transport", "observer")

    def __init__(self, receiver: link.Receiver, replica, transport: LinkTransport, observer: Observer | None = None):
        self.receiver = receiver
        self.replica = replica
        self.transport = transport
        self.observer = observer or _QUIET

    async def receive(self, message) -> None:
        await self.act(self.receiver.receive(message, self.replica))

    def due(self) -> bool:
        return self.replica is not None and self.receiver.due(self.replica)

    def poll(self) -> None:
        """Acks as the replica moved on (a poll only sends or closes: no await)."""
        self.act_now(self.receiver.poll(self.replica))

    def end(self, message: link.End | link.Lost) -> None:
        """The session ended or its stream was lost (only sends or closes: no await)."""
        self.act_now(self.receiver.receive(message, self.replica))

    def act_now(self, actions: list) -> None:
        for action in actions:
            if isinstance(action, link.Send):
                self.transport.send(action.message)
            else:
                if not isinstance(action, link.Close):
                    invariant(False, f"a receiver's action needs the replica: {type(action).__name__}")
                self.transport.close(action)

    async def act(self, actions: list) -> None:
        for action in actions:
            if isinstance(action, (link.Send, link.Close)):
                self.act_now([action])
            elif isinstance(action, link.Store) and self.receiver.state is link.ReceiverState.CLOSED:
                continue                        # refused meanwhile: nothing more is stored
            else:
                # (the message is made only when it is raised: a Store's repr holds its batch)
                if not isinstance(action, (link.Store, link.ResetLog, link.MarkVerified)):
                    invariant(False, f"a receiver's action no driver knows: {type(action).__name__}")
                self.observer.before_apply(action)
                error = await self.replica.apply(action)
                self.observer.after_apply(action, error)
                if error is not None:
                    await self.act(self.receiver.store_failed(error))
