//! The replica audit: after healing, every pair of replicas holds the same committed
//! entries over the log indexes both hold (log index, term, CRC32 of the entry's
//! records), no ConsumeQueue holds an entry past what its node has applied (apply
//! follows commit, so past the commit index either), no replica lacks queue entries
//! the leader still serves, and replicas that applied the same entries hold the same
//! queues (length and a digest of the entries) and the same replicated metadata
//! (consumer offsets, FIFO leases, topic and group configs). [`fetch`] asks each node
//! for its view (the LogDigest and QueueDigest admin calls); [`check`] is a plain
//! function of those views.

mod fetch;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use ledgermq_proto::admin_pb::{EntryDigest, LogDigestResponse, StateDigest};
use serde::Serialize;

use crate::checker::note_example;

pub use fetch::{fetch, settle};

/// A range of one message queue's offsets: `[from, to)` of `topic#queue_id`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueRange {
    /// Topic.
    pub topic: String,
    /// Message queue id.
    pub queue_id: i32,
    /// First queue offset.
    pub from: u64,
    /// One past the last queue offset.
    pub to: u64,
}

/// One node's digest of a [`QueueRange`], fetched in pages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueRangeDigest {
    /// Entries digested.
    pub entries: u64,
    /// Entries whose message record the node could not read.
    pub unreadable: u64,
    /// The CRC32 of each page, in order (pages split the range the same way on
    /// every node).
    pub crc32s: Vec<u32>,
}

/// One node's view: its state and the digests of the entries it holds.
#[derive(Debug, Clone)]
pub struct NodeView {
    /// The node's answer to the first LogDigest call (queue ranges, indexes, the
    /// digest of its metadata).
    pub state: LogDigestResponse,
    /// Digests of every entry it holds, in order.
    pub entries: Vec<EntryDigest>,
    /// Digests of the queue ranges it shares with each node at its applied index
    /// ([`shared_queue_ranges`]).
    pub queue_digests: BTreeMap<QueueRange, QueueRangeDigest>,
}

/// What the audit found between two nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PairAudit {
    /// The two node ids.
    pub nodes: (u64, u64),
    /// First log index both hold.
    pub compared_from: u64,
    /// Last log index compared: the lower of the two applied indexes (None when
    /// either applied nothing).
    pub compared_through: Option<u64>,
    /// Log indexes compared.
    pub entries_compared: u64,
    /// Log indexes whose (term, CRC) differ, or that one of the two lacks.
    pub divergent_entries: u64,
    /// Both had applied the same entries, so their queues and metadata compare.
    pub same_applied: bool,
    /// Queue ranges whose digests were compared.
    pub queues_compared: u64,
    /// Queue entries those ranges cover.
    pub queue_entries_compared: u64,
    /// Queue ranges whose digests differ (or that a node did not digest).
    pub queue_digest_mismatches: u64,
    /// Their metadata digests were taken at the same applied index and compared.
    pub state_compared: bool,
    /// The applied index of the compared metadata digests.
    pub state_applied_index: Option<u64>,
    /// Metadata entries compared (consumer offsets, FIFO leases, topics and groups
    /// on the first node of the pair).
    pub state_entries_compared: u64,
    /// Metadata parts (consumer offsets, FIFO leases, topics, groups) that differ.
    pub state_mismatches: u64,
}

/// Findings of the replica audit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReplicaAudit {
    /// Nodes audited.
    pub nodes: usize,
    /// The log indexes every node holds: `[from, through]` (`through` is the lowest
    /// applied index). Each pair is compared over what the two hold ([`Self::pairs`]).
    pub compared_from: u64,
    /// Last log index every node applied.
    pub compared_through: Option<u64>,
    /// Log indexes compared between at least one pair of nodes.
    pub entries_compared: u64,
    /// Log indexes whose (term, CRC) differ between two nodes holding them, or that
    /// one of two nodes lacks while the other holds and both applied past it.
    pub divergent_entries: u64,
    /// ConsumeQueue entries pointing past their node's last applied entry.
    pub queue_entries_past_commit: u64,
    /// Message queues whose length differs between nodes at the same applied index.
    pub queue_length_mismatches: u64,
    /// Message queues on a node that starts above the queue's start on the leader,
    /// or on a node at the same applied index: messages still served that a
    /// failover to that node would lose.
    pub queues_missing_retained: u64,
    /// Queue ranges compared by digest, between nodes at the same applied index.
    pub queue_digests_compared: u64,
    /// Queue entries those ranges cover, summed over the pairs.
    pub queue_entries_compared: u64,
    /// Queue ranges whose digests differ between two nodes at the same applied
    /// index (an entry pointing at another message, size or tag).
    pub queue_digest_mismatches: u64,
    /// Queue entries whose message record their node could not read (purged or
    /// damaged), per node and queue (the most over the ranges digested).
    pub queue_entries_unreadable: u64,
    /// Pairs of nodes whose metadata digests were taken at the same applied index.
    pub state_digests_compared: u64,
    /// Metadata parts (consumer offsets, FIFO leases, topic configs, group configs)
    /// that differ between two nodes at the same applied index.
    pub state_mismatches: u64,
    /// Nodes that had applied less than the most advanced node when audited (after
    /// the settle wait), or nothing at all: a replica that never caught up, whose
    /// unapplied part the comparisons above cannot see.
    pub lagging_nodes: u64,
    /// Every pair of nodes.
    pub pairs: Vec<PairAudit>,
    /// A few findings, in words.
    pub examples: Vec<String>,
    /// Nothing divergent, nothing past the commit index, no retained message
    /// missing, queues and metadata agree, no node lagging.
    pub valid: bool,
}

impl ReplicaAudit {
    /// One line for the CLI: what was compared and each finding's count.
    pub fn summary(&self) -> String {
        format!(
            "{} log entries compared over {} node pairs, {} divergent; {} queue entries past commit; \
             {} queue length mismatches; {} queues missing retained messages; \
             {} of {} queue digests differ ({} entries compared, {} unreadable); \
             {} metadata parts differ over {} pairs; {} lagging nodes",
            self.entries_compared,
            self.pairs.len(),
            self.divergent_entries,
            self.queue_entries_past_commit,
            self.queue_length_mismatches,
            self.queues_missing_retained,
            self.queue_digest_mismatches,
            self.queue_digests_compared,
            self.queue_entries_compared,
            self.queue_entries_unreadable,
            self.state_mismatches,
            self.state_digests_compared,
            self.lagging_nodes
        )
    }
}

/// The queue ranges two nodes both hold: for each queue on both, queue offsets
/// `[max of the minimums, min of the maximums)`, when not empty. [`fetch`] digests
/// these on both nodes; [`check`] compares them.
pub fn shared_queue_ranges(a: &LogDigestResponse, b: &LogDigestResponse) -> Vec<QueueRange> {
    let bq: BTreeMap<(&str, i32), (u64, u64)> = b
        .queues
        .iter()
        .map(|q| ((q.topic.as_str(), q.queue_id), (q.min_offset, q.max_offset)))
        .collect();
    let mut out: Vec<QueueRange> = a
        .queues
        .iter()
        .filter_map(|q| {
            let &(bmin, bmax) = bq.get(&(q.topic.as_str(), q.queue_id))?;
            let (from, to) = (q.min_offset.max(bmin), q.max_offset.min(bmax));
            (from < to).then(|| QueueRange {
                topic: q.topic.clone(),
                queue_id: q.queue_id,
                from,
                to,
            })
        })
        .collect();
    out.sort();
    out
}

/// Every pair `(i, j)`, `i < j`, of `n` items.
fn pairs(n: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n).flat_map(move |i| (i + 1..n).map(move |j| (i, j)))
}

/// Entries in the union of inclusive ranges.
fn union_len(mut ranges: Vec<(u64, u64)>) -> u64 {
    ranges.sort();
    let mut total = 0;
    let mut cur: Option<(u64, u64)> = None;
    for (lo, hi) in ranges {
        match cur {
            Some((clo, chi)) if lo <= chi.saturating_add(1) => cur = Some((clo, chi.max(hi))),
            _ => {
                if let Some((clo, chi)) = cur {
                    total += chi - clo + 1;
                }
                cur = Some((lo, hi));
            }
        }
    }
    total + cur.map_or(0, |(lo, hi)| hi - lo + 1)
}

/// Runs the audit over the nodes' views.
pub fn check(views: &[NodeView]) -> ReplicaAudit {
    let mut r = ReplicaAudit {
        nodes: views.len(),
        ..Default::default()
    };
    r.compared_from = views.iter().map(|v| v.state.first_index).max().unwrap_or(0);
    r.compared_through = views.iter().map(|v| v.state.applied_index).min().flatten();
    compare_logs(views, &mut r);
    check_queue_tails(views, &mut r);
    check_lagging(views, &mut r);
    check_queue_lengths(views, &mut r);
    check_retained(views, &mut r);
    compare_queues(views, &mut r);
    compare_state(views, &mut r);
    r.valid = r.divergent_entries == 0
        && r.queue_entries_past_commit == 0
        && r.queue_length_mismatches == 0
        && r.queues_missing_retained == 0
        && r.queue_digest_mismatches == 0
        && r.queue_entries_unreadable == 0
        && r.state_mismatches == 0
        && r.lagging_nodes == 0;
    r
}

/// Log entries, pair by pair, over the indexes both hold up to the lower applied
/// index; fills `r.pairs` (one per pair, in order).
fn compare_logs(views: &[NodeView], r: &mut ReplicaAudit) {
    let maps: Vec<BTreeMap<u64, (u64, u32)>> = views
        .iter()
        .map(|v| {
            v.entries
                .iter()
                .map(|e| (e.log_index, (e.term, e.crc32)))
                .collect()
        })
        .collect();
    let mut compared = Vec::new();
    let mut divergent = BTreeSet::new();
    for (i, j) in pairs(views.len()) {
        let (a, b) = (&views[i].state, &views[j].state);
        let from = a.first_index.max(b.first_index);
        let through = a.applied_index.min(b.applied_index);
        let mut p = PairAudit {
            nodes: (a.node_id, b.node_id),
            compared_from: from,
            compared_through: through,
            same_applied: a.applied_index == b.applied_index,
            ..Default::default()
        };
        if let Some(through) = through.filter(|&t| t >= from) {
            compared.push((from, through));
            for index in from..=through {
                p.entries_compared += 1;
                let (x, y) = (maps[i].get(&index), maps[j].get(&index));
                if x.is_none() || x != y {
                    p.divergent_entries += 1;
                    if divergent.insert(index) {
                        note_example(
                            &mut r.examples,
                            format!(
                                "log index {index}: (term, crc) node {} {x:?}, node {} {y:?}",
                                a.node_id, b.node_id
                            ),
                        );
                    }
                }
            }
        }
        r.pairs.push(p);
    }
    r.entries_compared = union_len(compared);
    r.divergent_entries = divergent.len() as u64;
}

/// No ConsumeQueue entry past its node's applied end.
fn check_queue_tails(views: &[NodeView], r: &mut ReplicaAudit) {
    for v in views {
        let s = &v.state;
        for q in &s.queues {
            if let Some(p) = q.last_physical_offset {
                if s.applied_index.is_none() || p >= s.applied_end_offset {
                    r.queue_entries_past_commit += 1;
                    note_example(
                        &mut r.examples,
                        format!(
                            "node {}: {}#{} has an entry at CommitLog offset {p}, past the applied end {} (applied index {:?})",
                            s.node_id, q.topic, q.queue_id, s.applied_end_offset, s.applied_index
                        ),
                    );
                }
            }
        }
    }
}

/// Every node applied as much as the most advanced one.
fn check_lagging(views: &[NodeView], r: &mut ReplicaAudit) {
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
}

/// Views grouped by applied index, groups of two or more.
fn same_applied(views: &[NodeView]) -> Vec<Vec<&NodeView>> {
    let mut by_applied: BTreeMap<Option<u64>, Vec<&NodeView>> = BTreeMap::new();
    for v in views {
        by_applied.entry(v.state.applied_index).or_default().push(v);
    }
    by_applied.into_values().filter(|g| g.len() > 1).collect()
}

/// Queue lengths agree between nodes that applied the same entries.
fn check_queue_lengths(views: &[NodeView], r: &mut ReplicaAudit) {
    let lens = |v: &NodeView| -> BTreeMap<(String, i32), u64> {
        v.state
            .queues
            .iter()
            .filter(|q| q.max_offset > 0)
            .map(|q| ((q.topic.clone(), q.queue_id), q.max_offset))
            .collect()
    };
    for group in same_applied(views) {
        let first = lens(group[0]);
        for v in &group[1..] {
            let other = lens(v);
            let keys: BTreeSet<_> = first.keys().chain(other.keys()).collect();
            for key in keys {
                if first.get(key) != other.get(key) {
                    r.queue_length_mismatches += 1;
                    note_example(
                        &mut r.examples,
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
}

/// The node that says it leads, in the highest term any node says that in.
fn leader(views: &[NodeView]) -> Option<&NodeView> {
    views
        .iter()
        .filter(|v| v.state.leader_id == Some(v.state.node_id))
        .max_by_key(|v| v.state.current_term)
}

/// Whether node `lacking` purged its log no further than the retention point node
/// `other` applied (a member purges through the highest segment boundary at or
/// below it, so its log then begins at most one past the point): `other` has yet
/// to purge what the group decided to delete, and nothing the group retains is
/// missing.
fn purged_by_group_point(views: &[NodeView], lacking: u64, other: u64) -> bool {
    let view = |id| views.iter().find(|v| v.state.node_id == id);
    let (Some(l), Some(o)) = (view(lacking), view(other)) else {
        return false;
    };
    let point = o.state.state.as_ref().and_then(|s| s.purge_point);
    point.is_some_and(|p| l.state.first_index <= p.saturating_add(1))
}

/// No node's queue starts above the leader's, nor above the same queue's start on
/// a node at the same applied index: the messages in between are still served and
/// a failover to that node would lose them. A start the group's retention point
/// explains is not flagged ([`purged_by_group_point`]).
fn check_retained(views: &[NodeView], r: &mut ReplicaAudit) {
    let mins = |v: &NodeView| -> BTreeMap<(String, i32), u64> {
        v.state
            .queues
            .iter()
            .map(|q| ((q.topic.clone(), q.queue_id), q.min_offset))
            .collect()
    };
    let leader = leader(views).map(|l| l.state.node_id);
    let mut flagged: BTreeSet<(u64, String, i32)> = BTreeSet::new();
    for (i, j) in pairs(views.len()) {
        let (a, b) = (&views[i], &views[j]);
        let (ai, bi) = (a.state.node_id, b.state.node_id);
        let with_leader = leader == Some(ai) || leader == Some(bi);
        if !with_leader && a.state.applied_index != b.state.applied_index {
            continue;
        }
        let (am, bm) = (mins(a), mins(b));
        for (key, &x) in &am {
            let Some(&y) = bm.get(key) else { continue };
            // The node starting later lacks [earlier, later); against the leader
            // only the follower is at fault.
            let (lacking, start, other, other_start) = if x > y {
                (ai, x, bi, y)
            } else if y > x {
                (bi, y, ai, x)
            } else {
                continue;
            };
            if leader == Some(lacking) && with_leader {
                continue;
            }
            if purged_by_group_point(views, lacking, other) {
                continue;
            }
            if flagged.insert((lacking, key.0.clone(), key.1)) {
                let role = if leader == Some(other) {
                    " (leader)"
                } else {
                    ""
                };
                note_example(
                    &mut r.examples,
                    format!(
                        "node {lacking}: {}#{} starts at queue offset {start}, node {other}{role} still holds it from {other_start}: a failover to node {lacking} loses those messages",
                        key.0, key.1
                    ),
                );
            }
        }
    }
    r.queues_missing_retained = flagged.len() as u64;
}

/// ConsumeQueue digests agree between nodes that applied the same entries, over
/// the queue ranges each pair holds.
fn compare_queues(views: &[NodeView], r: &mut ReplicaAudit) {
    let mut unreadable: BTreeMap<(u64, String, i32), u64> = BTreeMap::new();
    for v in views {
        for (range, d) in &v.queue_digests {
            let e = unreadable
                .entry((v.state.node_id, range.topic.clone(), range.queue_id))
                .or_default();
            *e = (*e).max(d.unreadable);
        }
    }
    for ((node, topic, queue_id), n) in unreadable.iter().filter(|(_, &n)| n > 0) {
        r.queue_entries_unreadable += n;
        note_example(
            &mut r.examples,
            format!("node {node}: {topic}#{queue_id} has {n} entries whose message it cannot read"),
        );
    }
    for (k, (i, j)) in pairs(views.len()).enumerate() {
        let (a, b) = (&views[i], &views[j]);
        if a.state.applied_index != b.state.applied_index {
            continue;
        }
        for range in shared_queue_ranges(&a.state, &b.state) {
            let p = &mut r.pairs[k];
            p.queues_compared += 1;
            p.queue_entries_compared += range.to - range.from;
            let (x, y) = (a.queue_digests.get(&range), b.queue_digests.get(&range));
            if x.is_none() || x.map(|d| (d.entries, &d.crc32s)) != y.map(|d| (d.entries, &d.crc32s))
            {
                p.queue_digest_mismatches += 1;
                note_example(
                    &mut r.examples,
                    format!(
                        "{}#{} queue offsets [{}, {}): node {} digest {:?}, node {} digest {:?} (same applied index {:?})",
                        range.topic,
                        range.queue_id,
                        range.from,
                        range.to,
                        a.state.node_id,
                        x.map(|d| &d.crc32s),
                        b.state.node_id,
                        y.map(|d| &d.crc32s),
                        a.state.applied_index
                    ),
                );
            }
        }
    }
    for p in &r.pairs {
        r.queue_digests_compared += p.queues_compared;
        r.queue_entries_compared += p.queue_entries_compared;
        r.queue_digest_mismatches += p.queue_digest_mismatches;
    }
}

/// The metadata digests' parts: (name, crc, entries).
/// The retention point counts as a part whose "crc" is the point's low 32 bits
/// and whose entry count is the point plus one (0: none committed).
fn state_parts(s: &StateDigest) -> [(&'static str, u32, u64); 6] {
    let point = s.purge_point.map_or(0, |p| p.saturating_add(1));
    [
        (
            "consumer offsets",
            s.consumer_offsets_crc32,
            s.consumer_offsets,
        ),
        ("FIFO leases", s.fifo_leases_crc32, s.fifo_leases),
        ("topic configs", s.topics_crc32, s.topics),
        ("group configs", s.groups_crc32, s.groups),
        (
            "delivery attempts",
            s.delivery_attempts_crc32,
            s.delivery_attempts,
        ),
        ("retention point", point as u32, point),
    ]
}

/// Metadata digests agree between nodes whose digests were taken at the same
/// applied index.
fn compare_state(views: &[NodeView], r: &mut ReplicaAudit) {
    for (k, (i, j)) in pairs(views.len()).enumerate() {
        let (a, b) = (&views[i].state, &views[j].state);
        let (Some(x), Some(y)) = (&a.state, &b.state) else {
            continue;
        };
        if x.applied_index != y.applied_index {
            continue;
        }
        let p = &mut r.pairs[k];
        p.state_compared = true;
        p.state_applied_index = x.applied_index;
        p.state_entries_compared = state_parts(x).iter().map(|part| part.2).sum();
        r.state_digests_compared += 1;
        for (px, py) in state_parts(x).into_iter().zip(state_parts(y)) {
            if px != py {
                p.state_mismatches += 1;
                r.state_mismatches += 1;
                note_example(
                    &mut r.examples,
                    format!(
                        "{} at applied index {:?}: node {} holds {} (crc {:08x}), node {} holds {} (crc {:08x})",
                        px.0, x.applied_index, a.node_id, px.2, px.1, b.node_id, py.2, py.1
                    ),
                );
            }
        }
    }
}
