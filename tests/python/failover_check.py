"""The official RocketMQ 5 Python client (rocketmq-python-client 5.1.2, unmodified)
through the death of one node: how long sends pause, whether any fails, whether an
acknowledged message is lost.

One producer sends normal messages and FIFO messages (several message groups) one
at a time for --before-s seconds, SIGKILLs the process given by --kill-pid, and
sends for --after-s seconds more, while a SimpleConsumer receives and acks both
topics. Every send is timed from its first attempt to its acknowledgement (the
client retries 3 times itself; a send() that raises counts as a failed send and is
tried again, until --give-up-s). Then it waits until every acknowledged message was
received. Prints one JSON line; exits 1 on a failed send or a lost message.

Topics PfNormal (normal) and PfFifo (FIFO) and the group PfSimple must exist.
"""

import argparse
import json
import os
import signal
import sys
import threading
import time

from rocketmq import (ClientConfiguration, Credentials, FilterExpression, Message,
                      Producer, SimpleConsumer)

NORMAL, FIFO, GROUP = "PfNormal", "PfFifo", "PfSimple"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--access", required=True,
                    help="the client's endpoints: host:port (a DNS name or one node)")
    ap.add_argument("--kill-pid", type=int, default=0)
    ap.add_argument("--before-s", type=float, default=4.0)
    ap.add_argument("--after-s", type=float, default=8.0)
    ap.add_argument("--fifo-groups", type=int, default=4)
    ap.add_argument("--give-up-s", type=float, default=30.0)
    ap.add_argument("--drain-s", type=float, default=45.0)
    ap.add_argument("--request-timeout-s", type=int, default=3)
    args = ap.parse_args()

    cfg = ClientConfiguration(args.access, Credentials(),
                              request_timeout=args.request_timeout_s)
    lock = threading.Lock()
    received = set()
    stop = threading.Event()

    consumer = SimpleConsumer(cfg, GROUP, {NORMAL: FilterExpression(),
                                           FIFO: FilterExpression()}, await_duration=2)
    consumer.startup()

    def consume():
        while not stop.is_set():
            try:
                msgs = consumer.receive(32, 5)
            except Exception:  # noqa: BLE001 - failover: receive again
                time.sleep(0.1)
                continue
            for m in msgs or []:
                with lock:
                    received.add(m.body.decode())
                try:
                    consumer.ack(m)
                except Exception:  # noqa: BLE001 - unacked: redelivered later
                    pass

    consumer_thread = threading.Thread(target=consume, daemon=True)
    consumer_thread.start()

    producer = Producer(cfg, (NORMAL, FIFO))
    producer.startup()
    acked = []
    failed_sends = 0
    never_acked = []
    longest = (0.0, "", 0.0)  # (seconds, body, seconds since the kill at its start)
    longest_after_kill = 0.0  # the longest send that ended after the kill
    fifo_seq = [0] * args.fifo_groups
    started = time.time()
    killed_at = None

    def send(body, build):
        nonlocal failed_sends, longest, longest_after_kill
        t0 = time.time()
        ok = False
        while not ok:
            try:
                producer.send(build())
                ok = True
            except Exception as e:  # noqa: BLE001 - count it, try again
                failed_sends += 1
                print(f"send {body} failed: {e}", file=sys.stderr, flush=True)
                if time.time() - t0 > args.give_up_s:
                    never_acked.append(body)
                    break
                time.sleep(0.05)
        took = time.time() - t0
        if killed_at is not None:
            longest_after_kill = max(longest_after_kill, took)
        if took > longest[0]:
            since_kill = round(t0 - killed_at, 3) if killed_at else None
            longest = (took, body, since_kill)
        if ok:
            acked.append(body)

    i = 0
    while time.time() - started < args.before_s + args.after_s:
        if killed_at is None and time.time() - started >= args.before_s:
            if args.kill_pid:
                os.kill(args.kill_pid, signal.SIGKILL)
            killed_at = time.time()

        def normal(i=i):
            m = Message()
            m.topic, m.body, m.keys = NORMAL, f"n-{i}".encode(), f"key-{i}"
            return m

        send(f"n-{i}", normal)
        g = i % args.fifo_groups
        fbody = f"g{g}:{fifo_seq[g]}"

        def fifo(fbody=fbody, g=g):
            m = Message()
            m.topic, m.body, m.message_group = FIFO, fbody.encode(), f"group-{g}"
            return m

        send(fbody, fifo)
        fifo_seq[g] += 1
        i += 1
    send_s = time.time() - started

    drain_started = time.time()
    while time.time() - drain_started < args.drain_s:
        with lock:
            if set(acked) <= received:
                break
        time.sleep(0.2)
    stop.set()
    with lock:
        lost = sorted(set(acked) - received)
    summary = {
        "access": args.access,
        "sent_acked": len(acked),
        "send_s": round(send_s, 1),
        "failed_sends": failed_sends,
        "never_acked": len(never_acked),
        "lost": len(lost),
        "lost_examples": lost[:5],
        "longest_send_pause_s": round(longest[0], 3),
        "longest_send": longest[1],
        "longest_send_started_after_kill_s": longest[2],
        "longest_send_pause_after_kill_s": round(longest_after_kill, 3),
        "drain_s": round(time.time() - drain_started, 1),
    }
    print(json.dumps(summary), flush=True)

    # The client's shutdown may wait on connections to the killed node: bound it,
    # then leave without waiting for the client's own threads.
    closer = threading.Thread(target=lambda: (producer.shutdown(), consumer.shutdown()),
                              daemon=True)
    closer.start()
    closer.join(timeout=5)
    return 1 if failed_sends or never_acked or lost else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
