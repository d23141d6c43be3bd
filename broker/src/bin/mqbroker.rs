//! `mqbroker -c FILE [--store-dir DIR]`: runs one node of a broker group.
//!
//! It opens the store (recovering after a crash), joins the group's Raft group and
//! keeps every name server told of its role. On SIGTERM/SIGINT it hands leadership
//! to a caught-up follower first (rolling restarts), gives calls in flight up to
//! 1.5 s to finish (through the new leader), unregisters and shuts the store
//! down cleanly. Clients (RocketMQ 5 gRPC) and `mqadmin` use `client_addr`.

use anyhow::Result;
use clap::Parser;
use ledgermq_broker::config::BrokerConfig;
use ledgermq_broker::node::{BrokerNode, NodeTimings, StartOptions};

/// mimalloc instead of glibc malloc: allocation was ~16% of a leader's CPU.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "mqbroker",
    about = "LedgerMQ broker node (one member of a Raft broker group)"
)]
struct Args {
    /// Configuration file: TOML, or a RocketMQ broker's `.properties` / `.conf`.
    #[arg(short = 'c', long = "config")]
    config: std::path::PathBuf,
    /// Store root; overrides `store_root` of the file.
    #[arg(long)]
    store_dir: Option<std::path::PathBuf>,
    /// Take part in elections at once even if this node may have lost entries it
    /// had acknowledged (a damaged tail, or a power loss under ASYNC_FLUSH). Only
    /// to restart a group a majority of which lost power under ASYNC_FLUSH, which
    /// otherwise stays without a leader: messages acknowledged just before may be
    /// lost.
    #[arg(long)]
    forget_lost_acknowledged: bool,
    /// Join a running group (`mqadmin addNode`) instead of initializing one: on
    /// the first start, with an empty store, wait for the leader to add this
    /// node (sets `join` of the file).
    #[arg(long)]
    join: bool,
    /// Log lines as `text` or `json` (one object per line), on stdout;
    /// colour codes only on a terminal without NO_COLOR. RUST_LOG filters.
    #[arg(long, env = "LEDGERMQ_LOG_FORMAT", default_value = "text")]
    log_format: ledgermq_namesrv::logging::LogFormat,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    ledgermq_namesrv::logging::init(args.log_format, "info,openraft=warn");
    let mut cfg = BrokerConfig::load(&args.config)?;
    if let Some(dir) = args.store_dir {
        cfg.store_root = dir;
    }
    cfg.join |= args.join;
    let node = BrokerNode::start(
        &cfg,
        StartOptions {
            forget_lost_acknowledged: args.forget_lost_acknowledged,
            ..StartOptions::default()
        },
        NodeTimings::default(),
    )
    .await?;
    tracing::info!(node = cfg.node_id, group = %cfg.broker_group, "mqbroker started");

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // A Raft core that stopped on a fatal error (a storage failure, a panic) leaves
    // a node that cannot serve: exit so a supervisor restarts it, and recovery runs.
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        why = node.failed() => {
            tracing::error!(error = %why, "the Raft node failed; exiting");
            eprintln!("mqbroker: the Raft node failed: {why}");
            std::process::exit(70);
        }
    }
    node.shutdown().await?;
    Ok(())
}
