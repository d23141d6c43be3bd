//! `mqbroker -c FILE [--store-dir DIR]`: runs one node of a broker group.
//!
//! It opens the store (recovering after a crash), joins the group's Raft group and
//! keeps every name server told of its role. On SIGTERM/SIGINT it hands leadership
//! to a caught-up follower first (rolling restarts), gives calls in flight up to
//! 1.5 s to finish (through the new leader), unregisters and shuts the store
//! down cleanly. Clients (RocketMQ 5 gRPC) and `mqadmin` use `client_addr`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use ledgermq_broker::announce::{spawn_announcer, Identity};
use ledgermq_broker::broker::Broker;
use ledgermq_broker::config::BrokerConfig;
use ledgermq_broker::route::{Members, NameServers};
use ledgermq_namesrv::registrar::Registrar;
use ledgermq_raft::{BatchConfig, NetworkFilter, RaftNode, RaftNodeConfig, RaftTiming};

/// On SIGTERM, after the leadership hand-over: how long calls in flight get to
/// finish before the client port closes.
const SHUTDOWN_DRAIN: Duration = Duration::from_millis(1500);

/// mimalloc instead of glibc malloc: allocation was ~16% of a leader's CPU.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "mqbroker",
    about = "LedgerMQ broker node (one member of a Raft broker group)"
)]
struct Args {
    /// TOML configuration file.
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
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,openraft=warn".into()),
        )
        .init();
    let args = Args::parse();
    let mut cfg = BrokerConfig::load(&args.config)?;
    if let Some(dir) = args.store_dir {
        cfg.store_root = dir;
    }
    let members = cfg.members().map_err(anyhow::Error::msg)?;
    let raft_addr = members
        .get(&cfg.node_id)
        .context("node_id not among peers")?
        .clone();
    let node = RaftNode::start(
        RaftNodeConfig {
            node_id: cfg.node_id,
            listen_addr: raft_addr.parse().context("peer address of this node")?,
            members,
            store: {
                let mut store = cfg.store_config().map_err(anyhow::Error::msg)?;
                store.forget_lost_acknowledged = args.forget_lost_acknowledged;
                store
            },
            timing: RaftTiming {
                heartbeat_interval_ms: cfg.raft_heartbeat_ms,
                election_timeout_min_ms: cfg.raft_election_min_ms,
                election_timeout_max_ms: cfg.raft_election_max_ms,
            },
            batch: BatchConfig::default(),
            store_host: cfg.client_addr.parse().context("client_addr")?,
            write_timeout_ms: 2500,
            cluster_name: cfg.broker_group.clone(),
            retention_interval_ms: cfg.retention_interval_ms,
        },
        NetworkFilter::default(),
    )
    .await?;
    let registrar = Arc::new(Registrar::start(
        cfg.namesrv_addrs.clone(),
        Duration::from_millis(cfg.namesrv_heartbeat_ms),
        Duration::from_secs(3),
    ));
    let identity = Identity {
        cluster: cfg.cluster.clone(),
        broker_group: cfg.broker_group.clone(),
        client_addr: cfg.advertised_client_addr().to_owned(),
    };
    let announcer = spawn_announcer(
        node.clone(),
        registrar.clone(),
        identity,
        Duration::from_secs(1),
    );
    let settings = cfg.service_settings();
    let broker = Broker::new(
        node.clone(),
        cfg.broker_group.clone(),
        settings,
        NameServers::new(cfg.namesrv_addrs.clone()),
        Members::new(
            cfg.broker_group.clone(),
            cfg.member_client_addrs().map_err(anyhow::Error::msg)?,
        ),
    );
    let client_addr: std::net::SocketAddr = cfg.client_addr.parse().context("client_addr")?;
    let server = ledgermq_broker::server::serve(broker, client_addr).await?;
    tracing::info!(node = cfg.node_id, group = %cfg.broker_group, "mqbroker started");
    println!("mqbroker {} node {} started", cfg.broker_group, cfg.node_id);

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // A Raft core that stopped on a fatal error (a storage failure, a panic) leaves
    // a node that cannot serve: exit so a supervisor restarts it, and recovery runs.
    let mut metrics = node.raft().metrics();
    let fatal = async move {
        loop {
            if let Err(e) = &metrics.borrow().running_state {
                return e.to_string();
            }
            if metrics.changed().await.is_err() {
                return "the Raft core stopped".to_string();
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        why = fatal => {
            tracing::error!(error = %why, "the Raft node failed; exiting");
            eprintln!("mqbroker: the Raft node failed: {why}");
            std::process::exit(70);
        }
    }
    if node.is_leader() {
        match node.transfer_leadership(None, Duration::from_secs(5)).await {
            Ok(to) => tracing::info!(to, "leadership handed over"),
            Err(e) => {
                tracing::warn!(error = %e, "could not hand leadership over; followers will elect")
            }
        }
    }
    // Calls taken before the hand-over finish through the new leader.
    server.stop(SHUTDOWN_DRAIN).await;
    announcer.abort();
    let _ = announcer.await; // drops its handle on the registrar
    match Arc::try_unwrap(registrar) {
        Ok(r) => r.stop(true).await,
        Err(_) => tracing::warn!("registrar still shared; not unregistering"),
    }
    node.stop(true).await?;
    Ok(())
}
