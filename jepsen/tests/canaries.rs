//! The harness catches a broken broker: with a test-only canary on
//! (`LEDGERMQ_CANARY`, read by debug builds only), a short run must be reported
//! invalid by the checker that watches the broken promise. Needs root, iproute2,
//! nftables and the workspace's debug binaries (`cargo build --bins`).

use std::process::Command;

use ledgermq_jepsen::procs::bin;

/// Runs `jepsen run` with `canary` on; returns (exit code, stdout, stderr).
fn run_with(canary: &str, nemesis: &str, seed: &str) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin("jepsen").unwrap())
        .current_dir(dir.path())
        .env("LEDGERMQ_CANARY", canary)
        .args([
            "run",
            "--time-limit",
            "30",
            "--nemesis",
            nemesis,
            "--seed",
            seed,
            "--fault-ms",
            "6000",
            "--gap-ms",
            "6000",
        ])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn acking_before_commit_is_caught_as_lost_messages() {
    let Some((verdict, stdout)) = invalid_run("ack-before-commit", "isolate-leader", "5") else {
        return;
    };
    assert!(
        verdict.starts_with("INVALID:")
            && verdict.contains(" lost,")
            && !verdict.contains(" 0 lost,"),
        "total-queue must report lost messages: {verdict}\n{stdout}"
    );
}

/// Runs the harness with `canary` on (see [`run_with`]) and asserts it exited 1
/// (invalid); returns its verdict line and stdout. None (after a SKIPPED line) in
/// a release build, which has no canaries.
fn invalid_run(canary: &str, nemesis: &str, seed: &str) -> Option<(String, String)> {
    if !cfg!(debug_assertions) {
        eprintln!("SKIPPED: canaries exist in debug builds only");
        return None;
    }
    let (code, stdout, stderr) = run_with(canary, nemesis, seed);
    assert_eq!(
        code,
        Some(1),
        "the run must be invalid:\n{stdout}\n{stderr}"
    );
    let verdict = stdout.lines().last().unwrap_or_default().to_owned();
    Some((verdict, stdout))
}

/// The number before `what` in a verdict (`"INVALID: 24 lost, ..."`).
fn count_before(verdict: &str, what: &str) -> Option<u64> {
    let head = &verdict[..verdict.find(what)?];
    head.rsplit(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
}

#[test]
fn skipping_the_fsync_is_caught_after_every_node_loses_power() {
    // SYNC_FLUSH (the default): every acknowledged send was promised fsynced on a
    // majority; with the fsyncs skipped, all three nodes lose it at once. The
    // checkpoint (really fsynced) then points past the surviving CommitLog, so the
    // nodes refuse to start, and the acknowledged messages not yet consumed are
    // lost. Which of the two checkers fires first depends on how far the consumers
    // had got (a full test run saw 0 lost with 6 exits); either fails the run.
    let Some((verdict, stdout)) = invalid_run("skip-fsync", "power-loss-all", "3") else {
        return;
    };
    let lost = count_before(&verdict, " lost,");
    let exited = count_before(&verdict, " node(s) exited by themselves");
    assert!(
        verdict.starts_with("INVALID:") && (lost > Some(0) || exited > Some(0)),
        "total-queue must report lost messages or nodes must fail to restart: {verdict}\n{stdout}"
    );
}

#[test]
fn voting_after_losing_acknowledged_entries_is_caught_as_lost_messages() {
    // quick-restart-lagging: a follower misses 2 s of committed entries, then the
    // leader comes back at once without its damaged tail while the other follower
    // is cut off. With the canary the two elect a leader without the entries the
    // leader lost (seeds 1-4 lost 7, 2, 6 and 3 acknowledged messages); without
    // it no leader is elected until the heal.
    let Some((verdict, stdout)) = invalid_run("lost-entries-vote", "quick-restart-lagging", "3")
    else {
        return;
    };
    assert!(
        verdict.starts_with("INVALID:") && count_before(&verdict, " lost,") > Some(0),
        "total-queue must report lost messages: {verdict}\n{stdout}"
    );
}

#[test]
fn dispatching_before_apply_is_caught_as_two_messages_at_one_queue_offset() {
    // The isolated leader's consumers are handed messages it appended but never
    // commits; after the heal its tail is cut and the new leader's messages take
    // those queue offsets (seeds 1-3 and 5: 5, 3, 3 and 2 inconsistent offsets).
    // Whether a consumer asks the isolated leader in time is up to timing: seed 1
    // once showed no inconsistent offset (a valid run), so a second seed is tried
    // before the canary is called missed.
    if !cfg!(debug_assertions) {
        eprintln!("SKIPPED: canaries exist in debug builds only");
        return;
    }
    let mut outputs = Vec::new();
    for seed in ["1", "2"] {
        let (code, stdout, stderr) = run_with("dispatch-before-apply", "isolate-leader", seed);
        let verdict = stdout.lines().last().unwrap_or_default().to_owned();
        let order = stdout
            .lines()
            .find(|l| l.starts_with("order: inconsistent offsets "))
            .unwrap_or_default()
            .to_owned();
        if code == Some(1)
            && verdict.starts_with("INVALID:")
            && verdict.contains("order violated")
            && count_before(&order, " offset gaps") > Some(0)
        {
            return;
        }
        outputs.push(format!("seed {seed}: exit {code:?}\n{stdout}\n{stderr}"));
    }
    panic!(
        "the order checker must report two messages at one queue offset (not with seeds 1 and 2):\n{}",
        outputs.join("\n")
    );
}
