//! The state machine's restart invariant: after open, the store's dispatch position
//! is exactly one past the last applied entry, whatever sled and the store each
//! persisted, so a snapshot's queue positions always match its log id.

use ledgermq_raft::codec::log_id;
use ledgermq_raft::meta::MetaDb;
use ledgermq_raft::state_machine::StateMachine;
use ledgermq_store::{MessageRecord, MessageStore, StoreConfig};

#[test]
fn dispatch_position_matches_last_applied_after_open() {
    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(StoreConfig::small(dir.path(), 1 << 20)).unwrap();
    for idx in 0..10u64 {
        let m = MessageRecord::message("TopicS", 0, format!("m{idx}").into_bytes(), 0);
        store.append_entry(1, idx, &[m]).unwrap();
    }
    store.dispatch_through(9).unwrap();
    let meta = MetaDb::open(&dir.path().join("meta")).unwrap();
    // sled says only entries up to 3 were applied (its tail was lost).
    MetaDb::put(&meta.sm, "last_applied", &Some(log_id(1, 3))).unwrap();
    let sm = StateMachine::open(store.clone(), meta).unwrap();
    assert_eq!(store.dispatched_next_log_index(), 4);
    // Readers of the metadata see the index it belongs to.
    assert_eq!(sm.shared().read().unwrap().applied_index, Some(3));
    assert_eq!(store.queue_offsets("TopicS", 0), (0, 4));
    // Applying again places the same messages at the same offsets.
    let placed = store.dispatch_through(9).unwrap();
    assert_eq!(
        placed.iter().map(|p| p.queue_offset).collect::<Vec<_>>(),
        (4..10).collect::<Vec<_>>()
    );
    assert_eq!(
        store.get_message("TopicS", 0, 7).unwrap().view().body(),
        b"m7"
    );
}
