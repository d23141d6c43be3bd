//! Reads of cached messages through the ConsumeQueue.
//!
//! The store is pre-filled with 102,400 messages of 1 KiB body (1,600 entries of 64
//! records, spread over 4 queues of one topic), dispatched, then:
//!
//! - `read/get_message_random`: `get_message` at uniformly random (queue, offset);
//!   the ConsumeQueue lookup plus the CommitLog read, copy and CRC check of one record;
//! - `read/cq_entry_random`: the ConsumeQueue lookup alone;
//! - `read/read_record_random`: the CommitLog `read_record` alone (known offset and size);
//! - `read/get_messages_32`: a pull of 32 consecutive messages from a random offset.
//!
//! Everything was just written, so it is in the page cache. Files go to a temporary
//! directory under `$LEDGERMQ_BENCH_DIR` (default: the system temp dir), deleted at the
//! end.
//!
//! Run: `cargo bench -p ledgermq-store --bench read`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ledgermq_store::record::{PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY};
use ledgermq_store::{FlushMode, MessageRecord, MessageStore, StoreConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TOPIC: &str = "BenchTopic";
const BODY_BYTES: usize = 1024;
const BATCH: usize = 64;
const ENTRIES: u64 = 1600;
const QUEUES: i32 = 4;
const PULL: usize = 32;
/// Pre-drawn random positions, cycled through (a power of two).
const PICKS: usize = 1 << 16;

fn bench_dir() -> tempfile::TempDir {
    let base = std::env::var_os("LEDGERMQ_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base).expect("creating the bench directory");
    tempfile::Builder::new()
        .prefix("ledgermq-bench-read-")
        .tempdir_in(base)
        .expect("creating a temporary directory")
}

fn message(n: u64) -> MessageRecord {
    let body = (0..BODY_BYTES).map(|b| (b as u64 * 31 + n) as u8).collect();
    MessageRecord::message(
        TOPIC,
        (n % QUEUES as u64) as i32,
        body,
        1_700_000_000_000 + n as i64,
    )
    .with_property(PROPERTY_TAGS, "TagA")
    .with_property(PROPERTY_KEYS, &format!("order-{n}"))
    .with_property(PROPERTY_UNIQ_KEY, &format!("7F0000010001{n:020X}"))
}

fn read(c: &mut Criterion) {
    let dir = bench_dir();
    let mut cfg = StoreConfig::new(dir.path());
    cfg.flush_mode = FlushMode::Async;
    let store = MessageStore::open(cfg).expect("opening the bench store");
    let mut n = 0u64;
    for idx in 0..ENTRIES {
        let batch: Vec<_> = (0..BATCH)
            .map(|_| {
                n += 1;
                message(n)
            })
            .collect();
        store.append_entry(1, idx, &batch).expect("append");
    }
    let placed = store.dispatch_through(ENTRIES - 1).expect("dispatch");
    assert_eq!(placed.len() as u64, n);
    let per_queue: Vec<u64> = (0..QUEUES)
        .map(|q| store.queue_offsets(TOPIC, q).1)
        .collect();

    let mut rng = StdRng::seed_from_u64(42);
    let picks: Vec<(i32, u64)> = (0..PICKS)
        .map(|_| {
            let q = rng.gen_range(0..QUEUES);
            (q, rng.gen_range(0..per_queue[q as usize]))
        })
        .collect();
    let cqs: Vec<_> = (0..QUEUES)
        .map(|q| store.consume_queues().get(TOPIC, q).expect("queue exists"))
        .collect();
    let located: Vec<(u64, usize)> = picks
        .iter()
        .map(|&(q, off)| {
            let e = cqs[q as usize].get(off).expect("cq entry");
            (e.commit_log_offset, e.size_bytes as usize)
        })
        .collect();

    let mut g = c.benchmark_group("read");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements(1));
    g.bench_function("get_message_random", |b| {
        let mut i = 0usize;
        b.iter(|| {
            let (q, off) = picks[i & (PICKS - 1)];
            i += 1;
            black_box(store.get_message(TOPIC, q, off).expect("get_message"))
        })
    });
    g.bench_function("cq_entry_random", |b| {
        let mut i = 0usize;
        b.iter(|| {
            let (q, off) = picks[i & (PICKS - 1)];
            i += 1;
            let cq = store.consume_queues().get(TOPIC, q).expect("queue exists");
            black_box(cq.get(off).expect("cq entry"))
        })
    });
    g.bench_function("read_record_random", |b| {
        let mut i = 0usize;
        b.iter(|| {
            let (phys, size) = located[i & (PICKS - 1)];
            i += 1;
            black_box(
                store
                    .commit_log()
                    .read_record(phys, size)
                    .expect("read_record"),
            )
        })
    });
    g.throughput(Throughput::Elements(PULL as u64));
    g.bench_function("get_messages_32", |b| {
        let mut i = 0usize;
        b.iter(|| {
            let (q, off) = picks[i & (PICKS - 1)];
            i += 1;
            let from = off.min(per_queue[q as usize] - PULL as u64);
            let (got, _) = store
                .get_messages(TOPIC, q, from, PULL, |_| true)
                .expect("get_messages");
            assert_eq!(got.len(), PULL);
            black_box(got)
        })
    });
    g.finish();
    drop(store);
    drop(dir);
}

criterion_group!(benches, read);
criterion_main!(benches);
