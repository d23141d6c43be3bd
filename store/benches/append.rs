//! CommitLog append throughput of 1 KiB-body messages through `MessageStore`.
//!
//! - `append_async/{single,batch64}`: ASYNC_FLUSH, append only (the background
//!   checkpoint thread flushes every 500 ms while the writer runs).
//! - `append_sync/*`: SYNC_FLUSH, every append is waited on until durable (group
//!   commit: one msync(MS_SYNC) covers every append written before it started):
//!   - `wait_each_1_writer`: one writer, `wait_durable` after every append (one fsync
//!     per append, nothing to group: the contrast case);
//!   - `wait_each_{4,16}_writers`: closed-loop threads, each appending (log indexes
//!     handed out under a shared lock, as the Raft leader does) then `wait_durable`;
//!     at most N entries can share an fsync;
//!   - `pipelined_window64`: one writer issuing appends with `when_durable`
//!     callbacks, at most 64 entries outstanding (how a Raft leader pipelines).
//!
//! `single` entries hold 1 record, `batch64` entries 64. Throughput counts message
//! body bytes (1024 per record); each record also carries ~190 bytes of header, topic
//! and properties, so the CommitLog grows ~1.18x faster.
//!
//! Files go to a temporary directory under `$LEDGERMQ_BENCH_DIR` (default: the
//! system temp dir). Timed runs are cut into 64 MiB chunks; between chunks (untimed)
//! a store holding more than 512 MiB is dropped, its directory deleted and a fresh
//! one opened, so disk use stays under ~600 MiB. Keeping stores small also lets the
//! page cache reuse recently freed pages: on a VM whose freed memory goes back to the
//! host (free page reporting), first-touch of fresh guest pages costs ~18 ms per
//! 8 MiB and would otherwise dominate the figures.
//!
//! Run: `cargo bench -p ledgermq-store --bench append`.

use std::hint::black_box;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ledgermq_store::record::{PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY};
use ledgermq_store::{FlushMode, MessageRecord, MessageStore, StoreConfig};
use tempfile::TempDir;

const BODY_BYTES: usize = 1024;
const BATCH: usize = 64;
const QUEUES: i32 = 4;
/// Closed-loop writer counts for the `wait_each_N_writers` variants.
const WRITERS: [usize; 2] = [4, 16];
const WINDOW: usize = 64;
/// Re-create the store (outside the timed region) once it holds this much. Small, so
/// that disk use stays low and the page cache keeps recycling the same pages (see the
/// module comment).
const MAX_BYTES_PER_STORE: u64 = 512 << 20;
/// Timed runs are cut into chunks of this many body bytes; the store is checked for
/// re-creation between chunks.
const CHUNK_BODY_BYTES: usize = 64 << 20;

fn bench_dir() -> TempDir {
    let base = std::env::var_os("LEDGERMQ_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base).expect("creating the bench directory");
    tempfile::Builder::new()
        .prefix("ledgermq-bench-append-")
        .tempdir_in(base)
        .expect("creating a temporary directory")
}

/// `n` producer-like records: 1 KiB body, tag, keys and message id, spread over the
/// queues of one topic.
fn records(n: usize) -> Vec<MessageRecord> {
    (0..n)
        .map(|i| {
            let body = (0..BODY_BYTES).map(|b| (b * 31 + i) as u8).collect();
            MessageRecord::message(
                "BenchTopic",
                i as i32 % QUEUES,
                body,
                1_700_000_000_000 + i as i64,
            )
            .with_property(PROPERTY_TAGS, "TagA")
            .with_property(PROPERTY_KEYS, &format!("order-{i}"))
            .with_property(PROPERTY_UNIQ_KEY, &format!("7F0000010001{i:020X}"))
        })
        .collect()
}

/// A store in a temporary directory plus the next log index to append.
struct BenchStore {
    mode: FlushMode,
    store: Arc<MessageStore>,
    next_index: Mutex<u64>,
    _dir: TempDir,
}

impl BenchStore {
    fn open(mode: FlushMode) -> Self {
        let dir = bench_dir();
        let mut cfg = StoreConfig::new(dir.path());
        cfg.flush_mode = mode;
        let store = MessageStore::open(cfg).expect("opening the bench store");
        Self {
            mode,
            store,
            next_index: Mutex::new(0),
            _dir: dir,
        }
    }

    /// Replaces the store with an empty one when it holds too much. Dropping it
    /// without `shutdown` skips the final flush: the files are deleted anyway.
    fn recycle_if_full(&mut self) {
        if self.store.commit_log().wrote_offset() >= MAX_BYTES_PER_STORE {
            *self = Self::open(self.mode);
        }
    }

    /// Appends one entry (safe from several threads: log indexes are handed out
    /// under the lock, which also orders the appends) and returns its end offset.
    fn append(&self, records: &[MessageRecord]) -> u64 {
        let mut next = self.next_index.lock().unwrap();
        let loc = self.store.append_entry(1, *next, records).expect("append");
        *next += 1;
        loc.end_offset()
    }
}

/// Runs `iters` iterations as `run(store, n)` calls of at most `CHUNK_BODY_BYTES`
/// worth of records each, re-creating the store between calls (untimed) when it is
/// full. Returns the summed time of the calls.
fn run_chunked(
    s: &mut BenchStore,
    iters: u64,
    body_bytes_per_iter: usize,
    mut run: impl FnMut(&BenchStore, u64) -> Duration,
) -> Duration {
    let chunk = (CHUNK_BODY_BYTES / body_bytes_per_iter).max(1) as u64;
    let mut took = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        s.recycle_if_full();
        let n = left.min(chunk);
        took += run(s, n);
        left -= n;
    }
    took
}

fn append_async(c: &mut Criterion) {
    let mut g = c.benchmark_group("append_async");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for (name, per_entry) in [("single", 1), ("batch64", BATCH)] {
        let recs = records(per_entry);
        let mut s = BenchStore::open(FlushMode::Async);
        g.throughput(Throughput::Bytes((BODY_BYTES * per_entry) as u64));
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                run_chunked(&mut s, iters, BODY_BYTES * per_entry, |s, n| {
                    let t = Instant::now();
                    for _ in 0..n {
                        black_box(s.append(&recs));
                    }
                    t.elapsed()
                })
            })
        });
    }
    g.finish();
}

fn append_sync(c: &mut Criterion) {
    let mut g = c.benchmark_group("append_sync");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for (label, per_entry) in [("single", 1), ("batch64", BATCH)] {
        let recs = records(per_entry);
        g.throughput(Throughput::Bytes((BODY_BYTES * per_entry) as u64));

        let mut s = BenchStore::open(FlushMode::Sync);
        g.bench_function(format!("wait_each_1_writer/{label}"), |b| {
            b.iter_custom(|iters| {
                run_chunked(&mut s, iters, BODY_BYTES * per_entry, |s, n| {
                    let t = Instant::now();
                    for _ in 0..n {
                        let end = s.append(&recs);
                        s.store.wait_durable(end).expect("durable");
                    }
                    t.elapsed()
                })
            })
        });
        drop(s);

        for writers in WRITERS {
            let mut s = BenchStore::open(FlushMode::Sync);
            g.bench_function(format!("wait_each_{writers}_writers/{label}"), |b| {
                b.iter_custom(|iters| {
                    run_chunked(&mut s, iters, BODY_BYTES * per_entry, |s, n| {
                        let recs = &recs;
                        let t = Instant::now();
                        std::thread::scope(|scope| {
                            for w in 0..writers as u64 {
                                let mine = n / writers as u64 + u64::from(w < n % writers as u64);
                                scope.spawn(move || {
                                    for _ in 0..mine {
                                        let end = s.append(recs);
                                        s.store.wait_durable(end).expect("durable");
                                    }
                                });
                            }
                        });
                        t.elapsed()
                    })
                })
            });
        }

        let mut s = BenchStore::open(FlushMode::Sync);
        g.bench_function(format!("pipelined_window{WINDOW}/{label}"), |b| {
            b.iter_custom(|iters| {
                run_chunked(&mut s, iters, BODY_BYTES * per_entry, |s, n| {
                    let (tx, rx) = mpsc::channel::<ledgermq_store::Result<u64>>();
                    let mut outstanding = 0usize;
                    let t = Instant::now();
                    for _ in 0..n {
                        while let Ok(r) = rx.try_recv() {
                            r.expect("durable");
                            outstanding -= 1;
                        }
                        if outstanding == WINDOW {
                            rx.recv().unwrap().expect("durable");
                            outstanding -= 1;
                        }
                        let end = s.append(&recs);
                        let tx = tx.clone();
                        s.store.when_durable(
                            end,
                            Box::new(move |r| {
                                let _ = tx.send(r);
                            }),
                        );
                        outstanding += 1;
                    }
                    // The chunk ends once all of it is durable.
                    for _ in 0..outstanding {
                        rx.recv().unwrap().expect("durable");
                    }
                    t.elapsed()
                })
            })
        });
        drop(s);
    }
    g.finish();
}

criterion_group!(benches, append_async, append_sync);
criterion_main!(benches);
