//! A clustering or broadcasting group's delivery attempts, recorded through
//! Raft before a receive is answered (`Command::DeliveryAttempts`), so a later
//! leader counts each message's next delivery on from the attempts made; and
//! what a receive whose record failed gives back.

use std::time::Instant;

use ledgermq_meta::{Command, DeliveryAttempts};

use super::leases::lease;
use super::{Consumers, PopRequest, PopResult, QueueKey, Record};
use crate::error::BrokerError;
use crate::receipt::ReceiptHandle;

impl Consumers {
    /// Records deliveries of a group that is not FIFO, proposed only by this node
    /// while it leads (a record that reaches the log late, in a later term, only
    /// keeps an attempt as made: the answer was not sent). Errors: the Raft
    /// write's; the caller then answers none of them.
    pub(super) async fn commit_attempts(
        &self,
        attempts: Vec<DeliveryAttempts>,
    ) -> Result<(), BrokerError> {
        self.node
            .write_command_as_leader(Command::DeliveryAttempts(attempts))
            .await?;
        Ok(())
    }

    /// Makes what `out` took for `req`, the receive whose record failed,
    /// deliverable again at once: its deliveries (their attempt stays counted:
    /// the record may still have committed) and its dead letters.
    pub(super) async fn release(&self, req: &PopRequest, term: u64, out: &PopResult) {
        let dead = out.dead.iter().map(|d| {
            (
                d.handle.queue_id,
                d.handle.queue_offset,
                d.handle.delivery_id,
            )
        });
        for (queue_id, offset, delivery_id) in out.recorded.iter().copied().chain(dead) {
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

/// Notes a delivery for recording through Raft before the answer: a FIFO
/// group's as its lease (or in its queue's batch lease, which the caller
/// makes once the queue is done, with `record.fifo_batches`), another group's
/// as its attempt with `record.attempts`.
pub(super) fn record(
    req: &PopRequest,
    record: Record,
    handle: &ReceiptHandle,
    attempt: u32,
    lease_at_ms: i64,
    out: &mut PopResult,
) {
    if req.fifo {
        if !record.fifo_batches {
            out.leases.push(lease(req, handle, attempt, lease_at_ms));
        }
    } else if record.attempts {
        // One record per queue: pop_queue takes a queue's messages together.
        let offset_attempt = (handle.queue_offset, attempt);
        match out.attempts.last_mut() {
            Some(q) if q.queue_id == handle.queue_id => q.attempts.push(offset_attempt),
            _ => out.attempts.push(DeliveryAttempts {
                group: req.consumer.clone(),
                topic: handle.topic.clone(),
                queue_id: handle.queue_id,
                attempts: vec![offset_attempt],
            }),
        }
    } else {
        return;
    }
    out.recorded
        .push((handle.queue_id, handle.queue_offset, handle.delivery_id));
}
