//! A store written by an earlier release starts under this one and keeps what it
//! held: the fixture under `tests/fixtures/store-44a2fd3/` is the three node
//! directories of a group written by commit 44a2fd3 (the release before stored
//! rows and snapshots carried a format version), by [`write_the_fixture`] below:
//! topics, groups (deleted ones too), consumer offsets, FIFO leases of both
//! command variants, messages in several CommitLog segments, and a retention purge
//! that left a snapshot in every member's metadata store.
//!
//! The fixture's peers listen on fixed loopback ports below the ephemeral range
//! (membership, with the addresses, is part of what was stored): 28761-28763,
//! which nothing else in the test run uses; a failure to bind them is that.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::{message, Cluster};
use ledgermq_raft::format::MAGIC;
use ledgermq_raft::meta::MetaDb;
use ledgermq_raft::{
    Command, FifoLease, GroupConfig, NodeId, OffsetCommit, TopicConfig, TopicMessageType, TopicPerm,
};
use ledgermq_store::FlushMode;

const T: Duration = Duration::from_secs(30);
/// Where the fixture is, from this crate's root.
const FIXTURE: &str = "tests/fixtures/store-44a2fd3";
/// Messages written to TopicM before the purge, and after it.
const BEFORE_PURGE: u64 = 400;
const AFTER_PURGE: u64 = 20;

fn members() -> BTreeMap<NodeId, String> {
    (0..3)
        .map(|i| (i, format!("127.0.0.1:{}", 28761 + i)))
        .collect()
}

fn body(i: u64) -> String {
    format!("{i:04}-{}", "m".repeat(400))
}

fn topic(name: &str, queue_count: u32, message_type: TopicMessageType) -> TopicConfig {
    TopicConfig {
        name: name.into(),
        queue_count,
        perm: TopicPerm::READ_WRITE,
        message_type,
    }
}

fn group(name: &str, fifo: bool, broadcast: bool, max_delivery_attempts: u32) -> GroupConfig {
    GroupConfig {
        name: name.into(),
        fifo,
        broadcast,
        max_delivery_attempts,
    }
}

fn commit(group: &str, topic: &str, queue_id: i32, offset: u64) -> Command {
    Command::CommitOffsets(vec![OffsetCommit {
        group: group.into(),
        topic: topic.into(),
        queue_id,
        offset,
    }])
}

fn lease(term: u64, queue_id: i32, queue_offset: u64) -> FifoLease {
    FifoLease {
        group: "GF".into(),
        topic: "TopicF".into(),
        queue_id,
        queue_offset,
        delivery_id: (term << FifoLease::DELIVERY_TERM_SHIFT) | 7,
        attempt: 2,
        visible_at_ms: 1_800_000_000_000,
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// Checks that every live node holds what the fixture's writer wrote, and
/// `extra` more messages on TopicM.
fn holds_the_fixture(c: &Cluster, extra: u64) {
    for n in c.live() {
        let id = n.id();
        let meta = n.shared_meta().read().unwrap().clone();
        assert_eq!(
            meta.topics.get("TopicF"),
            Some(&topic("TopicF", 2, TopicMessageType::Fifo)),
            "node {id}"
        );
        assert_eq!(
            meta.topics.get("TopicM"),
            Some(&topic("TopicM", 1, TopicMessageType::Normal)),
            "node {id}"
        );
        assert!(!meta.topics.contains_key("Gone"), "node {id}");
        assert_eq!(meta.groups.get("GF"), Some(&group("GF", true, false, 16)));
        assert_eq!(meta.groups.get("GN"), Some(&group("GN", false, true, 3)));
        assert!(!meta.groups.contains_key("GX"), "node {id}");
        let key = |g: &str, t: &str, q: i32| (g.to_string(), t.to_string(), q);
        assert_eq!(meta.offsets.get(&key("GN", "TopicM", 0)), Some(&350));
        assert_eq!(meta.offsets.get(&key("GF", "TopicF", 0)), Some(&1));
        assert!(!meta.offsets.keys().any(|k| k.0 == "GX"), "node {id}");
        let leases: Vec<(i32, u64, u32)> = meta
            .fifo_leases
            .values()
            .map(|l| (l.queue_id, l.queue_offset, l.attempt))
            .collect();
        assert_eq!(leases, vec![(0, 1, 2), (1, 0, 2)], "node {id}");
        let store = n.store();
        let (lo, hi) = store.queue_offsets("TopicM", 0);
        assert_eq!(hi, BEFORE_PURGE + AFTER_PURGE + extra, "node {id}");
        assert!(lo > 0, "node {id}: the fixture's purge is gone");
        let bodies = c.queue_bodies(id, "TopicM", 0);
        let fixture_end = (BEFORE_PURGE + AFTER_PURGE - lo) as usize;
        for (i, b) in bodies[..fixture_end].iter().enumerate() {
            assert_eq!(*b, body(lo + i as u64), "node {id}");
        }
        assert_eq!(store.queue_offsets("TopicF", 0), (0, 3), "node {id}");
        assert_eq!(store.queue_offsets("TopicF", 1), (0, 2), "node {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_written_by_the_previous_release_starts_and_keeps_its_state() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE);
    let dir = tempfile::tempdir().unwrap();
    // Nodes 0 and 1 start on their stores; node 2 starts empty, so it installs
    // the snapshot node 0 or 1 stored (in the earlier format) and replays the log
    // after it.
    for id in 0..2 {
        copy_dir(
            &fixture.join(format!("n{id}")),
            &dir.path().join(format!("n{id}")),
        );
    }
    {
        // The fixture holds rows in the earlier format (no envelope), or this
        // test would prove nothing.
        let db = MetaDb::open(&dir.path().join("n0/meta")).unwrap();
        let mut rows: Vec<Vec<u8>> = Vec::new();
        for tree in [&db.topics, &db.groups, &db.fifo_leases, &db.offsets] {
            rows.extend(tree.iter().map(|kv| kv.unwrap().1.to_vec()));
        }
        rows.push(db.sm.get("snapshot").unwrap().expect("a snapshot").to_vec());
        rows.push(db.sm.get("last_applied").unwrap().unwrap().to_vec());
        assert!(rows.len() > 8, "{} rows", rows.len());
        for r in &rows {
            assert!(!r.starts_with(&MAGIC), "an enveloped row in the fixture");
        }
    }
    let mut c = Cluster::configure_in(dir, members(), FlushMode::Sync, |_| {});
    c.start_together(&[0, 1, 2]).await;
    c.wait_leader(T).await;
    c.wait_converged(T).await;
    holds_the_fixture(&c, 0);
    c.audit();
    // This release writes next to what the earlier one wrote.
    let leader = c.wait_leader(T).await;
    c.node(leader)
        .write_command(Command::UpdateTopic(topic(
            "TopicN",
            4,
            TopicMessageType::Normal,
        )))
        .await
        .unwrap();
    // A lease of the term it is proposed in (again if an election came between,
    // a few times at most).
    let mut tries = 0;
    let term = loop {
        let l = c.node(c.wait_leader(T).await);
        let term = l.raft().metrics().borrow().current_term;
        let leases = Command::FifoLeasesOfTerm {
            term,
            leases: vec![lease(term, 1, 0)],
        };
        match l.write_command(leases).await {
            Ok(_) => break term,
            Err(e) if tries < 5 => {
                tries += 1;
                eprintln!("the lease of term {term} was not applied ({e}); again");
            }
            Err(e) => panic!("the lease was not applied in {tries} tries: {e}"),
        }
    };
    c.node(c.wait_leader(T).await)
        .write_messages(vec![message(
            "TopicM",
            0,
            &body(BEFORE_PURGE + AFTER_PURGE),
        )])
        .await
        .unwrap();
    c.wait_converged(T).await;
    for id in 0..3 {
        c.node(id).stop(true).await.unwrap();
        c.nodes.insert(id, None);
    }
    c.start_together(&[0, 1, 2]).await;
    c.wait_leader(T).await;
    c.wait_converged(T).await;
    holds_the_fixture(&c, 1);
    for n in c.live() {
        let meta = n.shared_meta().read().unwrap().clone();
        assert_eq!(meta.topics.len(), 3, "node {}", n.id());
        let l = &meta.fifo_leases[&("GF".into(), "TopicF".into(), 1)];
        assert_eq!(l.delivery_term(), term, "node {}", n.id());
    }
    c.audit();
}

/// Writes the fixture into `$LEDGERMQ_FIXTURE_OUT` (a directory that must not
/// exist). Run at the release whose format the fixture is to keep:
/// `LEDGERMQ_FIXTURE_OUT=/tmp/f cargo test -p ledgermq-raft --test stored_formats
/// -- --ignored write_the_fixture`, then copy `/tmp/f` to [`FIXTURE`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes the fixture; run by hand at the release it is to keep"]
async fn write_the_fixture() {
    let out = std::env::var("LEDGERMQ_FIXTURE_OUT").expect("LEDGERMQ_FIXTURE_OUT");
    let out = Path::new(&out);
    assert!(!out.exists(), "{} exists", out.display());
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::configure_in(dir, members(), FlushMode::Sync, |cfg| {
        cfg.retention_interval_ms = 300;
        cfg.store.retention.disk_force_clean_ratio = 0.0;
    });
    c.start_together(&[0, 1, 2]).await;
    let leader = c.wait_leader(T).await;
    let l = c.node(leader).clone();
    let commands = [
        Command::UpdateTopic(topic("TopicF", 2, TopicMessageType::Fifo)),
        Command::EnsureTopic(topic("TopicM", 1, TopicMessageType::Normal)),
        Command::UpdateTopic(topic("Gone", 1, TopicMessageType::Normal)),
        Command::DeleteTopic("Gone".into()),
        Command::UpdateGroup(group("GF", true, false, 16)),
        Command::EnsureGroup(group("GN", false, true, 3)),
        Command::UpdateGroup(group("GX", false, false, 16)),
        commit("GX", "TopicM", 0, 5),
        Command::DeleteGroup("GX".into()),
        commit("GN", "TopicM", 0, 0),
    ];
    for cmd in commands {
        l.write_command(cmd).await.unwrap();
    }
    for i in 0..BEFORE_PURGE {
        l.write_messages(vec![message("TopicM", 0, &body(i))])
            .await
            .unwrap();
    }
    l.write_command(commit("GN", "TopicM", 0, 350))
        .await
        .unwrap();
    c.wait_purged(T).await;
    for (q, n) in [(0, 3), (1, 2)] {
        for i in 0..n {
            l.write_messages(vec![message("TopicF", q, &format!("f{q}-{i}"))])
                .await
                .unwrap();
        }
    }
    let term = l.raft().metrics().borrow().current_term;
    l.write_command(commit("GF", "TopicF", 0, 1)).await.unwrap();
    l.write_command(Command::FifoLeasesOfTerm {
        term,
        leases: vec![lease(term, 0, 1)],
    })
    .await
    .unwrap();
    l.write_command(Command::FifoLeases(vec![lease(term, 1, 0)]))
        .await
        .unwrap();
    for i in BEFORE_PURGE..BEFORE_PURGE + AFTER_PURGE {
        l.write_messages(vec![message("TopicM", 0, &body(i))])
            .await
            .unwrap();
    }
    c.wait_converged(T).await;
    holds_the_fixture(&c, 0);
    for id in 0..3 {
        c.node(id).stop(true).await.unwrap();
        c.nodes.insert(id, None);
    }
    for id in 0..3 {
        copy_dir(
            &c.dir.path().join(format!("n{id}")),
            &out.join(format!("n{id}")),
        );
    }
}
