//! The timer index as dispatch keeps it: a record of the timer topic becomes a
//! pending timer keyed by its delivery time and its queue offset in the timer
//! topic's ConsumeQueue; a delivered copy removes it; dispatching again after a
//! crash ends in the same index; a reset for a snapshot empties it.

mod common;

use common::{crash, small_config};
use ledgermq_store::timer_index::{
    PendingTimer, PROPERTY_REAL_QID, PROPERTY_REAL_TOPIC, PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_QUEUE_OFFSET, TIMER_TOPIC,
};
use ledgermq_store::{MessageRecord, MessageStore};

fn timer(deliver_ms: i64, body: &str) -> MessageRecord {
    MessageRecord::message(TIMER_TOPIC, 0, body.as_bytes().to_vec(), 1)
        .with_property(PROPERTY_REAL_TOPIC, "Real")
        .with_property(PROPERTY_REAL_QID, "1")
        .with_property(PROPERTY_TIMER_DELIVER_MS, &deliver_ms.to_string())
}

fn copy(deliver_ms: i64, timer_queue_offset: u64, body: &str) -> MessageRecord {
    MessageRecord::message("Real", 1, body.as_bytes().to_vec(), 1)
        .with_property(PROPERTY_TIMER_DELIVER_MS, &deliver_ms.to_string())
        .with_property(PROPERTY_TIMER_QUEUE_OFFSET, &timer_queue_offset.to_string())
}

fn due(store: &MessageStore) -> Vec<(i64, u64)> {
    store
        .timers()
        .due(i64::MAX, 100)
        .unwrap()
        .into_iter()
        .map(|t: PendingTimer| (t.deliver_ms, t.timer_queue_offset))
        .collect()
}

#[test]
fn dispatch_adds_timers_and_delivered_copies_remove_them_again_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path(), 64 * 1024);
    // The test decides what is checkpointed.
    cfg.flush_interval_ms = 3_600_000;
    let store = MessageStore::open(cfg.clone()).unwrap();
    let first = store
        .append_entry(1, 0, &[timer(3_000, "a"), timer(1_000, "b")])
        .unwrap();
    store.append_entry(1, 1, &[timer(2_000, "c")]).unwrap();
    store.dispatch_through(1).unwrap();
    assert_eq!(due(&store), vec![(1_000, 1), (2_000, 2), (3_000, 0)]);
    // Retention keeps pending timers' records though no group consumes the
    // timer topic.
    assert_eq!(
        store.timers().oldest_physical_offset(0).unwrap(),
        Some(first.physical_offset)
    );
    let b = store.timers().due(1_000, 10).unwrap();
    assert_eq!(b.len(), 1);
    // The pending timer points at its record.
    let rec = store.read_timer(&b[0]).unwrap();
    assert_eq!(rec.body, b"b");
    store.checkpoint().unwrap();

    // "b" is delivered; then the store crashes before the next checkpoint.
    store.append_entry(1, 2, &[copy(1_000, 1, "b")]).unwrap();
    store.dispatch_through(2).unwrap();
    assert_eq!(due(&store), vec![(2_000, 2), (3_000, 0)]);
    // A normal message carrying neither property leaves the index alone.
    store
        .append_entry(1, 3, &[MessageRecord::message("Real", 0, b"n".to_vec(), 1)])
        .unwrap();
    store.dispatch_through(3).unwrap();
    crash(store);

    let store = MessageStore::open(cfg.clone()).unwrap();
    store.dispatch_through(3).unwrap();
    assert_eq!(due(&store), vec![(2_000, 2), (3_000, 0)]);
    // The copy went to the real queue once.
    assert_eq!(
        store.consume_queues().get("Real", 1).unwrap().max_offset(),
        1
    );

    // A follower that installs a snapshot starts an empty log: its timers go.
    store.reset(100, 2).unwrap();
    assert_eq!(due(&store), vec![]);
    store.shutdown().unwrap();
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// A crash may lose what the timer index wrote after the last checkpoint (here
/// its files are put back as the checkpoint left them): dispatching again from
/// the checkpoint ends in the same index.
#[test]
fn the_index_as_of_the_last_checkpoint_catches_up_by_dispatching_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path(), 64 * 1024);
    cfg.flush_interval_ms = 3_600_000;
    let saved = dir.path().join("timers-at-checkpoint");
    let store = MessageStore::open(cfg.clone()).unwrap();
    store
        .append_entry(1, 0, &[timer(3_000, "a"), timer(1_000, "b")])
        .unwrap();
    store.dispatch_through(0).unwrap();
    store.checkpoint().unwrap();
    copy_dir(&cfg.root.join("timerlog"), &saved);
    store.append_entry(1, 1, &[timer(2_000, "c")]).unwrap();
    store.append_entry(1, 2, &[copy(3_000, 0, "a")]).unwrap();
    store.dispatch_through(2).unwrap();
    let expected = vec![(1_000, 1), (2_000, 2)];
    assert_eq!(due(&store), expected);
    crash(store);
    std::fs::remove_dir_all(cfg.root.join("timerlog")).unwrap();
    copy_dir(&saved, &cfg.root.join("timerlog"));

    let store = MessageStore::open(cfg.clone()).unwrap();
    store.dispatch_through(2).unwrap();
    assert_eq!(due(&store), expected);
    store.shutdown().unwrap();
}

/// A store whose timer index is missing (written by an earlier release, which
/// kept none or kept it in sled, or deleted) rebuilds it from the CommitLog when
/// it opens.
#[test]
fn a_missing_index_is_rebuilt_from_the_log() {
    for missing in ["timerlog", "timers"] {
        rebuilt_from_the_log_without(missing);
    }
}

fn rebuilt_from_the_log_without(missing: &str) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path(), 64 * 1024);
    let store = MessageStore::open(cfg.clone()).unwrap();
    store
        .append_entry(1, 0, &[timer(3_000, "a"), timer(1_000, "b")])
        .unwrap();
    store.append_entry(1, 1, &[copy(1_000, 1, "b")]).unwrap();
    store.append_entry(1, 2, &[timer(2_000, "c")]).unwrap();
    store.dispatch_through(2).unwrap();
    let expected = vec![(2_000, 2), (3_000, 0)];
    assert_eq!(due(&store), expected);
    store.shutdown().unwrap();
    drop(store);
    std::fs::remove_dir_all(cfg.root.join(missing)).unwrap();

    let store = MessageStore::open(cfg.clone()).unwrap();
    assert_eq!(due(&store), expected);
    store.shutdown().unwrap();
}
