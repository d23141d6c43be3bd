//! A full disk refuses new messages with a clear error and keeps serving reads; a
//! committed entry that cannot be applied for want of space waits for space
//! instead of stopping every replica at the same entry (issue 13, item 7).
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
        assert!(
            matches!(r, Err(RaftNodeError::Store(StoreError::DiskFull { .. }))),
            "through node {id}: {r:?}"
        );
        let m = c.node(id).store().get_message("TopicA", 0, 0).unwrap();
        assert_eq!(m.view().body(), b"a0");
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
