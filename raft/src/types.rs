//! The openraft type configuration and the application data carried by Raft entries.

use std::io::Cursor;

use ledgermq_store::MessageRecord;
use serde::{Deserialize, Serialize};

/// Node id of a group member (RocketMQ's broker id within a broker group).
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// LedgerMQ's Raft types. Built with openraft's `single-term-leader` feature: one
    /// leader per term, so a log id is exactly (term, log index), which is what every
    /// CommitLog record carries.
    pub TypeConfig:
        D = Request,
        R = Response,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A Raft log id: (term, log index).
pub type LogId = openraft::LogId<NodeId>;
/// A Raft entry of this configuration.
pub type Entry = openraft::Entry<TypeConfig>;
/// The openraft handle.
pub type Raft = openraft::Raft<TypeConfig>;
/// Storage error of this configuration.
pub type StorageError = openraft::StorageError<NodeId>;

/// What a client write asks the group to commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Messages, stored one CommitLog record each. The leader sets their store
    /// timestamp and host before proposing, so every replica writes the same bytes.
    Messages(Vec<MessageRecord>),
    /// A change of the group's metadata.
    Command(Command),
}

/// Metadata changes, applied to the state machine (sled) on every replica.
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
    /// [`Response::StaleTerm`] and changes nothing). Each lease replaces the stored
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
    /// at or below `index` ([`crate::boundary`]) once it has applied this, so every
    /// member retains the same messages and a failover loses none the leader still
    /// served. Any member may propose it ([`crate::RaftNode::run_retention_once`]);
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
    /// ([`crate::format::LOG_COMMANDS`]): a leader writes it only when every
    /// member has said it decodes that set ([`Command::fifo_leases`]).
    FifoLeasesTimed {
        /// Term of the leader that made the deliveries.
        term: u64,
        /// The deliveries and their invisible durations.
        leases: Vec<TimedFifoLease>,
    },
}

impl Command {
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
    /// allowance for an entry applied late: `metadata::timed_lease_left_ms`).
    pub invisible_ms: u64,
}

/// A FIFO consumer group's delivery in flight on one queue (one at a time per
/// queue). Replaced by the queue's next lease (never by one with a lower
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

/// Kind of messages a topic accepts (RocketMQ 5's `TopicMessageType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum TopicMessageType {
    /// Normal messages.
    #[default]
    Normal,
    /// FIFO messages (message groups).
    Fifo,
    /// Delay / timer messages.
    Delay,
    /// Transactional messages.
    Transaction,
}

/// A topic's permission: RocketMQ's `PermName` bits (`PERM_WRITE` = 2,
/// `PERM_READ` = 4; 6 both), stored and sent as those bits (serde-transparent, so
/// rows and log entries of earlier releases, which held a bare `u32`, decode
/// unchanged). Other bits (RocketMQ's `PERM_INHERIT` = 1, `PERM_PRIORITY` = 8) are
/// kept as they came and mean nothing here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TopicPerm(u32);

impl TopicPerm {
    /// Sending only.
    pub const WRITE: TopicPerm = TopicPerm(2);
    /// Receiving only.
    pub const READ: TopicPerm = TopicPerm(4);
    /// Both (RocketMQ's default).
    pub const READ_WRITE: TopicPerm = TopicPerm(6);

    /// The permission these bits say (as a name server or an earlier release
    /// stored them).
    pub const fn from_bits(bits: u32) -> TopicPerm {
        TopicPerm(bits)
    }

    /// The permission an operator asked for: 2, 4 or 6; None for anything else.
    pub const fn operator_choice(bits: u32) -> Option<TopicPerm> {
        match bits {
            2 | 4 | 6 => Some(TopicPerm(bits)),
            _ => None,
        }
    }

    /// The bits, as stored and sent.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Clients may receive from the topic.
    pub const fn readable(self) -> bool {
        self.0 & 4 != 0
    }

    /// Clients may send to the topic.
    pub const fn writable(self) -> bool {
        self.0 & 2 != 0
    }
}

impl Default for TopicPerm {
    fn default() -> Self {
        TopicPerm::READ_WRITE
    }
}

/// A topic's configuration (RocketMQ's `TopicConfig`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicConfig {
    /// Topic name.
    pub name: String,
    /// Number of message queues (RocketMQ's read = write queue count here).
    pub queue_count: u32,
    /// Whether clients may send to it, receive from it, or both.
    pub perm: TopicPerm,
    /// Accepted message type.
    pub message_type: TopicMessageType,
}

/// A consumer group's configuration (RocketMQ's `SubscriptionGroupConfig`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupConfig {
    /// Group name.
    pub name: String,
    /// Strict order per message group.
    pub fifo: bool,
    /// Broadcasting (every consumer gets every message) rather than clustering.
    pub broadcast: bool,
    /// Deliveries before a message goes to the dead-letter queue (RocketMQ: 16).
    pub max_delivery_attempts: u32,
}

/// Where one committed message was placed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placed {
    /// Message queue id.
    pub queue_id: i32,
    /// Assigned queue offset.
    pub queue_offset: u64,
    /// CommitLog offset on the node that applied it (the same on every replica that
    /// holds the whole log).
    pub physical_offset: u64,
}

/// What applying an entry returns to the writer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Response {
    /// The entry's messages, in order, with their queue offsets. Empty when the entry
    /// had been dispatched already (a restart replaying the log).
    Messages(Vec<Placed>),
    /// A command or a Raft system entry was applied.
    #[default]
    Applied,
    /// A command bound to the term of the leader that proposed it
    /// ([`Command::FifoLeasesOfTerm`]) reached the log in another term's entry and
    /// was not applied.
    StaleTerm {
        /// The term the command was decided in.
        proposed_term: u64,
        /// The term of the entry that carried it.
        entry_term: u64,
    },
}
