//! The openraft type configuration and the application data carried by Raft entries.

use std::io::Cursor;

use ledgermq_store::MessageRecord;
use serde::{Deserialize, Serialize};

/// The metadata's commands and configs (the `ledgermq-meta` crate), re-exported
/// where the Raft layer's entries carry them.
pub use ledgermq_meta::{
    Command, FifoBatchLease, FifoDelivery, FifoLease, GroupConfig, OffsetCommit, TimedFifoLease,
    TopicConfig, TopicMessageType, TopicPerm,
};

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

impl From<ledgermq_meta::Outcome> for Response {
    fn from(o: ledgermq_meta::Outcome) -> Self {
        match o {
            ledgermq_meta::Outcome::Applied => Response::Applied,
            ledgermq_meta::Outcome::StaleTerm {
                proposed_term,
                entry_term,
            } => Response::StaleTerm {
                proposed_term,
                entry_term,
            },
        }
    }
}
