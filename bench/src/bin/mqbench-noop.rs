//! `mqbench-noop`: serves a RocketMQ 5 MessagingService that stores nothing
//! (SendMessage answers OK at once), so `mqbench --consumers 0` against it measures
//! the gRPC transport's own ceiling on this machine; with `--protocol remoting`
//! it serves the 4.x remoting protocol the same way (the remoting front end's
//! ceiling):
//!
//! ```text
//! mqbench-noop --listen 127.0.0.1:8091 &
//! mqbench --endpoints 127.0.0.1:8091 --consumers 0 --producers 1 --window 128 --duration-secs 20
//! mqbench-noop --protocol remoting --listen 127.0.0.1:10991 &
//! mqbench --protocol remoting --endpoints 127.0.0.1:10991 --consumers 0 --producers 1 --window 128 --duration-secs 20
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
    about = "A RocketMQ server that stores nothing (5.x gRPC or 4.x remoting): the transport's ceiling for mqbench"
)]
struct Args {
    /// `grpc` (a RocketMQ 5 MessagingService) or `remoting` (RocketMQ 4.x).
    #[arg(long, default_value = "grpc", value_parser = ["grpc", "remoting"])]
    protocol: String,
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:8091")]
    listen: SocketAddr,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if args.protocol == "remoting" {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        println!("no-op remoting server on {}", args.listen);
        return ledgermq_bench::noop_remoting::serve_on(listener)
            .await
            .with_context(|| format!("serving on {}", args.listen));
    }
    println!("no-op MessagingService on {}", args.listen);
    ledgermq_bench::noop::serve(args.listen)
        .await
        .with_context(|| format!("serving on {}", args.listen))
}
