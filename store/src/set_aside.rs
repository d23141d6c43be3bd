//! Setting a store's messages aside: what a node does when its metadata can no
//! longer speak for its log (the Raft layer decides, `ledgermq_raft::meta_check`),
//! so that it starts empty and takes everything back from its group.
//!
//! The files are moved, not deleted: a node never loses stored data on its own
//! decision. The caller removes them once the group has given the node back
//! everything it had acknowledged ([`remove_set_aside`]). The acknowledged mark
//! (`ack_mark`, `ack_bound`) and the disk reserve stay where they are: the mark is
//! what keeps the emptied node out of elections until then.

use std::path::{Path, PathBuf};

use crate::error::{IoContext, Result};

/// What a store root holds of messages and their indexes: the CommitLog, the
/// Raft index, the ConsumeQueues, the IndexFiles, the checkpoint and the abort
/// file (names as `MessageStore::open` makes them).
pub const MESSAGE_FILES: [&str; 6] = [
    "commitlog",
    "raftindex",
    crate::consume_queue::CONSUME_QUEUE_DIR,
    "index",
    "checkpoint",
    "abort",
];

/// Moves the [`MESSAGE_FILES`] of the closed store at `root` into `into` (a
/// directory on the same file system, created if missing) and fsyncs both
/// directories. Returns what was moved. Errors: `Io`.
pub fn set_aside_messages(root: &Path, into: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(into).at(into)?;
    let mut moved = Vec::new();
    for name in MESSAGE_FILES {
        let from = root.join(name);
        if from.exists() {
            let to = into.join(name);
            std::fs::rename(&from, &to).at(&from)?;
            moved.push(to);
        }
    }
    crate::mapped_file::fsync_dir(into)?;
    crate::mapped_file::fsync_dir(root)?;
    Ok(moved)
}

/// True if `dir` holds any of the [`MESSAGE_FILES`].
pub fn holds_messages(dir: &Path) -> bool {
    MESSAGE_FILES.iter().any(|n| dir.join(n).exists())
}

/// Removes the [`MESSAGE_FILES`] that [`set_aside_messages`] moved into `into`,
/// leaving anything else there (the caller's own files). Errors: `Io`.
pub fn remove_set_aside(into: &Path) -> Result<()> {
    for name in MESSAGE_FILES {
        let p = into.join(name);
        if p.is_dir() {
            std::fs::remove_dir_all(&p).at(&p)?;
        } else if p.exists() {
            std::fs::remove_file(&p).at(&p)?;
        }
    }
    crate::mapped_file::fsync_dir(into)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MessageRecord, MessageStore, StoreConfig};

    #[test]
    fn a_store_set_aside_reopens_empty_and_keeps_its_acknowledged_mark() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("n0");
        let cfg = StoreConfig::small(root.clone(), 64 * 1024);
        let store = MessageStore::open(cfg.clone()).unwrap();
        let recs: Vec<MessageRecord> = (0..5)
            .map(|i| MessageRecord::message("T", 0, vec![i; 100], 0))
            .collect();
        for (i, r) in recs.into_iter().enumerate() {
            store.append_entry(1, i as u64, &[r]).unwrap();
        }
        store
            .commit_log()
            .acknowledge_written(crate::ack_mark::AckedId { term: 1, index: 4 })
            .unwrap();
        store.shutdown().unwrap();
        drop(store);
        let aside = root.join("aside");
        let moved = set_aside_messages(&root, &aside).unwrap();
        assert!(moved.iter().any(|p| p.ends_with("commitlog")), "{moved:?}");
        assert!(holds_messages(&aside));
        let store = MessageStore::open(cfg.clone()).unwrap();
        assert_eq!(store.commit_log().last_log_id().unwrap(), None);
        assert!(store.commit_log().lost_acknowledged(), "the mark stayed");
        store.shutdown().unwrap();
        remove_set_aside(&aside).unwrap();
        assert!(!aside.join("commitlog").exists() && !holds_messages(&aside));
        assert!(aside.exists());
    }

    #[test]
    fn a_missing_mark_is_raised_to_the_log_before_the_log_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("n0");
        let cfg = StoreConfig::small(root.clone(), 64 * 1024);
        let store = MessageStore::open(cfg.clone()).unwrap();
        for i in 0..3u64 {
            let r = MessageRecord::message("T", 0, vec![1; 10], 0);
            store.append_entry(2, i, &[r]).unwrap();
        }
        assert_eq!(store.commit_log().acked_log_id(), None);
        let raised = store.commit_log().raise_ack_mark_to_last().unwrap();
        let last = crate::ack_mark::AckedId { term: 2, index: 2 };
        assert_eq!(raised, Some(last));
        store.shutdown().unwrap();
        drop(store);
        set_aside_messages(&root, &root.join("aside")).unwrap();
        let store = MessageStore::open(cfg).unwrap();
        assert_eq!(store.commit_log().acked_log_id(), Some(last), "durable");
        assert!(store.commit_log().lost_acknowledged());
    }
}
