//! 4.x remoting clients, unmodified: PyPI `rocketmq==0.4.4` (the C++ core it
//! bundles speaks the remoting protocol to the name server and the brokers),
//! driven by `tests/python/remoting_check.py`, against three nodes serving
//! `remoting_addr`; and the 5.x Python client on the same topics
//! (`tests/python/cross_check.py`), so messages cross protocols both ways.
//!
//! The client refreshes routes only every 30 s (C++ core) and sends to broker
//! id 0 of its last route until then; a send that fails is retried at once on
//! another broker name, which the name server's failover alias provides
//! (`namesrv/src/remoting.rs`). So a sync send pauses for the client's 3 s
//! send timeout on its connection to the dead node, not the refresh: asserted
//! below. The orderly run's topic is FIFO, which gets no alias, so a keyed send
//! stays on its key's queue (asserted) and waits for the refresh (printed).

use std::time::Duration;

use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};
use ledgermq_tests::python::{json_int, remoting_client_path, run_check, run_check_env};

/// A 3-node group serving remoting, with `topics` of 4 queues (each name
/// paired with extra `updateTopic` arguments).
async fn cluster(dir: &std::path::Path, topics: &[(&str, &[&str])]) -> (LocalCluster, usize) {
    let cluster = LocalCluster::start(
        dir,
        &ClusterOptions {
            remoting: true,
            ..ClusterOptions::default()
        },
    )
    .await
    .unwrap();
    let cmds: Vec<Vec<&str>> = topics
        .iter()
        .map(|(t, extra)| [&["updateTopic", "-t", t, "-q", "4"][..], extra].concat())
        .collect();
    let cmds: Vec<&[&str]> = cmds.iter().map(Vec::as_slice).collect();
    let leader = cluster.prepare("broker-a", &cmds).await.unwrap();
    (cluster, leader)
}

async fn remoting(args: &[&str], limit_s: u64) -> String {
    let path = remoting_client_path();
    run_check_env(
        "remoting_check.py",
        args,
        &[("PYTHONPATH", &path)],
        Duration::from_secs(limit_s),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remoting_producer_and_push_consumer_ride_out_a_leader_kill() {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, leader) = cluster(dir.path(), &[("RemTopic", &[])]).await;
    let pid = cluster.nodes[leader].pid().unwrap().to_string();
    let summary = remoting(
        &[
            "failover",
            "--namesrv",
            &cluster.namesrv_addr,
            "--kill-pid",
            &pid,
            "--messages",
            "100",
        ],
        300,
    )
    .await;
    assert!(json_int(&summary, "received").unwrap() >= json_int(&summary, "sent").unwrap());
    // The client's send timeout and a retry, not its 30 s route refresh.
    let pause_ms = json_int(&summary, "max_send_pause_ms").unwrap();
    assert!(pause_ms < 5_000, "sends paused {pause_ms} ms: {summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remoting_orderly_consumer_keeps_each_key_in_order_through_a_leader_kill() {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, leader) =
        cluster(dir.path(), &[("RemOrder", &["-a", "+message.type=FIFO"])]).await;
    let pid = cluster.nodes[leader].pid().unwrap().to_string();
    remoting(
        &[
            "orderly",
            "--namesrv",
            &cluster.namesrv_addr,
            "--kill-pid",
            &pid,
            "--messages",
            "160",
        ],
        300,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_cross_between_remoting_and_grpc_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, _) = cluster(dir.path(), &[("CrossA", &[]), ("CrossB", &[])]).await;
    let ns = cluster.namesrv_addr.clone();
    let access = cluster.nodes[1].client_addr.clone();
    let common = |topic: &'static str, prefix: &'static str| {
        vec!["--topic", topic, "--prefix", prefix, "--count", "20"]
    };
    // Sent over remoting (singles and a batch), received over gRPC.
    let mut a = vec!["send", "--namesrv", &ns];
    a.extend(common("CrossA", "ca"));
    remoting(&a, 120).await;
    let mut b = vec!["receive", "--access", &access];
    b.extend(common("CrossA", "ca"));
    run_check("cross_check.py", &b, Duration::from_secs(120)).await;
    // Sent over gRPC, pulled over remoting.
    let mut c = vec!["send", "--access", &access];
    c.extend(common("CrossB", "cb"));
    run_check("cross_check.py", &c, Duration::from_secs(120)).await;
    let mut d = vec!["pull", "--namesrv", &ns, "--wait", "30"];
    d.extend(common("CrossB", "cb"));
    remoting(&d, 120).await;
}

/// A 4.x producer sends to a topic no one created, with the brokers'
/// auto-creation on: the C++ core reads the route of RocketMQ's default topic
/// TBW102 (which nodes that create topics announce), sends there, and the
/// topic is created; a pull consumer then reads the messages back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4x_producer_creates_a_topic_on_first_use() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(
        dir.path(),
        &ClusterOptions {
            remoting: true,
            auto_create_topics: true,
            ..ClusterOptions::default()
        },
    )
    .await
    .unwrap();
    cluster.prepare("broker-a", &[]).await.unwrap();
    let ns = cluster.namesrv_addr.clone();
    let common = ["--topic", "FirstUse", "--prefix", "fu", "--count", "6"];
    let mut send = vec!["send", "--namesrv", &ns];
    send.extend(common);
    remoting(&send, 60).await;
    let mut pull = vec!["pull", "--namesrv", &ns, "--wait", "30"];
    pull.extend(common);
    remoting(&pull, 60).await;
    let list = cluster.admin(&["topicList"]).unwrap();
    assert!(list.lines().any(|l| l == "FirstUse"), "{list}");
}
