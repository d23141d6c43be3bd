//! The LogDigest admin call: one node's own view of its Raft log (log index, term
//! and a CRC32 of each entry's records, independent of where they sit) and of its ConsumeQueue tails, for
//! replica audits. Read-only; never passed on to the leader.

use ledgermq_store::record::record_crc;
use ledgermq_store::MessageStore;

use crate::admin_pb::{EntryDigest, LogDigestRequest, LogDigestResponse, QueueTail};
use crate::broker::Broker;

/// Entries returned when the request leaves `max_entries` at 0.
pub const DEFAULT_DIGEST_ENTRIES: u32 = 10_000;
/// Most entries one call returns.
pub const MAX_DIGEST_ENTRIES: u32 = 100_000;

/// Digests of entries `[from, from + max)` the store holds, in order. Errors: the
/// store's read error, as text (a damaged entry is reported, not skipped).
pub fn entry_digests(
    store: &MessageStore,
    from: u64,
    max: u32,
) -> Result<Vec<EntryDigest>, String> {
    let log = store.commit_log();
    let start = from.max(log.first_log_index());
    let end = log.next_log_index().min(start.saturating_add(max as u64));
    (start..end)
        .map(|i| {
            let e = store.read_entry(i).map_err(|e| e.to_string())?;
            // Over each record's CRC, recomputed from its bytes: the layout's CRC
            // leaves out PHYSICALOFFSET, so an entry digests the same wherever a
            // replica placed it (a snapshot's reset moves a follower's offsets),
            // and a damaged record still changes the digest.
            let mut h = crc32fast::Hasher::new();
            for r in e.records() {
                h.update(&record_crc(r?.bytes()).to_be_bytes());
            }
            Ok(EntryDigest {
                log_index: i,
                term: e.location.term,
                crc32: h.finalize(),
            })
        })
        .collect()
}

/// Answers a LogDigest call from `broker`'s node.
pub fn log_digest(broker: &Broker, req: &LogDigestRequest) -> LogDigestResponse {
    let store = broker.node.store();
    let metrics = broker.node.raft().metrics().borrow().clone();
    let log = store.commit_log();
    let mut r = LogDigestResponse {
        node_id: broker.node.id(),
        first_index: log.first_log_index(),
        next_index: log.next_log_index(),
        applied_index: metrics.last_applied.map(|l| l.index),
        current_term: metrics.current_term,
        leader_id: metrics.current_leader,
        ..Default::default()
    };
    let max = match req.max_entries {
        0 => DEFAULT_DIGEST_ENTRIES,
        n => n.min(MAX_DIGEST_ENTRIES),
    };
    let result = (|| -> Result<(), String> {
        r.commit_index = broker
            .node
            .saved_commit_index()
            .map_err(|e| e.to_string())?;
        if let Some(a) = r.applied_index {
            if a >= log.first_log_index() {
                r.applied_end_offset = log
                    .entry_location(a)
                    .map_err(|e| e.to_string())?
                    .end_offset();
            }
        }
        r.entries = entry_digests(store, req.from_index, max)?;
        for ((topic, queue_id), cq) in store.consume_queues().all() {
            r.queues.push(QueueTail {
                topic,
                queue_id,
                max_offset: cq.max_offset(),
                last_physical_offset: cq.last_commit_log_offset(),
            });
        }
        Ok(())
    })();
    if let Err(e) = result {
        r.error = e;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use ledgermq_store::{MessageRecord, StoreConfig};

    #[test]
    fn digests_cover_the_entries_held_and_tell_them_apart() {
        let dir = tempfile::tempdir().unwrap();
        let store = MessageStore::open(StoreConfig::small(dir.path(), 1 << 16)).unwrap();
        for i in 0..5u64 {
            let m = MessageRecord::message("T", 0, vec![i as u8; 10], 1);
            store.append_entry(1 + i / 3, i, &[m]).unwrap();
        }
        let all = entry_digests(&store, 0, 100).unwrap();
        assert_eq!(
            all.iter().map(|d| d.log_index).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4]
        );
        assert_eq!(all[3].term, 2);
        assert_ne!(all[0].crc32, all[1].crc32);
        let page = entry_digests(&store, 3, 1).unwrap();
        assert_eq!(page, vec![all[3]]);
        assert!(entry_digests(&store, 9, 10).unwrap().is_empty());
        store.shutdown().unwrap();
    }
}
