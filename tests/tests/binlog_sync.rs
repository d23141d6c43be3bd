//! The binlog-sync example (`examples/binlog-sync/run.sh --short`), end to end: a
//! MariaDB source under sysbench's write-only load, its row binlog captured into a
//! FIFO topic of a 3-node group of this build's binaries and applied to a replica
//! MariaDB by a FIFO consumer group, with the capture, the broker leader and the
//! applier each killed -9 on the way. Passes only if the script says every table is
//! equal (its exit status and its last line, JSON), a leader was killed, and events
//! were carried. The script installs MariaDB, sysbench and the Python libraries it
//! needs when they are missing (apt, pip), as `scripts/test` does beforehand.

use std::process::Command;

#[test]
fn binlog_sync_keeps_the_replica_equal_through_a_leader_kill() {
    let mqbroker = ledgermq_testkit::bins::bin("mqbroker").expect("build the binaries first");
    let bin_dir = mqbroker.parent().unwrap().to_path_buf();
    let out = tempfile::tempdir().unwrap();
    let repo = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let run = Command::new(format!("{repo}/examples/binlog-sync/run.sh"))
        .arg("--short")
        .env("LEDGERMQ_BIN_DIR", &bin_dir)
        .env("LEDGERMQ_BINLOG_OUT", out.path().join("run"))
        .output()
        .expect("examples/binlog-sync/run.sh starts");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    let last = stdout.lines().last().unwrap_or_default().to_owned();
    match verdict(run.status.success(), &last) {
        Ok(()) => println!("{last}"),
        Err(why) => {
            // Kept for a look: logs, report.md, the stores.
            let kept = out.keep();
            panic!(
                "{why}\nlast line: {last}\nthe run's files: {}\n{stderr}",
                kept.display()
            );
        }
    }
}

/// Why the run failed, if it did: its exit status, then its last line's fields.
fn verdict(success: bool, last: &str) -> Result<(), String> {
    if !success {
        return Err("run.sh exited non-zero".into());
    }
    let result: serde_json::Value =
        serde_json::from_str(last).map_err(|e| format!("the last line is not JSON: {e}"))?;
    if result["tables_equal"] != true {
        return Err("the replica's tables differ from the source's".into());
    }
    if result["leader_killed"] != true {
        return Err("no leader was killed".into());
    }
    if result["events"].as_u64().unwrap_or(0) <= 1000 {
        return Err("too few events carried".into());
    }
    if result["events_per_s"].as_f64().unwrap_or(0.0) <= 0.0
        || result["max_pause_ms"].as_u64().is_none()
    {
        return Err("events_per_s or max_pause_ms missing".into());
    }
    Ok(())
}
