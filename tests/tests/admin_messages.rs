//! `mqadmin` on a group's messages, on real `mqbroker` processes: rewinding a
//! consumer group to a time (`resetOffsetByTime`, the admin service's
//! ResetOffset), asked of a follower, made by the leader through Raft, so the
//! group consumes from the new offsets after the leader is killed too; and
//! finding messages by key and by message id (`queryMsgByKey`,
//! `queryMsgByUniqueKey`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ledgermq_broker::admin_pb::broker_admin_client::BrokerAdminClient;
use ledgermq_broker::admin_pb::ResetOffsetRequest;
use ledgermq_broker::pb::messaging_service_client::MessagingServiceClient;
use ledgermq_broker::pb::{
    receive_message_response::Content, AckMessageEntry, AckMessageRequest, Code, Message, Resource,
    SendMessageRequest, SystemProperties,
};
use ledgermq_jepsen::workload::receive_request;
use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};
use tonic::transport::Channel;

const TOPIC: &str = "Rewind";
const GROUP: &str = "RewindGroup";
const CLIENT_ID: &str = "reset-offset-test@1";

fn res(name: &str) -> Option<Resource> {
    Some(Resource {
        resource_namespace: String::new(),
        name: name.into(),
    })
}

fn request<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert("x-mq-client-id", CLIENT_ID.parse().unwrap());
    req
}

async fn client(addr: &str) -> MessagingServiceClient<Channel> {
    MessagingServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

/// Sends each body as a message of [`TOPIC`] whose message id is the body;
/// panics unless each is answered OK.
async fn send(c: &mut MessagingServiceClient<Channel>, bodies: &[String]) {
    send_keyed(c, bodies, |_| Vec::new()).await
}

/// [`send`], each message with the keys `keys` gives its body.
async fn send_keyed(
    c: &mut MessagingServiceClient<Channel>,
    bodies: &[String],
    keys: impl Fn(&str) -> Vec<String>,
) {
    for b in bodies {
        let m = Message {
            topic: res(TOPIC),
            user_properties: Default::default(),
            system_properties: Some(SystemProperties {
                message_id: b.clone(),
                keys: keys(b),
                tag: Some("TagA".into()),
                message_type: ledgermq_broker::pb::MessageType::Normal as i32,
                ..Default::default()
            }),
            body: b.as_bytes().to_vec(),
        };
        let r = c
            .send_message(request(SendMessageRequest { messages: vec![m] }))
            .await
            .unwrap()
            .into_inner();
        let s = r.status.unwrap();
        assert_eq!(s.code, Code::Ok as i32, "send {b}: {}", s.message);
    }
}

/// Receives and acks until `want` distinct bodies came, then for `quiet` more
/// (to see anything else that comes); every body received, in order.
async fn consume(
    c: &mut MessagingServiceClient<Channel>,
    want: usize,
    quiet: Duration,
) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut got = Vec::new();
    let mut quiet_until: Option<Instant> = None;
    loop {
        let distinct = got.iter().collect::<BTreeSet<_>>().len();
        if distinct >= want {
            let until = *quiet_until.get_or_insert_with(|| Instant::now() + quiet);
            if Instant::now() >= until {
                return got;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{distinct} of {want} distinct messages after 60 s: {got:?}"
        );
        let Ok(r) = c
            .receive_message(request(receive_request(GROUP, TOPIC, 30, 1)))
            .await
        else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut s = r.into_inner();
        let mut handles = Vec::new();
        while let Ok(Some(item)) = s.message().await {
            if let Some(Content::Message(m)) = item.content {
                got.push(String::from_utf8_lossy(&m.body).into_owned());
                handles.push(m.system_properties.unwrap().receipt_handle.unwrap());
            }
        }
        for h in handles {
            let ack = AckMessageRequest {
                group: res(GROUP),
                topic: res(TOPIC),
                entries: vec![AckMessageEntry {
                    message_id: String::new(),
                    receipt_handle: h,
                }],
            };
            let r = c.ack_message(request(ack)).await.unwrap().into_inner();
            assert_eq!(r.status.unwrap().code, Code::Ok as i32, "ack");
        }
    }
}

fn sorted(v: &[String]) -> Vec<String> {
    let mut v = v.to_vec();
    v.sort();
    v
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_rewound_to_a_time_consumes_again_from_there_after_the_leader_dies() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(dir.path(), &ClusterOptions::default())
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
    let follower = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    let mut c = client(&cluster.nodes[follower].client_addr).await;
    // topicList: the topic, once; with -c, its cluster and broker group.
    let list = cluster.admin(&["topicList"]).unwrap();
    assert_eq!(list.lines().filter(|l| *l == TOPIC).count(), 1, "{list}");
    let list = cluster
        .admin(&["topicList", "-c", "DefaultCluster"])
        .unwrap();
    assert!(
        list.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["DefaultCluster", TOPIC, "broker-a"]),
        "{list}"
    );
    assert!(cluster
        .admin(&["topicList", "-c", "NoSuchCluster"])
        .is_err());

    let before: Vec<String> = (0..10).map(|i| format!("before-{i}")).collect();
    let after: Vec<String> = (0..10).map(|i| format!("after-{i}")).collect();
    send(&mut c, &before).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let rewind_to_ms = now_ms();
    tokio::time::sleep(Duration::from_millis(50)).await;
    send(&mut c, &after).await;
    let all = consume(&mut c, 20, Duration::ZERO).await;
    assert_eq!(all.iter().collect::<BTreeSet<_>>().len(), 20);
    // Let the acks' offsets be committed through Raft, as a running group's are.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let p = cluster
            .admin(&["consumerProgress", "-g", GROUP, "-t", TOPIC])
            .unwrap();
        if p.contains("Diff Total: 0") {
            break;
        }
        assert!(Instant::now() < deadline, "offsets not committed: {p}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // raftStatus: three members, one leader, which lists its two followers.
    let raft = cluster.admin(&["raftStatus"]).unwrap();
    let roles: Vec<&str> = raft
        .lines()
        .filter(|l| l.starts_with("broker-a "))
        .filter_map(|l| l.split_whitespace().nth(3))
        .collect();
    assert_eq!(
        roles.iter().filter(|r| **r == "leader").count(),
        1,
        "{raft}"
    );
    assert_eq!(roles.len(), 3, "{raft}");
    assert_eq!(
        raft.lines().filter(|l| l.starts_with("  node ")).count(),
        2,
        "{raft}"
    );

    // topicStatus: every queue's offsets, the 20 messages held in all.
    let status = cluster.admin(&["topicStatus", "-t", TOPIC]).unwrap();
    assert!(status.contains("Messages held: 20"), "{status}");
    assert!(
        status.lines().any(|l| l.starts_with("broker-a")),
        "{status}"
    );
    assert!(cluster
        .admin(&["topicStatus", "-t", "NoSuchTopic"])
        .is_err());

    // Asked of a follower, made by the leader.
    let mut admin =
        BrokerAdminClient::connect(format!("http://{}", cluster.nodes[follower].client_addr))
            .await
            .unwrap();
    let r = admin
        .reset_offset(ResetOffsetRequest {
            group: GROUP.into(),
            topic: TOPIC.into(),
            timestamp_ms: rewind_to_ms,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.error, "");
    assert_eq!(r.node_id, cluster.nodes[leader].node_id);
    assert_eq!(r.queues.len(), 2);
    let rewound: u64 = r.queues.iter().map(|q| q.previous_offset - q.offset).sum();
    assert_eq!(rewound, 10, "{:?}", r.queues);

    // The reset is replicated: the next leader serves from it.
    cluster.kill(leader);
    cluster
        .wait_leader("broker-a", Duration::from_secs(15))
        .await
        .unwrap();
    let mut c = client(&cluster.nodes[other].client_addr).await;
    let again = consume(&mut c, 10, Duration::from_secs(2)).await;
    assert_eq!(
        sorted(&again).iter().collect::<BTreeSet<_>>(),
        after.iter().collect::<BTreeSet<_>>(),
        "after the reset to the time between the two batches: {again:?}"
    );

    // mqadmin, in RocketMQ's form: back to the beginning. A reset is a command
    // every member must decode (log command set 4), so it waits for the killed
    // member: refused, with that reason, until it is back and heard from.
    let reset = ["resetOffsetByTime", "-g", GROUP, "-t", TOPIC, "-s", "0"];
    let refused = cluster.admin(&reset).unwrap_err().to_string();
    assert!(refused.contains("does not decode"), "{refused}");
    cluster.restart(leader).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let out = loop {
        match cluster.admin(&reset) {
            Ok(out) => break out,
            Err(e) if Instant::now() < deadline => {
                let e = e.to_string();
                assert!(e.contains("does not decode"), "{e}");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(e) => panic!("the reset is refused with every member up: {e}"),
        }
    };
    assert!(out.contains("#queueId"), "{out}");
    let everything = consume(&mut c, 20, Duration::from_secs(2)).await;
    let mut want = before.clone();
    want.extend(after.iter().cloned());
    assert_eq!(
        sorted(&everything).iter().collect::<BTreeSet<_>>(),
        want.iter().collect::<BTreeSet<_>>()
    );
    // A broadcasting group is refused, with the reason.
    cluster
        .admin(&["updateSubGroup", "-g", "RewindEveryone", "--broadcast"])
        .unwrap();
    let refused = cluster
        .admin(&[
            "resetOffsetByTime",
            "-g",
            "RewindEveryone",
            "-t",
            TOPIC,
            "-s",
            "now",
        ])
        .unwrap_err()
        .to_string();
    assert!(refused.contains("broadcasting"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_found_by_key_and_by_message_id() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(dir.path(), &ClusterOptions::default())
        .await
        .unwrap();
    let leader = cluster
        .prepare("broker-a", &[&["updateTopic", "-t", TOPIC, "-q", "2"]])
        .await
        .unwrap();
    let mut c = client(&cluster.nodes[(leader + 1) % 3].client_addr).await;
    let ids: Vec<String> = (0..6).map(|i| format!("order-msg-{i}")).collect();
    // Even messages carry the key "even", every one its own "order-<i>".
    send_keyed(&mut c, &ids, |id| {
        let i: u32 = id.rsplit('-').next().unwrap().parse().unwrap();
        let mut keys = vec![format!("order-{i}")];
        if i % 2 == 0 {
            keys.push("even".into());
        }
        keys
    })
    .await;

    let lines_with = |out: &str, what: &str| out.lines().filter(|l| l.contains(what)).count();
    let by_key = cluster
        .admin(&["queryMsgByKey", "-t", TOPIC, "-k", "even"])
        .unwrap();
    for (i, id) in ids.iter().enumerate() {
        let want = usize::from(i % 2 == 0);
        assert_eq!(lines_with(&by_key, id), want, "{id}: {by_key}");
    }
    let one = cluster
        .admin(&["queryMsgByKey", "-t", TOPIC, "-k", "order-3"])
        .unwrap();
    assert_eq!(lines_with(&one, "order-msg-"), 1, "{one}");
    assert_eq!(lines_with(&one, &ids[3]), 1, "{one}");
    // A message id is a key too.
    let by_id = cluster
        .admin(&["queryMsgByKey", "-t", TOPIC, "-k", &ids[5]])
        .unwrap();
    assert_eq!(lines_with(&by_id, &ids[5]), 1, "{by_id}");
    let none = cluster
        .admin(&["queryMsgByKey", "-t", TOPIC, "-k", "no-such-key"])
        .unwrap();
    assert_eq!(lines_with(&none, "order-msg-"), 0, "{none}");

    // In full: tags, keys, the body.
    let full = cluster
        .admin(&["queryMsgByUniqueKey", "-t", TOPIC, "-i", &ids[4]])
        .unwrap();
    for want in ["TagA", "order-4 even", "Body", &ids[4]] {
        assert!(full.contains(want), "{want} missing: {full}");
    }
    let missing = cluster
        .admin(&["queryMsgByUniqueKey", "-t", TOPIC, "-i", "order-4"])
        .unwrap_err()
        .to_string();
    assert!(missing.contains("no message"), "{missing}");
    let bad = cluster
        .admin(&[
            "queryMsgByKey",
            "-t",
            TOPIC,
            "-k",
            "even",
            "--maxNum",
            "100000",
        ])
        .unwrap_err()
        .to_string();
    assert!(bad.contains("at most 256"), "{bad}");
}

/// A group whose members announce one `client_endpoint` (a name the admin's
/// host may not resolve at all): `mqadmin` still reaches each member at its
/// own address, so `updateTopic` works, `clusterList` prints every member's
/// own address and `raftStatus` asks each member once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_calls_reach_each_member_of_a_group_with_one_client_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(
        dir.path(),
        &ClusterOptions {
            client_endpoint: Some("ledgermq-group.invalid:8081".into()),
            ..ClusterOptions::default()
        },
    )
    .await
    .unwrap();
    cluster
        .prepare("broker-a", &[&["updateTopic", "-t", TOPIC, "-q", "2"]])
        .await
        .unwrap();
    let own: BTreeSet<String> = cluster
        .nodes
        .iter()
        .map(|n| n.client_addr.clone())
        .collect();
    let list = cluster.admin(&["clusterList"]).unwrap();
    let listed: BTreeSet<String> = list
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(3))
        .map(str::to_owned)
        .collect();
    assert_eq!(listed, own, "{list}");
    let raft = cluster.admin(&["raftStatus"]).unwrap();
    let ids: BTreeSet<&str> = raft
        .lines()
        .filter(|l| l.starts_with("broker-a "))
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    assert_eq!(ids, BTreeSet::from(["0", "1", "2"]), "{raft}");
}
