//! `mqbench-noop`: serves a RocketMQ 5 MessagingService that stores nothing
//! (SendMessage answers OK at once), so `mqbench --consumers 0` against it measures
//! the gRPC transport's own ceiling on this machine:
//!
//! ```text
//! mqbench-noop --listen 127.0.0.1:8091 &
//! mqbench --endpoints 127.0.0.1:8091 --consumers 0 --producers 1 --window 128 --duration-secs 20
//! ```

use std::net::SocketAddr;

use anyhow::{Context, Result};
use clap::Parser;

/// mimalloc, as `mqbroker` and `mqbench`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "mqbench-noop",
    about = "A RocketMQ 5 MessagingService that stores nothing: the gRPC transport's ceiling for mqbench"
)]
struct Args {
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:8091")]
    listen: SocketAddr,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    println!("no-op MessagingService on {}", args.listen);
    ledgermq_bench::noop::serve(args.listen)
        .await
        .with_context(|| format!("serving on {}", args.listen))
}
