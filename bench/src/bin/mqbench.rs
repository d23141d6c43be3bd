//! `mqbench`: load against any LedgerMQ cluster over RocketMQ 5 gRPC, or over
//! the 4.x remoting protocol with `--protocol remoting` (`--endpoints` then
//! names the nodes' remoting addresses, the leader first; create the topic
//! with `mqadmin updateTopic`).
//!
//! N producer tasks (one connection each, spread over `--endpoints`) keep up to
//! `--window` sends un-acknowledged; N consumer tasks receive from any queue and
//! acknowledge. Prints a progress line every second and a summary at the end
//! (`--json PATH` writes it as JSON too).
//!
//! ```text
//! mqbench --endpoints 127.0.0.1:8081,127.0.0.1:8082,127.0.0.1:8083 --create \
//!         --topic BenchTopic --group BenchGroup --producers 4 --window 64 \
//!         --consumers 2 --body-bytes 1024 --duration-secs 30
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use ledgermq_bench::ledgermq::LedgerMq;
use ledgermq_bench::runner::{run, LoadSpec};
use ledgermq_bench::summary::Summary;

/// mimalloc instead of glibc malloc: the tool shares the machine with the systems
/// it measures, so its own CPU is taken from them (allocation was ~17% of it).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "mqbench",
    about = "Load tool for a LedgerMQ cluster (RocketMQ 5 gRPC): windowed producers, consumers, latency and throughput"
)]
struct Args {
    /// Client addresses of nodes, `host:port,host:port,...`; producers and
    /// consumers are spread over them.
    #[arg(long, default_value = "127.0.0.1:8081")]
    endpoints: String,
    /// `grpc` (RocketMQ 5) or `remoting` (RocketMQ 4.x, its own pipelined
    /// client).
    #[arg(long, default_value = "grpc", value_parser = ["grpc", "remoting"])]
    protocol: String,
    /// Topic.
    #[arg(long, default_value = "BenchTopic")]
    topic: String,
    /// Consumer group.
    #[arg(long, default_value = "BenchGroup")]
    group: String,
    /// Producer tasks (one connection each).
    #[arg(long, default_value_t = 1)]
    producers: usize,
    /// Consumer tasks (0: send only).
    #[arg(long, default_value_t = 1)]
    consumers: usize,
    /// Un-acknowledged sends in flight per producer.
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// Offered load in messages per second over all producers (default: as fast
    /// as the window allows). Latency then counts from each send's scheduled
    /// start.
    #[arg(long, value_parser = ledgermq_bench::runner::parse_rate)]
    rate: Option<f64>,
    /// Body size in bytes (at least 16: send time and run id).
    #[arg(long, default_value_t = 1024)]
    body_bytes: usize,
    /// FIFO messages: one message group per producer (the topic and group must be
    /// FIFO; `--create` makes them so). Sends within a window may commit out of
    /// order; use `--window 1` for strict order.
    #[arg(long)]
    fifo: bool,
    /// Delay messages due this many ms after they are sent (the topic must accept
    /// DELAY messages; `--create` makes it so). End-to-end latency then counts
    /// from each message's delivery time: how late it arrived.
    #[arg(long, conflicts_with = "fifo")]
    delay_ms: Option<u64>,
    /// Delay messages all due at this time, ms since the Unix epoch (e.g. many
    /// timers falling due in the same second); latency as with `--delay-ms`.
    #[arg(long, conflicts_with_all = ["fifo", "delay_ms"])]
    deliver_at_ms: Option<u64>,
    /// Seconds to send after the warm-up.
    #[arg(long, default_value_t = 30, conflicts_with = "count")]
    duration_secs: u64,
    /// Send this many messages in all instead of for a duration (no warm-up).
    #[arg(long)]
    count: Option<u64>,
    /// Seconds of sending before measuring starts.
    #[arg(long, default_value_t = 0)]
    warmup_secs: u64,
    /// Longest wait, after sending ends, for consumers to receive everything sent.
    #[arg(long, default_value_t = 10)]
    drain_secs: u64,
    /// Create (or update) the topic and the consumer group first, through the
    /// admin service of every endpoint.
    #[arg(long)]
    create: bool,
    /// Queues of the topic when creating it (with `--protocol remoting`: the
    /// topic's queue count).
    #[arg(long, default_value_t = 8)]
    queues: u32,
    /// Deadline of one call, ms.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    /// Stamp bodies with this run id and count only received messages that
    /// carry it (default: a random one). A consumer-only run (`--producers 0`)
    /// given the id of a producer run started after it measures that run's
    /// messages (e.g. how late delay messages sent with `--deliver-at-ms`
    /// arrive, past the 3 s a drain waits for the next message).
    #[arg(long)]
    run_id: Option<u64>,
    /// Also write the summary as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Connect over TLS, checking the client ports against these CA
    /// certificates (PEM; the nodes' `[tls] ca_file`). gRPC only.
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// Sign every call as this user (with `--secret-key`), as the official
    /// clients do when given credentials. gRPC only.
    #[arg(long, requires = "secret_key")]
    access_key: Option<String>,
    /// The user's secret key.
    #[arg(long, requires = "access_key")]
    secret_key: Option<String>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let endpoints: Vec<String> = args
        .endpoints
        .split([',', ';'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    if endpoints.is_empty() {
        bail!("--endpoints names no address");
    }
    if args.producers == 0 && args.consumers == 0 {
        bail!("nothing to do: --producers 0 and --consumers 0");
    }
    if args.producers == 0 && args.count.is_some() {
        bail!("--count needs producers: consumers alone would never finish");
    }
    ledgermq_bench::payload::check_body_bytes(args.body_bytes).map_err(anyhow::Error::msg)?;
    let remoting = args.protocol == "remoting";
    if remoting
        && (args.create || args.fifo || args.delay_ms.is_some() || args.deliver_at_ms.is_some())
    {
        bail!("--protocol remoting sends normal messages to an existing topic: no --create, --fifo, --delay-ms or --deliver-at-ms");
    }
    if remoting && (args.tls_ca.is_some() || args.access_key.is_some()) {
        bail!("--tls-ca, --access-key and --secret-key are for --protocol grpc");
    }
    let driver = LedgerMq {
        endpoints,
        topic: args.topic.clone(),
        group: args.group.clone(),
        fifo: args.fifo,
        delay_ms: args.delay_ms,
        deliver_at_ms: args.deliver_at_ms,
        call_timeout: Duration::from_millis(args.timeout_ms),
        tls_ca: match &args.tls_ca {
            Some(p) => Some(std::fs::read(p).with_context(|| format!("--tls-ca {}", p.display()))?),
            None => None,
        },
        credentials: args.access_key.clone().zip(args.secret_key.clone()).map(
            |(access_key, secret_key)| ledgermq_proto::signature::Credentials {
                access_key,
                secret_key,
            },
        ),
    };
    if args.create {
        driver.create(args.queues).await?;
        println!(
            "created topic {} ({} queues, fifo {}) and group {}",
            args.topic, args.queues, args.fifo, args.group
        );
    }
    let spec = LoadSpec {
        label: if remoting {
            "ledgermq-remoting"
        } else if args.fifo {
            "ledgermq-fifo"
        } else if args.delay_ms.is_some() || args.deliver_at_ms.is_some() {
            "ledgermq-delay"
        } else {
            "ledgermq"
        }
        .into(),
        producers: args.producers,
        consumers: args.consumers,
        window: args.window,
        rate_per_sec: args.rate,
        body_bytes: args.body_bytes,
        duration: Duration::from_secs(args.duration_secs),
        count: args.count,
        warmup: Duration::from_secs(args.warmup_secs),
        drain: Duration::from_secs(args.drain_secs),
        progress: true,
        run_id: args.run_id,
    };
    let driver: Arc<dyn ledgermq_bench::runner::Driver> = if remoting {
        Arc::new(ledgermq_bench::remoting::LedgerMqRemoting {
            addrs: driver.endpoints.clone(),
            topic: args.topic.clone(),
            group: args.group.clone(),
            queues: args.queues,
            call_timeout: Duration::from_millis(args.timeout_ms),
        })
    } else {
        Arc::new(driver)
    };
    let summary = run(driver, spec).await;
    print!("{}", summary.render());
    if let Some(path) = &args.json {
        Summary::write_json(path, &summary)?;
        println!("summary written to {}", path.display());
    }
    Ok(())
}
