"""Binlog apply: a LedgerMQ FIFO consumer group into a replica MariaDB/MySQL.

Receives the row changes `capture.py` sends (see its docstring for the body) with
the official RocketMQ 5 Python client's SimpleConsumer in a FIFO consumer group, so
one message group's changes arrive in binlog order, and applies each
to the replica in one transaction together with its position:

    lmq_sync.applied(grp PRIMARY KEY, pos, n)

holds, per message group, the position of the last change applied (and how many
were). A change at or before that position was applied already (a redelivery, or a
capture that sent it again after its restart) and is dropped; any other is applied
and the position moved in the same transaction, so no change is applied twice and,
since the group's changes come in order, none is skipped. The message is acked
only after the commit: a consumer killed in between gets it again. A change whose
apply fails on a database error 5 times in a row is left unacked and delivered again after its invisible
time (the example's group allows 10,000 deliveries, so it does not reach the
dead-letter queue; the run fails if that queue holds anything).

Stats: `--stats FILE` gets one JSON line per second: changes applied and dropped,
and the replica's lag (apply time minus the change's binlog time, seconds): the
largest and the mean of that second.
"""

import argparse
import concurrent.futures
import base64
import json
import os
import signal
import sys
import threading
import time

import pymysql
from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

SCHEMA_SQL = [
    "CREATE DATABASE IF NOT EXISTS lmq_sync",
    "CREATE TABLE IF NOT EXISTS lmq_sync.applied (grp VARCHAR(255) PRIMARY KEY, "
    "pos BIGINT NOT NULL, n BIGINT NOT NULL) ENGINE=InnoDB",
]


def decode_value(v):
    if isinstance(v, dict) and "b64" in v:
        return base64.b64decode(v["b64"])
    return v


def quote(name):
    return "`" + name.replace("`", "``") + "`"


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.applied = self.dropped = 0
        self.lags = []

    def take(self):
        with self.lock:
            out = (self.applied, self.dropped, self.lags)
            self.applied = self.dropped = 0
            self.lags = []
        return out


def apply_change(conn, group, change):
    """Applies one change unless its position was applied; returns whether it was."""
    with conn.cursor() as cur:
        # The group's row first, locked (created at -1 for its first change): two
        # deliveries of one change, or a stale one and the next, run one after the
        # other, and the later sees what the earlier committed.
        cur.execute("INSERT INTO lmq_sync.applied (grp, pos, n) VALUES (%s, -1, 0) "
                    "ON DUPLICATE KEY UPDATE grp = grp", (group,))
        cur.execute("SELECT pos FROM lmq_sync.applied WHERE grp = %s FOR UPDATE", (group,))
        if cur.fetchone()[0] >= change["pos"]:
            conn.rollback()
            return False
        table = f"{quote(change['schema'])}.{quote(change['table'])}"
        pk = change["pk"]
        assert pk, "capture.py sends only tables with a primary key"
        where = " AND ".join(f"{quote(c)} = %s" for c in pk)
        where_args = [decode_value(v) for v in pk.values()]
        if change["op"] in ("delete", "update"):
            values = change.get("values") or {}
            moved = any(values.get(c) != v for c, v in pk.items())
            if change["op"] == "delete" or moved:
                cur.execute(f"DELETE FROM {table} WHERE {where}", where_args)
        if change["op"] in ("insert", "update"):
            cols = list(change["values"])
            cur.execute(
                f"REPLACE INTO {table} ({', '.join(quote(c) for c in cols)}) "
                f"VALUES ({', '.join(['%s'] * len(cols))})",
                [decode_value(change["values"][c]) for c in cols])
        cur.execute("UPDATE lmq_sync.applied SET pos = %s, n = n + 1 WHERE grp = %s",
                    (change["pos"], group))
    conn.commit()
    return True


def connect(args):
    host, port = args.mysql.rsplit(":", 1)
    conn = pymysql.connect(host=host, port=int(port), user=args.user,
                           password=args.password, autocommit=False)
    with conn.cursor() as cur:
        # No gap locks on lmq_sync.applied: concurrent first changes of two groups
        # would otherwise deadlock (each group's own row is locked, see apply_change).
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    return conn


def ack(consumer, m):
    """Acks, trying up to 20 times: after a failover the new leader takes the old
    receipt handle, and the queue's next message waits for this ack. A message
    never acked comes back after its invisible time and is dropped by position."""
    for attempt in range(20):
        try:
            consumer.ack(m)
            return
        except Exception as e:  # noqa: BLE001 - failover: try again
            print(f"apply: ack of {m.keys} failed ({e})", file=sys.stderr, flush=True)
            time.sleep(min(0.1 * (attempt + 1), 1.0))


def worker(consumer, acker, args, stats, stop):
    try:
        consume(consumer, acker, args, stats, stop)
    except BaseException as e:  # noqa: BLE001 - a thread that died would stall its queues
        print(f"apply: worker failed ({e!r}); stopping", file=sys.stderr, flush=True)
        os._exit(4)


def consume(consumer, acker, args, stats, stop):
    conn = None
    while not stop.is_set():
        try:
            msgs = consumer.receive(args.batch, args.invisible_s)
        except Exception as e:  # noqa: BLE001 - failover
            print(f"apply: receive failed ({e}); trying again", file=sys.stderr, flush=True)
            time.sleep(0.2)
            continue
        # A FIFO receive holds a batch of a queue's messages in queue order (and
        # nothing more of that queue is handed out until they are acked or visible
        # again): apply them one by one in that order, then ack them together.
        acks = []
        failed_groups = set()  # a later message of such a group must wait for it
        for m in msgs or []:
            if m.message_group in failed_groups:
                continue
            try:
                change = json.loads(m.body)
            except ValueError as e:
                # Not a change capture.py sent: a replica cannot be kept equal.
                print(f"apply: {m.keys} is not a change ({e}); stopping", file=sys.stderr,
                      flush=True)
                os._exit(3)
            for attempt in range(5):
                try:
                    if conn is None:
                        conn = connect(args)
                    applied = apply_change(conn, m.message_group, change)
                    break
                except (pymysql.err.MySQLError, OSError) as e:  # a deadlock, the replica
                    print(f"apply: {m.keys} failed ({e})", file=sys.stderr, flush=True)
                    try:
                        conn.close()
                    except Exception:  # noqa: BLE001
                        pass
                    conn = None
                    time.sleep(0.1 * (attempt + 1))
            else:
                # Not acked: delivered again after its invisible time.
                failed_groups.add(m.message_group)
                continue
            with stats.lock:
                if applied:
                    stats.applied += 1
                    stats.lags.append(time.time() - change["ts"])
                else:
                    stats.dropped += 1
            acks.append(acker.submit(ack, consumer, m))
        for f in acks:
            f.result()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mysql", required=True, help="replica host:port")
    ap.add_argument("--user", required=True)
    ap.add_argument("--password", required=True)
    ap.add_argument("--endpoints", required=True, help="one LedgerMQ node's client address, host:port")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True, help="a FIFO consumer group")
    ap.add_argument("--stats", required=True)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--invisible-s", type=int, default=10)
    args = ap.parse_args()

    host, port = args.mysql.rsplit(":", 1)
    conn = pymysql.connect(host=host, port=int(port), user=args.user,
                           password=args.password, autocommit=True)
    with conn.cursor() as cur:
        for sql in SCHEMA_SQL:
            cur.execute(sql)
    conn.close()

    cfg = ClientConfiguration(args.endpoints, Credentials(), request_timeout=5)
    consumer = SimpleConsumer(cfg, args.group, {args.topic: FilterExpression()},
                              await_duration=2)
    consumer.startup()
    stats = Stats()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    acker = concurrent.futures.ThreadPoolExecutor(max_workers=4 * args.threads)
    threads = [threading.Thread(target=worker, args=(consumer, acker, args, stats, stop),
                                daemon=True)
               for _ in range(args.threads)]
    for t in threads:
        t.start()
    with open(args.stats, "a") as out:
        while not stop.wait(1.0):
            applied, dropped, lags = stats.take()
            out.write(json.dumps({
                "t_ms": int(time.time() * 1000), "applied": applied, "dropped": dropped,
                "max_lag_s": round(max(lags), 3) if lags else None,
                "mean_lag_s": round(sum(lags) / len(lags), 3) if lags else None}) + "\n")
            out.flush()
    for t in threads:
        t.join(timeout=10)
    try:
        consumer.shutdown()
    except Exception:  # noqa: BLE001 - leaving anyway
        pass


if __name__ == "__main__":
    main()
