"""Delay messages with the official RocketMQ 5 Python client
(rocketmq-python-client 5.1.2, unmodified) against a running LedgerMQ cluster.

Sends --messages delay messages to PyDelay (message.type=DELAY) with delivery
timestamps 3 to 6 s ahead (in seconds, as the client sends them), optionally
SIGKILLs the process given by --kill-pid right after (so the timers fall due
during or after the election), and receives them with a SimpleConsumer of group
PyDelayGroup. Also sends one whose timestamp is in milliseconds (the docstring
trap: tens of thousands of years ahead) and expects ILLEGAL_DELIVERY_TIME.

Prints a JSON summary (lateness after the delivery time per message: median,
p99, max); exits 1 if a message was lost, arrived before its delivery time, or
the far-future one was accepted.
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

TOPIC, GROUP = "PyDelay", "PyDelayGroup"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--access", required=True, help="host:port of one broker node")
    ap.add_argument("--kill-pid", type=int, default=0)
    ap.add_argument("--messages", type=int, default=40)
    args = ap.parse_args()
    cfg = ClientConfiguration(args.access, Credentials())
    errors = []
    lock = threading.Lock()
    got = {}  # body -> first receive time (s)
    stop = threading.Event()

    consumer = SimpleConsumer(cfg, GROUP, {TOPIC: FilterExpression()}, await_duration=5)
    consumer.startup()

    def receive_loop():
        while not stop.is_set():
            try:
                msgs = consumer.receive(32, 15)
            except Exception:  # noqa: BLE001 - failover: receive again
                time.sleep(0.2)
                continue
            now = time.time()
            for m in msgs or []:
                with lock:
                    got.setdefault(m.body.decode(), now)
                for _ in range(20):
                    try:
                        consumer.ack(m)
                        break
                    except Exception as e:  # noqa: BLE001
                        if "INVALID_RECEIPT_HANDLE" in str(e):
                            break
                        time.sleep(0.1)

    t = threading.Thread(target=receive_loop, daemon=True)
    t.start()

    producer = Producer(cfg, (TOPIC,))
    producer.startup()
    due = {}  # body -> delivery time (s)
    failed_attempts = 0  # sends answered with an error: each may have been stored
    for i in range(args.messages):
        at = int(time.time()) + 3 + i % 4
        body = f"d-{i}"
        m = Message()
        m.topic, m.body, m.keys = TOPIC, body.encode(), f"key-{i}"
        m.delivery_timestamp = at
        for attempt in range(30):
            try:
                producer.send(m)
                due[body] = at
                break
            except Exception as e:  # noqa: BLE001 - retried: at least once
                failed_attempts += 1
                if attempt == 29:
                    errors.append(f"send {body} never acknowledged: {e}")
                time.sleep(0.2)
    far = Message()
    far.topic, far.body = TOPIC, b"far"
    far.delivery_timestamp = int(time.time() * 1000) + 10_000
    try:
        producer.send(far)
        errors.append("a delivery timestamp tens of thousands of years ahead was accepted")
        far_refusal = None
    except Exception as e:  # noqa: BLE001
        far_refusal = str(e)
        # The client reports the status code as its number (ILLEGAL_DELIVERY_TIME).
        if not far_refusal.startswith("40012,"):
            errors.append(f"the far-future message was refused otherwise: {e}")
    killed_at = None
    if args.kill_pid:
        os.kill(args.kill_pid, signal.SIGKILL)
        killed_at = time.time()
    producer.shutdown()

    deadline = time.time() + 90
    while time.time() < deadline:
        with lock:
            if set(due) <= set(got):
                break
        time.sleep(0.2)
    stop.set()
    t.join(timeout=20)
    with lock:
        received = dict(got)
    lost = sorted(set(due) - set(received))
    if lost:
        errors.append(f"{len(lost)} acknowledged delay messages never received, e.g. {lost[:5]}")
    early = [b for b, at in due.items() if b in received and received[b] < at]
    if early:
        errors.append(f"{len(early)} delay messages received before their time, e.g. {early[:5]}")
    late_ms = sorted(round((received[b] - at) * 1000) for b, at in due.items() if b in received)

    def pct(p):
        return late_ms[min(len(late_ms) - 1, int(len(late_ms) * p))] if late_ms else None

    print(json.dumps({
        "sent": len(due),
        "failed_attempts": failed_attempts,
        "received": len(set(received) & set(due)),
        "leader_killed": killed_at is not None,
        "late_ms_median": pct(0.5),
        "late_ms_p99": pct(0.99),
        "late_ms_max": late_ms[-1] if late_ms else None,
        "far_future_refusal": far_refusal,
        "errors": errors,
    }), flush=True)
    closer = threading.Thread(target=consumer.shutdown, daemon=True)
    closer.start()
    closer.join(timeout=10)
    return 1 if errors else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
