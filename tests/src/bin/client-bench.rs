//! `client-bench`: acked sends per second and send latency of the official RocketMQ
//! Rust client (`rocketmq` 5.0.0) against a local cluster of real processes (one
//! name server, one 3-node group, started here on free loopback ports).
//!
//! `--senders N` tasks share one producer, each with one send outstanding (so N
//! un-acked sends in all), for `--seconds`; `--rate R` paces the offered load to R
//! sends/s instead (latency at a fixed load). Prints sends/s, MB/s and latency
//! percentiles (ms).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Parser;
use hdrhistogram::Histogram;
use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};
use rocketmq::conf::{ClientOption, LoggingFormat, ProducerOption};
use rocketmq::model::message::MessageBuilder;
use rocketmq::Producer;

#[derive(Parser)]
#[command(about = "Official Rust client send throughput and latency against a local 3-node group")]
struct Args {
    /// Concurrent senders (un-acked sends in flight).
    #[arg(long, default_value_t = 64)]
    senders: usize,
    /// Seconds to measure (after a 2 s warm-up).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Body size in bytes.
    #[arg(long, default_value_t = 1024)]
    body_bytes: usize,
    /// `sync` or `async` flush on the brokers.
    #[arg(long, default_value = "sync")]
    flush: String,
    /// Offered load in sends/s (0: as fast as the senders go).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Queues of the topic.
    #[arg(long, default_value_t = 8)]
    queues: u32,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("logs"))?;
    std::env::set_current_dir(dir.path())?;
    let opts = ClusterOptions {
        flush: args.flush.clone(),
        ..ClusterOptions::default()
    };
    let cluster = LocalCluster::start(dir.path(), &opts).await?;
    cluster.admin(&["updateTopic", "-t", "Bench", "-q", &args.queues.to_string()])?;
    let leader = cluster
        .wait_leader("broker-a", Duration::from_secs(10))
        .await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut co = ClientOption::default();
    co.set_access_url(&cluster.nodes[leader].client_addr);
    co.set_enable_tls(false);
    let mut po = ProducerOption::default();
    po.set_topics(vec!["Bench"]);
    po.set_logging_format(LoggingFormat::Json);
    let mut p = Producer::new(po, co)?;
    p.start().await?;
    let p = Arc::new(p);

    let hist = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(
        1, 60_000_000, 3,
    )?));
    let errors = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let per_sender_interval =
        (args.rate > 0).then(|| Duration::from_secs_f64(args.senders as f64 / args.rate as f64));
    let mut tasks = Vec::new();
    for s in 0..args.senders {
        let (p, hist, errors, measuring, stop) = (
            p.clone(),
            hist.clone(),
            errors.clone(),
            measuring.clone(),
            stop.clone(),
        );
        let body = vec![b'x'; args.body_bytes];
        tasks.push(tokio::spawn(async move {
            // Spread the paced senders over one interval.
            let mut next = Instant::now()
                + per_sender_interval.map_or(Duration::ZERO, |i| i.mul_f64(s as f64 / 64.0));
            while !stop.load(Ordering::Relaxed) {
                if let Some(i) = per_sender_interval {
                    tokio::time::sleep_until(next.into()).await;
                    next += i;
                }
                let m = MessageBuilder::builder()
                    .set_topic("Bench")
                    .set_body(body.clone())
                    .build()
                    .expect("a valid message");
                let t0 = Instant::now();
                let ok = p.send(m).await.is_ok();
                if measuring.load(Ordering::Relaxed) {
                    if ok {
                        let us = t0.elapsed().as_micros() as u64;
                        hist.lock().unwrap().record(us.max(1)).ok();
                    } else {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    measuring.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    measuring.store(false, Ordering::Relaxed);
    let secs = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let h = hist.lock().unwrap();
    let rate = h.len() as f64 / secs;
    println!(
        "official Rust client, {} B bodies, flush {}, {} senders{}: {:.0} acked sends/s ({:.1} MB/s), errors {}",
        args.body_bytes,
        args.flush,
        args.senders,
        if args.rate > 0 { format!(" at {} sends/s offered", args.rate) } else { String::new() },
        rate,
        rate * args.body_bytes as f64 / 1e6,
        errors.load(Ordering::Relaxed)
    );
    println!(
        "send latency ms: p50 {:.2}  p90 {:.2}  p99 {:.2}  p999 {:.2}  max {:.2}",
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.9) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.value_at_quantile(0.999) as f64 / 1000.0,
        h.max() as f64 / 1000.0
    );
    Ok(())
}
