//! Retries and dead letters with the official RocketMQ 5 Python client's
//! PushConsumer (`tests/python/retry_dlq_check.py`): groups made with
//! `mqadmin updateSubGroup -r 2`; a message the listener fails is nacked with
//! the backoff the broker's Settings give, delivered again with the next
//! attempt and, after the second, copied to `%DLQ%<group>` by the broker
//! (without the kill, the group has a 2 s retry policy, `updateSubGroup -p`,
//! and each redelivery must come within 6 s, where the default's first is
//! 10 s); a
//! FIFO message the listener fails is retried by the client and forwarded with
//! ForwardMessageToDeadLetterQueue. Messages consumed OK never reach a
//! dead-letter queue. The same again with the leader killed (SIGKILL) right
//! after the first failed delivery: every failed message still reaches its
//! dead-letter queue and no message consumed OK does, and, with the nodes'
//! `exact_delivery_attempts` on, a normal message's attempts only go up across
//! the kill (the next leader counts on from the replicated DeliveryAttempts
//! record, never from 1 again).

use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_messages_are_retried_then_dead_lettered() {
    retried_then_dead_lettered(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_messages_are_retried_then_dead_lettered_through_a_leader_kill() {
    retried_then_dead_lettered(true).await;
}

/// PyRetryGroup's retry policy without the kill: every redelivery after 2 s.
const RETRY_POLICY_2S: &str = r#"{"type":"CUSTOMIZED","customizedRetryPolicy":{"next":[2000]}}"#;

async fn retried_then_dead_lettered(kill_leader: bool) {
    let dir = tempfile::tempdir().unwrap();
    // Through the kill, with delivery attempts recorded through Raft: they
    // never start again at 1.
    let opts = ClusterOptions {
        exact_delivery_attempts: kill_leader,
        ..ClusterOptions::default()
    };
    let cluster = LocalCluster::start(dir.path(), &opts).await.unwrap();
    let leader = cluster
        .prepare(
            "broker-a",
            &[
                &["updateTopic", "-t", "PyRetry", "-q", "2"],
                &["updateTopic", "-t", "PyRetryFifo", "-q", "2", "--fifo"],
                if kill_leader {
                    &["updateSubGroup", "-g", "PyRetryGroup", "-r", "2"]
                } else {
                    &[
                        "updateSubGroup",
                        "-g",
                        "PyRetryGroup",
                        "-r",
                        "2",
                        "-p",
                        RETRY_POLICY_2S,
                    ]
                },
                &[
                    "updateSubGroup",
                    "-g",
                    "PyRetryFifoGroup",
                    "--fifo",
                    "-r",
                    "2",
                ],
                // Readers of the dead-letter queues subscribe before the first
                // dead letter: the topics exist first, as operators make them.
                &["updateTopic", "-t", "%DLQ%PyRetryGroup", "-q", "1"],
                &["updateTopic", "-t", "%DLQ%PyRetryFifoGroup", "-q", "1"],
            ],
        )
        .await
        .unwrap();
    // The access point is a follower: it outlives the leader.
    let access = cluster.nodes[(leader + 1) % 3].client_addr.clone();
    let pid = cluster.nodes[leader].pid().unwrap().to_string();
    let mut args = vec!["--access", &access, "--max-attempts", "2"];
    if kill_leader {
        args.extend(["--kill-pid", &pid]);
    } else {
        args.extend(["--max-retry-gap-s", "6"]);
    }
    let summary = ledgermq_tests::python::run_check(
        "retry_dlq_check.py",
        &args,
        std::time::Duration::from_secs(300),
    )
    .await;
    assert!(summary.contains("\"errors\": []"), "{summary}");
    assert_eq!(
        summary.contains("\"leader_killed\": true"),
        kill_leader,
        "{summary}"
    );
}
