//! The official RocketMQ 5 Python client (`rocketmq-python-client==5.1.2`, installed
//! by `.ci/run`) against a real cluster: `tests/python/client_check.py` sends normal
//! and FIFO messages, kills the leader (SIGKILL) half way, and consumes with a
//! SimpleConsumer and a FIFO PushConsumer; it fails on any lost, filtered-out or
//! out-of-order message.

use std::process::Command;

use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_python_client_survives_a_leader_kill() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(dir.path(), &ClusterOptions::default())
        .await
        .unwrap();
    let leader = cluster
        .prepare(
            "broker-a",
            &[
                &["updateTopic", "-t", "PyNormal", "-q", "4"],
                &["updateTopic", "-t", "PyFifo", "-q", "4", "--fifo"],
                &["updateSubGroup", "-g", "PySimple"],
                &["updateSubGroup", "-g", "PyPush", "--fifo"],
            ],
        )
        .await
        .unwrap();
    // The access point is a follower: users list one address, and it outlives the
    // leader here.
    let access = cluster
        .nodes
        .iter()
        .enumerate()
        .find(|(i, _)| *i != leader)
        .map(|(_, n)| n.client_addr.clone())
        .unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/client_check.py");
    let out_path = dir.path().join("client_check.out");
    let err_path = dir.path().join("client_check.err");
    let mut child = Command::new("python3")
        .arg(script)
        .args(["--access", &access])
        .args([
            "--kill-pid",
            &cluster.nodes[leader].pid().unwrap().to_string(),
        ])
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("python3 runs (scripts/test and .ci/run install the client)");
    // The script bounds its own waits; this bounds a hang inside the client.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    println!("{stdout}");
    let tail = stderr.lines().rev().take(30).collect::<Vec<_>>().join("\n");
    assert!(
        status.is_some_and(|s| s.success()),
        "client_check.py failed or hung ({status:?}): {stdout}\n{tail}"
    );
}
