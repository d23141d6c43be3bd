//! The crates.io RocketMQ Rust client `rocketmq-client-rust` 1.0.0 (4.x
//! remoting), unmodified, as the program `tests/rust-remoting-client` (built by
//! `scripts/test` into `target/rust-remoting-client`): its producer's sends and
//! its transaction producer's commit, rollback and checked-back commit, read
//! back with a remoting pull of every queue.

use std::time::Duration;

use ledgermq_remoting::RemotingCommand;
use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};

fn call(addr: &str, cmd: RemotingCommand) -> RemotingCommand {
    ledgermq_tests::remoting::call(addr, &cmd)
}

/// Every body of `topic`'s 4 queues, read from `addr`, sorted.
fn bodies(addr: &str, topic: &str) -> Vec<String> {
    let mut out: Vec<String> = (0..4)
        .flat_map(|q| ledgermq_tests::remoting::pull_bodies(addr, "RustCheck", topic, q))
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crates_io_remoting_client_sends_and_ends_transactions() {
    let program = std::env::var("LEDGERMQ_RUST_REMOTING_CLIENT").unwrap_or_else(|_| {
        format!(
            "{}/../target/rust-remoting-client/release/ledgermq-rust-remoting-client",
            env!("CARGO_MANIFEST_DIR")
        )
    });
    assert!(
        std::path::Path::new(&program).exists(),
        "{program} is not built: run scripts/test, or cargo build --release --manifest-path \
         tests/rust-remoting-client/Cargo.toml --target-dir target/rust-remoting-client"
    );
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(
        dir.path(),
        &ClusterOptions {
            remoting: true,
            transaction_checks: Some((1000, 5)),
            ..ClusterOptions::default()
        },
    )
    .await
    .unwrap();
    cluster
        .prepare(
            "broker-a",
            &[&["updateTopic", "-t", "RustRemoting", "-q", "4"]],
        )
        .await
        .unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(&program)
            .args([cluster.namesrv_addr.as_str(), "RustRemoting"])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the client finishes within 2 minutes")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The rollback is never delivered; the checked-back one is.
    let want = [
        "commit-1",
        "plain-0",
        "plain-1",
        "plain-2",
        "plain-3",
        "plain-4",
        "unknown-1",
    ];
    let ns = cluster.namesrv_addr.clone();
    let got = tokio::task::spawn_blocking(move || {
        let route = call(
            &ns,
            RemotingCommand::request(105, [("topic", "RustRemoting")]),
        );
        let v: serde_json::Value = serde_json::from_slice(&route.body).unwrap();
        let leader = v["brokerDatas"][0]["brokerAddrs"]["0"]
            .as_str()
            .unwrap()
            .to_owned();
        // The checked-back commit is a oneway END_TRANSACTION: give it time.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let got = bodies(&leader, "RustRemoting");
            if got == want || std::time::Instant::now() >= deadline {
                return got;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    })
    .await
    .unwrap();
    assert_eq!(got, want);
}
