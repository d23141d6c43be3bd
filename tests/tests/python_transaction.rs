//! Transactional messages with the official RocketMQ 5 Python client
//! (`tests/python/transaction_check.py`): half messages sent through a follower
//! are invisible until committed; commits are received and rollbacks never,
//! also for ends answered right before the leader is killed (SIGKILL) and for
//! sends and ends made through the election; orphans are checked back over the
//! producer's Telemetry stream (by whichever node leads, through the node the
//! producer is connected to) and end as the checker answers; an orphan whose
//! checks are all answered UNKNOWN is checked `transaction_check_max` times and
//! then discarded, never delivered.

use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};

/// The cluster's `transaction_check_max`.
const CHECK_MAX: u32 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_commit_roll_back_and_are_checked_back_through_a_leader_kill() {
    let dir = tempfile::tempdir().unwrap();
    let opts = ClusterOptions {
        transaction_checks: Some((1_000, CHECK_MAX)),
        ..ClusterOptions::default()
    };
    let cluster = LocalCluster::start(dir.path(), &opts).await.unwrap();
    let leader = cluster
        .prepare(
            "broker-a",
            &[
                &[
                    "updateTopic",
                    "-t",
                    "PyTx",
                    "-q",
                    "4",
                    "-a",
                    "+message.type=TRANSACTION",
                ],
                &["updateSubGroup", "-g", "PyTxGroup"],
            ],
        )
        .await
        .unwrap();
    // The access point is a follower: it outlives the leader, and the next
    // leader may be the other follower, which reaches the producer through it.
    let access = cluster
        .nodes
        .iter()
        .enumerate()
        .find(|(i, _)| *i != leader)
        .map(|(_, n)| n.client_addr.clone())
        .unwrap();
    let pid = cluster.nodes[leader].pid().unwrap().to_string();
    let summary = ledgermq_tests::python::run_check(
        "transaction_check.py",
        &[
            "--access",
            &access,
            "--kill-pid",
            &pid,
            "--check-max",
            &CHECK_MAX.to_string(),
        ],
        std::time::Duration::from_secs(300),
    )
    .await;
    let json = ledgermq_tests::python::json_int;
    assert!(json(&summary, "committed").unwrap() > 0, "{summary}");
    assert!(json(&summary, "rolled_back").unwrap() > 0, "{summary}");
}
