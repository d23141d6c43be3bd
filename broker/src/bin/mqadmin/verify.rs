//! `mqadmin verifyReplicas`: checks that every member of a broker group holds
//! the same committed log prefix and the same ConsumeQueue entries, from each
//! member's own digests (the LogDigest and QueueDigest admin calls, never passed
//! on to the leader).
//!
//! The log is compared over the indexes every member holds and has applied
//! (`[highest first index, lowest applied index]`), entry by entry (term and a
//! CRC of its records); each queue over the offsets every member holds. Entries
//! past a member's applied index are left out: they may not be committed yet.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use ledgermq_broker::admin_pb::{
    EntryDigest, LogDigestRequest, LogDigestResponse, QueueDigestRequest, RaftStatusRequest,
    RaftStatusResponse,
};

/// Log entries asked per LogDigest call.
const LOG_PAGE: u32 = 10_000;
/// Queue offsets asked per QueueDigest call.
const QUEUE_PAGE: u64 = 100_000;

type Client = crate::cluster::AdminClient;

/// The log indexes `heads` (each member's LogDigest) all hold and have
/// applied: `[from, to)`, empty when they share none. No I/O.
pub fn common_log_range(heads: &[LogDigestResponse]) -> (u64, u64) {
    let from = heads.iter().map(|h| h.first_index).max().unwrap_or(0);
    let to = heads
        .iter()
        .map(|h| h.applied_index.map_or(0, |a| a + 1).min(h.next_index))
        .min()
        .unwrap_or(0);
    (from, to.max(from))
}

/// The first entry where `theirs` differs from `ours` (both from the same
/// first index), as (log index, ours, theirs); a missing entry is `None`. No I/O.
pub fn first_difference(
    ours: &[EntryDigest],
    theirs: &[EntryDigest],
) -> Option<(u64, Option<EntryDigest>, Option<EntryDigest>)> {
    let n = ours.len().max(theirs.len());
    (0..n).find_map(|i| {
        let (a, b) = (ours.get(i), theirs.get(i));
        (a != b).then(|| {
            let idx = a.or(b).map_or(0, |e| e.log_index);
            (idx, a.cloned(), b.cloned())
        })
    })
}

/// The queue offsets every member holds of each queue: (topic, queue id) →
/// `[from, to)`, for queues every member has. No I/O.
pub fn common_queue_ranges(heads: &[LogDigestResponse]) -> BTreeMap<(String, i32), (u64, u64)> {
    let mut out: BTreeMap<(String, i32), (u64, u64, usize)> = BTreeMap::new();
    for h in heads {
        for q in &h.queues {
            let e = out
                .entry((q.topic.clone(), q.queue_id))
                .or_insert((0, u64::MAX, 0));
            e.0 = e.0.max(q.min_offset);
            e.1 = e.1.min(q.max_offset);
            e.2 += 1;
        }
    }
    out.into_iter()
        .filter(|(_, (_, _, n))| *n == heads.len())
        .map(|(k, (from, to, _))| (k, (from, to.max(from))))
        .collect()
}

async fn log_digest(
    c: &mut Client,
    from_index: u64,
    max_entries: u32,
) -> Result<LogDigestResponse> {
    let r = c
        .log_digest(LogDigestRequest {
            from_index,
            max_entries,
        })
        .await?
        .into_inner();
    if !r.error.is_empty() {
        bail!("{}", r.error);
    }
    Ok(r)
}

/// Checks group `group`'s `members` (client addresses); prints one summary
/// line, and each difference found. Error: a member did not answer, or the
/// replicas differ.
pub async fn verify_group(group: &str, members: &[String]) -> Result<()> {
    let mut clients = Vec::new();
    for addr in members {
        let channel = crate::cluster::channel(addr, Some(std::time::Duration::from_secs(30)))
            .await
            .with_context(|| format!("{group}: {addr}"))?;
        clients.push(crate::cluster::admin_client(channel).max_decoding_message_size(64 << 20));
    }
    let mut heads = Vec::new();
    for (c, addr) in clients.iter_mut().zip(members) {
        heads.push(
            log_digest(c, 0, 1)
                .await
                .with_context(|| format!("{group}: {addr}"))?,
        );
    }
    let ids: Vec<u64> = heads.iter().map(|h| h.node_id).collect();
    let (from, to) = common_log_range(&heads);
    let mut differences = Vec::new();
    let mut at = from;
    'log: while at < to {
        let max = LOG_PAGE.min((to - at) as u32);
        let mut pages = Vec::new();
        for (c, addr) in clients.iter_mut().zip(members) {
            let mut p = log_digest(c, at, max)
                .await
                .with_context(|| format!("{group}: {addr}"))?;
            p.entries.retain(|e| e.log_index < to);
            pages.push(p.entries);
        }
        for (i, page) in pages.iter().enumerate().skip(1) {
            if let Some((idx, a, b)) = first_difference(&pages[0], page) {
                differences.push(format!(
                    "node {} and node {} differ at log index {idx}: {a:?} / {b:?}",
                    ids[0], ids[i]
                ));
                break 'log;
            }
        }
        if pages[0].is_empty() {
            break;
        }
        at += pages[0].len() as u64;
    }
    let queues = common_queue_ranges(&heads);
    let mut queue_entries = 0;
    for ((topic, queue_id), (qfrom, qto)) in &queues {
        let mut at = *qfrom;
        while at < *qto {
            let to_offset = qto.min(&at.saturating_add(QUEUE_PAGE)).to_owned();
            let mut seen: Vec<(u64, u32, u64)> = Vec::new();
            for (c, addr) in clients.iter_mut().zip(members) {
                let r = c
                    .queue_digest(QueueDigestRequest {
                        topic: topic.clone(),
                        queue_id: *queue_id,
                        from_offset: at,
                        to_offset,
                    })
                    .await
                    .with_context(|| format!("{group}: {addr}"))?
                    .into_inner();
                if !r.error.is_empty() {
                    bail!("{group}: {addr}: {}", r.error);
                }
                seen.push((r.node_id, r.crc32, r.unreadable));
            }
            for s in &seen {
                if s.2 > 0 {
                    differences.push(format!(
                        "node {} cannot read {} entries of {topic}/{queue_id} in [{at}, {to_offset})",
                        s.0, s.2
                    ));
                }
                if s.1 != seen[0].1 {
                    differences.push(format!(
                        "node {} and node {} differ on {topic}/{queue_id} in [{at}, {to_offset})",
                        seen[0].0, s.0
                    ));
                }
            }
            queue_entries += to_offset - at;
            at = to_offset;
        }
    }
    let nodes = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    if to == from && queue_entries == 0 && differences.is_empty() {
        differences.push(format!(
            "the members hold no committed entry in common (log indexes [{from}, {to})): nothing was compared"
        ));
    }
    let verdict = if differences.is_empty() {
        "identical"
    } else {
        "DIFFERENT"
    };
    println!(
        "{group:<12} {nodes:<10} {:<22} {:>10} {:>8} {:>12} {verdict}",
        format!("[{from}, {to})"),
        to - from,
        queues.len(),
        queue_entries
    );
    for d in &differences {
        println!("  {d}");
    }
    if !differences.is_empty() {
        bail!("{group}: the replicas differ");
    }
    Ok(())
}

/// The nodes of `known` (node id, client address; as the name servers list
/// them) that are members of the group (voters and learners) by the membership
/// its leader reports (else the first node that answers RaftStatus): a removed
/// node the name servers still list is left out, and said so. Error: none
/// answers.
async fn members_of(group: &str, known: &[(u64, String)]) -> Result<Vec<String>> {
    let mut view: Option<RaftStatusResponse> = None;
    for (_, addr) in known {
        let Ok(channel) =
            crate::cluster::channel(addr, Some(std::time::Duration::from_secs(10))).await
        else {
            continue;
        };
        let Ok(r) = crate::cluster::admin_client(channel)
            .raft_status(RaftStatusRequest {})
            .await
        else {
            continue;
        };
        let r = r.into_inner();
        let leads = r.role == "leader";
        if leads || view.is_none() {
            view = Some(r);
        }
        if leads {
            break;
        }
    }
    let Some(r) = view else {
        bail!("{group}: no member answered")
    };
    let mut out = Vec::new();
    for (id, addr) in known {
        if r.voters.contains(id) || r.learners.contains(id) {
            out.push(addr.clone());
        } else {
            println!("{group}: node {id} ({addr}) is not a member: left out");
        }
    }
    Ok(out)
}

/// Checks every group of `groups` (name → each node the name servers know:
/// node id, client address).
pub async fn verify_replicas(groups: BTreeMap<String, Vec<(u64, String)>>) -> Result<()> {
    println!(
        "{:<12} {:<10} {:<22} {:>10} {:>8} {:>12} #Result",
        "#Group", "#Nodes", "#Log indexes", "#Entries", "#Queues", "#Queue entries"
    );
    let mut failed = Vec::new();
    for (group, known) in groups {
        let checked = match members_of(&group, &known).await {
            Ok(members) => verify_group(&group, &members).await,
            Err(e) => Err(e),
        };
        if let Err(e) = checked {
            println!("{group:<12} {e:#}");
            failed.push(group);
        }
    }
    if !failed.is_empty() {
        bail!("not verified: {}", failed.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ledgermq_broker::admin_pb::QueueTail;

    fn head(
        first: u64,
        next: u64,
        applied: Option<u64>,
        queues: &[(&str, u64, u64)],
    ) -> LogDigestResponse {
        LogDigestResponse {
            first_index: first,
            next_index: next,
            applied_index: applied,
            queues: queues
                .iter()
                .map(|(t, min, max)| QueueTail {
                    topic: t.to_string(),
                    queue_id: 0,
                    min_offset: *min,
                    max_offset: *max,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn e(log_index: u64, term: u64, crc32: u32) -> EntryDigest {
        EntryDigest {
            log_index,
            term,
            crc32,
        }
    }

    #[test]
    fn the_log_is_compared_where_every_member_holds_and_applied_it() {
        let heads = [
            head(0, 100, Some(98), &[]),
            head(10, 120, Some(119), &[]),
            head(0, 90, Some(80), &[]),
        ];
        assert_eq!(common_log_range(&heads), (10, 81));
        // A member that applied nothing shares nothing.
        assert_eq!(
            common_log_range(&[head(0, 5, None, &[]), head(0, 5, Some(4), &[])]),
            (0, 0)
        );
        // One that purged past another's applied index: an empty range.
        assert_eq!(
            common_log_range(&[head(50, 60, Some(59), &[]), head(0, 40, Some(39), &[])]),
            (50, 50)
        );
    }

    #[test]
    fn the_first_difference_names_its_log_index() {
        let a = [e(5, 1, 10), e(6, 1, 11), e(7, 2, 12)];
        assert_eq!(first_difference(&a, &a), None);
        let b = [e(5, 1, 10), e(6, 1, 99), e(7, 2, 12)];
        assert_eq!(
            first_difference(&a, &b),
            Some((6, Some(e(6, 1, 11)), Some(e(6, 1, 99))))
        );
        assert_eq!(
            first_difference(&a, &a[..2]),
            Some((7, Some(e(7, 2, 12)), None))
        );
    }

    #[test]
    fn queues_are_compared_over_the_offsets_every_member_holds() {
        let heads = [
            head(0, 1, Some(0), &[("A", 0, 50), ("B", 0, 5)]),
            head(0, 1, Some(0), &[("A", 10, 40)]),
        ];
        let r = common_queue_ranges(&heads);
        assert_eq!(r.len(), 1, "B is not on every member");
        assert_eq!(r[&("A".to_string(), 0)], (10, 40));
    }
}
