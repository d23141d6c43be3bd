//! A node that lost entries it had acknowledged (a damaged CommitLog tail cut by
//! recovery) does not help elect a leader that lacks them (issue 13, item 3), under
//! SYNC_FLUSH (entries acknowledged once fsynced) and ASYNC_FLUSH (acknowledged once
//! written): after a crash of the process (the page cache keeps what it wrote) and
//! after a power loss (the machine restarts without what it had not fsynced).

mod common;

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use common::{message, Cluster};
use ledgermq_store::FlushMode;

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lost_acknowledged_entries_does_not_elect_a_leader_without_them() {
    lost_tail_keeps_acknowledged_entries(FlushMode::Sync, Loss::FlippedBit).await;
}

/// Under ASYNC_FLUSH an entry is acknowledged once written, before any fsync: the
/// mark must record it then, not at the next periodic flush (which, here, never
/// comes), or recovery cuts acknowledged entries without the node knowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_async_flush_a_node_that_lost_acknowledged_entries_does_not_elect_a_leader_without_them(
) {
    lost_tail_keeps_acknowledged_entries(FlushMode::Async, Loss::FlippedBit).await;
}

/// Under ASYNC_FLUSH a power loss takes the written entries and the acknowledged
/// mark alike (neither was fsynced): the durable bound written ahead of the mark,
/// from another boot, tells the node what it may have acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_async_flush_a_node_that_lost_power_does_not_elect_a_leader_without_what_it_acknowledged(
) {
    lost_tail_keeps_acknowledged_entries(FlushMode::Async, Loss::Power).await;
}

/// How the leader loses its tail.
#[derive(Clone, Copy, PartialEq)]
enum Loss {
    /// A bit flipped in the first entry of the tail; the process crashed.
    FlippedBit,
    /// The machine lost power: nothing since the last fsync is left (here: the
    /// tail is zeroed and the acknowledged mark too, none having been fsynced),
    /// and it boots with a new boot id.
    Power,
}

/// The tests set the process's boot id variable: one at a time when several run
/// in one process (`cargo test`; nextest runs each in its own).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn lost_tail_keeps_acknowledged_entries(flush: FlushMode, loss: Loss) {
    let _one = ONE_AT_A_TIME.lock().await;
    // Every node reads its boot id from this file (the leader "reboots" below).
    let boot = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(boot.path(), "boot-1").unwrap();
    std::env::set_var(ledgermq_store::fault_hooks::BOOT_ID_FILE_ENV, boot.path());
    // No periodic checkpoint (nor, under ASYNC_FLUSH, periodic flush): recovery
    // scans (and cuts at) the damaged tail.
    let mut c = Cluster::start_with(3, flush, |cfg| {
        cfg.store.flush_interval_ms = 3_600_000;
    })
    .await;
    let leader = c.wait_leader(T).await;
    let f1 = (leader + 1) % 3;
    let f2 = (leader + 2) % 3;
    let mut acked = Vec::new();
    for i in 0..20 {
        let body = format!("before-{i}");
        c.node(leader)
            .write_messages(vec![message("TopicL", 0, &body)])
            .await
            .unwrap();
        acked.push(body);
    }
    c.wait_converged(T).await;
    // F2 falls behind; entries e commit on the leader and F1.
    c.filter.isolate(f2, [leader, f1]);
    let first_e = c.node(leader).store().commit_log().next_log_index();
    for i in 0..30 {
        let body = format!("e-{i}");
        c.node(leader)
            .write_messages(vec![message("TopicL", 0, &body)])
            .await
            .unwrap();
        acked.push(body);
    }
    // Where the first of them lies in the leader's CommitLog.
    let (path, pos) = {
        let log = c.node(leader).store().commit_log();
        let loc = log.entry_location(first_e).unwrap();
        let seg = log.segments().find(loc.physical_offset).unwrap();
        (
            seg.path().to_path_buf(),
            loc.physical_offset - seg.start_offset() + 40,
        )
    };
    c.crash(leader).await;
    c.crash(f1).await;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .open(&path)
        .unwrap();
    match loss {
        // A flipped bit in acknowledged data (fsynced under SYNC_FLUSH).
        Loss::FlippedBit => {
            let mut b = [0u8; 1];
            f.read_exact_at(&mut b, pos).unwrap();
            f.write_all_at(&[b[0] ^ 0x10], pos).unwrap();
        }
        Loss::Power => {
            let len = f.metadata().unwrap().len();
            let from = pos - 40;
            f.write_all_at(&vec![0u8; (len - from) as usize], from)
                .unwrap();
            let dir = path.parent().unwrap();
            for later in std::fs::read_dir(dir).unwrap() {
                let later = later.unwrap().path();
                if later.file_name() > path.file_name() {
                    std::fs::remove_file(later).unwrap();
                }
            }
            let root = dir.parent().unwrap();
            std::fs::write(root.join("ack_mark"), [0u8; 20]).unwrap();
            std::fs::write(boot.path(), "boot-2").unwrap();
        }
    }
    drop(f);
    // It restarts at once, with only the lagging F2 to talk to.
    c.filter.heal();
    c.restart(leader).await;
    assert!(
        c.node(leader).store().commit_log().next_log_index() <= first_e,
        "recovery cut the damaged tail"
    );
    let deadline = Instant::now() + Duration::from_secs(4);
    while Instant::now() < deadline {
        for id in [leader, f2] {
            let n = c.node(id);
            if n.is_leader() {
                let last = n.raft().metrics().borrow().last_log_index.unwrap_or(0);
                assert!(
                    last >= first_e + 29,
                    "node {id} leads with a log ending at {last}, without acknowledged entries from {first_e}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // F1 comes back (it did not lose power): the group leads on with every
    // acknowledged message.
    std::fs::write(boot.path(), "boot-1").unwrap();
    c.restart(f1).await;
    c.wait_leader(T).await;
    let p = c
        .node(f2)
        .write_messages(vec![message("TopicL", 0, "after")])
        .await
        .unwrap();
    acked.push("after".into());
    assert_eq!(p[0].queue_offset, 50);
    c.wait_converged(T).await;
    c.audit();
    for id in 0..3 {
        assert_eq!(c.queue_bodies(id, "TopicL", 0), acked, "node {id}");
    }
}
