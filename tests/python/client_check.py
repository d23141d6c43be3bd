"""The official RocketMQ 5 Python client (rocketmq-python-client 5.1.2, unmodified)
against a running LedgerMQ cluster.

Sends normal messages (tags TagA/TagB/TagC, keys) and FIFO messages (several message
groups), SIGKILLs the process given by --kill-pid half way, and consumes with a
SimpleConsumer (receive/ack, filter "TagA||TagB") and a PushConsumer (FIFO group).
Prints a JSON summary; exits 1 if an acknowledged message was never received, a
filtered-out message arrived, or a message group arrived out of order.

Topics PyNormal (normal) and PyFifo (FIFO) and the groups PySimple and PyPush (FIFO)
must exist (the Rust test creates them with mqadmin).
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

NORMAL, FIFO = "PyNormal", "PyFifo"


def send_retrying(producer, build, limit_s):
    """Sends until acknowledged (the client retries 3 times itself)."""
    deadline = time.time() + limit_s
    while True:
        try:
            producer.send(build())
            return True
        except Exception:  # noqa: BLE001 - any failure: try again until the deadline
            if time.time() > deadline:
                return False
            time.sleep(0.1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--access", required=True, help="host:port of one broker node")
    ap.add_argument("--kill-pid", type=int, default=0)
    ap.add_argument("--messages", type=int, default=120)
    ap.add_argument("--fifo-groups", type=int, default=3)
    ap.add_argument("--fifo-per-group", type=int, default=15)
    args = ap.parse_args()

    cfg = ClientConfiguration(args.access, Credentials())
    lock = threading.Lock()
    simple_got, push_got = [], []
    stop = threading.Event()

    class Listener:
        def consume(self, m):
            with lock:
                push_got.append(m.body.decode())
            return ConsumeResult.SUCCESS

    push = PushConsumer(cfg, "PyPush", Listener(), {FIFO: FilterExpression()})
    push.startup()
    simple = SimpleConsumer(cfg, "PySimple", {NORMAL: FilterExpression("TagA||TagB")},
                            await_duration=5)
    simple.startup()

    def simple_loop():
        while not stop.is_set():
            try:
                msgs = simple.receive(16, 10)
            except Exception:  # noqa: BLE001 - failover: receive again
                time.sleep(0.2)
                continue
            for m in msgs or []:
                with lock:
                    simple_got.append(m.body.decode())
                for _ in range(20):
                    try:
                        simple.ack(m)
                        break
                    except Exception as e:  # noqa: BLE001
                        if "INVALID_RECEIPT_HANDLE" in str(e):
                            break
                        time.sleep(0.1)

    t = threading.Thread(target=simple_loop, daemon=True)
    t.start()

    producer = Producer(cfg, (NORMAL, FIFO))
    producer.startup()
    acked, excluded, fifo_acked = set(), 0, {}
    longest_send_s = 0.0
    fifo_every = max(1, args.messages // args.fifo_per_group)
    for i in range(args.messages):
        if i == args.messages // 2 and args.kill_pid:
            os.kill(args.kill_pid, signal.SIGKILL)
        tag = ("TagA", "TagB", "TagC")[i % 3]
        body = f"n-{i}"

        def normal(body=body, tag=tag, i=i):
            m = Message()
            m.topic, m.body, m.tag, m.keys = NORMAL, body.encode(), tag, f"key-{i}"
            return m

        t0 = time.time()
        if not send_retrying(producer, normal, 30):
            print(json.dumps({"error": f"send {body} never acknowledged"}))
            return 1
        longest_send_s = max(longest_send_s, time.time() - t0)
        if tag == "TagC":
            excluded += 1
        else:
            acked.add(body)
        if i % fifo_every == 0:
            for g in range(args.fifo_groups):
                seq = len(fifo_acked.setdefault(g, []))
                fbody = f"g{g}:{seq}"

                def fifo(fbody=fbody, g=g):
                    m = Message()
                    m.topic, m.body, m.message_group = FIFO, fbody.encode(), f"group-{g}"
                    return m

                t0 = time.time()
                if not send_retrying(producer, fifo, 60):
                    print(json.dumps({"error": f"FIFO send {fbody} never acknowledged"}))
                    return 1
                longest_send_s = max(longest_send_s, time.time() - t0)
                fifo_acked[g].append(seq)
    producer.shutdown()
    fifo_total = sum(len(v) for v in fifo_acked.values())

    drain_started = time.time()
    deadline = drain_started + 90
    while time.time() < deadline:
        with lock:
            done = acked <= set(simple_got) and len(set(push_got)) >= fifo_total
        if done:
            break
        time.sleep(0.2)
    drain_s = round(time.time() - drain_started, 1)
    stop.set()
    t.join(timeout=15)
    with lock:
        simple_seen, push_seen = list(simple_got), list(push_got)

    errors = []
    lost = sorted(acked - set(simple_seen))
    if lost:
        errors.append(f"{len(lost)} acknowledged normal messages never received, e.g. {lost[:5]}")
    leaked = [b for b in simple_seen if int(b[2:]) % 3 == 2]
    if leaked:
        errors.append(f"TagC messages passed the TagA||TagB filter: {leaked[:5]}")
    fifo_lost = fifo_total - len(set(push_seen))
    if fifo_lost:
        errors.append(f"{fifo_lost} acknowledged FIFO messages never received")
    last, seen = {}, set()
    for b in push_seen:
        g, seq = b.split(":")
        seq = int(seq)
        prev = last.get(g, -1)
        # A message arrives for the first time only right after the group's
        # previous one; a redelivery may repeat messages that arrived before (a
        # FIFO batch not acked comes back from its first unacked message).
        again = b in seen
        seen.add(b)
        if not (seq == prev + 1 or (again and seq <= prev)):
            errors.append(f"group {g}: {seq} arrived after {prev}")
            break
        last[g] = max(prev, seq)
    print(json.dumps({
        "drain_s": drain_s,
        "acked_normal": len(acked),
        "acked_fifo": fifo_total,
        "filtered_out_sent": excluded,
        "received_normal_deliveries": len(simple_seen),
        "received_fifo_deliveries": len(push_seen),
        "longest_send_s": round(longest_send_s, 3),
        "errors": errors,
    }), flush=True)

    # The client's shutdown may wait on connections to the killed node: bound it,
    # then leave without waiting for the client's own threads.
    closer = threading.Thread(target=lambda: (push.shutdown(), simple.shutdown()), daemon=True)
    closer.start()
    closer.join(timeout=10)
    return 1 if errors else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
