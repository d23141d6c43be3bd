//! The commands that change the replicated metadata, and the values they carry.

use serde::{Deserialize, Serialize};

use crate::acl::{AclResource, AclUser, Perm, SecretKey};
use crate::config::{GroupConfig, TopicConfig, TopicMessageType};
use crate::retry::RetryPolicy;

/// Metadata changes: committed through Raft and applied by [`crate::apply::apply`]
/// on every replica. Stored in the CommitLog as postcard (a `SystemPayload` of the
/// Raft layer): variants are append-only and their fields never change, so logs
/// written by earlier releases still decode (golden-byte tests in the Raft layer's
/// `format` tests pin every variant).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Consumer offsets committed by consumers; an offset never moves backwards
    /// (the higher of the stored and the committed one is kept).
    CommitOffsets(Vec<OffsetCommit>),
    /// Create or replace a topic's configuration.
    UpdateTopic(TopicConfig),
    /// Delete a topic's configuration (its stored messages age out by retention).
    DeleteTopic(String),
    /// Create or replace a consumer group's configuration.
    UpdateGroup(GroupConfig),
    /// Delete a consumer group and its offsets (its broadcasting consumers' offsets,
    /// kept as `group@client-id`, included).
    DeleteGroup(String),
    /// Create a topic unless it exists (auto-creation: never overrides an admin's
    /// config committed just before).
    EnsureTopic(TopicConfig),
    /// Create a consumer group unless it exists.
    EnsureGroup(GroupConfig),
    /// FIFO deliveries in flight: a new leader keeps each queue's message invisible
    /// until the lease ends, so the next message is not delivered before it.
    FifoLeases(Vec<FifoLease>),
    /// FIFO deliveries in flight, decided by the leader of `term`. Applied only from
    /// an entry of that same term: a lease decided by a leader that has since been
    /// deposed never commits in a later term (the state machine answers
    /// [`crate::Outcome::StaleTerm`] and changes nothing). Each lease replaces the stored
    /// one of its queue only if its delivery id is not lower (delivery ids grow
    /// with the term), so an older lease never replaces a newer one. Appended after
    /// the older variants, so logs written by earlier releases still decode.
    FifoLeasesOfTerm {
        /// Term of the leader that made the deliveries.
        term: u64,
        /// The deliveries.
        leases: Vec<FifoLease>,
    },
    /// The group's retention point: every member purges its Raft log, and with it
    /// the CommitLog segments that log holds, through the highest segment boundary
    /// at or below `index` (the Raft layer's `boundary` module) once it has applied this, so every
    /// member retains the same messages and a failover loses none the leader still
    /// served. Any member may propose it (the Raft layer's `RaftNode::run_retention_once`);
    /// the point only moves forward. Appended after the older variants, so logs
    /// written by earlier releases still decode.
    PurgeThrough {
        /// Raft log index to purge through.
        index: u64,
    },
    /// FIFO deliveries in flight, decided by the leader of `term`, each with how
    /// long its message stays invisible: every member counts that time from when
    /// it applies the entry, on its own monotonic clock, so a new leader holds an
    /// adopted delivery at least as long as the deciding leader promised,
    /// whatever the two wall clocks say. Term-checked and applied as
    /// [`Command::FifoLeasesOfTerm`]. Log command set 2
    /// (the Raft layer's `format::LOG_COMMANDS`): a leader writes it only when every
    /// member has said it decodes that set ([`Command::fifo_leases`]).
    FifoLeasesTimed {
        /// Term of the leader that made the deliveries.
        term: u64,
        /// The deliveries and their invisible durations.
        leases: Vec<TimedFifoLease>,
    },
    /// Rewinds (or moves forward) a consumer group's offsets on a topic's queues
    /// to exactly the given ones (`mqadmin resetOffsetByTime`), unlike
    /// [`Command::CommitOffsets`], which never moves an offset back. A queue's
    /// FIFO lease goes with it (its delivery is void). Proposed only by the
    /// leader, under its consumption state's gate, so no offset commit or lease
    /// it decided before the reset lands after it. Log command set 4: a leader
    /// writes it only when every member decodes that set.
    ResetOffsets(Vec<OffsetCommit>),
    /// Create or replace a consumer group's configuration together with its
    /// retry policy (`mqadmin updateSubGroup -p`); [`Command::UpdateGroup`]
    /// replaces a group's config and drops its policy, as RocketMQ's
    /// updateSubGroup replaces the whole `SubscriptionGroupConfig`. Log command
    /// set 6: a leader writes it only when every member decodes that set.
    UpdateGroupWithRetryPolicy {
        /// The group's configuration.
        group: GroupConfig,
        /// Its retry policy.
        retry_policy: RetryPolicy,
    },
    /// Deliveries of a clustering or broadcasting (not FIFO) group's messages,
    /// recorded by the leader before it answers the receive that made them, so
    /// a later leader counts a message's next delivery from the attempts made
    /// (exact across failover; FIFO groups' attempts travel in their leases).
    /// Each attempt is kept as the highest recorded for its message until the
    /// group's committed offset passes it. Log command set 7, written by the
    /// weaker rule ([`Command::written_past_silent_members`]).
    DeliveryAttempts(Vec<DeliveryAttempts>),
    /// Every FIFO delivery in flight on some queues, and each queue's lowest
    /// unacked offset, decided by the leader of `term` (a receive that handed
    /// a consumer a batch of a queue's messages, an ack call, a change of one's
    /// invisible time): a new leader keeps each delivery invisible for its time
    /// left, counted from its own apply, so no later message of the queue is
    /// delivered before them, and continues after the acked ones. A queue's
    /// batch replaces its stored lease, batch or single, unless that one is
    /// newer ([`FifoBatchLease::lease_id`]). Term-checked as
    /// [`Command::FifoLeasesTimed`]. Log command set 8, written by the weaker
    /// rule ([`Command::written_past_silent_members`]); while a member says it
    /// decodes less, a leader records single leases and hands out one message
    /// per queue and receive.
    FifoBatchLeases {
        /// Term of the leader that made the deliveries.
        term: u64,
        /// One batch per queue.
        batches: Vec<FifoBatchLease>,
    },
    /// Create a user ([`crate::AclUser`]), or change an existing one's secret
    /// key and admin flag, keeping its permissions. Log command set 9.
    PutAclUser {
        /// The access key.
        username: String,
        /// The secret key (`Debug` shows `<redacted>`).
        secret_key: SecretKey,
        /// Whether the user may do anything, admin calls included.
        admin: bool,
    },
    /// Set (`Some`) or remove (`None`) a user's permission on a topic, a
    /// consumer group, or the default of either ([`crate::AclUser::set_perm`]).
    /// A user that does not exist (deleted meanwhile) is left absent. Log
    /// command set 9.
    SetAclPerm {
        /// The access key.
        username: String,
        /// What the permission is about.
        resource: AclResource,
        /// The permission, or none to remove it.
        perm: Option<Perm>,
    },
    /// Delete a user and its permissions. Log command set 9.
    DeleteAclUser(String),
    /// Create a user with its permissions in one step, unless a user of that
    /// name exists (then nothing changes): the configuration's bootstrap
    /// users. Log command set 9 (the user's layout is frozen with it).
    CreateAclUser(AclUser),
}

/// Every FIFO delivery in flight on one queue of one consumer group, as the
/// leader tracked them when it made this lease ([`Command::FifoBatchLeases`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FifoBatchLease {
    /// Offset key of the consumer (the group).
    pub group: String,
    /// Topic.
    pub topic: String,
    /// Message queue id.
    pub queue_id: i32,
    /// Orders the queue's leases: taken from the deciding leader's delivery id
    /// sequence (term in the top bits, [`FifoLease::DELIVERY_TERM_SHIFT`]) when
    /// the lease was made, under the queue's lock, so a lease made later has a
    /// higher id than every lease and delivery before it.
    pub lease_id: u64,
    /// The queue's lowest unacked offset: everything below it is acked or
    /// filtered out, and the group's offset is raised to it.
    pub next_offset: u64,
    /// The first offset the leader had not delivered yet: every offset in
    /// `[next_offset, end_offset)` not in `deliveries` is acked (out of order)
    /// or filtered out.
    pub end_offset: u64,
    /// The deliveries in flight, in queue offset order, each in
    /// `[next_offset, end_offset)`; none when everything delivered is acked.
    pub deliveries: Vec<FifoDelivery>,
}

/// One FIFO delivery of a [`FifoBatchLease`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FifoDelivery {
    /// The delivered message's queue offset.
    pub queue_offset: u64,
    /// The delivery id in its receipt handle ([`FifoLease::delivery_id`]).
    pub delivery_id: u64,
    /// Delivery attempt, from 1.
    pub attempt: u32,
    /// Wall-clock ms (the deciding leader's clock) when the message becomes
    /// visible again, kept for members that restart before it.
    pub visible_at_ms: i64,
    /// How long the message stays invisible, ms, counted by each member from
    /// its apply (bounded as [`TimedFifoLease::invisible_ms`]).
    pub invisible_ms: u64,
}

/// Deliveries of messages of one queue to one consumer
/// ([`Command::DeliveryAttempts`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryAttempts {
    /// Offset key of the consumer (the group, or `group@client-id` for a
    /// broadcasting consumer).
    pub group: String,
    /// Topic.
    pub topic: String,
    /// Message queue id.
    pub queue_id: i32,
    /// (queue offset, the delivery's attempt number from 1) per message
    /// delivered.
    pub attempts: Vec<(u64, u32)>,
}

impl Command {
    /// The log command set that brings this command's encoding (the Raft layer's
    /// `format::LOG_COMMANDS`): 2 for [`Command::FifoLeasesTimed`], 3 for a topic
    /// config of type [`TopicMessageType::Mixed`] (`UpdateTopic`, `EnsureTopic`),
    /// 4 for [`Command::ResetOffsets`], 6 for
    /// [`Command::UpdateGroupWithRetryPolicy`], 7 for
    /// [`Command::DeliveryAttempts`], 8 for [`Command::FifoBatchLeases`], 9 for
    /// the users and permissions ([`Command::PutAclUser`],
    /// [`Command::SetAclPerm`], [`Command::DeleteAclUser`],
    /// [`Command::CreateAclUser`]), 1 for everything
    /// else. A leader writes it
    /// only once every member decodes that set (for [`Command::DeliveryAttempts`]
    /// and [`Command::FifoBatchLeases`]: once no member says it does not,
    /// [`Command::written_past_silent_members`]).
    /// No I/O.
    pub fn log_command_set(&self) -> u8 {
        match self {
            Command::FifoLeasesTimed { .. } => 2,
            Command::ResetOffsets(_) => 4,
            Command::UpdateGroupWithRetryPolicy { .. } => 6,
            Command::DeliveryAttempts(_) => 7,
            Command::FifoBatchLeases { .. } => 8,
            Command::PutAclUser { .. }
            | Command::SetAclPerm { .. }
            | Command::DeleteAclUser(_)
            | Command::CreateAclUser(_) => 9,
            Command::UpdateTopic(t) | Command::EnsureTopic(t)
                if t.message_type == TopicMessageType::Mixed =>
            {
                3
            }
            _ => 1,
        }
    }

    /// True for a command a leader writes once no member has said it decodes
    /// only an earlier log command set, without waiting to hear every member
    /// in its term (the Raft layer's weaker rule, as for transactional
    /// messages): [`Command::DeliveryAttempts`] and
    /// [`Command::FifoBatchLeases`], which must be recorded while a member is
    /// down, the very time a failover may follow. A member still on an earlier
    /// release that was down all along would stop at such an entry when it
    /// comes back (upgrade a member before it returns). No I/O.
    pub fn written_past_silent_members(&self) -> bool {
        matches!(
            self,
            Command::DeliveryAttempts(_) | Command::FifoBatchLeases { .. }
        )
    }

    /// The command that records FIFO deliveries decided by the leader of `term`:
    /// [`Command::FifoLeasesTimed`] when `members_decode_timed` (every member of
    /// the group decodes log command set 2), else [`Command::FifoLeasesOfTerm`],
    /// whose deadlines are the deciding leader's wall clock (what a member of an
    /// earlier release decodes). No I/O.
    pub fn fifo_leases(term: u64, leases: Vec<TimedFifoLease>, members_decode_timed: bool) -> Self {
        if members_decode_timed {
            Command::FifoLeasesTimed { term, leases }
        } else {
            Command::FifoLeasesOfTerm {
                term,
                leases: leases.into_iter().map(|t| t.lease).collect(),
            }
        }
    }
}

/// A FIFO delivery in flight and how long its message stays invisible, counted
/// by each member from when it applies the entry ([`Command::FifoLeasesTimed`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimedFifoLease {
    /// The delivery (its `visible_at_ms` is the deciding leader's wall-clock
    /// deadline, kept for members that restart before it ends).
    pub lease: FifoLease,
    /// How long the deciding leader keeps the message invisible, ms; each member
    /// counts it from its own apply (bounded by the wall-clock deadline plus an
    /// allowance for an entry applied late: [`crate::apply::timed_lease_left_ms`]).
    pub invisible_ms: u64,
}

/// A FIFO consumer group's delivery in flight on one queue, as a leader
/// records it while a member decodes no batch leases (one message in flight
/// per queue then; [`FifoBatchLease`] otherwise). Replaced by the queue's next lease (never by one with a lower
/// `delivery_id`); void once the group's offset passes `queue_offset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FifoLease {
    /// Offset key of the consumer (the group).
    pub group: String,
    /// Topic.
    pub topic: String,
    /// Message queue id.
    pub queue_id: i32,
    /// The delivered message's queue offset.
    pub queue_offset: u64,
    /// The delivery id in its receipt handle: the deciding leader's term in the top
    /// 24 bits ([`FifoLease::DELIVERY_TERM_SHIFT`]), a per-term sequence below, so
    /// ids grow with the term and are unique across terms.
    pub delivery_id: u64,
    /// Delivery attempt, from 1.
    pub attempt: u32,
    /// Wall-clock ms (leader's clock) when the message becomes visible again.
    pub visible_at_ms: i64,
}

impl FifoLease {
    /// Bits of a delivery id below its term.
    pub const DELIVERY_TERM_SHIFT: u32 = 40;

    /// The term of the leader that made this delivery (from its delivery id).
    pub fn delivery_term(&self) -> u64 {
        self.delivery_id >> Self::DELIVERY_TERM_SHIFT
    }
}

/// One consumer offset: the next queue offset `group` will consume from a queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetCommit {
    /// Consumer group.
    pub group: String,
    /// Topic.
    pub topic: String,
    /// Message queue id.
    pub queue_id: i32,
    /// Next queue offset to consume.
    pub offset: u64,
}
