//! Writes forwarded between nodes whose wall clocks disagree (issue 14, found by the
//! jepsen clock-skew fault): a follower forwards a send to the leader with the time
//! it has left, which must not depend on the two nodes' wall clocks agreeing. Real
//! `mqbroker` processes, each under libfaketime (`LD_PRELOAD`, an offset file per
//! node, monotonic clocks untouched: `ledgermq_jepsen::node_env`), as in
//! `jepsen run`; skipped when libfaketime is not installed.

use std::time::Duration;

use ledgermq_broker::pb::messaging_service_client::MessagingServiceClient;
use ledgermq_broker::pb::{Code, Message, Resource, SendMessageRequest, SystemProperties};
use ledgermq_tests::clocks::SkewableCluster;
use ledgermq_tests::cluster::LocalCluster;
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
    let Some(sc) = SkewableCluster::start().await else {
        return;
    };
    let cluster = &sc.cluster;
    let leader = cluster
        .prepare("broker-a", &[&["updateTopic", "-t", "Skewed", "-q", "2"]])
        .await
        .unwrap();
    let follower = (leader + 1) % 3;
    let proxy_timeout = Code::ProxyTimeout as i32;

    // Clocks agree: every forwarded send is answered OK.
    let refused = send_through_followers(cluster, leader, "agreed").await;
    assert!(refused.is_empty(), "with clocks agreeing: {refused:?}");

    // One follower's wall clock behind the leader's by more than the write timeout.
    sc.set_clock(follower, -SKEW_S).await;
    let refused = send_through_followers(cluster, leader, "behind").await;
    let timed_out = refused.iter().filter(|(_, c)| *c == proxy_timeout).count();
    assert!(
        refused.is_empty(),
        "node {follower}'s clock {SKEW_S} s behind the leader {leader}'s: {} of {} forwarded \
         sends not OK ({timed_out} PROXY_TIMEOUT; (follower, code): {refused:?})",
        refused.len(),
        2 * SENDS,
    );

    // The follower's clock back; the leader's ahead of both followers'.
    sc.set_clock(follower, 0).await;
    sc.set_clock(leader, SKEW_S).await;
    assert_eq!(
        cluster.leader("broker-a").await,
        Some(leader),
        "the leader changed: a wall clock moved an election"
    );
    let refused = send_through_followers(cluster, leader, "ahead").await;
    let timed_out = refused.iter().filter(|(_, c)| *c == proxy_timeout).count();
    assert!(
        refused.is_empty(),
        "the leader {leader}'s clock {SKEW_S} s ahead of its followers': {} of {} forwarded \
         sends not OK ({timed_out} PROXY_TIMEOUT; (follower, code): {refused:?})",
        refused.len(),
        2 * SENDS,
    );
}
