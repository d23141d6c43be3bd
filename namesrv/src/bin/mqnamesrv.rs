//! `mqnamesrv [-c FILE] [--listen HOST:PORT] [--log-format text|json]`: runs
//! one LedgerMQ name server.

use anyhow::Result;
use clap::Parser;
use ledgermq_namesrv::logging::{self, LogFormat};
use ledgermq_namesrv::server::{bind, serve, NameServerConfig};

#[derive(Parser, Debug)]
#[command(
    name = "mqnamesrv",
    about = "LedgerMQ name server (RocketMQ NameServer)"
)]
struct Args {
    /// Configuration file: TOML (keys: listen, scan_interval_ms, node_expiry_ms),
    /// or a RocketMQ name server's `.properties` / `.conf`.
    #[arg(short = 'c', long = "config")]
    config: Option<std::path::PathBuf>,
    /// Address to listen on; overrides the file (default 0.0.0.0:9876).
    #[arg(long)]
    listen: Option<String>,
    /// Log lines as `text` or `json` (one object per line), on stdout;
    /// colour codes only on a terminal without NO_COLOR. RUST_LOG filters.
    #[arg(long, env = "LEDGERMQ_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    logging::init(args.log_format, "info");
    let mut cfg = match &args.config {
        Some(p) => NameServerConfig::load(p)?,
        None => NameServerConfig::default(),
    };
    if let Some(l) = args.listen {
        cfg.listen = l;
    }
    let (listener, addr) = bind(&cfg.listen).await?;
    tracing::info!(%addr, "mqnamesrv listening");
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    serve(&cfg, listener, shutdown).await?;
    Ok(())
}
