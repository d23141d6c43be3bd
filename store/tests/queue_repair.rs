//! A damaged ConsumeQueue entry below the dispatch position is rebuilt from the
//! CommitLog when it is read (the jepsen `corrupt-consume-queue` fault left such
//! an entry unreadable for good before).

mod common;

use common::{damage_commit_log, message, overwrite_file, small_config};
use ledgermq_store::{MessageStore, StoreConfig, StoreError};

/// Messages 0..120 of the shared sequence: topics T0/T1, queues 0..3.
const MESSAGES: u64 = 120;

/// Writes, dispatches and checkpoints every message, stops cleanly, and returns
/// queue T0#0's messages in queue order.
fn write_and_stop(cfg: &StoreConfig) -> Vec<Vec<u8>> {
    let store = MessageStore::open(cfg.clone()).unwrap();
    for idx in 0..MESSAGES / 2 {
        let batch = [message(2 * idx, 80), message(2 * idx + 1, 120)];
        store.append_entry(1, idx, &batch).unwrap();
    }
    store.dispatch_through(MESSAGES / 2 - 1).unwrap();
    let (lo, hi) = store.queue_offsets("T0", 0);
    let bytes = (lo..hi)
        .map(|q| store.get_message("T0", 0, q).unwrap().bytes)
        .collect();
    store.shutdown().unwrap();
    bytes
}

/// Writes `bytes` over queue T0#0's file from entry `queue_offset`, byte `skip`.
fn damage_queue(cfg: &StoreConfig, queue_offset: u64, skip: u64, bytes: &[u8]) {
    let path = cfg
        .root
        .join("consumequeue/T0/0")
        .join(format!("{:020}", 0));
    overwrite_file(&path, queue_offset * 20 + skip, bytes);
}

#[test]
fn damaged_consume_queue_entries_are_rebuilt_from_the_commit_log() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path(), 16 * 1024);
    let expected = write_and_stop(&cfg);
    assert!(expected.len() >= 15, "{}", expected.len());
    // An entry pointing at a message of another queue (the next entry's offset
    // bytes shifted), one with a zero size (does not decode), two garbled in a
    // row, and the last one.
    damage_queue(&cfg, 3, 7, &[0x01]);
    damage_queue(&cfg, 6, 8, &[0, 0, 0, 0]);
    damage_queue(&cfg, 9, 0, &[0xC3; 40]);
    damage_queue(&cfg, expected.len() as u64 - 1, 2, &[0x77; 6]);
    let store = MessageStore::open(cfg.clone()).unwrap();
    for (q, want) in expected.iter().enumerate() {
        let got = store
            .get_message("T0", 0, q as u64)
            .unwrap_or_else(|e| panic!("queue offset {q}: {e}"));
        assert_eq!(&got.bytes, want, "queue offset {q}");
    }
    // The batch read a consumer makes sees the same messages.
    let (msgs, next) = store
        .get_messages("T0", 0, 0, expected.len(), |_| true)
        .unwrap();
    assert_eq!(next, expected.len() as u64);
    let got: Vec<_> = msgs.into_iter().map(|m| m.bytes).collect();
    assert_eq!(got, expected);
}

#[test]
fn damaged_first_entries_are_reported_not_invented() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path(), 16 * 1024);
    let expected = write_and_stop(&cfg);
    // The first two entries garbled: the store still opens (retention's search at
    // start reads past them), and with no intact entry before them (a snapshot may
    // have counted messages the CommitLog still holds) they are reported, not
    // guessed. (An all-zero entry in a queue's last file reads as its end when the
    // file is opened: `FixedLog`'s format.)
    damage_queue(&cfg, 0, 0, &[0xC3; 40]);
    let store = MessageStore::open(cfg).unwrap();
    for q in [0, 1] {
        assert!(
            matches!(
                store.get_message("T0", 0, q),
                Err(StoreError::Corrupted { .. })
            ),
            "queue offset {q}: {:?}",
            store.get_message("T0", 0, q).map(|m| m.physical_offset)
        );
    }
    for (q, want) in expected.iter().enumerate().skip(2) {
        assert_eq!(
            &store.get_message("T0", 0, q as u64).unwrap().bytes,
            want,
            "queue offset {q}"
        );
    }
}

#[test]
fn an_entry_whose_record_is_damaged_too_is_reported_not_invented() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path(), 16 * 1024);
    let expected = write_and_stop(&cfg);
    let phys = {
        let store = MessageStore::open(cfg.clone()).unwrap();
        let p = store.get_message("T0", 0, 5).unwrap().physical_offset;
        store.shutdown().unwrap();
        p
    };
    // The record's CRC-covered bytes, and its queue entry.
    damage_commit_log(&cfg, phys + 12, &[0x5A; 8]);
    damage_queue(&cfg, 5, 0, &[0xC3; 20]);
    let store = MessageStore::open(cfg).unwrap();
    assert!(matches!(
        store.get_message("T0", 0, 5),
        Err(StoreError::Corrupted { .. })
    ));
    assert_eq!(store.get_message("T0", 0, 6).unwrap().bytes, expected[6]);
}

/// Only an entry's tag hash damaged: the record it points at is a message of its
/// queue, but not one with that tag hash; the entry is rebuilt (a queue digest
/// of the jepsen replica audit differed on the damaged node before).
#[test]
fn an_entry_whose_tag_hash_was_damaged_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path(), 16 * 1024);
    write_and_stop(&cfg);
    let want = {
        let store = MessageStore::open(cfg.clone()).unwrap();
        let cq = store.consume_queues().get("T0", 0).unwrap();
        let e = cq.get(5).unwrap();
        store.shutdown().unwrap();
        e
    };
    // Bytes 12..20 of an entry are its tag hash.
    damage_queue(&cfg, 5, 14, &[0x5A, 0xA5]);
    let store = MessageStore::open(cfg).unwrap();
    let cq = store.consume_queues().get("T0", 0).unwrap();
    assert_ne!(cq.get(5).unwrap(), want, "the damage changed the tag hash");
    let (e, _) = store.queue_message(&cq, 5).unwrap();
    assert_eq!(e, want);
    assert_eq!(cq.get(5).unwrap(), want, "rewritten in the file");
}
