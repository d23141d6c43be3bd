//! Checkers over a history (see `jepsen-notes.md` for the reference definitions).
//! Plain functions of the history: no I/O.
//!
//! - [`total_queue`] (Jepsen's total-queue): lost = acknowledged, never received;
//!   unexpected = received, never sent or sent with a definite failure; duplicated; recovered = unknown send that
//!   arrived. Valid only when nothing is lost or unexpected.
//! - [`order`]: per message queue, one queue offset never holds two messages and the
//!   offsets delivered have no gaps; per message group, deliveries follow the send
//!   order (a redelivery may repeat the latest message, never go back).
//! - [`availability`]: time from each fault taking effect (`start_ms`) to the first
//!   acknowledgement of a send invoked after that (RTO), and failed sends outside fault windows.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use crate::history::{acked_sends, send_outcomes, Op, OpFn, OpType};

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
    /// A few lost values.
    pub lost_examples: Vec<String>,
    /// A few unexpected values.
    pub unexpected_examples: Vec<String>,
    /// Nothing lost and nothing unexpected.
    pub valid: bool,
}

fn deliveries(ops: &[Op]) -> impl Iterator<Item = &crate::history::Delivered> {
    ops.iter()
        .filter(|o| o.f == OpFn::Receive && o.op_type == OpType::Ok)
        .flat_map(|o| o.delivered.iter())
}

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
    TotalQueue {
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
        valid: lost.is_empty() && unexpected.is_empty(),
    }
}

/// Findings of the order checker.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Order {
    /// Queue offsets that delivered two different values.
    pub inconsistent_offsets: usize,
    /// Offsets missing between the lowest and highest offset delivered per queue.
    pub offset_gaps: usize,
    /// Deliveries of a message group that went back to an earlier message, or
    /// skipped an acknowledged one.
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
    let mut last: HashMap<&str, u64> = HashMap::new();
    for d in deliveries(ops) {
        let (Some(g), Some(seq)) = (d.group.as_deref(), d.seq) else {
            continue;
        };
        if let Some(&prev) = last.get(g) {
            let skipped = acked
                .get(g)
                .is_some_and(|a| a.range(prev + 1..seq.max(prev + 1)).next().is_some());
            if seq < prev || skipped {
                r.group_order_violations += 1;
                note(&mut r, format!("group {g}: {seq} delivered after {prev}"));
            }
        } else if acked
            .get(g)
            .is_some_and(|a| a.range(..seq).next().is_some())
        {
            r.group_order_violations += 1;
            note(
                &mut r,
                format!("group {g}: first delivery is {seq}, an earlier acked message was skipped"),
            );
        }
        let e = last.entry(g).or_insert(seq);
        *e = (*e).max(seq);
    }
    r.valid = r.inconsistent_offsets == 0 && r.offset_gaps == 0 && r.group_order_violations == 0;
    r
}

/// A fault's window, ms since the run started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FaultWindow {
    /// When its injection began (failures from here on are the fault's).
    pub began_ms: u64,
    /// When it was in effect (RTO counts from here).
    pub start_ms: u64,
    /// When it was healed.
    pub end_ms: u64,
    /// The one node it hit (killed, paused, isolated, alone on its side), if it
    /// hit one: calls through the other nodes are measured apart.
    pub target: Option<usize>,
}

/// Availability findings.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Availability {
    /// Per fault: ms from its start to the first acknowledgement of a send invoked after it (None if
    /// none was).
    pub rto_ms: Vec<Option<u64>>,
    /// Sends that failed or timed out outside every fault window (a grace period after
    /// each heal included).
    pub failures_outside_faults: usize,
    /// Acknowledged sends per second outside every fault window (grace included),
    /// over the sending phase: the fault-free throughput.
    pub fault_free_acks_per_s: f64,
    /// Per fault: acknowledged sends per second from [`SETTLE_MS`] after it took
    /// effect until its heal (None when it lasted no longer than that).
    pub acks_per_s_settled: Vec<Option<f64>>,
    /// Per fault that hit one node: acknowledged sends per second through the
    /// other nodes from [`SETTLE_MS`] after it took effect until its heal, over
    /// their fault-free rate (None when it hit no single node, lasted no longer
    /// than [`SETTLE_MS`], or no ack recorded its node).
    pub others_ratio_settled: Vec<Option<f64>>,
    /// Per fault that hit one node: the send calls made to the other nodes from
    /// [`SETTLE_MS`] after it took effect until its heal (what they achieve while
    /// clients also wait on the node that was hit).
    pub others_calls_settled: Vec<Option<CallStats>>,
}

/// What a set of send calls achieved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CallStats {
    /// Calls invoked in the span.
    pub calls: usize,
    /// Of those, acknowledged.
    pub acked: usize,
    /// Median latency of the acknowledged ones, ms.
    pub p50_ms: Option<u64>,
    /// 99th percentile latency of the acknowledged ones, ms.
    pub p99_ms: Option<u64>,
}

/// The send calls invoked in `[from_ms, to_ms)` to a node other than `target`.
fn calls_to_others(
    attempts: &[(u64, u64, Option<usize>, OpType)],
    target: usize,
    from_ms: u64,
    to_ms: u64,
) -> CallStats {
    let mut latencies = Vec::new();
    let mut calls = 0;
    for &(t0, t, node, outcome) in attempts {
        if (from_ms..to_ms).contains(&t0) && node.is_some_and(|n| n != target) {
            calls += 1;
            if outcome == OpType::Ok {
                latencies.push(t - t0);
            }
        }
    }
    latencies.sort_unstable();
    CallStats {
        calls,
        acked: latencies.len(),
        p50_ms: crate::report::quantile(&latencies, 0.5),
        p99_ms: crate::report::quantile(&latencies, 0.99),
    }
}

/// How long after a fault takes effect its throughput starts to count (issue 13:
/// "from 2 s after a single-node partition or kill begins").
pub const SETTLE_MS: u64 = 2_000;

/// Runs the availability checker. `grace_ms` after each heal still counts as the
/// fault (the cluster settles).
pub fn availability(ops: &[Op], faults: &[FaultWindow], grace_ms: u64) -> Availability {
    let acked = acked_sends(ops);
    // A send invoked before the fault says nothing about recovering from it.
    let rto_ms = faults
        .iter()
        .map(|f| {
            acked
                .iter()
                .filter(|(t0, _, _)| *t0 >= f.start_ms)
                .map(|(_, t, _)| *t)
                .min()
                .map(|t| t - f.start_ms)
        })
        .collect();
    let in_fault = |t: u64| {
        faults
            .iter()
            .any(|f| t >= f.began_ms && t <= f.end_ms + grace_ms)
    };
    let failures_outside_faults = ops
        .iter()
        .filter(|o| o.f == OpFn::Send && matches!(o.op_type, OpType::Fail | OpType::Info))
        .filter(|o| !in_fault(o.time_ms))
        .count();
    let ack_times: Vec<u64> = acked.iter().map(|(_, t, _)| *t).collect();
    let (fault_free_acks_per_s, acks_per_s_settled) = throughput(ops, &ack_times, faults, grace_ms);
    let others_ratio_settled = faults
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let target = f.target?;
            let others: Vec<u64> = acked
                .iter()
                .filter(|(_, _, n)| n.is_some_and(|n| n != target))
                .map(|(_, t, _)| *t)
                .collect();
            let (calm, settled) = throughput(ops, &others, faults, grace_ms);
            Some(settled[i]? / calm).filter(|r| r.is_finite())
        })
        .collect();
    let attempts = crate::history::send_attempts(ops);
    let others_calls_settled = faults
        .iter()
        .map(|f| {
            let from = f.start_ms + SETTLE_MS;
            let target = f.target.filter(|_| f.end_ms > from)?;
            Some(calls_to_others(&attempts, target, from, f.end_ms))
        })
        .collect();
    Availability {
        rto_ms,
        failures_outside_faults,
        fault_free_acks_per_s,
        acks_per_s_settled,
        others_ratio_settled,
        others_calls_settled,
    }
}

/// Acknowledgements per second outside the fault windows (each widened by
/// `grace_ms` after its heal) over the sending phase, and per fault from
/// [`SETTLE_MS`] after it took effect to its heal.
fn throughput(
    ops: &[Op],
    ack_times: &[u64],
    faults: &[FaultWindow],
    grace_ms: u64,
) -> (f64, Vec<Option<f64>>) {
    let sends = ops.iter().filter(|o| o.f == OpFn::Send).map(|o| o.time_ms);
    let (first, last) = sends.fold((u64::MAX, 0), |(a, b), t| (a.min(t), b.max(t)));
    let per_s = |n: usize, ms: u64| n as f64 * 1000.0 / ms as f64;
    let in_fault = |t: u64| {
        faults
            .iter()
            .any(|f| t >= f.began_ms && t <= f.end_ms + grace_ms)
    };
    // The sending phase less the union of the fault windows within it.
    let mut windows: Vec<(u64, u64)> = faults
        .iter()
        .map(|f| (f.began_ms.max(first), (f.end_ms + grace_ms).min(last)))
        .filter(|(a, b)| a < b)
        .collect();
    windows.sort_unstable();
    let (mut faulty_ms, mut covered_to) = (0, 0);
    for (a, b) in windows {
        let a = a.max(covered_to);
        if b > a {
            faulty_ms += b - a;
            covered_to = b;
        }
    }
    let calm_ms = last.saturating_sub(first).saturating_sub(faulty_ms);
    let calm_acks = ack_times.iter().filter(|&&t| !in_fault(t)).count();
    let fault_free = if calm_ms == 0 {
        0.0
    } else {
        per_s(calm_acks, calm_ms)
    };
    let settled = faults
        .iter()
        .map(|f| {
            let from = f.start_ms + SETTLE_MS;
            (f.end_ms > from).then(|| {
                let n = ack_times
                    .iter()
                    .filter(|&&t| t >= from && t < f.end_ms)
                    .count();
                per_s(n, f.end_ms - from)
            })
        })
        .collect();
    (fault_free, settled)
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
        // Going back to m0 after m2 is not.
        h.push(recv(6, &[("m0", 0, 0, g(0))]));
        let r = order(&h);
        assert_eq!(r.group_order_violations, 1);
        // Another value at offset 1, and offset 4 without 3.
        h.push(recv(7, &[("x", 0, 1, None), ("y", 0, 4, None)]));
        let r = order(&h);
        assert_eq!((r.inconsistent_offsets, r.offset_gaps), (1, 1));
        assert!(!r.valid);
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
    fn throughput_is_measured_outside_faults_and_from_two_seconds_into_each() {
        let mut h = Vec::new();
        // 10 acks/s for 20 s, except 2 acks/s from 2 s into the fault [5 s, 11 s].
        for i in 0..200u64 {
            let t = i * 100;
            let settled = (7_000..11_000).contains(&t);
            if settled && i % 5 != 0 {
                continue;
            }
            let id = format!("m{i}");
            h.push(send(t, i, OpType::Invoke, &id, None));
            h.push(send(t + 10, i, OpType::Ok, &id, None));
        }
        let faults = [FaultWindow {
            began_ms: 4_900,
            start_ms: 5_000,
            end_ms: 11_000,
            target: None,
        }];
        let a = availability(&h, &faults, 1_000);
        let rate = a.acks_per_s_settled[0].unwrap();
        assert!((rate - 2.0).abs() < 0.3, "{rate}");
        assert!(
            (a.fault_free_acks_per_s - 10.0).abs() < 0.5,
            "{}",
            a.fault_free_acks_per_s
        );
    }

    #[test]
    fn calls_through_the_other_nodes_are_measured_apart_from_the_fault_target() {
        // 10 acks/s spread over 3 nodes for 30 s; while node 2 is down [10 s, 20 s]
        // its calls fail and the others go on.
        let mut h = Vec::new();
        for i in 0..300u64 {
            let (t, node) = (i * 100, (i % 3) as usize);
            let id = format!("m{i}");
            let down = node == 2 && (10_000..20_000).contains(&t);
            let outcome = if down { OpType::Fail } else { OpType::Ok };
            for mut o in [
                send(t, i, OpType::Invoke, &id, None),
                send(t + 10, i, outcome, &id, None),
            ] {
                o.node = Some(node);
                h.push(o);
            }
        }
        let fault = |target| FaultWindow {
            began_ms: 10_000,
            start_ms: 10_000,
            end_ms: 20_000,
            target,
        };
        let a = availability(&h, &[fault(Some(2))], 0);
        let all = a.acks_per_s_settled[0].unwrap() / a.fault_free_acks_per_s;
        assert!((all - 2.0 / 3.0).abs() < 0.05, "{all}");
        let others = a.others_ratio_settled[0].unwrap();
        assert!((others - 1.0).abs() < 0.05, "{others}");
        // No target, no separate figure; a wrong target shows the loss.
        assert_eq!(
            availability(&h, &[fault(None)], 0).others_ratio_settled,
            vec![None]
        );
        let wrong = availability(&h, &[fault(Some(0))], 0).others_ratio_settled[0].unwrap();
        assert!(wrong < 0.6, "{wrong}");
        // 8 s from 12 s: 80 calls, 54 to nodes 0 and 1, all acked in 10 ms.
        let calls = a.others_calls_settled[0].unwrap();
        assert_eq!((calls.calls, calls.acked), (54, 54), "{calls:?}");
        assert_eq!((calls.p50_ms, calls.p99_ms), (Some(10), Some(10)));
        let via_0 = availability(&h, &[fault(Some(0))], 0).others_calls_settled[0].unwrap();
        assert_eq!((via_0.calls, via_0.acked), (53, 27), "{via_0:?}");
    }

    #[test]
    fn availability_measures_rto_and_failures_outside_faults() {
        let h = vec![
            send(100, 1, OpType::Invoke, "a", None),
            send(110, 1, OpType::Ok, "a", None),
            send(1000, 1, OpType::Invoke, "b", None),
            send(1500, 1, OpType::Info, "b", None),
            send(1600, 1, OpType::Invoke, "c", None),
            send(2300, 1, OpType::Ok, "c", None),
            send(9000, 1, OpType::Invoke, "d", None),
            send(9100, 1, OpType::Fail, "d", None),
            send(5000, 3, OpType::Invoke, "f", None),
            send(5100, 3, OpType::Info, "f", None),
            // Invoked before the first fault: acknowledged during it, but no RTO.
            send(950, 2, OpType::Invoke, "e", None),
            send(1010, 2, OpType::Ok, "e", None),
        ];
        let faults = [
            FaultWindow {
                began_ms: 900,
                start_ms: 1000,
                end_ms: 3000,
                target: None,
            },
            FaultWindow {
                began_ms: 9050,
                start_ms: 9500,
                end_ms: 9600,
                target: None,
            },
        ];
        let a = availability(&h, &faults, 500);
        assert_eq!(a.rto_ms, vec![Some(1300), None]);
        // The second fault lasted under 2 s; the first had no ack from 2 s on.
        assert_eq!(a.acks_per_s_settled, vec![None, None]);
        // "f" failed in the calm; "d" after the second fault began, before it was
        // in effect: that one is the fault's.
        assert_eq!(a.failures_outside_faults, 1);
    }
}
