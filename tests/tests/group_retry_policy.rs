//! A consumer group's retry policy (RocketMQ 5's groupRetryPolicy, given with
//! `mqadmin updateSubGroup -p JSON`), against real `mqbroker` processes: every
//! node sends it to the group's consumers as the backoff of their Settings
//! (Telemetry), as RocketMQ's proxy does; it is kept when every node restarts;
//! a bad policy is refused (by mqadmin before any group changes, and by the
//! broker); an update without `-p` puts back the broker's default.

use std::time::{Duration, Instant};

use ledgermq_broker::admin_pb::broker_admin_client::BrokerAdminClient;
use ledgermq_broker::admin_pb::UpdateGroupRequest;
use ledgermq_broker::pb::messaging_service_client::MessagingServiceClient;
use ledgermq_broker::pb::{
    retry_policy::Strategy, settings, telemetry_command, ClientType, Resource, RetryPolicy,
    Settings, Subscription, TelemetryCommand,
};
use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};

const EXPONENTIAL: &str = r#"{"type":"EXPONENTIAL","exponentialRetryPolicy":{"initial":1500,"max":60000,"multiplier":3}}"#;
const CUSTOMIZED: &str = r#"{"type":"CUSTOMIZED","customizedRetryPolicy":{"next":[1000,2500]}}"#;

/// What `addr` sends a push consumer of `group` in its Settings.
async fn backoff(addr: &str, group: &str) -> RetryPolicy {
    let mut c = MessagingServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let settings = TelemetryCommand {
        status: None,
        command: Some(telemetry_command::Command::Settings(Settings {
            client_type: Some(ClientType::PushConsumer as i32),
            pub_sub: Some(settings::PubSub::Subscription(Subscription {
                group: Some(Resource {
                    resource_namespace: String::new(),
                    name: group.into(),
                }),
                ..Default::default()
            })),
            ..Default::default()
        })),
    };
    let mut req = tonic::Request::new(tonic::codegen::tokio_stream::iter(vec![settings]));
    req.metadata_mut()
        .insert("x-mq-client-id", "retry-policy-test@1".parse().unwrap());
    let mut replies = c.telemetry(req).await.unwrap().into_inner();
    let reply = tokio::time::timeout(Duration::from_secs(10), replies.message())
        .await
        .expect("a telemetry reply")
        .unwrap()
        .expect("a telemetry reply");
    match reply.command {
        Some(telemetry_command::Command::Settings(s)) => s.backoff_policy.expect("a backoff"),
        other => panic!("{addr}: {other:?}"),
    }
}

/// The backoff as (max attempts, delays in ms or (initial ms, max ms,
/// multiplier)), for comparing.
fn shape(p: &RetryPolicy) -> (i32, String) {
    let ms = |d: &prost_types::Duration| d.seconds * 1000 + i64::from(d.nanos) / 1_000_000;
    let s = match p.strategy.as_ref().unwrap() {
        Strategy::CustomizedBackoff(c) => {
            format!("{:?}", c.next.iter().map(ms).collect::<Vec<_>>())
        }
        Strategy::ExponentialBackoff(e) => format!(
            "exp {} {} {}",
            ms(e.initial.as_ref().unwrap()),
            ms(e.max.as_ref().unwrap()),
            e.multiplier
        ),
    };
    (p.max_attempts, s)
}

const DEFAULT_BACKOFF: &str = "[10000, 30000, 60000, 120000, 180000, 240000, 300000, 360000, \
                               420000, 480000, 540000, 600000, 1200000, 1800000, 3600000, 7200000]";

/// Waits until every running node of the group sends `want` for `group`.
async fn every_node_sends(cluster: &LocalCluster, group: &str, want: (i32, &str)) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for addr in cluster.client_addrs("broker-a") {
        loop {
            let got = shape(&backoff(&addr, group).await);
            if (got.0, got.1.as_str()) == want {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{addr} sends {got:?} for {group}, want {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groups_retry_policy_reaches_its_consumers_from_every_node_and_survives_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(dir.path(), &ClusterOptions::default())
        .await
        .unwrap();
    cluster
        .prepare(
            "broker-a",
            &[
                &["updateSubGroup", "-g", "Exp", "-r", "5", "-p", EXPONENTIAL],
                &["updateSubGroup", "-g", "Custom", "-p", CUSTOMIZED],
                &["updateSubGroup", "-g", "Plain", "-r", "3"],
            ],
        )
        .await
        .unwrap();
    every_node_sends(&cluster, "Exp", (5, "exp 1500 60000 3")).await;
    every_node_sends(&cluster, "Custom", (16, "[1000, 2500]")).await;
    every_node_sends(&cluster, "Plain", (3, DEFAULT_BACKOFF)).await;

    // The broker refuses a bad policy itself (mqadmin checks it first).
    let mut admin = BrokerAdminClient::connect(format!("http://{}", cluster.nodes[0].client_addr))
        .await
        .unwrap();
    let r = admin
        .update_group(UpdateGroupRequest {
            name: "Exp".into(),
            retry_policy: r#"{"type":"LINEAR"}"#.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        r.error.contains("retry policy") && !r.retry_policy_set,
        "{r:?}"
    );
    // A good one is answered as set.
    let r = admin
        .update_group(UpdateGroupRequest {
            name: "Exp".into(),
            max_delivery_attempts: 5,
            retry_policy: EXPONENTIAL.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.error.is_empty() && r.retry_policy_set, "{r:?}");
    // Refused by mqadmin before any group changes: not JSON, an unknown type,
    // a delay out of bounds.
    for bad in [
        "{",
        r#"{"type":"LINEAR"}"#,
        r#"{"customizedRetryPolicy":{"next":[10]}}"#,
    ] {
        let e = cluster
            .admin(&["updateSubGroup", "-g", "Exp", "-p", bad])
            .expect_err(bad)
            .to_string();
        assert!(e.contains("retry policy"), "{bad}: {e}");
    }

    // Kept through a restart of every node (one at a time, so the group
    // keeps a leader).
    for i in 0..3 {
        cluster.restart(i).unwrap();
        cluster
            .wait_leader("broker-a", Duration::from_secs(30))
            .await
            .unwrap();
    }
    every_node_sends(&cluster, "Exp", (5, "exp 1500 60000 3")).await;
    every_node_sends(&cluster, "Custom", (16, "[1000, 2500]")).await;

    // An update without -p replaces the whole config: the default again.
    cluster
        .admin(&["updateSubGroup", "-g", "Custom", "-r", "4"])
        .unwrap();
    every_node_sends(&cluster, "Custom", (4, DEFAULT_BACKOFF)).await;
    every_node_sends(&cluster, "Exp", (5, "exp 1500 60000 3")).await;
}
