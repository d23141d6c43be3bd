//! Kills a real writing process with SIGKILL in the middle of its appends, then
//! recovers its store: every entry the writer was told is durable must be there, whole,
//! and dispatchable; the log continues after it.
//!
//! The writer is this same test binary re-run on its ignored `child_writer` test.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{message, small_config};
use ledgermq_store::{FlushMode, MessageStore};

const DIR_ENV: &str = "LEDGERMQ_KILL9_DIR";

#[test]
#[ignore = "run by kill9_writer_recovers_every_durable_entry as its child process"]
fn child_writer() {
    let Ok(dir) = std::env::var(DIR_ENV) else {
        return;
    };
    let mut cfg = small_config(std::path::Path::new(&dir), 64 * 1024);
    cfg.flush_mode = FlushMode::Sync;
    let store = MessageStore::open(cfg).unwrap();
    for idx in 0..1_000_000u64 {
        let batch: Vec<_> = (0..1 + idx % 4)
            .map(|k| message(idx * 4 + k, 300))
            .collect();
        let loc = store.append_entry(1, idx, &batch).unwrap();
        // Answered by the group-commit thread once an fsync covers the entry.
        store.when_durable(
            loc.end_offset(),
            Box::new(move |r| {
                if r.is_ok() {
                    println!("durable {idx}");
                }
            }),
        );
        if idx % 64 == 0 {
            store.dispatch_through(idx).unwrap();
        }
    }
}

#[test]
fn kill9_writer_recovers_every_durable_entry() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_writer",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DIR_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let started = Instant::now();
    let mut durable = Vec::new();
    while durable.len() < 2_000 && started.elapsed() < Duration::from_secs(60) {
        match lines.next() {
            Some(Ok(line)) => {
                if let Some(i) = line.strip_prefix("durable ") {
                    durable.push(i.trim().parse::<u64>().unwrap());
                }
            }
            _ => break,
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // Lines already in the pipe were also acknowledged before the kill.
    for line in lines.map_while(Result::ok) {
        if let Some(i) = line.strip_prefix("durable ") {
            durable.push(i.trim().parse::<u64>().unwrap());
        }
    }
    assert!(
        durable.len() >= 100,
        "the writer acknowledged only {} entries",
        durable.len()
    );
    let last_durable = *durable.iter().max().unwrap();

    let store = MessageStore::open(small_config(dir.path(), 64 * 1024)).unwrap();
    let report = store.recovery_report().clone();
    assert!(
        !report.clean,
        "a killed writer cannot have shut down cleanly"
    );
    let next = store.commit_log().next_log_index();
    assert!(
        next > last_durable,
        "durable entry {last_durable} lost: {report:?}"
    );
    for idx in 0..next {
        let entry = store.read_entry(idx).unwrap();
        let records: Vec<_> = entry.records().collect::<Result<_, _>>().unwrap();
        assert_eq!(
            records.len() as u64,
            1 + idx % 4,
            "entry {idx} is not whole"
        );
        assert_eq!(records[0].body(), message(idx * 4, 300).body.as_slice());
    }
    let placed = store.dispatch_through(next - 1).unwrap();
    let total: u64 = (0..next).map(|i| 1 + i % 4).sum();
    let (lo, hi) = store.queue_offsets("T0", 0);
    assert_eq!(lo, 0);
    let dispatched_before = report.dispatched_next_log_index;
    let from_before: u64 = (0..dispatched_before).map(|i| 1 + i % 4).sum();
    assert_eq!(placed.len() as u64 + from_before, total);
    for q in lo..hi {
        store.get_message("T0", 0, q).unwrap();
    }
    store.append_entry(2, next, &[message(0, 1)]).unwrap();
}
