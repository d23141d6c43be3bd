//! The CI runs of the `jepsen` binary: two short runs with fixed seeds, one under
//! SYNC_FLUSH and one under ASYNC_FLUSH (about 2 minutes each), of 8 faults each
//! drawn from 9 kinds: together they name every fault kind, and draw all but the
//! two in [`LEFT_OUT`]. Each must exit 0 (no safety violation) and
//! leave a complete run folder. Needs root, iproute2, nftables and the workspace
//! binaries (`cargo build --bins`).

use std::process::Command;

use ledgermq_jepsen::procs::bin;

/// Every kind, split between the two flush modes (ASYNC_FLUSH loses the unflushed
/// tail of a node that loses power by design, so the power losses run under
/// SYNC_FLUSH; a slow fsync delays acknowledgements only under SYNC_FLUSH).
const SYNC_KINDS: &str = "partition-halves,isolate-leader,kill-leader,pause-leader,power-loss,power-loss-all,power-loss-partitioned,slow-disk,clock-skew,partition-client-leader,retention,corrupt-mid-log,corrupt-checkpoint";
const ASYNC_KINDS: &str =
    "majorities-ring,one-way,kill-random,corrupt-tail,kill-majority,sigterm-leader,quick-restart,disk-full,clock-jump,partition-namesrv,corrupt-index,corrupt-consume-queue,corrupt-metadata";
/// The runs' seeds (sync, async).
const SEEDS: (u64, u64) = (2, 21);
/// Each fault's length and the calm after it, ms: 8 faults fit in 90 s.
const FAULT_MS: u64 = 5_500;
const GAP_MS: u64 = 5_000;
/// Faults per run.
const FAULTS: usize = 8;
/// The kind each run's seed does not draw (9 kinds, 8 faults): each is covered in
/// part by others (power-loss by power-loss-all and power-loss-partitioned,
/// kill-random by kill-majority, quick-restart and kill-leader).
const LEFT_OUT: (&str, &str) = ("power-loss", "kill-random");

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
fn each_short_run_draws_every_kind_of_its_list_but_one() {
    use ledgermq_jepsen::nemesis::{plan, FaultKind};
    for (list, seed, left_out) in [
        (SYNC_KINDS, SEEDS.0, LEFT_OUT.0),
        (ASYNC_KINDS, SEEDS.1, LEFT_OUT.1),
    ] {
        let kinds = FaultKind::parse_list(list).unwrap();
        let p = plan(seed, &kinds, 90_000, 5_000, FAULT_MS, GAP_MS);
        assert_eq!(p.len(), FAULTS, "{list}");
        let undrawn: Vec<&str> = kinds
            .iter()
            .filter(|k| !p.iter().any(|f| f.kind == **k))
            .map(|k| k.name())
            .collect();
        assert_eq!(undrawn, vec![left_out], "seed {seed} of {list}");
    }
}

#[test]
fn a_short_sync_run_under_faults_finds_no_violation() {
    short_run("sync", SYNC_KINDS, SEEDS.0);
}

#[test]
fn a_short_async_run_under_faults_finds_no_violation() {
    short_run("async", ASYNC_KINDS, SEEDS.1);
}

/// One run of [`FAULTS`] faults of [`FAULT_MS`] with [`GAP_MS`] of calm after each.
fn short_run(flush: &str, kinds: &str, seed: u64) {
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
            &seed.to_string(),
            "--flush",
            flush,
            "--fault-ms",
            &FAULT_MS.to_string(),
            "--gap-ms",
            &GAP_MS.to_string(),
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
    assert_eq!(r["faults"].as_array().unwrap().len(), FAULTS, "{results}");
    // A node that crashed on its own (a panic, a fatal Raft error) fails the run
    // even when its restart went fine.
    assert!(
        r["unexpected_exits"].as_array().unwrap().is_empty(),
        "{results}"
    );
    println!("{stdout}");
}
