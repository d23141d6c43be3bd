//! Writes forwarded between nodes whose wall clocks disagree (issue 14, found by the
//! jepsen clock-skew fault): a follower forwards a send to the leader with the time
//! it has left, which must not depend on the two nodes' wall clocks agreeing. Real
//! `mqbroker` processes, each under libfaketime (`LD_PRELOAD`, an offset file per
//! node, monotonic clocks untouched: `ledgermq_jepsen::node_env`), as in
//! `jepsen run`; skipped when libfaketime is not installed.

use std::path::Path;
use std::time::Duration;

use ledgermq_broker::pb::messaging_service_client::MessagingServiceClient;
use ledgermq_broker::pb::{Code, Message, Resource, SendMessageRequest, SystemProperties};
use ledgermq_jepsen::node_env::{self, libfaketime, set_clock_offset};
use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};
use tonic::transport::Channel;

/// How far the skewed node's wall clock is moved, s: four times the 2.5 s write
/// timeout a forwarded write is given.
const SKEW_S: i64 = 10;

/// Sends through each follower per phase.
const SENDS: usize = 8;

fn message(topic: &str, id: &str) -> Message {
    Message {
        topic: Some(Resource {
            resource_namespace: String::new(),
            name: topic.into(),
        }),
        user_properties: Default::default(),
        system_properties: Some(SystemProperties {
            message_id: id.into(),
            message_type: ledgermq_broker::pb::MessageType::Normal as i32,
            ..Default::default()
        }),
        body: id.as_bytes().to_vec(),
    }
}

/// One send of one message, as the official clients make it; its status code.
async fn send(c: &mut MessagingServiceClient<Channel>, topic: &str, id: &str) -> i32 {
    let mut req = tonic::Request::new(SendMessageRequest {
        messages: vec![message(topic, id)],
    });
    req.metadata_mut()
        .insert("x-mq-client-id", "clock-skew-test@1".parse().unwrap());
    req.set_timeout(Duration::from_secs(10));
    let r = c.send_message(req).await.unwrap().into_inner();
    r.status.unwrap().code
}

/// Node `i`'s wall clock as the node sees it (`date +%s` under its environment),
/// minus the real one, s: proves the offset file took effect.
fn clock_offset_seen(env: &[(String, String)]) -> i64 {
    let out = std::process::Command::new("date")
        .arg("+%s")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    let seen: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    seen - real
}

/// Moves node `i`'s wall clock `offset_s` off and waits until it shows (libfaketime
/// re-reads the file at most every second).
async fn skew(dir: &Path, env: &[(String, String)], i: usize, offset_s: i64) {
    set_clock_offset(dir, i, offset_s).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let seen = clock_offset_seen(env);
    assert!(
        (seen - offset_s).abs() <= 1,
        "node {i}'s clock is {seen} s off, not {offset_s} s: libfaketime did not take"
    );
}

/// Sends [`SENDS`] messages through each follower; the status codes not OK, with
/// the follower each came through.
async fn send_through_followers(
    cluster: &LocalCluster,
    leader: usize,
    phase: &str,
) -> Vec<(usize, i32)> {
    let mut refused = Vec::new();
    for f in (0..3).filter(|&f| f != leader) {
        let addr = &cluster.nodes[f].client_addr;
        let mut c = MessagingServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        for k in 0..SENDS {
            let code = send(&mut c, "Skewed", &format!("{phase}-n{f}-{k}")).await;
            if code != Code::Ok as i32 {
                refused.push((f, code));
            }
        }
    }
    refused
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_forwarded_between_nodes_whose_clocks_disagree_are_accepted() {
    let Some(lib) = libfaketime() else {
        println!(
            "SKIPPED: libfaketime is not installed (looked for {:?}; apt-get install libfaketime)",
            node_env::LIBFAKETIME_PATHS
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let clocks = dir.path().join("clocks");
    std::fs::create_dir_all(&clocks).unwrap();
    let env: Vec<Vec<(String, String)>> = (0..3)
        .map(|i| {
            set_clock_offset(&clocks, i, 0).unwrap();
            node_env::node_env(&clocks, i, Some(&lib))
        })
        .collect();
    let opts = ClusterOptions {
        node_env: env.clone(),
        ..ClusterOptions::default()
    };
    let cluster = LocalCluster::start(&dir.path().join("cluster"), &opts)
        .await
        .unwrap();
    let leader = cluster
        .prepare("broker-a", &[&["updateTopic", "-t", "Skewed", "-q", "2"]])
        .await
        .unwrap();
    let follower = (leader + 1) % 3;
    let proxy_timeout = Code::ProxyTimeout as i32;

    // Clocks agree: every forwarded send is answered OK.
    let refused = send_through_followers(&cluster, leader, "agreed").await;
    assert!(refused.is_empty(), "with clocks agreeing: {refused:?}");

    // One follower's wall clock behind the leader's by more than the write timeout.
    skew(&clocks, &env[follower], follower, -SKEW_S).await;
    let refused = send_through_followers(&cluster, leader, "behind").await;
    let timed_out = refused.iter().filter(|(_, c)| *c == proxy_timeout).count();
    assert!(
        refused.is_empty(),
        "node {follower}'s clock {SKEW_S} s behind the leader {leader}'s: {} of {} forwarded \
         sends not OK ({timed_out} PROXY_TIMEOUT; (follower, code): {refused:?})",
        refused.len(),
        2 * SENDS,
    );

    // The follower's clock back; the leader's ahead of both followers'.
    skew(&clocks, &env[follower], follower, 0).await;
    skew(&clocks, &env[leader], leader, SKEW_S).await;
    assert_eq!(
        cluster.leader("broker-a").await,
        Some(leader),
        "the leader changed: a wall clock moved an election"
    );
    let refused = send_through_followers(&cluster, leader, "ahead").await;
    let timed_out = refused.iter().filter(|(_, c)| *c == proxy_timeout).count();
    assert!(
        refused.is_empty(),
        "the leader {leader}'s clock {SKEW_S} s ahead of its followers': {} of {} forwarded \
         sends not OK ({timed_out} PROXY_TIMEOUT; (follower, code): {refused:?})",
        refused.len(),
        2 * SENDS,
    );
}
