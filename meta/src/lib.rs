//! LedgerMQ's replicated metadata, in the broker's own terms: consumer offsets,
//! FIFO delivery leases, topic and consumer group configs, and the group's
//! retention point.
//!
//! - [`command`]: what a leader commits through Raft to change the metadata.
//! - [`config`]: topic and consumer group configurations.
//! - [`state`]: [`GroupMeta`], the metadata every replica holds in memory.
//! - [`acl`]: users and their permissions, and the decision whether a user may
//!   do an action on a topic or consumer group.
//! - [`retry`]: a consumer group's retry policy (RocketMQ 5's `GroupRetryPolicy`).
//! - [`apply`]: the state machine's rules, `apply(state, command)` with no I/O;
//!   it lists the rows a command changed, which the Raft layer stores.
//! - [`error`]: [`MetaError`], what reading operator input can refuse.
//!
//! Formats (the Raft layer's `format` module, whose golden-byte tests pin them):
//! a [`Command`] is stored in a CommitLog entry as plain postcard, versioned by
//! variant (variants are append-only, a variant's fields never change, and a new
//! variant belongs to a new log command set); configs, leases, consumer offsets
//! and [`GroupMeta`]'s replicated maps are stored in sled rows and snapshots
//! inside versioned envelopes; `GroupMeta`'s retry policies and delivery
//! attempts (`#[serde(skip)]`, so snapshots of groups without them keep their
//! earlier bytes) in their own rows and in a snapshot's format-2 tail, and its
//! FIFO batch leases in their own rows and a snapshot's format-3 tail, its
//! users and permissions ([`acl`]) in their own rows and a snapshot's
//! format-4 tail. The rest
//! ([`Outcome`], [`RowChange`], the lease deadlines, the applied index and the
//! retention point, kept elsewhere) is never stored with them.
#![deny(missing_docs)]

pub mod acl;
pub mod apply;
pub mod command;
pub mod config;
pub mod error;
pub mod retry;
pub mod state;

pub use acl::{AclResource, AclUser, Action, Perm, SecretKey};
pub use apply::{Applied, AppliedAt, Canaries, Outcome, RowChange};
pub use command::{
    Command, DeliveryAttempts, FifoBatchLease, FifoDelivery, FifoLease, OffsetCommit,
    TimedFifoLease,
};
pub use config::{GroupConfig, TopicConfig, TopicMessageType, TopicPerm};
pub use error::MetaError;
pub use retry::RetryPolicy;
pub use state::{BatchDeadlines, GroupMeta, LeaseDeadline, LeaseDeadlines, QueueKey};
