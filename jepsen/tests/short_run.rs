//! The CI runs of the `jepsen` binary: two short runs with fixed seeds that
//! together inject every fault kind once, one under SYNC_FLUSH and one under
//! ASYNC_FLUSH (about 2 minutes each). Each must exit 0 (no safety violation) and
//! leave a complete run folder. Needs root, iproute2, nftables and the workspace
//! binaries (`cargo build --bins`).

use std::process::Command;

use ledgermq_jepsen::procs::bin;

/// Every kind once, split between the two flush modes (ASYNC_FLUSH loses the
/// unflushed tail of a node that loses power by design, so the power losses run
/// under SYNC_FLUSH).
const SYNC_KINDS: &str = "partition-halves,isolate-leader,kill-leader,pause-leader,power-loss,power-loss-all,power-loss-partitioned";
const ASYNC_KINDS: &str =
    "majorities-ring,one-way,kill-random,corrupt-tail,kill-majority,sigterm-leader,quick-restart";

#[test]
fn every_fault_kind_is_covered_by_the_two_short_runs() {
    let named: Vec<&str> = SYNC_KINDS
        .split(',')
        .chain(ASYNC_KINDS.split(','))
        .collect();
    for k in ledgermq_jepsen::nemesis::FaultKind::ALL {
        assert!(named.contains(&k.name()), "{} is in no short run", k.name());
    }
}

#[test]
fn a_short_sync_run_under_faults_finds_no_violation() {
    short_run("sync", SYNC_KINDS, "11");
}

#[test]
fn a_short_async_run_under_faults_finds_no_violation() {
    short_run("async", ASYNC_KINDS, "12");
}

/// One run of 7 faults of 6 s with 6 s of calm after each.
fn short_run(flush: &str, kinds: &str, seed: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin("jepsen").unwrap())
        .current_dir(dir.path())
        .args([
            "run",
            "--time-limit",
            "90",
            "--nemesis",
            kinds,
            "--seed",
            seed,
            "--flush",
            flush,
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
    assert_eq!(r["faults"].as_array().unwrap().len(), 7, "{results}");
    // A node that crashed on its own (a panic, a fatal Raft error) fails the run
    // even when its restart went fine.
    assert!(
        r["unexpected_exits"].as_array().unwrap().is_empty(),
        "{results}"
    );
    println!("{stdout}");
}
