//! A leader's queue of writes waiting to be proposed is bounded by bytes: past the
//! bound a write is refused at once (issue 13, item 7), instead of every request
//! being buffered until its write is taken.

mod common;

use std::time::Duration;

use common::{message, Cluster};
use ledgermq_raft::RaftNodeError;
use ledgermq_store::FlushMode;

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_past_the_pending_bound_are_refused_at_once() {
    let c = Cluster::start_with(3, FlushMode::Sync, |cfg| {
        cfg.batch.in_flight = 1;
        cfg.batch.max_pending_bytes = 128 << 10;
    })
    .await;
    let leader = c.wait_leader(T).await;
    let node = c.node(leader).clone();
    let body = "p".repeat(8 << 10);
    let writes = (0..400).map(|_| {
        let node = node.clone();
        let m = message("TopicO", 0, &body);
        async move { node.write_messages(vec![m]).await }
    });
    let results = futures::future::join_all(writes).await;
    let refused = results
        .iter()
        .filter(|r| matches!(r, Err(RaftNodeError::Overloaded { .. })))
        .count();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert!(refused > 0, "no write was refused");
    assert_eq!(
        ok + refused,
        400,
        "{:?}",
        results.iter().find(|r| r.is_err())
    );
    // Once the queue drained, writes are taken again.
    c.node(leader)
        .write_messages(vec![message("TopicO", 0, "after")])
        .await
        .unwrap();
    c.wait_converged(T).await;
    c.audit();
    let (_, hi) = c.node(leader).store().queue_offsets("TopicO", 0);
    assert_eq!(hi as usize, ok + 1);
}
