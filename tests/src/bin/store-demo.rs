//! The store's demo: write, crash (kill -9), recover, read.
//!
//! A child process appends 1 KiB messages to a store with group commit and prints
//! every entry once it is durable; the parent kills it with SIGKILL mid-stream,
//! reopens the store (crash recovery), reads every message back through the
//! ConsumeQueues and checks that every acknowledged message is there, once, in order.
//! Exits non-zero if any acknowledged message is lost, duplicated or out of order.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use ledgermq_store::record::{PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY};
use ledgermq_store::{FlushMode, MessageRecord, MessageStore, StoreConfig};

const TOPIC: &str = "DemoTopic";
const QUEUES: u64 = 4;
const PER_ENTRY: u64 = 16;
const BODY_BYTES: usize = 1024;

#[derive(Parser, Debug)]
#[command(about = "LedgerMQ store demo: write, kill -9, recover, read")]
struct Args {
    /// Store directory (default: a fresh temporary directory, removed at the end).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Acknowledged messages to wait for before killing the writer.
    #[arg(long, default_value_t = 20_000)]
    messages: u64,
    /// sync (fsync before acknowledging) or async (acknowledge once written).
    #[arg(long, default_value = "sync")]
    flush: FlushMode,
    /// CommitLog segment size in bytes (small, so the demo rolls over segments).
    #[arg(long, default_value_t = 8 << 20)]
    segment_bytes: u64,
    /// Internal: run as the writer child process.
    #[arg(long, hide = true)]
    child: bool,
}

fn config(args: &Args, dir: &Path) -> StoreConfig {
    let mut cfg = StoreConfig::small(dir, args.segment_bytes);
    cfg.flush_mode = args.flush;
    cfg
}

fn message(seq: u64) -> MessageRecord {
    let mut body = format!("seq={seq};").into_bytes();
    body.resize(BODY_BYTES, b'.');
    MessageRecord::message(TOPIC, (seq % QUEUES) as i32, body, now_ms())
        .with_property(PROPERTY_TAGS, if seq % 2 == 0 { "even" } else { "odd" })
        .with_property(PROPERTY_KEYS, &format!("order-{seq}"))
        .with_property(PROPERTY_UNIQ_KEY, &format!("DEMO{seq:016X}"))
}

fn seq_of(body: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(body.split(|&b| b == b';').next()?).ok()?;
    s.strip_prefix("seq=")?.parse().ok()
}

fn now_ms() -> i64 {
    ledgermq_store::store::now_ms()
}

/// The writer: appends entries of 16 messages forever, printing `acked <last seq>`
/// once each entry is durable (SYNC_FLUSH) or written (ASYNC_FLUSH).
fn run_child(args: &Args, dir: &Path) -> Result<()> {
    let store = MessageStore::open(config(args, dir))?;
    let mut seq = 0u64;
    for log_index in 0u64.. {
        let batch: Vec<_> = (0..PER_ENTRY).map(|k| message(seq + k)).collect();
        seq += PER_ENTRY;
        let loc = store.append_entry(1, log_index, &batch)?;
        // Single node: an entry is committed once it is persisted; then it is applied.
        let last = seq - 1;
        match args.flush {
            FlushMode::Sync => store.wait_durable(loc.end_offset()).map(|_| ())?,
            FlushMode::Async => {}
        }
        store.dispatch_through(log_index)?;
        println!("acked {last}");
    }
    Ok(())
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args = Args::parse();
    let temp;
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => {
            temp = tempfile::tempdir()?;
            temp.path().to_path_buf()
        }
    };
    if args.child {
        return run_child(&args, &dir);
    }
    println!(
        "LedgerMQ store demo: {} mode, store at {}",
        match args.flush {
            FlushMode::Sync => "SYNC_FLUSH",
            FlushMode::Async => "ASYNC_FLUSH",
        },
        dir.display()
    );

    // 1. Write, then crash.
    let exe = std::env::current_exe()?;
    let started = Instant::now();
    let mut child = Command::new(exe)
        .args(["--child", "--dir"])
        .arg(&dir)
        .args([
            "--flush",
            match args.flush {
                FlushMode::Sync => "sync",
                FlushMode::Async => "async",
            },
        ])
        .args(["--segment-bytes", &args.segment_bytes.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the writer")?;
    let mut acked: Option<u64> = None;
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    while acked.map_or(0, |a| a + 1) < args.messages {
        match lines.next() {
            Some(line) => {
                if let Some(n) = line?.strip_prefix("acked ") {
                    acked = Some(n.parse()?);
                }
            }
            None => bail!("the writer exited early: {:?}", child.wait()?),
        }
    }
    child.kill()?; // SIGKILL
    child.wait()?;
    let write_ms = started.elapsed().as_millis();
    for line in lines.map_while(std::result::Result::ok) {
        if let Some(n) = line.strip_prefix("acked ") {
            acked = Some(n.parse()?);
        }
    }
    let acked = acked.map_or(0, |a| a + 1);
    println!("write:   {acked} messages of {BODY_BYTES} B acknowledged in {write_ms} ms, then the writer was killed with SIGKILL");

    // 2. Recover.
    let t = Instant::now();
    let store = MessageStore::open(config(&args, &dir))?;
    let r = store.recovery_report().clone();
    println!(
        "recover: clean shutdown: {}; scanned {} entries from offset {:?} in {} ms; damage: {}; log ends at index {}",
        r.clean,
        r.entries_scanned,
        r.scanned_from,
        t.elapsed().as_millis(),
        r.damage.as_ref().map_or("none".to_string(), |(at, why)| format!("at {at}: {why}")),
        r.next_log_index
    );
    let next = store.commit_log().next_log_index();
    if next > 0 {
        store.dispatch_through(next - 1)?;
    }

    // 3. Read everything back through the ConsumeQueues.
    let t = Instant::now();
    let mut seen: BTreeMap<u64, u32> = BTreeMap::new();
    let mut in_order = true;
    for q in 0..QUEUES as i32 {
        let (lo, hi) = store.queue_offsets(TOPIC, q);
        let mut prev = None;
        let mut at = lo;
        while at < hi {
            let (msgs, next_at) = store.get_messages(TOPIC, q, at, 1024, |_| true)?;
            for m in &msgs {
                let seq = seq_of(m.view().body())
                    .context("a message body without its sequence number")?;
                in_order &= prev.is_none_or(|p| p < seq) && seq % QUEUES == q as u64;
                prev = Some(seq);
                *seen.entry(seq).or_default() += 1;
            }
            at = next_at;
        }
    }
    let lost = (0..acked).filter(|s| !seen.contains_key(s)).count();
    let duplicated = seen.values().filter(|&&n| n > 1).count();
    let recovered_unacked = seen.keys().filter(|&&s| s >= acked).count();
    println!(
        "read:    {} messages in {} ms through {QUEUES} ConsumeQueues; lost {lost}, duplicated {duplicated}, order kept: {}; {recovered_unacked} written but unacknowledged messages also survived",
        seen.len(),
        t.elapsed().as_millis(),
        if in_order { "yes" } else { "NO" }
    );
    let probe = acked / 2;
    let hits = store.query_by_key(TOPIC, &format!("order-{probe}"), 0, i64::MAX, 4)?;
    println!(
        "query:   key order-{probe} -> {} message(s) at CommitLog offset(s) {:?}",
        hits.len(),
        hits.iter().map(|h| h.physical_offset).collect::<Vec<_>>()
    );

    // 4. Clean shutdown, and a restart that needs no scan.
    store.shutdown()?;
    drop(store);
    let t = Instant::now();
    let store = MessageStore::open(config(&args, &dir))?;
    println!(
        "restart: after a clean shutdown: clean={} (no scan), opened in {} ms",
        store.recovery_report().clean,
        t.elapsed().as_millis()
    );
    store.shutdown()?;
    if lost > 0 || duplicated > 0 || !in_order || hits.len() != 1 || !store.recovery_report().clean
    {
        bail!(
            "FAILED: lost {lost}, duplicated {duplicated}, in order {in_order}, key hits {}",
            hits.len()
        );
    }
    println!("OK: every acknowledged message survived the crash, once and in order");
    Ok(())
}
