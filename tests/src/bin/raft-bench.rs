//! Raft benchmarks on loopback.
//!
//! - `throughput`: three replicas in this process (real files, real gRPC between
//!   them), many concurrent writers of 1 KiB messages; prints committed messages per
//!   second and commit latency percentiles. `--rate N` offers a fixed load (open loop)
//!   instead of as much as the writers can push.
//! - `failover`: three `raft-node` processes; kills the leader with SIGKILL
//!   `--kills` times and measures the time from each kill to the first write that
//!   commits on the new leader.

use ledgermq_testkit::free_port;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;
use ledgermq_raft::network::pb::raft_peer_client::RaftPeerClient;
use ledgermq_raft::network::{decode, encode, lazy_channel};
use ledgermq_raft::{
    BatchConfig, NetworkFilter, RaftNode, RaftNodeConfig, RaftTiming, Request, Response,
};
use ledgermq_store::{FlushMode, MessageRecord, StoreConfig};

#[derive(Parser)]
#[command(about = "LedgerMQ Raft benchmarks (3 replicas on loopback)")]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Commits per second and commit latency, 3 replicas in this process.
    Throughput {
        /// sync or async.
        #[arg(long, default_value = "sync")]
        flush: FlushMode,
        /// Concurrent writers (each waits for its commit before the next send).
        #[arg(long, default_value_t = 256)]
        writers: usize,
        /// Seconds to measure (after one second of warm-up).
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Message body size in bytes.
        #[arg(long, default_value_t = 1024)]
        body_bytes: usize,
        /// Offered load in messages per second (open loop); 0 = closed loop.
        #[arg(long, default_value_t = 0)]
        rate: u64,
        /// Replicas (1 measures the node without replication).
        #[arg(long, default_value_t = 3)]
        replicas: u64,
    },
    /// Time from a SIGKILL of the leader to the first commit on a new leader.
    Failover {
        /// sync or async.
        #[arg(long, default_value = "sync")]
        flush: FlushMode,
        /// Leader kills.
        #[arg(long, default_value_t = 20)]
        kills: usize,
    },
}

fn members(n: u64) -> BTreeMap<u64, String> {
    (0..n)
        .map(|i| (i, format!("127.0.0.1:{}", free_port())))
        .collect()
}

fn body_message(body_bytes: usize) -> MessageRecord {
    MessageRecord::message("BenchTopic", 0, vec![b'x'; body_bytes], 0)
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

async fn throughput(
    flush: FlushMode,
    writers: usize,
    seconds: u64,
    body_bytes: usize,
    rate: u64,
    replicas: u64,
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let members = members(replicas);
    let mut nodes = Vec::new();
    for (&id, addr) in &members {
        // RocketMQ's file sizes, with 256 MiB CommitLog segments to bound disk use.
        let mut store = StoreConfig::new(dir.path().join(format!("n{id}")));
        store.commit_log.segment_bytes = 256 << 20;

        store.flush_mode = flush;
        let cfg = RaftNodeConfig {
            node_id: id,
            listen_addr: addr.parse()?,
            members: members.clone(),
            store,
            timing: RaftTiming::default(),
            batch: BatchConfig::default(),
            store_host: addr.parse()?,
            write_timeout_ms: 5000,
            cluster_name: "bench".into(),
            retention_interval_ms: 0,
            join: false,
            peer_tls: None,
        };
        nodes.push(RaftNode::start(cfg, NetworkFilter::default()).await?);
    }
    let leader = loop {
        if let Some(n) = nodes.iter().find(|n| n.is_leader()) {
            break n.clone();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let warm_until = Instant::now() + Duration::from_secs(1);
    let end = warm_until + Duration::from_secs(seconds);
    let hist = Arc::new(Mutex::new(Histogram::<u64>::new(3)?));
    let errors = Arc::new(Mutex::new(0u64));
    let mut tasks = Vec::new();
    if rate == 0 {
        for _ in 0..writers {
            let (leader, hist, errors) = (leader.clone(), hist.clone(), errors.clone());
            tasks.push(tokio::spawn(async move {
                let mut local = Histogram::<u64>::new(3).unwrap();
                while Instant::now() < end {
                    let t = Instant::now();
                    match leader.write_messages(vec![body_message(body_bytes)]).await {
                        Ok(_) if t >= warm_until => {
                            local.record(t.elapsed().as_micros() as u64).unwrap()
                        }
                        Ok(_) => {}
                        Err(_) => *errors.lock().unwrap() += 1,
                    }
                }
                hist.lock().unwrap().add(&local).unwrap();
            }));
        }
    } else {
        let period = Duration::from_secs_f64(1.0 / rate as f64);
        let mut next = Instant::now();
        let limit = Arc::new(tokio::sync::Semaphore::new(16_384));
        while next < end {
            let scheduled = next;
            next += period;
            tokio::time::sleep_until(scheduled.into()).await;
            let permit = limit.clone().acquire_owned().await?;
            let (leader, hist, errors) = (leader.clone(), hist.clone(), errors.clone());
            tasks.push(tokio::spawn(async move {
                let r = leader.write_messages(vec![body_message(body_bytes)]).await;
                drop(permit);

                match r {
                    Ok(_) if scheduled >= warm_until => hist
                        .lock()
                        .unwrap()
                        .record(scheduled.elapsed().as_micros() as u64)
                        .unwrap(),
                    Ok(_) => {}
                    Err(_) => *errors.lock().unwrap() += 1,
                }
            }));
        }
    }
    for t in tasks {
        t.await?;
    }
    let h = hist.lock().unwrap().clone();
    let per_s = h.len() as f64 / seconds as f64;
    println!(
                "throughput: {replicas} replicas, flush={} body={}B {} -> {:.0} commits/s ({:.1} MB/s); commit latency ms p50 {:.2} p99 {:.2} p999 {:.2} max {:.2}; errors {}",
        if flush == FlushMode::Sync { "SYNC_FLUSH" } else { "ASYNC_FLUSH" },
        body_bytes,
        if rate == 0 { format!("{writers} writers") } else { format!("offered {rate}/s") },
        per_s,
        per_s * body_bytes as f64 / 1e6,
        ms(&h, 0.5),
        ms(&h, 0.99),
        ms(&h, 0.999),
        h.max() as f64 / 1000.0,
        errors.lock().unwrap()
    );
    for n in &nodes {
        n.stop(true).await?;
    }
    Ok(())
}

async fn forward_write(addr: &str, timeout: Duration) -> Result<()> {
    let channel =
        lazy_channel(addr, Duration::from_millis(200), None).map_err(anyhow::Error::msg)?;
    let mut req = tonic::Request::new(encode(&Request::Messages(vec![body_message(64)]))?);
    req.set_timeout(timeout);
    let reply = tokio::time::timeout(timeout, RaftPeerClient::new(channel).forward(req)).await??;
    let r: Result<Response, String> = decode(reply.get_ref())?;
    r.map(|_| ()).map_err(anyhow::Error::msg)
}

fn spawn_node(
    exe: &PathBuf,
    id: u64,
    members: &str,
    dir: &std::path::Path,
    flush: FlushMode,
) -> Result<Child> {
    Command::new(exe)
        .args(["--id", &id.to_string(), "--members", members, "--flush"])
        .arg(if flush == FlushMode::Sync {
            "sync"
        } else {
            "async"
        })
        .arg("--dir")
        .arg(dir.join(format!("n{id}")))
        .stdout(Stdio::null())
        .spawn()
        .context("starting raft-node (build it with: cargo build --release -p ledgermq-tests)")
}

async fn failover(flush: FlushMode, kills: usize) -> Result<()> {
    let exe = std::env::current_exe()?.with_file_name("raft-node");
    let dir = tempfile::tempdir()?;
    let members = members(3);
    let spec: String = members
        .iter()
        .map(|(i, a)| format!("{i}={a}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut procs = Procs(BTreeMap::new());
    for &id in members.keys() {
        procs
            .0
            .insert(id, spawn_node(&exe, id, &spec, dir.path(), flush)?);
    }
    let mut hist = Histogram::<u64>::new(3)?;
    let deadline_per_kill = Duration::from_secs(30);
    for k in 0..kills {
        // The peer Forward call runs the write on the receiving node itself, which
        // only the leader can do: the node that accepts it leads.
        let t = Instant::now();
        let victim = loop {
            let mut found = None;
            for (&id, addr) in &members {
                if forward_write(addr, Duration::from_millis(500))
                    .await
                    .is_ok()
                {
                    found = Some(id);
                    break;
                }
            }
            if let Some(id) = found {
                break id;
            }
            if t.elapsed() > deadline_per_kill {
                bail!("no leader within {deadline_per_kill:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut child = procs.0.remove(&victim).expect("running");
        let _ = child.kill(); // SIGKILL
        let killed = Instant::now();
        child.wait()?;
        let rto = loop {
            let mut ok = false;
            for (&id, addr) in &members {
                if id != victim
                    && forward_write(addr, Duration::from_millis(300))
                        .await
                        .is_ok()
                {
                    ok = true;
                    break;
                }
            }
            if ok {
                break killed.elapsed();
            }
            if killed.elapsed() > deadline_per_kill {
                bail!("no commit within {deadline_per_kill:?} of killing node {victim}");
            }
        };
        hist.record(rto.as_micros() as u64)?;
        println!(
            "kill {:2}: leader {victim} killed, first commit after {} ms",
            k + 1,
            rto.as_millis()
        );
        procs
            .0
            .insert(victim, spawn_node(&exe, victim, &spec, dir.path(), flush)?);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    println!(
        "failover: {} kills of the leader (SIGKILL): time to first commit ms p50 {:.0} p99 {:.0} max {:.0}",
        hist.len(),
        ms(&hist, 0.5),
        ms(&hist, 0.99),
        hist.max() as f64 / 1000.0
    );
    Ok(())
}

/// The node processes; all are killed when this is dropped, also on an error.
struct Procs(BTreeMap<u64, Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in self.0.values_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error,openraft=off".into()),
        )
        .init();
    match Args::parse().cmd {
        Cmd::Throughput {
            flush,
            writers,
            seconds,
            body_bytes,
            rate,
            replicas,
        } => throughput(flush, writers, seconds, body_bytes, rate, replicas).await,
        Cmd::Failover { flush, kills } => failover(flush, kills).await,
    }
}
