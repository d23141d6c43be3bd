"""Transactional messages with the official RocketMQ 5 Python client
(rocketmq-python-client 5.1.2, unmodified) against a running LedgerMQ cluster.

A transaction producer of PyTx (message.type=TRANSACTION), with a checker,
sends half messages through one access node and:
  - commits some (c-*) and rolls back others (r-*);
  - leaves some unended (orphans, o-commit-* and o-rollback-*), which the broker
    checks back: the checker answers COMMIT or ROLLBACK by the body;
  - sends one (late) and checks it is not received while it is a half message,
    then commits it;
  - optionally SIGKILLs the process --kill-pid (the leader) right after the
    commits and rollbacks were answered OK, then sends, commits and rolls back
    more (c2-*, r2-*) through the election.
A SimpleConsumer of PyTxGroup receives the topic throughout.

Prints a JSON summary; exits 1 if a committed message (answered OK, or an orphan
the checker committed) was never received, a rolled-back one was received, a
half message was received before its commit, or no check back came.
"""

import argparse
import json
import os
import signal
import sys
import threading
import time

from rocketmq import (ClientConfiguration, Credentials, FilterExpression, Message,
                      Producer, SimpleConsumer, TransactionChecker,
                      TransactionResolution)

TOPIC, GROUP = "PyTx", "PyTxGroup"


class Checker(TransactionChecker):
    """Answers a check back by the body's prefix; records what was checked."""

    def __init__(self):
        self.lock = threading.Lock()
        self.checked = {}  # body -> checks

    def check(self, message):
        body = message.body.decode()
        with self.lock:
            self.checked[body] = self.checked.get(body, 0) + 1
        if body.startswith("o-unknown-"):
            return TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED
        if body.startswith("o-rollback-") or body.startswith("r"):
            return TransactionResolution.ROLLBACK
        return TransactionResolution.COMMIT


def retry(what, fn, errors, attempts=40):
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - failover: try again
            if attempt == attempts - 1:
                errors.append(f"{what} failed {attempts} times: {e}")
            time.sleep(0.25)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--access", required=True, help="host:port of one broker node")
    ap.add_argument("--kill-pid", type=int, default=0)
    ap.add_argument("--messages", type=int, default=10)
    ap.add_argument("--check-max", type=int, default=3,
                    help="the broker's transaction_check_max")
    args = ap.parse_args()
    cfg = ClientConfiguration(args.access, Credentials())
    errors = []
    lock = threading.Lock()
    got = {}  # body -> first receive time
    stop = threading.Event()

    consumer = SimpleConsumer(cfg, GROUP, {TOPIC: FilterExpression()}, await_duration=3)
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

    checker = Checker()
    producer = Producer(cfg, (TOPIC,), checker=checker)
    producer.startup()

    committed, rolled_back = set(), set()  # answered OK
    orphans_commit, orphans_rollback, orphans_unknown = set(), set(), set()

    def send_half(body):
        tx = producer.begin_transaction()
        m = Message()
        m.topic, m.body, m.keys = TOPIC, body.encode(), body
        receipt = producer.send(m, tx)
        if not receipt.transaction_id:
            errors.append(f"{body}: the send receipt has no transaction id")
        return tx

    def run_batch(prefix_c, prefix_r, n):
        for i in range(n):
            for body, commit in ((f"{prefix_c}-{i}", True), (f"{prefix_r}-{i}", False)):
                tx = retry(f"send {body}", lambda b=body: send_half(b), errors)
                if tx is None:
                    continue
                if retry(f"end {body}", tx.commit if commit else tx.rollback, errors) is not None:
                    (committed if commit else rolled_back).add(body)

    run_batch("c", "r", args.messages)
    # Orphans: sent, never ended by the producer.
    for i in range(2):
        for body, dest in ((f"o-commit-{i}", orphans_commit), (f"o-rollback-{i}", orphans_rollback),
                           (f"o-unknown-{i}", orphans_unknown)):
            if retry(f"send {body}", lambda b=body: send_half(b), errors) is not None:
                dest.add(body)
    # A half message is invisible until its commit.
    late = retry("send late", lambda: send_half("late"), errors)
    time.sleep(3)
    with lock:
        if "late" in got:
            errors.append("a half message was received before its commit")
    if late is not None and retry("commit late", late.commit, errors) is not None:
        committed.add("late")

    killed_at = None
    if args.kill_pid:
        os.kill(args.kill_pid, signal.SIGKILL)
        killed_at = time.time()
        run_batch("c2", "r2", args.messages // 2)

    expected = committed | orphans_commit
    deadline = time.time() + 90
    while time.time() < deadline:
        with lock:
            if expected <= set(got):
                break
        time.sleep(0.2)
    # An orphan whose checks are all answered UNKNOWN is discarded after the
    # last; a leader change may repeat the check due at that moment.
    deadline = time.time() + 30
    while time.time() < deadline:
        with checker.lock:
            if all(checker.checked.get(b, 0) >= args.check_max for b in orphans_unknown):
                break
        time.sleep(0.2)
    # Late deliveries of what was rolled back or discarded would come now.
    time.sleep(4)
    stop.set()
    t.join(timeout=20)
    with lock:
        received = set(got)
    with checker.lock:
        checked = dict(checker.checked)
    lost = sorted(expected - received)
    if lost:
        errors.append(f"{len(lost)} committed messages never received, e.g. {lost[:5]}")
    overchecked = {b: checked.get(b, 0) for b in orphans_unknown
                   if not args.check_max <= checked.get(b, 0) <= args.check_max + 1}
    if overchecked:
        errors.append(f"orphans answered UNKNOWN checked other than {args.check_max} times "
                      f"(+1 for the leader change): {overchecked}")
    leaked = sorted((rolled_back | orphans_rollback | orphans_unknown) & received)
    if leaked:
        errors.append(f"{len(leaked)} rolled-back messages received, e.g. {leaked[:5]}")
    unchecked = sorted((orphans_commit | orphans_rollback | orphans_unknown) - set(checked))
    if unchecked:
        errors.append(f"orphans never checked back: {unchecked}")

    print(json.dumps({
        "committed": len(committed),
        "rolled_back": len(rolled_back),
        "orphans": len(orphans_commit) + len(orphans_rollback) + len(orphans_unknown),
        "received": len(received & expected),
        "checked": checked,
        "leader_killed": killed_at is not None,
        "errors": errors,
    }), flush=True)
    for c in (producer, consumer):
        closer = threading.Thread(target=c.shutdown, daemon=True)
        closer.start()
        closer.join(timeout=10)
    return 1 if errors else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
