//! A damaged Raft index entry is rebuilt from the CommitLog (the jepsen
//! `corrupt-index` fault stopped the node at every start before).

mod common;

use std::path::Path;

use common::{damage_commit_log, message, overwrite_file, small_config};
use ledgermq_store::{MessageStore, StoreConfig, StoreError};

const ENTRIES: u64 = 40;

/// Writes `ENTRIES` entries, checkpoints them and stops cleanly; returns each
/// entry's bytes as read back.
fn write_and_stop(cfg: &StoreConfig) -> Vec<Vec<u8>> {
    let store = MessageStore::open(cfg.clone()).unwrap();
    for idx in 0..ENTRIES {
        let batch: Vec<_> = (0..1 + idx % 3)
            .map(|k| message(idx * 3 + k, 100 + 37 * (idx as usize % 9)))
            .collect();
        store.append_entry(1 + idx / 10, idx, &batch).unwrap();
    }
    store.dispatch_through(ENTRIES - 1).unwrap();
    let bytes = (0..ENTRIES)
        .map(|i| store.read_entry(i).unwrap().bytes)
        .collect();
    store.shutdown().unwrap();
    bytes
}

/// Overwrites `len` bytes of the Raft index from entry `log_index` on with 0xA5.
fn damage_index(root: &Path, log_index: u64, skip: u64, len: usize) {
    let path = root.join("raftindex").join(format!("{:020}", 0));
    overwrite_file(&path, log_index * 32 + skip, &vec![0xA5; len]);
}

fn check_every_entry(store: &MessageStore, expected: &[Vec<u8>]) {
    for (i, bytes) in expected.iter().enumerate() {
        let e = store
            .read_entry(i as u64)
            .unwrap_or_else(|e| panic!("entry {i}: {e}"));
        assert_eq!(&e.bytes, bytes, "entry {i}");
    }
}

#[test]
fn damaged_index_entries_are_rebuilt_from_the_commit_log() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path(), 16 * 1024);
    let expected = write_and_stop(&cfg);
    // Two entries unreadable (magic and all), one whose physical offset points
    // elsewhere, and the last entry's.
    damage_index(&cfg.root, 11, 0, 64);
    damage_index(&cfg.root, 25, 8, 8);
    damage_index(&cfg.root, ENTRIES - 1, 4, 20);
    let store = MessageStore::open(cfg.clone()).unwrap();
    let last = store.commit_log().last_entry().unwrap().unwrap();
    assert_eq!(last.log_index, ENTRIES - 1);
    check_every_entry(&store, &expected);
    // New entries follow the repaired ones.
    store.append_entry(5, ENTRIES, &[message(999, 50)]).unwrap();
    assert_eq!(
        store.read_entry(ENTRIES).unwrap().location.log_index,
        ENTRIES
    );
    store.shutdown().unwrap();
    let store = MessageStore::open(cfg).unwrap();
    check_every_entry(&store, &expected);
}

#[test]
fn an_entry_whose_index_and_records_are_both_damaged_is_reported_not_invented() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path(), 16 * 1024);
    let expected = write_and_stop(&cfg);
    let victim = 17u64;
    let loc = {
        let store = MessageStore::open(cfg.clone()).unwrap();
        let loc = store.commit_log().entry_location(victim).unwrap();
        store.shutdown().unwrap();
        loc
    };
    // The record's CRC-covered bytes and its index entry.
    damage_commit_log(&cfg, loc.physical_offset + 12, &[0x5A; 16]);
    damage_index(&cfg.root, victim, 0, 32);
    let store = MessageStore::open(cfg).unwrap();
    assert!(
        matches!(store.read_entry(victim), Err(StoreError::Corrupted { .. })),
        "a damaged entry must not be read back"
    );
    // Every other entry still reads back, the one after the damage included.
    for (i, bytes) in expected.iter().enumerate() {
        if i as u64 != victim {
            assert_eq!(
                &store.read_entry(i as u64).unwrap().bytes,
                bytes,
                "entry {i}"
            );
        }
    }
}

#[test]
fn a_damaged_record_fails_only_its_reads_not_flushes_or_searches() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path(), 16 * 1024);
    let expected = write_and_stop(&cfg);
    let victim = 17u64;
    let (loc, end) = {
        let store = MessageStore::open(cfg.clone()).unwrap();
        let log = store.commit_log();
        let loc = log.entry_location(victim).unwrap();
        let end = log.last_entry().unwrap().unwrap().end_offset();
        store.shutdown().unwrap();
        (loc, end)
    };
    // The first record's header (its length and magic), the index left intact.
    damage_commit_log(&cfg, loc.physical_offset, &[0xF8; 8]);
    let store = MessageStore::open(cfg).unwrap();
    let log = store.commit_log();
    // Searches and flushes pass the damaged entry on what its index entry says.
    assert_eq!(log.entry_location(victim).unwrap(), loc);
    assert_eq!(
        log.last_entry_ending_by(loc.end_offset())
            .unwrap()
            .unwrap()
            .log_index,
        victim
    );
    store.append_entry(9, ENTRIES, &[message(999, 50)]).unwrap();
    log.flush().unwrap();
    assert!(log.flushed_offset() > end);
    // Reading it fails; its neighbours read back.
    let read = store.read_entry(victim).and_then(|e| {
        e.records()
            .try_for_each(|r| r.map(|_| ()).map_err(StoreError::InvalidInput))
    });
    assert!(read.is_err(), "a damaged record must not be read back");
    for i in [victim - 1, victim + 1] {
        assert_eq!(store.read_entry(i).unwrap().bytes, expected[i as usize]);
    }
}
