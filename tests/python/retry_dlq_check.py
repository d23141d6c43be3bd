"""Retries and dead letters with the official RocketMQ 5 Python client's
PushConsumer (rocketmq-python-client 5.1.2, unmodified) against a running
LedgerMQ cluster.

Sends ok-* and bad-* messages to PyRetry (NORMAL) and fok-* / fbad-* to
PyRetryFifo (FIFO, one message group). PushConsumers of PyRetryGroup and
PyRetryFifoGroup (both made with retryMaxTimes --max-attempts) succeed on ok
messages and fail on bad ones: a normal bad message is nacked with the backoff
the broker's Settings give and redelivered; a FIFO one is retried in the client
and then forwarded with ForwardMessageToDeadLetterQueue. SimpleConsumers read
%DLQ%PyRetryGroup and %DLQ%PyRetryFifoGroup (which must exist: the Rust test
makes them with mqadmin, as RocketMQ operators do for readers of a DLQ).

Prints a JSON summary; exits 1 unless every bad message reaches its group's
dead-letter queue after exactly --max-attempts deliveries (attempts 1, 2, ...
from the broker for normal messages; that many tries of one delivery for FIFO
ones), no ok message does, and every ok message is consumed once.
"""

import argparse
import json
import os
import sys
import threading
import time

from rocketmq import (ClientConfiguration, ConsumeResult, Credentials,
                      FilterExpression, Message, Producer, PushConsumer,
                      SimpleConsumer)

NORMAL, FIFO = "PyRetry", "PyRetryFifo"
GROUP, FIFO_GROUP = "PyRetryGroup", "PyRetryFifoGroup"


class Listener:
    """Fails bad messages, records every delivery's attempt."""

    def __init__(self):
        self.lock = threading.Lock()
        self.attempts = {}  # body -> [delivery attempts seen]

    def consume(self, message):
        body = message.body.decode()
        with self.lock:
            self.attempts.setdefault(body, []).append(message.delivery_attempt)
        return ConsumeResult.FAILURE if "bad" in body else ConsumeResult.SUCCESS


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--access", required=True, help="host:port of one broker node")
    ap.add_argument("--messages", type=int, default=3)
    ap.add_argument("--max-attempts", type=int, default=2)
    args = ap.parse_args()
    cfg = ClientConfiguration(args.access, Credentials())
    errors = []

    producer = Producer(cfg, (NORMAL, FIFO))
    producer.startup()
    sent = []
    for i in range(args.messages):
        for body, topic in ((f"ok-{i}", NORMAL), (f"bad-{i}", NORMAL),
                            (f"fok-{i}", FIFO), (f"fbad-{i}", FIFO)):
            m = Message()
            m.topic, m.body = topic, body.encode()
            if topic == FIFO:
                m.message_group = "g"
            producer.send(m)
            sent.append(body)
    producer.shutdown()

    listener, fifo_listener = Listener(), Listener()
    push = PushConsumer(cfg, GROUP, listener, {NORMAL: FilterExpression()})
    push.startup()
    fifo_push = PushConsumer(cfg, FIFO_GROUP, fifo_listener, {FIFO: FilterExpression()})
    fifo_push.startup()

    dead = {}  # DLQ topic -> {body: attempt the copy says}
    readers = []
    for g in (GROUP, FIFO_GROUP):
        topic = f"%DLQ%{g}"
        reader = SimpleConsumer(cfg, f"{g}Dlq", {topic: FilterExpression()},
                                await_duration=3)
        reader.startup()
        readers.append((topic, reader))
        dead[topic] = {}

    bad = {b for b in sent if b.startswith("bad-")}
    fbad = {b for b in sent if b.startswith("fbad-")}
    want = {f"%DLQ%{GROUP}": bad, f"%DLQ%{FIFO_GROUP}": fbad}
    deadline = time.time() + 150
    while time.time() < deadline:
        for topic, reader in readers:
            try:
                msgs = reader.receive(16, 15)
            except Exception:  # noqa: BLE001 - nothing yet
                continue
            for m in msgs or []:
                dead[topic].setdefault(m.body.decode(), m.delivery_attempt)
                reader.ack(m)
        if all(want[t] <= set(dead[t]) for t in want):
            break
    # Late copies of ok messages, or more deliveries of bad ones, would come now.
    time.sleep(3)

    for topic, w in want.items():
        missing = sorted(w - set(dead[topic]))
        if missing:
            errors.append(f"{topic}: never dead-lettered: {missing}")
        extra = sorted(set(dead[topic]) - w)
        if extra:
            errors.append(f"{topic}: dead-lettered but consumed OK: {extra}")
    # A normal message comes back from the broker with the next attempt; a FIFO
    # one is retried by the client itself within one delivery.
    normal_attempts = list(range(1, args.max_attempts + 1))
    fifo_attempts = [1] * args.max_attempts
    for name, lst, prefix, expected_attempts in (
            ("normal", listener, "bad-", normal_attempts),
            ("fifo", fifo_listener, "fbad-", fifo_attempts)):
        with lst.lock:
            seen = dict(lst.attempts)
        for body in sorted(b for b in sent if b.startswith(prefix)):
            if seen.get(body) != expected_attempts:
                errors.append(f"{name} {body} delivered with attempts {seen.get(body)}, "
                              f"not {expected_attempts}")
        oks = [b for b in sent if b.startswith(prefix.replace("bad", "ok"))]
        for body in oks:
            if seen.get(body) != [1]:
                errors.append(f"{name} {body} delivered with attempts {seen.get(body)}, not [1]")

    print(json.dumps({
        "sent": len(sent),
        "dead_lettered": {t: len(d) for t, d in dead.items()},
        "attempts": {**listener.attempts, **fifo_listener.attempts},
        "errors": errors,
    }), flush=True)
    for c in [push, fifo_push] + [r for _, r in readers]:
        closer = threading.Thread(target=c.shutdown, daemon=True)
        closer.start()
        closer.join(timeout=10)
    return 1 if errors else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
