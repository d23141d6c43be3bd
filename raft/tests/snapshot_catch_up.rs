//! A follower that catches up by snapshot holds every message the leader still
//! holds (issue 13, item 2): a failover to it never makes a retained message
//! disappear. It also holds the metadata only the snapshot carried to it (a
//! consumer group's retry policy and a delivery attempt, snapshot format 2),
//! across its restart.

mod common;

use std::time::{Duration, Instant};

use common::{message, Cluster};
use ledgermq_meta::{DeliveryAttempts, RetryPolicy};
use ledgermq_raft::format::SET_GROUP_RETRY_POLICIES;
use ledgermq_raft::{Command, GroupConfig};
use ledgermq_store::FlushMode;

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_down_across_retention_serves_every_retained_message_after_failover() {
    let mut c = Cluster::start(3, FlushMode::Sync).await;
    let leader = c.wait_leader(T).await;
    let lagging = (leader + 1) % 3;
    c.wait_members_decode(leader, SET_GROUP_RETRY_POLICIES, T)
        .await;
    c.crash(lagging).await;
    // A retry policy the follower will learn from the snapshot alone.
    let policy = RetryPolicy::Exponential {
        initial_ms: 2_000,
        max_ms: 30_000,
        multiplier: 3,
    };
    c.node(leader)
        .write_command(Command::UpdateGroupWithRetryPolicy {
            group: GroupConfig {
                name: "G".into(),
                fifo: false,
                broadcast: false,
                max_delivery_attempts: 4,
            },
            retry_policy: policy.clone(),
        })
        .await
        .unwrap();
    // And a delivery attempt of a message of group G.
    c.node(leader)
        .write_command(Command::DeliveryAttempts(vec![DeliveryAttempts {
            group: "G".into(),
            topic: "TopicR".into(),
            queue_id: 0,
            attempts: vec![(5, 2)],
        }]))
        .await
        .unwrap();
    // About eight 64 KiB segments of messages while the follower is down.
    for i in 0..1000 {
        let body = format!("{i:04}-{}", "r".repeat(400));
        c.node(leader)
            .write_messages(vec![message("TopicR", 0, &body)])
            .await
            .unwrap();
    }
    // A retention run: the oldest part of the log expired.
    let applied = c
        .node(leader)
        .raft()
        .metrics()
        .borrow()
        .last_applied
        .unwrap()
        .index;
    c.node(leader)
        .purge_log_through(applied / 3, T)
        .await
        .unwrap();
    let deadline = Instant::now() + T;
    while c.node(leader).store().commit_log().first_log_index() == 0 {
        assert!(Instant::now() < deadline, "the leader did not purge");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (lo, hi) = c.node(leader).store().queue_offsets("TopicR", 0);
    assert!(lo > 0 && hi == 1000, "retention kept [{lo}, {hi})");
    let retained: Vec<(u64, Vec<u8>)> = (lo..hi)
        .map(|o| {
            let m = c.node(leader).store().get_message("TopicR", 0, o).unwrap();
            (o, m.view().body().to_vec())
        })
        .collect();
    // The follower rejoins (behind the purge point: it catches up by snapshot).
    c.restart(lagging).await;
    c.wait_converged(T).await;
    c.audit();
    let policy_of = |c: &Cluster| {
        let meta = c.node(lagging).shared_meta();
        let meta = meta.read().unwrap();
        let attempt = meta
            .delivery_attempts
            .get(&("G".to_owned(), "TopicR".to_owned(), 0))
            .and_then(|q| q.get(&5).copied());
        (meta.retry_policies.get("G").cloned(), attempt)
    };
    assert_eq!(
        policy_of(&c),
        (Some(policy.clone()), Some(2)),
        "after the snapshot"
    );
    // Stored with the snapshot: kept across a restart (the log after the
    // snapshot does not hold the command).
    c.crash(lagging).await;
    c.restart(lagging).await;
    c.wait_converged(T).await;
    assert_eq!(policy_of(&c), (Some(policy), Some(2)), "after a restart");
    // The leader is killed; the rejoined follower leads.
    c.crash(leader).await;
    let now = c.wait_leader(T).await;
    if now != lagging {
        c.node(now)
            .transfer_leadership(Some(lagging), T)
            .await
            .unwrap();
        assert_eq!(c.wait_leader(T).await, lagging);
    }
    let store = c.node(lagging).store();
    let (new_lo, new_hi) = store.queue_offsets("TopicR", 0);
    let mut missing = Vec::new();
    for (o, body) in &retained {
        match store.get_message("TopicR", 0, *o) {
            Ok(m) => assert_eq!(m.view().body(), &body[..], "offset {o}"),
            Err(_) => missing.push(*o),
        }
    }
    assert!(
        missing.is_empty(),
        "the new leader lacks {} of the {} retained messages (it holds [{new_lo}, {new_hi}), \
         the old leader held [{lo}, {hi})), first missing: {:?}",
        missing.len(),
        retained.len(),
        missing.first()
    );
    // And it goes on where the old leader stopped.
    let p = c
        .node(lagging)
        .write_messages(vec![message("TopicR", 0, "after")])
        .await
        .unwrap();
    assert_eq!(p[0].queue_offset, 1000);
}
