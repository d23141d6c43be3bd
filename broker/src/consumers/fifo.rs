//! FIFO batches: the batch lease that records every delivery in flight on a
//! queue through Raft (log command set 8), and acks of many deliveries at once,
//! whose offset commits go through Raft in one write before they are answered.

use std::collections::BTreeMap;
use std::time::Instant;

use ledgermq_meta::{Command, FifoBatchLease, FifoDelivery, OffsetCommit};
use ledgermq_store::store::now_ms;

use super::{Consumers, QueueKey};
use crate::error::{refuse, BrokerError, ErrorKind};
use crate::pop::{AckOutcome, QueueState};
use crate::receipt::ReceiptHandle;

/// The batch lease `lease_id` of `key`'s queue in state `st`: its lowest
/// unacked offset, the first offset not delivered yet, and every delivery in
/// flight, each with its time left
/// counted from `now` (monotonic) and its wall-clock deadline from
/// `now_wall_ms` (ms since the Unix epoch).
pub(super) fn batch_lease(
    key: &QueueKey,
    st: &QueueState,
    lease_id: u64,
    now: Instant,
    now_wall_ms: i64,
) -> FifoBatchLease {
    let deliveries = st
        .in_flight_entries()
        .map(|(queue_offset, i)| {
            let left_ms = i.visible_at.saturating_duration_since(now).as_millis() as u64;
            FifoDelivery {
                queue_offset,
                delivery_id: i.delivery_id,
                attempt: i.attempt,
                visible_at_ms: now_wall_ms.saturating_add(left_ms as i64),
                invisible_ms: left_ms,
            }
        })
        .collect();
    FifoBatchLease {
        group: key.consumer.clone(),
        topic: key.topic.clone(),
        queue_id: key.queue_id,
        lease_id,
        next_offset: st.base(),
        end_offset: st.next(),
        deliveries,
    }
}

impl Consumers {
    /// True if the stored lease of `handle`'s queue is a batch lease made
    /// after its delivery: a single lease of that delivery would not replace
    /// it (`meta::apply`'s rule: the higher id wins).
    pub(super) fn batch_leased(&self, consumer: &str, handle: &ReceiptHandle) -> bool {
        let key = (consumer.to_owned(), handle.topic.clone(), handle.queue_id);
        let meta = self.node.shared_meta().read().unwrap();
        meta.fifo_batches
            .get(&key)
            .is_some_and(|b| b.lease_id > handle.delivery_id)
    }

    /// Records FIFO batch leases decided in `term` through Raft, proposed only
    /// by this node while it leads (never forwarded, except by the test-only
    /// `forward-fifo-leases` canary: the state machine refuses them if they
    /// reach the log in a later term). Errors: the Raft write's.
    pub(super) async fn commit_batches(
        &self,
        term: u64,
        batches: Vec<FifoBatchLease>,
    ) -> Result<(), BrokerError> {
        let command = Command::FifoBatchLeases { term, batches };
        if ledgermq_raft::canary::enabled(ledgermq_raft::canary::Canary::ForwardFifoLeases) {
            return self.forward_leases_canary(command).await;
        }
        self.node.write_command_as_leader(command).await?;
        Ok(())
    }

    /// Acks deliveries of `consumer`'s queues, one result per handle in order
    /// (as [`Consumers::ack`] gives for each). For a FIFO group the acks are
    /// recorded through Raft in one write before any is answered: each queue's
    /// batch lease as it is after them (its lowest unacked offset, the first
    /// not delivered, and the deliveries still in flight), or, while a member
    /// says it decodes no batch leases, the offsets they move (an ack above a
    /// message still unacked is then refused, `Unsupported`: no offset commit
    /// records it). If that write fails, no ack it carried is taken (each gets
    /// the write's error; handles acked by earlier calls answer OK). Errors per
    /// handle: as [`Consumers::ack`].
    pub async fn ack_many(
        &self,
        consumer: &str,
        handles: &[ReceiptHandle],
        fifo: bool,
    ) -> Vec<Result<(), BrokerError>> {
        if !fifo {
            let mut out = Vec::with_capacity(handles.len());
            for h in handles {
                out.push(self.ack_unordered(consumer, h).await);
            }
            return out;
        }
        let _gate = self.gate.read().await;
        let Some(term) = self.ready_term() else {
            return handles.iter().map(|_| Err(Self::not_ready())).collect();
        };
        let batches = self.fifo_batches();
        let mut results: Vec<Option<Result<(), BrokerError>>> =
            handles.iter().map(|_| None).collect();
        // Handles by queue, locked in queue id order (a pop or another ack
        // holds one queue at a time).
        let mut by_queue: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
        for (i, h) in handles.iter().enumerate() {
            match self.check_held(h) {
                Ok(()) => by_queue.entry(h.queue_id).or_default().push(i),
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        let mut locked = Vec::new();
        let mut leases = Vec::new();
        let mut commits = Vec::new();
        for (queue_id, all) in by_queue {
            // Each handle passes the reset check on its own delivery id.
            let mut queue = None;
            let mut idx = Vec::with_capacity(all.len());
            for i in all {
                match self.handle_queue(consumer, &handles[i], term, true) {
                    Ok(q) => {
                        queue.get_or_insert(q);
                        idx.push(i);
                    }
                    Err(e) => results[i] = Some(Err(e)),
                }
            }
            let Some(q) = queue else { continue };
            let st = q.lock_owned().await;
            let mut next = st.clone();
            // Acked by this call (recorded by its write, a repeated handle
            // too), in queue order.
            let mut taken = Vec::new();
            idx.sort_by_key(|&i| handles[i].queue_offset);
            for &i in &idx {
                let h = &handles[i];
                let delivery = Some(h.delivery_id);
                if st.peek_ack(h.queue_offset, delivery) == AckOutcome::AlreadyAcked {
                    results[i] = Some(Ok(()));
                    continue;
                }
                if h.queue_offset >= next.next() {
                    // Neither delivered by this leader nor adopted from a lease:
                    // acking it would skip a message no consumer got.
                    results[i] = Some(Err(refuse(
                        ErrorKind::InvalidReceiptHandle,
                        "the receipt handle names a message of a FIFO queue that is not \
                         in flight",
                    )));
                    continue;
                }
                match next.peek_ack(h.queue_offset, delivery) {
                    AckOutcome::Stale => results[i] = Some(Err(stale())),
                    AckOutcome::AlreadyAcked => taken.push(i),
                    AckOutcome::Acked if !batches && h.queue_offset != next.base() => {
                        // An offset commit cannot record it.
                        results[i] = Some(Err(refuse(
                            ErrorKind::Unsupported,
                            "while a member of an earlier release answers, a FIFO \
                             queue's messages are acked in queue order: ack the \
                             earlier ones first",
                        )));
                    }
                    AckOutcome::Acked => {
                        next.ack(h.queue_offset, delivery);
                        taken.push(i);
                    }
                }
            }
            let topic = &handles[idx[0]].topic;
            let recorded = if taken.is_empty() {
                false
            } else if batches {
                // Made under the queue's lock: a later lease of it has a higher id.
                let key = QueueKey {
                    consumer: consumer.to_owned(),
                    topic: topic.clone(),
                    queue_id,
                };
                let lease_id = self.new_handle(term, topic, queue_id, 0).delivery_id;
                leases.push(batch_lease(&key, &next, lease_id, Instant::now(), now_ms()));
                true
            } else if next.base() != st.base() {
                commits.push(OffsetCommit {
                    group: consumer.to_owned(),
                    topic: topic.clone(),
                    queue_id,
                    offset: next.base(),
                });
                true
            } else {
                false
            };
            locked.push((st, next, taken, recorded));
        }
        // Recorded first: a new leader must continue after these messages.
        let written = if !leases.is_empty() {
            self.commit_batches(term, leases).await
        } else if !commits.is_empty() {
            self.commit_as_leader(commits).await
        } else {
            Ok(())
        };
        let error = written.err();
        for (mut st, next, taken, recorded) in locked {
            if recorded {
                if let Some(e) = &error {
                    for i in taken {
                        results[i] = Some(Err(refuse(e.kind(), e.to_string())));
                    }
                    continue;
                }
            }
            let moved = next.base() != st.base();
            *st = next;
            if moved && recorded {
                st.take_commit();
            }
            for i in taken {
                results[i] = Some(Ok(()));
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Self::not_ready())))
            .collect()
    }
}

/// The error of an ack whose message was delivered again since.
pub(super) fn stale() -> BrokerError {
    refuse(
        ErrorKind::InvalidReceiptHandle,
        "the receipt handle expired: the message was delivered again since",
    )
}

#[cfg(test)]
mod tests;
