//! The storage faults against a real store: after a simulated power loss, recovery
//! keeps exactly the entries that were fsynced; after a damaged tail, it keeps the
//! intact prefix and drops the rest, and the log takes appends again.

use ledgermq_jepsen::disk::{damage_tail, power_loss};
use ledgermq_store::{MessageRecord, MessageStore, StoreConfig};
use rand::SeedableRng;

fn config(root: &std::path::Path, mark: &std::path::Path) -> StoreConfig {
    let mut c = StoreConfig::small(root, 1 << 16);
    c.flush_interval_ms = 3_600_000;
    c.commit_log.durable_mark_file = Some(mark.to_path_buf());
    c
}

fn msg(i: u64) -> MessageRecord {
    MessageRecord::message("T", 0, format!("m{i}").repeat(50).into_bytes(), 1)
}

/// Drops the store without a clean shutdown and waits for its threads to let go.
fn crash(store: std::sync::Arc<MessageStore>) {
    let weak = std::sync::Arc::downgrade(&store);
    drop(store);
    while weak.strong_count() > 0 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn a_power_loss_keeps_exactly_what_was_fsynced() {
    let dir = tempfile::tempdir().unwrap();
    let (root, mark) = (dir.path().join("n0"), dir.path().join("n0.durable-mark"));
    let store = MessageStore::open(config(&root, &mark)).unwrap();
    let mut last = 0;
    for i in 0..200u64 {
        last = store.append_entry(1, i, &[msg(i)]).unwrap().end_offset();
        if i == 119 {
            store.wait_durable(last).unwrap();
        }
    }
    assert!(last > 0);
    crash(store);
    let f = power_loss(&root, &mark).unwrap();
    assert!(f.bytes > 0, "{f:?}");
    let store = MessageStore::open(config(&root, &mark)).unwrap();
    assert_eq!(store.commit_log().next_log_index(), 120);
    for i in 0..120 {
        store.read_entry(i).unwrap();
    }
    assert!(store.read_entry(120).is_err());
    store.append_entry(2, 120, &[msg(120)]).unwrap();
    store.shutdown().unwrap();
}

#[test]
fn a_damaged_tail_is_cut_at_the_first_bad_record() {
    for seed in 0..8 {
        let dir = tempfile::tempdir().unwrap();
        let (root, mark) = (dir.path().join("n0"), dir.path().join("n0.mark"));
        let store = MessageStore::open(config(&root, &mark)).unwrap();
        for i in 0..100u64 {
            store.append_entry(1, i, &[msg(i)]).unwrap();
            if i == 49 {
                store.dispatch_through(i).unwrap();
                store.checkpoint().unwrap();
            }
        }
        crash(store);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let f = damage_tail(&root, &mut rng)
            .unwrap()
            .expect("a tail after the checkpoint");
        let store = MessageStore::open(config(&root, &mark)).unwrap();
        let next = store.commit_log().next_log_index();
        assert!((50..100).contains(&next), "seed {seed}: {f:?} kept {next}");
        for i in 0..next {
            store.read_entry(i).unwrap();
        }
        store.append_entry(2, next, &[msg(next)]).unwrap();
        store.shutdown().unwrap();
    }
}
