"""Authentication, ACLs and TLS against a LedgerMQ group with `[auth]` and
`[tls]` on (deploy/local-secure/), with the official RocketMQ 5 Python client
(rocketmq-python-client 5.1.2, unmodified) and raw calls through its generated
gRPC stubs (for exact status codes and headers the client would not send).

Modes:
- `main`: as user demo (PUB|SUB on SecureTopic, SUB on SecureGroup) the
  client sends and a SimpleConsumer of SecureGroup receives and acks every
  message; the same client with a wrong secret, or as demo on OtherTopic,
  cannot send; raw calls with no authorization header, a wrong secret, a stale
  date, a topic or group demo has no permission on answer UNAUTHORIZED
  (40100), as the reference proxy does.
- `user`: checks what one user may do (--can-publish / --can-subscribe 0|1)
  with raw QueryRoute, SendMessage and ReceiveMessage calls.

With --tls-ca the calls go over TLS (the official client with tls_enable and
GRPC_DEFAULT_SSL_ROOTS_FILE_PATH set to that CA by the caller), and a
plain-text call must not get through. Prints a one-line JSON summary; exits 1
on any unexpected answer.
"""

import argparse
import hmac
import json
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from hashlib import sha1

import grpc
from rocketmq import (ClientConfiguration, Credentials, FilterExpression,
                      Message, Producer, SimpleConsumer)
from rocketmq.grpc_protocol import definition_pb2 as d
from rocketmq.grpc_protocol import service_pb2 as s
from rocketmq.grpc_protocol import service_pb2_grpc as sg

TOPIC, GROUP = "SecureTopic", "SecureGroup"
UNAUTHORIZED, OK = d.Code.UNAUTHORIZED, d.Code.OK
problems = []


def check(what, ok):
    if not ok:
        problems.append(what)


def headers(ak, sk, when=None, authorization=True):
    """The 5.x client's headers, signed with (ak, sk) at `when` (UTC)."""
    when = when or datetime.now(timezone.utc)
    date_time = when.strftime("%Y%m%dT%H%M%SZ")
    md = [
        ("x-mq-client-id", "acl-probe-" + uuid.uuid4().hex[:8]),
        ("x-mq-language", "PYTHON"),
        ("x-mq-protocol", "GRPC_V2"),
        ("x-mq-date-time", date_time),
    ]
    if authorization:
        sig = hmac.new(sk.encode(), date_time.encode(), sha1).hexdigest()
        md.append((
            "authorization",
            f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, Signature={sig}",
        ))
    return md


class Raw:
    """Raw calls on one node's client port (over TLS when given a CA)."""

    def __init__(self, access, ca=None):
        self.host, port = access.rsplit(":", 1)
        self.port = int(port)
        if ca:
            with open(ca, "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            channel = grpc.secure_channel(access, creds)
        else:
            channel = grpc.insecure_channel(access)
        self.stub = sg.MessagingServiceStub(channel)

    def route(self, topic, md):
        ep = d.Endpoints(scheme=d.AddressScheme.IPv4,
                         addresses=[d.Address(host=self.host, port=self.port)])
        r = self.stub.QueryRoute(
            s.QueryRouteRequest(topic=d.Resource(name=topic), endpoints=ep),
            metadata=md, timeout=10)
        return r.status.code

    def send(self, topic, md):
        m = d.Message(
            topic=d.Resource(name=topic),
            system_properties=d.SystemProperties(
                message_id=uuid.uuid4().hex.upper(),
                body_encoding=d.Encoding.IDENTITY,
                message_type=d.MessageType.NORMAL,
            ),
            body=b"raw",
        )
        m.system_properties.born_timestamp.GetCurrentTime()
        m.system_properties.born_host = "127.0.0.1"
        r = self.stub.SendMessage(s.SendMessageRequest(messages=[m]), metadata=md, timeout=10)
        return r.status.code

    def receive(self, group, topic, md):
        req = s.ReceiveMessageRequest(
            group=d.Resource(name=group),
            message_queue=d.MessageQueue(topic=d.Resource(name=topic), id=-1,
                                         permission=d.Permission.READ_WRITE),
            filter_expression=d.FilterExpression(type=d.FilterType.TAG, expression="*"),
            batch_size=1,
            auto_renew=False,
        )
        req.invisible_duration.FromSeconds(30)
        req.long_polling_timeout.FromSeconds(1)
        for r in self.stub.ReceiveMessage(req, metadata=md, timeout=10):
            if r.WhichOneof("content") == "status":
                return r.status.code
        return None


def can(code):
    """True for an answer that is not a refusal (OK, or nothing to receive)."""
    return code in (OK, d.Code.MESSAGE_NOT_FOUND)


def client_sends(access, ak, sk, topic, tls):
    """True if the official client, as (ak, sk), starts and sends to `topic`."""
    producer = None
    try:
        producer = Producer(ClientConfiguration(access, Credentials(ak, sk), request_timeout=5),
                            (topic,), tls_enable=tls)
        producer.startup()
        m = Message()
        m.topic = topic
        m.body = b"probe"
        producer.send(m)
        return True
    except Exception as e:  # noqa: BLE001 - a refusal surfaces as any client error
        print(f"refused as expected? {ak} on {topic}: {str(e)[:160]}", file=sys.stderr)
        return False
    finally:
        if producer is not None:
            try:
                producer.shutdown()
            except Exception:  # noqa: BLE001
                pass


def main_mode(args):
    raw = Raw(args.access, args.tls_ca)
    demo = ("demo", "demo-secret")
    tls = bool(args.tls_ca)
    summary = {}
    if tls:
        # A plain-text call does not get through a TLS port.
        try:
            code = Raw(args.access).route(TOPIC, headers(*demo))
            check(f"a plain-text call was answered ({code})", False)
        except grpc.RpcError as e:
            check(f"a plain-text call failed with {e.code()}, not UNAVAILABLE",
                  e.code() == grpc.StatusCode.UNAVAILABLE)
    # Raw calls: the exact status codes.
    check("no authorization header: UNAUTHORIZED",
          raw.route(TOPIC, headers(*demo, authorization=False)) == UNAUTHORIZED)
    check("wrong secret: UNAUTHORIZED", raw.route(TOPIC, headers("demo", "wrong")) == UNAUTHORIZED)
    check("unknown user: UNAUTHORIZED", raw.route(TOPIC, headers("nobody", "x")) == UNAUTHORIZED)
    stale = datetime.now(timezone.utc) - timedelta(hours=2)
    check("a date 2 h old: UNAUTHORIZED", raw.route(TOPIC, headers(*demo, when=stale)) == UNAUTHORIZED)
    check("demo routes SecureTopic", raw.route(TOPIC, headers(*demo)) == OK)
    check("demo cannot route OtherTopic", raw.route("OtherTopic", headers(*demo)) == UNAUTHORIZED)
    check("demo cannot send to OtherTopic", raw.send("OtherTopic", headers(*demo)) == UNAUTHORIZED)
    check("demo cannot consume as OtherGroup",
          raw.receive("OtherGroup", TOPIC, headers(*demo)) == UNAUTHORIZED)
    check("admin may consume as OtherGroup",
          can(raw.receive("OtherGroup", TOPIC, headers("admin", "admin-secret"))))

    # The official client.
    check("a wrong secret cannot send",
          not client_sends(args.access, "demo", "wrong", TOPIC, tls))
    check("demo cannot send to OtherTopic",
          not client_sends(args.access, *demo, "OtherTopic", tls))
    cfg = ClientConfiguration(args.access, Credentials(*demo), request_timeout=10)
    producer = Producer(cfg, (TOPIC,), tls_enable=tls)
    producer.startup()
    sent = set()
    for i in range(args.messages):
        m = Message()
        m.topic = TOPIC
        m.body = f"secure-{i}".encode()
        m.tag = "TagA"
        producer.send(m)
        sent.add(f"secure-{i}")
    producer.shutdown()
    consumer = SimpleConsumer(cfg, GROUP, {TOPIC: FilterExpression("*")}, tls_enable=tls)
    consumer.startup()
    got = set()
    deadline = time.time() + 60
    while time.time() < deadline and not sent <= got:
        for m in consumer.receive(16, 15) or []:
            body = m.body.decode()
            if body.startswith("secure-"):
                got.add(body)
            consumer.ack(m)
    consumer.shutdown()
    check(f"every message demo sent is received ({len(sent & got)}/{len(sent)})", sent <= got)
    summary.update(sent=len(sent), received=len(sent & got))
    return summary


def user_mode(args):
    raw = Raw(args.access, args.tls_ca)
    md = lambda: headers(args.user, args.secret)  # noqa: E731 - a fresh date per call
    route, send = raw.route(TOPIC, md()), raw.send(TOPIC, md())
    receive = raw.receive(GROUP, TOPIC, md())
    publish, subscribe = bool(args.can_publish), bool(args.can_subscribe)
    check(f"route {route}", can(route) == (publish or subscribe))
    check(f"send {send}", can(send) == publish)
    check(f"receive {receive}", can(receive) == subscribe)
    return {"route": route, "send": send, "receive": receive}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["main", "user"])
    ap.add_argument("--access", required=True, help="host:port of one broker node")
    ap.add_argument("--messages", type=int, default=30)
    ap.add_argument("--user")
    ap.add_argument("--secret")
    ap.add_argument("--can-publish", type=int, default=0)
    ap.add_argument("--can-subscribe", type=int, default=0)
    ap.add_argument("--tls-ca", help="CA certificate (PEM): the port serves TLS")
    args = ap.parse_args()
    summary = main_mode(args) if args.mode == "main" else user_mode(args)
    summary["problems"] = problems
    print(json.dumps(summary))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
