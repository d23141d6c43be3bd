//! The Prometheus endpoints of `mqbroker` and `mqnamesrv` (`metrics_addr`), on
//! real processes: each value checked moves with what the group does. Messages
//! sent to a follower over remoting are counted once, by the follower; a pull
//! counts messages out; a committed consumer offset sets the leader's consumer
//! lag; an fsync, a gRPC admin call and a remoting call are timed; the Raft
//! gauges name the roles and the leader's followers; a leader's death moves the
//! term and leader counters of the node that takes over; the name server counts
//! its nodes by role, the topics, registrations and route queries.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use ledgermq_remoting::RemotingCommand;
use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};
use ledgermq_tests::remoting::{call, pull_bodies, send_request};

const TOPIC: &str = "MetricsT";
const GROUP: &str = "MetricsG";

/// `GET /metrics` on `addr`: the body.
fn scrape(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    assert!(head.to_ascii_lowercase().contains("text/plain"), "{head}");
    body.to_owned()
}

/// The sum of the samples of `name` whose labels include every pair of
/// `labels`; `None` when there is none.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        if labels
            .iter()
            .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
        {
            let v: f64 = rest.rsplit(' ').next().unwrap().parse().unwrap();
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

fn remoting_addr(cluster: &LocalCluster, i: usize) -> String {
    let text = std::fs::read_to_string(&cluster.nodes[i].config).unwrap();
    let v: toml::Value = toml::from_str(&text).unwrap();
    v["remoting_addr"].as_str().unwrap().to_owned()
}

/// Scrapes `addr` until `check` holds, up to 10 s; the last text.
async fn until(addr: &str, what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = scrape(addr);
        if check(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "{what} never held:\n{text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_and_name_server_metrics_move_with_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(
        dir.path(),
        &ClusterOptions {
            remoting: true,
            metrics: true,
            ..ClusterOptions::default()
        },
    )
    .await
    .unwrap();
    let leader = cluster
        .prepare(
            "broker-a",
            &[
                &["updateTopic", "-t", TOPIC, "-q", "1"],
                &["updateSubGroup", "-g", GROUP],
            ],
        )
        .await
        .unwrap();
    let follower = (leader + 1) % 3;
    let metrics: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| n.metrics_addr.clone().unwrap())
        .collect();
    let (leader_m, follower_m) = (metrics[leader].clone(), metrics[follower].clone());

    // Raft gauges: the roles, one term, the leader's two followers.
    let l = scrape(&leader_m);
    let f = scrape(&follower_m);
    assert_eq!(
        value(&l, "ledgermq_raft_role", &[("role", "leader")]),
        Some(1.0),
        "{l}"
    );
    assert_eq!(
        value(&f, "ledgermq_raft_role", &[("role", "follower")]),
        Some(1.0),
        "{f}"
    );
    let term = value(&l, "ledgermq_raft_term", &[]).unwrap();
    assert!(term >= 1.0);
    assert_eq!(value(&f, "ledgermq_raft_term", &[]), Some(term));
    // A follower has a lag once it first answered in this term.
    let l = until(&leader_m, "both followers' lag", |t| {
        t.lines()
            .filter(|x| x.starts_with("ledgermq_raft_follower_lag_entries{"))
            .count()
            == 2
    })
    .await;
    assert!(l.contains(&format!("node_id=\"broker-a-{leader}\"")), "{l}");
    // The admin call that made the topic went to the leader over gRPC.
    let update_topic = [
        ("protocol_type", "grpc_v2"),
        ("request_code", "UpdateTopic"),
    ];
    assert!(
        value(&l, "rocketmq_rpc_latency_count", &update_topic).unwrap_or(0.0) >= 1.0,
        "{l}"
    );

    // Ten sends to a follower over remoting: counted once, by the follower.
    let follower_remoting = remoting_addr(&cluster, follower);
    let mut body_bytes = 0;
    for i in 0..10 {
        let body = format!("metric-{i}");
        body_bytes += body.len();
        let send = send_request(TOPIC, 0, "", body.as_bytes());
        let sent = call(&follower_remoting, &send);
        assert_eq!(sent.code, 0, "{:?}", sent.remark);
    }
    let f = scrape(&follower_m);
    let normal = [("topic", TOPIC), ("message_type", "normal")];
    assert_eq!(
        value(&f, "rocketmq_messages_in_total", &normal),
        Some(10.0),
        "{f}"
    );
    assert_eq!(
        value(&f, "rocketmq_throughput_in_total", &normal),
        Some(body_bytes as f64)
    );
    assert_eq!(
        value(&f, "rocketmq_message_size_count", &normal),
        Some(10.0)
    );
    let sends = [
        ("protocol_type", "remoting"),
        ("request_code", "310"),
        ("response_code", "0"),
    ];
    assert_eq!(
        value(&f, "rocketmq_rpc_latency_count", &sends),
        Some(10.0),
        "{f}"
    );
    let l = scrape(&leader_m);
    assert_eq!(
        value(&l, "rocketmq_messages_in_total", &normal),
        None,
        "{l}"
    );
    assert!(value(&l, "ledgermq_store_flush_latency_ms_count", &[]).unwrap() > 0.0);
    assert!(value(&l, "rocketmq_storage_size", &[]).unwrap() > 0.0);
    assert!(value(&l, "ledgermq_raft_applied_index", &[]).unwrap() >= 10.0);
    assert_eq!(value(&l, "rocketmq_topic_number", &[]), Some(1.0));

    // A pull from the follower counts messages out there.
    let deadline = Instant::now() + Duration::from_secs(10);
    while pull_bodies(&follower_remoting, GROUP, TOPIC, 0).len() < 10 {
        assert!(
            Instant::now() < deadline,
            "the follower never served the 10 messages"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let out = [("topic", TOPIC), ("consumer_group", GROUP)];
    let f = scrape(&follower_m);
    assert!(
        value(&f, "rocketmq_messages_out_total", &out).unwrap_or(0.0) >= 10.0,
        "{f}"
    );

    // A committed offset of 4: the leader reports 6 messages of lag.
    let commit = RemotingCommand::request(
        15,
        [
            ("consumerGroup", GROUP),
            ("topic", TOPIC),
            ("queueId", "0"),
            ("commitOffset", "4"),
        ],
    );
    assert_eq!(call(&follower_remoting, &commit).code, 0);
    until(&leader_m, "a lag of 6", |t| {
        value(t, "rocketmq_consumer_lag_messages", &out) == Some(6.0)
    })
    .await;
    assert_eq!(
        value(&scrape(&follower_m), "rocketmq_consumer_lag_messages", &out),
        None
    );

    // The name server: one leader and two followers, the topic, heartbeats and
    // a remoting route query counted.
    let ns_m = cluster.namesrv_metrics_addr.clone().unwrap();
    let n = scrape(&ns_m);
    assert_eq!(
        value(&n, "ledgermq_namesrv_broker_nodes", &[("role", "leader")]),
        Some(1.0),
        "{n}"
    );
    assert_eq!(
        value(&n, "ledgermq_namesrv_broker_nodes", &[("role", "follower")]),
        Some(2.0)
    );
    assert!(value(&n, "rocketmq_topic_number", &[]).unwrap() >= 1.0);
    let registrations = value(&n, "ledgermq_namesrv_registrations_total", &[]).unwrap();
    let route = RemotingCommand::request(105, [("topic", TOPIC)]);
    assert_eq!(call(&cluster.namesrv_addr, &route).code, 0);
    let n = until(&ns_m, "another registration", |t| {
        value(t, "ledgermq_namesrv_registrations_total", &[]).unwrap() > registrations
    })
    .await;
    let remoting = [("protocol_type", "remoting")];
    assert_eq!(
        value(&n, "ledgermq_namesrv_route_queries_total", &remoting),
        Some(1.0)
    );

    // The leader dies: the node that takes over counts a term and a leader change.
    let before: Vec<(f64, f64)> = metrics
        .iter()
        .map(|addr| {
            let t = scrape(addr);
            (
                value(&t, "ledgermq_raft_term_changes_total", &[]).unwrap(),
                value(&t, "ledgermq_raft_leader_changes_total", &[]).unwrap(),
            )
        })
        .collect();
    cluster.kill(leader);
    let next = cluster
        .wait_leader("broker-a", Duration::from_secs(20))
        .await
        .unwrap();
    let m = until(&metrics[next], "the new leader's role", |t| {
        value(t, "ledgermq_raft_role", &[("role", "leader")]) == Some(1.0)
    })
    .await;
    let (terms, leaders) = before[next];
    assert!(
        value(&m, "ledgermq_raft_term_changes_total", &[]).unwrap() > terms,
        "{m}"
    );
    assert!(
        value(&m, "ledgermq_raft_leader_changes_total", &[]).unwrap() > leaders,
        "{m}"
    );
    assert!(value(&m, "ledgermq_raft_term", &[]).unwrap() > term);
}
