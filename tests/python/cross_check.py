"""The 5.x gRPC side of the cross-protocol check, with the official RocketMQ 5
Python client (rocketmq-python-client 5.1.2, unmodified); the 4.x side is
remoting_check.py (send, pull).

- receive: a SimpleConsumer (group CrossGroup) receives --count messages of
  --topic and fails unless the bodies --prefix-i arrive with tag TagX and keys
  --prefix-key-i (messages sent over remoting; the first, 10 KiB, compressed by
  the 4.x client).
- send: sends --count messages --prefix-i (the first 10 KiB) to --topic with
  tag TagX and keys --prefix-key-i (for a remoting pull consumer to read).

Prints a one-line JSON summary; exits 1 on a failure.
"""

import argparse
import json
import os
import sys
import time

from rocketmq import (ClientConfiguration, Credentials, FilterExpression, Message,
                      Producer, SimpleConsumer)


def body_of(prefix, i):
    """Message i's body, as remoting_check.py makes them: message 0's is 10 KiB
    (compressed by the 4.x client)."""
    b = "%s-%d" % (prefix, i)
    return b + "|" + "z" * 10240 if i == 0 else b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["receive", "send"])
    ap.add_argument("--access", required=True, help="host:port of one broker node")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--count", type=int, default=20)
    args = ap.parse_args()
    cfg = ClientConfiguration(args.access, Credentials())
    errors = []
    if args.mode == "send":
        p = Producer(cfg, (args.topic,))
        p.startup()
        for i in range(args.count):
            m = Message()
            m.topic, m.body = args.topic, body_of(args.prefix, i).encode()
            m.tag, m.keys = "TagX", "%s-key-%d" % (args.prefix, i)
            p.send(m)
        p.shutdown()
        print(json.dumps({"mode": "send", "sent": args.count}))
    else:
        c = SimpleConsumer(cfg, "CrossGroup", {args.topic: FilterExpression()}, await_duration=5)
        c.startup()
        found = {}
        end = time.time() + 60
        while time.time() < end and len(found) < args.count:
            for m in c.receive(32, 15) or []:
                body = m.body.decode()
                found[body.split("|")[0]] = (m.tag, list(m.keys), body)
                c.ack(m)
        c.shutdown()
        for i in range(args.count):
            body = "%s-%d" % (args.prefix, i)
            want = ("TagX", ["%s-key-%d" % (args.prefix, i)], body_of(args.prefix, i))
            if found.get(body) != want:
                errors.append("%s: got %s, want %s" % (body, str(found.get(body))[:80], str(want)[:80]))
        print(json.dumps({"mode": "receive", "received": len(found), "errors": errors[:10]}))
    sys.stdout.flush()
    os._exit(1 if errors else 0)


if __name__ == "__main__":
    main()
