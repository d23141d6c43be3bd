//! The 4.x remoting protocol on real processes, byte by byte: the name server
//! answers routes on the port it serves gRPC on (the cluster's own setup
//! talks gRPC to it), a broker node takes a SEND_MESSAGE_V2 in the ROCKETMQ
//! binary header and a PULL_MESSAGE gives the message back in RocketMQ's
//! stored layout with an offset message id that decodes to the node's
//! remoting address, which VIEW_MESSAGE_BY_ID and QUERY_MESSAGE find again;
//! bad frames get an error answer or a closed connection,
//! never a dead process.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ledgermq_remoting::message::decode_offset_message_id;
use ledgermq_remoting::{RemotingCommand, SerializeType};
use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};
use ledgermq_tests::remoting::{call, read_answer, send_request};

fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn request(code: i32, fields: &[(&str, &str)], body: &[u8]) -> RemotingCommand {
    let mut r = RemotingCommand::request(code, fields.iter().copied());
    r.opaque = 7;
    r.body = body.to_vec();
    r
}

/// Sends raw bytes; the answer, or `None` if the connection was closed.
fn raw(addr: &str, bytes: &[u8]) -> Option<RemotingCommand> {
    let mut s = connect(addr);
    s.write_all(bytes).unwrap();
    read_answer(&mut s)
}

fn frame(type_byte: u8, header: &[u8], body: &[u8]) -> Vec<u8> {
    let mut f = ((4 + header.len() + body.len()) as i32)
        .to_be_bytes()
        .to_vec();
    f.extend_from_slice(&(((type_byte as u32) << 24) | header.len() as u32).to_be_bytes());
    f.extend_from_slice(header);
    f.extend_from_slice(body);
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remoting_routes_sends_pulls_and_bad_frames() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(
        dir.path(),
        &ClusterOptions {
            remoting: true,
            ..ClusterOptions::default()
        },
    )
    .await
    .unwrap();
    let ns = cluster.namesrv_addr.clone();
    cluster
        .prepare(
            "broker-a",
            &[
                &["updateTopic", "-t", "Wire", "-q", "2"],
                &["updateTopic", "-t", "Behind", "-q", "1"],
            ],
        )
        .await
        .unwrap();
    let ns2 = ns.clone();
    tokio::task::spawn_blocking(move || check(&ns2))
        .await
        .unwrap();
}

/// A long poll at a follower for an offset past what it has applied (as a
/// consumer that read from a member which applied first asks) waits for the
/// follower's apply, and then answers with the message, naming the follower
/// again: not 0 at once, which in a consumer's route from before an election
/// is the dead leader. Topic Behind (one queue) starts empty.
fn follower_behind_waits_for_its_apply(leader: &str, follower: &str, follower_id: &str) {
    let behind = request(
        11,
        &[
            ("consumerGroup", "CG"),
            ("topic", "Behind"),
            ("queueId", "0"),
            ("queueOffset", "1"),
            ("maxMsgNums", "32"),
            ("sysFlag", "2"),
            ("suspendTimeoutMillis", "8000"),
            ("subscription", "*"),
        ],
        b"",
    );
    let at = follower.to_owned();
    let waiting = std::thread::spawn(move || call(&at, &behind));
    std::thread::sleep(Duration::from_millis(500));
    for i in 0..2 {
        let key = format!("UNIQ_KEY\u{1}BEHIND{i}\u{2}");
        let send = send_request("Behind", 0, &key, b"behind");
        let sent = call(leader, &send);
        assert_eq!(sent.code, 0, "{:?}", sent.remark);
    }
    let answer = waiting.join().unwrap();
    assert_eq!(
        answer.code, 0,
        "{:?} {:?}",
        answer.remark, answer.ext_fields
    );
    assert_eq!(answer.ext_fields["nextBeginOffset"], "2");
    assert_eq!(answer.ext_fields["suggestWhichBrokerId"], follower_id);
}

fn check(ns: &str) {
    // The route, over remoting, on the name server's one port.
    let route = call(ns, &request(105, &[("topic", "Wire")], b""));
    assert_eq!((route.code, route.opaque), (0, 7), "{:?}", route.remark);
    let v: serde_json::Value = serde_json::from_slice(&route.body).unwrap();
    assert_eq!(v["queueDatas"][0]["writeQueueNums"], 2);
    let addrs = v["brokerDatas"][0]["brokerAddrs"]
        .as_object()
        .unwrap()
        .clone();
    // The leader as 0, and every member (the leader too) as node id + 1.
    assert_eq!(addrs.len(), 4, "{addrs:?}");
    let leader = addrs["0"].as_str().unwrap().to_owned();
    assert_eq!(
        addrs.values().filter(|a| **a == leader).count(),
        2,
        "{addrs:?}"
    );
    let (follower_id, follower) = addrs
        .iter()
        .find(|(_, a)| **a != leader)
        .map(|(id, a)| (id.clone(), a.as_str().unwrap().to_owned()))
        .unwrap();
    assert_eq!(call(ns, &request(105, &[("topic", "Nope")], b"")).code, 17);

    // A send to a follower in the ROCKETMQ header is passed on, committed, and
    // answered with an offset message id naming the follower's address.
    let mut send = send_request(
        "Wire",
        1,
        "TAGS\u{1}T1\u{2}KEYS\u{1}k1\u{2}UNIQ_KEY\u{1}ABCDEF\u{2}",
        b"hello remoting",
    );
    send.serialize_type = SerializeType::RocketMq;
    let sent = call(&follower, &send);
    assert_eq!(sent.code, 0, "{:?}", sent.remark);
    assert_eq!(sent.serialize_type, SerializeType::RocketMq);
    let (host, offset) = decode_offset_message_id(&sent.ext_fields["msgId"]).unwrap();
    assert_eq!(host, follower.parse::<SocketAddr>().unwrap());
    assert_eq!(sent.ext_fields["queueId"], "1");

    // Pulled back from the leader, in RocketMQ's stored layout.
    let pull_req = request(
        11,
        &[
            ("consumerGroup", "CG"),
            ("topic", "Wire"),
            ("queueId", "1"),
            ("queueOffset", "0"),
            ("maxMsgNums", "32"),
            ("sysFlag", "0"),
            ("commitOffset", "0"),
            ("suspendTimeoutMillis", "0"),
            ("subscription", "T1"),
            ("subVersion", "0"),
        ],
        b"",
    );
    // A follower keeps the consumers that pull from it (the route numbers it
    // by node id + 1, as the answer does).
    let from_follower = call(&follower, &pull_req);
    assert_eq!(
        from_follower.ext_fields["suggestWhichBrokerId"], follower_id,
        "{:?}",
        from_follower.remark
    );
    let pull = call(&leader, &pull_req);
    assert_eq!(pull.code, 0, "{:?}", pull.remark);
    assert_eq!(pull.ext_fields["nextBeginOffset"], "1");
    // The leader sends its consumers on to a follower of the route.
    let suggested = &pull.ext_fields["suggestWhichBrokerId"];
    assert!(
        addrs.get(suggested.as_str()).is_some_and(|a| *a != leader),
        "{suggested} in {addrs:?}"
    );
    let b = &pull.body;
    let total = i32::from_be_bytes(b[0..4].try_into().unwrap()) as usize;
    assert_eq!(total, b.len());
    assert_eq!(
        i64::from_be_bytes(b[28..36].try_into().unwrap()) as u64,
        offset,
        "PHYSICALOFFSET is the message id's offset"
    );
    assert!(b.windows(14).any(|w| w == b"hello remoting"));
    assert!(b.ends_with(b"UNIQ_KEY\x01ABCDEF\x02"));
    // A tag the subscription does not take: nothing matches, try again from 1.
    let mut other_tag = request(11, &[], b"");
    other_tag.ext_fields = BTreeMap::from_iter(
        [
            ("consumerGroup", "CG"),
            ("topic", "Wire"),
            ("queueId", "1"),
            ("queueOffset", "0"),
            ("maxMsgNums", "32"),
            ("subscription", "T2"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned())),
    );
    let none = call(&leader, &other_tag);
    assert_eq!(
        (none.code, none.ext_fields["nextBeginOffset"].as_str()),
        (20, "1")
    );

    // Viewed by the offset of its message id, on another node; queried by key
    // and by message id.
    let off = offset.to_string();
    let view = call(&leader, &request(33, &[("offset", &off)], b""));
    assert_eq!(view.code, 0, "{:?}", view.remark);
    let viewed = ledgermq_remoting::message::decode_messages(&view.body).unwrap();
    assert_eq!((viewed.len(), viewed[0].body), (1, &b"hello remoting"[..]));
    let bad_off = (offset + 1).to_string();
    assert_ne!(
        call(&leader, &request(33, &[("offset", &bad_off)], b"")).code,
        0
    );
    let by_key = call(
        &leader,
        &request(
            12,
            &[("topic", "Wire"), ("key", "k1"), ("maxNum", "8")],
            b"",
        ),
    );
    assert_eq!(by_key.code, 0, "{:?}", by_key.remark);
    assert_eq!(
        ledgermq_remoting::message::decode_messages(&by_key.body)
            .unwrap()
            .len(),
        1
    );
    // A follower indexes the message once it applies its entry: soon.
    let by_id_req = request(
        12,
        &[
            ("topic", "Wire"),
            ("key", "ABCDEF"),
            ("_UNIQUE_KEY_QUERY", "true"),
        ],
        b"",
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let by_id = call(&follower, &by_id_req);
        if by_id.code == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{:?}", by_id.remark);
        std::thread::sleep(Duration::from_millis(50));
    }
    let none = call(
        &leader,
        &request(12, &[("topic", "Wire"), ("key", "nope")], b""),
    );
    assert_eq!(none.code, 22);

    // A delay message's stored record is the broker's own (a timer): neither
    // viewed nor sent back into a retry topic before its time.
    let mut delayed = send.clone();
    delayed
        .ext_fields
        .insert("i".into(), "DELAY\u{1}5\u{2}UNIQ_KEY\u{1}D1\u{2}".into());
    let d = call(&follower, &delayed);
    assert_eq!(d.code, 0, "{:?}", d.remark);
    assert_eq!(d.ext_fields["queueId"], "1", "the queue it goes to");
    let (_, timer_offset) = decode_offset_message_id(&d.ext_fields["msgId"]).unwrap();
    let t = timer_offset.to_string();
    assert_ne!(call(&leader, &request(33, &[("offset", &t)], b"")).code, 0);
    let back = |offset: &str| {
        request(
            36,
            &[
                ("offset", offset),
                ("group", "CG"),
                ("delayLevel", "1"),
                ("maxReconsumeTimes", "16"),
            ],
            b"",
        )
    };
    assert_ne!(call(&leader, &back(&t)).code, 0, "a timer is not sent back");

    // Consumer offsets: a commit is seen at once by a query, and after its
    // flush through Raft on every node; a queue the topic lacks is refused.
    let commit = |q: &str, o: &str| {
        request(
            15,
            &[
                ("consumerGroup", "CG"),
                ("topic", "Wire"),
                ("queueId", q),
                ("commitOffset", o),
            ],
            b"",
        )
    };
    assert_eq!(call(&follower, &commit("1", "1")).code, 0);
    assert_ne!(call(&follower, &commit("9", "1")).code, 0, "queue 9 of 2");
    let query = |addr: &str| {
        call(
            addr,
            &request(
                14,
                &[("consumerGroup", "CG"), ("topic", "Wire"), ("queueId", "1")],
                b"",
            ),
        )
    };
    assert_eq!(query(&follower).ext_fields["offset"], "1");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while query(&leader).ext_fields.get("offset").map(String::as_str) != Some("1") {
        assert!(
            std::time::Instant::now() < deadline,
            "the offset never reached the leader"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(query(&leader).code, 0);

    // A message sent back goes to the group's retry topic; a client's own
    // retry past the most reconsumes goes to the dead-letter queue.
    let hb =
        br#"{"clientID":"c1","consumerDataSet":[{"groupName":"CG","messageModel":"CLUSTERING"}]}"#;
    assert_eq!(call(&leader, &request(34, &[], hb)).code, 0);
    assert_eq!(call(&leader, &back(&offset.to_string())).code, 0);
    let mut give_up = send.clone();
    give_up.ext_fields.insert("b".into(), "%RETRY%CG".into());
    give_up.ext_fields.insert("e".into(), "0".into());
    give_up.ext_fields.insert("j".into(), "16".into());
    let g = call(&leader, &give_up);
    assert_eq!(g.code, 0, "{:?}", g.remark);
    // Never for a group that does not exist (no topics made for it).
    let mut stranger = give_up.clone();
    stranger.ext_fields.insert("b".into(), "%RETRY%Nope".into());
    assert_eq!(call(&leader, &stranger).code, 26);
    let mut back_nope = back(&offset.to_string());
    back_nope.ext_fields.insert("group".into(), "Nope".into());
    assert_eq!(call(&leader, &back_nope).code, 26);
    let dlq_pull = request(
        11,
        &[
            ("consumerGroup", "CG"),
            ("topic", "%DLQ%CG"),
            ("queueId", "0"),
            ("queueOffset", "0"),
            ("maxMsgNums", "32"),
        ],
        b"",
    );
    let dead = call(&leader, &dlq_pull);
    assert_eq!(dead.code, 0, "{:?}", dead.remark);
    assert_eq!(
        ledgermq_remoting::message::decode_messages(&dead.body)
            .unwrap()
            .len(),
        1
    );

    // Bad requests that decode get an error answer; the rest close the
    // connection. Every port keeps serving.
    for addr in [ns, leader.as_str()] {
        assert_eq!(call(addr, &request(999_999, &[], b"")).code, 3);
        let huge = i32::MAX.to_be_bytes();
        assert!(raw(addr, &huge).is_none(), "a frame over 16 MiB");
        assert!(
            raw(addr, &(-1i32).to_be_bytes()).is_none(),
            "a negative length"
        );
        let mut long_header = 8i32.to_be_bytes().to_vec();
        long_header.extend_from_slice(&100u32.to_be_bytes());
        long_header.extend_from_slice(b"{}{}");
        assert!(
            raw(addr, &long_header).is_none(),
            "a header longer than its frame"
        );
        assert!(
            raw(addr, &frame(0, b"{not json", b"")).is_none(),
            "bad JSON"
        );
        assert!(
            raw(addr, &frame(7, b"{}", b"")).is_none(),
            "serialize type 7"
        );
        let fields: String = (0..2000).map(|i| format!("\"k{i}\":\"v\",")).collect();
        let many = format!(
            "{{\"code\":105,\"opaque\":1,\"extFields\":{{{}\"z\":\"v\"}}}}",
            fields
        );
        assert!(
            raw(addr, &frame(0, many.as_bytes(), b"")).is_none(),
            "2001 ext fields"
        );
        assert_eq!(
            call(addr, &request(999_999, &[], b"")).code,
            3,
            "still serving"
        );
    }
    let mut bad_queue = send.clone();
    bad_queue
        .ext_fields
        .insert("h".into(), "not a number".into());
    let a = call(&leader, &bad_queue);
    assert_ne!(a.code, 0);
    assert!(a.remark.unwrap().contains("flag"));
    let mut bad_batch = request(
        320,
        &[("a", "PG"), ("b", "Wire"), ("e", "0")],
        &[0, 0, 0, 99, 1],
    );
    bad_batch.serialize_type = SerializeType::Json;
    let a = call(&leader, &bad_batch);
    assert_ne!(a.code, 0, "a cut batch body is refused");
    let hb = call(&leader, &request(34, &[], b"{\"clientID\":"));
    assert_ne!(hb.code, 0, "a heartbeat whose body is not JSON is refused");
    follower_behind_waits_for_its_apply(&leader, &follower, &follower_id);
}
