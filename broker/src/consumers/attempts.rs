//! A clustering or broadcasting group's delivery attempts, recorded through
//! Raft before a receive is answered (`Command::DeliveryAttempts`), so a later
//! leader counts each message's next delivery on from the attempts made; and
//! what a receive whose record failed gives back.

use std::time::Instant;

use ledgermq_meta::{Command, DeliveryAttempt};

use super::leases::lease;
use super::{Consumers, PopRequest, PopResult, QueueKey};
use crate::error::BrokerError;
use crate::receipt::ReceiptHandle;

impl Consumers {
    /// Records deliveries of a group that is not FIFO, proposed only by this node
    /// while it leads (a record that reaches the log late, in a later term, only
    /// keeps an attempt as made: the answer was not sent). Errors: the Raft
    /// write's; the caller then answers none of them.
    pub(super) async fn commit_attempts(
        &self,
        attempts: Vec<DeliveryAttempt>,
    ) -> Result<(), BrokerError> {
        self.node
            .write_command_as_leader(Command::DeliveryAttempts(attempts))
            .await?;
        Ok(())
    }

    /// Makes the deliveries of `req` listed in `recorded` ((queue id, queue
    /// offset, delivery id)), whose record failed, deliverable again at once.
    /// Their attempt stays counted: the record may still have committed.
    pub(super) async fn release(&self, req: &PopRequest, term: u64, recorded: &[(i32, u64, u64)]) {
        for &(queue_id, offset, delivery_id) in recorded {
            let key = QueueKey {
                consumer: req.consumer.clone(),
                topic: req.topic.clone(),
                queue_id,
            };
            if let Ok(q) = self.queue(&key, term, req.fifo) {
                q.lock()
                    .await
                    .change_invisible(offset, delivery_id, Instant::now());
            }
        }
    }
}

/// The record of a delivery of `req` under `h` with `attempt`.
fn attempt_record(req: &PopRequest, h: &ReceiptHandle, attempt: u32) -> DeliveryAttempt {
    DeliveryAttempt {
        group: req.consumer.clone(),
        topic: h.topic.clone(),
        queue_id: h.queue_id,
        queue_offset: h.queue_offset,
        attempt,
    }
}

/// Notes a delivery for recording through Raft before the answer: a FIFO
/// group's as its lease, another group's as its attempt when `record_attempts`.
pub(super) fn record(
    req: &PopRequest,
    record_attempts: bool,
    handle: &ReceiptHandle,
    attempt: u32,
    lease_at_ms: i64,
    out: &mut PopResult,
) {
    if req.fifo {
        out.leases.push(lease(req, handle, attempt, lease_at_ms));
    } else if record_attempts {
        out.attempts.push(attempt_record(req, handle, attempt));
    } else {
        return;
    }
    out.recorded
        .push((handle.queue_id, handle.queue_offset, handle.delivery_id));
}
