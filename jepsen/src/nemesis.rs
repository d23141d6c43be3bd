//! Fault plans, decided from a seed (no I/O: the harness carries them out).
//!
//! A network fault is a "grudge": the set of directed links (from, to) whose packets
//! are dropped. Jepsen's partition shapes: random halves, the leader isolated, a
//! majorities ring (every node sees a majority, no two the same one), and one-way
//! cuts. Process and storage faults name their target node.

use std::collections::BTreeSet;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// Directed links whose packets are dropped: (from node, to node).
pub type Grudge = BTreeSet<(usize, usize)>;

/// A kind of fault the nemesis can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// Nodes split into two random halves.
    PartitionHalves,
    /// The leader cut off from every other node.
    IsolateLeader,
    /// Every node sees a majority, each a different one.
    MajoritiesRing,
    /// One node's outgoing packets dropped (it still hears the others).
    OneWay,
    /// SIGKILL the leader, restart it when the fault ends.
    KillLeader,
    /// SIGKILL a random node, restart it when the fault ends.
    KillRandom,
    /// SIGSTOP the leader for longer than the election timeout, then SIGCONT.
    PauseLeader,
    /// A node loses what it had not fsynced (power loss), then restarts.
    PowerLoss,
    /// A node's CommitLog tail is truncated or corrupted while it is down.
    CorruptTail,
    /// SIGKILL the leader and one follower (no quorum), restart both at the heal.
    KillMajority,
    /// SIGTERM the leader under load (graceful stop), restart it at the heal.
    #[serde(rename = "sigterm-leader")]
    TerminateLeader,
    /// Every node loses what it had not fsynced at once, then restarts (SYNC_FLUSH
    /// only: under ASYNC_FLUSH the group then waits for an operator, by design).
    PowerLossAll,
    /// One node loses power and restarts at once while another is isolated.
    PowerLossPartitioned,
    /// SIGKILL the leader, damage its tail and restart it at once, before the
    /// group has elected a new leader.
    QuickRestart,
    /// One node's wall clock runs seconds ahead of or behind the others' (past the
    /// forwarded-write deadline, and for some seeds past the FIFO invisible time).
    ClockSkew,
    /// One node's wall clock jumps forward and backward by up to minutes, every
    /// second or two.
    ClockJump,
    /// One node's disk fills up (a ballast file on its own file system).
    DiskFull,
    /// One node's fsyncs are delayed (tens to hundreds of ms each).
    SlowDisk,
    /// The clients' host cut from the current leader only (both ways); the nodes
    /// still see each other, so clients must be served through the others.
    PartitionClientLeader,
    /// The name server cut from every node (for some seeds from the clients too);
    /// after the heal its route must name the actual leader again.
    PartitionNamesrv,
    /// A follower killed while retention is forced on the leader (old segments
    /// purged, only what every consumer group consumed); it must catch up by
    /// snapshot when it restarts at the heal.
    Retention,
    /// A byte range in the middle of a stopped node's CommitLog damaged (before
    /// its checkpoint), then restarted at the heal.
    CorruptMidLog,
    /// A byte range of a stopped node's Raft index damaged.
    CorruptIndex,
    /// A byte range of one of a stopped node's ConsumeQueue files damaged.
    CorruptConsumeQueue,
    /// Bytes of a stopped node's checkpoint file damaged.
    CorruptCheckpoint,
    /// A byte range of a stopped node's metadata store (sled) damaged.
    CorruptMetadata,
    /// A follower cut off for a while, then [`FaultKind::QuickRestart`] while the
    /// other follower is cut off: the quorum is the restarted leader, which lost
    /// its damaged tail, and the follower that never had it (the group must wait
    /// for the third node instead of electing the leader that lost entries).
    QuickRestartLagging,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 27] = [
        FaultKind::PartitionHalves,
        FaultKind::IsolateLeader,
        FaultKind::MajoritiesRing,
        FaultKind::OneWay,
        FaultKind::KillLeader,
        FaultKind::KillRandom,
        FaultKind::PauseLeader,
        FaultKind::PowerLoss,
        FaultKind::CorruptTail,
        FaultKind::KillMajority,
        FaultKind::TerminateLeader,
        FaultKind::PowerLossAll,
        FaultKind::PowerLossPartitioned,
        FaultKind::QuickRestart,
        FaultKind::ClockSkew,
        FaultKind::ClockJump,
        FaultKind::DiskFull,
        FaultKind::SlowDisk,
        FaultKind::PartitionClientLeader,
        FaultKind::PartitionNamesrv,
        FaultKind::Retention,
        FaultKind::CorruptMidLog,
        FaultKind::CorruptIndex,
        FaultKind::CorruptConsumeQueue,
        FaultKind::CorruptCheckpoint,
        FaultKind::CorruptMetadata,
        FaultKind::QuickRestartLagging,
    ];

    /// Parses a `--nemesis` list of names; `all`, `partition`, `kill`, `pause`,
    /// `power-loss`, `corrupt` (the tail and every stored file), `compound`,
    /// `clock`, `disk` and `routing` (partitions of the clients and the name
    /// server) select groups.
    pub fn parse_list(list: &str) -> Result<Vec<FaultKind>, String> {
        let mut out = Vec::new();
        for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let kinds: &[FaultKind] = match name {
                "all" => &FaultKind::ALL,
                "partition" => &[
                    FaultKind::PartitionHalves,
                    FaultKind::IsolateLeader,
                    FaultKind::MajoritiesRing,
                    FaultKind::OneWay,
                ],
                "kill" => &[FaultKind::KillLeader, FaultKind::KillRandom],
                "pause" => &[FaultKind::PauseLeader],
                "power-loss" => &[FaultKind::PowerLoss],
                "corrupt" => &[
                    FaultKind::CorruptTail,
                    FaultKind::CorruptMidLog,
                    FaultKind::CorruptIndex,
                    FaultKind::CorruptConsumeQueue,
                    FaultKind::CorruptCheckpoint,
                    FaultKind::CorruptMetadata,
                ],
                "routing" => &[
                    FaultKind::PartitionClientLeader,
                    FaultKind::PartitionNamesrv,
                ],
                "compound" => &[FaultKind::PowerLossPartitioned, FaultKind::QuickRestart],
                "quick-restart-lagging" => &[FaultKind::QuickRestartLagging],
                "clock" => &[FaultKind::ClockSkew, FaultKind::ClockJump],
                "disk" => &[FaultKind::DiskFull, FaultKind::SlowDisk],
                other => match FaultKind::ALL.iter().find(|k| k.name() == other) {
                    Some(k) => std::slice::from_ref(k),
                    None => return Err(format!("unknown nemesis {other:?}")),
                },
            };
            for k in kinds {
                if !out.contains(k) {
                    out.push(*k);
                }
            }
        }
        if out.is_empty() {
            return Err("no nemesis given".into());
        }
        Ok(out)
    }

    /// The kebab-case name.
    pub fn name(&self) -> &'static str {
        match self {
            FaultKind::PartitionHalves => "partition-halves",
            FaultKind::IsolateLeader => "isolate-leader",
            FaultKind::MajoritiesRing => "majorities-ring",
            FaultKind::OneWay => "one-way",
            FaultKind::KillLeader => "kill-leader",
            FaultKind::KillRandom => "kill-random",
            FaultKind::PauseLeader => "pause-leader",
            FaultKind::PowerLoss => "power-loss",
            FaultKind::CorruptTail => "corrupt-tail",
            FaultKind::KillMajority => "kill-majority",
            FaultKind::TerminateLeader => "sigterm-leader",
            FaultKind::PowerLossAll => "power-loss-all",
            FaultKind::PowerLossPartitioned => "power-loss-partitioned",
            FaultKind::QuickRestart => "quick-restart",
            FaultKind::ClockSkew => "clock-skew",
            FaultKind::ClockJump => "clock-jump",
            FaultKind::DiskFull => "disk-full",
            FaultKind::SlowDisk => "slow-disk",
            FaultKind::PartitionClientLeader => "partition-client-leader",
            FaultKind::PartitionNamesrv => "partition-namesrv",
            FaultKind::Retention => "retention",
            FaultKind::CorruptMidLog => "corrupt-mid-log",
            FaultKind::CorruptIndex => "corrupt-index",
            FaultKind::CorruptConsumeQueue => "corrupt-consume-queue",
            FaultKind::CorruptCheckpoint => "corrupt-checkpoint",
            FaultKind::CorruptMetadata => "corrupt-metadata",
            FaultKind::QuickRestartLagging => "quick-restart-lagging",
        }
    }
}

/// Drops every link between the two sides, both ways.
pub fn split(side_a: &[usize], side_b: &[usize]) -> Grudge {
    let mut g = Grudge::new();
    for &a in side_a {
        for &b in side_b {
            g.insert((a, b));
            g.insert((b, a));
        }
    }
    g
}

/// Random halves of `n` nodes (the smaller half first).
pub fn halves(n: usize, rng: &mut impl Rng) -> Grudge {
    let mut nodes: Vec<usize> = (0..n).collect();
    nodes.shuffle(rng);
    let (a, b) = nodes.split_at(n / 2);
    split(a, b)
}

/// The node that `g` leaves alone on its side (no link to any other node either
/// way), if exactly one is.
pub fn lone_node(n: usize, g: &Grudge) -> Option<usize> {
    let mut alone =
        (0..n).filter(|&a| (0..n).all(|b| a == b || (g.contains(&(a, b)) && g.contains(&(b, a)))));
    let first = alone.next()?;
    alone.next().is_none().then_some(first)
}

/// `node` cut off from the other `n - 1`.
pub fn isolate(n: usize, node: usize) -> Grudge {
    let rest: Vec<usize> = (0..n).filter(|&i| i != node).collect();
    split(&[node], &rest)
}

/// Majorities ring over `n` nodes in a random order: each node keeps its links to
/// the nearest `(n / 2) / 2` neighbours on each side (at least one) and drops the
/// rest, so it sees a majority and, for n >= 5, a different one from every other
/// node. For n = 3 every pair is adjacent: one link is cut both ways instead (two
/// nodes see different majorities, the third sees all).
pub fn majorities_ring(n: usize, rng: &mut impl Rng) -> Grudge {
    let mut ring: Vec<usize> = (0..n).collect();
    ring.shuffle(rng);
    let keep = ((n / 2) / 2).max(1);
    let mut g = Grudge::new();
    for (i, &a) in ring.iter().enumerate() {
        for (j, &b) in ring.iter().enumerate() {
            let d = i.abs_diff(j);
            if d.min(n - d) > keep {
                g.insert((a, b));
            }
        }
    }
    if g.is_empty() && n >= 3 {
        g.insert((ring[0], ring[1]));
        g.insert((ring[1], ring[0]));
    }
    g
}

/// `node`'s outgoing packets dropped.
pub fn one_way(n: usize, node: usize) -> Grudge {
    (0..n).filter(|&i| i != node).map(|i| (node, i)).collect()
}

/// One planned fault: start, length, kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedFault {
    /// When to start it, ms after the run started.
    pub start_ms: u64,
    /// How long it lasts, ms.
    pub duration_ms: u64,
    /// What it is.
    pub kind: FaultKind,
    /// A random number the harness uses to pick targets (nodes, halves).
    pub pick: u64,
}

/// The faults of a run: from `warmup_ms` until `time_limit_ms` minus a quiet tail,
/// one fault at a time, each `fault_ms` long with `gap_ms` of calm after it, kinds
/// drawn from `kinds` by `seed`. The same seed gives the same plan.
pub fn plan(
    seed: u64,
    kinds: &[FaultKind],
    time_limit_ms: u64,
    warmup_ms: u64,
    fault_ms: u64,
    gap_ms: u64,
) -> Vec<PlannedFault> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut t = warmup_ms;
    // Leave a calm tail for the final drain.
    let end = time_limit_ms.saturating_sub(gap_ms);
    // Draw kinds from a shuffled bag, refilled when empty, so every kind comes up.
    let mut bag: Vec<FaultKind> = Vec::new();
    while t + fault_ms <= end && !kinds.is_empty() {
        if bag.is_empty() {
            bag = kinds.to_vec();
            bag.shuffle(&mut rng);
        }
        let kind = bag.pop().expect("refilled above");
        out.push(PlannedFault {
            start_ms: t,
            duration_ms: fault_ms,
            kind,
            pick: rng.gen(),
        });
        t += fault_ms + gap_ms;
    }
    out
}

/// When planned fault `planned_ms` may start, given when the fault before it was
/// healed (`prev_end_ms`, on the run's clock). A fault that ran past the next
/// one's planned start (the retention fault waits up to 40 s for the consumers,
/// against 8 s planned) is followed by a whole calm `gap_ms`: otherwise every later
/// fault ran back to back while a node restarted at the heal was still catching
/// up, two faults at once (a 1800 s run measured 0-7 % availability under such
/// kills of the leader). A smaller overrun leaves at least half the calm, and only
/// what passes that half delays the fault, so small overruns (finding the leader,
/// a kill and restart) do not add up. No I/O.
pub fn fault_start_ms(planned_ms: u64, prev_end_ms: Option<u64>, gap_ms: u64) -> u64 {
    match prev_end_ms {
        Some(end) if end >= planned_ms => end.saturating_add(gap_ms),
        Some(end) => planned_ms.max(end.saturating_add(gap_ms / 2)),
        None => planned_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reach(g: &Grudge, n: usize, a: usize) -> BTreeSet<usize> {
        (0..n).filter(|&b| a == b || !g.contains(&(a, b))).collect()
    }

    #[test]
    fn partitions_have_their_shapes() {
        let mut rng = StdRng::seed_from_u64(7);
        for n in [3, 5] {
            let g = halves(n, &mut rng);
            let sizes: BTreeSet<usize> = (0..n).map(|a| reach(&g, n, a).len()).collect();
            assert_eq!(sizes, [n / 2, n - n / 2].into_iter().collect());
            let g = isolate(n, 1);
            assert_eq!(reach(&g, n, 1).len(), 1);
            assert_eq!(reach(&g, n, 0).len(), n - 1);
            let g = majorities_ring(n, &mut rng);
            let views: BTreeSet<BTreeSet<usize>> = (0..n).map(|a| reach(&g, n, a)).collect();
            for a in 0..n {
                assert!(reach(&g, n, a).len() > n / 2, "node {a} sees a majority");
            }
            assert!(
                views.len() > 1,
                "not everyone sees the same majority: {views:?}"
            );
            let g = one_way(n, 2);
            assert!(g.contains(&(2, 0)) && !g.contains(&(0, 2)));
            assert_eq!(lone_node(n, &g), None, "one way leaves links in");
            assert_eq!(lone_node(n, &isolate(n, 1)), Some(1));
            assert_eq!(lone_node(n, &Grudge::new()), None);
        }
        let g = halves(3, &mut rng);
        let alone = lone_node(3, &g).expect("halves of 3 leave one node alone");
        assert_eq!(reach(&g, 3, alone).len(), 1);
        assert_eq!(lone_node(5, &halves(5, &mut rng)), None);
    }

    #[test]
    fn plans_are_reproducible_and_fit_the_run() {
        let kinds = FaultKind::parse_list("partition,kill,pause").unwrap();
        assert_eq!(kinds.len(), 7);
        let a = plan(42, &kinds, 60_000, 5_000, 8_000, 6_000);
        assert_eq!(a, plan(42, &kinds, 60_000, 5_000, 8_000, 6_000));
        assert_ne!(a, plan(43, &kinds, 60_000, 5_000, 8_000, 6_000));
        // Faults at 5, 19 and 33 s; one at 47 s would end inside the calm tail.
        assert_eq!(a.len(), 3);
        let long = plan(42, &kinds, 600_000, 5_000, 8_000, 6_000);
        let seen: BTreeSet<&str> = long.iter().map(|f| f.kind.name()).collect();
        assert_eq!(seen.len(), kinds.len(), "every kind comes up in a long run");
        for w in a.windows(2) {
            assert!(w[0].start_ms + w[0].duration_ms <= w[1].start_ms);
        }
        let last = a.last().unwrap();
        assert!(last.start_ms + last.duration_ms + 6_000 <= 60_000);
        for k in FaultKind::ALL {
            assert_eq!(FaultKind::parse_list(k.name()).unwrap(), vec![k]);
        }
        assert_eq!(
            FaultKind::parse_list("all").unwrap().len(),
            FaultKind::ALL.len()
        );
        assert_eq!(
            FaultKind::parse_list("compound").unwrap(),
            vec![FaultKind::PowerLossPartitioned, FaultKind::QuickRestart]
        );
        assert_eq!(
            FaultKind::parse_list("clock,disk").unwrap(),
            vec![
                FaultKind::ClockSkew,
                FaultKind::ClockJump,
                FaultKind::DiskFull,
                FaultKind::SlowDisk
            ]
        );
        assert_eq!(FaultKind::parse_list("corrupt").unwrap().len(), 6);
        assert_eq!(
            FaultKind::parse_list("routing,retention").unwrap(),
            vec![
                FaultKind::PartitionClientLeader,
                FaultKind::PartitionNamesrv,
                FaultKind::Retention
            ]
        );
        assert!(FaultKind::parse_list("gremlins").is_err());
        assert!(FaultKind::parse_list("").is_err());
    }

    #[test]
    fn a_fault_after_one_that_overran_its_plan_waits_a_whole_calm() {
        // No fault before, or at least half the calm left: as planned.
        assert_eq!(fault_start_ms(5_000, None, 6_000), 5_000);
        assert_eq!(fault_start_ms(19_000, Some(13_000), 6_000), 19_000);
        assert_eq!(fault_start_ms(19_000, Some(16_000), 6_000), 19_000);
        // Less than half the calm left: half the calm after the heal, so only the
        // overrun past that half delays it.
        assert_eq!(fault_start_ms(19_000, Some(16_100), 6_000), 19_100);
        assert_eq!(fault_start_ms(19_000, Some(18_900), 6_000), 21_900);
        // Healed at or after its planned start: a whole calm after the heal.
        assert_eq!(fault_start_ms(19_000, Some(19_000), 6_000), 25_000);
        assert_eq!(fault_start_ms(19_000, Some(53_000), 6_000), 59_000);
    }
}
