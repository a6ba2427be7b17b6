"""A de-duplicating producer in a process of its own, for the `kill_producer` fault kind.

`python -m tests.fault.producer_proc --address A --stream S --producer-id ID --name N
--incarnation I --log FILE [--rate R] [--keys K]` opens `client.producer(S,
producer_id=ID)` (so each start takes a new epoch of ID) and sends unique payloads
"<N><I>-<seq>" under K partition keys at R records/s until SIGTERM, then flushes, closes
and exits 0. It appends one line per event to FILE, flushed at once, so a SIGKILL loses
nothing the producer was told:

    S <seq> <key> <payload> <monotonic s>          submitted (queued in the producer)
    A <seq> <key> <payload> <partition> <sn> <0|1 duplicate> <monotonic s>
    E <seq> <key> <payload> <error name> <monotonic s>

`sn` is "-" when the answer had none (an acknowledgement without an SN: a violation the
checker reports). CLOCK_MONOTONIC is the machine's, so the times compare with the test
process's History. `load_log` reads such a file back into a History: submits, acks and
errors, and every record submitted but never answered as "Unsettled" (indeterminate: the
process died with it in flight).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time

import sms.aio
from sms import errors
from tests.fault.history import History
from tests.fault.workload import encode_payload

OUTSTANDING_MAX = 200          # un-settled records before send() waits for one
PAYLOAD_BYTES = 100


async def _run(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    log = open(args.log, "a", buffering=1, encoding="utf-8")     # line-buffered: one write per event
    space = asyncio.Semaphore(OUTSTANDING_MAX)

    def settled(seq: int, key: str, payload: str, future: asyncio.Future) -> None:
        space.release()
        if future.cancelled():
            log.write(f"E {seq} {key} {payload} Cancelled {time.monotonic():.6f}\n")
        elif future.exception() is not None:
            name = getattr(future.exception(), "name", type(future.exception()).__name__)
            log.write(f"E {seq} {key} {payload} {name} {time.monotonic():.6f}\n")
        else:
            r = future.result()
            sn = "-" if r.sn is None else str(r.sn)
            log.write(f"A {seq} {key} {payload} {r.partition_ordinal} {sn} {int(r.duplicate)} "
                      f"{time.monotonic():.6f}\n")

    async with sms.aio.Client(args.address) as client:
        async with client.producer(args.stream, producer_id=args.producer_id) as producer:
            interval_s = 1.0 / args.rate
            seq = 0
            while not stop.is_set():
                await space.acquire()
                key = f"{args.name}-k{seq % args.keys}"
                payload = f"{args.name}{args.incarnation}-{seq:06d}"
                try:
                    future = await producer.send(encode_payload(payload, PAYLOAD_BYTES), key)
                except errors.SmsError as e:
                    space.release()
                    if not e.retriable:
                        print(f"producer_proc: send refused: {e.name}: {e.message}", file=sys.stderr)
                        return 1
                    await asyncio.sleep(interval_s)
                    continue
                log.write(f"S {seq} {key} {payload} {time.monotonic():.6f}\n")
                future.add_done_callback(lambda f, s=seq, k=key, p=payload: settled(s, k, p, f))
                seq += 1
                try:
                    await asyncio.wait_for(stop.wait(), interval_s)
                except TimeoutError:
                    pass
            await producer.flush()
    log.close()
    return 0


def load_log(path: str, history: History, stream: str, producer: str) -> tuple[int, int]:
    """Record the file's events into `history` as the producer `producer` (one name per
    incarnation: its submission order holds within one). Returns (acks, unsettled)."""
    submitted: dict[str, tuple[int, str, float]] = {}
    answered: set[str] = set()
    acks = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if not line.endswith("\n") or not parts:
                continue                 # a line cut by the kill
            if parts[0] == "S":
                seq, key, payload, t = int(parts[1]), parts[2], parts[3], float(parts[4])
                submitted[payload] = (seq, key, t)
                history.record_submit(stream, producer, seq, key, payload, t)
            elif parts[0] == "A":
                seq, key, payload = int(parts[1]), parts[2], parts[3]
                partition, sn, duplicate, t = int(parts[4]), parts[5], parts[6] == "1", float(parts[7])
                answered.add(payload)
                acks += 1
                history.record_ack(stream, partition, key, payload, None if sn == "-" else int(sn), duplicate, t,
                                   producer=producer, seq=seq, sent_s=submitted.get(payload, (0, "", None))[2])
            elif parts[0] == "E":
                payload, name, t = parts[3], parts[4], float(parts[5])
                answered.add(payload)
                history.record_error(name, payload, t, producer=producer, stream=stream)
    unsettled = [p for p in submitted if p not in answered]
    for payload in unsettled:
        history.record_error("Unsettled", payload, producer=producer, stream=stream,
                             message="in flight when the producer process died")
    return acks, len(unsettled)


def count_acks(path: str) -> int:
    """Acks in the file so far."""
    try:
        with open(path, encoding="utf-8") as f:
            return sum(1 for line in f if line.startswith("A ") and line.endswith("\n"))
    except FileNotFoundError:
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fault.producer_proc", description=__doc__.split("\n")[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--producer-id", required=True)
    parser.add_argument("--name", required=True, help="payload prefix")
    parser.add_argument("--incarnation", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--rate", type=float, default=200.0, help="records/s")
    parser.add_argument("--keys", type=int, default=8)
    return asyncio.run(_run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
