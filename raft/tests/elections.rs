//! Elections after a leader dies: the two survivors must elect one of themselves
//! even when their election timers fire together.

mod common;

use std::time::{Duration, Instant};

use common::{message, Cluster};
use ledgermq_store::FlushMode;

/// How long the survivors get to elect a leader: several election rounds.
const ELECT_WITHIN: Duration = Duration::from_secs(6);

/// Groups tried: each has a fair chance that its survivors' ticks are in phase
/// (one in five stalled without the fix).
const TRIALS: usize = 10;

/// The leader among the live nodes, once exactly one node leads and the others
/// follow it; None if that does not happen by `deadline`.
async fn leader_by(c: &Cluster, deadline: Instant) -> Option<u64> {
    loop {
        let leaders: Vec<_> = c.live().filter(|n| n.is_leader()).map(|n| n.id()).collect();
        if let [l] = leaders[..] {
            if c.live().all(|n| n.leader().map(|x| x.0) == Some(l)) {
                return Some(l);
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Each live node's current term.
fn terms(c: &Cluster) -> Vec<(u64, u64)> {
    c.live()
        .map(|n| (n.id(), n.raft().metrics().borrow().current_term))
        .collect()
}

/// The leader the live nodes elect after a kill just done, or None if none within
/// [`ELECT_WITHIN`]; either is printed, and a trial with none is recorded in
/// `stuck` with each live node's term.
async fn new_leader(
    c: &Cluster,
    trial: usize,
    stuck: &mut Vec<(usize, Vec<(u64, u64)>)>,
) -> Option<u64> {
    let killed_at = Instant::now();
    let new = leader_by(c, killed_at + ELECT_WITHIN).await;
    match new {
        Some(new) => eprintln!(
            "trial {trial}: node {new} leads {} ms after the kill",
            killed_at.elapsed().as_millis()
        ),
        None => {
            eprintln!("trial {trial}: no leader; (node, term): {:?}", terms(c));
            stuck.push((trial, terms(c)));
        }
    }
    new
}

/// openraft 0.9 draws a node's election timeout once, when the node starts, and
/// elections fire on a tick (1.5 heartbeat intervals) that starts with the node.
/// Two survivors whose draws round to the same number of ticks, on ticks in
/// phase, campaign at the same instant, each vote for themselves and refuse the
/// other, and do it again every round: the group has a quorum and no leader. The
/// nodes here start together, so their ticks are close in phase, and every node
/// draws the same timeout (500 ms); each group must still elect a new leader
/// after its leader is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survivors_whose_election_timers_fire_together_still_elect_a_leader() {
    let mut stuck = Vec::new();
    for trial in 0..TRIALS {
        let mut c = Cluster::start_together_with(3, FlushMode::Sync, |cfg| {
            cfg.timing.election_timeout_min_ms = 500;
            cfg.timing.election_timeout_max_ms = 501;
        })
        .await;
        // Every node initializes the group and campaigns at once: the first
        // election is a tie to break as well.
        let Some(old) = leader_by(&c, Instant::now() + ELECT_WITHIN).await else {
            eprintln!(
                "trial {trial}: no first leader; (node, term): {:?}",
                terms(&c)
            );
            stuck.push((trial, terms(&c)));
            continue;
        };
        c.node(old)
            .write_messages(vec![message("TopicE", 0, "before")])
            .await
            .unwrap();
        c.crash(old).await;
        if let Some(new) = new_leader(&c, trial, &mut stuck).await {
            assert_ne!(new, old);
        }
    }
    assert!(
        stuck.is_empty(),
        "no leader within {ELECT_WITHIN:?} of the start or of the kill: (trial, [(node, term)]): {stuck:?}"
    );
}

/// A follower cut off from the leader (but not from the other follower) falls
/// behind and campaigns in vain, raising its term; then the leader dies. The
/// survivor with the longer log must win soon: the one with the shorter log,
/// refused for it, puts its retries off (as openraft's own timer does) instead of
/// outbidding every campaign of the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_survivor_with_a_shorter_log_lets_the_other_win() {
    let mut slow = Vec::new();
    for trial in 0..TRIALS / 2 {
        let mut c = Cluster::start(3, FlushMode::Sync).await;
        let old = leader_by(&c, Instant::now() + Duration::from_secs(20))
            .await
            .expect("a first leader");
        let (ahead, behind) = {
            let f: Vec<u64> = (0..3).filter(|&i| i != old).collect();
            (f[0], f[1])
        };
        c.filter.block(old, behind);
        c.filter.block(behind, old);
        for i in 0..20 {
            c.node(old)
                .write_messages(vec![message("TopicE", 0, &format!("m{i}"))])
                .await
                .unwrap();
        }
        // Long enough for the follower left behind to campaign a few times.
        tokio::time::sleep(Duration::from_secs(2)).await;
        c.crash(old).await;
        c.filter.heal();
        if let Some(new) = new_leader(&c, trial, &mut slow).await {
            assert_eq!(new, ahead, "only the longer log can win");
        }
    }
    assert!(
        slow.is_empty(),
        "no leader within {ELECT_WITHIN:?} of the kill: (trial, [(node, term)]): {slow:?}"
    );
}

/// A voter that refuses a candidate because its own log is longer, with no leader
/// heard from for an election timeout, campaigns at once: the candidate cannot
/// win, it can. Jepsen `isolate-leader` found the wait: the follower with the
/// shorter log campaigned first and was refused, and the one with the longer log
/// campaigned two election timeouts late (openraft 0.9 adds `smaller_log_timeout`
/// to a node's election timeout while a `seen_greater_log` flag from an earlier
/// campaign of its own is set, and clears it only at its next campaign), then
/// split the vote with the first one's retry: 3 s without a leader. Here the
/// longer-log voter's own election timer is off, standing for that late timer;
/// without the rule no leader is ever elected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_with_a_longer_log_campaigns_when_it_refuses_a_candidate() {
    let mut c = Cluster::start(3, FlushMode::Sync).await;
    let leader = c.wait_leader(Duration::from_secs(20)).await;
    let (short, long) = ((leader + 1) % 3, (leader + 2) % 3);
    c.crash(short).await;
    for i in 0..3 {
        c.node(leader)
            .write_messages(vec![message("TopicE", 0, &format!("m{i}"))])
            .await
            .unwrap();
    }
    c.node(long).raft().runtime_config().elect(false);
    c.filter.isolate(leader, [short, long]);
    c.restart(short).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.node(long).is_leader() {
        assert!(
            Instant::now() < deadline,
            "no leader among {short} (shorter log) and {long} (longer log, timer off): {:?} {:?}",
            c.node(short).leader(),
            c.node(long).leader()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.filter.heal();
    c.wait_leader(Duration::from_secs(20)).await;
}

/// A follower that restarts and does not hear from the live leader for longer
/// than an election timeout does not depose it: a campaign would raise its term,
/// and the leader's next AppendEntries, refused with that term, would end a
/// leadership the rest of the group still follows. (openraft 0.9 waits the
/// leader lease on top of the election timeout while the stored vote is
/// committed to a leader.) Here the leader's messages to the restarted node are
/// lost for 1.3 s, more than the 900 ms election timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_follower_waits_for_the_live_leader_instead_of_deposing_it() {
    // SYNC_FLUSH: the crash loses nothing, so no lost-entries hold keeps the
    // node out of elections anyway.
    let mut c = Cluster::start(3, FlushMode::Sync).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = (leader + 1) % 3;
    let term = c.node(leader).raft().metrics().borrow().current_term;
    c.crash(follower).await;
    c.filter.block(leader, follower);
    c.restart(follower).await;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    c.filter.heal();
    let deadline = Instant::now() + Duration::from_secs(3);
    while c.node(follower).leader().map(|l| l.0) != Some(leader) {
        assert!(
            Instant::now() < deadline,
            "the restarted node never followed {leader}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        c.node(leader).is_leader(),
        "the live leader was deposed: {:?}",
        terms(&c)
    );
    assert_eq!(
        c.node(leader).raft().metrics().borrow().current_term,
        term,
        "terms: {:?}",
        terms(&c)
    );
}
