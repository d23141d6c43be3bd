//! A broker group of three [`BrokerNode`]s in one process: the leader-term
//! services (the consumer-offset committer) run on the ready leader alone and
//! move with the leadership, and a shutdown hands leadership over.

use std::path::Path;
use std::time::Duration;

use ledgermq_broker::config::BrokerConfig;
use ledgermq_broker::node::{BrokerNode, NodeTimings, StartOptions};
use ledgermq_broker::pb::messaging_service_client::MessagingServiceClient;
use ledgermq_broker::pb::receive_message_response::Content;
use ledgermq_broker::pb::{
    AckMessageEntry, AckMessageRequest, Code, FilterExpression, FilterType, Message, MessageQueue,
    MessageType, ReceiveMessageRequest, Resource, SendMessageRequest, SystemProperties,
};
use ledgermq_testkit::{free_port, BrokerToml};
use tonic::transport::Channel;

fn configs(dir: &Path) -> Vec<BrokerConfig> {
    let raft: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let client: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    (0..3)
        .map(|i| {
            let mut toml = BrokerToml::member(
                "DefaultCluster",
                "broker-t",
                i,
                &raft,
                &client,
                &dir.join(format!("n{i}")),
            );
            toml.commit_log_segment_bytes = Some(4 << 20);
            toml.disk_space_warning_ratio = Some(0.99);
            toml.auto_create_topics = Some(true);
            toml.exact_delivery_attempts = Some(true);
            let path = dir.join(format!("n{i}.toml"));
            toml.write(&path).unwrap();
            BrokerConfig::load(&path).unwrap()
        })
        .collect()
}

fn res(name: &str) -> Option<Resource> {
    Some(Resource {
        resource_namespace: String::new(),
        name: name.into(),
    })
}

/// `msg` with the client id header every official client sends.
fn from_client<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert("x-mq-client-id", "node-test@1".parse().unwrap());
    req
}

async fn client(cfg: &BrokerConfig) -> MessagingServiceClient<Channel> {
    MessagingServiceClient::connect(format!("http://{}", cfg.client_addr))
        .await
        .unwrap()
}

/// A ReceiveMessage of up to `batch_size` messages of any queue of `topic` for
/// `group` (tags `*`), invisible for `invisible_s`, long-polling 1 s.
fn receive_request(
    topic: &str,
    group: &str,
    batch_size: i32,
    invisible_s: i64,
) -> ReceiveMessageRequest {
    ReceiveMessageRequest {
        group: res(group),
        message_queue: Some(MessageQueue {
            topic: res(topic),
            id: -1,
            ..Default::default()
        }),
        filter_expression: Some(FilterExpression {
            r#type: FilterType::Tag as i32,
            expression: "*".into(),
        }),
        batch_size,
        invisible_duration: Some(prost_types::Duration {
            seconds: invisible_s,
            nanos: 0,
        }),
        auto_renew: false,
        long_polling_timeout: Some(prost_types::Duration {
            seconds: 1,
            nanos: 0,
        }),
    }
}

/// Sends one message with message id `id` to `topic`.
async fn send_one(c: &mut MessagingServiceClient<Channel>, topic: &str, id: &str) {
    let r = c
        .send_message(from_client(SendMessageRequest {
            messages: vec![Message {
                topic: res(topic),
                user_properties: Default::default(),
                system_properties: Some(SystemProperties {
                    message_id: id.into(),
                    message_type: MessageType::Normal as i32,
                    ..Default::default()
                }),
                body: b"x".to_vec(),
            }],
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.status.unwrap().code, Code::Ok as i32);
}

/// Sends `n` messages to `topic`, receives and acks them all as group `group`.
async fn send_receive_ack(
    c: &mut MessagingServiceClient<Channel>,
    topic: &str,
    group: &str,
    n: usize,
) {
    static NEXT_ID: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    for _ in 0..n {
        let i = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        send_one(c, topic, &format!("node-test-{i}")).await;
    }
    let mut acked = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while acked < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{acked} of {n} received"
        );
        let mut stream = c
            .receive_message(from_client(receive_request(topic, group, 32, 30)))
            .await
            .unwrap()
            .into_inner();
        while let Some(item) = stream.message().await.unwrap() {
            if let Some(Content::Message(m)) = item.content {
                let props = m.system_properties.unwrap();
                let r = c
                    .ack_message(from_client(AckMessageRequest {
                        group: res(group),
                        topic: res(topic),
                        entries: vec![AckMessageEntry {
                            message_id: props.message_id,
                            receipt_handle: props.receipt_handle.unwrap(),
                        }],
                    }))
                    .await
                    .unwrap()
                    .into_inner();
                assert_eq!(r.status.unwrap().code, Code::Ok as i32);
                acked += 1;
            }
        }
    }
}

/// The offsets of `group` on `topic` committed on `node`, summed over queues.
fn committed(node: &BrokerNode, group: &str, topic: &str) -> u64 {
    let meta = node.raft_node().shared_meta().read().unwrap();
    meta.offsets
        .iter()
        .filter(|((g, t, _), _)| g == group && t == topic)
        .map(|(_, o)| *o)
        .sum()
}

/// Waits until every live node has `want` committed for `group` on `topic`.
async fn wait_committed(nodes: &[Option<BrokerNode>], group: &str, topic: &str, want: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let seen: Vec<u64> = nodes
            .iter()
            .flatten()
            .map(|n| committed(n, group, topic))
            .collect();
        if seen.iter().all(|&o| o == want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "offsets committed per node {seen:?}, want {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts a node of each config.
async fn start_all(cfgs: &[BrokerConfig]) -> Vec<Option<BrokerNode>> {
    let mut nodes = Vec::new();
    for cfg in cfgs {
        nodes.push(Some(
            BrokerNode::start(cfg, StartOptions::default(), NodeTimings::default())
                .await
                .unwrap(),
        ));
    }
    nodes
}

/// Waits until exactly one live node is a ready leader whose leader-term services
/// run for its term, and the others run none; returns its index and term.
async fn serving_leader(nodes: &[Option<BrokerNode>]) -> (usize, u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let states: Vec<_> = nodes
            .iter()
            .map(|n| {
                n.as_ref().map(|n| {
                    (
                        n.raft_node().status().borrow().ready_term,
                        n.services_term(),
                    )
                })
            })
            .collect();
        let leaders: Vec<_> = states
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                Some((Some(t), Some(s))) if t == s => Some((i, *t)),
                _ => None,
            })
            .collect();
        let others_idle = states
            .iter()
            .flatten()
            .filter(|(ready, _)| ready.is_none())
            .all(|(_, services)| services.is_none());
        if leaders.len() == 1 && others_idle {
            return leaders[0];
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no single serving leader within 20 s: {states:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_term_services_follow_the_leader_through_a_hand_over_and_a_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let cfgs = configs(dir.path());
    let mut nodes = start_all(&cfgs).await;
    let (first, term) = serving_leader(&nodes).await;
    // Acks of a clustering group reach every replica through the leader's
    // offset committer.
    let leader = nodes[first].as_ref().unwrap();
    let mut c = client(&cfgs[first]).await;
    send_receive_ack(&mut c, "NodeT", "NodeG", 3).await;
    wait_committed(&nodes, "NodeG", "NodeT", 3).await;
    // A hand-over: the old leader stays up, its services end, the new leader's
    // start in a later term and commit the acks taken there.
    let to = leader
        .raft_node()
        .transfer_leadership(None, Duration::from_secs(10))
        .await
        .unwrap();
    let (second, next_term) = serving_leader(&nodes).await;
    assert_eq!(second as u64, to);
    assert!(next_term > term, "{next_term} after {term}");
    assert_eq!(nodes[first].as_ref().unwrap().services_term(), None);
    let mut c = client(&cfgs[second]).await;
    send_receive_ack(&mut c, "NodeT", "NodeG", 2).await;
    wait_committed(&nodes, "NodeG", "NodeT", 5).await;
    // A clean shutdown of the leader hands leadership to a caught-up follower.
    nodes[second].take().unwrap().shutdown().await.unwrap();
    let (third, last_term) = serving_leader(&nodes).await;
    assert_ne!(third, second);
    assert!(last_term > next_term, "{last_term} after {next_term}");
    for n in nodes.into_iter().flatten() {
        n.shutdown().await.unwrap();
    }
}

/// Receives from `c` as `group` on `topic` (each delivery invisible for 1 s)
/// until a message arrives or `wait` passes: (message id, delivery attempt).
async fn receive_one(
    c: &mut MessagingServiceClient<Channel>,
    topic: &str,
    group: &str,
    wait: Duration,
) -> Option<(String, i32)> {
    let deadline = tokio::time::Instant::now() + wait;
    while tokio::time::Instant::now() < deadline {
        let r = c
            .receive_message(from_client(receive_request(topic, group, 1, 1)))
            .await;
        // A node that just lost or gained leadership may refuse: ask again.
        let Ok(r) = r else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let mut stream = r.into_inner();
        while let Ok(Some(item)) = stream.message().await {
            if let Some(Content::Message(m)) = item.content {
                let p = m.system_properties.unwrap();
                return Some((p.message_id, p.delivery_attempt.unwrap_or(0)));
            }
        }
    }
    None
}

/// Hands leadership from the serving leader `from` to another node; returns the
/// new serving leader.
async fn hand_over(nodes: &[Option<BrokerNode>], from: usize) -> usize {
    nodes[from]
        .as_ref()
        .unwrap()
        .raft_node()
        .transfer_leadership(None, Duration::from_secs(10))
        .await
        .unwrap();
    let (to, _) = serving_leader(nodes).await;
    assert_ne!(to, from);
    to
}

/// A clustering group's delivery attempts are replicated, also while a member
/// is down: a message delivered and not acked is delivered by the next leader
/// with the next attempt, not with 1 again, and a message that used up its
/// attempts under earlier leaders goes to the dead-letter queue instead of
/// being delivered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_attempts_count_on_across_leader_changes() {
    use ledgermq_broker::admin_pb::broker_admin_client::BrokerAdminClient;
    use ledgermq_broker::admin_pb::UpdateGroupRequest;
    let dir = tempfile::tempdir().unwrap();
    let cfgs = configs(dir.path());
    let mut nodes = start_all(&cfgs).await;
    let (mut leader, _) = serving_leader(&nodes).await;
    let mut admin = BrokerAdminClient::connect(format!("http://{}", cfgs[leader].client_addr))
        .await
        .unwrap();
    let r = admin
        .update_group(UpdateGroupRequest {
            name: "AttemptG".into(),
            max_delivery_attempts: 3,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.error.is_empty(), "{}", r.error);
    let mut c = client(&cfgs[leader]).await;
    // Sent (the topic is created), received and acked once, so the group
    // exists on the topic; then the message under test.
    send_receive_ack(&mut c, "AttemptT", "AttemptG", 1).await;
    wait_committed(&nodes, "AttemptG", "AttemptT", 1).await;
    send_one(&mut c, "AttemptT", "attempt-m").await;
    let mut seen = Vec::new();
    for round in 0..3 {
        let mut c = client(&cfgs[leader]).await;
        let (id, attempt) = receive_one(&mut c, "AttemptT", "AttemptG", Duration::from_secs(10))
            .await
            .expect("the message is delivered again");
        assert_eq!(id, "attempt-m");
        seen.push(attempt);
        if round == 0 {
            // The first leader stops: the next ones record with a member down.
            nodes[leader].take().unwrap().shutdown().await.unwrap();
            leader = serving_leader(&nodes).await.0;
        } else {
            leader = hand_over(&nodes, leader).await;
        }
    }
    assert_eq!(
        seen,
        [1, 2, 3],
        "delivery attempts under three leaders, the last two with a member down"
    );
    // Its attempts are used up: the fourth leader dead-letters it.
    let mut c = client(&cfgs[leader]).await;
    let again = receive_one(&mut c, "AttemptT", "AttemptG", Duration::from_secs(4)).await;
    assert_eq!(again, None, "delivered after its last attempt");
    let dead = receive_one(
        &mut c,
        "%DLQ%AttemptG",
        "AttemptDlqReader",
        Duration::from_secs(10),
    )
    .await;
    assert!(
        dead.as_ref().is_some_and(|(id, _)| id == "attempt-m"),
        "not in %DLQ%AttemptG: {dead:?}"
    );
    for n in nodes.into_iter().flatten() {
        n.shutdown().await.unwrap();
    }
}
