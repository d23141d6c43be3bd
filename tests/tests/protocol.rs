//! The broker's answers on the wire (`apache.rocketmq.v2`, raw gRPC against real
//! `mqbroker` processes): bad input gets the protocol's status code, never a
//! silent success; a broadcasting consumer group gives every consumer every
//! message.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ledgermq_broker::pb::messaging_service_client::MessagingServiceClient;
use ledgermq_broker::pb::{
    receive_message_response::Content, AckMessageEntry, AckMessageRequest, Code, Message, Resource,
    SendMessageRequest, SystemProperties,
};
use ledgermq_jepsen::workload::receive_request;
use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};
use tonic::transport::Channel;

fn res(name: &str) -> Option<Resource> {
    Some(Resource {
        resource_namespace: String::new(),
        name: name.into(),
    })
}

fn message(topic: &str, body: &[u8], id: &str) -> Message {
    Message {
        topic: res(topic),
        user_properties: Default::default(),
        system_properties: Some(SystemProperties {
            message_id: id.into(),
            message_type: ledgermq_broker::pb::MessageType::Normal as i32,
            ..Default::default()
        }),
        body: body.to_vec(),
    }
}

async fn send_code(c: &mut MessagingServiceClient<Channel>, m: Message) -> i32 {
    let r = c
        .send_message(SendMessageRequest { messages: vec![m] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.entries.len(), 1, "one result entry per message");
    r.status.unwrap().code
}

/// One receive as `client_id`: (status code, bodies, receipt handles).
async fn receive(
    c: &mut MessagingServiceClient<Channel>,
    group: &str,
    topic: &str,
    client_id: &str,
) -> (i32, Vec<String>, Vec<String>) {
    let mut req = tonic::Request::new(receive_request(group, topic, 30, 2));
    req.metadata_mut()
        .insert("x-mq-client-id", client_id.parse().unwrap());
    let mut s = c.receive_message(req).await.unwrap().into_inner();
    let (mut code, mut bodies, mut handles) = (0, vec![], vec![]);
    while let Some(item) = s.message().await.unwrap() {
        match item.content.expect("every item has content") {
            Content::Status(st) => code = st.code,
            Content::Message(m) => {
                bodies.push(String::from_utf8_lossy(&m.body).into_owned());
                handles.push(m.system_properties.unwrap().receipt_handle.unwrap());
            }
            Content::DeliveryTimestamp(_) => {}
        }
    }
    (code, bodies, handles)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_protocols_status_codes() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(dir.path(), &ClusterOptions::default())
        .await
        .unwrap();
    let leader = cluster
        .prepare("broker-a", &[&["updateTopic", "-t", "Known", "-q", "2"]])
        .await
        .unwrap();
    // Ask a follower: any node answers every call.
    let addr = cluster.nodes[(leader + 1) % 3].client_addr.clone();
    let mut c = MessagingServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    assert_eq!(
        send_code(&mut c, message("Known", b"ok", "id-1")).await,
        Code::Ok as i32
    );
    let cases: Vec<(Message, Code)> = vec![
        (message("bad topic!", b"x", "id-2"), Code::IllegalTopic),
        (message("Known", b"", "id-3"), Code::BadRequest),
        (
            message("Known", &vec![b'x'; (4 << 20) + 1], "id-4"),
            Code::MessageBodyTooLarge,
        ),
        (message("Unknown", b"x", "id-5"), Code::TopicNotFound),
        (message("Known", b"x", ""), Code::IllegalMessageId),
        (
            {
                let mut m = message("Known", b"x", "id-6");
                m.system_properties.as_mut().unwrap().delivery_timestamp =
                    Some(prost_types::Timestamp {
                        seconds: 1,
                        nanos: 0,
                    });
                m
            },
            Code::Unsupported,
        ),
        (
            {
                let mut m = message("Known", b"x", "id-7");
                m.system_properties.as_mut().unwrap().message_group = Some("g".into());
                m
            },
            Code::MessagePropertyConflictWithType,
        ),
    ];
    for (m, code) in cases {
        assert_eq!(send_code(&mut c, m).await, code as i32, "{code:?}");
    }
    let (code, bodies, _) = receive(&mut c, "bad group!", "Known", "c1").await;
    assert_eq!((code, bodies.len()), (Code::IllegalConsumerGroup as i32, 0));
    let ack = c
        .ack_message(AckMessageRequest {
            group: res("G"),
            topic: res("Known"),
            entries: vec![AckMessageEntry {
                message_id: "id-1".into(),
                receipt_handle: "forged".into(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ack.entries.len(), 1);
    assert_eq!(ack.status.unwrap().code, Code::InvalidReceiptHandle as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broadcasting_group_gives_every_consumer_every_message() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(dir.path(), &ClusterOptions::default())
        .await
        .unwrap();
    let leader = cluster
        .prepare(
            "broker-a",
            &[
                &["updateTopic", "-t", "News", "-q", "2"],
                &["updateSubGroup", "-g", "Everyone", "--broadcast"],
            ],
        )
        .await
        .unwrap();
    let addr = cluster.nodes[leader].client_addr.clone();
    let mut c = MessagingServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let sent: BTreeSet<String> = (0..10).map(|i| format!("n{i}")).collect();
    for (i, b) in sent.iter().enumerate() {
        let code = send_code(&mut c, message("News", b.as_bytes(), &format!("id-{i}"))).await;
        assert_eq!(code, Code::Ok as i32);
    }
    for client in ["consumer-1", "consumer-2"] {
        let mut got = BTreeSet::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while got != sent {
            assert!(Instant::now() < deadline, "{client} got only {got:?}");
            let (_, bodies, handles) = receive(&mut c, "Everyone", "News", client).await;
            got.extend(bodies);
            for h in handles {
                let mut req = tonic::Request::new(AckMessageRequest {
                    group: res("Everyone"),
                    topic: res("News"),
                    entries: vec![AckMessageEntry {
                        message_id: String::new(),
                        receipt_handle: h,
                    }],
                });
                req.metadata_mut()
                    .insert("x-mq-client-id", client.parse().unwrap());
                let r = c.ack_message(req).await.unwrap().into_inner();
                assert_eq!(r.status.unwrap().code, Code::Ok as i32);
            }
        }
    }
    // A clustering group shares the messages instead: a second consumer of the same
    // group gets nothing once the first has them all.
    let (_, first, _) = receive(&mut c, "Shared", "News", "consumer-1").await;
    let (code, second, _) = receive(&mut c, "Shared", "News", "consumer-2").await;
    assert_eq!(first.len(), sent.len());
    assert_eq!((code, second.len()), (Code::MessageNotFound as i32, 0));
}
