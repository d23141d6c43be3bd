//! The rules for FIFO batch leases ([`Command::FifoBatchLeases`]): which of a
//! queue's leases, a batch or a single [`FifoLease`], is kept, and each
//! delivery's deadline on this member's clock. No I/O.
//!
//! [`Command::FifoBatchLeases`]: crate::Command::FifoBatchLeases

use std::time::Duration;

use super::{timed_lease_left_ms, AppliedAt, RowChange};
use crate::command::{FifoBatchLease, FifoLease};
use crate::state::{GroupMeta, QueueKey};

/// How new `key`'s stored lease is: its single lease's delivery id or its
/// batch's lease id (ids of one sequence per term, the term in the top bits).
fn stored_version(meta: &GroupMeta, key: &QueueKey) -> Option<u64> {
    let single = meta.fifo_leases.get(key).map(|l| l.delivery_id);
    let batch = meta.fifo_batches.get(key).map(|b| b.lease_id);
    single.max(batch)
}

/// Applies each batch of `batches` unless its queue's stored lease is newer
/// (a higher id): the group's offset is raised to its `next_offset`, the
/// queue's single lease goes, and the batch becomes the queue's lease (kept
/// with nothing in flight too, so its id still orders later leases); each
/// delivery's deadline is the
/// apply's instant plus its time left ([`timed_lease_left_ms`]). Deliveries
/// outside `[next_offset, end_offset)` are dropped; the rest kept in queue
/// offset order.
pub(super) fn apply_batches(
    meta: &mut GroupMeta,
    batches: Vec<FifoBatchLease>,
    at: AppliedAt,
    rows: &mut Vec<RowChange>,
) {
    for mut b in batches {
        let key = (b.group.clone(), b.topic.clone(), b.queue_id);
        if stored_version(meta, &key).is_some_and(|v| v > b.lease_id) {
            continue;
        }
        if meta
            .offsets
            .get(&key)
            .is_none_or(|&cur| b.next_offset > cur)
        {
            meta.offsets.insert(key.clone(), b.next_offset);
            rows.push(RowChange::Offset(key.clone(), b.next_offset));
        }
        if meta.fifo_leases.remove(&key).is_some() {
            meta.lease_deadlines.0.remove(&key);
            rows.push(RowChange::RemoveLease(key.clone()));
        }
        let (from, to) = (b.next_offset, b.end_offset);
        b.deliveries
            .retain(|d| (from..to).contains(&d.queue_offset));
        b.deliveries.sort_by_key(|d| d.queue_offset);
        b.deliveries.dedup_by_key(|d| d.queue_offset);
        // At most 12 h ahead each: no Instant overflows there.
        let deadlines = b
            .deliveries
            .iter()
            .map(|d| {
                at.instant
                    + Duration::from_millis(timed_lease_left_ms(
                        d.invisible_ms,
                        d.visible_at_ms,
                        at,
                    ))
            })
            .collect();
        meta.batch_deadlines.0.insert(key.clone(), deadlines);
        meta.fifo_batches.insert(key, b.clone());
        rows.push(RowChange::BatchLease(b));
    }
}

/// True if a single lease `l` may replace its queue's stored batch (none is
/// stored, or the batch is older than the delivery); removes that batch then.
pub(super) fn single_replaces_batch(
    meta: &mut GroupMeta,
    l: &FifoLease,
    rows: &mut Vec<RowChange>,
) -> bool {
    let key = (l.group.clone(), l.topic.clone(), l.queue_id);
    match meta.fifo_batches.get(&key) {
        None => true,
        Some(b) if b.lease_id > l.delivery_id => false,
        Some(_) => {
            remove_batch(meta, &key, rows);
            true
        }
    }
}

/// Drops `key`'s batch lease, if any.
pub(super) fn remove_batch(meta: &mut GroupMeta, key: &QueueKey, rows: &mut Vec<RowChange>) {
    if meta.fifo_batches.remove(key).is_some() {
        meta.batch_deadlines.0.remove(key);
        rows.push(RowChange::RemoveBatchLease(key.clone()));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::{apply, Applied, Canaries};
    use super::*;
    use crate::command::{Command, FifoDelivery, OffsetCommit};

    const TERM: u64 = 7;

    fn key() -> QueueKey {
        ("g".into(), "T".into(), 0)
    }

    fn id(term: u64, seq: u64) -> u64 {
        (term << FifoLease::DELIVERY_TERM_SHIFT) | seq
    }

    /// The batch lease `lease_seq` of `TERM` from `next_offset` with deliveries
    /// `(offset, delivery seq, attempt)`, each invisible for `invisible_ms`
    /// (wall deadline 10 s past wall-clock 0).
    fn batch(
        lease_seq: u64,
        next_offset: u64,
        deliveries: &[(u64, u64, u32)],
        invisible_ms: u64,
    ) -> FifoBatchLease {
        FifoBatchLease {
            group: "g".into(),
            topic: "T".into(),
            queue_id: 0,
            lease_id: id(TERM, lease_seq),
            next_offset,
            end_offset: deliveries
                .iter()
                .map(|d| d.0 + 1)
                .max()
                .unwrap_or(next_offset),
            deliveries: deliveries
                .iter()
                .map(|&(queue_offset, seq, attempt)| FifoDelivery {
                    queue_offset,
                    delivery_id: id(TERM, seq),
                    attempt,
                    visible_at_ms: 10_000,
                    invisible_ms,
                })
                .collect(),
        }
    }

    fn run_at(meta: &mut GroupMeta, cmd: Command, entry_term: u64, now: Instant) -> Applied {
        let at = AppliedAt {
            instant: now,
            wall_ms: 0,
        };
        apply(meta, cmd, entry_term, at, Canaries::default())
    }

    fn batches(b: FifoBatchLease) -> Command {
        Command::FifoBatchLeases {
            term: TERM,
            batches: vec![b],
        }
    }

    fn offsets(m: &GroupMeta) -> Vec<u64> {
        m.fifo_batches[&key()]
            .deliveries
            .iter()
            .map(|d| d.queue_offset)
            .collect()
    }

    #[test]
    fn a_batch_raises_the_offset_to_its_next_offset_and_counts_each_deadline_from_the_apply() {
        let mut m = GroupMeta::default();
        let now = Instant::now();
        // Given out of order, with one below its next offset: kept in queue
        // order, without it.
        let b = batch(9, 5, &[(7, 2, 1), (5, 1, 3), (4, 0, 1)], 2_000);
        let applied = run_at(&mut m, batches(b), TERM, now);
        assert_eq!(m.offsets[&key()], 5);
        assert_eq!(offsets(&m), [5, 7]);
        let stored = &m.fifo_batches[&key()];
        assert_eq!(stored.deliveries[0].attempt, 3);
        assert_eq!(
            m.batch_deadlines.0[&key()],
            vec![now + Duration::from_millis(2_000); 2]
        );
        assert_eq!(
            applied.rows,
            vec![
                RowChange::Offset(key(), 5),
                RowChange::BatchLease(stored.clone())
            ]
        );
        // An offset already past it stays.
        let mut m = GroupMeta::default();
        m.offsets.insert(key(), 9);
        run_at(&mut m, batches(batch(1, 5, &[(5, 1, 1)], 1_000)), TERM, now);
        assert_eq!(m.offsets[&key()], 9);
    }

    #[test]
    fn a_batch_of_another_term_changes_nothing() {
        let mut m = GroupMeta::default();
        let b = batch(1, 5, &[(5, 1, 1)], 1_000);
        let applied = run_at(&mut m, batches(b), TERM + 1, Instant::now());
        assert!(applied.rows.is_empty() && m.fifo_batches.is_empty() && m.offsets.is_empty());
    }

    #[test]
    fn the_newest_lease_wins_whatever_order_the_log_has_them_in() {
        let now = Instant::now();
        let single = |seq| FifoLease {
            group: "g".into(),
            topic: "T".into(),
            queue_id: 0,
            queue_offset: 5,
            delivery_id: id(TERM, seq),
            attempt: 1,
            visible_at_ms: 10_000,
        };
        let mut m = GroupMeta::default();
        run_at(&mut m, Command::FifoLeases(vec![single(3)]), TERM, now);
        // An older batch does not replace a newer single lease.
        run_at(&mut m, batches(batch(2, 5, &[(5, 1, 1)], 1_000)), TERM, now);
        assert!(m.fifo_batches.is_empty() && m.fifo_leases.contains_key(&key()));
        // A newer batch does, and the single lease row goes.
        let newer = batch(6, 5, &[(5, 4, 2), (6, 5, 1)], 1_000);
        let applied = run_at(&mut m, batches(newer), TERM, now);
        assert!(m.fifo_leases.is_empty() && offsets(&m) == [5, 6]);
        assert!(applied.rows.contains(&RowChange::RemoveLease(key())));
        // An ack of 6 made later (lease 8) lands before a receive's lease made
        // earlier (lease 7, still listing 6): the later one stays.
        run_at(&mut m, batches(batch(8, 5, &[(5, 4, 2)], 9_000)), TERM, now);
        run_at(
            &mut m,
            batches(batch(7, 5, &[(5, 4, 2), (6, 5, 1)], 1_000)),
            TERM,
            now,
        );
        assert_eq!(offsets(&m), [5]);
        assert_eq!(
            m.batch_deadlines.0[&key()][0],
            now + Duration::from_millis(9_000)
        );
        // A single lease older than the batch does not replace it; a newer one does.
        run_at(&mut m, Command::FifoLeases(vec![single(4)]), TERM, now);
        assert!(m.fifo_leases.is_empty() && m.fifo_batches.contains_key(&key()));
        let applied = run_at(&mut m, Command::FifoLeases(vec![single(9)]), TERM, now);
        assert!(m.fifo_batches.is_empty() && m.batch_deadlines.0.is_empty());
        assert!(applied.rows.contains(&RowChange::RemoveBatchLease(key())));
        assert_eq!(m.fifo_leases[&key()].delivery_id, id(TERM, 9));
    }

    #[test]
    fn a_batch_with_nothing_in_flight_moves_the_offset_and_still_orders_later_leases() {
        let now = Instant::now();
        let mut m = GroupMeta::default();
        run_at(
            &mut m,
            batches(batch(3, 5, &[(5, 1, 1), (6, 2, 1)], 1_000)),
            TERM,
            now,
        );
        let applied = run_at(&mut m, batches(batch(5, 7, &[], 0)), TERM, now);
        assert_eq!(m.offsets[&key()], 7);
        assert!(m.fifo_batches[&key()].deliveries.is_empty());
        assert!(m.batch_deadlines.0[&key()].is_empty());
        assert_eq!(applied.rows[0], RowChange::Offset(key(), 7));
        // A lease made before it and landing after it changes nothing.
        let late = run_at(&mut m, batches(batch(4, 5, &[(5, 1, 1)], 1_000)), TERM, now);
        assert!(late.rows.is_empty());
        assert!(m.fifo_batches[&key()].deliveries.is_empty());
    }

    #[test]
    fn a_reset_or_a_deleted_group_drops_the_batch() {
        let now = Instant::now();
        let mut m = GroupMeta::default();
        run_at(&mut m, batches(batch(4, 7, &[(7, 1, 1)], 1_000)), TERM, now);
        let reset = Command::ResetOffsets(vec![OffsetCommit {
            group: "g".into(),
            topic: "T".into(),
            queue_id: 0,
            offset: 0,
        }]);
        let applied = run_at(&mut m, reset, TERM, now);
        assert!(m.fifo_batches.is_empty() && m.batch_deadlines.0.is_empty());
        assert!(applied.rows.contains(&RowChange::RemoveBatchLease(key())));
        run_at(&mut m, batches(batch(5, 0, &[(0, 2, 1)], 1_000)), TERM, now);
        let applied = run_at(&mut m, Command::DeleteGroup("g".into()), TERM, now);
        assert!(m.fifo_batches.is_empty() && m.batch_deadlines.0.is_empty());
        assert!(applied.rows.contains(&RowChange::RemoveBatchLease(key())));
    }
}
