//! The harness catches a broken broker: with a test-only canary on
//! (`LEDGERMQ_CANARY`, read by debug builds only), a short run must be reported
//! invalid by the checker that watches the broken promise. Needs root, iproute2,
//! nftables and the workspace's debug binaries (`cargo build --bins`).

use std::process::Command;

use ledgermq_jepsen::procs::bin;

/// Runs `jepsen run` with `canary` on (30 s, 6 s faults and calms); returns (exit
/// code, stdout, stderr).
fn run_with(canary: &str, nemesis: &str, seed: &str) -> (Option<i32>, String, String) {
    run_planned(canary, nemesis, seed, "30", "6000")
}

/// [`run_with`], with `time_limit_s` of sending and faults and calms of
/// `fault_and_gap_ms` each.
fn run_planned(
    canary: &str,
    nemesis: &str,
    seed: &str,
    time_limit_s: &str,
    fault_and_gap_ms: &str,
) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin("jepsen").unwrap())
        .current_dir(dir.path())
        .env("LEDGERMQ_CANARY", canary)
        .args([
            "run",
            "--time-limit",
            time_limit_s,
            "--nemesis",
            nemesis,
            "--seed",
            seed,
            "--fault-ms",
            fault_and_gap_ms,
            "--gap-ms",
            fault_and_gap_ms,
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

/// The number after `what` in a line (`"... group order violations 1"`).
fn count_after(line: &str, what: &str) -> Option<u64> {
    let tail = &line[line.find(what)? + what.len()..];
    tail.split(|c: char| !c.is_ascii_digit())
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
    // it no leader is elected until the heal. The follower that holds the lost
    // entries is then told to cut committed entries, and openraft's assertion
    // stops it (exit 70). A CI run at 84a004e saw only that exit with seed 3
    // (every acknowledged message was received), and the same seed by hand lost
    // 2 with the exit, so seeds 1 to 3 are tried for lost messages.
    caught_with_seed_1_2_or_3(
        |seed| run_with("lost-entries-vote", "quick-restart-lagging", seed),
        |verdict, _| count_before(verdict, " lost,") > Some(0),
        "total-queue must report lost messages",
    );
}

#[test]
fn dispatching_before_apply_is_caught_as_two_messages_at_one_queue_offset() {
    // The isolated leader's consumers are handed messages it appended but never
    // commits; after the heal its tail is cut and the new leader's messages take
    // those queue offsets (seeds 1-3 and 5: 5, 3, 3 and 2 inconsistent offsets).
    // Whether a consumer asks the isolated leader in time is up to timing: seed 1
    // once showed no inconsistent offset (a valid run), so further seeds are tried
    // before the canary is called missed.
    caught_with_seed_1_2_or_3(
        |seed| run_with("dispatch-before-apply", "isolate-leader", seed),
        |verdict, stdout| {
            verdict.contains("order violated")
                && count_before(&line_starting(stdout, "order: "), " offset gaps") > Some(0)
        },
        "the order checker must report two messages at one queue offset",
    );
}

#[test]
fn forwarding_fifo_leases_is_caught_as_a_message_group_out_of_order() {
    // sigterm-leader: the leader hands over and stops taking writes, so the FIFO
    // deliveries it is deciding cannot be leased in its term. With the canary
    // their leases are forwarded to the new leader (late, after it has begun to
    // serve) and the deliveries answered while the old node drains its calls; the
    // new leader has meanwhile handed the same message out, had it acked and
    // delivered the group's next one, so the old delivery arrives out of order
    // ("group g5: 108 delivered after 109"; with FIFO batches, the FIFO
    // checker's "delivered while the previous was in flight" or "delivered
    // after an acknowledged ack": the order checker lets a message delivered
    // before come again after later ones). Not every hand-over meets a
    // delivery being decided (30 s runs with two hand-overs: 3 of 5 caught it),
    // so a run has four (50 s, 5 s faults and calms: seeds 1 and 2 showed 3 and 2
    // violations), and seeds 2 then 3 are tried while none found anything (at
    // 4833bfe one full test run met no such hand-over with seeds 1 and 2; seed 3
    // showed 1 violation).
    caught_with_seed_1_2_or_3(
        |seed| run_planned("forward-fifo-leases", "sigterm-leader", seed, "50", "5000"),
        |verdict, stdout| {
            let order = line_starting(stdout, "order: ");
            let fifo = line_starting(stdout, "fifo: ");
            let fifo_finding = [
                " delivered while the previous was in flight",
                " delivered again while in flight",
                " delivered after an acknowledged ack",
            ]
            .iter()
            .any(|what| count_before(&fifo, what) > Some(0));
            (verdict.contains("order violated")
                && count_after(&order, "group order violations ") > Some(0))
                || (verdict.contains("FIFO:") && fifo_finding)
        },
        "the order or FIFO checker must report a FIFO message handed out by a deposed leader",
    );
}

/// Runs `run` with seed 1, then with seeds 2 and 3 while a run was not invalid as
/// `caught` (given the verdict line and stdout) wants; panics with `what` and
/// every output if none was. Skipped (a SKIPPED line) in a release build.
fn caught_with_seed_1_2_or_3(
    run: impl Fn(&str) -> (Option<i32>, String, String),
    caught: impl Fn(&str, &str) -> bool,
    what: &str,
) {
    if !cfg!(debug_assertions) {
        eprintln!("SKIPPED: canaries exist in debug builds only");
        return;
    }
    let mut outputs = Vec::new();
    for seed in ["1", "2", "3"] {
        let (code, stdout, stderr) = run(seed);
        let verdict = stdout.lines().last().unwrap_or_default();
        if code == Some(1) && verdict.starts_with("INVALID:") && caught(verdict, &stdout) {
            return;
        }
        outputs.push(format!("seed {seed}: exit {code:?}\n{stdout}\n{stderr}"));
    }
    panic!(
        "{what} (not with seeds 1, 2 and 3):\n{}",
        outputs.join("\n")
    );
}

/// The first line of `stdout` that starts with `prefix` ("" if none).
fn line_starting(stdout: &str, prefix: &str) -> String {
    stdout
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_default()
        .to_owned()
}
