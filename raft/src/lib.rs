//! LedgerMQ's Raft layer: a broker group is a Raft group (openraft 0.9) whose log is
//! the store's CommitLog (DLedger-style: no second copy of message bytes).
//!
//! - `log_store`: `RaftLogStorage` over the CommitLog; the append callback runs after
//!   the group-commit fsync under SYNC_FLUSH.
//! - [`state_machine`]: apply = dispatch into ConsumeQueues and IndexFile, plus the
//!   group's metadata (consumer offsets, topic and group configs) in sled; snapshots
//!   hold the metadata and every queue's next offset.
//! - `boundary`: snapshots at CommitLog segment boundaries; retention purges only
//!   through one, and that is the snapshot a lagging follower gets.
//! - [`purge_point`]: the group's retention point (what a member proposes; every
//!   member purges through the committed one).
//! - [`network`], `server`: tonic peer transport with deadlines and lazy channels;
//!   [`framed`]: AppendEntries as length-prefixed frames on plain TCP, same port.
//! - `contact`: whether a majority of the group was heard from lately (a cut-off
//!   node refuses writes at once).
//! - `elections`: holds on openraft's election timer, and retries of a campaign
//!   that ended without a leader on a fresh random delay.
//! - `peer_formats`: which log command set each peer decodes (learned from
//!   its AppendEntries answers), so a leader writes a new command only when
//!   every member reads it.
//! - `writer`: leader-side batching of client writes into entries (group commit).
//! - [`node`]: one running member; forwarding from followers; leadership transfer.
//! - [`repair`]: a damaged log entry fetched again from a peer and written back (on
//!   read, and by a scrub of the whole log after each start).
//! - [`canary`]: test-only switches that break a promise (debug builds only;
//!   re-exported from the store crate, which needs them too).
#![deny(missing_docs)]
// openraft's `StorageError` is large and its traits return it; helpers do too.
#![allow(clippy::result_large_err)]

mod boundary;
pub use ledgermq_store::canary;
pub mod codec;
mod contact;
mod elections;
pub mod error;
pub mod format;
pub mod framed;
mod log_store;
pub mod meta;
pub mod meta_check;
pub mod network;
pub mod node;
mod peer_formats;
pub mod purge_point;
pub mod repair;
mod server;
pub mod state_machine;
pub mod types;
pub mod vote_file;
mod writer;

pub use error::{ForwardRefusal, RaftNodeError};
pub use network::{LinkShape, NetworkFilter};
pub use node::{NodeRole, NodeStatus, RaftNode, RaftNodeConfig, RaftTiming, ReplicaView};
pub use types::{
    Command, FifoBatchLease, FifoDelivery, FifoLease, GroupConfig, NodeId, OffsetCommit, Placed,
    Request, Response, TimedFifoLease, TopicConfig, TopicMessageType, TopicPerm,
};
pub use writer::BatchConfig;
