//! A member whose metadata store (sled) is damaged or lost starts again: it keeps
//! its vote (held apart from sled); where the log can replay what sled forgot it
//! applies it again; where it cannot (the log was purged past it), it sets the
//! damaged store and its messages aside and takes everything back from the group,
//! staying out of elections until its log is back past what it had acknowledged.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{commit_offset as commit, message, Cluster};
use ledgermq_store::set_aside::holds_messages;
use ledgermq_store::FlushMode;

const T: Duration = Duration::from_secs(30);

/// XORs every byte of the middle half of `path` with a pattern, as a disk that
/// returns garbage for a run of sectors would.
fn damage_middle(path: &Path) {
    let mut b = std::fs::read(path).unwrap();
    assert!(b.len() > 64, "{} holds {} bytes", path.display(), b.len());
    let (lo, hi) = (b.len() / 4, b.len() * 3 / 4);
    for (i, x) in b[lo..hi].iter_mut().enumerate() {
        *x ^= 0x5a ^ (i as u8);
    }
    std::fs::write(path, b).unwrap();
}

/// Waits until node `id` holds queue (`topic`, 0) as `[lo, hi)` with `lo <= max_lo`.
async fn wait_holds(c: &Cluster, id: u64, topic: &str, max_lo: u64, hi: u64) {
    let deadline = Instant::now() + T;
    loop {
        let (l, h) = c.node(id).store().queue_offsets(topic, 0);
        if h == hi && l <= max_lo {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {id} holds [{l}, {h}) of {topic}, not [..={max_lo}, {hi})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts a group, writes 300 messages to TopicM and commits group G's offset
/// at `consumed`; with `purge`, waits until every member purged its log.
async fn loaded_group(purge: bool, consumed: u64) -> (Cluster, u64) {
    let c = Cluster::start_with(3, FlushMode::Sync, |cfg| {
        if purge {
            cfg.retention_interval_ms = 300;
            cfg.store.retention.disk_force_clean_ratio = 0.0;
        }
    })
    .await;
    let leader = c.wait_leader(T).await;
    c.node(leader)
        .write_command(commit("G", "TopicM", 0))
        .await
        .unwrap();
    for i in 0..300 {
        let body = format!("{i:04}-{}", "m".repeat(400));
        c.node(leader)
            .write_messages(vec![message("TopicM", 0, &body)])
            .await
            .unwrap();
    }
    c.node(leader)
        .write_command(commit("G", "TopicM", consumed))
        .await
        .unwrap();
    c.wait_converged(T).await;
    if purge {
        c.wait_purged(T).await;
    }
    (c, leader)
}

fn consumer_offset(c: &Cluster, id: u64) -> Option<u64> {
    c.node(id)
        .shared_meta()
        .read()
        .unwrap()
        .offsets
        .get(&("G".to_string(), "TopicM".to_string(), 0))
        .copied()
}

fn set_aside_dirs(root: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(root)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("damaged-"))
        .map(|e| e.path())
        .collect()
}

/// After a restart of `follower`: it holds what the leader holds, applies alike,
/// agrees on consumer offsets, and can be half of a majority without the leader.
async fn takes_part_again(c: &mut Cluster, leader: u64, follower: u64) {
    let p = c
        .node(leader)
        .write_messages(vec![message("TopicM", 0, "after")])
        .await
        .unwrap();
    assert_eq!(p[0].queue_offset, 300);
    let leader_lo = c.node(leader).store().queue_offsets("TopicM", 0).0;
    wait_holds(c, follower, "TopicM", leader_lo.max(300), 301).await;
    c.wait_converged(T).await;
    c.audit();
    assert!(consumer_offset(c, leader).is_some());
    assert_eq!(
        consumer_offset(c, follower),
        consumer_offset(c, leader),
        "consumer offsets rebuilt"
    );
    c.crash(leader).await;
    let l2 = c.wait_leader(T).await;
    let p = c
        .node(l2)
        .write_messages(vec![message("TopicM", 0, "later")])
        .await
        .unwrap();
    assert_eq!(p[0].queue_offset, 301);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_lost_its_metadata_store_keeps_its_vote() {
    let (mut c, leader) = loaded_group(false, 120).await;
    let follower = (leader + 1) % 3;
    let term_before = c.node(follower).raft().metrics().borrow().current_term;
    assert!(term_before > 0);
    c.crash(follower).await;
    let root = c.cfgs[&follower].store.root.clone();
    std::fs::remove_dir_all(root.join("meta")).unwrap();
    // Cut off, so that nothing but its own storage can tell it the term.
    c.filter.isolate(follower, [0, 1, 2]);
    c.restart(follower).await;
    let m = c.node(follower).raft().metrics().borrow().clone();
    assert!(
        m.current_term >= term_before,
        "the member forgot its vote: term {} after, {term_before} before",
        m.current_term
    );
    c.filter.heal();
    // The log was never purged: it applies it again, nothing is set aside.
    takes_part_again(&mut c, leader, follower).await;
    assert!(set_aside_dirs(&root).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_metadata_store_rolled_back_applies_its_log_again() {
    let (mut c, leader) = loaded_group(false, 120).await;
    let follower = (leader + 1) % 3;
    c.crash(follower).await;
    let root = c.cfgs[&follower].store.root.clone();
    damage_middle(&root.join("meta").join("db"));
    c.restart(follower).await;
    takes_part_again(&mut c, leader, follower).await;
    // The log replays whatever sled forgot: no message is set aside (sled may
    // have reported the damage, and its store been set aside, or not).
    assert!(set_aside_dirs(&root).iter().all(|d| !holds_messages(d)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_metadata_store_forgot_a_purge_takes_everything_back() {
    let (mut c, leader) = loaded_group(true, 300).await;
    let follower = (leader + 1) % 3;
    c.crash(follower).await;
    let root = c.cfgs[&follower].store.root.clone();
    damage_middle(&root.join("meta").join("db"));
    c.restart(follower).await;
    let aside = set_aside_dirs(&root);
    assert_eq!(aside.len(), 1, "the damaged store is set aside: {aside:?}");
    assert!(aside[0].join("meta").exists());
    takes_part_again(&mut c, leader, follower).await;
    // Caught up: the old messages are removed, the damaged store stays.
    let deadline = Instant::now() + T;
    while aside[0].join("commitlog").exists() {
        assert!(Instant::now() < deadline, "the old messages stay set aside");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(aside[0].join("meta").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_before_the_vote_file_keeps_its_vote() {
    let (mut c, leader) = loaded_group(false, 120).await;
    let follower = (leader + 1) % 3;
    let vote = c.node(follower).raft().metrics().borrow().vote;
    c.crash(follower).await;
    // The previous release kept the vote in sled, under `vote` of tree `raft`.
    let root = c.cfgs[&follower].store.root.clone();
    std::fs::remove_file(root.join(ledgermq_raft::vote_file::VOTE_FILE_NAME)).unwrap();
    {
        let meta = ledgermq_raft::meta::MetaDb::open(&root.join("meta")).unwrap();
        // As that release wrote it: plain postcard, no format envelope.
        meta.raft
            .insert("vote", postcard::to_stdvec(&vote).unwrap())
            .unwrap();
        meta.flush().unwrap();
    }
    c.filter.isolate(follower, [0, 1, 2]);
    c.restart(follower).await;
    assert_eq!(
        c.node(follower).raft().metrics().borrow().current_term,
        vote.leader_id.term
    );
    assert!(root.join(ledgermq_raft::vote_file::VOTE_FILE_NAME).exists());
    c.filter.heal();
    takes_part_again(&mut c, leader, follower).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emptied_member_refuses_candidates_below_its_old_log_even_without_its_mark() {
    let (mut c, leader) = loaded_group(true, 300).await;
    let f = (leader + 1) % 3;
    let t = (leader + 2) % 3;
    // t falls behind: cut off while 50 more messages commit on the leader and f.
    c.filter.isolate(t, [0, 1, 2]);
    for i in 0..50 {
        c.node(leader)
            .write_messages(vec![message("TopicM", 0, &format!("late-{i}"))])
            .await
            .unwrap();
    }
    let last = c.node(leader).raft().metrics().borrow().last_log_index;
    let deadline = Instant::now() + T;
    while c.node(f).raft().metrics().borrow().last_log_index != last {
        assert!(Instant::now() < deadline, "f did not take the late entries");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.crash(f).await;
    // f's metadata store is damaged, and its acknowledged mark lost as well.
    let root = c.cfgs[&f].store.root.clone();
    damage_middle(&root.join("meta").join("db"));
    for mark in ["ack_mark", "ack_bound"] {
        let _ = std::fs::remove_file(root.join(mark));
    }
    // It restarts cut off from the leader: it sets its log aside, cannot catch up.
    c.filter.isolate(f, [0, 1, 2]);
    c.restart(f).await;
    assert!(
        set_aside_dirs(&root).iter().any(|d| holds_messages(d)),
        "f set its messages aside"
    );
    c.crash(leader).await;
    c.filter.heal();
    // t lacks the 50 entries f had acknowledged: f must not elect it, nor lead.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let leaders: Vec<u64> = c.live().filter(|n| n.is_leader()).map(|n| n.id()).collect();
    assert!(
        leaders.is_empty(),
        "elected without the late entries: {leaders:?}"
    );
    // The old leader comes back: the group goes on, with every message.
    c.restart(leader).await;
    let l = c.wait_leader(T).await;
    let p = c
        .node(l)
        .write_messages(vec![message("TopicM", 0, "after")])
        .await
        .unwrap();
    assert_eq!(p[0].queue_offset, 350);
    c.wait_converged(T).await;
    c.audit();
}
