//! What a new leader takes over of a queue's consumption: the group's committed
//! offset, a FIFO group's delivery in flight (its lease), and the delivery
//! attempts earlier leaders recorded for a clustering group's messages. No I/O.

use std::time::Instant;

use ledgermq_meta::GroupMeta;
use ledgermq_store::store::now_ms;

use super::QueueKey;
use crate::pop::{deadline_from_wall, Inflight, QueueState};

/// The state of `key` for a leader starting to serve it: the queue holds
/// `[min, max)`. The committed offset (the queue's min for a group new to it),
/// then for a FIFO group the previous leader's delivery in flight at that
/// offset, kept invisible until the deadline this node counted from its apply
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
