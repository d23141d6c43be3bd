"""4.x remoting clients with ACL credentials against a LedgerMQ group with
[auth] on: PyPI rocketmq==0.4.4 (rocketmq-client-cpp's core, unmodified),
whose session credentials make it sign every request as the 4.x ACL hook does
(AccessKey, Signature over the sorted ext field values and the body).

- demo (demo-secret), who may publish to and subscribe on SecureTopic and
  consume as SecureGroup: sends --count messages and consumes them all with a
  push consumer of SecureGroup;
- a wrong secret: sends fail;
- demo sending to OtherTopic (no permission): sends fail.

Run with PYTHONPATH naming the directory the package was installed into.
Prints a one-line JSON summary; exits 1 on a failure.
"""

import argparse
import json
import sys
import threading
import time

from rocketmq.client import Message, Producer, PushConsumer


def producer(ns, group, access_key, secret_key):
    p = Producer(group, timeout=3000)
    p.set_namesrv_addr(ns)
    p.set_session_credentials(access_key, secret_key, "LOCAL")
    p.start()
    return p


def send(p, topic, body):
    m = Message(topic)
    m.set_body(body)
    m.set_tags("TagA")
    m.set_keys(body)
    return p.send_sync(m)


def refused(p, topic, tries=3):
    """True when every send fails (the broker answers NO_PERMISSION)."""
    for i in range(tries):
        try:
            send(p, topic, "refused-%d" % i)
            return False
        except Exception:  # noqa: BLE001 - the refusal the check wants
            pass
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--namesrv", required=True)
    ap.add_argument("--count", type=int, default=20)
    args = ap.parse_args()
    summary = {}

    got = set()
    lock = threading.Lock()

    def on_message(m):
        with lock:
            got.add(m.body.decode())

    consumer = PushConsumer("SecureGroup")
    consumer.set_namesrv_addr(args.namesrv)
    consumer.set_session_credentials("demo", "demo-secret", "LOCAL")
    consumer.subscribe("SecureTopic", on_message)
    consumer.start()

    p = producer(args.namesrv, "SecureProducers", "demo", "demo-secret")
    sent = set()
    deadline = time.time() + 60
    for i in range(args.count):
        body = "acl-%d" % i
        while True:
            try:
                send(p, "SecureTopic", body)
                sent.add(body)
                break
            except Exception as e:  # noqa: BLE001 - retried until the deadline
                if time.time() > deadline:
                    print("send failed: %s" % e, file=sys.stderr)
                    break
                time.sleep(0.5)
    summary["sent"] = len(sent)
    summary["other_topic_refused"] = refused(p, "OtherTopic")
    p.shutdown()

    wrong = producer(args.namesrv, "WrongProducers", "demo", "not-the-secret")
    summary["wrong_secret_refused"] = refused(wrong, "SecureTopic")
    wrong.shutdown()

    deadline = time.time() + 60
    while time.time() < deadline:
        with lock:
            if sent <= got:
                break
        time.sleep(0.5)
    consumer.shutdown()
    with lock:
        summary["consumed"] = len(sent & got)
    print(json.dumps(summary))
    ok = (
        summary["sent"] == args.count
        and summary["consumed"] == args.count
        and summary["other_topic_refused"]
        and summary["wrong_secret_refused"]
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
