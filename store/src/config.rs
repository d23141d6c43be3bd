//! Store settings.

use std::path::PathBuf;

use crate::commit_log::CommitLogConfig;
use crate::retention::RetentionConfig;

/// When an append counts as persisted (RocketMQ's `flushDiskType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlushMode {
    /// `SYNC_FLUSH`: an append is reported durable only after an fsync covered it
    /// (group commit: one fsync serves every append written before it).
    #[default]
    Sync,
    /// `ASYNC_FLUSH`: appends are flushed every `flush_interval_ms`; a power loss can
    /// lose what was written since the last flush (a process crash loses nothing, the
    /// page cache survives it).
    Async,
}

impl std::str::FromStr for FlushMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "sync" | "sync_flush" => Ok(Self::Sync),
            "async" | "async_flush" => Ok(Self::Async),
            other => Err(format!(
                "unknown flush mode {other:?} (expected sync or async)"
            )),
        }
    }
}

/// Everything [`crate::MessageStore::open`] needs.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Store root directory (`commitlog/`, `raftindex/`, `consumequeue/`, `index/`,
    /// `checkpoint`, `abort`).
    pub root: PathBuf,
    /// CommitLog settings.
    pub commit_log: CommitLogConfig,
    /// Entries per ConsumeQueue file (RocketMQ: 300,000).
    pub consume_queue_entries_per_file: u64,
    /// IndexFile hash slots per file (RocketMQ: 5,000,000).
    pub index_hash_slot_num: u32,
    /// IndexFile entries per file (RocketMQ: 20,000,000).
    pub index_num: u32,
    /// SYNC_FLUSH or ASYNC_FLUSH.
    pub flush_mode: FlushMode,
    /// Background flush and checkpoint period in ms (RocketMQ `flushIntervalCommitLog`: 500).
    pub flush_interval_ms: u64,
    /// Retention settings.
    pub retention: RetentionConfig,
    /// Start accepting that acknowledged entries may be lost: the acknowledged
    /// mark and the bound are set to the recovered log's end
    /// ([`crate::ack_mark`], [`crate::ack_bound`]), so the node takes part in
    /// elections at once. Only for a group a majority of which lost power under
    /// ASYNC_FLUSH, which otherwise waits without a leader (`mqbroker
    /// --forget-lost-acknowledged`). Off by default.
    pub forget_lost_acknowledged: bool,
}

impl StoreConfig {
    /// RocketMQ's defaults under `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            commit_log: CommitLogConfig::default(),
            consume_queue_entries_per_file: crate::consume_queue::DEFAULT_ENTRIES_PER_FILE,
            index_hash_slot_num: crate::index_file::DEFAULT_HASH_SLOT_NUM,
            index_num: crate::index_file::DEFAULT_INDEX_NUM,
            flush_mode: FlushMode::Sync,
            flush_interval_ms: 500,
            retention: RetentionConfig::default(),
            forget_lost_acknowledged: false,
        }
    }

    /// Small files for tests and demos: `segment_bytes` CommitLog segments and small
    /// ConsumeQueue, index and IndexFile files, so rollover happens early.
    pub fn small(root: impl Into<PathBuf>, segment_bytes: u64) -> Self {
        let mut c = Self::new(root);
        c.commit_log.segment_bytes = segment_bytes;
        c.commit_log.max_message_size_bytes = (segment_bytes / 4) as usize;
        c.commit_log.raft_index_entries_per_file = 1024;
        c.consume_queue_entries_per_file = 1024;
        c.index_hash_slot_num = 1024;
        c.index_num = 4096;
        c.retention.disk_reserve_bytes = 256 << 10;
        // Tests share the host's disk: refuse writes only when it is all but full
        // (the disk-full tests set their own ratio on a filesystem of their own).
        c.retention.disk_space_warning_ratio = 0.99;
        c
    }
}
