//! Checkers over a history (see `jepsen-notes.md` for the reference definitions).
//! Plain functions of the history: no I/O.
//!
//! - [`total_queue`] (Jepsen's total-queue): lost = acknowledged, never received;
//!   unexpected = received, never sent or sent with a definite failure; duplicated; recovered = unknown send that
//!   arrived. Valid only when nothing is lost or unexpected.
//! - [`order`]: per message queue, one queue offset never holds two messages and the
//!   offsets delivered have no gaps; per message group, deliveries follow the send
//!   order (a redelivery may repeat the latest message, never go back).
//!
//! The availability checker is [`crate::availability`].

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::Serialize;

use crate::history::{send_outcomes, Op, OpFn, OpType};

/// Most examples kept per finding.
pub const MAX_EXAMPLES: usize = 10;

/// Adds `example` to `examples` unless [`MAX_EXAMPLES`] are kept already.
pub fn note_example(examples: &mut Vec<String>, example: String) {
    if examples.len() < MAX_EXAMPLES {
        examples.push(example);
    }
}

/// Counts and examples of Jepsen's total-queue checker.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TotalQueue {
    /// Sends invoked.
    pub attempted: usize,
    /// Sends acknowledged.
    pub acknowledged: usize,
    /// Distinct values received.
    pub received: usize,
    /// Acknowledged, never received.
    pub lost: usize,
    /// Received, but never sent or sent with a definite failure.
    pub unexpected: usize,
    /// Values received more than once (deliveries beyond the first).
    pub duplicated: usize,
    /// Sends of unknown outcome that were received.
    pub recovered: usize,
    /// Values stored at more than one queue position (topic, queue, offset): a
    /// write repeated, not a redelivery.
    pub duplicate_writes: usize,
    /// Of those, values stored at more positions than the client made attempts
    /// that may have written (refused attempts do not count): the broker stored a
    /// write twice (a violation).
    pub duplicate_writes_sent_once: usize,
    /// A few values stored twice though sent once, with their positions.
    pub duplicate_write_examples: Vec<String>,
    /// A few lost values.
    pub lost_examples: Vec<String>,
    /// A few unexpected values.
    pub unexpected_examples: Vec<String>,
    /// Nothing lost, nothing unexpected, nothing sent once stored twice.
    pub valid: bool,
}

fn deliveries(ops: &[Op]) -> impl Iterator<Item = &crate::history::Delivered> {
    ops.iter()
        .filter(|o| o.f == OpFn::Receive && o.op_type == OpType::Ok)
        .flat_map(|o| o.delivered.iter())
}

/// Where a message is stored: topic, queue id, queue offset.
type Position<'a> = (&'a str, i32, u64);

/// Runs the total-queue checker.
pub fn total_queue(ops: &[Op]) -> TotalQueue {
    let outcomes = send_outcomes(ops);
    let attempted: BTreeSet<&str> = outcomes.iter().map(|(s, _)| s.id.as_str()).collect();
    let acked: BTreeSet<&str> = outcomes
        .iter()
        .filter(|(_, t)| *t == OpType::Ok)
        .map(|(s, _)| s.id.as_str())
        .collect();
    let unknown: BTreeSet<&str> = outcomes
        .iter()
        .filter(|(_, t)| *t == OpType::Info)
        .map(|(s, _)| s.id.as_str())
        .collect();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for d in deliveries(ops) {
        *counts.entry(d.id.as_str()).or_default() += 1;
    }
    let lost: Vec<&str> = acked
        .iter()
        .filter(|v| !counts.contains_key(*v))
        .copied()
        .collect();
    // A send that failed surely did not happen: receiving it is as unexpected as
    // receiving what was never sent.
    let unexpected: Vec<&str> = counts
        .keys()
        .filter(|v| !acked.contains(*v) && !unknown.contains(*v))
        .copied()
        .collect();
    // A value at two queue positions was written twice. Fine for a send retried
    // after an unknown outcome; a violation when it is stored at more positions
    // than there were attempts that may have written (refused ones excluded).
    let mut positions: BTreeMap<&str, BTreeSet<Position<'_>>> = BTreeMap::new();
    for d in deliveries(ops) {
        positions.entry(d.id.as_str()).or_default().insert((
            d.topic.as_str(),
            d.queue_id,
            d.queue_offset,
        ));
    }
    // Attempts that may have written: a refused one (Fail) surely did not.
    let mut attempts: BTreeMap<&str, usize> = BTreeMap::new();
    for (s, t) in &outcomes {
        if *t != OpType::Fail {
            *attempts.entry(s.id.as_str()).or_default() += 1;
        }
    }
    let twice: Vec<(&str, &BTreeSet<Position<'_>>)> = positions
        .iter()
        .filter(|(_, p)| p.len() > 1)
        .map(|(v, p)| (*v, p))
        .collect();
    // Stored at more positions than there were attempts that may have written.
    let sent_once: Vec<String> = twice
        .iter()
        .filter(|(v, p)| p.len() > attempts.get(v).copied().unwrap_or(0))
        .map(|(v, p)| format!("{v} at {p:?}"))
        .collect();
    TotalQueue {
        duplicate_writes: twice.len(),
        duplicate_writes_sent_once: sent_once.len(),
        duplicate_write_examples: sent_once.iter().take(MAX_EXAMPLES).cloned().collect(),
        attempted: attempted.len(),
        acknowledged: acked.len(),
        received: counts.len(),
        lost: lost.len(),
        unexpected: unexpected.len(),
        duplicated: counts.values().map(|c| c - 1).sum(),
        recovered: unknown.iter().filter(|v| counts.contains_key(*v)).count(),
        lost_examples: lost
            .iter()
            .take(MAX_EXAMPLES)
            .map(|s| s.to_string())
            .collect(),
        unexpected_examples: unexpected
            .iter()
            .take(MAX_EXAMPLES)
            .map(|s| s.to_string())
            .collect(),
        valid: lost.is_empty() && unexpected.is_empty() && sent_once.is_empty(),
    }
}

/// Findings of the order checker.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Order {
    /// Queue offsets that delivered two different values.
    pub inconsistent_offsets: usize,
    /// Offsets missing between the lowest and highest offset delivered per queue.
    pub offset_gaps: usize,
    /// First deliveries of a message group that went back to an earlier
    /// acknowledged message, or skipped an acknowledged one. A message whose
    /// send ended unknown may be stored at any time after its send began, so
    /// after the producer's later messages too (a request held up in the
    /// network): going back to it is not a violation. Nor is delivering again
    /// a message delivered before: a FIFO queue hands out a batch, and a batch
    /// not acked comes back from its first unacked message (RocketMQ 5's pop
    /// orderly); that no message comes back after an ack answered OK, nor
    /// while an earlier one may still be processed, is the FIFO checker's
    /// ([`crate::fifo`]).
    pub group_order_violations: usize,
    /// Examples, one line each.
    pub examples: Vec<String>,
    /// No finding.
    pub valid: bool,
}

/// Runs the order checker. Only acknowledged sends may not be skipped within a
/// message group (failed and unknown ones may be missing).
pub fn order(ops: &[Op]) -> Order {
    let mut r = Order::default();
    let note = |r: &mut Order, s: String| note_example(&mut r.examples, s);
    // Per queue: offset → value.
    let mut queues: BTreeMap<(&str, &str, i32), BTreeMap<u64, &str>> = BTreeMap::new();
    for d in deliveries(ops) {
        let q = queues
            .entry((d.broker.as_str(), d.topic.as_str(), d.queue_id))
            .or_default();
        match q.get(&d.queue_offset) {
            Some(v) if *v != d.id => {
                r.inconsistent_offsets += 1;
                note(
                    &mut r,
                    format!(
                        "{}/{}#{} offset {}: {v} and {}",
                        d.broker, d.topic, d.queue_id, d.queue_offset, d.id
                    ),
                );
            }
            Some(_) => {}
            None => {
                q.insert(d.queue_offset, &d.id);
            }
        }
    }
    for ((broker, topic, qid), offsets) in &queues {
        let (lo, hi) = (offsets.keys().next(), offsets.keys().next_back());
        if let (Some(&lo), Some(&hi)) = (lo, hi) {
            let missing = (hi - lo + 1) as usize - offsets.len();
            if missing > 0 {
                r.offset_gaps += missing;
                note(
                    &mut r,
                    format!("{broker}/{topic}#{qid}: {missing} offsets missing in [{lo}, {hi}]"),
                );
            }
        }
    }
    // Per message group: acknowledged sequence numbers, then the delivery order.
    let outcomes = send_outcomes(ops);
    let mut acked: HashMap<&str, BTreeSet<u64>> = HashMap::new();
    for (s, _) in outcomes.iter().filter(|(_, t)| *t == OpType::Ok) {
        if let (Some(g), Some(seq)) = (&s.group, s.seq) {
            acked.entry(g.as_str()).or_default().insert(seq);
        }
    }
    let mut groups = GroupOrder::default();
    let receives = ops
        .iter()
        .filter(|o| o.f == OpFn::Receive && o.op_type == OpType::Ok);
    for op in receives {
        groups.this_receive.clear();
        for d in &op.delivered {
            if let (Some(g), Some(seq)) = (d.group.as_deref(), d.seq) {
                groups.step(&mut r, &acked, g, seq);
            }
        }
    }
    r.valid = r.inconsistent_offsets == 0 && r.offset_gaps == 0 && r.group_order_violations == 0;
    r
}

/// The order check's memory of each message group.
#[derive(Default)]
struct GroupOrder<'a> {
    /// The highest message delivered.
    last: HashMap<&'a str, u64>,
    /// The messages the receive that last delivered the highest one handed
    /// out up to that delivery (what a batch that comes back may repeat).
    last_batch: HashMap<&'a str, HashSet<u64>>,
    /// The messages of the receive being read.
    this_receive: HashMap<&'a str, HashSet<u64>>,
}

impl<'a> GroupOrder<'a> {
    /// One delivery of message `seq` of group `g`: a violation if it skips an
    /// acknowledged message, or goes back to an acknowledged one that is not
    /// in the group's last batch (the receive that last delivered its highest
    /// message, up to that delivery).
    fn step(&mut self, r: &mut Order, acked: &HashMap<&str, BTreeSet<u64>>, g: &'a str, seq: u64) {
        let mine = self.this_receive.entry(g).or_default();
        mine.insert(seq);
        let acked_seq = |n: u64| acked.get(g).is_some_and(|a| a.contains(&n));
        if let Some(&prev) = self.last.get(g) {
            let skipped = acked
                .get(g)
                .is_some_and(|a| a.range(prev + 1..seq.max(prev + 1)).next().is_some());
            let came_back = self.last_batch.get(g).is_some_and(|b| b.contains(&seq));
            let back_to_acked = seq < prev && !came_back && acked_seq(seq);
            if back_to_acked || skipped {
                r.group_order_violations += 1;
                note_example(
                    &mut r.examples,
                    format!("group {g}: {seq} delivered after {prev}"),
                );
            }
        } else if acked
            .get(g)
            .is_some_and(|a| a.range(..seq).next().is_some())
        {
            r.group_order_violations += 1;
            note_example(
                &mut r.examples,
                format!("group {g}: first delivery is {seq}, an earlier acked message was skipped"),
            );
        }
        let e = self.last.entry(g).or_insert(seq);
        if seq >= *e {
            *e = seq;
            self.last_batch.insert(g, mine.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Delivered;

    use crate::history::send_op as send;

    /// (value, queue id, queue offset, (message group, seq)).
    type Item<'a> = (&'a str, i32, u64, Option<(&'a str, u64)>);

    fn recv(time_ms: u64, items: &[Item<'_>]) -> Op {
        Op {
            time_ms,
            process: 99,
            op_type: OpType::Ok,
            f: OpFn::Receive,
            sent: None,
            delivered: items
                .iter()
                .map(|(id, q, off, g)| Delivered {
                    id: id.to_string(),
                    broker: "broker-a".into(),
                    topic: "T".into(),
                    queue_id: *q,
                    queue_offset: *off,
                    group: g.map(|g| g.0.into()),
                    seq: g.map(|g| g.1),
                })
                .collect(),
            error: None,
            node: None,
            pinned_to: None,
        }
    }

    fn sent_ok(id: &str, p: u64, g: Option<(&str, u64)>) -> Vec<Op> {
        vec![
            send(0, p, OpType::Invoke, id, g),
            send(1, p, OpType::Ok, id, g),
        ]
    }

    #[test]
    fn total_queue_counts_lost_unexpected_duplicated_recovered() {
        let mut h = sent_ok("a", 1, None);
        h.extend(sent_ok("b", 1, None));
        h.push(send(2, 2, OpType::Invoke, "c", None));
        h.push(send(3, 2, OpType::Info, "c", None));
        h.push(send(4, 3, OpType::Invoke, "d", None));
        h.push(send(5, 3, OpType::Fail, "d", None));
        h.push(recv(
            6,
            &[
                ("a", 0, 0, None),
                ("a", 0, 0, None),
                ("c", 0, 1, None),
                ("z", 0, 2, None),
            ],
        ));
        let r = total_queue(&h);
        assert_eq!((r.attempted, r.acknowledged, r.received), (4, 2, 3));
        assert_eq!(
            (r.lost, r.unexpected, r.duplicated, r.recovered),
            (1, 1, 1, 1)
        );
        // A send that failed must not arrive.
        h.push(recv(7, &[("d", 0, 3, None)]));
        assert_eq!(total_queue(&h).unexpected, 2);
        assert_eq!(r.lost_examples, vec!["b"]);
        assert!(!r.valid);
    }

    #[test]
    fn a_value_sent_once_and_stored_twice_is_a_violation_a_retried_one_is_not() {
        let mut h = sent_ok("a", 1, None);
        // "r" timed out once (unknown), then was acknowledged on the next node.
        h.push(send(2, 2, OpType::Invoke, "r", None));
        h.push(send(3, 2, OpType::Info, "r", None));
        h.extend(sent_ok("r", 2, None));
        // A redelivery at the same position is not a duplicate write.
        h.push(recv(6, &[("a", 0, 0, None), ("r", 0, 1, None)]));
        h.push(recv(7, &[("a", 0, 0, None), ("r", 1, 0, None)]));
        let r = total_queue(&h);
        assert_eq!((r.duplicate_writes, r.duplicate_writes_sent_once), (1, 0));
        assert!(r.valid, "{r:?}");
        h.push(recv(8, &[("a", 0, 2, None)]));
        let r = total_queue(&h);
        assert_eq!((r.duplicate_writes, r.duplicate_writes_sent_once), (2, 1));
        assert!(r.duplicate_write_examples[0].starts_with("a at "), "{r:?}");
        assert!(!r.valid);
        // A refused attempt wrote nothing: "f" refused, then acknowledged once,
        // and stored twice, is a violation.
        let mut h = Vec::new();
        h.push(send(0, 3, OpType::Invoke, "f", None));
        h.push(send(1, 3, OpType::Fail, "f", None));
        h.extend(sent_ok("f", 3, None));
        h.push(recv(4, &[("f", 0, 0, None), ("f", 1, 0, None)]));
        assert_eq!(total_queue(&h).duplicate_writes_sent_once, 1);
    }

    #[test]
    fn order_finds_gaps_inconsistency_and_group_regressions() {
        let g = |n| Some(("g", n));
        let mut h = Vec::new();
        for (i, id) in ["m0", "m1", "m2"].iter().enumerate() {
            h.extend(sent_ok(id, 1, g(i as u64)));
        }
        // A redelivery of the latest message is fine.
        h.push(recv(
            5,
            &[
                ("m0", 0, 0, g(0)),
                ("m1", 0, 1, g(1)),
                ("m1", 0, 1, g(1)),
                ("m2", 0, 2, g(2)),
            ],
        ));
        assert!(order(&h).valid, "{:?}", order(&h));
        // Nor is a batch that comes back from its first message, twice.
        h.push(recv(
            6,
            &[("m0", 0, 0, g(0)), ("m1", 0, 1, g(1)), ("m2", 0, 2, g(2))],
        ));
        h.push(recv(6, &[("m0", 0, 0, g(0))]));
        assert!(order(&h).valid, "{:?}", order(&h));
        // A first delivery that goes back is not: m3 after m4.
        h.extend(sent_ok("m3", 1, g(3)));
        h.extend(sent_ok("m4", 1, g(4)));
        h.push(recv(8, &[("m4", 0, 4, g(4)), ("m3", 0, 3, g(3))]));
        let r = order(&h);
        assert_eq!(r.group_order_violations, 2, "m3 skipped, then back to it");
        // Another value at offset 1, and offset 4 without 3.
        h.push(recv(9, &[("x", 0, 1, None), ("y", 0, 6, None)]));
        let r = order(&h);
        assert_eq!((r.inconsistent_offsets, r.offset_gaps), (1, 1));
        assert!(!r.valid);
    }

    #[test]
    fn a_message_delivered_before_may_come_back_only_with_the_latest_ones_batch() {
        let g = |n| Some(("g", n));
        let mut h = sent_ok("m0", 1, g(0));
        h.extend(sent_ok("m1", 1, g(1)));
        // m0 alone, m1 alone, then m0 again: not a batch coming back.
        h.push(recv(5, &[("m0", 0, 0, g(0))]));
        h.push(recv(6, &[("m1", 0, 1, g(1))]));
        h.push(recv(7, &[("m0", 0, 0, g(0))]));
        assert_eq!(order(&h).group_order_violations, 1, "{:?}", order(&h));
    }

    #[test]
    fn skipping_an_acknowledged_group_message_is_a_violation_but_not_a_failed_one() {
        let g = |n| Some(("g", n));
        let mut h = sent_ok("m0", 1, g(0));
        h.push(send(2, 1, OpType::Invoke, "m1", g(1)));
        h.push(send(3, 1, OpType::Fail, "m1", g(1)));
        h.extend(sent_ok("m2", 1, g(2)));
        h.push(recv(5, &[("m0", 0, 0, g(0)), ("m2", 0, 1, g(2))]));
        assert!(order(&h).valid);
        let mut h2 = sent_ok("m0", 1, g(0));
        h2.extend(sent_ok("m1", 1, g(1)));
        h2.push(recv(5, &[("m1", 0, 1, g(1))]));
        assert_eq!(order(&h2).group_order_violations, 1);
    }

    #[test]
    fn a_group_message_whose_send_ended_unknown_may_come_after_later_ones() {
        let g = |n| Some(("g", n));
        // m1 timed out (held up in the network), the producer went on with m2, and
        // m1 was stored after it: delivered m0, m2, m1.
        let mut h = sent_ok("m0", 1, g(0));
        h.push(send(2, 1, OpType::Invoke, "m1", g(1)));
        h.push(send(3, 1, OpType::Info, "m1", g(1)));
        h.extend(sent_ok("m2", 1, g(2)));
        h.push(recv(
            5,
            &[("m0", 0, 0, g(0)), ("m2", 0, 1, g(2)), ("m1", 0, 2, g(1))],
        ));
        assert!(order(&h).valid, "{:?}", order(&h));
        // Had m1 been acknowledged, the same deliveries break the group's order.
        let mut h = sent_ok("m0", 1, g(0));
        h.extend(sent_ok("m1", 1, g(1)));
        h.extend(sent_ok("m2", 1, g(2)));
        h.push(recv(
            5,
            &[("m0", 0, 0, g(0)), ("m2", 0, 1, g(2)), ("m1", 0, 2, g(1))],
        ));
        assert_eq!(order(&h).group_order_violations, 2, "{:?}", order(&h));
    }
}
