//! Helpers shared by the store's integration tests.
#![allow(dead_code)]

use ledgermq_store::record::{PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY};
use ledgermq_store::{MessageRecord, StoreConfig};

/// A small-file config under `dir`.
pub fn small_config(dir: &std::path::Path, segment_bytes: u64) -> StoreConfig {
    let mut c = StoreConfig::small(dir, segment_bytes);
    c.flush_interval_ms = 50;
    c
}

/// Message `n` of a deterministic sequence: topic T{n%2}, queue n%3, tag, key and id.
pub fn message(n: u64, body_bytes: usize) -> MessageRecord {
    let mut body = format!("message-{n}-").into_bytes();
    body.resize(body_bytes.max(body.len()), b'a' + (n % 26) as u8);
    MessageRecord::message(
        &format!("T{}", n % 2),
        (n % 3) as i32,
        body,
        1_700_000_000_000 + n as i64,
    )
    .with_property(PROPERTY_TAGS, if n % 2 == 0 { "even" } else { "odd" })
    .with_property(PROPERTY_KEYS, &format!("key-{n} all"))
    .with_property(PROPERTY_UNIQ_KEY, &format!("ID{n:08}"))
}

/// "Crashes" `store`: drops it without shutdown and waits until the drop has run
/// (a background thread may hold the last reference for a moment and would
/// otherwise finish its work after the test has reopened the store).
pub fn crash(store: std::sync::Arc<ledgermq_store::MessageStore>) {
    let weak = std::sync::Arc::downgrade(&store);
    drop(store);
    while weak.strong_count() > 0 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Writes `bytes` over the file at `path` from byte `at`, and fsyncs it: damage
/// done to a stopped store.
pub fn overwrite_file(path: &std::path::Path, at: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, at).unwrap();
    f.sync_all().unwrap();
}

/// Writes `bytes` over the CommitLog of the stopped store `cfg` from physical
/// offset `offset` (within one segment).
pub fn damage_commit_log(cfg: &StoreConfig, offset: u64, bytes: &[u8]) {
    let seg = cfg.commit_log.segment_bytes;
    let start = offset - offset % seg;
    let path = cfg.root.join("commitlog").join(format!("{start:020}"));
    overwrite_file(&path, offset - start, bytes);
}
