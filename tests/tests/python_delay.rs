//! Delay messages with the official RocketMQ 5 Python client
//! (`tests/python/delay_check.py`): sent to a DELAY topic with delivery
//! timestamps a few seconds ahead, never received before their time, all
//! received after it although the leader is killed (SIGKILL) right after the
//! sends, so they fall due during or after the election; a timestamp given in
//! milliseconds instead of seconds is refused with ILLEGAL_DELIVERY_TIME.

use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_messages_arrive_after_their_time_through_a_leader_kill() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(dir.path(), &ClusterOptions::default())
        .await
        .unwrap();
    let leader = cluster
        .prepare(
            "broker-a",
            &[
                &[
                    "updateTopic",
                    "-t",
                    "PyDelay",
                    "-q",
                    "4",
                    "-a",
                    "+message.type=DELAY",
                ],
                &["updateSubGroup", "-g", "PyDelayGroup"],
            ],
        )
        .await
        .unwrap();
    // The access point is a follower: it outlives the leader.
    let access = cluster
        .nodes
        .iter()
        .enumerate()
        .find(|(i, _)| *i != leader)
        .map(|(_, n)| n.client_addr.clone())
        .unwrap();
    let pid = cluster.nodes[leader].pid().unwrap().to_string();
    let summary = ledgermq_tests::python::run_check(
        "delay_check.py",
        &["--access", &access, "--kill-pid", &pid],
        std::time::Duration::from_secs(240),
    )
    .await;
    // Each timer is delivered once: the topic holds one message per acknowledged
    // send, and at most one more per failed attempt (which may have been stored).
    let json = ledgermq_tests::python::json_int;
    let sent = json(&summary, "sent").expect("sent in the summary");
    let failed = json(&summary, "failed_attempts").expect("failed_attempts");
    let progress = cluster
        .admin(&["consumerProgress", "-g", "PyDelayGroup", "-t", "PyDelay"])
        .unwrap();
    let stored: u64 = progress
        .lines()
        .filter(|l| l.starts_with("PyDelay "))
        .map(|l| l.split_whitespace().nth(3).unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(
        (sent..=sent + failed).contains(&stored),
        "{stored} messages stored in PyDelay for {sent} acknowledged delay sends ({failed} failed attempts):\n{progress}"
    );
}
