"""Binlog sync over LedgerMQ, end to end, on real MariaDB instances.

Starts, all on loopback and under --out: a source MariaDB with a row-based binlog
(`binlog_row_metadata=FULL`, so row events carry column names), a replica MariaDB,
and a LedgerMQ name server with a 3-node broker group; creates a FIFO topic and a
FIFO consumer group; loads the source with sysbench's `oltp_write_only` (prepare,
then run at --rate transactions/s); runs `capture.py` (binlog -> FIFO messages) and
`apply.py` (FIFO consumer -> replica). During the load it kills -9 the capture and
starts it again (it resumes from its state file), kills -9 the broker group's leader
(restarted 3 s later) and kills -9 the applier (restarted 2 s later). When the
load ends it waits (up to --drain-timeout-s, else it fails) until the capture has
every binlog row acknowledged, the changes applied are as many as the row changes
`mariadb-binlog` counts in the binlog, and every table's CHECKSUM TABLE and row
count match; then checks the dead-letter queue is empty; writes `report.md` and
`lag.svg`, and prints one JSON line last (with "error" added when the run broke):

    {"events": N, "events_per_s": X, "tables_equal": true|false,
     "max_pause_ms": M, "leader_killed": true}

`tables_equal` holds all three checks; the exit status is 0 only then.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from report import lag_svg, markdown, read_jsonl

HERE = os.path.dirname(os.path.abspath(__file__))
TOPIC, GROUP, SCHEMA = "BinlogSync", "BinlogSyncApply", "sbtest"
USER, PASSWORD = "lmq", "lmq-sync"


def log(msg):
    print(f"[binlog-sync {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def terminate_all(procs):
    """SIGTERM to every process still running, then up to 15 s each to exit (SIGKILL
    after that)."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, check, timeout_s):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{what} not ready after {timeout_s} s")


class MariaDB:
    """One mariadbd on a port of its own, its data and socket under `root`."""

    def __init__(self, root, name, binlog):
        self.dir = os.path.join(root, name)
        self.sock = os.path.join(root, f"{name}.sock")
        self.port = free_port()
        self.binlog = binlog
        self.proc = None

    def start(self):
        os.makedirs(self.dir)
        subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={self.dir}",
                        "--user=root", "--auth-root-authentication-method=normal",
                        "--skip-test-db"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        mariadbd = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
        cmd = [mariadbd, "--no-defaults", f"--datadir={self.dir}", "--user=root",
               f"--port={self.port}", "--bind-address=127.0.0.1", f"--socket={self.sock}",
               f"--pid-file={self.dir}.pid", "--skip-name-resolve",
               "--innodb-buffer-pool-size=64M", "--innodb-flush-log-at-trx-commit=1"]
        if self.binlog:
            cmd += [f"--log-bin={self.dir}/binlog", "--binlog-format=ROW",
                    "--binlog-row-image=FULL", "--binlog-row-metadata=FULL",
                    "--server-id=1", "--sync-binlog=1"]
        else:
            cmd += ["--server-id=2"]
        self.proc = subprocess.Popen(cmd, stdout=open(f"{self.dir}.log", "w"),
                                     stderr=subprocess.STDOUT)
        wait_for(f"mariadbd {self.dir}", lambda: self.sql("SELECT 1") is not None, 60)
        self.sql(f"CREATE USER '{USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'; "
                 f"GRANT ALL ON *.* TO '{USER}'@'127.0.0.1'")

    def sql(self, statement):
        """Runs SQL as root over the socket; returns its tab-separated rows."""
        out = subprocess.run(["mariadb", "--no-defaults", "-S", self.sock, "-uroot", "-N",
                              "-B", "-e", statement], check=True, capture_output=True,
                             text=True).stdout
        return [line.split("\t") for line in out.splitlines()]

    def addr(self):
        return f"127.0.0.1:{self.port}"

    def stop(self):
        terminate_all([self.proc] if self.proc else [])


class LedgerMQ:
    """A name server and a 3-node broker group of this project's binaries."""

    def __init__(self, root, bin_dir):
        self.root, self.bin = root, bin_dir
        self.ns = f"127.0.0.1:{free_port()}"
        self.client = [f"127.0.0.1:{free_port()}" for _ in range(3)]
        self.raft = [f"127.0.0.1:{free_port()}" for _ in range(3)]
        self.remoting = [f"127.0.0.1:{free_port()}" for _ in range(3)]
        self.procs = {}

    def endpoints(self):
        """One node's client address for the official Python client: a follower at
        the time of asking. (Given several, `a;b;c`, that client sends the HTTP/2
        authority `a,b,c`, which the h2 crate refuses as malformed.) The client
        follows the routes to the other nodes from there."""
        leader = self.leader()
        return self.client[(leader + 1) % 3 if leader is not None else 0]

    def start(self):
        os.makedirs(self.root)
        with open(f"{self.root}/namesrv.toml", "w") as f:
            f.write(f'listen = "{self.ns}"\n')
        self.procs["ns"] = subprocess.Popen(
            [f"{self.bin}/mqnamesrv", "-c", f"{self.root}/namesrv.toml"],
            stdout=open(f"{self.root}/namesrv.log", "a"), stderr=subprocess.STDOUT)
        peers = "".join(f'{i} = "{a}"\n' for i, a in enumerate(self.raft))
        clients = "".join(f'{i} = "{a}"\n' for i, a in enumerate(self.client))
        for n in range(3):
            with open(f"{self.root}/n{n}.toml", "w") as f:
                f.write(f'cluster = "BinlogCluster"\nbroker_group = "broker-a"\nnode_id = {n}\n'
                        f'client_addr = "{self.client[n]}"\n'
                        f'remoting_addr = "{self.remoting[n]}"\n'
                        f'namesrv_addrs = ["{self.ns}"]\n'
                        f'store_root = "{self.root}/n{n}"\nflush = "sync"\n'
                        f'commit_log_segment_bytes = 67108864\n'
                        f'[peers]\n{peers}[client_addrs]\n{clients}')
            self.start_node(n)
        wait_for("the broker group's leader", lambda: self.leader() is not None, 60)

    def start_node(self, n):
        self.procs[n] = subprocess.Popen(
            [f"{self.bin}/mqbroker", "-c", f"{self.root}/n{n}.toml"],
            stdout=open(f"{self.root}/n{n}.log", "a"), stderr=subprocess.STDOUT)

    def admin(self, *args):
        return subprocess.run([f"{self.bin}/mqadmin", args[0], "-n", self.ns, *args[1:]],
                              check=True, capture_output=True, text=True).stdout

    def leader(self):
        """The leader's node id, from `mqadmin clusterList`, or None."""
        for line in self.admin("clusterList").splitlines():
            cols = line.split()
            if len(cols) > 4 and cols[4] == "leader":
                return int(cols[2])
        return None

    def stop(self):
        terminate_all(self.procs.values())


def sysbench(src, args, command, extra=()):
    host, port = src.addr().rsplit(":", 1)
    return ["sysbench", "oltp_write_only", "--db-driver=mysql", f"--mysql-host={host}",
            f"--mysql-port={port}", f"--mysql-user={USER}", f"--mysql-password={PASSWORD}",
            f"--mysql-db={SCHEMA}", f"--tables={args.tables}",
            f"--table-size={args.table_size}", *extra, command]


def checksums(db, tables):
    rows = db.sql("CHECKSUM TABLE " + ", ".join(f"{SCHEMA}.{t}" for t in tables))
    counts = [db.sql(f"SELECT COUNT(*) FROM {SCHEMA}.{t}")[0][0] for t in tables]
    return [r[1] for r in rows], counts


FULL = {"tables": 8, "table_size": 2000, "rate": 50, "duration_s": 180,
        "drain_timeout_s": 600}
SHORT = {"tables": 4, "table_size": 500, "rate": 20, "duration_s": 40,
         "drain_timeout_s": 180}


def binlog_row_changes(src, tables):
    """Row changes to `tables` in the source's binlog, counted by MariaDB's own
    mariadb-binlog (one `### INSERT/UPDATE/DELETE` line per row), independently
    of the capture's binlog reader."""
    files = [os.path.join(src.dir, row[0]) for row in src.sql("SHOW BINARY LOGS")]
    text = subprocess.run(["mariadb-binlog", "--no-defaults", "-v",
                           "--base64-output=DECODE-ROWS", *files], check=True,
                          capture_output=True).stdout.decode("utf-8", errors="replace")
    names = {f"`{SCHEMA}`.`{t}`" for t in tables}
    n = 0
    for line in text.splitlines():
        # "### INSERT INTO `db`.`t`", "### UPDATE `db`.`t`", "### DELETE FROM `db`.`t`"
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "###":
            if parts[1] == "UPDATE":
                n += parts[2] in names
            elif parts[1] in ("INSERT", "DELETE") and len(parts) >= 4:
                n += parts[3] in names
    return n


def dlq_messages(mq):
    """Messages the consumer group's dead-letter topic holds (`mqadmin topicStatus`'s
    last line), 0 if `mqadmin topicList` does not list it (it is created at the first
    dead letter)."""
    dlq = f"%DLQ%{GROUP}"
    if dlq not in mq.admin("topicList").split():
        return 0
    out = mq.admin("topicStatus", "-t", dlq)
    for line in out.splitlines():
        if line.startswith("Messages held:"):
            return int(line.split(":", 1)[1])
    raise RuntimeError(f"topicStatus printed no 'Messages held' line: {out!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", action="store_true",
                    help=f"the short version: {SHORT} (options given still win)")
    ap.add_argument("--bin-dir", required=True, help="where mqnamesrv, mqbroker, mqadmin are")
    ap.add_argument("--out", required=True, help="a directory for the run (emptied first)")
    ap.add_argument("--tables", type=int, help=f"default {FULL['tables']}")
    ap.add_argument("--table-size", type=int, help=f"default {FULL['table_size']}")
    ap.add_argument("--rate", type=int, help=f"sysbench tx/s, default {FULL['rate']}")
    ap.add_argument("--duration-s", type=int,
                    help=f"how long sysbench runs, default {FULL['duration_s']}")
    ap.add_argument("--drain-timeout-s", type=int,
                    help=f"default {FULL['drain_timeout_s']}")
    ap.add_argument("--queues", type=int, default=16)
    args = ap.parse_args()
    for k, v in (SHORT if args.short else FULL).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    run = None
    try:
        shutil.rmtree(args.out, ignore_errors=True)
        os.makedirs(args.out)
        run = Run(args)
        result = run.run()
    except BaseException as e:  # noqa: BLE001 - the JSON line is printed in any case
        log(f"failed: {e!r}")
        result = (run.result(error=repr(e)) if run is not None else
                  {"events": 0, "events_per_s": 0.0, "tables_equal": False,
                   "max_pause_ms": 0, "leader_killed": False, "error": repr(e)})
        terminated = isinstance(e, Terminated)
    else:
        terminated = False
    if run is not None:
        run.stop_all()
        try:
            run.write_report(result)
        except Exception as e:  # noqa: BLE001 - the JSON line matters more
            log(f"no report: {e!r}")
    print(json.dumps(result), flush=True)
    if terminated:
        return 143
    return 0 if result["tables_equal"] else 1


class Terminated(BaseException):
    """SIGTERM arrived: the run stops, cleans up and still prints its JSON line."""


def on_sigterm(*_):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one does not cut the cleanup
    raise Terminated("SIGTERM")


class Run:
    """One run: its processes, its faults and what it measured."""

    def __init__(self, args):
        self.args = args
        self.tables = [f"sbtest{i}" for i in range(1, args.tables + 1)]
        self.src = MariaDB(args.out, "source", binlog=True)
        self.rep = MariaDB(args.out, "replica", binlog=False)
        self.mq = LedgerMQ(os.path.join(args.out, "ledgermq"), args.bin_dir)
        self.procs = {}
        self.faults = []
        self.t0_ms = int(time.time() * 1000)
        self.equal = False
        self.events = 0
        self.changes_in_binlog = None
        self.dead_lettered = None
        self.params = {}

    def start(self, name, script, *extra):
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-u", os.path.join(HERE, script), *extra],
            stdout=open(f"{self.args.out}/{name}.log", "a"), stderr=subprocess.STDOUT)

    def check_alive(self):
        for name in ("capture", "apply"):
            rc = self.procs[name].poll()
            if rc is not None:
                raise RuntimeError(f"{name}.py exited ({rc}): see {name}.log")

    def run(self):
        args, src, rep, mq = self.args, self.src, self.rep, self.mq
        log(f"starting MariaDB source and replica, LedgerMQ under {args.out}")
        src.start()
        rep.start()
        mq.start()
        access = mq.endpoints()
        capture_args = ["--mysql", src.addr(), "--user", USER, "--password", PASSWORD,
                        "--schema", SCHEMA, "--endpoints", access, "--topic", TOPIC,
                        "--state", f"{args.out}/capture-state.json",
                        "--stats", f"{args.out}/capture-stats.jsonl"]
        apply_args = ["--mysql", rep.addr(), "--user", USER, "--password", PASSWORD,
                      "--endpoints", access, "--topic", TOPIC, "--group", GROUP,
                      "--stats", f"{args.out}/apply-stats.jsonl"]
        mq.admin("updateTopic", "-t", TOPIC, "-q", str(args.queues), "--fifo")
        # A change the applier keeps failing on must not reach the dead-letter
        # queue (its group would go on without it): 10,000 deliveries.
        mq.admin("updateSubGroup", "-g", GROUP, "--fifo", "-r", "10000")
        src.sql(f"CREATE DATABASE {SCHEMA}")
        log(f"sysbench prepare: {args.tables} tables of {args.table_size} rows")
        subprocess.run(sysbench(src, args, "prepare"), check=True, stdout=subprocess.DEVNULL)
        dump = subprocess.run(["mariadb-dump", "--no-defaults", "-S", src.sock, "-uroot",
                               "--no-data", "--databases", SCHEMA], check=True,
                              capture_output=True).stdout
        subprocess.run(["mariadb", "--no-defaults", "-S", rep.sock, "-uroot"], input=dump,
                       check=True)
        first_binlog = src.sql("SHOW BINARY LOGS")[0][0]
        self.t0_ms = int(time.time() * 1000)
        self.start("apply", "apply.py", *apply_args)
        self.start("capture", "capture.py", *capture_args, "--start-file", first_binlog)
        log(f"sysbench run: {args.rate} tx/s for {args.duration_s} s; capture and apply running")
        self.procs["sysbench"] = load = subprocess.Popen(sysbench(src, args, "run", (
            f"--rate={args.rate}", f"--time={args.duration_s}", "--threads=2",
            "--report-interval=10")), stdout=open(f"{args.out}/sysbench.log", "w"),
            stderr=subprocess.STDOUT)
        load_started = time.time()

        def at(fraction):
            while time.time() < load_started + args.duration_s * fraction:
                self.check_alive()
                time.sleep(0.2)

        def fault(label):
            self.faults.append((int(time.time() * 1000), label))
            log(label)

        at(0.3)
        self.procs["capture"].kill()
        self.procs["capture"].wait()
        fault("capture killed -9 (started again at once, from its state)")
        self.start("capture", "capture.py", *capture_args, "--start-file", first_binlog)
        at(0.5)
        wait_for("a leader to kill", lambda: mq.leader() is not None, 30)
        leader = mq.leader()
        mq.procs[leader].kill()
        mq.procs[leader].wait()
        fault(f"broker leader n{leader} killed -9 (started again 3 s later)")
        time.sleep(3)
        mq.start_node(leader)
        at(0.7)
        self.procs["apply"].kill()
        self.procs["apply"].wait()
        fault("applier killed -9 (started again 2 s later)")
        time.sleep(2)
        self.start("apply", "apply.py", *apply_args)
        while load.poll() is None:
            self.check_alive()
            time.sleep(0.5)
        if load.returncode != 0:
            raise RuntimeError("sysbench run failed: see sysbench.log")
        load_ended = time.time()
        end_file, end_pos = src.sql("SHOW MASTER STATUS")[0][:2]
        log(f"load done; source binlog ends at {end_file}:{end_pos}; draining")

        changes = binlog_row_changes(src, self.tables)

        def captured_all():
            path = f"{args.out}/capture-state.json"
            if not os.path.exists(path):
                return False
            with open(path) as f:
                st = json.load(f)
            return st["log_file"] == end_file and st["log_pos"] == int(end_pos)

        def applied():
            return int(rep.sql("SELECT COALESCE(SUM(n), 0) FROM lmq_sync.applied")[0][0])

        # Done when the capture has every row acknowledged, the replica has applied
        # as many changes as the binlog holds, and the tables compare equal.
        deadline = time.time() + args.drain_timeout_s
        while not (captured_all() and applied() == changes
                   and checksums(src, self.tables) == checksums(rep, self.tables)):
            if time.time() > deadline:
                raise RuntimeError(f"the replica did not catch up within {args.drain_timeout_s} s "
                                   f"({applied()} of {changes} changes applied)")
            self.check_alive()
            time.sleep(2)
        caught_up = time.time()
        src_sums, rep_sums = checksums(src, self.tables), checksums(rep, self.tables)
        for i, table in enumerate(self.tables):
            a = f"checksum {src_sums[0][i]}, {src_sums[1][i]} rows"
            b = f"checksum {rep_sums[0][i]}, {rep_sums[1][i]} rows"
            log(f"{table}: source {a}; replica {b}{'' if a == b else '  DIFFERENT'}")
        self.events = applied()
        self.changes_in_binlog = changes
        self.dead_lettered = dlq_messages(mq)
        log(f"row changes: {self.changes_in_binlog} in the binlog, {self.events} applied "
            f"once each; {self.dead_lettered} in the dead-letter queue")
        self.equal = (src_sums == rep_sums and self.events == self.changes_in_binlog
                      and self.dead_lettered == 0)
        self.params = {"tables": args.tables, "table_size": args.table_size,
                       "rate_tx_per_s": args.rate, "duration_s": args.duration_s,
                       "queues": args.queues, "load_s": round(load_ended - load_started, 1),
                       "caught_up_s_after_load": round(caught_up - load_ended, 1),
                       "row_changes_in_binlog": self.changes_in_binlog,
                       "dead_lettered": self.dead_lettered}
        return self.result()

    def result(self, error=None):
        """The JSON line: events applied, their rate from the capture's start to the
        last apply, whether the tables (and the counts) are equal, and the longest
        send that ended within 30 s after the leader kill."""
        apply_stats = read_jsonl(f"{self.args.out}/apply-stats.jsonl")
        capture_stats = read_jsonl(f"{self.args.out}/capture-stats.jsonl")
        applied_times = [s["t_ms"] for s in apply_stats if s["applied"]]
        last_apply_ms = max(applied_times) if applied_times else self.t0_ms + 1
        kills = [t for t, label in self.faults if "leader" in label]
        pause = max([s["longest_send_ms"] for s in capture_stats
                     if kills and kills[0] <= s["t_ms"] <= kills[0] + 30_000] + [0.0])
        out = {"events": self.events,
               "events_per_s": round(self.events / max(0.001, (last_apply_ms - self.t0_ms)
                                                      / 1000.0), 1),
               "tables_equal": self.equal and error is None,
               "max_pause_ms": round(pause),
               "leader_killed": bool(kills)}
        if error is not None:
            out["error"] = error
        return out

    def write_report(self, result):
        apply_stats = read_jsonl(f"{self.args.out}/apply-stats.jsonl")
        samples = [(s["t_ms"], s["max_lag_s"], s["mean_lag_s"]) for s in apply_stats]
        with open(f"{self.args.out}/lag.svg", "w") as f:
            f.write(lag_svg(samples, self.faults, self.t0_ms))
        rows = [f"| {(s['t_ms'] - self.t0_ms) / 1000.0:.0f} | {s['applied']} | "
                f"{s['max_lag_s']} | {s['mean_lag_s']} |" for s in apply_stats[::5]]
        with open(f"{self.args.out}/report.md", "w") as f:
            f.write(markdown(result, self.params, self.faults, self.t0_ms, rows))
        log(f"report: {self.args.out}/report.md")

    def stop_all(self):
        terminate_all(self.procs.values())
        self.mq.stop()
        self.src.stop()
        self.rep.stop()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_sigterm)
    sys.exit(main())
