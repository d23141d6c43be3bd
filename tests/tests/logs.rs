//! Process logs on real processes: a node and a name server whose stdout is a
//! file write plain text, with no terminal colour codes, one line per event;
//! `LEDGERMQ_LOG_FORMAT=json` (or `--log-format json`) makes every line a JSON
//! object with the event's level, target and message at the top level.

use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};

/// The lines of the log at `path`, failing if it holds an ESC byte (the start
/// of every ANSI colour code).
fn plain_lines(path: &std::path::Path) -> Vec<String> {
    let bytes = std::fs::read(path).unwrap();
    assert!(
        !bytes.contains(&0x1b),
        "{} holds terminal colour codes",
        path.display()
    );
    String::from_utf8(bytes)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_to_files_are_plain_text_or_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let json = vec![("LEDGERMQ_LOG_FORMAT".to_owned(), "json".to_owned())];
    let cluster = LocalCluster::start(
        dir.path(),
        &ClusterOptions {
            node_env: vec![json],
            ..ClusterOptions::default()
        },
    )
    .await
    .unwrap();
    cluster
        .wait_leader("broker-a", std::time::Duration::from_secs(30))
        .await
        .unwrap();

    // Each node logs its start event just after its client port opens (which
    // the cluster waited for): wait for the events.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !cluster.nodes.iter().all(|n| {
        String::from_utf8_lossy(&std::fs::read(&n.log).unwrap()).contains("mqbroker started")
    }) && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    // Node 0 logs JSON: every line one object.
    let lines = plain_lines(&cluster.nodes[0].log);
    let mut started = false;
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        for key in ["timestamp", "level", "target"] {
            assert!(v.get(key).is_some(), "no {key}: {line}");
        }
        started |= v["message"] == "mqbroker started" && v["node"] == 0;
    }
    assert!(started, "no start event in {lines:?}");

    // The others, and the name server, log text.
    for node in &cluster.nodes[1..] {
        let lines = plain_lines(&node.log);
        assert!(lines.iter().all(|l| !l.starts_with('{')), "{lines:?}");
        assert!(
            lines
                .iter()
                .any(|l| l.contains("INFO") && l.contains("mqbroker started")),
            "{lines:?}"
        );
    }
    let lines = plain_lines(&dir.path().join("namesrv.log"));
    assert!(lines.iter().all(|l| !l.starts_with('{')), "{lines:?}");
    assert!(
        lines.iter().any(|l| l.contains("mqnamesrv listening")),
        "{lines:?}"
    );
}
