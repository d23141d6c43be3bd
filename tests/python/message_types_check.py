"""Topic message types (RocketMQ 5's `message.type` attribute) with the official
RocketMQ 5 Python client (rocketmq-python-client 5.1.2, unmodified).

- PyMixed (message.type=MIXED) takes normal and FIFO messages, and a SimpleConsumer
  of group PyTypes receives every one of them.
- PyDelayOnly (message.type=DELAY): the client refuses a normal message before
  sending it, because the route says the topic's queues accept DELAY messages only
  (its check of `accept_message_types`).
- PyNormalOnly (message.type=NORMAL): the client refuses a FIFO message the same way.

The Rust test creates the topics with `mqadmin updateTopic -a +message.type=...` and
the group. Prints a JSON summary; exits 1 on any failed expectation.
"""

import argparse
import json
import os
import sys
import time

from rocketmq import (ClientConfiguration, Credentials, FilterExpression, Message,
                      Producer, SimpleConsumer)

MIXED, DELAY_ONLY, NORMAL_ONLY = "PyMixed", "PyDelayOnly", "PyNormalOnly"
CLIENT_REFUSAL = "not match with queue accept message types"


def message(topic, body, group=None):
    m = Message()
    m.topic, m.body = topic, body.encode()
    if group:
        m.message_group = group
    return m


def refused_by_client(producer, m):
    """The client's own refusal text, or None if it sent or failed otherwise."""
    try:
        producer.send(m)
        return None
    except Exception as e:  # noqa: BLE001 - the refusal is an IllegalArgumentException
        return str(e) if CLIENT_REFUSAL in str(e) else f"other failure: {e}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--access", required=True, help="host:port of one broker node")
    ap.add_argument("--messages", type=int, default=20)
    args = ap.parse_args()
    cfg = ClientConfiguration(args.access, Credentials())
    errors = []

    producer = Producer(cfg, (MIXED, DELAY_ONLY, NORMAL_ONLY))
    producer.startup()
    sent = set()
    for i in range(args.messages):
        for body, group in ((f"normal-{i}", None), (f"fifo-{i}", f"group-{i % 3}")):
            try:
                producer.send(message(MIXED, body, group))
                sent.add(body)
            except Exception as e:  # noqa: BLE001
                errors.append(f"MIXED topic refused {body}: {e}")
                break
    delay_refusal = refused_by_client(producer, message(DELAY_ONLY, "normal-to-delay"))
    if delay_refusal is None or not delay_refusal.startswith("current message type"):
        errors.append(f"a normal message to a DELAY topic: {delay_refusal or 'sent'}")
    normal_refusal = refused_by_client(producer, message(NORMAL_ONLY, "fifo", "g"))
    if normal_refusal is None or not normal_refusal.startswith("current message type"):
        errors.append(f"a FIFO message to a NORMAL topic: {normal_refusal or 'sent'}")
    producer.shutdown()

    consumer = SimpleConsumer(cfg, "PyTypes", {MIXED: FilterExpression()}, await_duration=5)
    consumer.startup()
    got = set()
    deadline = time.time() + 60
    while time.time() < deadline and not sent <= got:
        try:
            msgs = consumer.receive(32, 15)
        except Exception:  # noqa: BLE001 - receive again
            time.sleep(0.2)
            continue
        for m in msgs or []:
            got.add(m.body.decode())
            consumer.ack(m)
    consumer.shutdown()
    missing = sorted(sent - got)
    if missing:
        errors.append(f"{len(missing)} messages sent to the MIXED topic never received: {missing[:5]}")
    print(json.dumps({
        "sent_mixed": len(sent),
        "received_mixed": len(got),
        "delay_topic_refusal": delay_refusal,
        "normal_topic_refusal": normal_refusal,
        "errors": errors,
    }), flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
