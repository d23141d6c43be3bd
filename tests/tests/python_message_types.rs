//! Topic message types with the official RocketMQ 5 Python client
//! (`tests/python/message_types_check.py`): topics made with RocketMQ's
//! `mqadmin updateTopic -a +message.type=...`, a MIXED topic taking normal and FIFO
//! messages, and the client refusing a message its topic's route does not accept.

use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_take_the_message_types_their_attribute_names() {
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
                    "PyMixed",
                    "-q",
                    "4",
                    "-a",
                    "+message.type=MIXED",
                ],
                &[
                    "updateTopic",
                    "-t",
                    "PyDelayOnly",
                    "-q",
                    "2",
                    "-a",
                    "+message.type=DELAY",
                ],
                // FIFO first, then back to NORMAL with RocketMQ's attribute removal.
                &["updateTopic", "-t", "PyNormalOnly", "-q", "2", "--fifo"],
                &[
                    "updateTopic",
                    "-t",
                    "PyNormalOnly",
                    "-q",
                    "2",
                    "-a",
                    "-message.type",
                ],
                &["updateSubGroup", "-g", "PyTypes"],
            ],
        )
        .await
        .unwrap();
    // An update that names no type keeps the topic's.
    cluster
        .admin(&["updateTopic", "-t", "PyDelayOnly", "-q", "2"])
        .unwrap();
    let bad = cluster
        .admin(&[
            "updateTopic",
            "-t",
            "PyBad",
            "-a",
            "+message.type=SCHEDULED",
        ])
        .unwrap_err()
        .to_string();
    assert!(bad.contains("message.type"), "{bad}");
    let access = cluster.nodes[leader].client_addr.clone();
    ledgermq_tests::python::run_check(
        "message_types_check.py",
        &["--access", &access],
        std::time::Duration::from_secs(180),
    )
    .await;
}
