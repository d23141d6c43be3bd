"""Binlog capture: a MariaDB/MySQL row-based binlog into a LedgerMQ FIFO topic.

Reads the source's binlog over the replication protocol (PyPI `mysql-replication`,
which decodes row events with the column names the server logs under
`binlog_row_metadata=FULL`) and sends each changed row as one FIFO message with the
official RocketMQ 5 Python client (`rocketmq-python-client` 5.1.2):

- message group = `schema.table:primary key`, so every change of one row is
  delivered in binlog order, and rows are spread over the topic's queues;
- keys = the row's binlog position `file:log_pos:row`; tag = the table name;
- body = JSON: `pos` (one integer that orders positions: file number << 44 |
  end log_pos << 12 | row index), `op` (insert, update, delete), `schema`, `table`,
  `pk` (the primary key's columns before the change), `values` (the row after it;
  absent for a delete) and `ts` (the binlog event's time, seconds).

A table without a primary key (one the binlog's row metadata names) stops the
capture with an error: its rows could be neither ordered nor found.

Sends to one message group are serial (the next only after the previous is
acknowledged), as RocketMQ's FIFO needs; different groups go out in parallel over
`--senders` threads, a group always on the same one. A send that fails is tried
again until it is acknowledged, so nothing is skipped; one that failed after all
may be stored twice, which the applier drops by position.

Resume: `--state FILE` (JSON, written atomically and fsync'd every 0.5 s and at
exit) holds the binlog position of the start of the earliest transaction with a
row not yet acknowledged (or, with none, of the next transaction). A restarted
capture, after a crash too, reads on from there: rows it had already sent are sent
again and dropped by the applier, none is skipped.

Stats: `--stats FILE` gets one JSON line every 0.5 s: rows sent and acknowledged,
and the longest send (first attempt to acknowledgement, ms) that ended in it.
"""

import argparse
import base64
import json
import os
import queue
import signal
import sys
import tempfile
import threading
import time
import zlib

from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import QueryEvent, RotateEvent, XidEvent
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent
from rocketmq import ClientConfiguration, Credentials, Message, Producer


def encode_value(v):
    """A column value as JSON: ints, floats, strings and NULL as they are; the rest
    (DECIMAL, dates, times) as text, bytes as base64 under {"b64": ...}."""
    if v is None or isinstance(v, (int, float, str)):
        return v
    if isinstance(v, (bytes, bytearray)):
        return {"b64": base64.b64encode(bytes(v)).decode()}
    return str(v)


def position(log_file, end_log_pos, row):
    """One integer that orders binlog positions: the file's number, the event's end
    position and the row's index in the event."""
    file_no = int(log_file.rsplit(".", 1)[1])
    if file_no >= (1 << 19) or end_log_pos >= (1 << 32) or row >= (1 << 12):
        raise SystemExit(f"capture: position {log_file}:{end_log_pos}:{row} does not fit "
                         "the 63-bit position (19-bit file number, 32-bit offset, 12-bit row)")
    return (file_no << 44) | (end_log_pos << 12) | row


class Tracker:
    """Which rows are acknowledged, and from where a restart must read."""

    def __init__(self, start):
        # Reentrant: the SIGTERM handler runs on the main thread, which may hold it.
        self.lock = threading.RLock()
        self.pending = {}          # seq -> (log_file, log_pos) of its transaction's start
        self.boundary = start      # the start of the transaction being read next
        self.sent = 0
        self.acked = 0
        self.longest_ms = 0.0

    def add(self, seq, txn_start):
        with self.lock:
            self.pending[seq] = txn_start
            self.sent += 1

    def ack(self, seq, took_ms):
        with self.lock:
            del self.pending[seq]
            self.acked += 1
            self.longest_ms = max(self.longest_ms, took_ms)

    def set_boundary(self, pos):
        with self.lock:
            self.boundary = pos

    def resume_position(self):
        with self.lock:
            if self.pending:
                return self.pending[min(self.pending)]
            return self.boundary


STATE_LOCK = threading.RLock()  # one writer at a time (reentrant: see Tracker.lock)


def write_state(path, pos):
    """Replaces the state file with `pos`, durably: a temporary file of its own in
    the same directory, fsync'd, renamed over the state, and the directory fsync'd."""
    directory = os.path.dirname(os.path.abspath(path))
    with STATE_LOCK:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".capture-state-")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"log_file": pos[0], "log_pos": pos[1]}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def sender(producer, topic, inbox, tracker, stop):
    while True:
        item = inbox.get()
        if item is None:
            return
        seq, group, keys, tag, body = item
        started = time.monotonic()
        while True:
            msg = Message()
            msg.topic = topic
            msg.body = body
            msg.tag = tag
            msg.keys = keys
            msg.message_group = group
            try:
                producer.send(msg)
                break
            except Exception as e:  # noqa: BLE001 - not acknowledged: send it again
                if stop.is_set():
                    return
                print(f"capture: send of {keys} failed ({e}); trying again", file=sys.stderr,
                      flush=True)
                time.sleep(0.2)
        tracker.ack(seq, (time.monotonic() - started) * 1000.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mysql", required=True, help="source host:port")
    ap.add_argument("--user", required=True)
    ap.add_argument("--password", required=True)
    ap.add_argument("--schema", required=True, help="only this database's tables")
    ap.add_argument("--endpoints", required=True, help="one LedgerMQ node's client address, host:port")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--stats", required=True)
    ap.add_argument("--start-file", required=True,
                    help="the binlog file to start at (position 4) when there is no state")
    ap.add_argument("--senders", type=int, default=8)
    ap.add_argument("--server-id", type=int, default=4242)
    args = ap.parse_args()

    if os.path.exists(args.state):
        with open(args.state) as f:
            st = json.load(f)
        start = (st["log_file"], st["log_pos"])
        print(f"capture: resuming at {start[0]}:{start[1]}", file=sys.stderr, flush=True)
    else:
        start = (args.start_file, 4)
    tracker = Tracker(start)
    stop = threading.Event()

    cfg = ClientConfiguration(args.endpoints, Credentials(), request_timeout=3)
    producer = Producer(cfg, (args.topic,))
    producer.startup()

    inboxes = [queue.Queue(maxsize=1024) for _ in range(args.senders)]
    threads = [threading.Thread(target=sender, daemon=True,
                                args=(producer, args.topic, q, tracker, stop))
               for q in inboxes]
    for t in threads:
        t.start()

    def checkpoint_loop():
        stats = open(args.stats, "a")
        last_sent = last_acked = 0
        written = None
        while not stop.wait(0.5):
            pos = tracker.resume_position()
            if pos != written:  # an fsync'd rename only when the position moved
                write_state(args.state, pos)
                written = pos
            now = time.time()
            with tracker.lock:
                sent, acked, longest = tracker.sent, tracker.acked, tracker.longest_ms
                tracker.longest_ms = 0.0
            stats.write(json.dumps({"t_ms": int(now * 1000), "sent": sent - last_sent,
                                    "acked": acked - last_acked,
                                    "longest_send_ms": round(longest, 1)}) + "\n")
            stats.flush()
            last_sent, last_acked = sent, acked

    checkpointer = threading.Thread(target=checkpoint_loop, daemon=True)
    checkpointer.start()

    def on_term(*_):
        # Where to resume, then out: rows sent but not yet acknowledged are sent
        # again by the next capture.
        stop.set()
        write_state(args.state, tracker.resume_position())
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)

    host, port = args.mysql.rsplit(":", 1)
    stream = BinLogStreamReader(
        connection_settings={"host": host, "port": int(port), "user": args.user,
                             "passwd": args.password},
        server_id=args.server_id, blocking=True, resume_stream=True,
        # is_mariadb stays False: with it, this library asks MariaDB for the binlog
        # from its very start whatever position it is given; MariaDB serves the
        # MySQL COM_BINLOG_DUMP by file and position.
        log_file=start[0], log_pos=start[1], is_mariadb=False,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, XidEvent,
                     QueryEvent, RotateEvent],
        slave_heartbeat=1)
    txn_start = start
    seq = 0
    try:
        for ev in stream:
            if stop.is_set():
                break
            if isinstance(ev, RotateEvent):
                txn_start = (ev.next_binlog, ev.position)
                tracker.set_boundary(txn_start)
                continue
            if isinstance(ev, XidEvent) or (isinstance(ev, QueryEvent)
                                            and ev.query.strip().upper() != "BEGIN"):
                # The transaction (or a DDL statement) ends here: the next starts.
                txn_start = (stream.log_file, stream.log_pos)
                tracker.set_boundary(txn_start)
                continue
            if not isinstance(ev, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                continue
            if ev.schema != args.schema:
                continue
            pk_cols = ev.primary_key
            if isinstance(pk_cols, str):
                pk_cols = (pk_cols,) if pk_cols else ()
            if not pk_cols:
                # Its rows cannot be told apart: no message group keeps a row's
                # changes in order, and the applier could not find the row.
                raise SystemExit(f"capture: {ev.schema}.{ev.table} has no primary key "
                                 "(one the binlog's metadata names); not replicated")
            op = {WriteRowsEvent: "insert", UpdateRowsEvent: "update",
                  DeleteRowsEvent: "delete"}[type(ev)]
            for i, row in enumerate(ev.rows):
                before = row.get("before_values", row.get("values"))
                after = row.get("after_values", row.get("values")) if op != "delete" else None
                pk = {c: encode_value(before[c]) for c in pk_cols}
                pos = position(stream.log_file, ev.packet.log_pos, i)
                group = f"{ev.schema}.{ev.table}:" + ",".join(str(pk[c]) for c in pk_cols)
                body = {"pos": pos, "op": op, "schema": ev.schema, "table": ev.table,
                        "pk": pk, "ts": ev.timestamp}
                if after is not None:
                    body["values"] = {c: encode_value(v) for c, v in after.items()}
                seq += 1
                tracker.add(seq, txn_start)
                keys = f"{stream.log_file}:{ev.packet.log_pos}:{i}"
                shard = zlib.crc32(group.encode()) % len(inboxes)
                inboxes[shard].put((seq, group, keys, ev.table,
                                    json.dumps(body).encode()))
    finally:
        stop.set()
        stream.close()
        checkpointer.join(timeout=2)
        write_state(args.state, tracker.resume_position())


if __name__ == "__main__":
    main()
