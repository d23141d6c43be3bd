//! Retention is the group's decision: a member under disk pressure proposes a
//! retention point, every member purges through the committed one, and forced
//! cleaning takes only what every consumer group has consumed.

mod common;

use std::time::{Duration, Instant};

use common::{commit_offset as commit, message, Cluster};
use ledgermq_store::FlushMode;

const T: Duration = Duration::from_secs(20);

/// Each live member's [min, max) queue offsets of (`topic`, 0).
fn queue_starts(c: &Cluster, topic: &str) -> Vec<(u64, u64, u64)> {
    c.live()
        .map(|n| {
            let (lo, hi) = n.store().queue_offsets(topic, 0);
            (n.id(), lo, hi)
        })
        .collect()
}

/// Waits until every live member's queue (`topic`, 0) starts at the same offset,
/// past `above`; returns it.
async fn wait_same_start_above(c: &Cluster, topic: &str, above: u64) -> u64 {
    let deadline = Instant::now() + T;
    loop {
        let starts = queue_starts(c, topic);
        let first = starts[0].1;
        if first > above && starts.iter().all(|s| s.1 == first) {
            return first;
        }
        assert!(
            Instant::now() < deadline,
            "members did not purge alike past queue offset {above}: {starts:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_cleaning_on_one_member_purges_every_member_alike_and_only_what_is_consumed() {
    let c = Cluster::start_with(3, FlushMode::Sync, |cfg| {
        cfg.retention_interval_ms = 300;
        // Only member 0's disk is "full": forced cleaning is due there alone.
        cfg.store.retention.disk_force_clean_ratio = if cfg.node_id == 0 { 0.0 } else { 1.0 };
    })
    .await;
    let leader = c.wait_leader(T).await;
    c.node(leader)
        .write_command(commit("G", "TopicF", 0))
        .await
        .unwrap();
    for i in 0..300 {
        let body = format!("{i:04}-{}", "f".repeat(400));
        c.node(leader)
            .write_messages(vec![message("TopicF", 0, &body)])
            .await
            .unwrap();
    }
    // Nothing consumed: nothing is taken, though member 0 forces cleaning.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (id, lo, hi) in queue_starts(&c, "TopicF") {
        assert_eq!((lo, hi), (0, 300), "node {id} purged unconsumed messages");
    }
    // Consumed up to 150: the segments wholly below it go, on every member.
    c.node(leader)
        .write_command(commit("G", "TopicF", 150))
        .await
        .unwrap();
    let start = wait_same_start_above(&c, "TopicF", 0).await;
    assert!(start <= 150, "purged past the consumed offset: {start}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (id, lo, _) in queue_starts(&c, "TopicF") {
        assert!(lo <= 150, "node {id} purged past the consumed offset: {lo}");
    }
    // Everything consumed: more goes, still alike; writes go on.
    c.node(leader)
        .write_command(commit("G", "TopicF", 300))
        .await
        .unwrap();
    wait_same_start_above(&c, "TopicF", start).await;
    let p = c
        .node(leader)
        .write_messages(vec![message("TopicF", 0, "late")])
        .await
        .unwrap();
    assert_eq!(p[0].queue_offset, 300);
    c.wait_converged(T).await;
    c.audit();
    let points: Vec<_> = c
        .live()
        .map(|n| n.shared_meta().read().unwrap().purge_point)
        .collect();
    assert!(
        points[0].is_some() && points.iter().all(|p| *p == points[0]),
        "every member holds the same retention point: {points:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_purged_its_log_starts_again() {
    let mut c = Cluster::start_with(3, FlushMode::Sync, |cfg| {
        cfg.retention_interval_ms = 300;
        cfg.store.retention.disk_force_clean_ratio = 0.0;
    })
    .await;
    let leader = c.wait_leader(T).await;
    for i in 0..300 {
        let body = format!("{i:04}-{}", "r".repeat(400));
        c.node(leader)
            .write_messages(vec![message("TopicS", 0, &body)])
            .await
            .unwrap();
    }
    let start = wait_same_start_above(&c, "TopicS", 0).await;
    let follower = (leader + 1) % 3;
    let purged_through = c.node(follower).raft().metrics().borrow().purged;
    assert!(purged_through.is_some());
    c.crash(follower).await;
    c.restart(follower).await;
    assert_eq!(
        c.node(follower).raft().metrics().borrow().purged,
        purged_through,
        "the restarted member knows where its log was purged"
    );
    let p = c
        .node(leader)
        .write_messages(vec![message("TopicS", 0, "after")])
        .await
        .unwrap();
    assert_eq!(p[0].queue_offset, 300);
    c.wait_converged(T).await;
    c.audit();
    // Retention goes on meanwhile (every message counts as consumed): members
    // agree on a start at or past the one before the restart.
    wait_same_start_above(&c, "TopicS", start - 1).await;
    assert_eq!(c.node(follower).store().queue_offsets("TopicS", 0).1, 301);
}
