//! `quickstart`: README command one. Starts the `deploy/local` cluster (one
//! `mqnamesrv` on 127.0.0.1:9876 and the three `mqbroker` nodes of `broker-a`,
//! clients on 8081-8083), creates a FIFO topic with `mqadmin`, then runs a demo
//! producer and consumer with the official RocketMQ 5 Rust client: `--groups`
//! message groups sending in order, a FIFO consumer group acking. Half way through
//! it kills the leader (SIGKILL) and reports what happened: sent, acked, received,
//! order kept, and how long sends paused. Exits non-zero if an acknowledged message
//! was lost or a message group arrived out of order.
//!
//! Stores and logs go under `--dir` (default `target/quickstart`, emptied first).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};
use rocketmq::conf::{ClientOption, LoggingFormat, ProducerOption, SimpleConsumerOption};
use rocketmq::model::common::{FilterExpression, FilterType};
use rocketmq::model::message::MessageBuilder;
use rocketmq::{Producer, SimpleConsumer};

const TOPIC: &str = "QuickstartFifo";
const GROUP: &str = "QuickstartConsumers";

#[derive(Parser)]
#[command(
    about = "LedgerMQ quickstart: a local 3-node group, a demo producer and consumer, a leader kill"
)]
struct Args {
    /// Messages to send.
    #[arg(long, default_value_t = 2000)]
    messages: usize,
    /// Message groups (each sends its messages in order).
    #[arg(long, default_value_t = 8)]
    groups: usize,
    /// Body size in bytes.
    #[arg(long, default_value_t = 1024)]
    body_bytes: usize,
    /// Working directory for stores and logs.
    #[arg(long, default_value = "target/quickstart")]
    dir: PathBuf,
    /// Directory of the cluster configurations.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/local"))]
    deploy: PathBuf,
}

#[derive(Default)]
struct Stats {
    acked: BTreeMap<usize, usize>,
    failed_attempts: usize,
    longest_send_ms: u128,
}

fn client_option(access: &str) -> ClientOption {
    let mut o = ClientOption::default();
    o.set_access_url(access);
    o.set_enable_tls(false);
    o.set_long_polling_timeout(Duration::from_secs(5));
    o
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if args.dir.exists() {
        std::fs::remove_dir_all(&args.dir)
            .with_context(|| format!("emptying {}", args.dir.display()))?;
    }
    std::fs::create_dir_all(args.dir.join("logs"))?;
    let deploy = args.deploy.canonicalize().context("deploy directory")?;
    let dir = args.dir.canonicalize()?;
    // The Rust client writes its JSON log to ./logs/rocketmq_client.log.
    std::env::set_current_dir(&dir)?;

    println!(
        "starting mqnamesrv and 3 mqbroker nodes from {} ...",
        deploy.display()
    );
    let opts = ClusterOptions {
        deploy_dir: Some(deploy),
        ..ClusterOptions::default()
    };
    let mut cluster = LocalCluster::start(&dir, &opts).await?;
    let group = cluster.nodes[0].group.clone();
    let leader = cluster.wait_leader(&group, Duration::from_secs(20)).await?;
    println!("{}", cluster.admin(&["clusterList"])?.trim_end());
    print!(
        "{}",
        cluster.admin(&["updateTopic", "-t", TOPIC, "-q", "8", "--fifo"])?
    );
    print!(
        "{}",
        cluster.admin(&["updateSubGroup", "-g", GROUP, "--fifo"])?
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let access = cluster.nodes[leader].client_addr.clone();

    let mut po = ProducerOption::default();
    po.set_topics(vec![TOPIC]);
    po.set_logging_format(LoggingFormat::Json);
    let mut producer = Producer::new(po, client_option(&access))?;
    producer.start().await?;
    let producer = Arc::new(producer);
    let mut co = SimpleConsumerOption::default();
    co.set_topics(vec![TOPIC]);
    co.set_consumer_group(GROUP);
    co.set_logging_format(LoggingFormat::Json);
    let mut consumer = SimpleConsumer::new(co, client_option(&access))?;
    consumer.start().await?;

    let received: Arc<Mutex<Vec<(usize, usize)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let consumer_task = {
        let (received, stop) = (received.clone(), stop.clone());
        tokio::spawn(async move {
            let f = FilterExpression::new(FilterType::Tag, "*");
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // A call may land on the dead node (the client keeps it in its
                // balancing set): try again.
                let Ok(msgs) = consumer
                    .receive_with(TOPIC.to_string(), &f, 32, Duration::from_secs(10))
                    .await
                else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                for m in msgs {
                    let body = m.body();
                    let text = String::from_utf8_lossy(&body[..body.len().min(32)]);
                    if let Some((g, s)) = text.split(' ').next().and_then(|h| h.split_once(':')) {
                        if let (Ok(g), Ok(s)) = (g.parse(), s.parse()) {
                            received.lock().unwrap().push((g, s));
                        }
                    }
                    // Ack until it sticks, or the delivery was replaced by a newer one.
                    let until = Instant::now() + Duration::from_secs(10);
                    while Instant::now() < until {
                        match consumer.ack(&m).await {
                            Ok(_) => break,
                            Err(e) if e.to_string().contains("INVALID_RECEIPT_HANDLE") => break,
                            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                        }
                    }
                }
            }
        })
    };

    let stats = Arc::new(Mutex::new(Stats::default()));
    let per_group = args.messages / args.groups.max(1);
    let sent_total = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    println!(
        "sending {} messages of {} bytes in {} message groups; the leader ({}) is killed half way",
        per_group * args.groups,
        args.body_bytes,
        args.groups,
        cluster.nodes[leader].client_addr
    );
    let started = Instant::now();
    let mut senders = Vec::new();
    for g in 0..args.groups {
        let (producer, stats, sent_total) = (producer.clone(), stats.clone(), sent_total.clone());
        let body_bytes = args.body_bytes;
        senders.push(tokio::spawn(async move {
            for seq in 0..per_group {
                let mut body = format!("{g}:{seq} ").into_bytes();
                body.resize(body_bytes.max(body.len()), b'x');
                let t0 = Instant::now();
                loop {
                    let msg = MessageBuilder::fifo_message_builder(
                        TOPIC,
                        body.clone(),
                        format!("order-{g}"),
                    )
                    .build()
                    .expect("a valid message");
                    match producer.send(msg).await {
                        Ok(_) => break,
                        Err(_) => {
                            stats.lock().unwrap().failed_attempts += 1;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
                sent_total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut s = stats.lock().unwrap();
                s.longest_send_ms = s.longest_send_ms.max(t0.elapsed().as_millis());
                *s.acked.entry(g).or_default() += 1;
            }
        }));
    }
    let half = per_group * args.groups / 2;
    while sent_total.load(std::sync::atomic::Ordering::Relaxed) < half {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cluster.kill(leader);
    println!(
        "killed the leader {} (SIGKILL) after {half} acked sends",
        cluster.nodes[leader].client_addr
    );
    for s in senders {
        s.await?;
    }
    let send_secs = started.elapsed().as_secs_f64();
    let acked_total: usize = stats.lock().unwrap().acked.values().sum();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let distinct = received
            .lock()
            .unwrap()
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        if distinct >= acked_total || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = tokio::time::timeout(Duration::from_secs(15), consumer_task).await;
    let new_leader = cluster
        .wait_leader(&group, Duration::from_secs(10))
        .await
        .ok();

    let got = received.lock().unwrap().clone();
    let mut last: BTreeMap<usize, i64> = BTreeMap::new();
    let mut order_violations = 0;
    for &(g, s) in &got {
        let prev = last.entry(g).or_insert(-1);
        if s as i64 != *prev && s as i64 != *prev + 1 {
            order_violations += 1;
        }
        *prev = (*prev).max(s as i64);
    }
    let distinct: std::collections::BTreeSet<_> = got.iter().collect();
    let lost = acked_total.saturating_sub(distinct.len());
    let s = stats.lock().unwrap();
    println!();
    println!(
        "sent (acked)        {acked_total} in {send_secs:.1} s ({:.0} msgs/s)",
        acked_total as f64 / send_secs
    );
    println!(
        "failed attempts     {} (retried by the demo producer)",
        s.failed_attempts
    );
    println!(
        "received            {} distinct, {} deliveries ({} redelivered)",
        distinct.len(),
        got.len(),
        got.len() - distinct.len()
    );
    println!("lost                {lost}");
    println!(
        "order kept          {}",
        if order_violations == 0 {
            "yes, in every message group"
        } else {
            "NO"
        }
    );
    println!(
        "longest send        {} ms (sends paused while a new leader was elected)",
        s.longest_send_ms
    );
    if let Some(l) = new_leader {
        println!("new leader          {}", cluster.nodes[l].client_addr);
    }
    println!("logs                {}", dir.display());
    if lost > 0 || order_violations > 0 {
        bail!("{lost} acknowledged messages lost, {order_violations} out of order");
    }
    Ok(())
}
