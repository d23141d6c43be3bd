//! The retention fault: old CommitLog segments purged while a follower is down,
//! so the follower must catch up by snapshot when it returns.
//!
//! The broker offers no admin call to run retention and its config keeps reserve
//! times in hours; what the harness can trigger is RocketMQ's forced clean: once a
//! member's disk is fuller than `disk_force_clean_ratio` (0.85), each of its
//! retention runs ([`RETENTION_INTERVAL`] here) proposes the group's retention point through the
//! oldest segments (up to 10 a run), not only expired ones, but only as far as
//! every consumer group has consumed; every member then purges through it. The
//! harness forces it with a ballast that leaves [`LEAVE_RATIO`] of the leader's
//! own file system free (used 90 %, below the jepsen nodes' write refusal at
//! 99 %). The harness does not wait for the consumers: that forced cleaning spares
//! unconsumed messages is the product's promise, and the total-queue checker
//! counts an acknowledged message purged before it was consumed as lost.
//!
//! The follower is killed first; the ballast goes in once the segment being
//! written starts past where the follower's log ended, and stays until the
//! leader's log begins past the follower's last entry (the follower then needs
//! the snapshot to catch up) or [`GATE_WAIT`] has passed. The injection can
//! therefore take that long (the fault's window begins when it returns). Where the
//! workload's consumers fall behind its producers (debug builds on 2 cores: they
//! receive about 60 % of the acks while sending goes on), the purge may stop short
//! of the follower's end, and the detail says so.

use std::path::Path;
use std::time::Duration;

use ledgermq_proto::admin_pb::LogDigestRequest;

use crate::access::Access;
use crate::hosts::Network;
use crate::node_env::{fill_disk, free_disk, NODE_DISK_BYTES};
use crate::procs::{client_addr, Cluster, CLIENT_HOST};
use crate::workload::in_namespace;
use crate::JepsenError;

/// CommitLog segment size of the jepsen nodes, bytes: small, so a short run rolls
/// several segments and retention has some to delete.
pub const SEGMENT_BYTES: u64 = 64 << 10;

/// Period of the jepsen nodes' retention runs (mqbroker's `retention_interval_ms`;
/// 10 s by default): each run deletes at most 10 segments, so a purge past a
/// killed follower's end takes a few runs.
pub const RETENTION_INTERVAL: Duration = Duration::from_secs(2);

/// The fraction of the leader's file system the ballast leaves free.
pub const LEAVE_RATIO: f64 = 0.10;

/// How long the harness tries to force a deletion before giving up (the fault then
/// only keeps the follower down).
pub const GATE_WAIT: Duration = Duration::from_secs(40);

/// Between two looks at the leader's log.
pub const POLL: Duration = Duration::from_millis(200);

/// What the store logs when retention deleted segments.
const DELETED_MARKER: &str = "CommitLog segments deleted";

/// What the leader says of its log.
#[derive(Debug, Clone, Copy)]
struct LeaderLog {
    /// CommitLog offset where its last applied entry ends.
    applied_end: u64,
    /// Its last log index (no member holds a later entry: a follower's log ends
    /// at or before it).
    last_index: u64,
    /// Its first log index (past what it purged).
    first_index: u64,
}

/// The leader's log (None: no answer, or node `n` does not lead).
async fn ask(access: Access, addr: String) -> Option<LeaderLog> {
    let mut c = access
        .admin(&addr, Some(Duration::from_secs(2)))
        .await
        .ok()?;
    let d = c
        .log_digest(LogDigestRequest {
            from_index: u64::MAX,
            max_entries: 1,
        })
        .await
        .ok()?
        .into_inner();
    (d.error.is_empty() && d.leader_id == Some(d.node_id)).then_some(LeaderLog {
        applied_end: d.applied_end_offset,
        last_index: d.next_index.saturating_sub(1),
        first_index: d.first_index,
    })
}

/// Leader `n`'s log, asked from the clients' host (None: no answer within 2 s, or
/// node `n` no longer leads).
fn leader_log(c: &Cluster, net: &Network, n: usize) -> Option<LeaderLog> {
    let access = c.access().clone();
    in_namespace(&net.host_ns(CLIENT_HOST), move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(2), ask(access, client_addr(n))).await
        })
        .ok()
        .flatten()
    })
    .ok()
    .flatten()
}

fn deletions(dir: &Path, n: usize) -> Vec<String> {
    std::fs::read_to_string(dir.join(format!("n{n}.log")))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(DELETED_MARKER))
        .map(str::to_owned)
        .collect()
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Kills `follower`; once leader `leader`'s segment being written starts past
/// where the follower's log ended, puts the ballast in and keeps it until the
/// leader's log begins past the follower's last entry or [`GATE_WAIT`] has
/// passed since the kill. The follower stays down (the caller restarts it at the
/// heal). Returns what happened, in words.
pub fn force(
    c: &mut Cluster,
    net: &Network,
    leader: usize,
    follower: usize,
) -> Result<String, JepsenError> {
    c.kill(follower);
    // The follower must miss entries the purge takes. Asked after the kill, the
    // leader's last log index bounds every entry the follower got.
    let missed = leader_log(c, net, leader);
    let Some(LeaderLog {
        applied_end: missed_end,
        last_index: missed_index,
        ..
    }) = missed
    else {
        return Ok(format!(
            "node {follower} killed (SIGKILL); retention not forced: node {leader} (leader) did not say where its log ended"
        ));
    };
    let dir = c.dir().to_path_buf();
    let root = Cluster::store_root(&dir, leader);
    let first = crate::disk::segments(&root.join("commitlog"))?
        .first()
        .map_or(0, |s| s.0);
    let before = deletions(&dir, leader).len();
    let leave = (NODE_DISK_BYTES as f64 * LEAVE_RATIO) as u64;
    let give_up = now_ms() + GATE_WAIT.as_millis() as i64;
    let mut filled = None;
    let mut last = None;
    while now_ms() < give_up {
        let log = leader_log(c, net, leader);
        last = log.or(last);
        match (log, &filled) {
            (Some(l), _) if l.first_index > missed_index => break,
            (Some(l), None) if l.applied_end / SEGMENT_BYTES * SEGMENT_BYTES > missed_end => {
                filled = Some(fill_disk(&root, leave));
            }
            _ => {}
        }
        std::thread::sleep(POLL);
    }
    if filled.is_some() {
        free_disk(&root)?;
    }
    let took = filled.transpose()?;
    let logged: Vec<String> = deletions(&dir, leader)[before..]
        .iter()
        .map(|l| crate::reverts::strip_ansi(l))
        .collect();
    let killed = format!(
        "node {follower} killed (SIGKILL) (its log ending at or before index {missed_index}, CommitLog offset {missed_end})"
    );
    let Some(took) = took else {
        return Ok(format!(
            "{killed}; no ballast put on node {leader} (leader) within {} s: its segment being written never started past the follower's end",
            GATE_WAIT.as_secs()
        ));
    };
    let reach = match last {
        Some(l) if l.first_index > missed_index => format!(
            "its log now begins at index {} (the follower catches up by snapshot)",
            l.first_index
        ),
        Some(l) => format!(
            "its log begins at index {}, short of the follower's end (the consumers had not consumed further)",
            l.first_index
        ),
        None => "the leader did not answer".to_owned(),
    };
    Ok(format!(
        "{killed}; retention forced on node {leader} (leader, oldest segment {first}) with a ballast of {took} bytes leaving {leave}; {reach}; it logged: {}",
        if logged.is_empty() { "no deletion".to_owned() } else { logged.join(" | ") }
    ))
}
