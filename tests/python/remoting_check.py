"""4.x remoting clients against a running LedgerMQ cluster: PyPI rocketmq==0.4.4
(a ctypes wrapper over the bundled rocketmq-client-cpp core, unmodified), which
speaks the remoting protocol to the name server and the brokers.

Run with PYTHONPATH naming the directory the package was installed into with
`pip install --target` (its `rocketmq` package would otherwise clash with the 5.x
client's). Modes:

- failover: a push consumer (group RemGroup) on RemTopic; --messages sync sends
  (tags TagA/TagB, keys) with the process --kill-pid SIGKILLed half way; then a
  batch send, delay-level sends (level 2: 5 s; never consumed before), and
  messages whose first consumption fails (sent back, consumed again). Fails on a
  send that never succeeds, an acknowledged message never consumed, a delay
  message consumed early, a failed message not consumed again.
- orderly: an orderly push consumer (group RemOrderGroup) on RemOrder; sends
  per key in order with send_orderly (same key, same queue), --kill-pid SIGKILLed
  half way; fails unless each key's messages are first consumed in order, all.
- send: --count messages to --topic (bodies --prefix-i, the first 10 KiB long,
  which the client compresses; tag TagX, keys --prefix-key-i), half of them in
  one batch.
- pull: a pull consumer reads every queue of --topic from offset 0 and fails
  unless the --count bodies --prefix-i are there with their tag and keys.

Prints a one-line JSON summary; exits 1 on a failure.
"""

import argparse
import json
import os
import signal
import sys
import threading
import time

from rocketmq.client import Message, Producer, PullConsumer, PushConsumer, RecvMessage
from rocketmq.ffi import _CConsumeStatus, dll

NS = None


def subscribe(consumer, topic, on_message):
    """PushConsumer.subscribe, except that on_message returning False asks for
    the message again (RECONSUME_LATER): 0.4.4's own wrapper re-raises the
    callback's exception inside ctypes, which then reports CONSUME_SUCCESS."""
    def cb(_consumer, m):
        try:
            ok = on_message(RecvMessage(m)) is not False
        except Exception:  # noqa: BLE001 - a failed consumption
            ok = False
        return (_CConsumeStatus.CONSUME_SUCCESS if ok else _CConsumeStatus.RECONSUME_LATER).value
    if dll.Subscribe(consumer._handle, topic.encode(), b"*") != 0:
        raise RuntimeError("Subscribe failed")
    consumer._register_callback(cb)

def producer(group):
    p = Producer(group, timeout=3000)
    p.set_namesrv_addr(NS)
    p.start()
    return p


def msg(topic, body, tag, key, delay_level=0):
    m = Message(topic)
    m.set_body(body)
    m.set_tags(tag)
    m.set_keys(key)
    if delay_level:
        m.set_delay_time_level(delay_level)
    return m


def send_until_ok(send, limit_s=90):
    """Sends until it succeeds; returns (failed attempts, pause in s)."""
    start = time.time()
    failed = 0
    while True:
        try:
            r = send()
            if int(r.status) == 0:
                return failed, time.time() - start
            failed += 1
        except Exception:  # noqa: BLE001 - failover: the client retries the send
            failed += 1
        if time.time() - start > limit_s:
            raise RuntimeError("a send did not succeed within %d s" % limit_s)
        time.sleep(0.2)


def kill(pid):
    if pid:
        os.kill(pid, signal.SIGKILL)


def wait_for(pred, limit_s):
    end = time.time() + limit_s
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.2)
    return pred()


def failover(args):
    lock = threading.Lock()
    got = {}  # body -> (first receive time, reconsume times seen)
    fail_once = set()

    def on_message(m):
        body = m.body.decode()
        with lock:
            if body.startswith("r-") and body not in fail_once:
                fail_once.add(body)
                return False
            first = got.get(body)
            got[body] = (first[0] if first else time.time(), max(m.reconsume_times, first[1] if first else 0),
                         m.tags.decode(), m.keys.decode())

    c = PushConsumer("RemGroup")
    c.set_namesrv_addr(NS)
    subscribe(c, "RemTopic", on_message)
    c.start()
    time.sleep(args.settle)
    p = producer("RemProducer")
    acked, failed, max_pause = [], 0, 0.0
    for i in range(args.messages):
        if i == args.messages // 2:
            kill(args.kill_pid)
        body = "m-%d" % i
        tag = "TagA" if i % 2 == 0 else "TagB"
        f, pause = send_until_ok(lambda: p.send_sync(msg("RemTopic", body, tag, "key-%d" % i)))
        failed += f
        max_pause = max(max_pause, pause)
        acked.append(body)
    batch = [msg("RemTopic", "b-%d" % i, "TagA", "bkey-%d" % i) for i in range(10)]
    f, _ = send_until_ok(lambda: p.send_batch(batch))
    failed += f
    acked += ["b-%d" % i for i in range(10)]
    delay_sent = {}
    for i in range(3):
        body = "d-%d" % i
        delay_sent[body] = time.time()
        f, _ = send_until_ok(lambda: p.send_sync(msg("RemTopic", body, "TagA", "dkey-%d" % i, 2)))
        failed += f
        acked.append(body)
    for i in range(3):
        body = "r-%d" % i
        f, _ = send_until_ok(lambda: p.send_sync(msg("RemTopic", body, "TagA", "rkey-%d" % i)))
        failed += f
        acked.append(body)
    complete = wait_for(lambda: all(b in got for b in acked), args.wait)
    c.shutdown()
    p.shutdown()
    errors = []
    missing = [b for b in acked if b not in got]
    if missing:
        errors.append("%d acknowledged messages never consumed, e.g. %s" % (len(missing), missing[:5]))
    early = [(b, got[b][0] - t) for b, t in delay_sent.items() if b in got and got[b][0] - t < 5.0]
    if early:
        errors.append("delay-level messages consumed before 5 s: %s" % early)
    # Sent after the leader's kill: consumers pulling from followers go on.
    late = [(b, got[b][0] - t - 5.0) for b, t in delay_sent.items() if b in got and got[b][0] - t > 10.0]
    if late:
        errors.append("delay-level messages consumed over 5 s after their time: %s" % late)
    not_retried = [b for b in ("r-0", "r-1", "r-2") if b in got and got[b][1] < 1]
    if not_retried:
        errors.append("failed messages not consumed again with reconsume_times >= 1: %s" % not_retried)
    wrong = [b for b in acked if b in got and b.startswith("m-")
             and (got[b][2] != ("TagA" if int(b[2:]) % 2 == 0 else "TagB") or got[b][3] != "key-" + b[2:])]
    if wrong:
        errors.append("tags or keys differ: %s" % wrong[:5])
    summary = {"mode": "failover", "sent": len(acked), "failed_attempts": failed,
               "received": len(got), "complete": complete,
               "max_send_pause_ms": int(max_pause * 1000),
               "delay_lateness_ms": sorted(int((got[b][0] - t - 5.0) * 1000)
                                           for b, t in delay_sent.items() if b in got),
               "errors": errors}
    print(json.dumps(summary))
    return not errors


def orderly(args):
    lock = threading.Lock()
    seen = {}  # key -> list of sequence numbers as first consumed
    first = set()
    queues = {}  # key -> queue ids its messages were consumed from

    def on_message(m):
        body = m.body.decode()  # "key:seq"
        key, seq = body.split(":")
        with lock:
            queues.setdefault(key, set()).add(m.queue_id)
            if body not in first:
                first.add(body)
                seen.setdefault(key, []).append(int(seq))

    c = PushConsumer("RemOrderGroup", orderly=True)
    c.set_namesrv_addr(NS)
    subscribe(c, "RemOrder", on_message)
    c.start()
    time.sleep(args.settle)
    p = producer("RemOrderProducer")
    keys, per_key = 8, args.messages // 8
    failed, max_pause, sent = 0, 0.0, 0
    for s in range(per_key):
        if s == per_key // 2:
            kill(args.kill_pid)
        for k in range(keys):
            body = "k%d:%d" % (k, s)
            f, pause = send_until_ok(lambda: p.send_orderly(msg("RemOrder", body, "TagA", body), k))
            failed += f
            max_pause = max(max_pause, pause)
            sent += 1
    complete = wait_for(lambda: len(first) >= sent, args.wait)
    c.shutdown()
    p.shutdown()
    errors = []
    for k in range(keys):
        got = seen.get("k%d" % k, [])
        if got != sorted(got):
            errors.append("key k%d consumed out of order: %s" % (k, got))
        if sorted(set(got)) != list(range(per_key)):
            errors.append("key k%d: %d of %d messages" % (k, len(set(got)), per_key))
        if len(queues.get("k%d" % k, ())) > 1:
            errors.append("key k%d stored in more than one queue: %s" % (k, sorted(queues["k%d" % k])))
    summary = {"mode": "orderly", "sent": sent, "failed_attempts": failed, "received": len(first),
               "complete": complete, "max_send_pause_ms": int(max_pause * 1000), "errors": errors}
    print(json.dumps(summary))
    return not errors


def body_of(prefix, i):
    """Message i's body: message 0's is 10 KiB, which the C++ core sends
    zlib-compressed (its threshold is 4 KiB)."""
    b = "%s-%d" % (prefix, i)
    return b + "|" + "z" * 10240 if i == 0 else b


def send(args):
    p = producer("RemSendProducer")
    half = args.count // 2
    for i in range(half):
        send_until_ok(lambda: p.send_sync(msg(args.topic, body_of(args.prefix, i), "TagX",
                                              "%s-key-%d" % (args.prefix, i))))
    batch = [msg(args.topic, body_of(args.prefix, i), "TagX", "%s-key-%d" % (args.prefix, i))
             for i in range(half, args.count)]
    if batch:
        send_until_ok(lambda: p.send_batch(batch))
    p.shutdown()
    print(json.dumps({"mode": "send", "sent": args.count}))
    return True


def pull(args):
    c = PullConsumer("RemPullGroup")
    c.set_namesrv_addr(NS)
    c.start()
    found = {}
    end = time.time() + args.wait
    while time.time() < end and len(found) < args.count:
        for m in c.pull(args.topic):
            body = m.body.decode()
            found[body.split("|")[0]] = (m.tags.decode(), m.keys.decode(), body)
    c.shutdown()
    errors = []
    for i in range(args.count):
        body = "%s-%d" % (args.prefix, i)
        if body not in found:
            errors.append("%s not pulled" % body)
        elif found[body] != ("TagX", "%s-key-%d" % (args.prefix, i), body_of(args.prefix, i)):
            errors.append("%s has tag, keys or body %s" % (body, str(found[body])[:80]))
    print(json.dumps({"mode": "pull", "pulled": len(found), "errors": errors[:10]}))
    return not errors


def main():
    global NS
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["failover", "orderly", "send", "pull"])
    ap.add_argument("--namesrv", required=True)
    ap.add_argument("--kill-pid", type=int, default=0)
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--topic", default="")
    ap.add_argument("--prefix", default="x")
    ap.add_argument("--count", type=int, default=20)
    ap.add_argument("--settle", type=float, default=5.0, help="s for a consumer's first rebalance")
    ap.add_argument("--wait", type=float, default=120.0, help="s to wait for consumption")
    args = ap.parse_args()
    NS = args.namesrv
    ok = {"failover": failover, "orderly": orderly, "send": send, "pull": pull}[args.mode](args)
    sys.stdout.flush()
    # The C++ core's threads can outlive shutdown(): leave without waiting.
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    main()
