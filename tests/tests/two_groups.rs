//! Two broker groups of three real `mqbroker` processes each serve one topic (how
//! RocketMQ scales out): routes list both groups' queues with each group's leader;
//! when one group loses its quorum, the official Rust producer keeps getting acks
//! through the other group's queues; once the group is back, every acknowledged
//! message is consumed.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use ledgermq_broker::pb::messaging_service_client::MessagingServiceClient;
use ledgermq_broker::pb::{Code, QueryRouteRequest, Resource};
use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};
use rocketmq::conf::{ClientOption, LoggingFormat, ProducerOption, SimpleConsumerOption};
use rocketmq::model::common::{FilterExpression, FilterType};
use rocketmq::model::message::MessageBuilder;
use rocketmq::{Producer, SimpleConsumer};

const TOPIC: &str = "Spread";

fn client_option(access: &str) -> ClientOption {
    let mut o = ClientOption::default();
    o.set_access_url(access);
    o.set_enable_tls(false);
    o.set_long_polling_timeout(Duration::from_secs(5));
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_without_quorum_pauses_only_its_own_queues() {
    let dir = tempfile::tempdir().unwrap();
    let opts = ClusterOptions {
        groups: 2,
        ..ClusterOptions::default()
    };
    let mut cluster = LocalCluster::start(dir.path(), &opts).await.unwrap();
    cluster
        .admin(&["updateTopic", "-t", TOPIC, "-q", "4"])
        .unwrap();
    cluster
        .admin(&["updateSubGroup", "-g", "SpreadGroup"])
        .unwrap();
    let a_leader = cluster
        .wait_leader("broker-a", Duration::from_secs(10))
        .await
        .unwrap();
    let access = cluster.nodes[a_leader].client_addr.clone();

    // The route names both groups, 4 queues each, each with its leader first.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut c = MessagingServiceClient::connect(format!("http://{access}"))
            .await
            .unwrap();
        let mut req = tonic::Request::new(QueryRouteRequest {
            topic: Some(Resource {
                resource_namespace: String::new(),
                name: TOPIC.into(),
            }),
            endpoints: None,
        });
        req.metadata_mut()
            .insert("x-mq-language", "RUST".parse().unwrap());
        req.metadata_mut()
            .insert("x-mq-client-id", "two-groups-test".parse().unwrap());
        let r = c.query_route(req).await.unwrap().into_inner();
        let groups: HashSet<String> = r
            .message_queues
            .iter()
            .filter_map(|q| q.broker.as_ref().map(|b| b.name.clone()))
            .collect();
        if r.status.as_ref().unwrap().code == Code::Ok as i32 && groups.len() == 2 {
            assert_eq!(r.message_queues.len(), 8);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "route never listed both groups: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let mut po = ProducerOption::default();
    po.set_topics(vec![TOPIC]);
    po.set_logging_format(LoggingFormat::Terminal);
    let mut producer = Producer::new(po, client_option(&access)).unwrap();
    producer.start().await.unwrap();

    // A long-running producer has a session with every group: the Rust client
    // 5.0.0 panics if its first call to an endpoint cannot connect.
    let mut acked = HashSet::new();
    for i in 0..16 {
        let body = format!("warm-{i}");
        let msg = MessageBuilder::builder()
            .set_topic(TOPIC)
            .set_body(body.clone().into_bytes())
            .build()
            .unwrap();
        producer.send(msg).await.unwrap();
        acked.insert(body);
    }

    // Group b loses its quorum.
    let b_nodes: Vec<usize> = (0..cluster.nodes.len())
        .filter(|&i| cluster.nodes[i].group == "broker-b")
        .collect();
    cluster.kill(b_nodes[0]);
    cluster.kill(b_nodes[1]);

    let (mut first_try_ok, mut attempts) = (0, 0);
    let outage = Instant::now();
    for i in 0..20 {
        let body = format!("m-{i}");
        let mut tries = 0;
        loop {
            tries += 1;
            attempts += 1;
            let msg = MessageBuilder::builder()
                .set_topic(TOPIC)
                .set_body(body.clone().into_bytes())
                .build()
                .unwrap();
            if producer.send(msg).await.is_ok() {
                break;
            }
            // The route lists a's 4 queues, then b's 4: at most 4 tries in a row
            // land on b.
            assert!(
                tries <= 4,
                "message {i} failed {tries} times: group a's queues must take it"
            );
        }
        if tries == 1 {
            first_try_ok += 1;
        }
        acked.insert(body);
    }
    println!(
        "with broker-b down: 20 messages acked in {:?}, {first_try_ok} on the first try, {attempts} attempts",
        outage.elapsed()
    );
    // Round robin over 8 queues: about half the first tries hit group a.
    assert!(
        first_try_ok >= 7,
        "only {first_try_ok} of 20 first tries succeeded"
    );

    cluster.restart(b_nodes[0]).unwrap();
    cluster.restart(b_nodes[1]).unwrap();
    cluster
        .wait_leader("broker-b", Duration::from_secs(20))
        .await
        .unwrap();

    let mut co = SimpleConsumerOption::default();
    co.set_topics(vec![TOPIC]);
    co.set_consumer_group("SpreadGroup");
    co.set_logging_format(LoggingFormat::Terminal);
    let mut consumer = SimpleConsumer::new(co, client_option(&access)).unwrap();
    consumer.start().await.unwrap();
    let mut got = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !acked.is_subset(&got) {
        assert!(
            Instant::now() < deadline,
            "missing {:?}",
            acked.difference(&got).collect::<Vec<_>>()
        );
        let Ok(msgs) = consumer
            .receive_with(
                TOPIC.to_string(),
                &FilterExpression::new(FilterType::Tag, "*"),
                32,
                Duration::from_secs(10),
            )
            .await
        else {
            continue;
        };
        for m in msgs {
            got.insert(String::from_utf8_lossy(m.body()).into_owned());
            let _ = consumer.ack(&m).await;
        }
    }
}
