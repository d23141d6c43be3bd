//! What a new leader takes over of a queue's consumption: the group's committed
//! offset, a FIFO group's deliveries in flight (its lease or batch lease), and the delivery
//! attempts earlier leaders recorded for a clustering group's messages. No I/O.

use std::time::Instant;

use ledgermq_meta::{FifoBatchLease, GroupMeta};
use ledgermq_store::store::now_ms;

use super::QueueKey;
use crate::pop::{deadline_from_wall, Inflight, QueueState};

/// The state of `key` for a leader starting to serve it: the queue holds
/// `[min, max)`. The committed offset (the queue's min for a group new to it),
/// then for a FIFO group the previous leader's deliveries in flight at and
/// above that offset (its batch lease, or its single lease at that offset),
/// each kept invisible until the deadline this node counted from its apply
/// of the lease or, for a lease without one, for the time its wall-clock
/// deadline has left by this node's wall clock; for any other group the
/// delivery attempts recorded for messages at or above the committed offset,
/// from which their next deliveries count on.
pub(super) fn initial_state(
    meta: &GroupMeta,
    key: &QueueKey,
    fifo: bool,
    min: u64,
    max: u64,
) -> QueueState {
    let k = (key.consumer.clone(), key.topic.clone(), key.queue_id);
    let committed = meta.offsets.get(&k).copied().unwrap_or(min).clamp(min, max);
    let mut st = QueueState::new(committed);
    if !fifo {
        return match meta.delivery_attempts.get(&k) {
            Some(prior) => st.with_prior_attempts(prior.clone()),
            None => st,
        };
    }
    if let Some(b) = meta.fifo_batches.get(&k) {
        adopt_batch(&mut st, b, meta.batch_deadlines.0.get(&k), committed, max);
        return st;
    }
    if let Some(l) = meta
        .fifo_leases
        .get(&k)
        .filter(|l| l.queue_offset == committed)
    {
        if st.next_new() == Some(committed) && committed < max {
            // The time left as this node counted it from its apply, or
            // else as the wall clocks say.
            let visible_at = meta
                .lease_deadlines
                .0
                .get(&k)
                .filter(|d| d.delivery_id == l.delivery_id)
                .map(|d| d.visible_at)
                .unwrap_or_else(|| deadline_from_wall(l.visible_at_ms, now_ms(), Instant::now()));
            st.adopt(
                committed,
                Inflight {
                    delivery_id: l.delivery_id,
                    visible_at,
                    attempt: l.attempt,
                },
            );
        }
    }
    st
}

/// Takes over the deliveries of batch `b` at or above `committed` (the queue
/// holds up to `max`): each stays in flight until its deadline, counted from
/// this node's apply (`deadlines`, one per delivery) or else read off the wall
/// clock; the other offsets below the batch's `end_offset` were acked or
/// filtered out, and are not delivered again.
fn adopt_batch(
    st: &mut QueueState,
    b: &FifoBatchLease,
    deadlines: Option<&Vec<Instant>>,
    committed: u64,
    max: u64,
) {
    // Counted from the apply only if they are this batch's own.
    let deadlines = deadlines.filter(|d| d.len() == b.deliveries.len());
    let now = Instant::now();
    let wall_now_ms = now_ms();
    // Offsets in [committed, end) it does not list were acked or filtered out.
    let end = b.end_offset.min(max);
    let skip_below = |st: &mut QueueState, offset: u64| {
        while let Some(o) = st.next_new().filter(|&o| o < offset) {
            st.skip(o);
        }
    };
    for (n, d) in b.deliveries.iter().enumerate() {
        if d.queue_offset < committed {
            continue;
        }
        if d.queue_offset >= end {
            break;
        }
        skip_below(st, d.queue_offset);
        if st.next_new() != Some(d.queue_offset) {
            break;
        }
        let visible_at = deadlines
            .map(|v| v[n])
            .unwrap_or_else(|| deadline_from_wall(d.visible_at_ms, wall_now_ms, now));
        st.adopt(
            d.queue_offset,
            Inflight {
                delivery_id: d.delivery_id,
                visible_at,
                attempt: d.attempt,
            },
        );
    }
    skip_below(st, end);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clustering_group_counts_on_from_the_recorded_attempts_at_or_above_its_offset() {
        let mut meta = GroupMeta::default();
        let k = ("g".to_owned(), "T".to_owned(), 0);
        meta.offsets.insert(k.clone(), 5);
        meta.delivery_attempts
            .insert(k, [(4, 9), (5, 2), (7, 1)].into());
        let key = QueueKey {
            consumer: "g".into(),
            topic: "T".into(),
            queue_id: 0,
        };
        let mut st = initial_state(&meta, &key, false, 0, 10);
        assert_eq!(st.base(), 5);
        assert_eq!(
            (
                st.prior_attempts(4),
                st.prior_attempts(5),
                st.prior_attempts(7)
            ),
            (0, 2, 1)
        );
        let now = Instant::now();
        // Offsets 5, 6, 7: attempts 3, 1 (none recorded), 2.
        let mut attempts = Vec::new();
        for id in 0..3 {
            let o = st.next_new().unwrap();
            attempts.push(st.deliver(o, id, now));
        }
        assert_eq!(attempts, [3, 1, 2]);
        // A FIFO group's state ignores them (its attempts are in its lease).
        let st = initial_state(&meta, &key, true, 0, 10);
        assert_eq!(st.prior_attempts(5), 0);
    }
}
