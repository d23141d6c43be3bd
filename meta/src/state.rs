//! The group's metadata in memory: what every replica holds after applying the
//! same committed commands, and what a snapshot carries.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::acl::AclUser;
use crate::command::{FifoBatchLease, FifoLease};
use crate::config::{GroupConfig, TopicConfig};
use crate::retry::RetryPolicy;

/// (consumer group or offset key, topic, message queue id).
pub type QueueKey = (String, String, i32);

/// The group's metadata as the state machine holds it (a read-only copy is shared
/// with the broker through the Raft layer's `SharedMeta`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupMeta {
    /// (group, topic, queue id) → next queue offset to consume.
    pub offsets: BTreeMap<(String, String, i32), u64>,
    /// Topic configs by name.
    pub topics: BTreeMap<String, TopicConfig>,
    /// Consumer group configs by name.
    pub groups: BTreeMap<String, GroupConfig>,
    /// (group, topic, queue id) → the FIFO delivery in flight, for queues whose
    /// last lease was a single one (`fifo_batches` otherwise).
    pub fifo_leases: BTreeMap<(String, String, i32), FifoLease>,
    /// (group, topic, queue id) → when the stored lease's message becomes visible
    /// again on this node's monotonic clock, for leases this process applied
    /// from a [`crate::Command::FifoLeasesTimed`] (their invisible time
    /// counted from the apply). Not stored and not part of a snapshot: a lease
    /// restored at a restart or from a snapshot has none, and is judged by its
    /// wall-clock `visible_at_ms`. Node-local: left out of `Debug` output.
    #[serde(skip)]
    pub lease_deadlines: LeaseDeadlines,
    /// Log index of the last entry applied to this copy (None before the first), set
    /// under the same lock as the maps, so a reader holding the lock sees the maps as
    /// of exactly this index (replica audits). Not part of a snapshot.
    #[serde(skip)]
    pub applied_index: Option<u64>,
    /// The group's retention point ([`crate::Command::PurgeThrough`]): every member purges
    /// its log through the highest segment boundary at or below it. Kept in the
    /// `sm` tree under `purge_point`, not in a snapshot (whose encoding it would
    /// change): a member that installs one starts its log there anyway.
    #[serde(skip)]
    pub purge_point: Option<u64>,
    /// Consumer group name → its retry policy, for groups given one
    /// ([`crate::Command::UpdateGroupWithRetryPolicy`]). Kept in its own sled
    /// tree and carried by a snapshot of format 2 after the version-1 layout
    /// (the Raft layer's `state_machine` snapshot encoding), so skipped here:
    /// a snapshot without policies keeps the bytes earlier releases read.
    #[serde(skip)]
    pub retry_policies: BTreeMap<String, RetryPolicy>,
    /// (group, topic, queue id) → queue offset → the highest delivery attempt
    /// recorded for that message ([`crate::Command::DeliveryAttempts`]), for
    /// messages at or above the group's committed offset. Kept in its own sled
    /// tree and carried by a snapshot of format 2 (as `retry_policies`).
    #[serde(skip)]
    pub delivery_attempts: BTreeMap<QueueKey, BTreeMap<u64, u32>>,
    /// (group, topic, queue id) → every FIFO delivery in flight on the queue,
    /// for queues whose last lease was a batch ([`crate::Command::FifoBatchLeases`];
    /// a queue has a batch or a `fifo_leases` entry, never both). Kept in its
    /// own sled tree and carried by a snapshot of format 3 (as
    /// `retry_policies`).
    #[serde(skip)]
    pub fifo_batches: BTreeMap<QueueKey, FifoBatchLease>,
    /// Username → the user and its permissions ([`crate::Command::PutAclUser`]
    /// and the other ACL commands). Kept in its own sled tree and carried by a
    /// snapshot of format 4 (as `retry_policies`).
    #[serde(skip)]
    pub acl_users: BTreeMap<String, AclUser>,
    /// This member's own deadlines of the batches in `fifo_batches` it applied,
    /// one per delivery in the same order. Node-local as `lease_deadlines`.
    #[serde(skip)]
    pub batch_deadlines: BatchDeadlines,
}

/// This member's monotonic deadlines of the FIFO batch leases it applied, by
/// (group, topic, queue id): one instant per delivery of the stored batch, in
/// its order. `Debug` prints `BatchDeadlines(node-local)` (as
/// [`LeaseDeadlines`]).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct BatchDeadlines(pub BTreeMap<(String, String, i32), Vec<std::time::Instant>>);

impl std::fmt::Debug for BatchDeadlines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BatchDeadlines(node-local)")
    }
}

/// This member's own deadlines of the FIFO leases it applied with their time
/// left, by (group, topic, queue id). Instants of this process, which replicas
/// holding the same replicated metadata do not share: `Debug` prints
/// `LeaseDeadlines(node-local)`, so [`GroupMeta`]'s `Debug` output, which tests
/// compare across replicas, shows replicated state alone.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct LeaseDeadlines(pub BTreeMap<(String, String, i32), LeaseDeadline>);

impl std::fmt::Debug for LeaseDeadlines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseDeadlines(node-local)")
    }
}

/// The monotonic deadline of a FIFO lease this node applied with its time left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseDeadline {
    /// The lease's delivery id (the deadline is that delivery's).
    pub delivery_id: u64,
    /// When the message becomes visible again: the apply's instant plus the
    /// invisible duration the deciding leader gave.
    pub visible_at: std::time::Instant,
}
