//! The audit's I/O: waiting for the replicas to settle and fetching each node's view
//! over the admin calls (LogDigest, QueueDigest).

use std::time::{Duration, Instant};

use ledgermq_proto::admin_pb::{
    EntryDigest, LogDigestRequest, LogDigestResponse, QueueDigestRequest,
};

use super::{pairs, shared_queue_ranges, NodeView, QueueRange, QueueRangeDigest};
use crate::access::{Access, Admin};
use crate::JepsenError;

/// Queue offsets per QueueDigest call (the broker takes at most 1,000,000).
const QUEUE_DIGEST_PAGE: u64 = 250_000;

async fn client(access: &Access, addr: &str) -> Result<Admin, JepsenError> {
    Ok(access
        .admin(addr, None)
        .await?
        .max_decoding_message_size(64 << 20))
}

async fn digest(
    access: &Access,
    addr: &str,
    from_index: u64,
    max_entries: u32,
) -> Result<LogDigestResponse, JepsenError> {
    let r = client(access, addr)
        .await?
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

/// `addr`'s digest of `range`, in pages of [`QUEUE_DIGEST_PAGE`] offsets from its
/// start. Error: the node did not answer, or refused (e.g. retention moved the
/// queue's start past the range since its LogDigest).
async fn queue_digest(
    access: &Access,
    addr: &str,
    range: &QueueRange,
) -> Result<QueueRangeDigest, JepsenError> {
    let mut c = client(access, addr).await?;
    let mut d = QueueRangeDigest::default();
    let mut from = range.from;
    while from < range.to {
        let to = range.to.min(from.saturating_add(QUEUE_DIGEST_PAGE));
        let r = c
            .queue_digest(QueueDigestRequest {
                topic: range.topic.clone(),
                queue_id: range.queue_id,
                from_offset: from,
                to_offset: to,
            })
            .await
            .map_err(|s| JepsenError::Host(format!("{addr}: {}", s.message())))?
            .into_inner();
        if !r.error.is_empty() {
            return Err(JepsenError::Host(format!("{addr}: {}", r.error)));
        }
        d.entries += r.entries;
        d.unreadable += r.unreadable;
        d.crc32s.push(r.crc32);
        from = to;
    }
    Ok(d)
}

/// Waits (up to `timeout`) until every node answers and all have applied the same
/// entries, twice in a row 500 ms apart; returns the last answers (with whatever was
/// reached when the time ran out). Call from inside the clients' namespace.
pub async fn settle(
    access: &Access,
    nodes: &[String],
    timeout: Duration,
) -> Vec<Option<LogDigestResponse>> {
    let deadline = Instant::now() + timeout;
    let mut last: Option<Vec<Option<u64>>> = None;
    loop {
        let mut states = Vec::new();
        for n in nodes {
            states.push(digest(access, n, u64::MAX, 1).await.ok());
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

/// Fetches every node's view: state, all entry digests (in pages), and, for each
/// pair of nodes at the same applied index, both nodes' digests of the queue ranges
/// the two hold ([`shared_queue_ranges`]; each range digested once per node). Call
/// from inside the clients' namespace. Error: a node did not answer or refused.
pub async fn fetch(access: &Access, nodes: &[String]) -> Result<Vec<NodeView>, JepsenError> {
    let mut out = Vec::new();
    for n in nodes {
        let state = digest(access, n, u64::MAX, 1).await?;
        let mut entries: Vec<EntryDigest> = Vec::new();
        let mut from = state.first_index;
        while from < state.next_index {
            let page = digest(access, n, from, 50_000).await?.entries;
            match page.last() {
                Some(l) => from = l.log_index + 1,
                None => break,
            }
            entries.extend(page);
        }
        out.push(NodeView {
            state,
            entries,
            queue_digests: Default::default(),
        });
    }
    for (i, j) in pairs(out.len()) {
        if out[i].state.applied_index != out[j].state.applied_index {
            continue;
        }
        for range in shared_queue_ranges(&out[i].state, &out[j].state) {
            for k in [i, j] {
                if !out[k].queue_digests.contains_key(&range) {
                    let d = queue_digest(access, &nodes[k], &range).await?;
                    out[k].queue_digests.insert(range.clone(), d);
                }
            }
        }
    }
    Ok(out)
}
