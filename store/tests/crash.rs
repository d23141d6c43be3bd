//! Crash tests: torn tails (files cut at random byte positions) and random bit flips,
//! followed by recovery. Every entry before the damage must read back intact; nothing
//! at or after it may be returned; the log must accept appends at the cut.

mod common;

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

use common::{crash, message, small_config};

use ledgermq_store::{MessageStore, StoreConfig, StoreError};
use rand::{Rng, SeedableRng};

const SEGMENT: u64 = 16 * 1024;

/// Small files, and no background checkpoint: the tests decide what is checkpointed.
fn crash_config(dir: &Path) -> StoreConfig {
    let mut cfg = small_config(dir, SEGMENT);
    cfg.flush_interval_ms = 3_600_000;
    cfg
}

fn segment_path(cfg: &StoreConfig, offset: u64) -> (PathBuf, u64) {
    let start = offset - offset % SEGMENT;
    (
        cfg.root.join("commitlog").join(format!("{start:020}")),
        offset - start,
    )
}

/// Writes `entries` entries of 1-3 records; checkpoints after `checkpointed` of them;
/// returns the locations (log index = position) and drops the store without a clean
/// shutdown.
fn write_then_crash(
    cfg: &StoreConfig,
    entries: u64,
    checkpointed: u64,
    rng: &mut impl Rng,
) -> Vec<(u64, u64)> {
    let store = MessageStore::open(cfg.clone()).unwrap();
    let mut locs = Vec::new();
    for idx in 0..entries {
        let batch: Vec<_> = (0..rng.gen_range(1..=3))
            .map(|k| message(idx * 3 + k, rng.gen_range(0..700)))
            .collect();
        let loc = store.append_entry(1, idx, &batch).unwrap();
        locs.push((loc.physical_offset, loc.end_offset()));
        if idx + 1 == checkpointed {
            store.dispatch_through(idx).unwrap();
            store.checkpoint().unwrap();
        }
    }
    // Stop the background checkpoint from covering the tail before we "crash".
    crash(store);
    locs
}

/// Checks the recovered store: entries `[0, keep)` intact, nothing from `keep` on.
fn check_recovered(cfg: &StoreConfig, keep: u64, entries: u64, seed: u64) {
    let store = MessageStore::open(cfg.clone()).unwrap();
    let report = store.recovery_report().clone();
    assert_eq!(
        store.commit_log().next_log_index(),
        keep,
        "seed {seed}: {report:?}"
    );
    for idx in 0..keep {
        let e = store
            .read_entry(idx)
            .unwrap_or_else(|err| panic!("seed {seed}: entry {idx}: {err}"));
        for r in e.records() {
            r.unwrap_or_else(|err| panic!("seed {seed}: entry {idx}: {err}"));
        }
    }
    for idx in keep..entries {
        assert!(
            matches!(store.read_entry(idx), Err(StoreError::OutOfRange { .. })),
            "seed {seed}: entry {idx} after the damage is still readable"
        );
    }
    // Dispatch what survived and read it through the ConsumeQueues; then the log goes on.
    if keep > 0 {
        store.dispatch_through(keep - 1).unwrap();
    }
    let (lo, hi) = store.queue_offsets("T0", 0);
    for q in lo..hi {
        store.get_message("T0", 0, q).unwrap();
    }
    store.append_entry(2, keep, &[message(1, 10)]).unwrap();
    store.shutdown().unwrap();
    crash(store); // already shut down: this only waits for the last reference
    let store = MessageStore::open(cfg.clone()).unwrap();
    assert!(store.recovery_report().clean);
    assert_eq!(store.commit_log().next_log_index(), keep + 1);
}

fn first_entry_touching(locs: &[(u64, u64)], offset: u64) -> u64 {
    locs.iter()
        .position(|&(_, end)| end > offset)
        .unwrap_or(locs.len()) as u64
}

fn cut_file(path: &Path, len: u64) {
    OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

fn flip_bit(path: &Path, at: u64, bit: u8) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at as usize] ^= 1 << bit;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn torn_tail_cut_at_random_positions() {
    for seed in 0..40u64 {
        let dir = tempfile::tempdir().unwrap();
        let cfg = crash_config(dir.path());
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let entries = 60;
        let checkpointed = rng.gen_range(1..30);
        let locs = write_then_crash(&cfg, entries, checkpointed, &mut rng);
        let durable_end = locs[checkpointed as usize - 1].1;
        let end = locs.last().unwrap().1;
        let cut_at = rng.gen_range(durable_end..end);
        let (path, in_file) = segment_path(&cfg, cut_at);
        cut_file(&path, in_file);
        // Later segments (including any created ahead of the writer) never reached
        // the disk either.
        let cut_segment = cut_at - in_file;
        for e in std::fs::read_dir(cfg.root.join("commitlog")).unwrap() {
            let p = e.unwrap().path();
            let start: u64 = p.file_name().unwrap().to_str().unwrap().parse().unwrap();
            if start > cut_segment {
                std::fs::remove_file(p).unwrap();
            }
        }
        let _ = end;
        check_recovered(&cfg, first_entry_touching(&locs, cut_at), entries, seed);
    }
}

#[test]
fn random_bit_flips_in_the_unflushed_tail() {
    for seed in 100..160u64 {
        let dir = tempfile::tempdir().unwrap();
        let cfg = crash_config(dir.path());
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let entries = 50;
        let checkpointed = rng.gen_range(1..25);
        let locs = write_then_crash(&cfg, entries, checkpointed, &mut rng);
        let durable_end = locs[checkpointed as usize - 1].1;
        let end = locs.last().unwrap().1;
        // Flip inside a record (padding at a segment's end carries no data).
        let victim = rng.gen_range(checkpointed as usize..entries as usize);
        let (start, stop) = locs[victim];
        let at = rng.gen_range(start.max(durable_end)..stop);
        let (path, in_file) = segment_path(&cfg, at);
        flip_bit(&path, in_file, rng.gen_range(0..8));
        let _ = end;
        check_recovered(&cfg, victim as u64, entries, seed);
    }
}

#[test]
fn a_flip_in_checkpointed_data_is_reported_on_read_and_a_full_scan_cuts_there() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = crash_config(dir.path());
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let locs = write_then_crash(&cfg, 40, 40, &mut rng);
    let victim = 10usize;
    let at = locs[victim].0 + 70; // inside the record header area, covered by the CRC
    let (path, in_file) = segment_path(&cfg, at);
    flip_bit(&path, in_file, 3);
    {
        // Recovery trusts the checkpointed prefix; the read itself catches the damage.
        let store = MessageStore::open(cfg.clone()).unwrap();
        assert_eq!(store.commit_log().next_log_index(), 40);
        let err = store.read_entry(victim as u64).and_then(|e| {
            e.records()
                .try_for_each(|r| r.map(|_| ()).map_err(StoreError::InvalidInput))
        });
        assert!(
            err.is_err(),
            "a corrupted record must not be returned as data"
        );
        assert!(store.read_entry(victim as u64 + 1).is_ok());
    }
    // Without a checkpoint the scan starts at the oldest segment and cuts at the damage.
    std::fs::remove_file(cfg.root.join("checkpoint")).unwrap();
    check_recovered(&cfg, victim as u64, 40, 7);
}

#[test]
fn a_hole_in_a_consume_queue_past_the_checkpoint_is_cut_and_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = crash_config(dir.path());
    let store = MessageStore::open(cfg.clone()).unwrap();
    for idx in 0..40u64 {
        store
            .append_entry(1, idx, &[message(idx * 6, 100)])
            .unwrap(); // all T0, queue 0
    }
    store.dispatch_through(9).unwrap();
    store.checkpoint().unwrap();
    store.dispatch_through(39).unwrap();
    let expect: Vec<Vec<u8>> = (0..40)
        .map(|q| store.get_message("T0", 0, q).unwrap().bytes)
        .collect();
    crash(store);
    // A power loss kept the later entries but not the ones right after the checkpoint.
    let cq_file = cfg
        .root
        .join("consumequeue/T0/0")
        .join(format!("{:020}", 0));
    let mut bytes = std::fs::read(&cq_file).unwrap();
    bytes[12 * 20..20 * 20].fill(0);
    std::fs::write(&cq_file, bytes).unwrap();
    let store = MessageStore::open(cfg).unwrap();
    assert_eq!(
        store.queue_offsets("T0", 0),
        (0, 10),
        "entries past the hole were dropped"
    );
    store.dispatch_through(39).unwrap();
    for (q, want) in expect.iter().enumerate() {
        assert_eq!(&store.get_message("T0", 0, q as u64).unwrap().bytes, want);
    }
}
