//! FIFO delivery leases across leader changes (issue 13, item 1): a lease decided
//! by a leader that has since been deposed never commits in a later term, and an
//! older lease never replaces a newer one.

mod common;

use std::time::Duration;

use common::Cluster;
use ledgermq_raft::{Command, FifoLease, RaftNodeError, TimedFifoLease};
use ledgermq_store::FlushMode;

const T: Duration = Duration::from_secs(20);

fn lease(term: u64, seq: u64, queue_offset: u64) -> FifoLease {
    FifoLease {
        group: "G".into(),
        topic: "TopicF".into(),
        queue_id: 0,
        queue_offset,
        // Delivery ids hold the deciding leader's term in their top 24 bits.
        delivery_id: (term << 40) | seq,
        attempt: 1,
        visible_at_ms: i64::MAX / 2,
    }
}

fn stored_lease(c: &Cluster, id: u64) -> Option<FifoLease> {
    c.node(id)
        .shared_meta()
        .read()
        .unwrap()
        .fifo_leases
        .get(&("G".to_string(), "TopicF".to_string(), 0))
        .cloned()
}

fn term_of(c: &Cluster, id: u64) -> u64 {
    c.node(id).raft().metrics().borrow().current_term
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leaders_fifo_lease_never_commits_in_a_later_term() {
    let c = Cluster::start(3, FlushMode::Sync).await;
    let old = c.wait_leader(T).await;
    let old_term = term_of(&c, old);
    let new = (old + 1) % 3;
    c.node(old).transfer_leadership(Some(new), T).await.unwrap();
    assert_eq!(c.wait_leader(T).await, new);
    assert!(term_of(&c, new) > old_term);
    // The deposed leader records a delivery it decided in its own term, the way
    // the broker's legacy path did (a command from any node, so it is forwarded).
    // Until the deposed leader hears from the new one it refuses to forward
    // (`LeaderUnreachable`, nothing written); a loaded machine can take a while.
    let deadline = tokio::time::Instant::now() + T;
    let r = loop {
        let r = c
            .node(old)
            .write_command(Command::FifoLeases(vec![lease(old_term, 7, 3)]))
            .await;
        match r {
            Err(RaftNodeError::LeaderUnreachable { .. } | RaftNodeError::CutOff { .. })
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            r => break r,
        }
    };
    // And through the API the broker uses now.
    let r2 = c
        .node(old)
        .write_command_as_leader(Command::FifoLeasesOfTerm {
            term: old_term,
            leases: vec![lease(old_term, 8, 4)],
        })
        .await;
    // Even if a deposed leader's lease reaches the new leader by another path,
    // the state machine refuses it.
    let r3 = c
        .node(new)
        .write_command(Command::FifoLeasesOfTerm {
            term: old_term,
            leases: vec![lease(old_term, 9, 5)],
        })
        .await;
    c.wait_converged(T).await;
    for id in 0..3 {
        assert_eq!(
            stored_lease(&c, id),
            None,
            "node {id} holds a lease of deposed term {old_term}"
        );
        assert_eq!(
            c.node(id)
                .shared_meta()
                .read()
                .unwrap()
                .offsets
                .get(&("G".into(), "TopicF".into(), 0)),
            None,
            "a refused lease must not move the group's offset"
        );
    }
    for (name, r) in [("forwarded", r), ("as leader", r2), ("stale term", r3)] {
        assert!(
            matches!(
                r,
                Err(RaftNodeError::NotLeader { .. } | RaftNodeError::StaleTerm { .. })
            ),
            "{name}: {r:?}"
        );
    }
    // The current leader's own lease commits (on a loaded machine another
    // election may have followed the transfer).
    let new = c.wait_leader(T).await;
    let new_term = term_of(&c, new);
    c.node(new)
        .write_command_as_leader(Command::FifoLeasesOfTerm {
            term: new_term,
            leases: vec![lease(new_term, 1, 3)],
        })
        .await
        .unwrap();
    c.wait_converged(T).await;
    for id in 0..3 {
        assert_eq!(stored_lease(&c, id), Some(lease(new_term, 1, 3)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_lease_never_replaces_a_newer_one() {
    let c = Cluster::start(3, FlushMode::Sync).await;
    let leader = c.wait_leader(T).await;
    let term = term_of(&c, leader);
    let newer = lease(term, 10, 5);
    let older = lease(term, 3, 4);
    c.node(leader)
        .write_command(Command::FifoLeases(vec![newer.clone()]))
        .await
        .unwrap();
    // A lease decided earlier (lower delivery id) that commits later, e.g. a
    // proposal held up in a batch.
    let _ = c
        .node(leader)
        .write_command(Command::FifoLeases(vec![older]))
        .await;
    c.wait_converged(T).await;
    for id in 0..3 {
        assert_eq!(stored_lease(&c, id), Some(newer.clone()), "node {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_lease_is_written_once_every_member_decodes_it_and_each_counts_it_from_its_apply() {
    let c = Cluster::start(3, FlushMode::Sync).await;
    let leader = c.wait_leader(T).await;
    let term = term_of(&c, leader);
    // Every member of this release says so in its AppendEntries answers
    // (heartbeats included); a member not heard yet keeps the set closed.
    let set = ledgermq_raft::format::SET_TIMED_FIFO_LEASES;
    c.wait_members_decode(leader, set, T).await;
    assert!(
        !c.node(leader)
            .members_decode(ledgermq_raft::format::LOG_COMMANDS + 1),
        "a set no release knows"
    );
    let before = std::time::Instant::now();
    let l = lease(term, 1, 3);
    let invisible = Duration::from_secs(30);
    c.node(leader)
        .write_command_as_leader(Command::fifo_leases(
            term,
            vec![TimedFifoLease {
                lease: l.clone(),
                invisible_ms: invisible.as_millis() as u64,
            }],
            true,
        ))
        .await
        .unwrap();
    c.wait_converged(T).await;
    let after = std::time::Instant::now();
    for id in 0..3 {
        assert_eq!(stored_lease(&c, id), Some(l.clone()), "node {id}");
        let d = c
            .node(id)
            .shared_meta()
            .read()
            .unwrap()
            .lease_deadlines
            .0
            .get(&("G".to_string(), "TopicF".to_string(), 0))
            .copied()
            .unwrap_or_else(|| panic!("node {id} has no deadline for the timed lease"));
        assert_eq!(d.delivery_id, l.delivery_id);
        assert!(
            d.visible_at >= before + invisible && d.visible_at <= after + invisible,
            "node {id}: the deadline is its apply plus the invisible duration"
        );
    }
}
