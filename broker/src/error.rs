//! The broker crate's one error type, and the protocol-neutral kind of each
//! failure ([`ErrorKind`]): what went wrong in the broker's own terms. Each
//! protocol adapter maps a kind to its status code (`grpc::status` for the
//! RocketMQ 5.x protocol); the broker's rules never name a protocol's code.

use ledgermq_raft::RaftNodeError;
use ledgermq_store::StoreError;

/// What kind of failure a [`BrokerError`] is, in the broker's terms. The names
/// follow RocketMQ's (its 5.x `Code` and 4.x `ResponseCode` share them); whether a
/// write may still take effect is a kind of its own ([`ErrorKind::OutcomeUnknown`]
/// against [`ErrorKind::NoLeader`]), so no adapter has to guess it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Malformed or inconsistent input not covered by a narrower kind.
    BadRequest,
    /// A topic name that is not allowed.
    IllegalTopic,
    /// A consumer group name that is not allowed.
    IllegalConsumerGroup,
    /// A tag that is not allowed.
    IllegalMessageTag,
    /// A message key that is not allowed.
    IllegalMessageKey,
    /// A message group that is not allowed.
    IllegalMessageGroup,
    /// A user property name that is not allowed (reserved, or bad characters).
    IllegalMessagePropertyKey,
    /// A message id that is not allowed.
    IllegalMessageId,
    /// An invisible duration out of range.
    IllegalInvisibleTime,
    /// A delay message's delivery time missing or too far ahead.
    IllegalDeliveryTime,
    /// A filter expression that cannot be parsed or is not supported.
    IllegalFilterExpression,
    /// A receipt handle that does not name a delivery in flight.
    InvalidReceiptHandle,
    /// A transaction id that names no transaction this broker can end (never
    /// handed out, of another message, or ended otherwise).
    InvalidTransactionId,
    /// A message body over the maximum size.
    MessageBodyTooLarge,
    /// Too much in one call (e.g. more messages than one send may carry).
    PayloadTooLarge,
    /// A message that does not fit its topic's type (e.g. a message group on a
    /// normal topic).
    MessagePropertyConflictWithType,
    /// The topic does not exist.
    TopicNotFound,
    /// The consumer group does not exist.
    ConsumerGroupNotFound,
    /// No such message (e.g. a physical offset past the log).
    MessageNotFound,
    /// The topic's or group's permission forbids the call.
    Forbidden,
    /// The caller is not authenticated, or its user lacks the permission the
    /// call needs (`crate::auth`).
    Unauthorized,
    /// The call needs the consumer's client id, and it has none.
    ClientIdRequired,
    /// A feature this broker does not offer (yet).
    Unsupported,
    /// The broker is overloaded; try again later.
    TooManyRequests,
    /// Surely not done: no leader could take the call (there is none, this node
    /// does not lead, or the leader could not be reached before anything was sent).
    NoLeader,
    /// The outcome is unknown: the call may still take effect (a timeout, a
    /// forwarded call whose answer was lost, a node stopping).
    OutcomeUnknown,
    /// A failure of this node (storage, transport, configuration).
    Internal,
}

/// Failures of the broker's client service, its admin service and its setup.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// A request the broker refuses or could not finish, with the kind that names
    /// why.
    #[error("{message}")]
    Refused {
        /// Why.
        kind: ErrorKind,
        /// A message for the client.
        message: String,
    },
    /// The Raft layer failed or timed out.
    #[error(transparent)]
    Raft(#[from] RaftNodeError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The name servers could not be asked.
    #[error("name server: {0}")]
    NameServer(String),
    /// Calling the group's leader failed.
    #[error("leader {addr}: {reason}")]
    Leader {
        /// The leader's client address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// Binding or serving failed.
    #[error("transport: {0}")]
    Transport(String),
    /// A configuration value that cannot be used.
    #[error("config key {key}: {reason}")]
    Config {
        /// The key (of `mqbroker`'s TOML file).
        key: &'static str,
        /// Why.
        reason: String,
    },
}

/// Shorthand for a refusal of kind `kind`.
pub fn refuse(kind: ErrorKind, message: impl Into<String>) -> BrokerError {
    BrokerError::Refused {
        kind,
        message: message.into(),
    }
}

impl BrokerError {
    /// The kind of this failure. An unknown outcome (a timeout, a forwarded write
    /// whose answer was lost, a node stopping) is `OutcomeUnknown`: the write may
    /// still commit (at-least-once); a write surely not made for want of a leader
    /// is `NoLeader`; bad input its own kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            BrokerError::Refused { kind, .. } => *kind,
            BrokerError::Raft(e) => match e {
                // The outcome is unknown: the write may still commit (a forwarded
                // write whose answer was lost may have been proposed; an entry
                // proposed before a graceful stop may commit under the next leader,
                // and the raft layer's ShuttingDown does not say whether it was
                // proposed).
                RaftNodeError::Timeout { .. }
                | RaftNodeError::Abandoned { .. }
                | RaftNodeError::Forward { .. }
                | RaftNodeError::Expired
                | RaftNodeError::ShuttingDown => ErrorKind::OutcomeUnknown,
                // Surely not written.
                // StaleTerm: committed in a later term, so not applied (this node
                // lost the leadership the command was decided under).
                // CutOff: refused before anything was proposed or forwarded.
                RaftNodeError::NotLeader { .. }
                | RaftNodeError::NoLeader
                | RaftNodeError::StaleTerm { .. }
                | RaftNodeError::CutOff { .. }
                | RaftNodeError::LeaderUnreachable { .. } => ErrorKind::NoLeader,
                RaftNodeError::InvalidInput(_) => ErrorKind::BadRequest,
                RaftNodeError::Overloaded { .. } => ErrorKind::TooManyRequests,
                // Not written: a member runs a release that cannot read it.
                RaftNodeError::MembersCannotDecode { .. } => ErrorKind::Unsupported,
                RaftNodeError::Store(s) => store_kind(s),
                _ => ErrorKind::Internal,
            },
            BrokerError::Store(s) => store_kind(s),
            BrokerError::Leader { .. } => ErrorKind::NoLeader,
            BrokerError::NameServer(_) | BrokerError::Transport(_) | BrokerError::Config { .. } => {
                ErrorKind::Internal
            }
        }
    }
}

fn store_kind(s: &StoreError) -> ErrorKind {
    match s {
        StoreError::InvalidInput(_) => ErrorKind::BadRequest,
        StoreError::MessageTooLarge { .. } => ErrorKind::MessageBodyTooLarge,
        StoreError::OutOfRange { .. } => ErrorKind::MessageNotFound,
        _ => ErrorKind::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_at_shutdown_does_not_claim_the_write_was_not_made() {
        // openraft's Fatal::Stopped: an entry proposed before a graceful stop may
        // still commit (the raft layer does not tell before from after proposing).
        let e = BrokerError::Raft(RaftNodeError::ShuttingDown);
        assert_eq!(e.kind(), ErrorKind::OutcomeUnknown);
        // Refusals that surely wrote nothing keep saying so.
        for e in [
            RaftNodeError::NoLeader,
            RaftNodeError::NotLeader { leader: None },
        ] {
            assert_eq!(BrokerError::Raft(e).kind(), ErrorKind::NoLeader);
        }
    }
}
