//! The drain's end: after the producers stop, consumers go on until every queue's
//! committed consumer offset has reached the queue's end as the broker reports it
//! (the ConsumerProgress admin call), not only until every acknowledged send was
//! seen. A queue still short when the drain gives up is a finding: messages that
//! were stored but never consumed (stuck behind a lease, an offset never
//! committed, a message that cannot be delivered).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ledgermq_proto::admin_pb::{ConsumerProgressRequest, QueueProgress};
use serde::Serialize;

use crate::access::Access;

/// How often the drain asks for the groups' progress.
pub const POLL_INTERVAL: Duration = Duration::from_millis(1000);

/// Deadline of one node's answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// What the drain saw last.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DrainOutcome {
    /// Every queue of every (group, topic) reached its end.
    pub reached: bool,
    /// The queues that did not, in words (empty when `reached`).
    pub short_queues: Vec<String>,
    /// The applied index of the node whose progress was read last.
    pub applied_index: Option<u64>,
}

/// The queues of `progress` whose committed consumer offset is not at the queue's
/// end, in words (`group` names the consumer group): short of it (messages never
/// consumed) or past it (an offset pointing past the recovered log, which would
/// skip the messages stored there next).
pub fn short_queues(group: &str, progress: &[QueueProgress]) -> Vec<String> {
    progress
        .iter()
        .filter_map(|q| {
            let consumed = q.consumer_offset.unwrap_or(q.min_offset);
            let (topic, id, end) = (&q.topic, q.queue_id, q.broker_offset);
            match consumed.cmp(&end) {
                std::cmp::Ordering::Less => Some(format!(
                    "{group} on {topic}#{id}: consumer offset {consumed}, queue end {end} ({} never consumed)",
                    end - consumed
                )),
                std::cmp::Ordering::Greater => Some(format!(
                    "{group} on {topic}#{id}: consumer offset {consumed} past the queue end {end}"
                )),
                std::cmp::Ordering::Equal => None,
            }
        })
        .collect()
}

/// One node's progress of `group` on `topic`: (applied index, queues).
async fn ask(
    access: &Access,
    addr: &str,
    group: &str,
    topic: &str,
) -> Option<(Option<u64>, Vec<QueueProgress>)> {
    let call = async {
        let mut c = access.admin(addr, Some(CALL_TIMEOUT)).await.ok()?;
        let r = c
            .consumer_progress(ConsumerProgressRequest {
                group: group.into(),
                topic: topic.into(),
            })
            .await
            .ok()?
            .into_inner();
        r.error.is_empty().then_some((r.applied_index, r.queues))
    };
    tokio::time::timeout(CALL_TIMEOUT, call).await.ok()?
}

/// The progress of every (group, topic) in `pairs` as the most advanced node that
/// answers for all of them has applied it (offsets are replicated: a node behind
/// would report a stale view). None if no node answered for every pair.
pub async fn progress(
    access: &Access,
    nodes: &[String],
    pairs: &[(String, String)],
) -> Option<DrainOutcome> {
    let mut best: Option<DrainOutcome> = None;
    for addr in nodes {
        let mut short = Vec::new();
        let mut applied = None;
        let mut all = true;
        for (group, topic) in pairs {
            match ask(access, addr, group, topic).await {
                Some((a, queues)) => {
                    applied = applied.max(a);
                    short.extend(short_queues(group, &queues));
                }
                None => all = false,
            }
        }
        if !all {
            continue;
        }
        if best.as_ref().is_none_or(|b| applied > b.applied_index) {
            best = Some(DrainOutcome {
                reached: short.is_empty(),
                short_queues: short,
                applied_index: applied,
            });
        }
    }
    best
}

/// Polls [`progress`] every [`POLL_INTERVAL`] until `stop` is set, keeping `done`
/// true while the last reading had every queue at its end; returns the last
/// reading (None if no node ever answered).
pub async fn watch(
    access: Access,
    nodes: Vec<String>,
    pairs: Vec<(String, String)>,
    done: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> Option<DrainOutcome> {
    let mut last = None;
    while !stop.load(Ordering::Relaxed) {
        if let Some(p) = progress(&access, &nodes, &pairs).await {
            done.store(p.reached, Ordering::Relaxed);
            last = Some(p);
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    // One last reading after the consumers stopped.
    progress(&access, &nodes, &pairs).await.or(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_is_short_until_the_committed_offset_reaches_its_end() {
        let q = |queue_id, min_offset, broker_offset, consumer_offset| QueueProgress {
            topic: "T".into(),
            queue_id,
            min_offset,
            broker_offset,
            consumer_offset,
        };
        let p = [
            q(0, 0, 10, Some(10)),
            q(1, 0, 10, Some(9)),
            // Never committed: consumption starts at the queue's start.
            q(2, 4, 4, None),
            q(3, 4, 6, None),
        ];
        let s = short_queues("G", &p);
        assert_eq!(s.len(), 2, "{s:?}");
        assert!(s[0].starts_with("G on T#1: consumer offset 9, queue end 10"));
        assert!(s[1].starts_with("G on T#3: consumer offset 4, queue end 6"));
        assert!(short_queues("G", &p[..1]).is_empty());
        // An offset past the end (pointing past the recovered log) is a finding too.
        let s = short_queues("G", &[q(4, 0, 10, Some(12))]);
        assert_eq!(
            s,
            vec!["G on T#4: consumer offset 12 past the queue end 10"]
        );
    }
}
