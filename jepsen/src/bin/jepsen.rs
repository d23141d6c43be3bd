//! `jepsen`: LedgerMQ's Jepsen-style partition test. Needs root, iproute2, nftables
//! and the workspace binaries (`cargo build --release --bins`).
//!
//! `jepsen run [--time-limit SECONDS] [--nemesis LIST] [--seed N] [--flush sync|async] [--secure]`
//! starts a name server and a 3-node group in network namespaces, runs producers
//! and consumers while the nemesis injects faults, audits the replicas and writes a
//! run folder under the current directory. Exit code: 0 valid, 1 safety violation
//! (or a run that could not be checked), 2 harness error, 130 interrupted.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::{Parser, Subcommand};
use ledgermq_jepsen::nemesis::FaultKind;
use ledgermq_jepsen::runner::{run, verdict, RunOptions};

#[derive(Parser)]
#[command(name = "jepsen", about = "LedgerMQ's Jepsen-style partition tests")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// One run: workload under faults, then the checkers.
    Run {
        /// Seconds of sending (faults happen inside it); draining and the audit
        /// follow.
        #[arg(long, default_value_t = 120)]
        time_limit: u64,
        /// Faults, comma-separated kinds or groups (every kind is described in
        /// docs/jepsen.md): partition (= partition-halves, isolate-leader,
        /// majorities-ring, one-way), kill (= kill-leader, kill-random), pause
        /// (= pause-leader), power-loss, corrupt (= corrupt-tail), compound
        /// (= power-loss-partitioned, quick-restart), clock (= clock-skew,
        /// clock-jump), disk (= disk-full, slow-disk), kill-majority,
        /// sigterm-leader, power-loss-all (sync only; power-loss-partitioned is
        /// sync only too), any other kind by name, or all.
        #[arg(long, default_value = "all")]
        nemesis: String,
        /// Seed of the fault schedule and targets.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Flush mode of the nodes: sync (SYNC_FLUSH) or async (ASYNC_FLUSH).
        #[arg(long, default_value = "sync")]
        flush: String,
        /// Length of each fault, ms.
        #[arg(long, default_value_t = 8_000)]
        fault_ms: u64,
        /// Calm between faults, ms.
        #[arg(long, default_value_t = 6_000)]
        gap_ms: u64,
        /// Where the run folder goes.
        #[arg(long, default_value = ".")]
        out: PathBuf,
        /// The least fraction of fault-free throughput the producers that know
        /// every node must keep from 2 s into each single-node partition or kill
        /// (the product's promise: 0.8); below it the run is invalid.
        #[arg(long, default_value_t = ledgermq_jepsen::availability::PROMISED_RATIO)]
        availability_bound: f64,
        /// Turn on TLS on every port, mutual TLS between the members, signed
        /// client calls with ACLs, and signed registrations at the name server
        /// (certificates made in the run folder with openssl; docs/jepsen.md).
        #[arg(long)]
        secure: bool,
    },
}

fn main() {
    let Cmd::Run {
        time_limit,
        nemesis,
        seed,
        flush,
        fault_ms,
        gap_ms,
        out,
        availability_bound,
        secure,
    } = Cli::parse().cmd;
    let mut kinds = match FaultKind::parse_list(&nemesis) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("jepsen: {e}");
            std::process::exit(2);
        }
    };
    // NaN or a bound of 0 or less would turn the check off.
    if !(availability_bound > 0.0 && availability_bound <= 1.0) {
        eprintln!("jepsen: --availability-bound must be in (0, 1], not {availability_bound}");
        std::process::exit(2);
    }
    if !matches!(flush.as_str(), "sync" | "async") {
        eprintln!("jepsen: --flush must be sync or async, not {flush:?}");
        std::process::exit(2);
    }
    // ASYNC_FLUSH acknowledges before the fsync: a group all of whose nodes lose
    // power may have lost acknowledged entries everywhere, so every node stays out
    // of elections (README) and the group waits for an operator
    // (`mqbroker --forget-lost-acknowledged`). Asked for by name, that is an error;
    // in `all` or a group, it is left out.
    if flush == "async" {
        let k = FaultKind::PowerLossAll;
        if kinds.contains(&k) {
            if nemesis.split(',').any(|n| n.trim() == k.name()) {
                eprintln!("jepsen: {} needs --flush sync (under ASYNC_FLUSH a group all of whose nodes lose power waits for an operator, by design)", k.name());
                std::process::exit(2);
            }
            kinds.retain(|x| *x != k);
            eprintln!("jepsen: {} left out under --flush async", k.name());
        }
        if kinds.is_empty() {
            eprintln!("jepsen: no fault kind left for --flush async");
            std::process::exit(2);
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    // Ctrl-C, apart from `stop`, which the runner also sets when the nemesis fails.
    let interrupted = Arc::new(AtomicBool::new(false));
    let (s, i) = (stop.clone(), interrupted.clone());
    if let Err(e) = ctrlc::set_handler(move || {
        eprintln!("jepsen: interrupted; healing and removing the hosts");
        i.store(true, Ordering::Relaxed);
        s.store(true, Ordering::Relaxed);
    }) {
        eprintln!("jepsen: cannot handle Ctrl-C: {e}");
    }
    let opts = RunOptions {
        time_limit_s: time_limit,
        kinds,
        seed,
        flush,
        out_dir: out,
        warmup_ms: 5_000,
        fault_ms,
        gap_ms,
        availability_bound,
        secure,
    };
    match run(&opts, stop.clone()) {
        Ok(o) => {
            let r = &o.results;
            let tq = &r.total_queue;
            println!("run folder: {}", o.dir.display());
            println!(
                "total-queue: attempted {} acknowledged {} received {} lost {} unexpected {} duplicated {} recovered {}; stored twice {} (more often than sent {})",
                tq.attempted, tq.acknowledged, tq.received, tq.lost, tq.unexpected, tq.duplicated, tq.recovered,
                tq.duplicate_writes, tq.duplicate_writes_sent_once
            );
            println!(
                "order: inconsistent offsets {} offset gaps {} group order violations {}",
                r.order.inconsistent_offsets, r.order.offset_gaps, r.order.group_order_violations
            );
            println!(
                "fifo: {} deliveries, {} acks answered OK, {} delivered while the previous was in flight, {} delivered again while in flight, {} delivered after an acknowledged ack",
                r.fifo.deliveries, r.fifo.acks_ok, r.fifo.delivered_while_previous_in_flight, r.fifo.delivered_again_while_in_flight, r.fifo.redelivered_after_ack
            );
            match (&r.replica_audit, &r.audit_error) {
                (Some(a), _) => println!("replica audit: {}", a.summary()),
                (None, e) => println!("replica audit: not run ({})", e.as_deref().unwrap_or("?")),
            }
            println!(
                "availability: {} faults, RTO p50 {:?} ms p99 {:?} ms, {} without recovery, {} failed sends outside faults",
                r.faults.len(),
                r.rto_p50_ms,
                r.rto_p99_ms,
                r.faults_without_recovery,
                r.availability.failures_outside_faults
            );
            println!(
                "throughput from 2 s into a fault, over the fault-free {:.0} acks/s: {}",
                r.availability.fault_free_acks_per_s,
                r.throughput_ratio_by_kind
                    .iter()
                    .map(|(k, v)| format!("{k} {:.0}%", v * 100.0))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            println!(
                "through the nodes a fault did not hit, over their fault-free rate: {}",
                r.others_ratio_by_kind
                    .iter()
                    .map(|(k, v)| format!("{k} {:.0}%", v * 100.0))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let pct = |m: &std::collections::BTreeMap<String, f64>| {
                m.iter()
                    .map(|(k, v)| format!("{k} {:.0}%", v * 100.0))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            println!(
                "producers that spread over every node, from 2 s into a fault over their fault-free {:.0} acks/s (bound {:.0}% where promised): {}",
                r.availability.spread_fault_free_acks_per_s,
                r.availability_bound * 100.0,
                pct(&r.spread_ratio_by_kind)
            );
            println!(
                "producers pinned to one node each: {}",
                pct(&r.pinned_ratio_by_kind)
            );
            if let Some(g) = r.availability.longest_gaps.first() {
                println!(
                    "longest time without an ack: {} ms, producer {} ({}), from {:.1} s",
                    g.gap_ms,
                    g.process,
                    g.pinned_to
                        .map_or("spread".to_owned(), |n| format!("pinned to node {n}")),
                    g.from_ms as f64 / 1000.0
                );
            }
            match &r.drain {
                Some(d) if d.reached => println!(
                    "drain: every queue's consumer offset reached its end (applied index {:?})",
                    d.applied_index
                ),
                Some(d) => {
                    for q in &d.short_queues {
                        println!("drain: {q}");
                    }
                }
                None => println!("drain: no node answered for the consumer groups' progress"),
            }
            for s in &r.availability_shortfalls {
                println!("availability: {s}");
            }
            // Faults whose target's calls hang (neither answered nor refused).
            let hangs = [FaultKind::PauseLeader, FaultKind::PartitionClientLeader];
            for f in r.faults.iter().filter(|f| hangs.contains(&f.kind)) {
                if let Some(c) = f.others_calls {
                    println!(
                        "{} at {:.0} s: calls to the other nodes from 2 s in: {} of {} acknowledged, p50 {:?} ms p99 {:?} ms",
                        f.kind.name(),
                        f.start_ms as f64 / 1000.0,
                        c.acked,
                        c.calls,
                        c.p50_ms,
                        c.p99_ms
                    );
                }
            }
            for e in &r.sync_reverts {
                println!("revert: {e}");
            }
            for e in &r.unexpected_exits {
                println!("unexpected exit: {e}");
            }
            println!("{}", verdict(r));
            std::process::exit(if r.interrupted {
                130
            } else if r.valid {
                0
            } else {
                1
            });
        }
        Err(e) => {
            eprintln!("jepsen: {e}");
            std::process::exit(if interrupted.load(Ordering::Relaxed) {
                130
            } else {
                2
            });
        }
    }
}
