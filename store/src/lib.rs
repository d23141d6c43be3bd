//! LedgerMQ's storage engine for one broker node.
//!
//! - [`commit_log`]: the CommitLog, one append-only record log shared by every topic in
//!   fixed-size mmap'd segments; it is also the Raft log (records carry term and log
//!   index) and owns the Raft log index ([`raft_index`]).
//! - [`consume_queue`]: per (topic, queue id) 20-byte entries, filled by
//!   [`MessageStore::dispatch_through`] once entries are committed.
//! - [`index_file`]: hash index by key and message id.
//! - [`timer_index`]: pending delay messages by delivery time, kept by dispatch,
//!   in [`timer_wheel`]'s files.
//! - [`checkpoint`], [`recovery`]: crash recovery; [`retention`], [`purge`]: deletion.
//! - [`group_commit`]: one fsync for many appends under SYNC_FLUSH.
//! - [`fault_hooks`]: a delay before every fsync, for the jepsen harness's slow disk.
//! - [`canary`]: test-only switches that break a promise (debug builds only).
//! - [`ack_mark`]: how far the CommitLog was acknowledged as durable, so a node
//!   knows when recovery cut entries it had acknowledged; [`ack_bound`]: the
//!   durable bound written ahead of it under ASYNC_FLUSH, for a power loss.
//!
//! Knows nothing of Raft's rules or the network: the `raft` crate decides what is
//! committed and calls `dispatch_through`.
#![deny(missing_docs)]

pub mod ack_bound;
pub mod ack_mark;
pub mod canary;
pub mod checkpoint;
pub mod commit_log;
pub mod config;
pub mod consume_queue;
pub mod error;
pub mod fault_hooks;
pub mod fixed_log;
pub mod group_commit;
pub mod half_index;
pub mod index_file;
pub mod mapped_file;
pub mod purge;
pub mod queries;
pub mod raft_index;
pub mod record;
pub mod recovery;
pub mod reserve;
pub mod retention;
pub mod room;
pub mod set_aside;
pub mod store;
pub mod timer_index;
pub mod timer_wheel;

pub use commit_log::{CommitLog, CommitLogConfig, StoredEntry};
pub use config::{FlushMode, StoreConfig};
pub use error::{Result, StoreError};
pub use queries::StoredMessage;
pub use raft_index::EntryLocation;
pub use record::{MessageRecord, RecordKind, RecordView};
pub use store::{DispatchedMessage, MessageStore, QueuePosition, RecoveryReport};
