//! The broker's answers on the wire (`apache.rocketmq.v2`, raw gRPC against real
//! `mqbroker` processes): bad input gets the protocol's status code, never a
//! silent success; a broadcasting consumer group gives every consumer every
//! message; hostile or careless clients hit bounds with a clear status.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ledgermq_broker::pb::messaging_service_client::MessagingServiceClient;
use ledgermq_broker::pb::{
    receive_message_response::Content, settings, telemetry_command, AckMessageEntry,
    AckMessageRequest, ClientType, Code, HeartbeatRequest, Message, Publishing, QueryRouteRequest,
    Resource, SendMessageRequest, Settings, SystemProperties, TelemetryCommand,
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

/// Client id every official client sends as `x-mq-client-id`.
const CLIENT_ID: &str = "protocol-test@1";

/// `msg` as a request from client `client_id` (none: without the header).
fn from<T>(msg: T, client_id: Option<&str>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    if let Some(id) = client_id {
        req.metadata_mut()
            .insert("x-mq-client-id", id.parse().unwrap());
    }
    req
}

/// Sends `messages` as one request; (status code, result entries).
async fn send_all(
    c: &mut MessagingServiceClient<Channel>,
    messages: Vec<Message>,
    client_id: Option<&str>,
) -> (i32, usize) {
    let r = c
        .send_message(from(SendMessageRequest { messages }, client_id))
        .await
        .unwrap()
        .into_inner();
    (r.status.unwrap().code, r.entries.len())
}

async fn send_code(c: &mut MessagingServiceClient<Channel>, m: Message) -> i32 {
    let (code, entries) = send_all(c, vec![m], Some(CLIENT_ID)).await;
    assert_eq!(entries, 1, "one result entry per message");
    code
}

/// One receive as `client_id`: (status code, bodies, receipt handles).
async fn receive(
    c: &mut MessagingServiceClient<Channel>,
    group: &str,
    topic: &str,
    client_id: &str,
) -> (i32, Vec<String>, Vec<String>) {
    let client_id = Some(client_id).filter(|c| !c.is_empty());
    let req = from(receive_request(group, topic, 30, 2), client_id);
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

/// A MessagingService client of `cluster`'s node `node`.
async fn client_of(cluster: &LocalCluster, node: usize) -> MessagingServiceClient<Channel> {
    let addr = &cluster.nodes[node].client_addr;
    MessagingServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

/// A 3-node group with topic `Known` (2 queues), and a client of one of its
/// followers: any node answers every call.
async fn known_topic_through_a_follower(
    dir: &std::path::Path,
) -> (LocalCluster, MessagingServiceClient<Channel>) {
    let cluster = LocalCluster::start(dir, &ClusterOptions::default())
        .await
        .unwrap();
    let leader = cluster
        .prepare("broker-a", &[&["updateTopic", "-t", "Known", "-q", "2"]])
        .await
        .unwrap();
    let c = client_of(&cluster, (leader + 1) % 3).await;
    (cluster, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_protocols_status_codes() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, mut c) = known_topic_through_a_follower(dir.path()).await;
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
            // A delay message (it has a delivery timestamp) to a NORMAL topic.
            {
                let mut m = message("Known", b"x", "id-6");
                m.system_properties.as_mut().unwrap().delivery_timestamp =
                    Some(prost_types::Timestamp {
                        seconds: 1,
                        nanos: 0,
                    });
                m
            },
            Code::MessagePropertyConflictWithType,
        ),
        (
            {
                let mut m = message("Known", b"x", "id-8");
                m.system_properties.as_mut().unwrap().message_type =
                    ledgermq_broker::pb::MessageType::Transaction as i32;
                m
            },
            // A transactional message to a NORMAL topic.
            Code::MessagePropertyConflictWithType,
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
        .ack_message(from(
            AckMessageRequest {
                group: res("G"),
                topic: res("Known"),
                entries: vec![AckMessageEntry {
                    message_id: "id-1".into(),
                    receipt_handle: "forged".into(),
                }],
            },
            Some(CLIENT_ID),
        ))
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
    let mut c = client_of(&cluster, leader).await;
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

/// A producer's Settings command for `topic`.
fn producer_settings(topic: &str) -> TelemetryCommand {
    TelemetryCommand {
        status: None,
        command: Some(telemetry_command::Command::Settings(Settings {
            client_type: Some(ClientType::Producer as i32),
            pub_sub: Some(settings::PubSub::Publishing(Publishing {
                topics: vec![res(topic).unwrap()],
                max_body_size: 0,
                validate_message_type: true,
            })),
            ..Default::default()
        })),
    }
}

/// A request without the client id gets CLIENT_ID_REQUIRED, as from the reference
/// proxy (`GrpcMessagingApplication.validateContext`), on every call; a message
/// type the protocol does not define is refused, not stored as a normal message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_client_ids_and_unknown_message_types_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, mut c) = known_topic_through_a_follower(dir.path()).await;
    let required = Code::ClientIdRequired as i32;

    let mut m = message("Known", b"x", "id-type");
    m.system_properties.as_mut().unwrap().message_type = 99;
    assert_eq!(send_code(&mut c, m).await, Code::Unsupported as i32);

    let (code, entries) = send_all(&mut c, vec![message("Known", b"x", "id-n")], None).await;
    assert_eq!((code, entries), (required, 1), "send");
    let route = c
        .query_route(from(
            QueryRouteRequest {
                topic: res("Known"),
                endpoints: None,
            },
            None,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(route.status.unwrap().code, required, "query route");
    let hb = c
        .heartbeat(from(HeartbeatRequest::default(), None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(hb.status.unwrap().code, required, "heartbeat");
    let (code, bodies, _) = receive(&mut c, "G", "Known", "").await;
    assert_eq!((code, bodies.len()), (required, 0), "receive");
    let ack = c
        .ack_message(from(
            AckMessageRequest {
                group: res("G"),
                topic: res("Known"),
                entries: vec![AckMessageEntry {
                    message_id: "id-1".into(),
                    receipt_handle: "forged".into(),
                }],
            },
            None,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ack.status.unwrap().code, required, "ack");
    let outbound = tonic::codegen::tokio_stream::iter(vec![producer_settings("Known")]);
    let mut replies = c
        .telemetry(from(outbound, None))
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), replies.message())
        .await
        .expect("a telemetry reply")
        .unwrap()
        .expect("a telemetry reply");
    assert_eq!(first.status.unwrap().code, required, "telemetry");
}

/// Bounds on what one client can make the broker keep: messages per send, queues
/// per topic, and a Telemetry stream whose replies are not read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_topics_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(dir.path(), &ClusterOptions::default())
        .await
        .unwrap();
    let leader = cluster
        .prepare("broker-a", &[&["updateTopic", "-t", "Known", "-q", "64"]])
        .await
        .unwrap();
    let e = cluster
        .admin(&["updateTopic", "-t", "Huge", "-q", "1024"])
        .expect_err("1024 queues are over the default bound of 64");
    assert!(e.to_string().contains("queue"), "{e}");
    let mut c = client_of(&cluster, leader).await;
    let many = |n: usize| {
        (0..n)
            .map(|i| message("Known", b"x", &format!("id-{i}")))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        send_all(&mut c, many(1024), Some(CLIENT_ID)).await,
        (Code::Ok as i32, 1024)
    );
    assert_eq!(
        send_all(&mut c, many(1025), Some(CLIENT_ID)).await,
        (Code::PayloadTooLarge as i32, 1025)
    );

    // A client that sends Settings over and over without reading the replies: the
    // broker stops buffering replies for it and ends its stream.
    const SENT: usize = 50_000;
    let outbound = tonic::codegen::tokio_stream::iter(vec![producer_settings("Known"); SENT]);
    let mut replies = c
        .telemetry(from(outbound, Some(CLIENT_ID)))
        .await
        .unwrap()
        .into_inner();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut got = 0;
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(10), replies.message()).await {
            Ok(Ok(Some(_))) => got += 1,
            Ok(Ok(None)) => break None,
            Ok(Err(s)) => break Some(s.code()),
            Err(_) => panic!("the telemetry stream neither ended nor answered ({got} replies)"),
        }
    };
    eprintln!("telemetry: {got} of {SENT} replies, then {end:?}");
    assert!(
        got < SENT,
        "every one of {SENT} replies was kept for the client"
    );
    assert_eq!(end, Some(tonic::Code::ResourceExhausted));
}

/// Auto-created consumer groups and broadcasting client ids stop at their bounds
/// (here 3 groups and 2 client ids per broadcasting group).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_groups_and_broadcasting_clients_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(dir.path(), &ClusterOptions::default())
        .await
        .unwrap();
    for i in 0..cluster.nodes.len() {
        let cfg = cluster.nodes[i].config.clone();
        let text = std::fs::read_to_string(&cfg).unwrap().replacen(
            "\n[peers]",
            "\nmax_consumer_groups = 3\nmax_broadcast_clients_per_group = 2\n\n[peers]",
            1,
        );
        std::fs::write(&cfg, text).unwrap();
        cluster.restart(i).unwrap();
    }
    let leader = cluster
        .prepare(
            "broker-a",
            &[
                &["updateTopic", "-t", "Known", "-q", "2"],
                &["updateSubGroup", "-g", "Everyone", "--broadcast"],
            ],
        )
        .await
        .unwrap();
    let mut c = client_of(&cluster, leader).await;
    let none = Code::MessageNotFound as i32;
    for g in ["G1", "G2"] {
        assert_eq!(receive(&mut c, g, "Known", CLIENT_ID).await.0, none, "{g}");
    }
    let (code, _, _) = receive(&mut c, "G3", "Known", CLIENT_ID).await;
    assert_eq!(code, Code::ConsumerGroupNotFound as i32, "a fourth group");
    // Existing groups keep working.
    assert_eq!(receive(&mut c, "G1", "Known", CLIENT_ID).await.0, none);

    for client in ["c1", "c2", "c1"] {
        let (code, _, _) = receive(&mut c, "Everyone", "Known", client).await;
        assert_eq!(code, none, "{client}");
    }
    let (code, _, _) = receive(&mut c, "Everyone", "Known", "c3").await;
    assert_eq!(code, Code::TooManyRequests as i32, "a third client id");
}
