//! A CommitLog entry damaged before the checkpoint (bit rot, a torn or misdirected
//! write in data recovery no longer scans) is fetched again from a peer holding the
//! same entry and written back in place, instead of stopping the node at every
//! start (jepsen `corrupt-mid-log`: "when Read LogIndex(223): CRC mismatch") or
//! failing every read of it for good.

mod common;

use std::time::{Duration, Instant};

use common::{message, Cluster};
use ledgermq_raft::NodeId;
use ledgermq_store::{EntryLocation, FlushMode, StoreConfig};

const T: Duration = Duration::from_secs(20);

/// Writes `bytes` over the CommitLog of the stopped node whose store is `cfg`, from
/// physical `offset` (within one segment), and fsyncs them.
fn damage_commit_log(cfg: &StoreConfig, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let seg = cfg.commit_log.segment_bytes;
    let start = offset - offset % seg;
    let path = cfg.root.join("commitlog").join(format!("{start:020}"));
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset - start).unwrap();
    f.sync_all().unwrap();
}

/// True if entry `idx` of `node` reads back with every record's CRC intact.
fn entry_intact(c: &Cluster, node: NodeId, idx: u64) -> bool {
    c.node(node)
        .store()
        .read_entry(idx)
        .is_ok_and(|e| e.records().all(|r| r.is_ok()))
}

/// Stops `victim` cleanly (its checkpoint then covers its whole log, so recovery
/// scans none of it), damages 16 bytes in the middle of each entry of `damaged`,
/// and starts it again.
async fn damage_and_restart(c: &mut Cluster, victim: NodeId, damaged: &[EntryLocation]) {
    c.node(victim).stop(true).await.unwrap();
    c.nodes.insert(victim, None);
    for loc in damaged {
        let at = loc.physical_offset + u64::from(loc.size_bytes) / 2;
        damage_commit_log(&c.cfgs[&victim].store, at, &[0xA5; 16]);
    }
    c.restart(victim).await;
}

/// Waits until every entry of `damaged` on `node` reads back intact.
async fn wait_repaired(c: &Cluster, node: NodeId, damaged: &[EntryLocation]) {
    let deadline = Instant::now() + T;
    while !damaged.iter().all(|l| entry_intact(c, node, l.log_index)) {
        assert!(
            Instant::now() < deadline,
            "node {node}: damaged entries {:?} were not repaired within {T:?}",
            damaged
                .iter()
                .filter(|l| !entry_intact(c, node, l.log_index))
                .map(|l| l.log_index)
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_entry_before_the_checkpoint_is_fetched_again_from_a_peer() {
    let mut c = Cluster::start(3, FlushMode::Sync).await;
    let leader = c.wait_leader(T).await;
    let mut bodies = Vec::new();
    for i in 0..120 {
        let body = format!("m-{i:03}-{}", "x".repeat(600));
        c.node(leader)
            .write_messages(vec![message("TopicR", 0, &body)])
            .await
            .unwrap();
        bodies.push(body);
    }
    c.wait_converged(T).await;
    let follower = (leader + 1) % 3;
    let log = c.node(follower).store().commit_log();
    let (first, next) = (log.first_log_index(), log.next_log_index());
    // Entries of messages early, in the middle and late in the log, in more than
    // one segment (64 KiB segments, ~700-byte entries).
    let damaged: Vec<EntryLocation> = [first + 10, (first + next) / 2, next - 10]
        .iter()
        .map(|&i| log.entry_location(i).unwrap())
        .collect();
    damage_and_restart(&mut c, follower, &damaged).await;
    wait_repaired(&c, follower, &damaged).await;
    assert_eq!(c.queue_bodies(follower, "TopicR", 0), bodies);

    // The repaired node serves as leader: every message is still there, in order,
    // and the replicas agree entry by entry.
    c.node(leader).stop(true).await.unwrap();
    c.nodes.insert(leader, None);
    let new_leader = c.wait_leader(T).await;
    c.node(new_leader)
        .write_messages(vec![message("TopicR", 0, "after")])
        .await
        .unwrap();
    bodies.push("after".into());
    c.restart(leader).await;
    c.wait_converged(T).await;
    for n in 0..3 {
        assert_eq!(c.queue_bodies(n, "TopicR", 0), bodies, "node {n}");
    }
    c.audit();
}

/// The leader's own copy is the damaged one, damaged while it runs (its scrub at
/// start is long done): openraft reads it to catch up a follower that was down,
/// and the log store repairs it from the other follower before handing it over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_reading_a_damaged_entry_to_catch_a_follower_up_repairs_it_first() {
    let mut c = Cluster::start(3, FlushMode::Sync).await;
    let leader = c.wait_leader(T).await;
    let lagging = (leader + 2) % 3;
    c.crash(lagging).await;
    for i in 0..60 {
        c.node(leader)
            .write_messages(vec![message("TopicL", 0, &format!("l-{i}"))])
            .await
            .unwrap();
    }
    c.wait_converged(T).await;
    let log = c.node(leader).store().commit_log();
    let loc = log.entry_location(log.next_log_index() - 20).unwrap();
    damage_commit_log(
        &c.cfgs[&leader].store,
        loc.physical_offset + u64::from(loc.size_bytes) / 2,
        &[0xA5; 16],
    );
    assert!(!entry_intact(&c, leader, loc.log_index));
    c.restart(lagging).await;
    c.wait_converged(T).await;
    assert_eq!(c.wait_leader(T).await, leader, "the leader kept running");
    wait_repaired(&c, leader, &[loc]).await;
    let want: Vec<String> = (0..60).map(|i| format!("l-{i}")).collect();
    for n in 0..3 {
        assert_eq!(c.queue_bodies(n, "TopicL", 0), want, "node {n}");
    }
    c.audit();
}

/// openraft reads entries at start (`LogIdList::load_log_ids`: the first entry,
/// then the middle one, whose terms differ). Two nodes whose damaged entries are
/// each what the other reads start together while the third is down: each
/// answers the other's `ReadEntry` before its own Raft is up, so both start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_starting_together_repair_each_other() {
    let mut c = Cluster::start(3, FlushMode::Sync).await;
    let leader = c.wait_leader(T).await;
    for i in 0..40 {
        c.node(leader)
            .write_messages(vec![message("TopicS", 0, &format!("s-{i}"))])
            .await
            .unwrap();
    }
    c.wait_converged(T).await;
    let (a, b, down) = (leader, (leader + 1) % 3, (leader + 2) % 3);
    let log_a = c.node(a).store().commit_log();
    let (first, last) = (log_a.first_log_index(), log_a.next_log_index() - 1);
    assert_eq!(first, 0, "nothing purged: openraft reads entry 0 at start");
    let mid = (first + last) / 2;
    let damaged_a = log_a.entry_location(first).unwrap();
    let damaged_b = c.node(b).store().commit_log().entry_location(mid).unwrap();
    for n in [a, b, down] {
        c.node(n).stop(true).await.unwrap();
        c.nodes.insert(n, None);
    }
    for (n, loc) in [(a, damaged_a), (b, damaged_b)] {
        let at = loc.physical_offset + u64::from(loc.size_bytes) / 2;
        damage_commit_log(&c.cfgs[&n].store, at, &[0xA5; 8]);
    }
    c.start_together(&[a, b]).await;
    wait_repaired(&c, a, &[damaged_a]).await;
    wait_repaired(&c, b, &[damaged_b]).await;
    c.wait_leader(T).await;
    c.restart(down).await;
    c.wait_converged(T).await;
    let want: Vec<String> = (0..40).map(|i| format!("s-{i}")).collect();
    for n in 0..3 {
        assert_eq!(c.queue_bodies(n, "TopicS", 0), want, "node {n}");
    }
    c.audit();
}
