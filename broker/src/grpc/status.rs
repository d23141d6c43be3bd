//! The RocketMQ 5.x status of a broker failure: each [`ErrorKind`] is one
//! `apache.rocketmq.v2.Code`, chosen as the reference proxy answers (its
//! `ProxyException` and `StatusCode` mapping), and only codes the official Rust
//! client 5.0.0 knows.

use crate::error::{BrokerError, ErrorKind};
use crate::pb::{self, Code};

/// The 5.x status code of a failure kind.
pub fn code_of(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::BadRequest => Code::BadRequest,
        ErrorKind::IllegalTopic => Code::IllegalTopic,
        ErrorKind::IllegalConsumerGroup => Code::IllegalConsumerGroup,
        ErrorKind::IllegalMessageTag => Code::IllegalMessageTag,
        ErrorKind::IllegalMessageKey => Code::IllegalMessageKey,
        ErrorKind::IllegalMessageGroup => Code::IllegalMessageGroup,
        ErrorKind::IllegalMessagePropertyKey => Code::IllegalMessagePropertyKey,
        ErrorKind::IllegalMessageId => Code::IllegalMessageId,
        ErrorKind::IllegalInvisibleTime => Code::IllegalInvisibleTime,
        ErrorKind::IllegalDeliveryTime => Code::IllegalDeliveryTime,
        ErrorKind::IllegalFilterExpression => Code::IllegalFilterExpression,
        ErrorKind::InvalidReceiptHandle => Code::InvalidReceiptHandle,
        ErrorKind::InvalidTransactionId => Code::InvalidTransactionId,
        ErrorKind::MessageBodyTooLarge => Code::MessageBodyTooLarge,
        ErrorKind::PayloadTooLarge => Code::PayloadTooLarge,
        ErrorKind::MessagePropertyConflictWithType => Code::MessagePropertyConflictWithType,
        ErrorKind::TopicNotFound => Code::TopicNotFound,
        ErrorKind::ConsumerGroupNotFound => Code::ConsumerGroupNotFound,
        ErrorKind::MessageNotFound => Code::MessageNotFound,
        ErrorKind::Forbidden => Code::Forbidden,
        ErrorKind::Unauthorized => Code::Unauthorized,
        ErrorKind::ClientIdRequired => Code::ClientIdRequired,
        ErrorKind::Unsupported => Code::Unsupported,
        ErrorKind::TooManyRequests => Code::TooManyRequests,
        // Surely not done: the client may send again at once (to another node).
        ErrorKind::NoLeader => Code::HaNotAvailable,
        // May still take effect: the client retries knowing it may duplicate.
        ErrorKind::OutcomeUnknown => Code::ProxyTimeout,
        ErrorKind::Internal => Code::InternalServerError,
    }
}

/// A failure as the 5.x protocol says it.
pub trait ToStatus {
    /// The status code a client gets.
    fn code(&self) -> Code;
    /// The status (code and message) a client gets.
    fn to_status(&self) -> pb::Status;
}

impl ToStatus for BrokerError {
    fn code(&self) -> Code {
        code_of(self.kind())
    }

    fn to_status(&self) -> pb::Status {
        pb::Status {
            code: self.code() as i32,
            message: self.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ledgermq_raft::RaftNodeError;

    #[test]
    fn an_unknown_outcome_and_a_sure_refusal_keep_their_codes() {
        let e = BrokerError::Raft(RaftNodeError::ShuttingDown);
        assert_eq!(e.code(), Code::ProxyTimeout);
        assert_eq!(
            BrokerError::Raft(RaftNodeError::NoLeader).code(),
            Code::HaNotAvailable
        );
        let r = crate::error::refuse(ErrorKind::IllegalTopic, "bad name");
        assert_eq!(r.to_status().code, Code::IllegalTopic as i32);
        assert_eq!(r.to_status().message, "bad name");
    }
}
