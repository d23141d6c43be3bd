//! One run: hosts, cluster, workload, nemesis, audit, checkers and the run folder
//! (`history.jsonl`, `results.json`, `report.html`, node logs and stores).
//!
//! The nemesis runs on the calling thread (which also starts every node, so a
//! node's parent-death signal fires only when the harness dies); the workload runs
//! on a thread inside the clients' namespace. Faults come one at a time from the
//! seeded plan ([`crate::nemesis::plan`]); after the last one everything is healed
//! and the workload's consumers drain.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::Serialize;

use crate::audit::{self, ReplicaAudit};
use crate::availability::{availability, Availability, FaultWindow};
use crate::checker::{order, total_queue, Order, TotalQueue};
use crate::faults::{inject, leader, undo};
use crate::history::{write_jsonl, Op};
use crate::hosts::Network;
use crate::nemesis::{plan, FaultKind, Grudge};
use crate::net::NS_PREFIX;
use crate::procs::{client_addr, Cluster, CLIENT_HOST, HOSTS, NODES};
use crate::report::{self, quantile, Shade};
use crate::workload::{in_namespace, Recorder, WorkloadOptions};
use crate::JepsenError;

/// What to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Length of the workload's sending phase, s (faults happen inside it).
    pub time_limit_s: u64,
    /// Fault kinds to draw from.
    pub kinds: Vec<FaultKind>,
    /// Seed of the fault plan and of the faults' targets.
    pub seed: u64,
    /// `sync` or `async` flush on the nodes.
    pub flush: String,
    /// Where the run folder is created.
    pub out_dir: PathBuf,
    /// Calm before the first fault, ms.
    pub warmup_ms: u64,
    /// Length of each fault, ms.
    pub fault_ms: u64,
    /// Calm after each fault, ms.
    pub gap_ms: u64,
}

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
    /// The run was interrupted (Ctrl-C): results are partial.
    pub interrupted: bool,
    /// No safety violation: nothing lost or unexpected, nothing sent once stored
    /// twice, order kept (FIFO included), replicas agree, no node exited by itself,
    /// and (SYNC_FLUSH) no follower's log reverted without damaged bytes.
    pub valid: bool,
}

/// Ms after a heal that still count as the fault's (restart and catch-up).
pub const GRACE_MS: u64 = 5_000;

/// A run's outcome: its folder and results.
pub struct RunOutcome {
    /// The run folder.
    pub dir: PathBuf,
    /// The findings.
    pub results: RunResults,
}

/// Sleeps until `t_ms` on the recorder's clock; false if interrupted meanwhile.
fn sleep_until(rec: &Recorder, t_ms: u64, stop: &AtomicBool) -> bool {
    loop {
        // One reading of the clock: it may pass `t_ms` between two readings.
        let left = t_ms.saturating_sub(rec.now_ms());
        if left == 0 {
            break;
        }
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(left.min(50)));
    }
    !stop.load(Ordering::Relaxed)
}

/// Waits for a leader and creates the workload's topics and groups.
fn prepare(c: &Cluster, net: &Network) -> Result<(), JepsenError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while leader(c, net).is_none() {
        if Instant::now() > deadline {
            return Err(JepsenError::Host("no leader within 60 s".into()));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    for args in [
        &["updateTopic", "-t", "JNormal", "-q", "4"][..],
        &["updateTopic", "-t", "JFifo", "-q", "4", "--fifo"],
        &["updateSubGroup", "-g", "JGroup"],
        &["updateSubGroup", "-g", "JFifoGroup", "--fifo"],
    ] {
        let mut tries = 0;
        while let Err(e) = c.admin(net, args) {
            tries += 1;
            if tries > 20 {
                return Err(e);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    Ok(())
}

/// Runs the test; `stop` interrupts it (results are then partial). The hosts and
/// processes are removed before this returns, whatever happened.
pub fn run(opts: &RunOptions, stop: Arc<AtomicBool>) -> Result<RunOutcome, JepsenError> {
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
    let dir = opts
        .out_dir
        .join(format!("jepsen-{stamp}-seed{}-{}", opts.seed, opts.flush));
    std::fs::create_dir_all(&dir)?;
    // Namespaces of this run: `lmqj-<pid>-...`, so runs side by side do not meet;
    // those of killed runs go first.
    crate::hosts::remove_orphans(NS_PREFIX)?;
    let net = Network::create(&format!("{NS_PREFIX}{}-", std::process::id()), HOSTS)?;
    let mut c = Cluster::start(&net, &dir, &opts.flush)?;
    prepare(&c, &net)?;
    let nodes: Vec<String> = (0..NODES).map(client_addr).collect();
    let rec = Recorder::new();
    let time_limit_ms = opts.time_limit_s * 1000;
    let faults = plan(
        opts.seed,
        &opts.kinds,
        time_limit_ms,
        opts.warmup_ms,
        opts.fault_ms,
        opts.gap_ms,
    );
    let wl = WorkloadOptions {
        nodes: nodes.clone(),
        topic: "JNormal".into(),
        fifo_topic: "JFifo".into(),
        group: "JGroup".into(),
        fifo_group: "JFifoGroup".into(),
        producers: 3,
        fifo_producers: 3,
        consumers: 3,
        duration: Duration::from_millis(time_limit_ms),
        drain: Duration::from_secs(300),
        quiet: Duration::from_secs(20),
        settle: Duration::from_secs(5),
        call_timeout: Duration::from_secs(5),
        send_interval: Duration::from_millis(5),
        fifo_send_interval: Duration::from_millis(50),
        stop: stop.clone(),
    };
    let (ns, wl_rec) = (net.host_ns(CLIENT_HOST), rec.clone());
    let workload = std::thread::spawn(move || {
        in_namespace(&ns, move || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(JepsenError::Io)?
                .block_on(crate::workload::run(wl, wl_rec))
        })
    });
    let mut rng = StdRng::seed_from_u64(opts.seed ^ 0x5eed);
    let mut done: Vec<FaultRecord> = Vec::new();
    let mut nemesis_error = None;
    let mut unexpected_exits: Vec<String> = Vec::new();
    for f in &faults {
        if !sleep_until(&rec, f.start_ms, &stop) {
            break;
        }
        let began_ms = rec.now_ms();
        let (u, detail, target) = match inject(f.kind, &mut rng, f.pick, &mut c, &net, &dir) {
            Ok(x) => x,
            Err(e) => {
                nemesis_error = Some(format!("{}: {e}", f.kind.name()));
                break;
            }
        };
        // The fault is in effect from here (finding the leader and applying rules
        // took time; sends acknowledged meanwhile say nothing about recovery).
        let start_ms = rec.now_ms();
        eprintln!(
            "[{:>7.1}s] {}: {detail}",
            start_ms as f64 / 1000.0,
            f.kind.name()
        );
        sleep_until(&rec, start_ms + f.duration_ms, &stop);
        if let Err(e) = undo(u, &mut c, &net) {
            nemesis_error = Some(format!("healing {}: {e}", f.kind.name()));
            break;
        }
        let end_ms = rec.now_ms();
        eprintln!("[{:>7.1}s] healed", end_ms as f64 / 1000.0);
        for why in c.take_findings() {
            eprintln!("[{:>7.1}s] {why}", end_ms as f64 / 1000.0);
            unexpected_exits.push(why);
        }
        for n in 0..NODES {
            if let Some(status) = c.exited(n) {
                let why =
                    format!("node {n} exited by itself ({status}) by {end_ms} ms; see n{n}.log");
                eprintln!("[{:>7.1}s] {why}; restarting it", end_ms as f64 / 1000.0);
                unexpected_exits.push(why);
                if let Err(e) = c.restart(&net, n) {
                    nemesis_error = Some(format!("restarting node {n}: {e}"));
                }
            }
        }
        done.push(FaultRecord {
            kind: f.kind,
            began_ms,
            start_ms,
            end_ms,
            detail,
            target,
            rto_ms: None,
            acks_per_s_settled: None,
            others_ratio: None,
            others_calls: None,
        });
    }
    // Heal everything: network, paused and stopped nodes. A network left cut would
    // turn the drain's misses into false losses.
    if let Err(e) = net.apply(&Grudge::new()) {
        nemesis_error.get_or_insert(format!("healing the network: {e}"));
    }
    for n in 0..NODES {
        let _ = c.signal(n, "CONT");
        if let Some(status) = c.exited(n) {
            unexpected_exits.push(format!(
                "node {n} exited by itself ({status}); see n{n}.log"
            ));
        }
        if !c.is_running(n) {
            c.restart(&net, n)?;
        }
    }
    if let Some(e) = nemesis_error {
        stop.store(true, Ordering::Relaxed);
        let _ = workload.join();
        return Err(JepsenError::Host(format!("nemesis failed: {e}")));
    }
    let history = workload
        .join()
        .map_err(|_| JepsenError::Host("the workload thread panicked".into()))???;
    let interrupted = stop.load(Ordering::Relaxed);
    let (replica_audit, audit_error) = if interrupted {
        (None, Some("interrupted".to_owned()))
    } else {
        eprintln!(
            "[{:>7.1}s] workload done; auditing replicas",
            rec.now_ms() as f64 / 1000.0
        );
        let nodes2 = nodes.clone();
        let views = in_namespace(&net.host_ns(CLIENT_HOST), move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(JepsenError::Io)?
                .block_on(async {
                    audit::settle(&nodes2, Duration::from_secs(60)).await;
                    audit::fetch(&nodes2).await
                })
        })?;
        match views {
            Ok(v) => (Some(audit::check(&v)), None),
            Err(e) => (None, Some(e.to_string())),
        }
    };
    // Crashes during the drain and the audit count too.
    unexpected_exits.extend(c.take_findings());
    for n in 0..NODES {
        if let Some(status) = c.exited(n) {
            unexpected_exits.push(format!(
                "node {n} exited by itself ({status}) after the last heal; see n{n}.log"
            ));
        }
    }
    drop(c);
    drop(net);
    let sync_reverts = if opts.flush == "sync" {
        sync_reverts(&dir, rec.start_unix_ms(), &done)
    } else {
        Vec::new()
    };
    let results = evaluate(
        opts,
        &history,
        done,
        (replica_audit, audit_error),
        (unexpected_exits, sync_reverts),
        interrupted,
    );
    write_outputs(&dir, &history, &results)?;
    Ok(RunOutcome { dir, results })
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

/// The follower log reverts in the nodes' logs (`dir/nI.log`) that no fault
/// damaging stored bytes explains ([`crate::reverts`]); a log that cannot be
/// read is a finding too. `start_unix_ms`: the run clock's start.
fn sync_reverts(dir: &Path, start_unix_ms: i64, done: &[FaultRecord]) -> Vec<String> {
    let mut reverts = Vec::new();
    let mut unreadable = Vec::new();
    for n in 0..NODES {
        let path = dir.join(format!("n{n}.log"));
        match std::fs::read_to_string(&path) {
            Ok(log) => reverts.extend(
                crate::reverts::revert_times(&log)
                    .into_iter()
                    .map(|t| (n, t.map(|t| t - start_unix_ms))),
            ),
            Err(e) => unreadable.push(format!(
                "{}: {e}; its reverts were not checked",
                path.display()
            )),
        }
    }
    let faults: Vec<(FaultKind, u64, u64)> = done
        .iter()
        .map(|f| (f.kind, f.began_ms, f.end_ms))
        .collect();
    unreadable.extend(crate::reverts::unexplained(&reverts, &faults));
    unreadable
}

/// Runs the checkers over a finished run.
pub fn evaluate(
    opts: &RunOptions,
    history: &[Op],
    mut faults: Vec<FaultRecord>,
    (replica_audit, audit_error): (Option<ReplicaAudit>, Option<String>),
    (unexpected_exits, sync_reverts): (Vec<String>, Vec<String>),
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
    }
    let throughput_ratio_by_kind = throughput_ratios(&faults, availability.fault_free_acks_per_s);
    let others_ratio_by_kind = time_weighted_by_kind(&faults, |f| f.others_ratio);
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
        unexpected_exits,
        sync_reverts,
        interrupted,
        valid,
    }
}

/// The one-line verdict.
pub fn verdict(r: &RunResults) -> String {
    if r.valid {
        return "valid: nothing lost or unexpected, order kept, replicas agree, no node crashed"
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
            "FIFO: {} delivered while the previous was in flight, {} delivered after an acknowledged ack",
            r.fifo.delivered_while_previous_in_flight, r.fifo.redelivered_after_ack
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
    if !r.unexpected_exits.is_empty() {
        why.push(format!(
            "{} node(s) exited by themselves",
            r.unexpected_exits.len()
        ));
    }
    format!("INVALID: {}", why.join("; "))
}

fn write_outputs(dir: &Path, history: &[Op], r: &RunResults) -> Result<(), JepsenError> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(dir.join("history.jsonl"))?);
    write_jsonl(&mut f, history)?;
    let json = serde_json::to_string_pretty(r).map_err(|e| JepsenError::History(e.to_string()))?;
    std::fs::write(dir.join("results.json"), &json)?;
    let shades: Vec<Shade> = r
        .faults
        .iter()
        .map(|f| Shade {
            start_ms: f.began_ms,
            end_ms: f.end_ms,
            label: format!("{}: {}", f.kind.name(), f.detail),
        })
        .collect();
    let title = format!(
        "LedgerMQ jepsen run: seed {}, flush {}, {} s",
        r.seed, r.flush, r.time_limit_s
    );
    let page = report::html(
        &title,
        &verdict(r),
        &json,
        &report::timeline(history),
        &shades,
    );
    std::fs::write(dir.join("report.html"), page)?;
    Ok(())
}
