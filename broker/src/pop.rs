//! What a consumer group has taken from one message queue (RocketMQ 5's "pop"
//! consumption), as the leader tracks it. No I/O: the caller reads the store and
//! commits offsets.
//!
//! Offsets below `base` are acked (`base` is the consumer offset committed through
//! Raft). Every offset in `[base, next)` is either acked (out of order) or in flight:
//! delivered, invisible until its deadline, waiting for an ack. When the deadline
//! passes without an ack the message is delivered again with the next attempt
//! number. A new leader starts from the committed offset with nothing in flight, so
//! messages in flight at a failover are delivered again (at-least-once). Where
//! earlier leaders recorded their deliveries through Raft before answering
//! (`Command::DeliveryAttempts`, with the node option `exact_delivery_attempts`;
//! [`QueueState::with_prior_attempts`]), each counts on from the last attempt
//! made, and a message whose last attempt was made goes to the dead-letter
//! queue; otherwise a message in flight counts from 1 again.
//!
//! FIFO consumer groups take a queue's messages a batch at a time: nothing more
//! of the queue is delivered while a message of it is in flight and invisible;
//! once every message in flight is visible again (acked ones are gone) they
//! are delivered again, lowest first, before anything newer. The caller
//! records deliveries and acks through Raft before it answers them (the
//! `consumers` module), so a new leader continues after the acked ones. Acks may also name
//! offsets this leader never delivered (a delivery by the previous leader): they
//! are recorded, and those messages are skipped.
//!
//! Invisible deadlines are instants of this node's monotonic clock, so a jump of
//! its wall clock (an NTP step, a VM resumed, an operator) neither makes every
//! message in flight visible at once nor hides them longer than asked (issue 14).
//! A FIFO lease committed through Raft carries its time left, which each member
//! counts on its own monotonic clock from its apply; only a lease without one
//! (see [`deadline_from_wall`]) has its wall-clock deadline turned into a
//! monotonic one once, when a new leader adopts it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::consume::INVISIBLE_RANGE_MS;

/// Most messages in flight per queue and consumer group; more wait for acks.
pub const MAX_IN_FLIGHT_PER_QUEUE: usize = 4096;
/// Most offsets between the lowest unacked message and the next new one: a message
/// held unacked for long stops new deliveries past this window, which bounds the
/// acked set and what a failover delivers again.
pub const MAX_WINDOW: u64 = 65_536;

/// One delivered, unacked message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inflight {
    /// Delivery id (with the term, it names the receipt handle).
    pub delivery_id: u64,
    /// When it becomes visible again, on this node's monotonic clock.
    pub visible_at: Instant,
    /// Delivery attempt, from 1.
    pub attempt: u32,
}

/// The monotonic deadline of a FIFO lease adopted from an earlier term: the time
/// left until its wall-clock deadline `visible_at_ms` (ms since the Unix epoch, as
/// the lease's leader wrote it), read off this node's wall clock `wall_now_ms` once,
/// counted from `now`; `now` if the deadline has passed. At most the longest
/// invisible duration a client may ask (12 h) is left, however far behind this
/// node's wall clock is.
///
/// Used only for a lease without the time left counted from this node's apply
/// (`GroupMeta::lease_deadlines`): one written while a member was on an earlier
/// release, or restored since at a restart or from a snapshot. For those the
/// two leaders' wall clocks are trusted to agree: a new leader whose wall clock
/// is ahead of the old one's releases the adopted lease early (by the
/// difference), one behind holds it longer; only the remaining time at adoption
/// is judged by the wall clock, not every check after it.
pub fn deadline_from_wall(visible_at_ms: i64, wall_now_ms: i64, now: Instant) -> Instant {
    let left_ms = visible_at_ms.saturating_sub(wall_now_ms).max(0) as u64;
    now + Duration::from_millis(left_ms.min(INVISIBLE_RANGE_MS.1))
}

/// What an ack did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// The delivery was acked now.
    Acked,
    /// The message had been acked already (a repeated ack): nothing to do.
    AlreadyAcked,
    /// The message was delivered again since this handle was issued: the handle is
    /// stale and the newer delivery stays in flight.
    Stale,
}

/// One (consumer group, topic, queue id)'s consumption state on the leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueState {
    base: u64,
    next: u64,
    acked: BTreeSet<u64>,
    inflight: BTreeMap<u64, Inflight>,
    committed: Option<u64>,
    /// Attempts earlier leaders made of offsets at or above `base` that this
    /// leader has not delivered yet (replicated delivery attempts).
    prior: BTreeMap<u64, u32>,
}

impl QueueState {
    /// State of a queue whose consumer offset is `committed` (the next offset to
    /// consume; the queue's min offset for a group new to it).
    pub fn new(committed: u64) -> Self {
        Self {
            base: committed,
            next: committed,
            acked: BTreeSet::new(),
            inflight: BTreeMap::new(),
            committed: Some(committed),
            prior: BTreeMap::new(),
        }
    }

    /// This state, knowing that earlier leaders delivered the messages at
    /// `prior`'s offsets that many times (offsets below the committed one are
    /// ignored): a first delivery here counts on from there.
    pub fn with_prior_attempts(mut self, mut prior: BTreeMap<u64, u32>) -> Self {
        self.prior = prior.split_off(&self.base);
        self
    }

    /// How many times earlier leaders delivered `offset`, if this leader has not
    /// delivered it yet (0 if never).
    pub fn prior_attempts(&self, offset: u64) -> u32 {
        self.prior.get(&offset).copied().unwrap_or(0)
    }

    /// The lowest offset not acked: what the consumer offset should say.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The next offset never delivered by this leader: every offset in
    /// `[base, next)` is acked (or filtered out) or in flight.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// Messages in flight.
    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// The queue no longer holds offsets below `min` (retention): forget them.
    pub fn clamp_to_min(&mut self, min: u64) {
        if self.base >= min {
            return;
        }
        self.inflight = self.inflight.split_off(&min);
        self.acked = self.acked.split_off(&min);
        self.base = min;
        self.next = self.next.max(min);
        self.advance();
    }

    /// In-flight messages whose invisible time has ended at `now` (monotonic),
    /// lowest first: (queue offset, its in-flight record).
    pub fn expired(&self, now: Instant) -> Vec<(u64, Inflight)> {
        self.inflight
            .iter()
            .filter(|(_, i)| i.visible_at <= now)
            .map(|(o, i)| (*o, *i))
            .collect()
    }

    /// False if a FIFO queue may deliver at `now` (monotonic): nothing in flight,
    /// or every message in flight is visible again (they are then delivered
    /// again, lowest first, before anything newer). One message still invisible
    /// blocks the queue: a consumer may still be working on it, and nothing
    /// of the queue goes to another consumer meanwhile.
    pub fn fifo_blocked(&self, now: Instant) -> bool {
        self.inflight.values().any(|i| i.visible_at > now)
    }

    /// True if one FIFO lease of a single message can say what this queue
    /// holds: at most one message in flight and none acked out of order
    /// (everything below the lowest unacked offset is acked, nothing above).
    pub fn single_lease_fits(&self) -> bool {
        self.inflight.len() <= 1 && self.acked.is_empty()
    }

    /// Every message in flight, lowest offset first: (queue offset, its
    /// in-flight record).
    pub fn in_flight_entries(&self) -> impl Iterator<Item = (u64, Inflight)> + '_ {
        self.inflight.iter().map(|(o, i)| (*o, *i))
    }

    /// The next offset to deliver for the first time (skipping offsets acked through
    /// a previous leader's handles), or None if too many are in flight or the window
    /// past the lowest unacked message is full.
    pub fn next_new(&mut self) -> Option<u64> {
        while self.acked.contains(&self.next) {
            self.next += 1;
        }
        (self.inflight.len() < MAX_IN_FLIGHT_PER_QUEUE && self.next - self.base < MAX_WINDOW)
            .then_some(self.next)
    }

    /// Takes over a delivery a previous leader made of `offset` (== `next_new()`):
    /// it stays in flight until its deadline, and its handle can ack it.
    pub fn adopt(&mut self, offset: u64, inflight: Inflight) {
        assert_eq!(offset, self.next, "deliveries are adopted in queue order");
        self.inflight.insert(offset, inflight);
        self.next = offset + 1;
    }

    /// Records a delivery of `offset`: either the first by this leader
    /// (`offset == next_new()`; its attempt counts on from the attempts earlier
    /// leaders made, from 1 if none) or again (it is in flight and expired),
    /// invisible until `visible_at` (monotonic). Returns the attempt number.
    pub fn deliver(&mut self, offset: u64, delivery_id: u64, visible_at: Instant) -> u32 {
        let attempt = match self.inflight.get(&offset) {
            Some(i) => i.attempt + 1,
            None => {
                assert_eq!(offset, self.next, "first deliveries go in order");
                self.next = offset + 1;
                self.prior
                    .remove(&offset)
                    .map_or(1, |a| a.saturating_add(1))
            }
        };
        self.inflight.insert(
            offset,
            Inflight {
                delivery_id,
                visible_at,
                attempt,
            },
        );
        attempt
    }

    /// Passes over `offset` (== `next_new()`) without delivering it: it does not
    /// match the subscription's filter.
    pub fn skip(&mut self, offset: u64) {
        assert_eq!(offset, self.next, "offsets are skipped in queue order");
        self.prior.remove(&offset);
        self.acked.insert(offset);
        self.next = offset + 1;
        self.advance();
    }

    /// Acks the delivery `delivery_id` of `offset`. Offsets this leader never
    /// delivered are acked as they are (a previous leader delivered them); the caller
    /// checks that the queue holds `offset`.
    pub fn ack(&mut self, offset: u64, delivery_id: Option<u64>) -> AckOutcome {
        let outcome = self.peek_ack(offset, delivery_id);
        if outcome == AckOutcome::Acked {
            self.inflight.remove(&offset);
            self.prior.remove(&offset);
            self.acked.insert(offset);
            self.advance();
        }
        outcome
    }

    /// What [`Self::ack`] would do, without doing it.
    pub fn peek_ack(&self, offset: u64, delivery_id: Option<u64>) -> AckOutcome {
        if offset < self.base || self.acked.contains(&offset) {
            return AckOutcome::AlreadyAcked;
        }
        match self.inflight.get(&offset) {
            Some(i) if Some(i.delivery_id) != delivery_id => AckOutcome::Stale,
            _ => AckOutcome::Acked,
        }
    }

    /// The attempt number of `offset`'s current delivery if it is `delivery_id`.
    pub fn attempt_of(&self, offset: u64, delivery_id: u64) -> Option<u32> {
        self.inflight
            .get(&offset)
            .filter(|i| i.delivery_id == delivery_id)
            .map(|i| i.attempt)
    }

    /// Moves the invisible deadline of the current delivery of `offset` to
    /// `visible_at` (monotonic). False if `delivery_id` is not the current delivery.
    pub fn change_invisible(&mut self, offset: u64, delivery_id: u64, visible_at: Instant) -> bool {
        match self.inflight.get_mut(&offset) {
            Some(i) if i.delivery_id == delivery_id => {
                i.visible_at = visible_at;
                true
            }
            _ => false,
        }
    }

    /// The consumer offset to commit, if it moved since the last call.
    pub fn take_commit(&mut self) -> Option<u64> {
        (self.committed != Some(self.base)).then(|| {
            self.committed = Some(self.base);
            self.base
        })
    }

    /// A commit taken with [`Self::take_commit`] failed: offer it again.
    pub fn commit_failed(&mut self) {
        self.committed = None;
    }

    fn advance(&mut self) {
        while self.acked.remove(&self.base) {
            self.base += 1;
        }
        while self
            .prior
            .first_key_value()
            .is_some_and(|(&o, _)| o < self.base)
        {
            self.prior.pop_first();
        }
        if self.next < self.base {
            self.next = self.base;
        }
        debug_assert!(self
            .inflight
            .keys()
            .all(|&o| o >= self.base && o < self.next));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::OnceLock;

    /// `ms` after a fixed instant of the monotonic clock.
    fn at(ms: u64) -> Instant {
        static BASE: OnceLock<Instant> = OnceLock::new();
        *BASE.get_or_init(Instant::now) + Duration::from_millis(ms)
    }

    #[test]
    fn out_of_order_acks_move_the_base_only_past_a_contiguous_prefix() {
        let mut s = QueueState::new(10);
        for (id, o) in (10..14).enumerate() {
            assert_eq!(s.next_new(), Some(o));
            assert_eq!(s.deliver(o, id as u64, at(100)), 1);
        }
        assert_eq!(s.ack(12, Some(2)), AckOutcome::Acked);
        assert_eq!(s.base(), 10);
        assert_eq!(s.ack(10, Some(0)), AckOutcome::Acked);
        assert_eq!(s.base(), 11);
        assert_eq!(s.ack(11, Some(1)), AckOutcome::Acked);
        assert_eq!(s.base(), 13);
        assert_eq!(s.ack(11, Some(1)), AckOutcome::AlreadyAcked);
        assert_eq!(s.take_commit(), Some(13));
        assert_eq!(s.take_commit(), None);
        s.commit_failed();
        assert_eq!(s.take_commit(), Some(13));
    }

    #[test]
    fn attempts_of_earlier_leaders_count_on_until_delivered_skipped_acked_or_consumed() {
        let s = QueueState::new(10).with_prior_attempts([(8, 5), (10, 2), (11, 1), (12, 3)].into());
        // Below the committed offset: consumed, ignored.
        assert_eq!(s.prior_attempts(8), 0);
        let mut s = s;
        assert_eq!(s.next_new(), Some(10));
        assert_eq!(s.deliver(10, 1, at(100)), 3);
        assert_eq!(s.prior_attempts(10), 0);
        // Again after its invisible time: this leader's count goes on.
        assert_eq!(s.deliver(10, 2, at(200)), 4);
        // Skipped by a filter, or acked through an earlier leader's handle.
        s.next_new();
        s.skip(11);
        assert_eq!(s.prior_attempts(11), 0);
        assert_eq!(s.ack(12, None), AckOutcome::Acked);
        assert_eq!(s.prior_attempts(12), 0);
        // Retention past them.
        let mut t = QueueState::new(0).with_prior_attempts([(1, 2), (5, 1)].into());
        t.clamp_to_min(3);
        assert_eq!((t.prior_attempts(1), t.prior_attempts(5)), (0, 1));
    }

    #[test]
    fn expired_deliveries_come_back_with_the_next_attempt_and_old_handles_go_stale() {
        let mut s = QueueState::new(0);
        s.next_new();
        s.deliver(0, 1, at(100));
        assert!(s.expired(at(99)).is_empty());
        assert_eq!(s.expired(at(100)).len(), 1);
        assert_eq!(s.deliver(0, 2, at(200)), 2);
        assert_eq!(s.ack(0, Some(1)), AckOutcome::Stale);
        assert!(!s.change_invisible(0, 1, at(500)));
        assert!(s.change_invisible(0, 2, at(500)));
        assert!(s.expired(at(300)).is_empty());
        assert_eq!(s.ack(0, Some(2)), AckOutcome::Acked);
        assert_eq!(s.base(), 1);
    }

    #[test]
    fn fifo_blocks_until_ack_or_expiry() {
        let mut s = QueueState::new(0);
        assert!(!s.fifo_blocked(at(0)));
        s.next_new();
        s.deliver(0, 1, at(100));
        assert!(s.fifo_blocked(at(50)));
        assert!(!s.fifo_blocked(at(100)));
        s.ack(0, Some(1));
        assert!(!s.fifo_blocked(at(50)));
    }

    #[test]
    fn a_fifo_batch_blocks_while_any_of_it_is_invisible() {
        let mut s = QueueState::new(0);
        for (o, id) in [(0, 1), (1, 2), (2, 3)] {
            assert_eq!(s.next_new(), Some(o));
            s.deliver(o, id, at(100));
        }
        // The first one's deadline moved earlier: the others still block.
        assert!(s.change_invisible(0, 1, at(10)));
        assert!(s.fifo_blocked(at(50)));
        assert!(!s.fifo_blocked(at(100)));
        // Acked ones no longer count; the lowest comes back first.
        s.ack(1, Some(2));
        let offsets: Vec<_> = s.expired(at(100)).iter().map(|e| e.0).collect();
        assert_eq!(offsets, [0, 2]);
        let all: Vec<_> = s.in_flight_entries().map(|e| e.0).collect();
        assert_eq!(all, [0, 2]);
    }

    #[test]
    fn acks_from_a_previous_leader_skip_those_messages() {
        // A new leader starts at the committed offset 5; a consumer acks 5 and 7 with
        // the old leader's handles.
        let mut s = QueueState::new(5);
        assert_eq!(s.ack(7, None), AckOutcome::Acked);
        assert_eq!(s.base(), 5);
        assert_eq!(s.ack(5, None), AckOutcome::Acked);
        assert_eq!(s.base(), 6);
        assert_eq!(s.next_new(), Some(6));
        s.deliver(6, 1, at(10));
        assert_eq!(s.next_new(), Some(8));
        s.deliver(8, 2, at(10));
        s.ack(6, Some(1));
        assert_eq!(s.base(), 8);
    }

    #[test]
    fn an_adopted_delivery_blocks_fifo_until_acked_with_its_handle() {
        let mut s = QueueState::new(4);
        // The old leader's lease ends at wall-clock 5000 ms; this node's wall clock
        // reads 4000 ms at adoption: 1000 ms left.
        let old = Inflight {
            delivery_id: 77,
            visible_at: deadline_from_wall(5000, 4000, at(0)),
            attempt: 2,
        };
        assert_eq!(s.next_new(), Some(4));
        s.adopt(4, old);
        assert!(s.fifo_blocked(at(999)));
        assert!(!s.fifo_blocked(at(1000)));
        assert_eq!(s.ack(4, Some(78)), AckOutcome::Stale);
        assert_eq!(s.ack(4, Some(77)), AckOutcome::Acked);
        assert_eq!(s.base(), 5);
    }

    #[test]
    fn a_message_held_unacked_stops_new_deliveries_past_the_window() {
        let mut s = QueueState::new(0);
        s.next_new();
        s.deliver(0, 1, at(u64::from(u32::MAX)));
        for o in 1..MAX_WINDOW {
            assert_eq!(s.next_new(), Some(o));
            s.skip(o);
        }
        assert_eq!(s.next_new(), None);
        s.ack(0, Some(1));
        assert_eq!(s.base(), MAX_WINDOW);
        assert_eq!(s.next_new(), Some(MAX_WINDOW));
    }

    #[test]
    fn filtered_messages_are_skipped_and_retention_clamps() {
        let mut s = QueueState::new(0);
        s.next_new();
        s.skip(0);
        assert_eq!(s.base(), 1);
        s.next_new();
        s.deliver(1, 1, at(10));
        s.next_new();
        s.skip(2);
        assert_eq!(s.base(), 1);
        s.clamp_to_min(5);
        assert_eq!((s.base(), s.next(), s.in_flight()), (5, 5, 0));
    }

    #[test]
    fn an_adopted_leases_wall_clock_deadline_becomes_the_time_left_from_now() {
        assert_eq!(deadline_from_wall(10_000, 7_500, at(20)), at(2_520));
        // Passed, or i64 extremes: visible at once.
        assert_eq!(deadline_from_wall(7_000, 7_500, at(20)), at(20));
        assert_eq!(deadline_from_wall(i64::MIN, i64::MAX, at(20)), at(20));
        // A wall clock far behind: at most the longest invisible duration.
        let longest = INVISIBLE_RANGE_MS.1;
        assert_eq!(deadline_from_wall(i64::MAX, 0, at(20)), at(20 + longest));
    }

    proptest! {
        /// Against a model: every offset below `next` is acked or in flight exactly
        /// once; base is the lowest offset not acked.
        #[test]
        fn state_matches_a_model(ops in proptest::collection::vec((0u8..4, 0u64..20, 0u64..50), 1..200)) {
            let mut s = QueueState::new(0);
            let mut acked = BTreeSet::new();
            let mut ids: BTreeMap<u64, u64> = BTreeMap::new();
            let mut id = 0u64;
            for (op, x, now) in ops {
                match op {
                    0 => if let Some(o) = s.next_new() {
                        id += 1;
                        s.deliver(o, id, at(now + 10));
                        ids.insert(o, id);
                    },
                    1 => if let Some(&(o, _)) = s.expired(at(now)).first() {
                        id += 1;
                        s.deliver(o, id, at(now + 10));
                        ids.insert(o, id);
                    },
                    2 => {
                        let r = s.ack(x, ids.get(&x).copied());
                        if r == AckOutcome::Acked { acked.insert(x); }
                        prop_assert_ne!(r, AckOutcome::Stale);
                    }
                    _ => if x < s.next() {
                        if let Some(&cur) = ids.get(&x) {
                            prop_assert_eq!(s.ack(x, Some(cur.wrapping_add(1000))) == AckOutcome::Stale,
                                !acked.contains(&x));
                        }
                    },
                }
                let base = (0..).find(|o| !acked.contains(o)).unwrap();
                prop_assert_eq!(s.base(), base);
                for o in 0..s.next() {
                    prop_assert!(acked.contains(&o) ^ s.inflight.contains_key(&o), "offset {}", o);
                }
            }
        }
    }
}
