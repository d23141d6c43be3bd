//! One member of a broker group's Raft group as a process (for failover benchmarks
//! and fault tests until `mqbroker` exists). Stops cleanly on SIGINT/SIGTERM;
//! `kill -9` is a crash.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use clap::Parser;
use ledgermq_raft::{BatchConfig, NetworkFilter, RaftNode, RaftNodeConfig, RaftTiming};
use ledgermq_store::{FlushMode, StoreConfig};

#[derive(Parser, Debug)]
#[command(about = "Run one LedgerMQ Raft group member")]
struct Args {
    /// This node's id.
    #[arg(long)]
    id: u64,
    /// Every member: `ID=HOST:PORT,ID=HOST:PORT,...` (peer addresses).
    #[arg(long)]
    members: String,
    /// Store directory.
    #[arg(long)]
    dir: std::path::PathBuf,
    /// sync or async.
    #[arg(long, default_value = "sync")]
    flush: FlushMode,
    /// CommitLog segment size in bytes.
    #[arg(long, default_value_t = 64 << 20)]
    segment_bytes: u64,
    /// Heartbeat period in ms.
    #[arg(long, default_value_t = RaftTiming::default().heartbeat_interval_ms)]
    heartbeat_ms: u64,
    /// Election timeout lower bound in ms.
    #[arg(long, default_value_t = RaftTiming::default().election_timeout_min_ms)]
    election_min_ms: u64,
    /// Election timeout upper bound in ms.
    #[arg(long, default_value_t = RaftTiming::default().election_timeout_max_ms)]
    election_max_ms: u64,
}

/// Parses `ID=HOST:PORT,...`.
fn parse_members(s: &str) -> Result<BTreeMap<u64, String>> {
    let mut m = BTreeMap::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (id, addr) = part.split_once('=').context("a member is ID=HOST:PORT")?;
        m.insert(id.trim().parse()?, addr.trim().to_string());
    }
    if m.is_empty() {
        bail!("no members given");
    }
    Ok(m)
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args = Args::parse();
    let members = parse_members(&args.members)?;
    let addr = members
        .get(&args.id)
        .context("--id is not among --members")?
        .clone();
    let mut store = StoreConfig::new(&args.dir);
    store.commit_log.segment_bytes = args.segment_bytes;
    store.flush_mode = args.flush;
    let cfg = RaftNodeConfig {
        node_id: args.id,
        listen_addr: addr.parse()?,
        members,
        store,
        timing: RaftTiming {
            heartbeat_interval_ms: args.heartbeat_ms,
            election_timeout_min_ms: args.election_min_ms,
            election_timeout_max_ms: args.election_max_ms,
        },
        batch: BatchConfig::default(),
        store_host: addr.parse()?,
        write_timeout_ms: 3000,
        cluster_name: "raft-node".into(),
        retention_interval_ms: 10_000,
        join: false,
        peer_tls: None,
    };
    let node = RaftNode::start(cfg, NetworkFilter::default()).await?;
    println!("ready {}", args.id);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    node.stop(true).await?;
    Ok(())
}
