//! The half index as dispatch keeps it: a record of the half topic becomes a
//! pending half, first checked its immunity after its store time; the first
//! commit copy or op record that names it ends it, later ones change nothing
//! (a later commit copy reaches no queue: the first end decides delivery too);
//! dispatching again after a crash, or rebuilding a missing index from the log,
//! ends in the same index; a reset for a snapshot empties it.

mod common;

use common::{crash, small_config};
use ledgermq_store::half_index::{
    HalfEnd, HalfState, HALF_TOPIC, OP_HALF_TOPIC, PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_TRANSACTION_END, PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
};
use ledgermq_store::timer_index::{PROPERTY_REAL_QID, PROPERTY_REAL_TOPIC};
use ledgermq_store::{MessageRecord, MessageStore};

fn half(body: &str, stored_ms: i64, immunity_s: u64) -> MessageRecord {
    MessageRecord::message(HALF_TOPIC, 0, body.as_bytes().to_vec(), stored_ms)
        .with_property(PROPERTY_REAL_TOPIC, "Real")
        .with_property(PROPERTY_REAL_QID, "1")
        .with_property(
            PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
            &immunity_s.to_string(),
        )
}

fn commit(half_offset: u64, body: &str) -> MessageRecord {
    MessageRecord::message("Real", 1, body.as_bytes().to_vec(), 1).with_property(
        PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
        &half_offset.to_string(),
    )
}

fn op(half_offset: u64, end: &str) -> MessageRecord {
    MessageRecord::message(OP_HALF_TOPIC, 0, half_offset.to_string().into_bytes(), 1)
        .with_property(
            PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
            &half_offset.to_string(),
        )
        .with_property(PROPERTY_TRANSACTION_END, end)
}

fn states(store: &MessageStore, n: u64) -> Vec<Option<HalfState>> {
    (0..n)
        .map(|q| store.timers().halves().state(q).unwrap())
        .collect()
}

fn ended(e: HalfEnd) -> Option<HalfState> {
    Some(HalfState::Ended(e))
}

#[test]
fn the_first_end_of_a_half_wins_and_dispatch_again_agrees() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path(), 64 * 1024);
    cfg.flush_interval_ms = 3_600_000;
    let store = MessageStore::open(cfg.clone()).unwrap();
    let first = store
        .append_entry(1, 0, &[half("a", 10_000, 6), half("b", 10_000, 60)])
        .unwrap();
    store.append_entry(1, 1, &[half("c", 20_000, 0)]).unwrap();
    store.dispatch_through(1).unwrap();
    let halves = store.timers().halves();
    assert_eq!(halves.pending(), 3);
    // First checks: store time plus immunity.
    let due: Vec<(u64, i64)> = halves
        .due(i64::MAX, 10)
        .unwrap()
        .iter()
        .map(|h| (h.half_queue_offset, h.first_check_ms))
        .collect();
    assert_eq!(due, vec![(0, 16_000), (1, 70_000), (2, 20_000)]);
    assert_eq!(halves.due(19_999, 10).unwrap().len(), 1);
    assert_eq!(
        halves.oldest_physical_offset(0).unwrap(),
        Some(first.physical_offset)
    );
    let h = halves.due(16_000, 1).unwrap()[0];
    assert_eq!(store.read_half(&h).unwrap().body, b"a");
    store.checkpoint().unwrap();

    // a commits, b rolls back, then a rollback of a and a commit of b come
    // too late; c is discarded; a normal message touches nothing.
    store.append_entry(1, 2, &[commit(0, "a")]).unwrap();
    store
        .append_entry(1, 3, &[op(1, "ROLLBACK"), op(0, "ROLLBACK")])
        .unwrap();
    let late_commit = store.append_entry(1, 4, &[commit(1, "b")]).unwrap();
    store
        .append_entry(
            1,
            5,
            &[
                op(2, "DISCARD"),
                MessageRecord::message("Real", 0, b"n".to_vec(), 1),
            ],
        )
        .unwrap();
    store.dispatch_through(5).unwrap();
    let expected = vec![
        ended(HalfEnd::Committed),
        ended(HalfEnd::RolledBack),
        ended(HalfEnd::Discarded),
    ];
    assert_eq!(states(&store, 3), expected);
    assert_eq!(store.timers().halves().pending(), 0);
    // Only a's commit reached the real queue: b's came after its rollback.
    let real = |s: &MessageStore| s.consume_queues().get("Real", 1).unwrap().max_offset();
    assert_eq!(real(&store), 1);
    assert_eq!(
        store
            .timers()
            .halves()
            .end_of(1)
            .unwrap()
            .map(|(_, by)| by != late_commit.physical_offset),
        Some(true)
    );
    crash(store);

    let store = MessageStore::open(cfg.clone()).unwrap();
    store.dispatch_through(5).unwrap();
    assert_eq!(states(&store, 3), expected);
    assert_eq!(store.timers().halves().pending(), 0);
    assert_eq!(real(&store), 1);
    // Cut the queue back and dispatch again from a's commit: the same one entry.
    store.rebuild_consume_queues_from(2).unwrap();
    store.dispatch_through(5).unwrap();
    assert_eq!(real(&store), 1);

    // A follower that installs a snapshot starts an empty log: its halves go.
    store.reset(100, 2).unwrap();
    assert_eq!(states(&store, 3), vec![None, None, None]);
    store.shutdown().unwrap();
}

/// A store whose index is missing rebuilds its halves from the CommitLog too.
#[test]
fn a_missing_index_rebuilds_the_halves_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path(), 64 * 1024);
    let store = MessageStore::open(cfg.clone()).unwrap();
    store
        .append_entry(1, 0, &[half("a", 1_000, 6), half("b", 1_000, 6)])
        .unwrap();
    store.append_entry(1, 1, &[commit(1, "b")]).unwrap();
    store.append_entry(1, 2, &[half("c", 2_000, 6)]).unwrap();
    store.dispatch_through(2).unwrap();
    let pending = |s: &MessageStore| {
        let h = s.timers().halves();
        (0..3)
            .map(|q| matches!(h.state(q).unwrap(), Some(HalfState::Pending(_))))
            .collect::<Vec<_>>()
    };
    assert_eq!(pending(&store), vec![true, false, true]);
    store.shutdown().unwrap();
    drop(store);
    std::fs::remove_dir_all(cfg.root.join("timers")).unwrap();

    let store = MessageStore::open(cfg.clone()).unwrap();
    assert_eq!(pending(&store), vec![true, false, true]);
    assert_eq!(
        store.timers().halves().state(1).unwrap(),
        ended(HalfEnd::Committed)
    );
    store.shutdown().unwrap();
}
