//! The replica audit: after healing, every replica holds the same committed prefix
//! (log index, term, CRC32 of the entry's records), and no ConsumeQueue holds an
//! entry past what its node has applied (apply follows commit, so past the commit
//! index either). [`fetch`] asks each node for its view (the LogDigest admin call);
//! [`check`] is a plain function of those views.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ledgermq_broker::admin_pb::broker_admin_client::BrokerAdminClient;
use ledgermq_broker::admin_pb::{EntryDigest, LogDigestRequest, LogDigestResponse};
use serde::Serialize;

use crate::checker::note_example;
use crate::JepsenError;

/// One node's view: its state and the digests of the entries it holds.
#[derive(Debug, Clone)]
pub struct NodeView {
    /// The node's answer to the first LogDigest call (queue tails, indexes).
    pub state: LogDigestResponse,
    /// Digests of every entry it holds, in order.
    pub entries: Vec<EntryDigest>,
}

/// Findings of the replica audit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReplicaAudit {
    /// Nodes audited.
    pub nodes: usize,
    /// The committed prefix compared: log indexes `[from, through]` held by every
    /// node (`through` is the lowest applied index).
    pub compared_from: u64,
    /// Last log index compared.
    pub compared_through: Option<u64>,
    /// Entries compared on every node.
    pub entries_compared: u64,
    /// Log indexes whose (term, CRC) differ between nodes, or that a node lacks.
    pub divergent_entries: u64,
    /// ConsumeQueue entries pointing past their node's last applied entry.
    pub queue_entries_past_commit: u64,
    /// Message queues whose length differs between nodes at the same applied index.
    pub queue_length_mismatches: u64,
    /// Nodes that had applied less than the most advanced node when audited (after
    /// the settle wait), or nothing at all: a replica that never caught up, whose
    /// unapplied part the comparison above cannot see.
    pub lagging_nodes: u64,
    /// A few findings, in words.
    pub examples: Vec<String>,
    /// Nothing divergent, nothing past the commit index, queues agree, no node
    /// lagging.
    pub valid: bool,
}

/// Runs the audit over the nodes' views.
pub fn check(views: &[NodeView]) -> ReplicaAudit {
    let mut r = ReplicaAudit {
        nodes: views.len(),
        ..Default::default()
    };
    let note = |r: &mut ReplicaAudit, s: String| note_example(&mut r.examples, s);
    let from = views.iter().map(|v| v.state.first_index).max().unwrap_or(0);
    let through = views.iter().map(|v| v.state.applied_index).min().flatten();
    r.compared_from = from;
    r.compared_through = through;
    if let Some(through) = through {
        let maps: Vec<BTreeMap<u64, (u64, u32)>> = views
            .iter()
            .map(|v| {
                v.entries
                    .iter()
                    .map(|e| (e.log_index, (e.term, e.crc32)))
                    .collect()
            })
            .collect();
        for index in from..=through {
            let got: Vec<Option<&(u64, u32)>> = maps.iter().map(|m| m.get(&index)).collect();
            r.entries_compared += 1;
            if got.iter().any(Option::is_none) || got.windows(2).any(|w| w[0] != w[1]) {
                r.divergent_entries += 1;
                note(
                    &mut r,
                    format!("log index {index}: (term, crc) per node {got:?}"),
                );
            }
        }
    }
    for v in views {
        let s = &v.state;
        for q in &s.queues {
            if let Some(p) = q.last_physical_offset {
                if s.applied_index.is_none() || p >= s.applied_end_offset {
                    r.queue_entries_past_commit += 1;
                    note(
                        &mut r,
                        format!(
                            "node {}: {}#{} has an entry at CommitLog offset {p}, past the applied end {} (applied index {:?})",
                            s.node_id, q.topic, q.queue_id, s.applied_end_offset, s.applied_index
                        ),
                    );
                }
            }
        }
    }
    let most = views.iter().filter_map(|v| v.state.applied_index).max();
    for v in views
        .iter()
        .filter(|v| most.is_some() && v.state.applied_index != most)
    {
        r.lagging_nodes += 1;
        note_example(
            &mut r.examples,
            format!(
                "node {} applied through {:?}, others through {most:?}",
                v.state.node_id, v.state.applied_index
            ),
        );
    }
    // Queue lengths agree between nodes that applied the same entries.
    let mut by_applied: BTreeMap<Option<u64>, Vec<&NodeView>> = BTreeMap::new();
    for v in views {
        by_applied.entry(v.state.applied_index).or_default().push(v);
    }
    for group in by_applied.values().filter(|g| g.len() > 1) {
        let lens = |v: &NodeView| -> BTreeMap<(String, i32), u64> {
            v.state
                .queues
                .iter()
                .filter(|q| q.max_offset > 0)
                .map(|q| ((q.topic.clone(), q.queue_id), q.max_offset))
                .collect()
        };
        let first = lens(group[0]);
        for v in &group[1..] {
            let other = lens(v);
            let keys: std::collections::BTreeSet<_> = first.keys().chain(other.keys()).collect();
            for key in keys {
                if first.get(key) != other.get(key) {
                    r.queue_length_mismatches += 1;
                    note(
                        &mut r,
                        format!(
                            "{}#{}: node {} holds {:?} entries, node {} holds {:?}",
                            key.0,
                            key.1,
                            group[0].state.node_id,
                            first.get(key),
                            v.state.node_id,
                            other.get(key)
                        ),
                    );
                }
            }
        }
    }
    r.valid = r.divergent_entries == 0
        && r.queue_entries_past_commit == 0
        && r.queue_length_mismatches == 0
        && r.lagging_nodes == 0;
    r
}

async fn digest(
    addr: &str,
    from_index: u64,
    max_entries: u32,
) -> Result<LogDigestResponse, JepsenError> {
    let mut c = BrokerAdminClient::connect(format!("http://{addr}"))
        .await
        .map_err(|e| JepsenError::Host(format!("{addr}: {e}")))?
        .max_decoding_message_size(64 << 20);
    let r = c
        .log_digest(LogDigestRequest {
            from_index,
            max_entries,
        })
        .await
        .map_err(|s| JepsenError::Host(format!("{addr}: {}", s.message())))?
        .into_inner();
    if !r.error.is_empty() {
        return Err(JepsenError::Host(format!("{addr}: {}", r.error)));
    }
    Ok(r)
}

/// Waits (up to `timeout`) until every node answers and all have applied the same
/// entries, twice in a row 500 ms apart; returns the last answers (with whatever was
/// reached when the time ran out). Call from inside the clients' namespace.
pub async fn settle(nodes: &[String], timeout: Duration) -> Vec<Option<LogDigestResponse>> {
    let deadline = Instant::now() + timeout;
    let mut last: Option<Vec<Option<u64>>> = None;
    loop {
        let mut states = Vec::new();
        for n in nodes {
            states.push(digest(n, u64::MAX, 1).await.ok());
        }
        let applied: Vec<Option<u64>> = states
            .iter()
            .map(|s| s.as_ref().and_then(|s| s.applied_index))
            .collect();
        let agreed = states.iter().all(Option::is_some)
            && applied.windows(2).all(|w| w[0] == w[1])
            && last.as_ref() == Some(&applied);
        if agreed || Instant::now() > deadline {
            return states;
        }
        last = Some(applied);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Fetches every node's view: state and all entry digests, in pages. Call from
/// inside the clients' namespace. Error: a node did not answer.
pub async fn fetch(nodes: &[String]) -> Result<Vec<NodeView>, JepsenError> {
    let mut out = Vec::new();
    for n in nodes {
        let state = digest(n, u64::MAX, 1).await?;
        let mut entries: Vec<EntryDigest> = Vec::new();
        let mut from = state.first_index;
        while from < state.next_index {
            let page = digest(n, from, 50_000).await?.entries;
            match page.last() {
                Some(l) => from = l.log_index + 1,
                None => break,
            }
            entries.extend(page);
        }
        out.push(NodeView { state, entries });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ledgermq_broker::admin_pb::QueueTail;

    fn view(id: u64, applied: u64, entries: &[(u64, u64, u32)], queue: (u64, u64)) -> NodeView {
        NodeView {
            state: LogDigestResponse {
                node_id: id,
                first_index: 0,
                next_index: entries.len() as u64,
                applied_index: Some(applied),
                applied_end_offset: 1000,
                queues: vec![QueueTail {
                    topic: "T".into(),
                    queue_id: 0,
                    max_offset: queue.0,
                    last_physical_offset: Some(queue.1),
                }],
                ..Default::default()
            },
            entries: entries
                .iter()
                .map(|&(log_index, term, crc32)| EntryDigest {
                    log_index,
                    term,
                    crc32,
                })
                .collect(),
        }
    }

    #[test]
    fn identical_replicas_pass() {
        let e = [(0, 1, 7), (1, 1, 8), (2, 2, 9)];
        let r = check(&[view(0, 2, &e, (3, 900)), view(1, 2, &e, (3, 900))]);
        assert!(r.valid, "{r:?}");
        assert_eq!(r.entries_compared, 3);
    }

    #[test]
    fn divergence_queue_overrun_and_length_mismatch_are_found() {
        let a = [(0, 1, 7), (1, 1, 8), (2, 2, 9)];
        let b = [(0, 1, 7), (1, 1, 5), (2, 2, 9)];
        let r = check(&[view(0, 2, &a, (3, 900)), view(1, 2, &b, (3, 900))]);
        assert_eq!((r.divergent_entries, r.valid), (1, false));
        let r = check(&[view(0, 2, &a, (3, 1000)), view(1, 2, &a, (3, 900))]);
        assert_eq!(r.queue_entries_past_commit, 1);
        let r = check(&[view(0, 2, &a, (3, 900)), view(1, 2, &a, (2, 900))]);
        assert_eq!(r.queue_length_mismatches, 1);
        // A node that lacks a committed entry diverges too.
        let r = check(&[view(0, 2, &a, (3, 900)), view(1, 2, &a[..2], (3, 900))]);
        assert_eq!(r.divergent_entries, 1);
    }

    #[test]
    fn a_replica_that_never_caught_up_fails_the_audit() {
        // Identical over the prefix both applied, but node 1 stopped at index 1.
        let e = [(0, 1, 7), (1, 1, 8), (2, 2, 9)];
        let r = check(&[view(0, 2, &e, (3, 900)), view(1, 1, &e[..2], (2, 900))]);
        assert_eq!(
            (r.divergent_entries, r.lagging_nodes, r.valid),
            (0, 1, false)
        );
    }
}
