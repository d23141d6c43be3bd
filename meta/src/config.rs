//! Topic and consumer group configurations as the group replicates them
//! (RocketMQ's `TopicConfig` and `SubscriptionGroupConfig`), stored as postcard
//! in sled rows and snapshots, and inside the `UpdateTopic`, `EnsureTopic`,
//! `UpdateGroup` and `EnsureGroup` commands of the log: fields are never removed
//! or reordered. A new field needs a new format version of the row and new
//! `Command` variants in a new log command set (old entries keep their layout).

use serde::{Deserialize, Serialize};

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
