//! One run: hosts, cluster, workload, nemesis, audit, checkers and the run folder
//! (`history.jsonl`, `results.json`, `roles.json`, `report.html`, node logs and
//! stores).
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

use crate::access::Access;
use crate::audit;
pub use crate::evaluate::{evaluate, verdict, FaultRecord, RunResults};
use crate::faults::{inject, leader, undo};
use crate::history::{write_jsonl, Op};
use crate::hosts::Network;
use crate::nemesis::{plan, FaultKind, Grudge};
use crate::net::{host_addr, NS_PREFIX};
use crate::procs::{client_addr, Cluster, CLIENT_HOST, HOSTS, NAMESRV_HOST, NODES};
use crate::report::{self, Shade};
use crate::workload::{in_namespace, Recorder, SendingEnd, WorkloadOptions};
use crate::JepsenError;

/// The workload's topics and consumer groups.
const TOPIC: &str = "JNormal";
const FIFO_TOPIC: &str = "JFifo";
const GROUP: &str = "JGroup";
const FIFO_GROUP: &str = "JFifoGroup";

/// The retry policy `JGroup` is given (RocketMQ's groupRetryPolicy JSON).
const JGROUP_RETRY_POLICY: &str = r#"{"type":"EXPONENTIAL","exponentialRetryPolicy":{"initial":1000,"max":60000,"multiplier":2}}"#;

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
    /// The least ratio of fault-free throughput the spread producers must keep
    /// under each fault kind the promise covers
    /// ([`crate::availability::PROMISED_RATIO`] unless a run says otherwise).
    pub availability_bound: f64,
    /// Run with TLS, mutual TLS between members, signed calls, ACLs and signed
    /// registrations on ([`crate::access`]).
    pub secure: bool,
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
        &["updateTopic", "-t", TOPIC, "-q", "4"][..],
        &["updateTopic", "-t", FIFO_TOPIC, "-q", "4", "--fifo"],
        // A retry policy, so the replica audit compares one through every
        // fault (snapshots carry it in their format 2).
        &["updateSubGroup", "-g", GROUP, "-p", JGROUP_RETRY_POLICY],
        &["updateSubGroup", "-g", FIFO_GROUP, "--fifo"],
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
    let access = if opts.secure {
        let hosts: Vec<(String, String)> = (0..NODES)
            .map(|i| (Access::node_cert(i), host_addr(i).to_string()))
            .chain([("namesrv".to_owned(), host_addr(NAMESRV_HOST).to_string())])
            .collect();
        Access::secure(&dir, &hosts, &[TOPIC, FIFO_TOPIC], &[GROUP, FIFO_GROUP])?
    } else {
        Access::plain()
    };
    let mut c = Cluster::start(&net, &dir, &opts.flush, access.clone())?;
    prepare(&c, &net)?;
    if access.is_secure() {
        // Before any fault: every node refuses what a secure cluster must.
        let (ns, a) = (net.host_ns(CLIENT_HOST), access.clone());
        let checked = in_namespace(&ns, move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(JepsenError::Io)?
                .block_on(async {
                    let mut out = Vec::new();
                    for i in 0..NODES {
                        out.push(a.check_refusals(&client_addr(i)).await?);
                    }
                    Ok::<_, JepsenError>(out)
                })
        })??;
        for line in checked {
            eprintln!("secure run: {line}");
        }
    }
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
    let sending_end = SendingEnd::new(time_limit_ms);
    let wl = WorkloadOptions {
        nodes: nodes.clone(),
        topic: TOPIC.into(),
        fifo_topic: FIFO_TOPIC.into(),
        group: GROUP.into(),
        fifo_group: FIFO_GROUP.into(),
        producers: 3,
        pinned_producers: 3,
        fifo_producers: 3,
        consumers: 3,
        sending_end: sending_end.clone(),
        drain: Duration::from_secs(300),
        quiet: Duration::from_secs(20),
        settle: Duration::from_secs(5),
        call_timeout: Duration::from_secs(5),
        send_interval: Duration::from_millis(5),
        fifo_send_interval: Duration::from_millis(50),
        stop: stop.clone(),
        access: access.clone(),
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
    // Each node's role and term, sampled until the workload is done.
    let sampling_done = Arc::new(AtomicBool::new(false));
    let (ns, access2, nodes2, rec2, done2) = (
        net.host_ns(CLIENT_HOST),
        access.clone(),
        nodes.clone(),
        rec.clone(),
        sampling_done.clone(),
    );
    let sampler = std::thread::spawn(move || {
        in_namespace(&ns, move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(|rt| rt.block_on(crate::roles::sample(access2, nodes2, rec2, done2)))
                .unwrap_or_default()
        })
        .unwrap_or_default()
    });
    let mut rng = StdRng::seed_from_u64(opts.seed ^ 0x5eed);
    let mut done: Vec<FaultRecord> = Vec::new();
    let mut nemesis_error = None;
    let mut unexpected_exits: Vec<String> = Vec::new();
    let mut route_findings: Vec<String> = Vec::new();
    let mut prev_end_ms = None;
    for f in &faults {
        let at_ms = crate::nemesis::fault_start_ms(f.start_ms, prev_end_ms, opts.gap_ms);
        if at_ms + f.duration_ms + opts.gap_ms > time_limit_ms {
            eprintln!(
                "[{:>7.1}s] {} and later faults left out: an earlier fault overran the plan",
                rec.now_ms() as f64 / 1000.0,
                f.kind.name()
            );
            break;
        }
        if !sleep_until(&rec, at_ms, &stop) {
            break;
        }
        let began_ms = rec.now_ms();
        // Sending goes on while the fault is injected and in effect, and for a
        // calm gap after its heal, even past the time limit if it overran.
        sending_end.hold();
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
        let mut detail = detail;
        if f.kind == FaultKind::PartitionNamesrv {
            match crate::routes::route_check(&c, &net, crate::routes::ROUTE_BOUND) {
                Ok(ms) => detail.push_str(&format!(
                    "; its route named the actual leader again {ms} ms after the heal"
                )),
                Err(finding) => {
                    eprintln!("[{:>7.1}s] {finding}", end_ms as f64 / 1000.0);
                    route_findings.push(finding);
                }
            }
        }
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
        // The calm counts from here: the route check and restarts above take time.
        prev_end_ms = Some(rec.now_ms());
        sending_end.end_at(time_limit_ms.max(rec.now_ms() + opts.gap_ms));
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
            spread_ratio: None,
            pinned_ratio: None,
        });
    }
    // A fault that failed to inject or heal left sending held.
    sending_end.end_at(time_limit_ms.max(rec.now_ms()));
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
        sampling_done.store(true, Ordering::Relaxed);
        let _ = sampler.join();
        return Err(JepsenError::Host(format!("nemesis failed: {e}")));
    }
    let (history, drain) = workload
        .join()
        .map_err(|_| JepsenError::Host("the workload thread panicked".into()))???;
    sampling_done.store(true, Ordering::Relaxed);
    let roles = sampler.join().unwrap_or_default();
    let interrupted = stop.load(Ordering::Relaxed);
    let (replica_audit, audit_error) = if interrupted {
        (None, Some("interrupted".to_owned()))
    } else {
        eprintln!(
            "[{:>7.1}s] workload done; auditing replicas",
            rec.now_ms() as f64 / 1000.0
        );
        let (access2, nodes2) = (access.clone(), nodes.clone());
        let views = in_namespace(&net.host_ns(CLIENT_HOST), move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(JepsenError::Io)?
                .block_on(async {
                    audit::settle(&access2, &nodes2, Duration::from_secs(60)).await;
                    audit::fetch(&access2, &nodes2).await
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
    let mut results = evaluate(
        opts,
        &history,
        done,
        (replica_audit, audit_error),
        (unexpected_exits, sync_reverts),
        drain,
        interrupted,
    );
    results.add_route_findings(route_findings);
    write_outputs(&dir, &history, &results, &roles)?;
    Ok(RunOutcome { dir, results })
}

/// The follower log reverts in the nodes' logs (`dir/nI.log`) that no fault
/// damaging stored bytes explains ([`crate::reverts`]); a log that cannot be
/// read is a finding too. `start_unix_ms`: the run clock's start.
fn sync_reverts(dir: &Path, start_unix_ms: i64, done: &[FaultRecord]) -> Vec<String> {
    let mut reverts = Vec::new();
    let mut set_asides = Vec::new();
    let mut unreadable = Vec::new();
    for n in 0..NODES {
        let path = dir.join(format!("n{n}.log"));
        match std::fs::read_to_string(&path) {
            Ok(log) => {
                reverts.extend(
                    crate::reverts::revert_times(&log)
                        .into_iter()
                        .map(|t| (n, t.map(|t| t - start_unix_ms))),
                );
                set_asides.extend(
                    crate::reverts::set_aside_times(&log)
                        .into_iter()
                        .map(|t| (n, t - start_unix_ms)),
                );
            }
            Err(e) => unreadable.push(format!(
                "{}: {e}; its reverts were not checked",
                path.display()
            )),
        }
    }
    let faults: Vec<(FaultKind, u64, u64, Option<usize>)> = done
        .iter()
        .map(|f| (f.kind, f.began_ms, f.end_ms, f.target))
        .collect();
    let faults = crate::reverts::explaining_faults(&faults, &set_asides);
    unreadable.extend(crate::reverts::unexplained(&reverts, &faults));
    unreadable
}

/// One availability row per fault kind in the run, in the plan's kind order.
fn availability_rows(r: &RunResults) -> Vec<report::AvailabilityRow> {
    let mut kinds: Vec<FaultKind> = Vec::new();
    for f in &r.faults {
        if !kinds.contains(&f.kind) {
            kinds.push(f.kind);
        }
    }
    kinds
        .into_iter()
        .map(|k| {
            let of_kind: Vec<&FaultRecord> = r.faults.iter().filter(|f| f.kind == k).collect();
            let mut rtos: Vec<u64> = of_kind.iter().filter_map(|f| f.rto_ms).collect();
            rtos.sort_unstable();
            let name = k.name();
            report::AvailabilityRow {
                kind: name.to_owned(),
                faults: of_kind.len(),
                promised: crate::availability::promise_covers(k),
                all_ratio: r.throughput_ratio_by_kind.get(name).copied(),
                spread_ratio: r.spread_ratio_by_kind.get(name).copied(),
                pinned_ratio: r.pinned_ratio_by_kind.get(name).copied(),
                others_ratio: r.others_ratio_by_kind.get(name).copied(),
                rto_p50_ms: report::quantile(&rtos, 0.5),
            }
        })
        .collect()
}

fn write_outputs(
    dir: &Path,
    history: &[Op],
    r: &RunResults,
    roles: &[crate::roles::RoleSample],
) -> Result<(), JepsenError> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(dir.join("history.jsonl"))?);
    write_jsonl(&mut f, history)?;
    let json = serde_json::to_string_pretty(r).map_err(|e| JepsenError::History(e.to_string()))?;
    std::fs::write(dir.join("results.json"), &json)?;
    let roles_json =
        serde_json::to_string(roles).map_err(|e| JepsenError::History(e.to_string()))?;
    std::fs::write(dir.join("roles.json"), roles_json)?;
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
        &report::Extras {
            availability: availability_rows(r),
            bound: r.availability_bound,
            roles: roles.to_vec(),
            nodes: NODES,
        },
    );
    std::fs::write(dir.join("report.html"), page)?;
    Ok(())
}
