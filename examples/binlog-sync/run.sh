#!/usr/bin/env bash
# Binlog sync over LedgerMQ FIFO messages, end to end (README.md beside this file):
# a MariaDB source under sysbench's write-only load, its row-based binlog captured
# into a FIFO topic of a 3-node LedgerMQ group, applied to a replica MariaDB by a
# FIFO consumer group, with a broker leader, the capture and the applier killed -9
# on the way; then every table is compared. Its last line is JSON; it exits non-zero
# unless the tables are equal.
#
#   examples/binlog-sync/run.sh            # 8 tables x 2,000 rows, 50 tx/s for 3 min
#   examples/binlog-sync/run.sh --short    # 4 tables x 500 rows, 20 tx/s for 40 s
#
# Other options go to binlog_sync.py (--rate, --duration-s, --tables, --table-size).
# Installs what it needs: mariadb-server and sysbench (apt), mysql-replication,
# PyMySQL and rocketmq-python-client (pip). The LedgerMQ binaries come from
# LEDGERMQ_BIN_DIR, else from a release build made here. The run's files (logs,
# report.md, lag.svg) go to LEDGERMQ_BINLOG_OUT, else target/binlog-sync.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# A setup step that fails still ends with the JSON line.
trap 'rc=$?; [ "$rc" -eq 0 ] || echo "{\"events\": 0, \"events_per_s\": 0.0, \"tables_equal\": false, \"max_pause_ms\": 0, \"leader_killed\": false, \"error\": \"setup failed (exit $rc)\"}"' EXIT

if ! command -v sysbench >/dev/null || ! command -v mariadb-install-db >/dev/null \
    || ! command -v mariadb-dump >/dev/null || ! command -v mariadb-binlog >/dev/null \
    || { ! command -v mariadbd >/dev/null && [ ! -x /usr/sbin/mariadbd ]; }; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server sysbench >/dev/null
fi
pip_install() {
  python3 -m pip install --quiet "$@" || python3 -m pip install --quiet --break-system-packages "$@"
}
python3 -c "import pymysqlreplication, pymysql" 2>/dev/null \
  || pip_install "mysql-replication==1.0.17" "PyMySQL==1.2.4"
python3 -c "import rocketmq.v5" 2>/dev/null || pip_install "rocketmq-python-client==5.1.2"

bin_dir="${LEDGERMQ_BIN_DIR:-}"
if [ -z "$bin_dir" ]; then
  (cd "$repo" && cargo build --release --bins)
  bin_dir="$repo/target/release"
fi
out="${LEDGERMQ_BINLOG_OUT:-$repo/target/binlog-sync}"
trap - EXIT
exec python3 "$here/binlog_sync.py" --bin-dir "$bin_dir" --out "$out" "$@"
