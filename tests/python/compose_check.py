"""The official RocketMQ 5 Python client (rocketmq-python-client 5.1.2, unmodified)
against deploy/compose's two broker groups while tests/tests/compose.rs stops,
cuts off and restarts their containers.

One producer sends one message at a time, in turn to CoA (normal, broker-a), CoFifo
(FIFO, broker-a, --fifo-groups message groups) and CoB (normal, broker-b), until the
file --stop-file exists; SimpleConsumers (group CoSimple for CoA and CoB, FIFO group
CoFifoGroup for CoFifo) receive and ack meanwhile. Every body starts with --run
and a slash (a message another run left is acked and ignored). Every send is timed
from its first attempt to its acknowledgement (a send() that raises counts as a failed
attempt and is tried again, until --give-up-s). After the stop file it waits until
every acknowledged message was received, then prints one JSON line:

- sent_acked, failed_attempts, never_acked, lost (acknowledged, never received),
  fifo_out_of_order (a message group's message received for the first time
  after a later one of the same group);
- sends: [start (s since the Unix epoch), duration (s), body] of every send that
  took longer than --slow-s, so the caller can tell which fault each pause
  belongs to;
- acks_per_s: {second since the Unix epoch: acknowledgements in it}.

With --tls the calls go over TLS (the caller sets GRPC_DEFAULT_SSL_ROOTS_FILE_PATH
to the CA); with --access-key they are signed with the secret key in the
environment variable LEDGERMQ_SECRET_KEY.

Its first stdout line is "started" once the first message of each topic is
acknowledged. Exits 1 on a never-acknowledged send, a lost message or a FIFO order
violation.
"""

import argparse
import json
import os
import sys
import threading
import time

from rocketmq import (ClientConfiguration, Credentials, FilterExpression, Message,
                      Producer, SimpleConsumer)

NORMAL_A, FIFO_A, NORMAL_B = "CoA", "CoFifo", "CoB"
GROUP, FIFO_GROUP = "CoSimple", "CoFifoGroup"


def consume(consumer, run, stop, lock, received, fifo_seen, fifo_bad):
    """Receives and acks until stop; records this run's bodies, checks FIFO
    order."""
    while not stop.is_set():
        try:
            msgs = consumer.receive(32, 5)
        except Exception:  # noqa: BLE001 - failover: receive again
            time.sleep(0.1)
            continue
        for m in msgs or []:
            body = m.body.decode()
            mine, _, rest = body.partition("/")
            with lock:
                first = mine == run and body not in received
                if mine == run:
                    received.add(body)
                if first and rest.startswith("f"):
                    group, seq = rest[1:].split(":")
                    if int(seq) < fifo_seen.get(group, -1):
                        fifo_bad.append(body)
                    fifo_seen[group] = max(fifo_seen.get(group, -1), int(seq))
            try:
                consumer.ack(m)
            except Exception:  # noqa: BLE001 - unacked: redelivered later
                pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--access", required=True, help="host:port (broker-a:8081)")
    ap.add_argument("--stop-file", required=True)
    ap.add_argument("--fifo-groups", type=int, default=4)
    ap.add_argument("--give-up-s", type=float, default=30.0)
    ap.add_argument("--drain-s", type=float, default=60.0)
    ap.add_argument("--slow-s", type=float, default=0.25)
    ap.add_argument("--request-timeout-s", type=int, default=3)
    ap.add_argument("--access-key", default="")
    ap.add_argument("--tls", action="store_true", help="the ports serve TLS")
    ap.add_argument("--run", default=os.urandom(4).hex(),
                    help="prefix of every body: a message of another run is ignored")
    args = ap.parse_args()
    run = args.run

    secret_key = os.environ.get("LEDGERMQ_SECRET_KEY", "") if args.access_key else ""
    cfg = ClientConfiguration(args.access, Credentials(args.access_key, secret_key),
                              request_timeout=args.request_timeout_s)
    tls = args.tls
    lock, stop = threading.Lock(), threading.Event()
    received, fifo_seen, fifo_bad = set(), {}, []
    consumers = [
        SimpleConsumer(cfg, GROUP, {NORMAL_A: FilterExpression(),
                                    NORMAL_B: FilterExpression()}, await_duration=2,
                       tls_enable=tls),
        SimpleConsumer(cfg, FIFO_GROUP, {FIFO_A: FilterExpression()}, await_duration=2,
                       tls_enable=tls),
    ]
    threads = []
    for c in consumers:
        c.startup()
        t = threading.Thread(target=consume, daemon=True,
                             args=(c, run, stop, lock, received, fifo_seen, fifo_bad))
        t.start()
        threads.append(t)

    producer = Producer(cfg, (NORMAL_A, FIFO_A, NORMAL_B), tls_enable=tls)
    producer.startup()
    acked, never_acked, slow, acks_per_s = [], [], [], {}
    failed_attempts = 0
    fifo_seq = [0] * args.fifo_groups

    def send(body, build):
        nonlocal failed_attempts
        t0 = time.time()
        while True:
            try:
                producer.send(build())
                acked.append(body)
                second = str(int(time.time()))
                acks_per_s[second] = acks_per_s.get(second, 0) + 1
                break
            except Exception as e:  # noqa: BLE001 - count it, try again
                failed_attempts += 1
                print(f"{time.time():.3f} send {body} failed: {e}", file=sys.stderr,
                      flush=True)
                if time.time() - t0 > args.give_up_s:
                    never_acked.append(body)
                    break
                time.sleep(0.05)
        took = time.time() - t0
        if took > args.slow_s:
            slow.append([round(t0, 3), round(took, 3), body])

    def message(topic, body, group=None):
        m = Message()
        m.topic, m.body, m.keys = topic, body.encode(), body
        if group is not None:
            m.message_group = group
        return m

    i = 0
    started = time.time()
    while not os.path.exists(args.stop_file):
        send(f"{run}/a{i}", lambda i=i: message(NORMAL_A, f"{run}/a{i}"))
        g = i % args.fifo_groups
        fbody = f"{run}/f{g}:{fifo_seq[g]}"
        send(fbody, lambda fbody=fbody, g=g: message(FIFO_A, fbody, f"group-{g}"))
        fifo_seq[g] += 1
        send(f"{run}/b{i}", lambda i=i: message(NORMAL_B, f"{run}/b{i}"))
        if i == 0:
            print("started", flush=True)
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
        bad = list(fifo_bad)
    print(json.dumps({
        "sent_acked": len(acked),
        "send_s": round(send_s, 1),
        "failed_attempts": failed_attempts,
        "never_acked": len(never_acked),
        "lost": len(lost),
        "lost_examples": lost[:5],
        "fifo_out_of_order": len(bad),
        "fifo_out_of_order_examples": bad[:5],
        "drain_s": round(time.time() - drain_started, 1),
        "sends": slow,
        "acks_per_s": acks_per_s,
    }), flush=True)

    # The client's shutdown may wait on connections to stopped nodes: bound it.
    closer = threading.Thread(
        target=lambda: (producer.shutdown(), [c.shutdown() for c in consumers]),
        daemon=True)
    closer.start()
    closer.join(timeout=5)
    return 1 if never_acked or lost or bad else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
