//! The verdict of a finished run: the checkers over its history, the per-fault
//! availability figures, and the one-line summary. Plain functions of what the
//! run recorded ([`crate::runner`] gathers it).

use serde::Serialize;

use crate::audit::ReplicaAudit;
use crate::availability::{availability, Availability, FaultWindow};
use crate::checker::{order, total_queue, Order, TotalQueue};
use crate::drain::DrainOutcome;
use crate::history::Op;
use crate::nemesis::FaultKind;
use crate::report::quantile;
use crate::runner::{RunOptions, GRACE_MS};

/// A fault as it happened.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    /// What it was.
    pub kind: FaultKind,
    /// When the nemesis began injecting it, ms since the start.
    pub began_ms: u64,
    /// When it was in effect (process killed or paused, rules applied, files
    /// damaged), ms since the start: RTO counts from here.
    pub start_ms: u64,
    /// When it was healed, ms since the start.
    pub end_ms: u64,
    /// Which nodes it hit and how.
    pub detail: String,
    /// The one node it hit (killed, paused, isolated, alone on its side of a
    /// partition), if it hit one.
    pub target: Option<usize>,
    /// Time from its start to the first acknowledged send after it, ms.
    pub rto_ms: Option<u64>,
    /// Acknowledged sends per second from 2 s after it took effect to its heal.
    pub acks_per_s_settled: Option<f64>,
    /// For a fault with a target: acknowledged sends per second through the other
    /// nodes over the same span, over their fault-free rate.
    pub others_ratio: Option<f64>,
    /// For a fault with a target: what the send calls to the other nodes achieved
    /// over the same span.
    pub others_calls: Option<crate::availability::CallStats>,
    /// The producers that spread over every node: their acknowledged rate over
    /// the same span, over their fault-free rate.
    pub spread_ratio: Option<f64>,
    /// The same for the producers pinned to one node each.
    pub pinned_ratio: Option<f64>,
}

/// Everything `results.json` holds.
#[derive(Debug, Clone, Serialize)]
pub struct RunResults {
    /// Seed of the plan.
    pub seed: u64,
    /// Flush mode of the nodes.
    pub flush: String,
    /// Fault kinds drawn from.
    pub nemesis: Vec<FaultKind>,
    /// Sending phase, s.
    pub time_limit_s: u64,
    /// Ops in the history.
    pub ops: usize,
    /// The faults, in order.
    pub faults: Vec<FaultRecord>,
    /// Lost / unexpected / duplicated / recovered.
    pub total_queue: TotalQueue,
    /// Queue offsets and message group order.
    pub order: Order,
    /// FIFO: one message of a group in flight at a time, acks answered OK final.
    pub fifo: crate::fifo::FifoDelivery,
    /// The replica audit (None if it could not be run; see `audit_error`).
    pub replica_audit: Option<ReplicaAudit>,
    /// Why the audit could not be run.
    pub audit_error: Option<String>,
    /// RTO per fault and failures outside faults.
    pub availability: Availability,
    /// Per fault kind: acknowledged sends per second from 2 s after each fault of
    /// that kind took effect until its heal, over the fault-free rate.
    pub throughput_ratio_by_kind: std::collections::BTreeMap<String, f64>,
    /// Per fault kind that hits one node: the same through the other nodes only,
    /// over their fault-free rate (time-weighted over the faults of the kind).
    pub others_ratio_by_kind: std::collections::BTreeMap<String, f64>,
    /// Per fault kind: the spread producers' ratio (time-weighted over its faults).
    pub spread_ratio_by_kind: std::collections::BTreeMap<String, f64>,
    /// Per fault kind: the pinned producers' ratio.
    pub pinned_ratio_by_kind: std::collections::BTreeMap<String, f64>,
    /// The least spread-producer ratio a kind the promise covers may show
    /// ([`crate::availability::promise_covers`]).
    pub availability_bound: f64,
    /// Kinds the promise covers whose spread-producer ratio fell below the bound.
    pub availability_shortfalls: Vec<String>,
    /// Where the drain left the consumer groups: every queue's committed consumer
    /// offset at the queue's end, or the queues short of it (None: no node
    /// answered for the groups' progress).
    pub drain: Option<DrainOutcome>,
    /// Median RTO over the faults after which a send succeeded, ms.
    pub rto_p50_ms: Option<u64>,
    /// 99th percentile RTO, ms.
    pub rto_p99_ms: Option<u64>,
    /// Faults after which no send succeeded before the run ended.
    pub faults_without_recovery: usize,
    /// Nodes that exited without the nemesis killing them (a crash: not a safety
    /// violation by itself, but a finding).
    pub unexpected_exits: Vec<String>,
    /// Under SYNC_FLUSH: followers' logs that reverted (lost entries they had
    /// acknowledged) where no fault damaged stored bytes, a promised fsync not
    /// done; and node logs that could not be read for this check.
    pub sync_reverts: Vec<String>,
    /// After a name-server partition healed, its route did not name the actual
    /// leader again within [`crate::routes::ROUTE_BOUND`] (one line each).
    pub route_findings: Vec<String>,
    /// The run was interrupted (Ctrl-C): results are partial.
    pub interrupted: bool,
    /// Every check passed: nothing lost or unexpected, nothing sent once stored
    /// twice, order kept (FIFO included), replicas agree, no node exited by itself,
    /// (SYNC_FLUSH) no follower's log reverted without damaged bytes, the
    /// availability promise held for every fault kind it covers, the drain
    /// consumed every queue to its end, and the name server's routes named the
    /// leader again after each of its partitions.
    pub valid: bool,
}

impl RunResults {
    /// Adds the findings of the route check ([`crate::routes::route_check`]): any
    /// makes the run invalid.
    pub fn add_route_findings(&mut self, findings: Vec<String>) {
        self.valid &= findings.is_empty();
        self.route_findings.extend(findings);
    }
}

/// Per fault kind: acknowledged throughput from 2 s into its faults (all of that
/// kind together) over the fault-free throughput.
pub fn throughput_ratios(
    faults: &[FaultRecord],
    fault_free_acks_per_s: f64,
) -> std::collections::BTreeMap<String, f64> {
    if fault_free_acks_per_s <= 0.0 {
        return Default::default();
    }
    time_weighted_by_kind(faults, |f| {
        f.acks_per_s_settled.map(|r| r / fault_free_acks_per_s)
    })
}

/// Per fault kind: the mean of `value` over its faults, each weighted by how long
/// it counted (from 2 s after it took effect to its heal); kinds with no value
/// are left out.
pub fn time_weighted_by_kind(
    faults: &[FaultRecord],
    value: impl Fn(&FaultRecord) -> Option<f64>,
) -> std::collections::BTreeMap<String, f64> {
    let mut sums: std::collections::BTreeMap<String, (f64, f64)> = Default::default();
    for f in faults {
        if let Some(v) = value(f) {
            let secs =
                (f.end_ms - f.start_ms).saturating_sub(crate::availability::SETTLE_MS) as f64;
            let e = sums.entry(f.kind.name().to_owned()).or_default();
            e.0 += v * secs;
            e.1 += secs;
        }
    }
    sums.into_iter()
        .filter(|(_, (_, secs))| *secs > 0.0)
        .map(|(k, (sum, secs))| (k, sum / secs))
        .collect()
}

/// Runs the checkers over a finished run.
pub fn evaluate(
    opts: &RunOptions,
    history: &[Op],
    mut faults: Vec<FaultRecord>,
    (replica_audit, audit_error): (Option<ReplicaAudit>, Option<String>),
    (unexpected_exits, sync_reverts): (Vec<String>, Vec<String>),
    drain: Option<DrainOutcome>,
    interrupted: bool,
) -> RunResults {
    let windows: Vec<FaultWindow> = faults
        .iter()
        .map(|f| FaultWindow {
            began_ms: f.began_ms,
            start_ms: f.start_ms,
            end_ms: f.end_ms,
            target: f.target,
        })
        .collect();
    let availability = availability(history, &windows, GRACE_MS);
    for (i, f) in faults.iter_mut().enumerate() {
        f.rto_ms = availability.rto_ms[i];
        f.acks_per_s_settled = availability.acks_per_s_settled[i];
        f.others_ratio = availability.others_ratio_settled[i];
        f.others_calls = availability.others_calls_settled[i];
        f.spread_ratio = availability.spread_ratio_settled[i];
        f.pinned_ratio = availability.pinned_ratio_settled[i];
    }
    let throughput_ratio_by_kind = throughput_ratios(&faults, availability.fault_free_acks_per_s);
    let others_ratio_by_kind = time_weighted_by_kind(&faults, |f| f.others_ratio);
    let spread_ratio_by_kind = time_weighted_by_kind(&faults, |f| f.spread_ratio);
    let pinned_ratio_by_kind = time_weighted_by_kind(&faults, |f| f.pinned_ratio);
    let availability_shortfalls =
        shortfalls(&spread_ratio_by_kind, opts.availability_bound, &faults);
    let mut rtos: Vec<u64> = availability.rto_ms.iter().flatten().copied().collect();
    rtos.sort_unstable();
    let total_queue = total_queue(history);
    let order = order(history);
    let fifo = crate::fifo::fifo_delivery(history, crate::workload::INVISIBLE_S as u64 * 1000);
    let valid = total_queue.valid
        && order.valid
        && fifo.valid
        && replica_audit.as_ref().is_some_and(|a| a.valid)
        && unexpected_exits.is_empty()
        && sync_reverts.is_empty()
        && availability_shortfalls.is_empty()
        && drain.as_ref().is_some_and(|d| d.reached)
        && !interrupted;
    RunResults {
        seed: opts.seed,
        flush: opts.flush.clone(),
        nemesis: opts.kinds.clone(),
        time_limit_s: opts.time_limit_s,
        ops: history.len(),
        faults_without_recovery: availability.rto_ms.iter().filter(|r| r.is_none()).count(),
        rto_p50_ms: quantile(&rtos, 0.5),
        rto_p99_ms: quantile(&rtos, 0.99),
        faults,
        total_queue,
        order,
        fifo,
        replica_audit,
        audit_error,
        availability,
        throughput_ratio_by_kind,
        others_ratio_by_kind,
        spread_ratio_by_kind,
        pinned_ratio_by_kind,
        availability_bound: opts.availability_bound,
        availability_shortfalls,
        drain,
        unexpected_exits,
        sync_reverts,
        route_findings: Vec::new(),
        interrupted,
        valid,
    }
}

/// The kinds the promise covers whose ratio is below `bound`, in words.
///
/// A covered kind with a fault that lasted past [`crate::availability::SETTLE_MS`]
/// but no ratio (no fault-free acknowledgement to compare with) is a shortfall
/// too: a run that never served outside its faults does not pass by default.
pub fn shortfalls(
    ratio_by_kind: &std::collections::BTreeMap<String, f64>,
    bound: f64,
    faults: &[FaultRecord],
) -> Vec<String> {
    let measurable = |k: FaultKind| {
        faults.iter().any(|f| {
            f.kind == k && f.end_ms.saturating_sub(f.start_ms) > crate::availability::SETTLE_MS
        })
    };
    FaultKind::ALL
        .iter()
        .filter(|k| crate::availability::promise_covers(**k))
        .filter_map(|k| {
            let Some(&r) = ratio_by_kind.get(k.name()) else {
                return measurable(*k).then(|| {
                    format!(
                        "{}: not measured (no fault-free acknowledgement to compare with)",
                        k.name()
                    )
                });
            };
            (r < bound).then(|| {
                format!(
                    "{}: the spread producers got {:.0} % of their fault-free throughput from {} ms into it, below {:.0} %",
                    k.name(),
                    r * 100.0,
                    crate::availability::SETTLE_MS,
                    bound * 100.0
                )
            })
        })
        .collect()
}

/// The one-line verdict.
pub fn verdict(r: &RunResults) -> String {
    if r.valid {
        return "valid: nothing lost or unexpected, order kept, replicas agree, no node crashed, availability kept, every queue consumed to its end"
            .into();
    }
    let mut why = Vec::new();
    if r.interrupted {
        why.push("interrupted".to_owned());
    }
    if !r.total_queue.valid {
        why.push(format!(
            "{} lost, {} unexpected, {} stored more often than sent",
            r.total_queue.lost, r.total_queue.unexpected, r.total_queue.duplicate_writes_sent_once
        ));
    }
    if !r.order.valid {
        why.push("order violated".into());
    }
    if !r.fifo.valid {
        why.push(format!(
            "FIFO: {} delivered while the previous was in flight, {} delivered again while in flight, {} delivered after an acknowledged ack",
            r.fifo.delivered_while_previous_in_flight, r.fifo.delivered_again_while_in_flight, r.fifo.redelivered_after_ack
        ));
    }
    match (&r.replica_audit, &r.audit_error) {
        (Some(a), _) if !a.valid => why.push("replicas diverge or lag".into()),
        (None, Some(e)) => why.push(format!("replica audit not run: {e}")),
        _ => {}
    }
    if !r.sync_reverts.is_empty() {
        why.push(format!(
            "{} follower log revert(s) under SYNC_FLUSH with no damaged bytes",
            r.sync_reverts.len()
        ));
    }
    if !r.availability_shortfalls.is_empty() {
        why.push(format!(
            "availability below {:.0} % under {}",
            r.availability_bound * 100.0,
            r.availability_shortfalls
                .iter()
                .map(|s| s.split(':').next().unwrap_or_default())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    match &r.drain {
        Some(d) if !d.reached => why.push(format!(
            "{} queue(s) not consumed to their end after the drain",
            d.short_queues.len()
        )),
        None => why.push("consumer progress could not be read after the drain".into()),
        _ => {}
    }
    if !r.route_findings.is_empty() {
        why.push(format!(
            "the name server's route named a stale leader after {} partition(s) healed",
            r.route_findings.len()
        ));
    }
    if !r.unexpected_exits.is_empty() {
        why.push(format!(
            "{} node(s) exited by themselves",
            r.unexpected_exits.len()
        ));
    }
    format!("INVALID: {}", why.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_covered_kind_below_the_bound_is_a_shortfall_and_others_are_not() {
        let ratios: std::collections::BTreeMap<String, f64> = [
            ("isolate-leader", 0.79),
            ("kill-leader", 0.95),
            // Not covered by the promise: never a shortfall.
            ("pause-leader", 0.01),
            ("kill-majority", 0.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let s = shortfalls(&ratios, 0.8, &[]);
        assert_eq!(s.len(), 1, "{s:?}");
        assert!(s[0].starts_with("isolate-leader: "), "{s:?}");
        assert!(shortfalls(&ratios, 0.7, &[]).is_empty());
        // A covered kind that ran long enough but has no ratio fails too; one
        // whose faults were too short to measure does not.
        let fault = |kind, end_ms| FaultRecord {
            kind,
            began_ms: 0,
            start_ms: 0,
            end_ms,
            detail: String::new(),
            target: None,
            rto_ms: None,
            acks_per_s_settled: None,
            others_ratio: None,
            others_calls: None,
            spread_ratio: None,
            pinned_ratio: None,
        };
        let s = shortfalls(&ratios, 0.7, &[fault(FaultKind::KillRandom, 6_000)]);
        assert_eq!(s.len(), 1, "{s:?}");
        assert!(s[0].starts_with("kill-random: not measured"), "{s:?}");
        assert!(shortfalls(&ratios, 0.7, &[fault(FaultKind::KillRandom, 1_500)]).is_empty());
    }

    #[test]
    fn a_queue_left_short_by_the_drain_or_unreadable_progress_fails_the_run() {
        let opts = RunOptions {
            time_limit_s: 1,
            kinds: vec![],
            seed: 1,
            flush: "sync".into(),
            out_dir: ".".into(),
            warmup_ms: 0,
            fault_ms: 0,
            gap_ms: 0,
            availability_bound: 0.8,
            secure: false,
        };
        let audit = ReplicaAudit {
            valid: true,
            ..Default::default()
        };
        let run = |drain: Option<DrainOutcome>| {
            let r = evaluate(
                &opts,
                &[],
                vec![],
                (Some(audit.clone()), None),
                (vec![], vec![]),
                drain,
                false,
            );
            (r.valid, verdict(&r))
        };
        let reached = DrainOutcome {
            reached: true,
            ..Default::default()
        };
        assert!(run(Some(reached.clone())).0);
        let short = DrainOutcome {
            reached: false,
            short_queues: vec!["G on T#1: consumer offset 9, queue end 10".into()],
            applied_index: Some(5),
        };
        let (valid, v) = run(Some(short));
        assert!(
            !valid && v.contains("1 queue(s) not consumed to their end"),
            "{v}"
        );
        let (valid, v) = run(None);
        assert!(
            !valid && v.contains("consumer progress could not be read"),
            "{v}"
        );
        let mut r = evaluate(
            &opts,
            &[],
            vec![],
            (Some(audit.clone()), None),
            (vec![], vec![]),
            Some(reached.clone()),
            false,
        );
        r.add_route_findings(vec![]);
        assert!(r.valid);
        r.add_route_findings(vec!["stale".into()]);
        assert!(
            !r.valid && verdict(&r).contains("stale leader"),
            "{}",
            verdict(&r)
        );
    }
}
