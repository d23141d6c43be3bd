//! The operator's mqadmin commands on real processes (issue 18): brokerStatus
//! (its figures move with traffic), getBrokerConfig (the effective
//! configuration, defaults included), transferLeader (to the node asked),
//! deleteTopic (routes and topicList stop naming the topic) and deleteSubGroup
//! (the group goes from every node).

use std::time::{Duration, Instant};

use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};
use ledgermq_tests::grpc::send_one;

const TOPIC: &str = "TopicOps";
const GROUP: &str = "GroupOps";

/// The value of `key` in the `key : value` lines of node `node_id`'s section
/// of `out` (brokerStatus / getBrokerConfig output).
fn value_of(out: &str, node_id: u64, key: &str) -> Option<String> {
    let header = format!("node {node_id} (");
    let section = out.split("# ").find(|s| s.contains(&header))?;
    section.lines().find_map(|l| {
        let (k, v) = l.split_once(" : ")?;
        (k.trim() == key).then(|| v.trim().to_owned())
    })
}

/// Polls `mqadmin ARGS` until `done` holds for its output, for up to 20 s.
async fn wait_admin(cluster: &LocalCluster, args: &[&str], done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = cluster.admin(args).unwrap();
        if done(&out) {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "{args:?} never got there:\n{out}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_config_transfer_and_deletes_work_on_a_running_group() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(dir.path(), &ClusterOptions::default())
        .await
        .unwrap();
    let leader = cluster
        .prepare(
            "broker-a",
            &[
                &["updateTopic", "-t", TOPIC, "-q", "2"],
                &["updateSubGroup", "-g", GROUP],
            ],
        )
        .await
        .unwrap();
    let leader_id = cluster.nodes[leader].node_id;

    // brokerStatus: one section per node, the leader's counts move with sends.
    let before = cluster.admin(&["brokerStatus", "-b", "broker-a"]).unwrap();
    for id in 0..3 {
        assert!(value_of(&before, id, "role").is_some(), "{before}");
    }
    assert_eq!(
        value_of(&before, leader_id, "role").as_deref(),
        Some("leader"),
        "{before}"
    );
    let sent_before: u64 = value_of(&before, leader_id, "messagesInTotal")
        .unwrap()
        .parse()
        .unwrap();
    for i in 0..5 {
        send_one(
            &cluster.nodes[leader].client_addr,
            TOPIC,
            &format!("ops-{i}"),
        )
        .await
        .unwrap();
    }
    let after = cluster.admin(&["brokerStatus", "-b", "broker-a"]).unwrap();
    let sent_after: u64 = value_of(&after, leader_id, "messagesInTotal")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(sent_after, sent_before + 5, "{after}");
    let groups: u64 = value_of(&after, leader_id, "consumerGroupCount")
        .unwrap()
        .parse()
        .unwrap();
    assert!(groups >= 1, "{after}");

    // getBrokerConfig: every node's own effective configuration.
    let config = cluster
        .admin(&["getBrokerConfig", "-b", "broker-a"])
        .unwrap();
    println!("{after}{config}");
    for id in 0..3 {
        assert_eq!(
            value_of(&config, id, "node_id"),
            Some(id.to_string()),
            "{config}"
        );
        assert_eq!(
            value_of(&config, id, "broker_group").as_deref(),
            Some("broker-a")
        );
        // A key the harness leaves out, at its default.
        assert_eq!(
            value_of(&config, id, "max_body_bytes").as_deref(),
            Some("4194304")
        );
    }

    // transferLeader to a follower named.
    let target = (leader_id + 1) % 3;
    let out = cluster
        .admin(&[
            "transferLeader",
            "-b",
            "broker-a",
            "-i",
            &target.to_string(),
        ])
        .unwrap();
    assert!(
        out.contains(&format!("handed over to node {target}")),
        "{out}"
    );
    let now = cluster
        .wait_leader("broker-a", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(cluster.nodes[now].node_id, target);
    // A node that is not another voter is refused.
    let refused = cluster.admin(&["transferLeader", "-b", "broker-a", "-i", "9"]);
    assert!(refused.is_err(), "{refused:?}");

    // deleteSubGroup: the group goes from every node's count.
    cluster.admin(&["deleteSubGroup", "-g", GROUP]).unwrap();
    wait_admin(&cluster, &["brokerStatus", "-b", "broker-a"], |out| {
        (0..3).all(|id| {
            value_of(out, id, "consumerGroupCount")
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|n| n + 1 == groups)
        })
    })
    .await;

    // deleteTopic: topicList and routes stop naming it.
    assert!(cluster.admin(&["topicList"]).unwrap().contains(TOPIC));
    cluster.admin(&["deleteTopic", "-t", TOPIC]).unwrap();
    wait_admin(&cluster, &["topicList"], |out| !out.contains(TOPIC)).await;
    let route = cluster.admin(&["topicRoute", "-t", TOPIC]);
    assert!(
        route.as_ref().map_or(true, |o| !o.contains("broker-a")),
        "{route:?}"
    );
}
