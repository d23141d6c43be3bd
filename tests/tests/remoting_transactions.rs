//! Transactional messages over the 4.x remoting protocol, byte by byte, as a
//! Java `TransactionMQProducer` speaks it: a half message sent with
//! `TRAN_MSG` stays invisible; END_TRANSACTION (oneway, through a follower)
//! commits it; a half left open is checked back over the producer's own
//! connection (CHECK_TRANSACTION_STATE, with the message in RocketMQ's stored
//! layout) and the producer's rollback keeps it from ever being delivered.

use std::time::{Duration, Instant};

use ledgermq_remoting::message::decode_messages;
use ledgermq_remoting::RemotingCommand;
use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};
use ledgermq_tests::remoting::Client;

fn req(code: i32, fields: &[(&str, &str)]) -> RemotingCommand {
    RemotingCommand::request(code, fields.iter().copied())
}

fn half(id: &str, body: &[u8]) -> RemotingCommand {
    let props = format!("TRAN_MSG\u{1}true\u{2}PGROUP\u{1}TxPG\u{2}UNIQ_KEY\u{1}{id}\u{2}CHECK_IMMUNITY_TIME_IN_SECONDS\u{1}1\u{2}");
    let mut r = req(
        310,
        &[
            ("a", "TxPG"),
            ("b", "TxTopic"),
            ("c", "TBW102"),
            ("d", "4"),
            ("e", "0"),
            ("f", "4"),
            ("g", "0"),
            ("h", "0"),
            ("i", &props),
        ],
    );
    r.body = body.to_vec();
    r
}

/// Bodies of queue 0 of TxTopic, as a pull from `addr` answers.
fn bodies(addr: &str) -> Vec<Vec<u8>> {
    ledgermq_tests::remoting::pull_bodies(addr, "TxCG", "TxTopic", 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remoting_transactions_commit_and_are_checked_back() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(
        dir.path(),
        &ClusterOptions {
            remoting: true,
            // A check every second, at most 3.
            transaction_checks: Some((1000, 3)),
            ..ClusterOptions::default()
        },
    )
    .await
    .unwrap();
    cluster
        .prepare("broker-a", &[&["updateTopic", "-t", "TxTopic", "-q", "1"]])
        .await
        .unwrap();
    let ns = cluster.namesrv_addr.clone();
    tokio::task::spawn_blocking(move || check(&ns))
        .await
        .unwrap();
}

fn check(ns: &str) {
    let route = Client::connect(ns).call(req(105, &[("topic", "TxTopic")]));
    assert_eq!(route.code, 0, "{:?}", route.remark);
    let v: serde_json::Value = serde_json::from_slice(&route.body).unwrap();
    let addrs = &v["brokerDatas"][0]["brokerAddrs"];
    let leader = addrs["0"].as_str().unwrap().to_owned();
    let follower = addrs
        .as_object()
        .unwrap()
        .iter()
        .map(|(_, a)| a.as_str().unwrap().to_owned())
        .find(|a| *a != leader)
        .unwrap();

    // The producer's connection to the leader, known by its heartbeat.
    let mut p = Client::connect(&leader);
    let mut hb = req(34, &[]);
    hb.body = br#"{"clientID":"p1","producerDataSet":[{"groupName":"TxPG"}],"consumerDataSet":[]}"#
        .to_vec();
    assert_eq!(p.call(hb).code, 0);

    // Refused: a producer group no check could reach, a transactional batch.
    let mut bad = half("TX0", b"x");
    bad.ext_fields.insert("a".into(), "no group!".into());
    assert_ne!(p.call(bad).code, 0);
    let mut batch = req(320, &[("a", "TxPG"), ("b", "TxTopic"), ("e", "0")]);
    batch.body =
        ledgermq_remoting::message::encode_batch(&[ledgermq_remoting::message::BatchItem {
            flag: 0,
            body: b"x".to_vec(),
            properties: [("TRAN_MSG".to_owned(), "true".to_owned())].into(),
        }]);
    assert_ne!(p.call(batch).code, 0);

    // Committed through a follower: visible then, and not before.
    let sent = p.call(half("TX1", b"commit me"));
    assert_eq!(sent.code, 0, "{:?}", sent.remark);
    let txid = sent.ext_fields["transactionId"].clone();
    assert!(bodies(&leader).is_empty(), "a half message is invisible");
    // (Java sends it oneway; as a request its answer says how it went.)
    let mut f = Client::connect(&follower);
    let ended = f.call(req(
        37,
        &[
            ("producerGroup", "TxPG"),
            ("tranStateTableOffset", &sent.ext_fields["queueOffset"]),
            ("commitLogOffset", "0"),
            ("commitOrRollback", "8"),
            ("fromTransactionCheck", "false"),
            ("msgId", "TX1"),
            ("transactionId", &txid),
        ],
    ));
    assert_eq!(ended.code, 0, "{:?}", ended.remark);
    let deadline = Instant::now() + Duration::from_secs(10);
    while bodies(&leader) != vec![b"commit me".to_vec()] {
        assert!(Instant::now() < deadline, "the commit never showed");
        std::thread::sleep(Duration::from_millis(100));
    }

    // Left open: checked back over the producer's connection, rolled back.
    let sent = p.call(half("TX2", b"roll me back"));
    assert_eq!(sent.code, 0, "{:?}", sent.remark);
    let txid2 = sent.ext_fields["transactionId"].clone();
    let check = p.wait_request(39, &txid2, Duration::from_secs(20));
    assert_eq!(check.ext_fields["msgId"], "TX2");
    let shown = decode_messages(&check.body).unwrap();
    assert_eq!(
        (shown[0].topic, shown[0].body),
        ("TxTopic", &b"roll me back"[..])
    );
    assert!(shown[0].properties.contains("PGROUP\u{1}TxPG\u{2}"));
    p.oneway(req(
        37,
        &[
            ("producerGroup", "TxPG"),
            (
                "tranStateTableOffset",
                &check.ext_fields["tranStateTableOffset"],
            ),
            ("commitLogOffset", &check.ext_fields["commitLogOffset"]),
            ("commitOrRollback", "12"),
            ("fromTransactionCheck", "true"),
            ("msgId", "TX2"),
            ("transactionId", &txid2),
        ],
    ));
    // Ended by the rollback: no more checks (one already under way may still
    // arrive in the first half second), and never delivered.
    std::thread::sleep(Duration::from_millis(500));
    while p.read_frame().is_some() {}
    p.server_requests.clear();
    let quiet_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < quiet_until {
        if let Some(c) = p.read_frame() {
            assert!(
                !(c.code == 39 && c.ext_fields.get("transactionId") == Some(&txid2)),
                "checked back again after its rollback"
            );
        }
    }
    assert_eq!(bodies(&leader), vec![b"commit me".to_vec()]);
    assert_eq!(bodies(&follower), vec![b"commit me".to_vec()]);
}
