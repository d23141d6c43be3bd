//! Replication makes progress with large entries over a slow link (issue 13,
//! item 6): openraft 0.9 gives an AppendEntries call the heartbeat interval
//! (100 ms) as its deadline, so what one call carries must cross the link well
//! within it.

mod common;

use std::time::Duration;

use common::Cluster;
use ledgermq_raft::{LinkShape, RaftNodeError};
use ledgermq_store::{FlushMode, MessageRecord};

const T: Duration = Duration::from_secs(30);

/// 1 Gbit/s with 10 ms of latency each way.
const WAN: LinkShape = LinkShape {
    latency_ms: 10,
    bytes_per_sec: 125_000_000,
};

fn big(i: usize, body_bytes: usize) -> MessageRecord {
    let mut body = vec![b'b'; body_bytes];
    body[..8].copy_from_slice(&(i as u64).to_be_bytes());
    MessageRecord::message("TopicBig", 0, body, 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_catches_up_with_large_entries_over_a_slow_link() {
    let mut c = Cluster::start_with(3, FlushMode::Async, |cfg| {
        cfg.store.commit_log.segment_bytes = 64 << 20;
        cfg.store.commit_log.max_message_size_bytes = 4 << 20;
    })
    .await;
    let leader = c.wait_leader(T).await;
    let lagging = (leader + 1) % 3;
    for a in 0..3 {
        for b in 0..3 {
            if a != b {
                c.filter.shape(a, b, WAN);
            }
        }
    }
    c.crash(lagging).await;
    // Requests of 3 MiB: each is one entry.
    for i in 0..16 {
        let batch = (0..3).map(|j| big(i * 3 + j, 1 << 20)).collect();
        c.node(leader).write_messages(batch).await.unwrap();
    }
    c.restart(lagging).await;
    c.wait_converged(T).await;
    c.audit();
    let (_, hi) = c.node(lagging).store().queue_offsets("TopicBig", 0);
    assert_eq!(hi, 48);
    // A request larger than an entry may be is refused, not stored as one huge
    // entry no follower could receive in time.
    let huge: Vec<_> = (0..20).map(|j| big(1000 + j, 1 << 20)).collect();
    let r = c.node(leader).write_messages(huge).await;
    assert!(
        matches!(r, Err(RaftNodeError::InvalidInput(_))),
        "a 20 MiB request: {r:?}"
    );
}
