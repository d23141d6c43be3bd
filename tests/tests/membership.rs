//! Membership changes with `mqadmin` on real processes while a producer runs
//! (issue 18): a follower's disk dies (its process killed, its store deleted), a
//! new node started with `join = true` is added with `addNode` and the dead one
//! removed with `removeNode`; then the leader itself is removed (it hands
//! leadership over first). A consumer receives and acks all the while. Every
//! send is acknowledged by some member within the producer's retries, sends
//! keep being acknowledged after each change, the consumer receives every
//! acknowledged message, the group's queues hold at least every acknowledged
//! message, and `verifyReplicas` finds the remaining members identical (the
//! new node included). The longest gap between acknowledgements around the leader's
//! removal is printed, not asserted (timing on a shared machine is noisy).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ledgermq_broker::admin_pb::broker_admin_client::BrokerAdminClient;
use ledgermq_broker::admin_pb::LogDigestRequest;
use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};
use ledgermq_tests::grpc::{receive_and_ack, send_one};

const TOPIC: &str = "TopicMembers";
const GROUP: &str = "broker-a";
const CONSUMER_GROUP: &str = "MembersConsumers";

/// Receives and acks `TOPIC` for `CONSUMER_GROUP` until `stop`, through the
/// next address of `addrs` after each failed call; every body received goes
/// into `received`.
fn spawn_consumer(
    addrs: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    received: Arc<Mutex<std::collections::BTreeSet<String>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut turn = 0usize;
        while !stop.load(Ordering::Relaxed) {
            let addr = {
                let a = addrs.lock().unwrap();
                a[turn % a.len()].clone()
            };
            match receive_and_ack(&addr, CONSUMER_GROUP, TOPIC, "members-consumer@1").await {
                Ok(bodies) => received.lock().unwrap().extend(bodies),
                Err(_) => {
                    turn += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    })
}

/// What the producer saw.
#[derive(Default)]
struct Sent {
    /// Bodies acknowledged, with when.
    acked: Vec<(String, Instant)>,
    /// Sends no member acknowledged.
    failed: Vec<String>,
}

/// Sends one message after another until `stop`, each to the next address of
/// `addrs` (which the test changes as members come and go); a send that is not
/// acknowledged is tried on the next address, for up to 10 s.
fn spawn_producer(
    addrs: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    sent: Arc<Mutex<Sent>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut i = 0usize;
        while !stop.load(Ordering::Relaxed) {
            let body = format!("member-msg-{i:06}");
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut attempt = i;
            loop {
                let addr = {
                    let a = addrs.lock().unwrap();
                    a[attempt % a.len()].clone()
                };
                if send_one(&addr, TOPIC, &body).await.is_ok() {
                    sent.lock().unwrap().acked.push((body, Instant::now()));
                    break;
                }
                if Instant::now() > deadline {
                    sent.lock().unwrap().failed.push(body);
                    break;
                }
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            i += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
}

/// Waits until the producer has `more` acknowledgements beyond what it had.
async fn wait_acks(sent: &Mutex<Sent>, more: usize, what: &str) {
    let want = sent.lock().unwrap().acked.len() + more;
    let deadline = Instant::now() + Duration::from_secs(30);
    while sent.lock().unwrap().acked.len() < want {
        assert!(Instant::now() < deadline, "no acknowledgements {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The longest time between two acknowledgements from `from` on.
fn longest_gap(sent: &Sent, from: Instant) -> Duration {
    let times: Vec<Instant> = sent
        .acked
        .iter()
        .map(|(_, t)| *t)
        .filter(|t| *t >= from)
        .collect();
    times
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqadmin_replaces_a_dead_node_and_removes_the_leader_while_a_producer_runs() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(dir.path(), &ClusterOptions::default())
        .await
        .unwrap();
    let leader = cluster
        .prepare(GROUP, &[&["updateTopic", "-t", TOPIC, "-q", "2"]])
        .await
        .unwrap();
    let addrs = Arc::new(Mutex::new(cluster.client_addrs(GROUP)));
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(Mutex::new(Sent::default()));
    let producer = spawn_producer(addrs.clone(), stop.clone(), sent.clone());
    let stop_consumer = Arc::new(AtomicBool::new(false));
    let received = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
    let consumer = spawn_consumer(addrs.clone(), stop_consumer.clone(), received.clone());
    wait_acks(&sent, 20, "at start").await;

    // A follower's disk dies.
    let dead = (leader + 1) % 3;
    let dead_addr = cluster.nodes[dead].client_addr.clone();
    addrs.lock().unwrap().retain(|a| *a != dead_addr);
    cluster.kill(dead);
    std::fs::remove_dir_all(dir.path().join(format!("{GROUP}-n{dead}"))).unwrap();
    // Its replacement: a new id, an empty store, joining the running group.
    let (new_idx, peer_addr) = match cluster.start_joiner(GROUP, 3) {
        Ok(j) => j,
        Err(e) => {
            let log = std::fs::read_to_string(dir.path().join(format!("{GROUP}-n3.log")));
            panic!(
                "the joining node did not start: {e}\n{}",
                log.unwrap_or_default()
            );
        }
    };
    let out = cluster
        .admin(&["addNode", "-b", GROUP, "-i", "3", "-p", &peer_addr])
        .unwrap();
    assert!(out.contains("node 3 added"), "{out}");
    let dead_id = dead.to_string();
    let out = cluster
        .admin(&["removeNode", "-b", GROUP, "-i", &dead_id])
        .unwrap();
    assert!(out.contains(&format!("node {dead} removed")), "{out}");
    addrs
        .lock()
        .unwrap()
        .push(cluster.nodes[new_idx].client_addr.clone());
    wait_acks(&sent, 20, "after the replacement").await;
    let status = cluster.admin(&["raftStatus", "-b", GROUP]).unwrap();
    println!("{status}");

    // The leader itself goes: it hands leadership over, the next leader removes it.
    let leader = cluster
        .wait_leader(GROUP, Duration::from_secs(10))
        .await
        .unwrap();
    let leader_id = cluster.nodes[leader].node_id.to_string();
    let removal = Instant::now();
    let out = cluster
        .admin(&["removeNode", "-b", GROUP, "-i", &leader_id])
        .unwrap();
    assert!(out.contains(&format!("node {leader_id} removed")), "{out}");
    let leader_addr = cluster.nodes[leader].client_addr.clone();
    addrs.lock().unwrap().retain(|a| *a != leader_addr);
    wait_acks(&sent, 20, "after the leader's removal").await;
    // The removed node still runs (it never receives its removal, and stays a
    // learner in its own view): no leader replicates to it, so it tells the
    // name servers it is cut off, and routes leave it out.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = cluster.admin(&["clusterList"]).unwrap();
        let line = list
            .lines()
            .find(|l| l.split_whitespace().nth(3) == Some(leader_addr.as_str()))
            .unwrap_or_default()
            .to_owned();
        if line.ends_with("cut-off") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the removed node is still routed:\n{list}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::Relaxed);
    producer.await.unwrap();
    cluster.kill(leader);

    let sent = std::mem::take(&mut *sent.lock().unwrap());
    assert!(
        sent.failed.is_empty(),
        "sends never acknowledged: {:?}",
        sent.failed
    );
    // The consumer gets every acknowledged message: within the receive's
    // invisible duration (30 s) and then some, for a message delivered in a
    // reply that was lost.
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        let missing = {
            let got = received.lock().unwrap();
            sent.acked.iter().filter(|(b, _)| !got.contains(b)).count()
        };
        if missing == 0 {
            break;
        }
        if Instant::now() >= deadline {
            let got = received.lock().unwrap();
            let lost: Vec<String> = sent
                .acked
                .iter()
                .filter(|(b, _)| !got.contains(b))
                .map(|(b, at)| {
                    format!(
                        "{b} (acknowledged {:?} after the removal began)",
                        at.checked_duration_since(removal)
                    )
                })
                .collect();
            panic!("{missing} acknowledged message(s) never received: {lost:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop_consumer.store(true, Ordering::Relaxed);
    consumer.await.unwrap();
    println!(
        "{} messages acknowledged; longest gap between acknowledgements from the leader's removal on: {:?}",
        sent.acked.len(),
        longest_gap(&sent, removal)
    );
    // The remaining members hold the same entries, and at least every
    // acknowledged message (a send retried after a lost answer may be stored twice).
    let out = cluster.admin(&["verifyReplicas", "-b", GROUP]).unwrap();
    println!("{out}");
    assert!(out.contains("identical"), "{out}");
    // Acknowledged means committed, not applied everywhere: the new node may
    // still be applying the last few.
    let channel = tonic::transport::Endpoint::from_shared(format!(
        "http://{}",
        cluster.nodes[new_idx].client_addr
    ))
    .unwrap()
    .connect()
    .await
    .unwrap();
    let mut admin = BrokerAdminClient::new(channel);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let digest = admin
            .log_digest(LogDigestRequest {
                from_index: 0,
                max_entries: 1,
            })
            .await
            .unwrap()
            .into_inner();
        let held: u64 = digest
            .queues
            .iter()
            .filter(|q| q.topic == TOPIC)
            .map(|q| q.max_offset - q.min_offset)
            .sum();
        if held >= sent.acked.len() as u64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new node holds {held} messages of {} acknowledged",
            sent.acked.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
