//! A full disk refuses new messages with a clear error and keeps serving reads; a
//! committed entry that cannot be applied for want of space waits for space
//! instead of stopping every replica at the same entry (issue 13, item 7).
//!
//! One node's own disk filling up (issue 14): a follower stays up, falls behind
//! and catches up by itself once space is freed; a leader hands its leadership
//! to a follower; a node whose disk is full still forwards client writes.
//!
//! Needs root (a small tmpfs is mounted for the stores); skipped otherwise.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{message, Cluster};
use ledgermq_raft::RaftNodeError;
use ledgermq_store::{FlushMode, StoreError};
use openraft::ServerState;

const T: Duration = Duration::from_secs(20);

/// A tmpfs of `size_mb` MiB mounted on a fresh directory, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size_mb: u64) -> Option<Self> {
        let dir = tempfile::tempdir().ok()?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mb}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Self { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Fills the file system holding `dir` with a file; returns its path.
fn fill(dir: &Path) -> PathBuf {
    let p = dir.join("filler");
    let mut f = std::fs::File::create(&p).unwrap();
    for chunk in [1 << 20, 4096, 512] {
        let buf = vec![7u8; chunk];
        while f.write_all(&buf).is_ok() {}
    }
    let _ = f.sync_all();
    p
}

/// A tmpfs for a test's stores, or None (with a note) when it cannot be mounted.
fn tmpfs_or_skip() -> Option<Tmpfs> {
    let fs = Tmpfs::mount(48);
    if fs.is_none() {
        eprintln!("SKIPPED: mounting a tmpfs needs root");
    }
    fs
}

/// A 3-node group stored on `fs` with the given disk settings, and `messages`
/// messages `a0`, `a1`, ... written to TopicA queue 0 and applied everywhere.
async fn started(
    fs: &Tmpfs,
    warning_ratio: f64,
    reserve_bytes: u64,
    messages: usize,
) -> (Cluster, u64) {
    let root = fs.path().to_path_buf();
    let c = Cluster::start_with(3, FlushMode::Sync, move |cfg| {
        cfg.store.root = root.join(format!("n{}", cfg.node_id));
        cfg.store.retention.disk_space_warning_ratio = warning_ratio;
        cfg.store.retention.disk_reserve_bytes = reserve_bytes;
    })
    .await;
    let leader = c.wait_leader(T).await;
    for i in 0..messages {
        c.node(leader)
            .write_messages(vec![message("TopicA", 0, &format!("a{i}"))])
            .await
            .unwrap();
    }
    c.wait_converged(T).await;
    (c, leader)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_that_cannot_be_applied_for_want_of_space_waits_and_stops_no_replica() {
    let Some(fs) = tmpfs_or_skip() else { return };
    // The admission check and the disk reserve off: the entry must reach apply
    // and find no space.
    let (c, leader) = started(&fs, 1.0, 0, 5).await;
    let filler = fill(fs.path());
    // A message to a new queue: its ConsumeQueue file cannot be created.
    let r = c
        .node(leader)
        .write_messages(vec![message("TopicC", 0, "c")])
        .await;
    assert!(r.is_err(), "{r:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    for id in 0..3 {
        let n = c.node(id);
        let state = n.raft().metrics().borrow().state;
        assert_ne!(state, ServerState::Shutdown, "node {id} stopped: {r:?}");
        let m = n.store().get_message("TopicA", 0, 0).unwrap();
        assert_eq!(m.view().body(), b"a0", "node {id} serves reads");
    }
    // Space comes back: the entry is applied everywhere.
    std::fs::remove_file(filler).unwrap();
    let deadline = Instant::now() + T;
    while (0..3).any(|id| c.node(id).store().queue_offsets("TopicC", 0).1 < 1) {
        assert!(Instant::now() < deadline, "the entry was not applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.node(leader)
        .write_messages(vec![message("TopicC", 0, "c2")])
        .await
        .unwrap();
    c.wait_converged(T).await;
    c.audit();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_new_messages_and_serves_reads() {
    let Some(fs) = tmpfs_or_skip() else { return };
    let (c, leader) = started(&fs, 0.90, 0, 1).await;
    let filler = fill(fs.path());
    // Disk usage is measured at most every 100 ms.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for id in 0..3 {
        let r = c
            .node(id)
            .write_messages(vec![message("TopicA", 0, "refused")])
            .await;
        // The leader refuses; a follower forwards it, whatever its own disk, and
        // reports the leader's refusal.
        if id == leader {
            assert!(
                matches!(r, Err(RaftNodeError::Store(StoreError::DiskFull { .. }))),
                "through the leader: {r:?}"
            );
        } else {
            assert!(
                matches!(r, Err(RaftNodeError::Forward { .. })),
                "through node {id}: {r:?}"
            );
        }
        let m = c.node(id).store().get_message("TopicA", 0, 0).unwrap();
        assert_eq!(m.view().body(), b"a0");
        assert_eq!(
            c.node(id).store().queue_offsets("TopicA", 0).1,
            1,
            "written"
        );
    }
    std::fs::remove_file(filler).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.node(leader)
        .write_messages(vec![message("TopicA", 0, "a1")])
        .await
        .unwrap();
    c.wait_converged(T).await;
    c.audit();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disk_reserve_lets_a_committed_entry_be_applied_on_a_full_disk() {
    let Some(fs) = tmpfs_or_skip() else { return };
    let (c, leader) = started(&fs, 1.0, 256 << 10, 1).await;
    let _filler = fill(fs.path());
    // A new queue's ConsumeQueue file finds no space until a reserve is released.
    c.node(leader)
        .write_messages(vec![message("TopicB", 0, "b")])
        .await
        .unwrap();
    c.wait_converged(T).await;
    let released = (0..3)
        .filter(|&id| !c.node(id).store().config().root.join("reserve").exists())
        .count();
    assert!(released > 0, "no node gave up its reserve");
    c.audit();
}

/// A 3-node group, each node on a tmpfs of its own (`fs[id]`), with RocketMQ's
/// admission limit (0.90) and a disk reserve of `reserve_bytes`; one message
/// written and applied everywhere.
async fn started_on_own_disks(fs: &[Tmpfs], reserve_bytes: u64) -> (Cluster, u64) {
    let roots: Vec<PathBuf> = fs.iter().map(|f| f.path().join("store")).collect();
    let c = Cluster::start_with(3, FlushMode::Sync, move |cfg| {
        cfg.store.root = roots[cfg.node_id as usize].clone();
        cfg.store.retention.disk_reserve_bytes = reserve_bytes;
        cfg.store.retention.disk_space_warning_ratio = 0.90;
    })
    .await;
    let leader = c.wait_leader(T).await;
    c.node(leader)
        .write_messages(vec![message("TopicA", 0, "a0")])
        .await
        .unwrap();
    c.wait_converged(T).await;
    (c, leader)
}

/// Three tmpfs mounts, or None (with a note) when they cannot be mounted.
fn own_disks_or_skip() -> Option<Vec<Tmpfs>> {
    let fs: Option<Vec<Tmpfs>> = (0..3).map(|_| Tmpfs::mount(48)).collect();
    if fs.is_none() {
        eprintln!("SKIPPED: mounting a tmpfs needs root");
    }
    fs
}

/// Waits until node `id`'s Raft has applied `index` or more.
async fn wait_applied(c: &Cluster, id: u64, index: u64) {
    let deadline = Instant::now() + T;
    loop {
        let m = c.node(id).raft().metrics().borrow().clone();
        assert_ne!(m.state, ServerState::Shutdown, "node {id} stopped");
        if m.last_applied.is_some_and(|l| l.index >= index) {
            return;
        }
        assert!(Instant::now() < deadline, "node {id} did not apply {index}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_whose_disk_is_full_stays_up_and_catches_up_once_space_is_freed() {
    let Some(fs) = own_disks_or_skip() else {
        return;
    };
    let (c, leader) = started_on_own_disks(&fs, 4 << 20).await;
    let full = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    let filler = fill(fs[full as usize].path());
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A new term: every node saves its vote (sled flushes), the full one included.
    c.node(leader)
        .transfer_leadership(Some(other), T)
        .await
        .unwrap();
    let leader = c.wait_leader(T).await;
    // More than its CommitLog can take (64 KiB segments, none made past the
    // 2 MiB kept for metadata): the group goes on without it.
    let body = "x".repeat(8000);
    for i in 0..400 {
        c.node(leader)
            .write_messages(vec![message("TopicA", 0, &format!("{i}{body}"))])
            .await
            .unwrap();
    }
    let last = c
        .node(leader)
        .raft()
        .metrics()
        .borrow()
        .last_log_index
        .unwrap();
    let behind = c
        .node(full)
        .raft()
        .metrics()
        .borrow()
        .last_log_index
        .unwrap();
    assert!(
        behind < last,
        "the full node took every entry: {behind} of {last}"
    );
    // Its reserve went to its metadata (checked once it is back: first, that it
    // did not stop).
    let kept_reserve = c.node(full).store().config().root.join("reserve").exists();
    // Space comes back: it catches up by itself, and its metadata is written.
    std::fs::remove_file(filler).unwrap();
    wait_applied(&c, full, last).await;
    c.node(leader)
        .write_messages(vec![message("TopicA", 0, "after")])
        .await
        .unwrap();
    c.wait_converged(T).await;
    assert!(!kept_reserve, "the full node kept its reserve");
    let saved = c.node(full).saved_commit_index().unwrap();
    assert!(saved >= Some(last), "{saved:?} < {last}");
    assert_eq!(
        c.queue_bodies(full, "TopicA", 0),
        c.queue_bodies(leader, "TopicA", 0)
    );
    c.audit();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_disk_is_full_hands_its_leadership_to_a_follower() {
    let Some(fs) = own_disks_or_skip() else {
        return;
    };
    let (c, leader) = started_on_own_disks(&fs, 4 << 20).await;
    let filler = fill(fs[leader as usize].path());
    // Within a few seconds another node leads and takes writes, through it and
    // through the full node alike.
    let deadline = Instant::now() + Duration::from_secs(10);
    let new_leader = loop {
        let l = c.wait_leader(T).await;
        if l != leader {
            break l;
        }
        assert!(
            Instant::now() < deadline,
            "the full leader kept its leadership"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for id in [new_leader, leader] {
        c.node(id)
            .write_messages(vec![message("TopicA", 0, &format!("via {id}"))])
            .await
            .unwrap();
    }
    // It does not take leadership back while its disk is full.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_ne!(c.wait_leader(T).await, leader);
    std::fs::remove_file(filler).unwrap();
    c.node(new_leader)
        .write_messages(vec![message("TopicA", 0, "after")])
        .await
        .unwrap();
    c.wait_converged(T).await;
    c.audit();
}
