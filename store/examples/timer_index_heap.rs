//! How much heap the timer index takes as pending timers grow: inserts
//! `N` timers (default 10,000,000) into a `TimerIndex` in a temporary
//! directory, as dispatch does, and prints the process's anonymous resident
//! memory (`RssAnon`, what the heap costs) and the index's size on disk every
//! million (the entries' files are page cache, counted in RssFile, not RssAnon).
//! Then reads the due ones of one second, as delivery does.
//!
//! `cargo run --release -p ledgermq-store --example timer_index_heap [N]`

use std::time::Instant;

use ledgermq_store::timer_index::{PendingTimer, TimerIndex};

fn rss_anon_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("RssAnon:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_bytes(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000_000);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let idx = TimerIndex::open(&dir.path().join("timers")).expect("the index opens");
    idx.open_wheel(&dir.path().join("timerlog"), 0)
        .expect("the wheel opens");
    idx.mark_wheel_ready(&dir.path().join("timerlog"))
        .expect("the wheel is marked ready");
    println!("pending      RssAnon MiB  on disk MiB  inserts/s");
    println!("{:>10}  {:>11}  {:>11}", 0, rss_anon_kib() / 1024, 0);
    let base_ms = 1_800_000_000_000i64;
    let mut t0 = Instant::now();
    for i in 0..n {
        // Spread over one day of delivery seconds, 1 ms apart within a second.
        let deliver_ms = base_ms + ((i * 7919) % 86_400) as i64 * 1000 + (i % 1000) as i64;
        idx.insert(PendingTimer {
            deliver_ms,
            timer_queue_offset: i,
            physical_offset: i * 300,
            size_bytes: 300,
        })
        .expect("insert");
        if (i + 1) % 1_000_000 == 0 {
            idx.flush().expect("flush");
            let rate = 1_000_000.0 / t0.elapsed().as_secs_f64();
            println!(
                "{:>10}  {:>11}  {:>11}  {:>9.0}",
                i + 1,
                rss_anon_kib() / 1024,
                dir_bytes(dir.path()) >> 20,
                rate
            );
            t0 = Instant::now();
        }
    }
    let t = Instant::now();
    let due = idx.due(base_ms + 999, 1_000_000).expect("due");
    println!(
        "due in the first second: {} read in {:.1} ms",
        due.len(),
        t.elapsed().as_secs_f64() * 1000.0
    );
    // A restart: the wheel's chains are relinked by a scan of every entry.
    idx.close().expect("close");
    drop(idx);
    let t = Instant::now();
    let idx = TimerIndex::open(&dir.path().join("timers")).expect("the index opens");
    idx.open_wheel(&dir.path().join("timerlog"), n)
        .expect("the wheel opens");
    println!(
        "reopened with {} pending in {:.0} ms, RssAnon {} MiB",
        idx.pending(),
        t.elapsed().as_secs_f64() * 1000.0,
        rss_anon_kib() / 1024
    );
}
