//! The broker crate's one error type, and how each failure maps to a status code of
//! the RocketMQ 5 protocol (`apache.rocketmq.v2.Code`).

use ledgermq_raft::RaftNodeError;
use ledgermq_store::StoreError;

use crate::pb::Code;

/// Failures of the broker's client service, its admin service and its setup.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// A request the protocol refuses, with the status code that names why.
    #[error("{message}")]
    Refused {
        /// The protocol status code (only codes the official Rust client 5.0.0 knows).
        code: Code,
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

/// Shorthand for a refusal.
pub fn refuse(code: Code, message: impl Into<String>) -> BrokerError {
    BrokerError::Refused {
        code,
        message: message.into(),
    }
}

impl BrokerError {
    /// The protocol status code a client gets for this failure. An unknown outcome
    /// (a timeout, a forwarded write whose answer was lost, a node stopping) says
    /// `PROXY_TIMEOUT`: the write may still commit (at-least-once); a write surely
    /// not made for want of a leader says `HA_NOT_AVAILABLE`; bad input its own
    /// 4xxxx code.
    pub fn code(&self) -> Code {
        match self {
            BrokerError::Refused { code, .. } => *code,
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
                | RaftNodeError::ShuttingDown => Code::ProxyTimeout,
                // Surely not written.
                // StaleTerm: committed in a later term, so not applied (this node
                // lost the leadership the command was decided under).
                // CutOff: refused before anything was proposed or forwarded.
                RaftNodeError::NotLeader { .. }
                | RaftNodeError::NoLeader
                | RaftNodeError::StaleTerm { .. }
                | RaftNodeError::CutOff { .. }
                | RaftNodeError::LeaderUnreachable { .. } => Code::HaNotAvailable,
                RaftNodeError::InvalidInput(_) => Code::BadRequest,
                RaftNodeError::Overloaded { .. } => Code::TooManyRequests,
                RaftNodeError::Store(s) => store_code(s),
                _ => Code::InternalServerError,
            },
            BrokerError::Store(s) => store_code(s),
            BrokerError::Leader { .. } => Code::HaNotAvailable,
            BrokerError::NameServer(_) | BrokerError::Transport(_) | BrokerError::Config { .. } => {
                Code::InternalServerError
            }
        }
    }

    /// The status message sent with this failure.
    pub fn to_status(&self) -> crate::pb::Status {
        crate::pb::Status {
            code: self.code() as i32,
            message: self.to_string(),
        }
    }
}

fn store_code(s: &StoreError) -> Code {
    match s {
        StoreError::InvalidInput(_) => Code::BadRequest,
        StoreError::MessageTooLarge { .. } => Code::MessageBodyTooLarge,
        StoreError::OutOfRange { .. } => Code::MessageNotFound,
        _ => Code::InternalServerError,
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
        assert_eq!(e.code(), Code::ProxyTimeout);
        // Refusals that surely wrote nothing keep saying so.
        for e in [
            RaftNodeError::NoLeader,
            RaftNodeError::NotLeader { leader: None },
        ] {
            assert_eq!(BrokerError::Raft(e).code(), Code::HaNotAvailable);
        }
    }
}
