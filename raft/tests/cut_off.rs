//! A node cut off from its group answers writes at once with a retryable error
//! instead of holding each one for the write timeout (issue 13, item 4).

mod common;

use std::time::Duration;

use common::{message, Cluster};
use ledgermq_raft::RaftNodeError;
use ledgermq_store::FlushMode;

const T: Duration = Duration::from_secs(20);

fn is_cut_off(r: &Result<Vec<ledgermq_raft::Placed>, RaftNodeError>) -> bool {
    matches!(r, Err(RaftNodeError::CutOff { .. }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_leader_or_follower_refuses_writes_at_once() {
    let c = Cluster::start(3, FlushMode::Sync).await;
    let leader = c.wait_leader(T).await;
    let follower = (leader + 1) % 3;
    c.node(leader)
        .write_messages(vec![message("TopicC", 0, "ok")])
        .await
        .unwrap();
    // A follower cut off from both others.
    c.filter.isolate(follower, [leader, (leader + 2) % 3]);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = c
        .node(follower)
        .write_messages(vec![message("TopicC", 0, "f")])
        .await;
    assert!(is_cut_off(&r), "isolated follower: {r:?}");
    assert!(!c.node(follower).in_contact_with_quorum());
    // The rest of the group takes writes.
    c.node(leader)
        .write_messages(vec![message("TopicC", 0, "still")])
        .await
        .unwrap();
    c.filter.heal();
    // The leader cut off from both followers (it still believes it leads).
    let leader = c.wait_leader(T).await;
    let others: Vec<_> = (0..3).filter(|&i| i != leader).collect();
    c.filter.isolate(leader, others.clone());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = c
        .node(leader)
        .write_messages(vec![message("TopicC", 0, "l")])
        .await;
    assert!(is_cut_off(&r), "isolated leader: {r:?}");
    // The majority elected a leader of its own and serves.
    let w = c
        .node(others[0])
        .write_messages(vec![message("TopicC", 0, "majority")])
        .await;
    assert!(w.is_ok(), "{w:?}");
    c.filter.heal();
    c.wait_leader(T).await;
    for id in 0..3 {
        assert!(
            c.node(id)
                .write_messages(vec![message("TopicC", 0, "healed")])
                .await
                .is_ok(),
            "node {id} after the heal"
        );
    }
}
