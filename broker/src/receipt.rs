//! Receipt handles: the string a consumer acks a delivery with. It names the queue,
//! the queue offset and the delivery (the leader's term and a per-term delivery id),
//! so any node can route an ack and the leader can tell a current delivery from a
//! stale one. Format: `v1:{term}:{delivery_id}:{queue_id}:{queue_offset}:{topic}`
//! (topic names cannot hold `:`). No I/O.

use crate::error::ErrorKind;
use crate::error::{refuse, BrokerError};

/// One delivery of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptHandle {
    /// Term of the leader that delivered it.
    pub term: u64,
    /// Delivery id, unique within the term.
    pub delivery_id: u64,
    /// Topic.
    pub topic: String,
    /// Message queue id.
    pub queue_id: i32,
    /// Queue offset of the message.
    pub queue_offset: u64,
}

impl ReceiptHandle {
    /// The handle as sent to clients.
    pub fn encode(&self) -> String {
        format!(
            "v1:{}:{}:{}:{}:{}",
            self.term, self.delivery_id, self.queue_id, self.queue_offset, self.topic
        )
    }

    /// Parses a handle. Error: `INVALID_RECEIPT_HANDLE`.
    pub fn decode(s: &str) -> Result<Self, BrokerError> {
        let bad = || {
            refuse(
                ErrorKind::InvalidReceiptHandle,
                format!("receipt handle {s:?} is invalid"),
            )
        };
        let mut it = s.splitn(6, ':');
        if it.next() != Some("v1") {
            return Err(bad());
        }
        let mut num = || {
            it.next()
                .and_then(|p| p.parse::<u64>().ok())
                .ok_or_else(bad)
        };
        let term = num()?;
        let delivery_id = num()?;
        let queue_id = i32::try_from(num()?).map_err(|_| bad())?;
        let queue_offset = num()?;
        let topic = it
            .next()
            .filter(|t| !t.is_empty())
            .ok_or_else(bad)?
            .to_owned();
        Ok(Self {
            term,
            delivery_id,
            topic,
            queue_id,
            queue_offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_garbage_is_refused() {
        let h = ReceiptHandle {
            term: 7,
            delivery_id: 42,
            topic: "%RETRY%g|x".into(),
            queue_id: 3,
            queue_offset: 1 << 40,
        };
        assert_eq!(ReceiptHandle::decode(&h.encode()).unwrap(), h);
        for bad in [
            "",
            "v1",
            "v2:1:2:3:4:t",
            "v1:x:2:3:4:t",
            "v1:1:2:-3:4:t",
            "v1:1:2:3:4:",
            "v1:1:2:99999999999:4:t",
        ] {
            assert_eq!(
                ReceiptHandle::decode(bad).unwrap_err().kind(),
                ErrorKind::InvalidReceiptHandle,
                "{bad}"
            );
        }
    }
}
