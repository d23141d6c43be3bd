//! Topic and consumer group configurations as the group replicates them
//! (RocketMQ's `TopicConfig` and `SubscriptionGroupConfig`), stored as postcard
//! in sled rows and snapshots, and inside the `UpdateTopic`, `EnsureTopic`,
//! `UpdateGroup` and `EnsureGroup` commands of the log: fields are never removed
//! or reordered. A new field needs a new format version of the row and new
//! `Command` variants in a new log command set (old entries keep their layout).

use serde::{Deserialize, Serialize};

/// Kind of messages a topic accepts (RocketMQ 5's `TopicMessageType`, the topic
/// attribute `message.type`); also the kind of one message, which is never
/// `Mixed`. Stored as postcard's variant index: variants are only appended.
/// `Mixed` (index 4) is read by no release before log command set 3, so a topic
/// of that type is written only once every member decodes that set
/// ([`crate::Command::log_command_set`]).
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
    /// Every kind of message (RocketMQ 5's MIXED).
    Mixed,
}

impl TopicMessageType {
    /// Every type, in stored order.
    pub const ALL: [TopicMessageType; 5] = [
        TopicMessageType::Normal,
        TopicMessageType::Fifo,
        TopicMessageType::Delay,
        TopicMessageType::Transaction,
        TopicMessageType::Mixed,
    ];

    /// The attribute value RocketMQ writes: `NORMAL`, `FIFO`, `DELAY`,
    /// `TRANSACTION` or `MIXED` (`TopicMessageType.getValue()`).
    pub const fn attribute_value(self) -> &'static str {
        match self {
            TopicMessageType::Normal => "NORMAL",
            TopicMessageType::Fifo => "FIFO",
            TopicMessageType::Delay => "DELAY",
            TopicMessageType::Transaction => "TRANSACTION",
            TopicMessageType::Mixed => "MIXED",
        }
    }

    /// The type an attribute value names, ASCII case ignored; None for any other
    /// value (RocketMQ's `UNSPECIFIED` included: a topic always has a type).
    pub fn from_attribute_value(value: &str) -> Option<TopicMessageType> {
        Self::ALL
            .into_iter()
            .find(|t| t.attribute_value().eq_ignore_ascii_case(value))
    }

    /// True if a topic of this type takes a message of type `message`: the same
    /// type, or any type on a `Mixed` topic.
    pub fn accepts(self, message: TopicMessageType) -> bool {
        self == message || self == TopicMessageType::Mixed
    }

    /// The message types a topic of this type takes, in stored order (what
    /// routes report per queue).
    pub fn accepted(self) -> Vec<TopicMessageType> {
        match self {
            TopicMessageType::Mixed => Self::ALL[..4].to_vec(),
            t => vec![t],
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_types_read_rocketmq_attribute_values() {
        for t in TopicMessageType::ALL {
            assert_eq!(
                TopicMessageType::from_attribute_value(t.attribute_value()),
                Some(t)
            );
        }
        assert_eq!(
            TopicMessageType::from_attribute_value("delay"),
            Some(TopicMessageType::Delay)
        );
        assert_eq!(TopicMessageType::from_attribute_value("UNSPECIFIED"), None);
        assert_eq!(TopicMessageType::from_attribute_value(""), None);
    }

    #[test]
    fn a_mixed_topic_takes_every_message_type_and_others_only_their_own() {
        use TopicMessageType::*;
        for m in [Normal, Fifo, Delay, Transaction] {
            assert!(Mixed.accepts(m));
            assert!(m.accepts(m));
            for t in [Normal, Fifo, Delay, Transaction] {
                assert_eq!(t.accepts(m), t == m, "{t:?} takes {m:?}");
            }
        }
        assert_eq!(Mixed.accepted(), vec![Normal, Fifo, Delay, Transaction]);
        assert_eq!(Delay.accepted(), vec![Delay]);
    }

    #[test]
    fn message_types_keep_their_stored_variant_index() {
        for (i, t) in TopicMessageType::ALL.into_iter().enumerate() {
            assert_eq!(postcard::to_allocvec(&t).unwrap(), vec![i as u8]);
        }
    }
}
