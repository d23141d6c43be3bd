//! Messages in flight while the leader's wall clock jumps (issue 14, found while
//! testing clock faults): a received message stays invisible for the invisible
//! duration asked, counted on the leader's monotonic clock, whatever its wall
//! clock does. Forward, a FIFO queue must neither deliver its next message nor
//! deliver the one in flight again, and a normal queue must not deliver its
//! message in flight again; back, a message must come back once its invisible
//! time has passed. Real `mqbroker` processes under libfaketime (`LD_PRELOAD`, an
//! offset file per node, monotonic clocks untouched: `ledgermq_jepsen::node_env`),
//! as `tests/tests/clock_skew.rs`; skipped when libfaketime is not installed.
//! Also: a FIFO delivery in flight when its leader dies stays invisible its whole
//! time under a new leader whose wall clock is ahead.

use std::time::{Duration, Instant};

use ledgermq_broker::pb::messaging_service_client::MessagingServiceClient;
use ledgermq_broker::pb::{
    receive_message_response::Content, AckMessageEntry, AckMessageRequest, Code, Message,
    MessageType, Resource, SendMessageRequest, SystemProperties,
};
use ledgermq_jepsen::workload::receive_request;
use ledgermq_tests::clocks::SkewableCluster;
use tonic::transport::Channel;

/// How far the leader's wall clock jumps, s: four times the invisible duration.
const JUMP_S: i64 = 120;

/// Invisible duration of the deliveries that must stay invisible, s: longer than
/// the whole test takes after them.
const LONG_INVISIBLE_S: i64 = 30;

/// Invisible duration of the delivery that must come back after the jump back, s.
const SHORT_INVISIBLE_S: i64 = 2;

/// How long the leader is watched for a delivery it must not make, per check.
const WATCH: Duration = Duration::from_secs(5);

const FIFO_TOPIC: &str = "JumpFifo";
const FIFO_GROUP: &str = "JumpFifoGroup";
const TOPIC: &str = "JumpNormal";
const GROUP: &str = "JumpNormalGroup";
const CLIENT_ID: &str = "clock-jump-test@1";

fn res(name: &str) -> Option<Resource> {
    Some(Resource {
        resource_namespace: String::new(),
        name: name.into(),
    })
}

/// A message with body `body`; FIFO of message group `g` if `group` is given.
fn message(topic: &str, body: &str, group: Option<&str>) -> Message {
    Message {
        topic: res(topic),
        user_properties: Default::default(),
        system_properties: Some(SystemProperties {
            message_id: format!("id-{body}"),
            message_type: if group.is_some() {
                MessageType::Fifo as i32
            } else {
                MessageType::Normal as i32
            },
            message_group: group.map(str::to_owned),
            ..Default::default()
        }),
        body: body.as_bytes().to_vec(),
    }
}

fn request<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert("x-mq-client-id", CLIENT_ID.parse().unwrap());
    req.set_timeout(Duration::from_secs(30));
    req
}

async fn send(c: &mut MessagingServiceClient<Channel>, m: Message) {
    let r = c
        .send_message(request(SendMessageRequest { messages: vec![m] }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.status.unwrap().code, Code::Ok as i32, "send");
}

/// One delivery: body, receipt handle, delivery attempt.
#[derive(Debug, Clone)]
struct Delivery {
    body: String,
    handle: String,
    attempt: i32,
}

/// One receive of up to one message, long-polling up to 1 s: what it delivered.
async fn receive(
    c: &mut MessagingServiceClient<Channel>,
    group: &str,
    topic: &str,
    invisible_s: i64,
) -> Vec<Delivery> {
    try_receive(c, group, topic, invisible_s)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// [`receive`]; Err if the call fails or answers a status other than OK or
/// MESSAGE_NOT_FOUND (what a node between leaders may do).
async fn try_receive(
    c: &mut MessagingServiceClient<Channel>,
    group: &str,
    topic: &str,
    invisible_s: i64,
) -> Result<Vec<Delivery>, String> {
    let mut req = receive_request(group, topic, invisible_s, 1);
    req.batch_size = 1;
    let call = c.receive_message(request(req)).await;
    let mut s = call
        .map_err(|e| format!("receive failed: {e}"))?
        .into_inner();
    let mut got = Vec::new();
    while let Some(item) = s
        .message()
        .await
        .map_err(|e| format!("receive failed: {e}"))?
    {
        match item.content.expect("every item has content") {
            Content::Status(st) => {
                if st.code != Code::Ok as i32 && st.code != Code::MessageNotFound as i32 {
                    return Err(format!("receive answered {st:?}"));
                }
            }
            Content::Message(m) => {
                let sp = m.system_properties.unwrap();
                got.push(Delivery {
                    body: String::from_utf8_lossy(&m.body).into_owned(),
                    handle: sp.receipt_handle.unwrap(),
                    attempt: sp.delivery_attempt.unwrap_or(0),
                });
            }
            Content::DeliveryTimestamp(_) => {}
        }
    }
    Ok(got)
}

/// Receives for `how_long`; everything delivered meanwhile. With
/// `between_leaders`, failed calls and refusals (a node between leaders) are
/// retried after 100 ms; without, they fail the test.
async fn watch(
    c: &mut MessagingServiceClient<Channel>,
    group: &str,
    topic: &str,
    how_long: Duration,
    between_leaders: bool,
) -> Vec<Delivery> {
    let until = Instant::now() + how_long;
    let mut got = Vec::new();
    while Instant::now() < until {
        match try_receive(c, group, topic, LONG_INVISIBLE_S).await {
            Ok(ds) => got.extend(ds),
            Err(e) if !between_leaders => panic!("{e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    got
}

/// Receives until a delivery comes or `how_long` passed.
async fn first_delivery(
    c: &mut MessagingServiceClient<Channel>,
    group: &str,
    topic: &str,
    invisible_s: i64,
    how_long: Duration,
) -> Option<Delivery> {
    let until = Instant::now() + how_long;
    while Instant::now() < until {
        if let Some(d) = receive(c, group, topic, invisible_s).await.pop() {
            return Some(d);
        }
    }
    None
}

async fn ack(c: &mut MessagingServiceClient<Channel>, group: &str, topic: &str, handle: &str) {
    let r = c
        .ack_message(request(AckMessageRequest {
            group: res(group),
            topic: res(topic),
            entries: vec![AckMessageEntry {
                message_id: String::new(),
                receipt_handle: handle.to_owned(),
            }],
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.status.unwrap().code, Code::Ok as i32, "ack {handle}");
}

fn bodies(ds: &[Delivery]) -> Vec<(String, i32)> {
    ds.iter().map(|d| (d.body.clone(), d.attempt)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_in_flight_stay_invisible_when_the_leaders_wall_clock_jumps() {
    let Some(sc) = SkewableCluster::start().await else {
        return;
    };
    let cluster = &sc.cluster;
    let leader = cluster
        .prepare(
            "broker-a",
            &[
                &["updateTopic", "-t", FIFO_TOPIC, "-q", "2", "--fifo"],
                &["updateSubGroup", "-g", FIFO_GROUP, "--fifo"],
                &["updateTopic", "-t", TOPIC, "-q", "1"],
                &["updateSubGroup", "-g", GROUP],
            ],
        )
        .await
        .unwrap();
    let addr = &cluster.nodes[leader].client_addr;
    let mut c = MessagingServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    for body in ["f1", "f2"] {
        send(&mut c, message(FIFO_TOPIC, body, Some("g"))).await;
    }
    send(&mut c, message(TOPIC, "n1", None)).await;

    let wait = Duration::from_secs(10);
    let f1 = first_delivery(&mut c, FIFO_GROUP, FIFO_TOPIC, LONG_INVISIBLE_S, wait)
        .await
        .expect("the first FIFO message is delivered");
    assert_eq!((f1.body.as_str(), f1.attempt), ("f1", 1));
    let n1 = first_delivery(&mut c, GROUP, TOPIC, LONG_INVISIBLE_S, wait)
        .await
        .expect("the normal message is delivered");
    assert_eq!((n1.body.as_str(), n1.attempt), ("n1", 1));
    let received = Instant::now();

    // Every failed promise, reported together at the end.
    let mut broken = Vec::new();

    // Forward: both stay in flight for their 30 s, counted from their delivery.
    sc.set_clock(leader, JUMP_S).await;
    let fifo = watch(&mut c, FIFO_GROUP, FIFO_TOPIC, WATCH, false).await;
    let normal = watch(&mut c, GROUP, TOPIC, WATCH, false).await;
    assert!(
        received.elapsed() < Duration::from_secs(LONG_INVISIBLE_S as u64),
        "the checks took longer than the invisible duration"
    );
    if !fifo.is_empty() {
        broken.push(format!(
            "FIFO: delivered while f1 was in flight (its 30 s not over) after the leader's \
             clock jumped {JUMP_S} s forward: (body, attempt) {:?}",
            bodies(&fifo)
        ));
    }
    if !normal.is_empty() {
        broken.push(format!(
            "normal: n1 delivered again within its 30 s after the leader's clock jumped \
             {JUMP_S} s forward: (body, attempt) {:?}",
            bodies(&normal)
        ));
    }

    // The FIFO queue goes on once f1 (its latest delivery) is acked.
    let latest = fifo.iter().rev().find(|d| d.body == "f1").unwrap_or(&f1);
    ack(&mut c, FIFO_GROUP, FIFO_TOPIC, &latest.handle).await;
    let next = first_delivery(&mut c, FIFO_GROUP, FIFO_TOPIC, LONG_INVISIBLE_S, wait).await;
    assert_eq!(
        next.as_ref().map(|d| d.body.as_str()),
        Some("f2"),
        "after f1's ack the FIFO queue delivers f2"
    );

    // Back: a message received for 2 s comes back after about 2 s, not 2 s plus
    // the jump.
    send(&mut c, message(TOPIC, "n2", None)).await;
    let n2 = first_delivery(&mut c, GROUP, TOPIC, SHORT_INVISIBLE_S, wait)
        .await
        .expect("n2 is delivered");
    assert_eq!((n2.body.as_str(), n2.attempt), ("n2", 1));
    let n2_received = Instant::now();
    sc.set_clock(leader, 0).await;
    let again = first_delivery(&mut c, GROUP, TOPIC, LONG_INVISIBLE_S, WATCH).await;
    match again {
        Some(d) if d.body == "n2" => assert_eq!(d.attempt, 2),
        other => broken.push(format!(
            "normal: n2, received for {SHORT_INVISIBLE_S} s, not delivered again within \
             {:?} of that delivery, the leader's clock having jumped {JUMP_S} s back \
             meanwhile (got {:?})",
            n2_received.elapsed(),
            other.map(|d| (d.body, d.attempt))
        )),
    }

    assert_eq!(
        cluster.leader("broker-a").await,
        Some(leader),
        "the leader changed: the test judged the wrong node"
    );
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// How far ahead of the leader's wall clock the followers' are, s.
const AHEAD_S: i64 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_delivery_stays_invisible_its_whole_time_under_a_new_leader_whose_clock_is_ahead() {
    let Some(mut sc) = SkewableCluster::start().await else {
        return;
    };
    let leader = sc
        .cluster
        .prepare(
            "broker-a",
            &[
                &["updateTopic", "-t", FIFO_TOPIC, "-q", "1", "--fifo"],
                &["updateSubGroup", "-g", FIFO_GROUP, "--fifo"],
            ],
        )
        .await
        .unwrap();
    // Whichever follower is elected next has a wall clock 20 s ahead.
    for i in (0..3).filter(|&i| i != leader) {
        sc.set_clock(i, AHEAD_S).await;
    }
    let addr = sc.cluster.nodes[leader].client_addr.clone();
    let mut c = MessagingServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    for body in ["f1", "f2"] {
        send(&mut c, message(FIFO_TOPIC, body, Some("g"))).await;
    }
    let f1 = first_delivery(
        &mut c,
        FIFO_GROUP,
        FIFO_TOPIC,
        LONG_INVISIBLE_S,
        Duration::from_secs(10),
    )
    .await
    .expect("the first FIFO message is delivered");
    let received = Instant::now();
    assert_eq!((f1.body.as_str(), f1.attempt), ("f1", 1));
    // The lease is committed before the delivery is answered; give the
    // followers a moment to apply it, then the leader dies.
    tokio::time::sleep(Duration::from_secs(1)).await;
    sc.cluster.kill(leader);
    let other = (leader + 1) % 3;
    let addr = sc.cluster.nodes[other].client_addr.clone();
    let mut c = MessagingServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    // Until 6 s before f1's 30 s end: nothing of the group may be delivered. A
    // new leader that read the lease's time left off its own wall clock would
    // hand f1 out again about 20 s early.
    let watch_until = received + Duration::from_secs(LONG_INVISIBLE_S as u64 - 6);
    let got = watch(
        &mut c,
        FIFO_GROUP,
        FIFO_TOPIC,
        watch_until.saturating_duration_since(Instant::now()),
        true,
    )
    .await;
    assert!(
        received.elapsed() < Duration::from_secs(LONG_INVISIBLE_S as u64),
        "the watch overran f1's invisible time"
    );
    assert!(
        sc.cluster
            .leader("broker-a")
            .await
            .is_some_and(|l| l != leader),
        "no new leader was elected: the test judged nothing"
    );
    assert!(
        got.is_empty(),
        "FIFO: delivered within f1's {LONG_INVISIBLE_S} s after a leader {AHEAD_S} s ahead took \
         over: (body, attempt) {:?}",
        bodies(&got)
    );
}
