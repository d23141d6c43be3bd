//! The store's one error type.

use std::path::PathBuf;

/// Every failure the store reports. Variants that concern stored bytes name the file
/// and the byte offset, so an operator can find the damage.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An operating-system I/O call failed on `path`.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory the call was made on.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A stored record or index entry failed its checks (bad size, magic, CRC, or a
    /// log index / offset that does not match its position). Nothing is returned from it.
    #[error("corrupted data in {path} at file offset {file_offset}: {reason}")]
    Corrupted {
        /// The segment file holding the damaged bytes.
        path: PathBuf,
        /// Byte offset inside that file.
        file_offset: u64,
        /// What check failed.
        reason: String,
    },

    /// A message whose encoded record would exceed `max_message_size_bytes`.
    #[error("message of {size_bytes} bytes exceeds the maximum of {max_bytes} bytes")]
    MessageTooLarge {
        /// Encoded size of the offending message.
        size_bytes: usize,
        /// The configured limit.
        max_bytes: usize,
    },

    /// A Raft entry whose records do not fit in one CommitLog segment.
    #[error("raft entry of {size_bytes} bytes does not fit a CommitLog segment of {segment_bytes} bytes")]
    EntryTooLarge {
        /// Encoded size of all records of the entry.
        size_bytes: u64,
        /// The configured segment size.
        segment_bytes: u64,
    },

    /// A field the record layout cannot carry (topic longer than 127 bytes, properties
    /// longer than 32767 bytes, an empty batch, ...).
    #[error("invalid input: {0}")]
    InvalidInput(String),

    /// A read asked for a position that holds no data: before the oldest retained
    /// byte or entry, or at or past the written end.
    #[error("{what} {requested} is out of range [{min}, {max})")]
    OutOfRange {
        /// What was asked for ("physical offset", "log index", "queue offset").
        what: &'static str,
        /// The position asked for.
        requested: u64,
        /// The first position that can be read.
        min: u64,
        /// One past the last position that can be read.
        max: u64,
    },

    /// An append whose log index does not directly follow the last stored one, or a
    /// term that goes backwards: the caller broke the Raft log's shape.
    #[error("log index {got} does not follow the last stored entry (expected {expected}) or its term {term} is below {last_term}")]
    NonContiguousLog {
        /// The log index the next append must carry.
        expected: u64,
        /// The log index given.
        got: u64,
        /// The term given.
        term: u64,
        /// The term of the last stored entry.
        last_term: u64,
    },

    /// The configuration is unusable (for example a segment size too small for one record).
    #[error("invalid configuration: {0}")]
    Config(String),

    /// The disk holding the store is fuller than the configured limit
    /// (`disk_space_warning_ratio`): new messages are refused; reads go on.
    #[error("the disk is full: {used_percent}% used, new messages are refused above {limit_percent}%; not written")]
    DiskFull {
        /// Used share of the disk, percent.
        used_percent: u32,
        /// The limit, percent.
        limit_percent: u32,
    },

    /// An entry was to be written back from a peer's copy of `(given_term,
    /// log_index)`, but this log holds another term at that index now (it was
    /// truncated and written again meanwhile): nothing was written.
    #[error("entry {log_index} is of term {held_term} here, not {given_term}; not written back")]
    EntryReplaced {
        /// The log index.
        log_index: u64,
        /// The term this log holds there.
        held_term: u64,
        /// The term of the copy given.
        given_term: u64,
    },

    /// The store was closed or a background flush failed earlier; it accepts no more writes.
    #[error("store is not writable: {0}")]
    NotWritable(String),
}

impl StoreError {
    /// True if this is the operating system's "no space left on device" (ENOSPC):
    /// the write may succeed once space is freed.
    pub fn is_no_space(&self) -> bool {
        // std reports ENOSPC as `StorageFull`.
        matches!(self, StoreError::Io { source, .. }
            if source.kind() == std::io::ErrorKind::StorageFull)
    }
}

/// Result alias of the store crate.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Attaches a path to an `std::io::Error`.
pub trait IoContext<T> {
    /// Tags an I/O error with the path it was about, as `StoreError::Io`.
    fn at(self, path: &std::path::Path) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, path: &std::path::Path) -> Result<T> {
        self.map_err(|source| StoreError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}
