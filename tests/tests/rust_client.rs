//! The official RocketMQ 5 Rust client (`rocketmq` 5.0.0 from crates.io, unmodified)
//! against a real cluster (`mqnamesrv` and three `mqbroker` processes): normal
//! messages with tags and keys, FIFO messages in several message groups, tag
//! filtering, SimpleConsumer receive/ack, and the leader killed with SIGKILL in the
//! middle. Every acknowledged message must be received; each message group in
//! order; nothing the filter excludes.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};
use rocketmq::conf::{ClientOption, LoggingFormat, ProducerOption, SimpleConsumerOption};
use rocketmq::model::common::{FilterExpression, FilterType};
use rocketmq::model::message::{Message, MessageBuilder};
use rocketmq::{Producer, SimpleConsumer};

const NORMAL: &str = "RustNormal";
const FIFO: &str = "RustFifo";
const MESSAGES: usize = 200;
const GROUPS: usize = 4;
const FIFO_PER_GROUP: usize = 30;

fn client_option(access: &str) -> ClientOption {
    let mut o = ClientOption::default();
    o.set_access_url(access);
    o.set_enable_tls(false);
    o.set_timeout(Duration::from_secs(3));
    o.set_long_polling_timeout(Duration::from_secs(5));
    o
}

async fn producer(access: &str, topics: &[&str]) -> Producer {
    let mut po = ProducerOption::default();
    po.set_topics(topics.to_vec());
    po.set_logging_format(LoggingFormat::Terminal);
    let mut p = Producer::new(po, client_option(access)).unwrap();
    p.start().await.unwrap();
    p
}

async fn consumer(access: &str, group: &str, topic: &str) -> SimpleConsumer {
    let mut co = SimpleConsumerOption::default();
    co.set_topics(vec![topic]);
    co.set_consumer_group(group);
    co.set_logging_format(LoggingFormat::Terminal);
    let mut c = SimpleConsumer::new(co, client_option(access)).unwrap();
    c.start().await.unwrap();
    c
}

/// Sends until acknowledged or `limit` passes (the client itself does not retry).
async fn send_retrying<M: Message>(p: &Producer, build: impl Fn() -> M, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if p.send(build()).await.is_ok() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Received (body) values in receipt order.
type Log = Arc<Mutex<Vec<String>>>;

fn spawn_consumer(
    c: SimpleConsumer,
    topic: &'static str,
    filter: &'static str,
    log: Log,
    stop: Arc<Mutex<bool>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let f = FilterExpression::new(FilterType::Tag, filter);
        while !*stop.lock().unwrap() {
            let Ok(msgs) = c
                .receive_with(topic.to_string(), &f, 16, Duration::from_secs(5))
                .await
            else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            for m in msgs {
                let body = String::from_utf8_lossy(m.body()).into_owned();
                // Ack until it sticks or the message's delivery is replaced.
                for _ in 0..20 {
                    match c.ack(&m).await {
                        Ok(_) => break,
                        Err(e) if e.to_string().contains("INVALID_RECEIPT_HANDLE") => break,
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                }
                log.lock().unwrap().push(body);
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn official_rust_client_survives_a_leader_kill() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(dir.path(), &ClusterOptions::default())
        .await
        .unwrap();
    let leader = cluster
        .prepare(
            "broker-a",
            &[
                &["updateTopic", "-t", NORMAL, "-q", "4"],
                &["updateTopic", "-t", FIFO, "-q", "4", "--fifo"],
                &["updateSubGroup", "-g", "RustTags"],
                &["updateSubGroup", "-g", "RustFifo", "--fifo"],
            ],
        )
        .await
        .unwrap();
    let access = cluster.nodes[leader].client_addr.clone();

    let stop = Arc::new(Mutex::new(false));
    let tags_log: Log = Arc::default();
    let fifo_log: Log = Arc::default();
    let tags = spawn_consumer(
        consumer(&access, "RustTags", NORMAL).await,
        NORMAL,
        "TagA||TagB",
        tags_log.clone(),
        stop.clone(),
    );
    let fifo = spawn_consumer(
        consumer(&access, "RustFifo", FIFO).await,
        FIFO,
        "*",
        fifo_log.clone(),
        stop.clone(),
    );

    let p = producer(&access, &[NORMAL, FIFO]).await;
    let mut acked = HashSet::new();
    let mut fifo_acked: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let mut excluded_sent = 0;
    let mut pause_ms = 0u128;
    for i in 0..MESSAGES {
        if i == MESSAGES / 2 {
            cluster.kill(leader);
        }
        let tag = ["TagA", "TagB", "TagC"][i % 3];
        let body = format!("n-{i}");
        let t0 = Instant::now();
        let ok = send_retrying(
            &p,
            || {
                MessageBuilder::builder()
                    .set_topic(NORMAL)
                    .set_body(body.clone().into_bytes())
                    .set_tag(tag)
                    .set_keys(vec![format!("key-{i}")])
                    .build()
                    .unwrap()
            },
            Duration::from_secs(20),
        )
        .await;
        pause_ms = pause_ms.max(t0.elapsed().as_millis());
        assert!(ok, "send {i} never acknowledged");
        if tag == "TagC" {
            excluded_sent += 1;
        } else {
            acked.insert(body);
        }
        // FIFO: one message of each group per round.
        if i % (MESSAGES / FIFO_PER_GROUP) == 0 {
            for g in 0..GROUPS {
                let seq = fifo_acked.entry(g).or_default().len();
                let body = format!("g{g}:{seq}");
                let ok = send_retrying(
                    &p,
                    || {
                        MessageBuilder::fifo_message_builder(
                            FIFO,
                            body.clone().into_bytes(),
                            format!("group-{g}"),
                        )
                        .build()
                        .unwrap()
                    },
                    Duration::from_secs(20),
                )
                .await;
                assert!(ok, "FIFO send {body} never acknowledged");
                fifo_acked.get_mut(&g).unwrap().push(seq);
            }
        }
    }
    println!("longest send (with client-side retries) across the leader kill: {pause_ms} ms");
    let fifo_total: usize = fifo_acked.values().map(Vec::len).sum();

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got_tags: HashSet<String> = tags_log.lock().unwrap().iter().cloned().collect();
        let got_fifo: HashSet<String> = fifo_log.lock().unwrap().iter().cloned().collect();
        if acked.is_subset(&got_tags) && got_fifo.len() >= fifo_total {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "lost: {} normal, fifo received {} of {fifo_total}",
            acked.difference(&got_tags).count(),
            got_fifo.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    *stop.lock().unwrap() = true;
    let _ = tokio::time::timeout(Duration::from_secs(10), tags).await;
    let _ = tokio::time::timeout(Duration::from_secs(10), fifo).await;

    let tags_got = tags_log.lock().unwrap().clone();
    assert!(excluded_sent > 0);
    for b in &tags_got {
        let i: usize = b[2..].parse().unwrap();
        assert_ne!(i % 3, 2, "TagC message {b} passed the TagA||TagB filter");
    }
    // Each message group arrives in order: a message is delivered for the
    // first time only right after the group's previous one; a redelivery may
    // repeat messages delivered before (a FIFO batch not acked comes back from
    // its first unacked message), never skip one.
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    let mut seen: HashSet<String> = HashSet::new();
    for b in fifo_log.lock().unwrap().iter() {
        let (g, seq) = b.split_once(':').unwrap();
        let seq: i64 = seq.parse().unwrap();
        let again = !seen.insert(b.clone());
        let prev = last.entry(g.to_string()).or_insert(-1);
        assert!(
            seq == *prev + 1 || (again && seq <= *prev),
            "group {g}: {seq} after {prev}"
        );
        *prev = (*prev).max(seq);
    }
    println!(
        "acked {} normal + {fifo_total} FIFO; received {} normal deliveries, {} FIFO deliveries",
        acked.len(),
        tags_got.len(),
        fifo_log.lock().unwrap().len()
    );
}

/// A FIFO batch in flight when the leader dies stays with its consumer: the new
/// leader neither delivers it again nor the group's next message before its
/// invisible time ends, and the old receipt handles still ack it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fifo_delivery_in_flight_survives_a_leader_kill() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(dir.path(), &ClusterOptions::default())
        .await
        .unwrap();
    let leader = cluster
        .prepare(
            "broker-a",
            &[
                &["updateTopic", "-t", NORMAL, "-q", "1"],
                &["updateTopic", "-t", FIFO, "-q", "1", "--fifo"],
                &["updateSubGroup", "-g", "LeaseGroup", "--fifo"],
            ],
        )
        .await
        .unwrap();
    let access = cluster.nodes[leader].client_addr.clone();
    let p = producer(&access, &[NORMAL, FIFO]).await;
    for seq in 0..3 {
        let m = MessageBuilder::fifo_message_builder(FIFO, format!("g0:{seq}").into_bytes(), "g0")
            .build()
            .unwrap();
        p.send(m).await.unwrap();
    }
    let holder = consumer(&access, "LeaseGroup", FIFO).await;
    let all = FilterExpression::new(FilterType::Tag, "*");
    let got = holder
        .receive_with(FIFO.to_string(), &all, 8, Duration::from_secs(30))
        .await
        .unwrap();
    let bodies: Vec<_> = got.iter().map(|m| m.body().to_vec()).collect();
    assert_eq!(
        bodies,
        [&b"g0:0"[..], b"g0:1", b"g0:2"],
        "a FIFO queue hands out a batch in order"
    );

    cluster.kill(leader);
    cluster
        .wait_leader("broker-a", Duration::from_secs(20))
        .await
        .unwrap();
    // Routes leave the dead node out after three name-server heartbeats (3 s here);
    // the Rust client 5.0.0 panics if its first call to an endpoint cannot connect.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let other_addr = cluster.client_addrs("broker-a")[0].clone();
    let other = consumer(&other_addr, "LeaseGroup", FIFO).await;
    // For a few seconds after the new leader is ready, nothing of the group may be
    // delivered: g0:0 is still invisible with its first consumer.
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        if let Ok(msgs) = other
            .receive_with(FIFO.to_string(), &all, 8, Duration::from_secs(30))
            .await
        {
            let bodies: Vec<_> = msgs
                .iter()
                .map(|m| String::from_utf8_lossy(m.body()).into_owned())
                .collect();
            assert!(
                bodies.is_empty(),
                "delivered while the batch is in flight: {bodies:?}"
            );
        }
    }
    // The first consumer's handles, issued by the dead leader, ack the batch.
    for m in &got {
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Err(e) = holder.ack(m).await {
            assert!(Instant::now() < deadline, "old handle never acked: {e}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let p = producer(&other_addr, &[NORMAL, FIFO]).await;
    let g0_3 = || {
        MessageBuilder::fifo_message_builder(FIFO, b"g0:3".to_vec(), "g0")
            .build()
            .unwrap()
    };
    assert!(
        send_retrying(&p, g0_3, Duration::from_secs(20)).await,
        "g0:3 never acknowledged"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(msgs) = other
            .receive_with(FIFO.to_string(), &all, 8, Duration::from_secs(30))
            .await
        {
            if let Some(m) = msgs.first() {
                assert_eq!(m.body(), b"g0:3", "the next message after the acked ones");
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "g0:3 never delivered after the acks"
        );
    }
}

/// Delay messages built with the client's `delay_message_builder` (epoch seconds)
/// to a DELAY topic: none is received before its time, and every one after it
/// although the leader is killed (SIGKILL) right after the sends, so they fall
/// due during or after the election and the next leader delivers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delay_messages_arrive_after_their_time_through_a_leader_kill() {
    const DELAY: &str = "RustDelay";
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(dir.path(), &ClusterOptions::default())
        .await
        .unwrap();
    let leader = cluster
        .prepare(
            "broker-a",
            &[
                &[
                    "updateTopic",
                    "-t",
                    DELAY,
                    "-q",
                    "4",
                    "-a",
                    "+message.type=DELAY",
                ],
                &["updateSubGroup", "-g", "RustDelay"],
            ],
        )
        .await
        .unwrap();
    let access = cluster.nodes[(leader + 1) % 3].client_addr.clone();
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    // (body, when first received, ms since the epoch)
    let got: Arc<Mutex<BTreeMap<String, i64>>> = Arc::default();
    let stop = Arc::new(Mutex::new(false));
    let c = consumer(&access, "RustDelay", DELAY).await;
    let receiver = tokio::spawn({
        let (got, stop) = (got.clone(), stop.clone());
        async move {
            let all = FilterExpression::new(FilterType::Tag, "*");
            while !*stop.lock().unwrap() {
                let Ok(msgs) = c
                    .receive_with(DELAY.to_string(), &all, 16, Duration::from_secs(10))
                    .await
                else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let at = now_ms();
                for m in msgs {
                    let body = String::from_utf8_lossy(m.body()).into_owned();
                    got.lock().unwrap().entry(body).or_insert(at);
                    let _ = c.ack(&m).await;
                }
            }
        }
    });
    let p = producer(&access, &[DELAY]).await;
    let mut due: BTreeMap<String, i64> = BTreeMap::new();
    for i in 0..30 {
        let at_s = now_ms() / 1000 + 3 + i % 3;
        let body = format!("d-{i}");
        let ok = send_retrying(
            &p,
            || {
                MessageBuilder::delay_message_builder(DELAY, body.clone().into_bytes(), at_s)
                    .build()
                    .unwrap()
            },
            Duration::from_secs(20),
        )
        .await;
        assert!(ok, "delay send {body} never acknowledged");
        due.insert(body, at_s * 1000);
    }
    cluster.kill(leader);
    let deadline = Instant::now() + Duration::from_secs(60);
    while due.keys().any(|b| !got.lock().unwrap().contains_key(b)) {
        assert!(
            Instant::now() < deadline,
            "delay messages lost: {:?}",
            due.keys()
                .filter(|b| !got.lock().unwrap().contains_key(*b))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    *stop.lock().unwrap() = true;
    let _ = tokio::time::timeout(Duration::from_secs(15), receiver).await;
    let got = got.lock().unwrap();
    let mut late_ms: Vec<i64> = Vec::new();
    for (b, at) in &due {
        let r = got[b];
        assert!(r >= *at, "{b} received {} ms before its time", at - r);
        late_ms.push(r - at);
    }
    late_ms.sort();
    println!(
        "30 delay messages through a leader kill: received {} to {} ms after their time",
        late_ms[0],
        late_ms[late_ms.len() - 1]
    );
}

/// Transactional messages with the client's transaction producer
/// (`new_transaction_producer`, `transaction_message_builder`,
/// `send_transaction_message`, `commit` / `rollback`) to a TRANSACTION topic,
/// the leader killed (SIGKILL) half way: every message whose commit was answered
/// OK is received, none whose rollback was; a half whose send or end failed
/// (and an orphan left unended on purpose) is checked back through the
/// client's Telemetry stream and ends as the checker says (by its body).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactions_commit_and_roll_back_through_a_leader_kill() {
    use rocketmq::model::transaction::{Transaction, TransactionResolution};
    const TX: &str = "RustTx";
    let dir = tempfile::tempdir().unwrap();
    let opts = ClusterOptions {
        transaction_checks: Some((1_000, 15)),
        ..ClusterOptions::default()
    };
    let mut cluster = LocalCluster::start(dir.path(), &opts).await.unwrap();
    let leader = cluster
        .prepare(
            "broker-a",
            &[
                &[
                    "updateTopic",
                    "-t",
                    TX,
                    "-q",
                    "4",
                    "-a",
                    "+message.type=TRANSACTION",
                ],
                &["updateSubGroup", "-g", TX],
            ],
        )
        .await
        .unwrap();
    let access = cluster.nodes[(leader + 1) % 3].client_addr.clone();
    let log: Log = Arc::default();
    let stop = Arc::new(Mutex::new(false));
    let receiver = spawn_consumer(
        consumer(&access, TX, TX).await,
        TX,
        "*",
        log.clone(),
        stop.clone(),
    );
    let checked: Log = Arc::default();
    let mut po = ProducerOption::default();
    po.set_topics(vec![TX]);
    po.set_logging_format(LoggingFormat::Terminal);
    let checker = {
        let checked = checked.clone();
        Box::new(
            move |_txid: String, m: rocketmq::model::message::MessageView| {
                let body = String::from_utf8_lossy(m.body()).into_owned();
                let commit = body.starts_with('c');
                checked.lock().unwrap().push(body);
                if commit {
                    TransactionResolution::COMMIT
                } else {
                    TransactionResolution::ROLLBACK
                }
            },
        )
    };
    let mut p = Producer::new_transaction_producer(po, client_option(&access), checker).unwrap();
    p.start().await.unwrap();

    let (mut committed, mut rolled_back, mut sent) =
        (HashSet::new(), HashSet::new(), HashSet::new());
    for i in 0..40 {
        if i == 20 {
            cluster.kill(leader);
        }
        let body = format!("{}-{i}", if i % 2 == 0 { "c" } else { "r" });
        let deadline = Instant::now() + Duration::from_secs(20);
        let tx = loop {
            let m = MessageBuilder::transaction_message_builder(TX, body.clone().into_bytes())
                .build()
                .unwrap();
            match p.send_transaction_message(m).await {
                Ok(tx) => break tx,
                Err(e) => {
                    assert!(Instant::now() < deadline, "{body} never sent: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        assert!(!tx.transaction_id().is_empty());
        sent.insert(body.clone());
        // An end that fails is left to the check back (commit consumes `tx`).
        if body.starts_with('c') {
            if tx.commit().await.is_ok() {
                committed.insert(body);
            }
        } else if tx.rollback().await.is_ok() {
            rolled_back.insert(body);
        }
    }
    // An orphan: checked back and committed by the checker.
    let deadline = Instant::now() + Duration::from_secs(20);
    let orphan_tx = loop {
        let orphan = MessageBuilder::transaction_message_builder(TX, b"c-orphan".to_vec())
            .build()
            .unwrap();
        // The client keeps the killed node in its balancing set: retry.
        match p.send_transaction_message(orphan).await {
            Ok(tx) => break tx,
            Err(e) => {
                assert!(Instant::now() < deadline, "the orphan was never sent: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let want: HashSet<String> = sent
        .iter()
        .filter(|b| b.starts_with('c'))
        .cloned()
        .chain(["c-orphan".to_owned()])
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got: HashSet<String> = log.lock().unwrap().iter().cloned().collect();
        if want.is_subset(&got) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "committed messages never received: {:?} (checked back: {:?})",
            want.difference(&got).collect::<Vec<_>>(),
            checked.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Late deliveries of rolled-back halves would come now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    *stop.lock().unwrap() = true;
    let _ = tokio::time::timeout(Duration::from_secs(15), receiver).await;
    let got: HashSet<String> = log.lock().unwrap().iter().cloned().collect();
    let leaked: Vec<&String> = got.iter().filter(|b| b.starts_with('r')).collect();
    assert!(
        leaked.is_empty(),
        "rolled-back messages received: {leaked:?}"
    );
    assert!(committed.is_subset(&got));
    assert!(
        checked.lock().unwrap().iter().any(|b| b == "c-orphan"),
        "the orphan {} was not checked back",
        orphan_tx.transaction_id()
    );
    println!(
        "40 transactions through a leader kill: {} commits and {} rollbacks answered OK, {} received, checked back: {:?}",
        committed.len(),
        rolled_back.len(),
        got.len(),
        checked.lock().unwrap()
    );
}
