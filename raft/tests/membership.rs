//! Membership changes while writes run (issue 18): a node joins as a learner,
//! catches up and votes; the leader itself is removed (it hands leadership over
//! first); a follower whose disk died is replaced by a new node with an empty
//! store. Nothing acknowledged is lost, and the new members count for a quorum.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{message, Cluster};
use ledgermq_raft::node::{ChangeDone, MembershipChange};
use ledgermq_raft::{NodeId, RaftNode, RaftNodeError};
use ledgermq_store::FlushMode;
use ledgermq_testkit::free_port;

const T: Duration = Duration::from_secs(30);
const TOPIC: &str = "TopicM";

/// Configures node `id` to join `c`'s group (an empty store under the
/// cluster's directory, a new peer port) without starting it; returns its peer
/// address.
fn configure_joiner(c: &mut Cluster, id: NodeId) -> String {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut cfg = c.cfgs[&0].clone();
    cfg.node_id = id;
    cfg.listen_addr = addr.parse().unwrap();
    cfg.store_host = cfg.listen_addr;
    cfg.store.root = c.dir.path().join(format!("n{id}"));
    cfg.members.insert(id, addr.clone());
    cfg.join = true;
    c.cfgs.insert(id, cfg);
    addr
}

/// Writes one message after another, each through the next of `nodes`, until
/// `stop`; every body acknowledged goes into `acked`.
fn spawn_writer(
    nodes: Vec<Arc<RaftNode>>,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<String>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let body = format!("m{i:06}");
            let node = &nodes[i as usize % nodes.len()];
            if node
                .write_messages(vec![message(TOPIC, 0, &body)])
                .await
                .is_ok()
            {
                acked.lock().unwrap().push(body);
            }
            i += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

fn voters(node: &RaftNode) -> Vec<NodeId> {
    node.raft()
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .voter_ids()
        .collect()
}

/// Waits until `node` has applied a membership whose voters are `want`.
async fn wait_voters(node: &RaftNode, want: &[NodeId]) {
    let deadline = Instant::now() + T;
    while voters(node) != want {
        assert!(
            Instant::now() < deadline,
            "node {} has voters {:?}, not {want:?}",
            node.id(),
            voters(node)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every acknowledged body is in node `id`'s queue, once each.
fn assert_holds_every_ack(c: &Cluster, id: NodeId, acked: &[String]) {
    let held = c.queue_bodies(id, TOPIC, 0);
    let distinct: BTreeSet<&String> = held.iter().collect();
    assert_eq!(
        distinct.len(),
        held.len(),
        "node {id} holds a message twice"
    );
    let missing: Vec<&String> = acked.iter().filter(|b| !distinct.contains(b)).collect();
    assert!(
        missing.is_empty(),
        "node {id} lacks {} acknowledged message(s), first {:?}",
        missing.len(),
        missing.first()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_catches_up_and_votes_then_the_leader_is_removed_while_writes_run() {
    let mut c = Cluster::start(3, FlushMode::Sync).await;
    let leader = c.wait_leader(T).await;
    let follower = (leader + 1) % 3;
    // Some history the new node has to catch up with.
    for i in 0..200 {
        c.node(follower)
            .write_messages(vec![message(TOPIC, 0, &format!("h{i:04}"))])
            .await
            .unwrap();
    }
    let addr = configure_joiner(&mut c, 3);
    c.restart(3).await;
    // A node that joins waits: it is no member and makes no group of its own.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!c.node(3).is_member());
    assert!(c.node(3).raft().metrics().borrow().current_leader.is_none());

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let writer = spawn_writer(
        (0..3).map(|id| c.node(id).clone()).collect(),
        stop.clone(),
        acked.clone(),
    );
    // Asked of a follower, which passes it to the leader.
    let added = c
        .node(follower)
        .change_membership(
            MembershipChange::AddVoter {
                id: 3,
                addr: addr.clone(),
            },
            T,
        )
        .await
        .unwrap();
    assert_eq!(
        (added.done, added.voters.clone()),
        (ChangeDone::Added, vec![0, 1, 2, 3])
    );
    assert!(added.learners.is_empty());
    assert!(c.node(3).is_member());
    // Asking again changes nothing; the same id at another address is refused.
    let again = c
        .node(3)
        .change_membership(MembershipChange::AddVoter { id: 3, addr }, T)
        .await
        .unwrap();
    assert_eq!(again.done, ChangeDone::AlreadyVoter);
    let other = c
        .node(3)
        .change_membership(
            MembershipChange::AddVoter {
                id: 3,
                addr: "127.0.0.1:1".into(),
            },
            T,
        )
        .await;
    assert!(
        matches!(other, Err(RaftNodeError::MembershipRefused(_))),
        "{other:?}"
    );

    // The leader itself, asked through the new node: it hands leadership over,
    // and the next leader removes it.
    let leader = c.wait_leader(T).await;
    let removed = c
        .node(3)
        .change_membership(MembershipChange::Remove { id: leader }, T)
        .await
        .unwrap();
    assert_eq!(removed.done, ChangeDone::Removed);
    let rest: Vec<NodeId> = (0..4).filter(|&id| id != leader).collect();
    assert_eq!(
        (removed.voters.clone(), removed.learners.clone()),
        (rest.clone(), vec![])
    );
    // The removed node learned it no longer votes before it was let go.
    assert!(!voters(c.node(leader)).contains(&leader));
    // Writes go on under the new leader for a while.
    let before = acked.lock().unwrap().len();
    let deadline = Instant::now() + T;
    while acked.lock().unwrap().len() < before + 50 {
        assert!(
            Instant::now() < deadline,
            "writes stopped after the removal"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    c.crash(leader).await;
    c.wait_converged(T).await;
    c.audit();
    let acked = acked.lock().unwrap().clone();
    for id in rest {
        wait_voters(c.node(id), &removed.voters).await;
        assert_holds_every_ack(&c, id, &acked);
    }
    // The history written before it joined came to the new node too.
    let history: Vec<String> = (0..200).map(|i| format!("h{i:04}")).collect();
    assert_eq!(c.queue_bodies(3, TOPIC, 0)[..200], history[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_whose_disk_died_is_replaced_by_a_new_node_that_counts_for_a_quorum() {
    let mut c = Cluster::start(3, FlushMode::Sync).await;
    let leader = c.wait_leader(T).await;
    let dead = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    for i in 0..100 {
        c.node(leader)
            .write_messages(vec![message(TOPIC, 0, &format!("h{i:04}"))])
            .await
            .unwrap();
    }
    // The disk dies: the node is gone, its store with it.
    c.crash(dead).await;
    std::fs::remove_dir_all(&c.cfgs[&dead].store.root).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let writer = spawn_writer(
        vec![c.node(leader).clone(), c.node(other).clone()],
        stop.clone(),
        acked.clone(),
    );
    let addr = configure_joiner(&mut c, 3);
    c.restart(3).await;
    let added = c
        .node(other)
        .change_membership(MembershipChange::AddVoter { id: 3, addr }, T)
        .await
        .unwrap();
    assert_eq!(added.voters, vec![0, 1, 2, 3]);
    // The dead node never hears of its removal: it is removed anyway.
    let removed = c
        .node(3)
        .change_membership(MembershipChange::Remove { id: dead }, T)
        .await
        .unwrap();
    assert_eq!(removed.done, ChangeDone::Removed);
    let mut want: Vec<NodeId> = vec![leader, other, 3];
    want.sort_unstable();
    assert_eq!(removed.voters, want);
    // Removing it again changes nothing.
    let again = c
        .node(leader)
        .change_membership(MembershipChange::Remove { id: dead }, T)
        .await
        .unwrap();
    assert_eq!(again.done, ChangeDone::NotMember);
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();

    // The new node is part of every quorum now: with `other` down, the leader
    // and node 3 commit.
    c.wait_converged(T).await;
    c.crash(other).await;
    let leader = c.wait_leader(T).await;
    c.node(leader)
        .write_messages(vec![message(TOPIC, 0, "after")])
        .await
        .expect("the leader and the new node make a quorum");
    let mut acked = acked.lock().unwrap().clone();
    acked.push("after".into());
    c.wait_converged(T).await;
    c.audit();
    assert_holds_every_ack(&c, 3, &acked);
    assert_eq!(c.queue_bodies(3, TOPIC, 0).len(), 100 + acked.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_that_cannot_catch_up_stays_a_learner_until_it_can() {
    let mut c = Cluster::start(3, FlushMode::Sync).await;
    let leader = c.wait_leader(T).await;
    for i in 0..20 {
        c.node(leader)
            .write_messages(vec![message(TOPIC, 0, &format!("h{i:04}"))])
            .await
            .unwrap();
    }
    let addr = configure_joiner(&mut c, 3);
    c.restart(3).await;
    // Nothing reaches the new node.
    for id in 0..3 {
        c.filter.block(id, 3);
    }
    // Asked through a follower: the leader's answer comes back before the
    // follower's own deadline.
    let change = MembershipChange::AddVoter { id: 3, addr };
    let r = c
        .node((leader + 1) % 3)
        .change_membership(change.clone(), Duration::from_secs(2))
        .await;
    assert!(
        matches!(r, Err(RaftNodeError::CatchUpTimeout { id: 3, .. })),
        "{r:?}"
    );
    let m = c
        .node(leader)
        .raft()
        .metrics()
        .borrow()
        .membership_config
        .clone();
    assert_eq!(
        m.membership().voter_ids().collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert_eq!(m.membership().learner_ids().collect::<Vec<_>>(), vec![3]);
    // Once it can, asking again goes on from there.
    c.filter.heal();
    let added = c.node(leader).change_membership(change, T).await.unwrap();
    assert_eq!(
        (added.done, added.voters),
        (ChangeDone::Added, vec![0, 1, 2, 3])
    );
    c.wait_converged(T).await;
    assert_eq!(c.queue_bodies(3, TOPIC, 0).len(), 20);
}
