//! The availability checker: per fault, the time to the first acknowledgement
//! after it took effect (RTO), failed sends outside fault windows, and acknowledged
//! throughput from [`SETTLE_MS`] into each fault against the fault-free rate, over
//! all nodes and, for a fault that hit one node, through the other nodes.
//! Plain functions of the history: no I/O.

use serde::Serialize;

use crate::history::{acked_sends, Op, OpFn, OpType};

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
    /// The fault-free rate of the producers that spread over every node.
    pub spread_fault_free_acks_per_s: f64,
    /// Per fault: the same producers' rate from [`SETTLE_MS`] after it took effect
    /// until its heal, over their fault-free rate (what a client that knows every
    /// node sees; the promise is stated for these).
    pub spread_ratio_settled: Vec<Option<f64>>,
    /// Per fault: the same for the producers pinned to one node each (a pinned
    /// producer whose node is down can do nothing until it returns).
    pub pinned_ratio_settled: Vec<Option<f64>>,
    /// Per producer, the longest time without an acknowledgement during the
    /// sending phase, longest first.
    pub longest_gaps: Vec<ProducerGap>,
}

/// One producer's longest time without an acknowledged send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ProducerGap {
    /// The producer's process.
    pub process: u64,
    /// Its one node, if it is pinned to one.
    pub pinned_to: Option<usize>,
    /// The gap, ms.
    pub gap_ms: u64,
    /// When it began (its last ack before it, or the start of sending), ms.
    pub from_ms: u64,
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

/// The availability the product promises (issue 13): from [`SETTLE_MS`] after a
/// single-node partition or kill took effect, clients that know every node get
/// at least this fraction of the fault-free acknowledged throughput.
pub const PROMISED_RATIO: f64 = 0.8;

/// Whether the promise covers `kind`: faults that partition or stop one node
/// while the other two keep a quorum. Not covered: a paused leader and the
/// clients cut from the leader (either way the clients' calls to it are neither
/// answered nor refused, so each waits out its call timeout there: the other
/// nodes serve every call they get, which `others_calls` shows), faults that
/// take a quorum away (kill-majority, power-loss-all) or hit two nodes
/// (majorities-ring, power-loss-partitioned), clock, disk and corruption faults.
/// Kinds this list does not name are not covered.
pub fn promise_covers(kind: crate::nemesis::FaultKind) -> bool {
    use crate::nemesis::FaultKind as K;
    matches!(
        kind,
        K::PartitionHalves
            | K::IsolateLeader
            | K::OneWay
            | K::KillLeader
            | K::KillRandom
            | K::PowerLoss
            | K::CorruptTail
            | K::TerminateLeader
            | K::QuickRestart
    )
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
    let by_kind = |pinned: bool| {
        let sends: Vec<Op> = ops
            .iter()
            .filter(|o| o.f == OpFn::Send && o.pinned_to.is_some() == pinned)
            .cloned()
            .collect();
        let times: Vec<u64> = acked_sends(&sends).iter().map(|(_, t, _)| *t).collect();
        let (calm, settled) = throughput(ops, &times, faults, grace_ms);
        let ratios = settled
            .into_iter()
            .map(|r| Some(r? / calm).filter(|r| r.is_finite()))
            .collect::<Vec<_>>();
        (calm, ratios)
    };
    let (spread_fault_free_acks_per_s, spread_ratio_settled) = by_kind(false);
    let (_, pinned_ratio_settled) = by_kind(true);
    Availability {
        rto_ms,
        failures_outside_faults,
        fault_free_acks_per_s,
        acks_per_s_settled,
        others_ratio_settled,
        others_calls_settled,
        spread_fault_free_acks_per_s,
        spread_ratio_settled,
        pinned_ratio_settled,
        longest_gaps: longest_gaps(ops),
    }
}

/// Per producer: the longest span of the sending phase (from the first send
/// invoked by any producer to the last) without an acknowledgement of its sends.
pub fn longest_gaps(ops: &[Op]) -> Vec<ProducerGap> {
    let sends: Vec<&Op> = ops.iter().filter(|o| o.f == OpFn::Send).collect();
    let invokes = sends.iter().filter(|o| o.op_type == OpType::Invoke);
    let (first, last) = invokes.fold((u64::MAX, 0), |(a, b), o| {
        (a.min(o.time_ms), b.max(o.time_ms))
    });
    let mut acks: std::collections::BTreeMap<u64, (Option<usize>, Vec<u64>)> = Default::default();
    for o in &sends {
        let e = acks.entry(o.process).or_insert((o.pinned_to, Vec::new()));
        if o.op_type == OpType::Ok {
            e.1.push(o.time_ms);
        }
    }
    let mut gaps: Vec<ProducerGap> = acks
        .into_iter()
        .map(|(process, (pinned_to, mut times))| {
            times.retain(|t| (first..=last).contains(t));
            times.sort_unstable();
            let mut edges = vec![first];
            edges.extend(times);
            edges.push(last);
            let (gap_ms, from_ms) = edges
                .windows(2)
                .map(|w| (w[1] - w[0], w[0]))
                .max()
                .unwrap_or((0, first));
            ProducerGap {
                process,
                pinned_to,
                gap_ms,
                from_ms,
            }
        })
        .collect();
    gaps.sort_by_key(|g| std::cmp::Reverse(g.gap_ms));
    gaps
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
    use crate::history::send_op as send;

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
    fn spread_and_pinned_producers_are_measured_apart_with_each_ones_longest_gap() {
        // Producer 1 spreads over nodes 0..3 and is refused by node 2 while it is
        // down [10 s, 20 s), then acked by the next node 10 ms later; producer 2
        // is pinned to node 2 and gets nothing while it is down.
        let mut h = Vec::new();
        for i in 0..300u64 {
            let t = i * 100;
            let down = (10_000..20_000).contains(&t);
            let spread = (i % 3) as usize;
            let id = format!("s{i}");
            let mut ops = vec![(t, spread, OpType::Invoke), (t + 5, spread, OpType::Ok)];
            if down && spread == 2 {
                ops = vec![
                    (t, 2, OpType::Invoke),
                    (t + 5, 2, OpType::Fail),
                    (t + 5, 0, OpType::Invoke),
                    (t + 10, 0, OpType::Ok),
                ];
            }
            for (time, node, ty) in ops {
                let mut o = send(time, 1, ty, &id, None);
                o.node = Some(node);
                h.push(o);
            }
            let id = format!("p{i}");
            let outcome = if down { OpType::Fail } else { OpType::Ok };
            for (time, ty) in [(t, OpType::Invoke), (t + 5, outcome)] {
                let mut o = send(time, 2, ty, &id, None);
                (o.node, o.pinned_to) = (Some(2), Some(2));
                h.push(o);
            }
        }
        let fault = FaultWindow {
            began_ms: 10_000,
            start_ms: 10_000,
            end_ms: 20_000,
            target: Some(2),
        };
        let a = availability(&h, &[fault], 0);
        let spread = a.spread_ratio_settled[0].unwrap();
        assert!((spread - 1.0).abs() < 0.05, "{spread}");
        assert_eq!(a.pinned_ratio_settled, vec![Some(0.0)]);
        assert!((a.spread_fault_free_acks_per_s - 10.0).abs() < 0.5);
        // The pinned producer's last ack before the fault was at 9,905 ms, its
        // next at 20,005 ms; the spread one waited at most 105 ms (a retry on the
        // next node; the latest such wait began at 19,605 ms).
        let gaps: Vec<(u64, Option<usize>, u64, u64)> = a
            .longest_gaps
            .iter()
            .map(|g| (g.process, g.pinned_to, g.gap_ms, g.from_ms))
            .collect();
        assert_eq!(
            gaps,
            vec![(2, Some(2), 10_100, 9_905), (1, None, 105, 19_605)]
        );
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
