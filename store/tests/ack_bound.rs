//! The acknowledged bound under ASYNC_FLUSH (issue 13, item 3): after an unclean
//! stop on a machine that restarted, the node counts everything up to the bound
//! as possibly acknowledged and lost; after a crash of the process only, or a
//! clean stop, it does not; an operator can tell it to forget.

mod common;

use common::{crash, message, small_config};
use ledgermq_store::ack_mark::AckedId;
use ledgermq_store::fault_hooks::BOOT_ID_FILE_ENV;
use ledgermq_store::{FlushMode, MessageStore, StoreConfig};

fn open(cfg: &StoreConfig, boot: &std::path::Path, boot_id: &str) -> std::sync::Arc<MessageStore> {
    std::fs::write(boot, boot_id).unwrap();
    MessageStore::open(cfg.clone()).unwrap()
}

#[test]
fn a_reboot_after_an_unclean_stop_counts_the_bound_as_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let boot = dir.path().join("boot-id");
    // This test binary's own process: no other test reads the variable meanwhile.
    std::env::set_var(BOOT_ID_FILE_ENV, &boot);
    let mut cfg = small_config(&dir.path().join("store"), 64 * 1024);
    cfg.flush_mode = FlushMode::Async;
    cfg.flush_interval_ms = 3_600_000;

    let store = open(&cfg, &boot, "boot-1");
    for i in 0..10u64 {
        store.append_entry(1, i, &[message(i, 100)]).unwrap();
    }
    let last = AckedId { term: 1, index: 9 };
    store.commit_log().acknowledge_written(last).unwrap();
    assert_eq!(store.commit_log().acked_log_id(), Some(last));
    crash(store);

    // The process crashed; same boot: the page cache kept everything.
    let store = open(&cfg, &boot, "boot-1");
    assert_eq!(store.commit_log().acked_log_id(), Some(last));
    assert!(!store.commit_log().lost_acknowledged());
    crash(store);

    // The machine restarted: what was acknowledged may be gone with the page
    // cache, up to the bound written ahead of the mark.
    let store = open(&cfg, &boot, "boot-2");
    let bound = store.commit_log().acked_log_id().unwrap();
    assert!(bound > last, "{bound:?}");
    assert!(store.commit_log().lost_acknowledged());
    crash(store);
    // That stays known across a further crash in the same boot.
    let store = open(&cfg, &boot, "boot-2");
    assert_eq!(store.commit_log().acked_log_id(), Some(bound));
    assert!(store.commit_log().lost_acknowledged());
    crash(store);

    // An operator's decision: forget it.
    let mut forget = cfg.clone();
    forget.forget_lost_acknowledged = true;
    std::fs::write(&boot, "boot-3").unwrap();
    let store = MessageStore::open(forget).unwrap();
    assert_eq!(store.commit_log().acked_log_id(), Some(last));
    assert!(!store.commit_log().lost_acknowledged());
    store.append_entry(1, 10, &[message(10, 100)]).unwrap();
    store
        .commit_log()
        .acknowledge_written(AckedId { term: 1, index: 10 })
        .unwrap();
    store.shutdown().unwrap();
    drop(store);

    // A clean stop made everything durable: a reboot after it loses nothing.
    let store = open(&cfg, &boot, "boot-4");
    assert_eq!(
        store.commit_log().acked_log_id(),
        Some(AckedId { term: 1, index: 10 })
    );
    assert!(!store.commit_log().lost_acknowledged());
}

/// A snapshot installed below entries this node acknowledged (and lost) does not
/// hold them: the reset keeps the mark, so the node still knows; one at or past
/// the mark holds every entry it acknowledged.
#[test]
fn a_reset_for_a_snapshot_keeps_what_was_acknowledged_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(&dir.path().join("store"), 64 * 1024);
    let store = MessageStore::open(cfg).unwrap();
    for i in 0..10u64 {
        store.append_entry(2, i, &[message(i, 100)]).unwrap();
    }
    store.commit_log().flush().unwrap();
    let acked = AckedId { term: 2, index: 9 };
    assert_eq!(store.commit_log().acked_log_id(), Some(acked));
    // A snapshot ending at index 5, term 2: entries 6-9 are not in it.
    store.reset(6, 2).unwrap();
    assert_eq!(store.commit_log().acked_log_id(), Some(acked));
    assert!(store.commit_log().lost_acknowledged());
    store.append_entry(2, 6, &[message(6, 100)]).unwrap();
    assert!(store.commit_log().lost_acknowledged());
    // One ending past the mark holds them.
    store.reset(20, 3).unwrap();
    assert!(!store.commit_log().lost_acknowledged());
}
