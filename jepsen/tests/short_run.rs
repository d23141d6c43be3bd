//! The CI run of the `jepsen` binary: a short run with fixed seeds covering a
//! partition, a killed leader, a paused leader and a power loss (about 1.5
//! minutes). It must exit 0 (no safety violation) and leave a complete run folder.
//! Needs root, iproute2, nftables and the workspace binaries (`cargo build --bins`).

use std::process::Command;

use ledgermq_jepsen::procs::bin;

#[test]
fn a_short_run_under_faults_finds_no_violation() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin("jepsen").unwrap())
        .current_dir(dir.path())
        .args([
            "run",
            "--time-limit",
            "70",
            "--nemesis",
            "partition-halves,isolate-leader,kill-leader,pause-leader,power-loss",
            "--seed",
            "11",
            "--fault-ms",
            "6000",
            "--gap-ms",
            "6000",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let folder = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().starts_with("jepsen-"))
        .map(|e| e.path());
    let results = folder
        .as_ref()
        .and_then(|f| std::fs::read_to_string(f.join("results.json")).ok())
        .unwrap_or_default();
    assert!(
        out.status.success(),
        "jepsen run failed ({}):\n{stdout}\n{stderr}\n{results}",
        out.status
    );
    let folder = folder.expect("a run folder");
    for f in [
        "history.jsonl",
        "results.json",
        "report.html",
        "n0.log",
        "namesrv.log",
    ] {
        assert!(folder.join(f).is_file(), "{f} missing in {folder:?}");
    }
    let r: serde_json::Value = serde_json::from_str(&results).unwrap();
    assert_eq!(r["valid"], true, "{results}");
    assert!(
        r["total_queue"]["acknowledged"].as_u64().unwrap() > 500,
        "{results}"
    );
    assert!(
        r["replica_audit"]["entries_compared"].as_u64().unwrap() > 500,
        "{results}"
    );
    assert_eq!(r["faults"].as_array().unwrap().len(), 5, "{results}");
    // A node that crashed on its own (a panic, a fatal Raft error) fails the run
    // even when its restart went fine.
    assert!(
        r["unexpected_exits"].as_array().unwrap().is_empty(),
        "{results}"
    );
    println!("{stdout}");
}
