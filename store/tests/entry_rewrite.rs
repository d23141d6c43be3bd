//! A damaged CommitLog entry before the checkpoint is written back in place from a
//! peer's copy of the same entry (`CommitLog::rewrite_entry`), and only when the
//! copy is of the same term and fills the entry's slot exactly.

mod common;

use common::{damage_commit_log, message, small_config};
use ledgermq_store::{MessageRecord, MessageStore, StoreError};

const ENTRIES: u64 = 30;

/// The records of entry `idx` as written (what a peer holds).
fn records(idx: u64) -> Vec<MessageRecord> {
    (0..1 + idx % 3)
        .map(|k| message(idx * 3 + k, 120 + 41 * (idx as usize % 7)))
        .collect()
}

/// A store at `cfg` holding entries `0..ENTRIES` (terms 1 to 3), dispatched.
fn write_entries(cfg: &ledgermq_store::StoreConfig) -> std::sync::Arc<MessageStore> {
    let store = MessageStore::open(cfg.clone()).unwrap();
    for idx in 0..ENTRIES {
        store
            .append_entry(1 + idx / 10, idx, &records(idx))
            .unwrap();
    }
    store.dispatch_through(ENTRIES - 1).unwrap();
    store
}

/// Every entry's bytes as `store` reads them back.
fn entry_bytes(store: &MessageStore) -> Vec<Vec<u8>> {
    (0..ENTRIES)
        .map(|i| store.read_entry(i).unwrap().bytes)
        .collect()
}

/// Every entry of `store` but `except` checks out and holds the bytes `before`
/// gives it.
fn assert_intact(store: &MessageStore, before: &[Vec<u8>], except: Option<u64>) {
    for i in (0..ENTRIES).filter(|&i| Some(i) != except) {
        let e = store.commit_log().read_entry_verified(i);
        assert_eq!(e.unwrap().bytes, before[i as usize], "entry {i}");
    }
}

#[test]
fn a_damaged_entry_is_written_back_from_a_copy_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path(), 16 * 1024);
    let store = write_entries(&cfg);
    let before = entry_bytes(&store);
    let (q0_before, _) = store.get_messages("T0", 0, 0, 100, |_| true).unwrap();
    let loc14 = store.commit_log().entry_location(14).unwrap();
    let loc21 = store.commit_log().entry_location(21).unwrap();
    store.shutdown().unwrap();
    drop(store);

    // Damage the body of a multi-record entry (its last record) and of a
    // single-record one, before the checkpoint: recovery does not scan them.
    damage_commit_log(
        &cfg,
        loc14.physical_offset + u64::from(loc14.size_bytes) - 30,
        &[0x5A; 8],
    );
    damage_commit_log(&cfg, loc21.physical_offset + 60, &[0x5A; 8]);

    let store = MessageStore::open(cfg.clone()).unwrap();
    let log = store.commit_log();
    for idx in [14, 21] {
        assert!(
            matches!(
                log.read_entry_verified(idx),
                Err(StoreError::Corrupted { .. })
            ),
            "entry {idx} reads back damaged"
        );
    }
    // A copy of another term, or of another size, is refused and writes nothing.
    assert!(matches!(
        store.rewrite_entry(99, 14, &records(14)),
        Err(StoreError::EntryReplaced { .. })
    ));
    assert!(matches!(
        store.rewrite_entry(loc14.term, 14, &records(15)),
        Err(StoreError::InvalidInput(_))
    ));
    assert!(log.read_entry_verified(14).is_err());
    // The right copy restores the entry byte for byte.
    for (idx, loc) in [(14, loc14), (21, loc21)] {
        assert_eq!(
            store.rewrite_entry(loc.term, idx, &records(idx)).unwrap(),
            loc
        );
        assert_eq!(
            log.read_entry_verified(idx).unwrap().bytes,
            before[idx as usize]
        );
    }
    let (q0, _) = store.get_messages("T0", 0, 0, 100, |_| true).unwrap();
    assert_eq!(q0.len(), q0_before.len());
    // Written durably in place: a crash right after loses nothing of it.
    common::crash(store);
    let store = MessageStore::open(cfg).unwrap();
    assert_intact(&store, &before, None);
}

/// After a crash the active IndexFile is rebuilt from the CommitLog; a damaged
/// entry is skipped then, and indexed once it is written back.
#[test]
fn an_entry_the_index_rebuild_skipped_as_damaged_is_indexed_once_written_back() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path(), 16 * 1024);
    let store = write_entries(&cfg);
    let loc = store.commit_log().entry_location(21).unwrap();
    // Entry 21 is message 63 alone: topic T1, key "key-63".
    assert_eq!(
        store
            .query_by_key("T1", "key-63", 0, i64::MAX, 4)
            .unwrap()
            .len(),
        1
    );
    // A checkpoint covers every entry, so recovery cuts nothing, and the rebuild
    // of the IndexFile at the next open covers them all.
    let cp = store.checkpoint().unwrap();
    assert_eq!(cp.dispatched_next_log_index, ENTRIES);
    common::crash(store);
    damage_commit_log(&cfg, loc.physical_offset + 60, &[0x5A; 8]);

    let store = MessageStore::open(cfg).unwrap();
    assert_eq!(
        store.commit_log().next_log_index(),
        ENTRIES,
        "recovery cut nothing"
    );
    assert!(store
        .query_by_key("T1", "key-63", 0, i64::MAX, 4)
        .unwrap()
        .is_empty());
    store.rewrite_entry(loc.term, 21, &records(21)).unwrap();
    let hits = store.query_by_key("T1", "key-63", 0, i64::MAX, 4).unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].physical_offset, loc.physical_offset);
    // Written back once more (nothing skipped now): not indexed twice.
    store.rewrite_entry(loc.term, 21, &records(21)).unwrap();
    assert_eq!(
        store
            .query_by_key("T1", "key-63", 0, i64::MAX, 4)
            .unwrap()
            .len(),
        1
    );
}

/// The Raft index entry of a damaged entry is damaged too, pointing at another
/// entry: the copy is not written there (the entries around the
/// slot do not pin it), and every other entry stays as it was.
#[test]
fn a_copy_is_never_written_where_a_damaged_index_entry_points() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path(), 16 * 1024);
    let store = write_entries(&cfg);
    let before = entry_bytes(&store);
    let loc = |i: u64| store.commit_log().entry_location(i).unwrap();
    // Entry 14's index entry will point at entry 16 (its size field intact, so
    // the copy encodes to the size the index gives).
    let (l14, target) = (loc(14), loc(16));
    store.shutdown().unwrap();
    drop(store);
    damage_commit_log(&cfg, l14.physical_offset + 40, &[0x5A; 8]);
    let index = cfg.root.join("raftindex").join(format!("{:020}", 0));
    common::overwrite_file(&index, 14 * 32 + 8, &target.physical_offset.to_be_bytes());

    let store = MessageStore::open(cfg.clone()).unwrap();
    let res = store.rewrite_entry(l14.term, 14, &records(14));
    assert!(
        matches!(res, Err(StoreError::Corrupted { .. })),
        "written back through a damaged index entry: {res:?}"
    );
    assert_intact(&store, &before, Some(14));
}

/// One damaged span covers the end of an entry and the header of the next: the
/// first is still pinned (by the entry before it, whose header is intact, and by
/// the next entry's index entry), and once it is written back so is the next.
#[test]
fn damage_across_an_entry_boundary_is_written_back_entry_by_entry() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path(), 16 * 1024);
    let store = write_entries(&cfg);
    let before = entry_bytes(&store);
    let (l17, l18) = (
        store.commit_log().entry_location(17).unwrap(),
        store.commit_log().entry_location(18).unwrap(),
    );
    assert_eq!(
        l17.end_offset(),
        l18.physical_offset,
        "adjacent in one segment"
    );
    store.shutdown().unwrap();
    drop(store);
    damage_commit_log(&cfg, l18.physical_offset - 10, &[0x5A; 30]);

    let store = MessageStore::open(cfg).unwrap();
    for (idx, loc) in [(17, l17), (18, l18)] {
        assert!(store.commit_log().read_entry_verified(idx).is_err());
        store.rewrite_entry(loc.term, idx, &records(idx)).unwrap();
    }
    assert_intact(&store, &before, None);
}
