//! The operator's mqadmin commands on real processes (issue 18): brokerStatus
//! (its figures move with traffic), getBrokerConfig (the effective
//! configuration, defaults included), consumerConnection (a 5.x and a 4.x
//! consumer, each on the node it talks to), transferLeader (to the node
//! asked), deleteTopic (routes and topicList stop naming the topic) and
//! deleteSubGroup (the group goes from every node).

use std::time::{Duration, Instant};

use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};
use ledgermq_tests::grpc::{heartbeat_consumer, send_one};
use ledgermq_tests::remoting::read_answer;
use std::io::Write;

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
    let opts = ClusterOptions {
        remoting: true,
        ..ClusterOptions::default()
    };
    let cluster = LocalCluster::start(dir.path(), &opts).await.unwrap();
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

    // One node by its address (RocketMQ's -b brokerAddr).
    let one = cluster
        .admin(&["brokerStatus", "-b", &cluster.nodes[0].client_addr])
        .unwrap();
    assert_eq!(one.matches("# broker-a node").count(), 1, "{one}");
    assert_eq!(value_of(&one, 0, "nodeId").as_deref(), Some("0"), "{one}");
    assert!(cluster
        .admin(&["brokerStatus", "-b", "127.0.0.1:1"])
        .is_err());

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

    // consumerConnection: a 5.x consumer heartbeats to node 0, a 4.x one to
    // node 1 over a connection it keeps open.
    heartbeat_consumer(&cluster.nodes[0].client_addr, GROUP, "py-consumer@1")
        .await
        .unwrap();
    let config_1 = std::fs::read_to_string(&cluster.nodes[1].config).unwrap();
    let remoting_1 = config_1
        .lines()
        .find_map(|l| l.strip_prefix("remoting_addr = "))
        .unwrap()
        .trim_matches('"')
        .to_owned();
    let mut conn = std::net::TcpStream::connect(&remoting_1).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let body = format!(
        r#"{{"clientID":"cpp-consumer@2","consumerDataSet":[{{"groupName":"{GROUP}","messageModel":"CLUSTERING"}}],"producerDataSet":[]}}"#
    );
    let mut hb = ledgermq_remoting::RemotingCommand::request(34, Vec::<(String, String)>::new());
    hb.body = body.into_bytes();
    conn.write_all(&hb.encode().unwrap()).unwrap();
    assert_eq!(read_answer(&mut conn).unwrap().code, 0);
    let consumers = cluster.admin(&["consumerConnection", "-g", GROUP]).unwrap();
    println!("{consumers}");
    let line = |id: &str| {
        consumers
            .lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("{id} not listed:\n{consumers}"))
            .to_owned()
    };
    let py = line("py-consumer@1");
    assert!(
        py.contains("gRPC 5.x") && py.contains("PYTHON") && py.ends_with("broker-a/0"),
        "{py}"
    );
    let cpp = line("cpp-consumer@2");
    assert!(
        cpp.contains("remoting 4.x") && cpp.ends_with("broker-a/1"),
        "{cpp}"
    );
    // Its connection closes: it is no longer listed.
    drop(conn);
    wait_admin(&cluster, &["consumerConnection", "-g", GROUP], |out| {
        !out.contains("cpp-consumer@2")
    })
    .await;
    assert!(cluster
        .admin(&["consumerConnection", "-g", "NoSuchGroup"])
        .is_err());

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
    // A node that is not another voter is refused; the leader itself is a no-op.
    let refused = cluster.admin(&["transferLeader", "-b", "broker-a", "-i", "9"]);
    assert!(
        format!("{refused:?}").contains("is not another voter"),
        "{refused:?}"
    );
    let same = cluster
        .admin(&[
            "transferLeader",
            "-b",
            "broker-a",
            "-i",
            &target.to_string(),
        ])
        .unwrap();
    assert!(
        same.contains(&format!("handed over to node {target}")),
        "{same}"
    );

    // deleteSubGroup: refused without -r true (offsets go with the group) or a
    // scope; then the group goes from every node's count.
    assert!(cluster
        .admin(&["deleteSubGroup", "-g", GROUP, "-b", "broker-a"])
        .is_err());
    assert!(cluster
        .admin(&["deleteSubGroup", "-g", GROUP, "-r", "true"])
        .is_err());
    cluster
        .admin(&[
            "deleteSubGroup",
            "-g",
            GROUP,
            "-r",
            "true",
            "-b",
            "broker-a",
        ])
        .unwrap();
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
    // The broker's own topics are not deleted.
    for (own, why) in [
        ("TBW102", "broker's own topics"),
        ("rmq_sys_wheel_timer", "broker's own topics"),
        ("RMQ_SYS_TRANS_HALF_TOPIC", "broker's own topics"),
        ("%RETRY%GroupOps", "belongs to a consumer group"),
        ("%DLQ%GroupOps", "belongs to a consumer group"),
    ] {
        let r = cluster.admin(&["deleteTopic", "-t", own, "-c", "DefaultCluster"]);
        assert!(format!("{r:?}").contains(why), "{own}: {r:?}");
    }
    cluster
        .admin(&["deleteTopic", "-t", TOPIC, "-c", "DefaultCluster"])
        .unwrap();
    wait_admin(&cluster, &["topicList"], |out| !out.contains(TOPIC)).await;
    let route = cluster.admin(&["topicRoute", "-t", TOPIC]);
    assert!(
        route.as_ref().map_or(true, |o| !o.contains("broker-a")),
        "{route:?}"
    );
}
