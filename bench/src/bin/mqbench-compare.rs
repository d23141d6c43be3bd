//! `mqbench-compare`: the same load, in one run on one machine, against a LedgerMQ
//! 3-node group (SYNC_FLUSH, then ASYNC_FLUSH), a 3-node NATS JetStream cluster
//! (file storage, replicas 3) and a 3-node RabbitMQ cluster (quorum queue), each
//! started on loopback here and stopped (processes killed, files removed) before
//! the next. Prints a table and the ratios LedgerMQ-async / NATS and
//! LedgerMQ-sync / RabbitMQ.
//!
//! Needs `mqbroker`, `mqnamesrv`, `mqadmin` next to this binary (`cargo build
//! --release -p ledgermq-broker -p ledgermq-namesrv -p ledgermq-bench`) and
//! Debian's `nats-server` and `rabbitmq-server` packages.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Parser;
use ledgermq_bench::compare::{check_installed, run_system, System};
use ledgermq_bench::runner::LoadSpec;
use ledgermq_bench::summary::Summary;
use ledgermq_bench::table::{Machine, Report, Row};

/// mimalloc instead of glibc malloc: the tool shares the machine with the systems
/// it measures, so its own CPU is taken from them (allocation was ~17% of it).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "mqbench-compare",
    about = "LedgerMQ vs NATS JetStream vs RabbitMQ quorum queues, 3 nodes each on loopback, same load"
)]
struct Args {
    /// Body size in bytes.
    #[arg(long, default_value_t = 1024)]
    body_bytes: usize,
    /// Un-acknowledged sends in flight per producer.
    #[arg(long, default_value_t = 128)]
    window: usize,
    /// Offered load in messages per second over all producers (default: as fast
    /// as the window allows). Latency then counts from each send's scheduled
    /// start.
    #[arg(long, value_parser = ledgermq_bench::runner::parse_rate)]
    rate: Option<f64>,
    /// Producer tasks (one connection each).
    #[arg(long, default_value_t = 1)]
    producers: usize,
    /// Consumer tasks (one connection each).
    #[arg(long, default_value_t = 1)]
    consumers: usize,
    /// Seconds measured per system (after the warm-up).
    #[arg(long, default_value_t = 20)]
    duration_secs: u64,
    /// Seconds of load before measuring, per system.
    #[arg(long, default_value_t = 2)]
    warmup_secs: u64,
    /// Longest wait after sending for consumers to catch up, per system.
    #[arg(long, default_value_t = 10)]
    drain_secs: u64,
    /// Systems to run, in order: ledgermq-sync, ledgermq-async,
    /// ledgermq-sync-remoting, ledgermq-async-remoting, nats, rabbitmq.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ledgermq-sync,ledgermq-async,ledgermq-sync-remoting,ledgermq-async-remoting,nats,rabbitmq"
    )]
    systems: Vec<String>,
    /// Directory for the systems' stores and logs (a new temporary directory
    /// under it is used and removed for each system).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Also write the report (machine, every summary, ratios) as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Hide the per-second progress lines.
    #[arg(long)]
    quiet: bool,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let systems: Vec<System> = args
        .systems
        .iter()
        .map(|s| s.parse())
        .collect::<Result<_>>()?;
    if systems.is_empty() {
        bail!("--systems names none");
    }
    for s in &systems {
        check_installed(*s)?;
    }
    if args.producers == 0 {
        bail!("--producers 0: nothing to compare");
    }
    ledgermq_bench::payload::check_body_bytes(args.body_bytes).map_err(anyhow::Error::msg)?;
    let spec = LoadSpec {
        label: String::new(),
        producers: args.producers,
        consumers: args.consumers,
        window: args.window,
        rate_per_sec: args.rate,
        body_bytes: args.body_bytes,
        duration: Duration::from_secs(args.duration_secs),
        count: None,
        warmup: Duration::from_secs(args.warmup_secs),
        drain: Duration::from_secs(args.drain_secs),
        progress: !args.quiet,
        run_id: None,
    };
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base)?;
    let mut rows = Vec::new();
    for system in systems {
        let dir = tempfile::Builder::new()
            .prefix(&format!("mqbench-{}-", system.name()))
            .tempdir_in(&base)?;
        // On Ctrl-C, return through the clusters' Drop (their processes sit in
        // process groups of their own, so the terminal's signal does not reach
        // them): no peer is left running.
        let outcome = tokio::select! {
            r = run_system(system, &spec, dir.path()) => r,
            _ = tokio::signal::ctrl_c() => bail!("interrupted: {} stopped", system.name()),
        };
        let row = match outcome {
            Ok(summary) => {
                print!("{}", summary.render());
                Row {
                    system: system.name().into(),
                    durability: system.durability().into(),
                    summary: Some(summary),
                    error: None,
                }
            }
            Err(e) => {
                eprintln!("[{}] FAILED: {e:#}", system.name());
                Row {
                    system: system.name().into(),
                    durability: system.durability().into(),
                    summary: None,
                    error: Some(format!("{e:#}").lines().next().unwrap_or("").to_owned()),
                }
            }
        };
        rows.push(row);
        // Let the killed processes' sockets and page cache settle before the next.
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(dir);
    }
    let report = Report::new(Machine::this(), rows);
    println!();
    print!("{}", report.render());
    if let Some(path) = &args.json {
        Summary::write_json(path, &report)?;
        println!("report written to {}", path.display());
    }
    if report.rows.iter().all(|r| r.summary.is_none()) {
        bail!("no system ran");
    }
    Ok(())
}
