//! The retention fault: old CommitLog segments purged on the leader while a
//! follower is down, so the follower must catch up by snapshot when it returns.
//!
//! **Today this forces nothing**: forced cleaning is off by default (the store's
//! `disk_force_clean_ratio` is 1.0 since it crash-looped a node whose disk alone
//! filled: docs/jepsen.md) and the broker's config does not expose it, so the
//! fault kills a follower and fills the leader's disk for a moment, and reports
//! that no retention run deleted anything. What follows is the design it keeps
//! for when forcing can be turned on per node.
//!
//! The broker offers no admin call to run retention and its config exposes no
//! reserve time; what it can offer is RocketMQ's forced clean: once the store's
//! disk is fuller than `diskSpaceCleanForciblyRatio` (0.85), each retention run
//! (every 10 s from the node's start) deletes the oldest segments (up to 10)
//! whether expired or not, never the one being written. The harness forces it
//! with a ballast that leaves [`LEAVE_RATIO`] of the leader's own file system
//! free (used 90 %, below the jepsen nodes' write refusal at 99 %), put in shortly
//! before a run (predicted from the time the node logged its start) and taken out
//! as soon as the leader logs a deletion, or shortly after the run.
//!
//! Retention deletes messages whether consumed or not (RocketMQ semantics), and
//! the total-queue checker would count an acknowledged message purged before it
//! was consumed as lost. So the ballast goes in only while every consumer group has
//! consumed everything before the segment being written ([`consumed_below`] over
//! the leader's ConsumeQueue files, at or past that segment's start), and is taken
//! out again at once when a segment roll leaves a closed segment not yet
//! consumed. The check and the node's retention run are not atomic: a roll and a
//! retention run within one poll ([`POLL`]) of each other could still purge a
//! message consumed a moment later.
//!
//! The follower is killed first and the purge waits until the segment being
//! written starts past where its log ended, so the purge takes entries it lacks.
//! The injection can therefore take up to [`GATE_WAIT`] (the fault's window
//! begins when it returns). Where the workload's consumers fall behind its
//! producers (debug builds on 2 cores: they receive about 60 % of the acks while
//! sending goes on), the groups catch up only once sending stops, so a retention
//! fault drawn early forces nothing and says so; one that reaches the drain does.

use std::path::Path;
use std::time::Duration;

use ledgermq_broker::admin_pb::broker_admin_client::BrokerAdminClient;
use ledgermq_broker::admin_pb::{ConsumerProgressRequest, LogDigestRequest, QueueProgress};

use crate::hosts::Network;
use crate::node_env::{fill_disk, free_disk, NODE_DISK_BYTES};
use crate::procs::{client_addr, Cluster, CLIENT_HOST};
use crate::workload::in_namespace;
use crate::JepsenError;

/// CommitLog segment size of the jepsen nodes, bytes: small, so a short run rolls
/// several segments and retention has some to delete.
pub const SEGMENT_BYTES: u64 = 64 << 10;

/// The fraction of the leader's file system the ballast leaves free.
pub const LEAVE_RATIO: f64 = 0.10;

/// How long the harness waits for the consumers to be caught up before giving up
/// (the fault then only keeps the follower down).
pub const GATE_WAIT: Duration = Duration::from_secs(40);

/// Between two checks of the consumers and the leader's log.
pub const POLL: Duration = Duration::from_millis(200);

/// The consumer groups and topics of the workload.
const GROUPS: [(&str, &str); 2] = [("JGroup", "JNormal"), ("JFifoGroup", "JFifo")];

/// What the store logs when retention deleted segments.
const DELETED_MARKER: &str = "CommitLog segments deleted";

/// Bytes per ConsumeQueue entry and entries per file (the store's defaults).
const CQ_ENTRY: u64 = 20;
const CQ_FILE_ENTRIES: u64 = 300_000;

/// The CommitLog offset of the first message a queue's consumers have not
/// consumed: ConsumeQueue entry `offset` of `<root>/consumequeue/<topic>/<queue>`.
fn physical_offset(root: &Path, topic: &str, queue: i32, offset: u64) -> std::io::Result<u64> {
    use std::os::unix::fs::FileExt;
    let byte = offset * CQ_ENTRY;
    let file_start = byte / (CQ_ENTRY * CQ_FILE_ENTRIES) * (CQ_ENTRY * CQ_FILE_ENTRIES);
    let path = root
        .join("consumequeue")
        .join(topic)
        .join(queue.to_string())
        .join(format!("{file_start:020}"));
    let mut b = [0u8; 8];
    std::fs::File::open(path)?.read_exact_at(&mut b, byte - file_start)?;
    Ok(u64::from_be_bytes(b))
}

/// The CommitLog offset below which every queue of `progress` is consumed: the
/// least offset of a queue's first unconsumed message (`u64::MAX` when all are
/// consumed), read from the ConsumeQueue files under `root`.
pub fn consumed_below(root: &Path, progress: &[QueueProgress]) -> std::io::Result<u64> {
    let mut below = u64::MAX;
    for q in progress {
        let c = q.consumer_offset.unwrap_or(q.min_offset).max(q.min_offset);
        if c < q.broker_offset {
            below = below.min(physical_offset(root, &q.topic, q.queue_id, c)?);
        }
    }
    Ok(below)
}

/// What the leader says: every group's progress and its applied CommitLog end.
struct LeaderView {
    progress: Vec<QueueProgress>,
    applied_end: u64,
}

async fn ask(addr: String) -> Option<LeaderView> {
    let mut c = BrokerAdminClient::connect(format!("http://{addr}"))
        .await
        .ok()?;
    let mut progress = Vec::new();
    for (group, topic) in GROUPS {
        // The group's own topic, and every topic it committed an offset in (its
        // retry topic, if it has one).
        for t in [topic, ""] {
            let r = c
                .consumer_progress(ConsumerProgressRequest {
                    group: group.into(),
                    topic: t.into(),
                })
                .await
                .ok()?
                .into_inner();
            if !r.error.is_empty() {
                return None;
            }
            progress.extend(r.queues);
        }
    }
    let d = c
        .log_digest(LogDigestRequest {
            from_index: u64::MAX,
            max_entries: 1,
        })
        .await
        .ok()?
        .into_inner();
    (d.error.is_empty() && d.leader_id == Some(d.node_id)).then_some(LeaderView {
        progress,
        applied_end: d.applied_end_offset,
    })
}

/// The leader's view, asked from the clients' host (None: no answer within 2 s,
/// or node `n` no longer leads).
fn leader_view(net: &Network, n: usize) -> Option<LeaderView> {
    in_namespace(&net.host_ns(CLIENT_HOST), move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(2), ask(client_addr(n))).await
        })
        .ok()
        .flatten()
    })
    .ok()
    .flatten()
}

/// Whether retention may run on leader `n` now: (guard holds, the start of the
/// segment being written, what is consumed below). None when the leader does not
/// answer.
fn guard(net: &Network, root: &Path, n: usize) -> Option<(bool, u64, u64)> {
    let v = leader_view(net, n)?;
    let current = v.applied_end / SEGMENT_BYTES * SEGMENT_BYTES;
    let below = consumed_below(root, &v.progress).ok()?;
    Some((below >= current, current, below))
}

fn deletions(dir: &Path, n: usize) -> Vec<String> {
    std::fs::read_to_string(dir.join(format!("n{n}.log")))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(DELETED_MARKER))
        .map(str::to_owned)
        .collect()
}

/// The period of a node's retention runs (mqbroker's `retention_interval_ms`).
pub const RETENTION_PERIOD: Duration = Duration::from_secs(10);

/// How long before a predicted retention run the ballast goes in, and how long
/// after it it stays at most.
const BEFORE_RUN: Duration = Duration::from_millis(1500);
const AFTER_RUN: Duration = Duration::from_millis(1500);

/// What node logs once when it has started (its retention runs then follow every
/// [`RETENTION_PERIOD`], the first one period later).
const STARTED_MARKER: &str = "mqbroker started";

/// The wall-clock time (ms since the Unix epoch) of the last line containing
/// `marker` in a node's log (tracing's lines: an RFC 3339 timestamp first,
/// possibly in ANSI colour codes).
pub fn last_logged_ms(log: &str, marker: &str) -> Option<i64> {
    let line = log.lines().rev().find(|l| l.contains(marker))?;
    crate::reverts::line_time_ms(line)
}

/// The first retention run of a node started at `started_ms` that comes at or
/// after `after_ms` (ms since the Unix epoch).
pub fn next_run_ms(started_ms: i64, after_ms: i64) -> i64 {
    let period = RETENTION_PERIOD.as_millis() as i64;
    let k = ((after_ms - started_ms).max(0) + period - 1) / period;
    started_ms + k.max(1) * period
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn sleep_until_ms(t: i64) {
    let left = t - now_ms();
    if left > 0 {
        std::thread::sleep(Duration::from_millis(left as u64));
    }
}

/// Kills `follower`, then at each retention run of leader `leader` (predicted
/// from when it logged its start) until one deletes segments or [`GATE_WAIT`]
/// has passed: once the segment being written starts past where the follower's
/// log ended (so the purge takes entries it lacks) and every group has consumed
/// what precedes that segment, puts the ballast in from [`BEFORE_RUN`] before the run until the
/// deletion is logged or [`AFTER_RUN`] after it, taking it out at once if a
/// segment roll breaks that (see the module docs). The follower stays down (the
/// caller restarts it at the heal). Returns what happened, in words.
pub fn force(
    c: &mut Cluster,
    net: &Network,
    leader: usize,
    follower: usize,
) -> Result<String, JepsenError> {
    // The follower must miss entries the purge takes: the leader's log end now.
    let missed_from = leader_view(net, leader).map_or(0, |v| v.applied_end);
    c.kill(follower);
    let dir = c.dir().to_path_buf();
    let root = Cluster::store_root(&dir, leader);
    let log = dir.join(format!("n{leader}.log"));
    let started = last_logged_ms(&std::fs::read_to_string(&log)?, STARTED_MARKER)
        .ok_or_else(|| JepsenError::Host(format!("{}: no start line", log.display())))?;
    let first = crate::disk::segments(&root.join("commitlog"))?
        .first()
        .map_or(0, |s| s.0);
    let before = deletions(&dir, leader).len();
    let leave = (NODE_DISK_BYTES as f64 * LEAVE_RATIO) as u64;
    let give_up = now_ms() + GATE_WAIT.as_millis() as i64;
    let mut tries = Vec::new();
    let mut outcome = None;
    while outcome.is_none() && now_ms() < give_up {
        let run = next_run_ms(started, now_ms() + BEFORE_RUN.as_millis() as i64 + 200);
        sleep_until_ms(run - BEFORE_RUN.as_millis() as i64);
        match guard(net, &root, leader) {
            Some((true, current, _)) if current > first && current > missed_from => {}
            Some((_, current, below)) => {
                tries.push(format!(
                    "run at {run} ms: not forced (segment being written starts at {current}, consumed below {}, oldest segment {first}, the follower's log ends near {missed_from})",
                    if below == u64::MAX { "the end".to_owned() } else { below.to_string() }
                ));
                continue;
            }
            None => {
                tries.push(format!(
                    "run at {run} ms: not forced (the leader did not answer)"
                ));
                continue;
            }
        }
        let filled = fill_disk(&root, leave);
        let mut held = true;
        while filled.is_ok() && now_ms() < run + AFTER_RUN.as_millis() as i64 {
            let now = deletions(&dir, leader);
            if now.len() > before {
                outcome = Some(now[before..].join(" | "));
                break;
            }
            if let Some((false, current, below)) = guard(net, &root, leader) {
                held = false;
                tries.push(format!(
                    "run at {run} ms: aborted, a segment roll left messages below {current} unconsumed (consumed below {below})"
                ));
                break;
            }
            std::thread::sleep(POLL);
        }
        free_disk(&root)?;
        let took = filled?;
        if held && outcome.is_none() {
            tries.push(format!(
                "run at {run}: ballast of {took} bytes, no deletion logged"
            ));
        }
    }
    let killed = format!("node {follower} killed (SIGKILL)");
    Ok(match outcome {
        Some(line) => format!(
            "{killed} (its log ending near CommitLog offset {missed_from}); retention forced on node {leader} (leader, oldest segment {first}) with a ballast leaving {leave} bytes while every group had consumed up to the segment being written; it logged: {}{}",
            crate::reverts::strip_ansi(&line),
            if tries.is_empty() { String::new() } else { format!(" (earlier: {})", tries.join("; ")) }
        ),
        None => format!(
            "{killed}; retention not forced on node {leader} (leader) within {} s: {}",
            GATE_WAIT.as_secs(),
            tries.join("; ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_runs_are_predicted_from_the_start_line() {
        let log = "\u{1b}[2m2026-12-01T17:03:32.740121Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m mqbroker: mqbroker started node=1\nmqbroker broker-a node 1 started\n";
        let t = last_logged_ms(log, STARTED_MARKER).unwrap();
        assert_eq!(t % 1000, 740);
        assert_eq!(last_logged_ms("nothing\n", STARTED_MARKER), None);
        assert_eq!(
            next_run_ms(1_000, 1_000),
            11_000,
            "the first run is a period in"
        );
        assert_eq!(next_run_ms(1_000, 11_000), 11_000);
        assert_eq!(next_run_ms(1_000, 11_001), 21_000);
    }

    #[test]
    fn consumed_below_reads_the_first_unconsumed_entrys_offset() {
        let dir = tempfile::tempdir().unwrap();
        let q = dir.path().join("consumequeue/T/1");
        std::fs::create_dir_all(&q).unwrap();
        let mut cq = Vec::new();
        for phys in [100u64, 300, 500] {
            cq.extend(phys.to_be_bytes());
            cq.extend(64u32.to_be_bytes());
            cq.extend(0u64.to_be_bytes());
        }
        std::fs::write(q.join(format!("{:020}", 0)), &cq).unwrap();
        let p = |consumer_offset, broker_offset| QueueProgress {
            topic: "T".into(),
            queue_id: 1,
            min_offset: 0,
            broker_offset,
            consumer_offset,
        };
        assert_eq!(consumed_below(dir.path(), &[p(Some(1), 3)]).unwrap(), 300);
        assert_eq!(consumed_below(dir.path(), &[p(None, 3)]).unwrap(), 100);
        assert_eq!(
            consumed_below(dir.path(), &[p(Some(3), 3)]).unwrap(),
            u64::MAX
        );
        assert_eq!(
            consumed_below(dir.path(), &[p(Some(3), 3), p(Some(2), 3)]).unwrap(),
            500
        );
    }
}
