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

With --max-retry-gap-s S, a failed normal message must come back within S
seconds each time: the Rust test then gives PyRetryGroup a retry policy
(`mqadmin updateSubGroup -p`) whose delays are shorter than the default 10 s,
so the client's backoff shows the policy reached it through Settings.

With --kill-pid, SIGKILLs that process (the group's leader) right after the
first failed delivery of a normal message, so retries, nacks and dead-lettering
go on under the next leader. The cluster must record delivery attempts
(`exact_delivery_attempts = true` in the nodes' configs).

Prints a JSON summary; exits 1 unless every bad message reaches its group's
dead-letter queue after exactly --max-attempts deliveries (attempts 1, 2, ...
from the broker for normal messages; that many tries of one delivery for FIFO
ones), no ok message does, and every ok message is consumed once. Through a
leader kill: attempts are replicated (a normal message's with
DeliveryAttempts records, a FIFO one's with its lease), so a normal message's
attempts only go up across the kill, never starting again at 1; a delivery
the kill cut off before the client saw it still counts (the client may see
attempt 2 first), and an acknowledged message may come again.
"""

import argparse
import json
import os
import signal
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

    def __init__(self, kill_pid=0):
        self.lock = threading.Lock()
        self.attempts = {}  # body -> [delivery attempts seen]
        self.times = {}  # body -> [time.monotonic() of each delivery]
        self.kill_pid = kill_pid
        self.killed_at = None

    def consume(self, message):
        body = message.body.decode()
        with self.lock:
            self.attempts.setdefault(body, []).append(message.delivery_attempt)
            self.times.setdefault(body, []).append(time.monotonic())
            if "bad" in body and self.kill_pid and self.killed_at is None:
                os.kill(self.kill_pid, signal.SIGKILL)
                self.killed_at = time.time()
        return ConsumeResult.FAILURE if "bad" in body else ConsumeResult.SUCCESS


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--access", required=True, help="host:port of one broker node")
    ap.add_argument("--messages", type=int, default=3)
    ap.add_argument("--max-attempts", type=int, default=2)
    ap.add_argument("--kill-pid", type=int, default=0)
    ap.add_argument("--max-retry-gap-s", type=float, default=0,
                    help="if set: a failed normal message comes back within "
                         "this long (the group's retry policy reached the client)")
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

    listener, fifo_listener = Listener(args.kill_pid), Listener()
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
    deadline = time.time() + (210 if args.kill_pid else 150)
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
            got = seen.get(body) or []
            if not args.kill_pid:
                ok = got == expected_attempts
            elif name == "normal":
                # Attempts are replicated: they never start again at 1 under
                # the next leader. A delivery the kill cut off before the client
                # saw it still counts, so one may be missing; the last reached
                # the maximum (then it was dead-lettered).
                ok = (bool(got) and got == sorted(set(got))
                      and got[0] <= 2 and got[-1] == args.max_attempts)
            else:
                # Tries of one delivery, and of one more if the kill cut one.
                ok = (args.max_attempts <= len(got) <= 2 * args.max_attempts
                      and set(got) <= {1, 2})
            if not ok:
                errors.append(f"{name} {body} delivered with attempts {got}, "
                              f"not {expected_attempts}")
        oks = [b for b in sent if b.startswith(prefix.replace("bad", "ok"))]
        for body in oks:
            got = seen.get(body) or []
            # Through a kill an acknowledged message may come again (with the
            # next attempt: attempts never go back), and a delivery the kill
            # cut off before the client saw it still counts (its record or
            # lease was committed): the client then sees attempt 2 first.
            ok_under_kill = (args.kill_pid and got
                             and all(1 <= a <= args.max_attempts for a in got)
                             and (name == "fifo" or got == sorted(set(got))))
            if got != [1] and not ok_under_kill:
                errors.append(f"{name} {body} delivered with attempts {got}, not [1]")

    if args.kill_pid and listener.killed_at is None:
        errors.append("the leader was never killed: no normal message failed")
    # Seconds between a failed normal message's deliveries: the backoff the
    # client took from the group's retry policy (plus the broker's redelivery).
    with listener.lock:
        gaps = {b: [round(t2 - t1, 2) for t1, t2 in zip(ts, ts[1:])]
                for b, ts in listener.times.items() if b.startswith("bad-")}
    if args.max_retry_gap_s:
        slow = {b: g for b, g in gaps.items() if any(x > args.max_retry_gap_s for x in g)}
        if slow or not any(gaps.values()):
            errors.append(f"retries not within {args.max_retry_gap_s} s: {gaps}")
    print(json.dumps({
        "sent": len(sent),
        "dead_lettered": {t: len(d) for t, d in dead.items()},
        "attempts": {**listener.attempts, **fifo_listener.attempts},
        "retry_gaps_s": gaps,
        "leader_killed": listener.killed_at is not None,
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
