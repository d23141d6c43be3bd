//! The replica-audit admin calls: one node's own view, never passed on to the
//! leader. LogDigest: its Raft log (log index, term and a CRC32 of each entry's
//! records, independent of where they sit), its ConsumeQueue ranges and a digest of
//! its replicated metadata at the applied index it belongs to. QueueDigest: a CRC32
//! over one ConsumeQueue's entries in a range of queue offsets.

use ledgermq_meta::{RetryPolicy, TopicMessageType};
use ledgermq_raft::state_machine::GroupMeta;
use ledgermq_store::record::record_crc;
use ledgermq_store::MessageStore;

use crate::admin_pb::{
    EntryDigest, LogDigestRequest, LogDigestResponse, QueueDigestRequest, QueueDigestResponse,
    QueueTail, StateDigest,
};
use crate::broker::Broker;

/// Entries returned when the request leaves `max_entries` at 0.
pub const DEFAULT_DIGEST_ENTRIES: u32 = 10_000;
/// Most entries one call returns.
pub const MAX_DIGEST_ENTRIES: u32 = 100_000;
/// Most queue offsets one QueueDigest call covers.
pub const MAX_QUEUE_DIGEST_ENTRIES: u64 = 1_000_000;

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
        r.state = Some(state_digest(&broker.node.shared_meta().read().unwrap()));
        r.entries = entry_digests(store, req.from_index, max)?;
        for ((topic, queue_id), cq) in store.consume_queues().all() {
            r.queues.push(QueueTail {
                topic,
                queue_id,
                max_offset: cq.max_offset(),
                last_physical_offset: cq.last_commit_log_offset(),
                min_offset: cq.min_offset(),
            });
        }
        Ok(())
    })();
    if let Err(e) = result {
        r.error = e;
    }
    r
}

/// A canonical byte encoding for the metadata digests (see `StateDigest` in
/// admin.proto): strings length-prefixed, integers big-endian.
struct Canon(crc32fast::Hasher);

impl Canon {
    fn new() -> Self {
        Self(crc32fast::Hasher::new())
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.0.update(&(s.len() as u32).to_be_bytes());
        self.0.update(s.as_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.update(b);
        self
    }
    fn done(self) -> u32 {
        self.0.finalize()
    }
}

/// Digests of `meta` (consumer offsets, FIFO leases and batch leases, topic and group configs
/// with the users and their permissions, delivery attempts), each
/// over its entries in key order (the maps are BTreeMaps), the retention point, and
/// the applied index they belong to. Call with the metadata's lock held, so the two agree.
pub fn state_digest(meta: &GroupMeta) -> StateDigest {
    let mut offsets = Canon::new();
    for ((group, topic, queue_id), next) in &meta.offsets {
        offsets
            .str(group)
            .str(topic)
            .bytes(&queue_id.to_be_bytes())
            .bytes(&next.to_be_bytes());
    }
    let mut leases = Canon::new();
    for ((group, topic, queue_id), l) in &meta.fifo_leases {
        leases
            .str(group)
            .str(topic)
            .bytes(&queue_id.to_be_bytes())
            .bytes(&l.queue_offset.to_be_bytes())
            .bytes(&l.delivery_id.to_be_bytes())
            .bytes(&l.attempt.to_be_bytes())
            .bytes(&l.visible_at_ms.to_be_bytes());
    }
    // Then the batch leases (their queues hold no single lease).
    for ((group, topic, queue_id), b) in &meta.fifo_batches {
        leases
            .str(group)
            .str(topic)
            .bytes(&queue_id.to_be_bytes())
            .bytes(&b.lease_id.to_be_bytes())
            .bytes(&b.next_offset.to_be_bytes())
            .bytes(&b.end_offset.to_be_bytes())
            .bytes(&(b.deliveries.len() as u64).to_be_bytes());
        for d in &b.deliveries {
            leases
                .bytes(&d.queue_offset.to_be_bytes())
                .bytes(&d.delivery_id.to_be_bytes())
                .bytes(&d.attempt.to_be_bytes())
                .bytes(&d.visible_at_ms.to_be_bytes())
                .bytes(&d.invisible_ms.to_be_bytes());
        }
    }
    let mut topics = Canon::new();
    for (name, t) in &meta.topics {
        let kind: u8 = match t.message_type {
            TopicMessageType::Normal => 0,
            TopicMessageType::Fifo => 1,
            TopicMessageType::Delay => 2,
            TopicMessageType::Transaction => 3,
            TopicMessageType::Mixed => 4,
        };
        topics
            .str(name)
            .bytes(&t.queue_count.to_be_bytes())
            .bytes(&t.perm.bits().to_be_bytes())
            .bytes(&[kind]);
    }
    let mut groups = Canon::new();
    for (name, g) in &meta.groups {
        groups
            .str(name)
            .bytes(&[g.fifo as u8, g.broadcast as u8])
            .bytes(&g.max_delivery_attempts.to_be_bytes());
        // The group's retry policy, if it has one (nothing if none, so a group
        // without one digests as before): 1 exponential, 2 customized, then
        // its values.
        match meta.retry_policies.get(name) {
            None => {}
            Some(RetryPolicy::Exponential {
                initial_ms,
                max_ms,
                multiplier,
            }) => {
                groups.bytes(&[1]);
                for v in [initial_ms, max_ms, multiplier] {
                    groups.bytes(&v.to_be_bytes());
                }
            }
            Some(RetryPolicy::Customized { next_ms }) => {
                groups
                    .bytes(&[2])
                    .bytes(&(next_ms.len() as u64).to_be_bytes());
                for ms in next_ms {
                    groups.bytes(&ms.to_be_bytes());
                }
            }
        }
    }
    // Then the users and their permissions (nothing when there are none, so
    // a group without users digests as before): each user's name, a SHA-1 of
    // its secret key (not the key: a CRC32 over it would let a digest reader
    // test guesses), admin flag, and permissions as listUser shows them.
    for u in meta.acl_users.values() {
        use sha1::Digest;
        groups
            .str(&u.username)
            .bytes(&sha1::Sha1::digest(u.secret_key.expose().as_bytes()))
            .bytes(&[u.admin as u8]);
        for e in crate::grpc::acl_admin::user_info(u).acl {
            groups.str(&e.resource).str(&e.perm);
        }
    }
    let mut attempts = Canon::new();
    let mut attempt_count = 0u64;
    for ((group, topic, queue_id), queue) in &meta.delivery_attempts {
        for (offset, attempt) in queue {
            attempts
                .str(group)
                .str(topic)
                .bytes(&queue_id.to_be_bytes())
                .bytes(&offset.to_be_bytes())
                .bytes(&attempt.to_be_bytes());
            attempt_count += 1;
        }
    }
    StateDigest {
        applied_index: meta.applied_index,
        delivery_attempts_crc32: attempts.done(),
        delivery_attempts: attempt_count,
        consumer_offsets_crc32: offsets.done(),
        consumer_offsets: meta.offsets.len() as u64,
        fifo_leases_crc32: leases.done(),
        fifo_leases: (meta.fifo_leases.len() + meta.fifo_batches.len()) as u64,
        topics_crc32: topics.done(),
        topics: meta.topics.len() as u64,
        groups_crc32: groups.done(),
        groups: meta.groups.len() as u64,
        purge_point: meta.purge_point,
    }
}

/// Answers a QueueDigest call from `store` (see admin.proto): the CRC32 over each
/// entry's size, tag hash and record CRC in `[from_offset, to_offset)`. An entry
/// whose record cannot be read (purged, damaged, not where the entry says) is
/// digested with record CRC 0 and counted in `unreadable`. Refused (in `error`):
/// an empty or reversed range, one over [`MAX_QUEUE_DIGEST_ENTRIES`] offsets, one
/// outside what the node holds (a queue it lacks holds nothing).
pub fn queue_digest(
    store: &MessageStore,
    node_id: u64,
    req: &QueueDigestRequest,
) -> QueueDigestResponse {
    let cq = store.consume_queues().get(&req.topic, req.queue_id);
    let (min, max) = cq
        .as_ref()
        .map_or((0, 0), |cq| (cq.min_offset(), cq.max_offset()));
    let mut r = QueueDigestResponse {
        node_id,
        min_offset: min,
        max_offset: max,
        ..Default::default()
    };
    let (from, to) = (req.from_offset, req.to_offset);
    let refuse = if from >= to {
        Some(format!("queue offsets [{from}, {to}) are an empty range"))
    } else if to - from > MAX_QUEUE_DIGEST_ENTRIES {
        Some(format!(
            "queue offsets [{from}, {to}) are more than {MAX_QUEUE_DIGEST_ENTRIES}"
        ))
    } else if from < min || to > max {
        Some(format!(
            "queue offsets [{from}, {to}) of {}#{} are outside those held, [{min}, {max})",
            req.topic, req.queue_id
        ))
    } else {
        None
    };
    let Some(cq) = cq.filter(|_| refuse.is_none()) else {
        r.error = refuse.unwrap_or_default();
        return r;
    };
    let mut h = crc32fast::Hasher::new();
    for q in from..to {
        // Read as consumers read: a damaged entry is rebuilt from the CommitLog.
        let (e, crc) = match store.queue_message(&cq, q) {
            Ok((e, bytes)) => (e, record_crc(&bytes)),
            Err(err) => match cq.get(q) {
                // The entry is there, its record is not readable.
                Ok(e) => {
                    r.unreadable += 1;
                    (e, 0)
                }
                Err(_) => {
                    // Retention moved the queue's start meanwhile, or the entry is
                    // damaged beyond repair.
                    r.error = format!("{}#{} queue offset {q}: {err}", req.topic, req.queue_id);
                    return r;
                }
            },
        };
        h.update(&e.size_bytes.to_be_bytes());
        h.update(&e.tag_hash.to_be_bytes());
        h.update(&crc.to_be_bytes());
        r.entries += 1;
    }
    r.crc32 = h.finalize();
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use ledgermq_meta::TopicPerm;
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

    /// A store holding `bodies` as messages of T#0, one entry each, dispatched.
    fn store_with(dir: &std::path::Path, bodies: &[&[u8]]) -> std::sync::Arc<MessageStore> {
        let store = MessageStore::open(StoreConfig::small(dir, 1 << 16)).unwrap();
        for (i, b) in bodies.iter().enumerate() {
            let m = MessageRecord::message("T", 0, b.to_vec(), 1);
            store.append_entry(1, i as u64, &[m]).unwrap();
        }
        store.dispatch_through(bodies.len() as u64 - 1).unwrap();
        store
    }

    fn ask(store: &MessageStore, queue_id: i32, from: u64, to: u64) -> QueueDigestResponse {
        let req = QueueDigestRequest {
            topic: "T".into(),
            queue_id,
            from_offset: from,
            to_offset: to,
        };
        queue_digest(store, 7, &req)
    }

    #[test]
    fn queue_digests_agree_on_equal_queues_and_tell_different_ones_apart() {
        let (d1, d2, d3) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let a = store_with(d1.path(), &[b"a", b"b", b"c"]);
        let b = store_with(d2.path(), &[b"a", b"b", b"c"]);
        let c = store_with(d3.path(), &[b"a", b"X", b"c"]);
        let ra = ask(&a, 0, 0, 3);
        assert_eq!((ra.error.as_str(), ra.entries, ra.unreadable), ("", 3, 0));
        assert_eq!((ra.min_offset, ra.max_offset, ra.node_id), (0, 3, 7));
        assert_eq!(ra.crc32, ask(&b, 0, 0, 3).crc32);
        assert_ne!(ra.crc32, ask(&c, 0, 0, 3).crc32);
        // Over a range both hold alike, the differing entry is left out.
        assert_eq!(ask(&a, 0, 2, 3).crc32, ask(&c, 0, 2, 3).crc32);
        for s in [a, b, c] {
            s.shutdown().unwrap();
        }
    }

    #[test]
    fn queue_digests_refuse_ranges_not_held_or_too_long() {
        let d = tempfile::tempdir().unwrap();
        let s = store_with(d.path(), &[b"a", b"b"]);
        for (queue_id, from, to, says) in [
            (0, 1, 1, "empty range"),
            (0, 2, 1, "empty range"),
            (0, 0, 3, "outside those held, [0, 2)"),
            (0, 0, MAX_QUEUE_DIGEST_ENTRIES + 1, "more than"),
            (5, 0, 1, "outside those held, [0, 0)"),
        ] {
            let r = ask(&s, queue_id, from, to);
            assert!(r.error.contains(says), "[{from}, {to}): {}", r.error);
            assert_eq!(r.entries, 0);
        }
        s.shutdown().unwrap();
    }

    #[test]
    fn state_digests_are_canonical_and_name_the_part_that_differs() {
        use ledgermq_meta::{FifoLease, GroupConfig, TopicConfig};
        let mut a = GroupMeta {
            applied_index: Some(9),
            ..Default::default()
        };
        for (g, q, o) in [("G1", 0, 5), ("G0", 1, 3), ("G0", 0, 4)] {
            a.offsets.insert((g.into(), "T".into(), q), o);
        }
        a.topics.insert(
            "T".into(),
            TopicConfig {
                name: "T".into(),
                queue_count: 4,
                perm: TopicPerm::READ_WRITE,
                message_type: TopicMessageType::Fifo,
            },
        );
        a.groups.insert(
            "G0".into(),
            GroupConfig {
                name: "G0".into(),
                fifo: true,
                broadcast: false,
                max_delivery_attempts: 16,
            },
        );
        let lease = FifoLease {
            group: "G0".into(),
            topic: "T".into(),
            queue_id: 0,
            queue_offset: 4,
            delivery_id: 1 << 40,
            attempt: 1,
            visible_at_ms: 1000,
        };
        a.fifo_leases.insert(("G0".into(), "T".into(), 0), lease);
        let da = state_digest(&a);
        assert_eq!(
            (
                da.applied_index,
                da.consumer_offsets,
                da.topics,
                da.groups,
                da.fifo_leases
            ),
            (Some(9), 3, 1, 1, 1)
        );
        // The same contents inserted in another order digest the same.
        let mut b = GroupMeta {
            applied_index: Some(9),
            ..Default::default()
        };
        for (k, v) in a.offsets.iter().rev() {
            b.offsets.insert(k.clone(), *v);
        }
        b.topics = a.topics.clone();
        b.groups = a.groups.clone();
        b.fifo_leases = a.fifo_leases.clone();
        assert_eq!(state_digest(&b), da);
        // Each part changes only its own digest.
        let mut c = b.clone();
        c.offsets.insert(("G0".into(), "T".into(), 1), 4);
        let dc = state_digest(&c);
        assert_ne!(dc.consumer_offsets_crc32, da.consumer_offsets_crc32);
        assert_eq!(
            (dc.fifo_leases_crc32, dc.topics_crc32, dc.groups_crc32),
            (da.fifo_leases_crc32, da.topics_crc32, da.groups_crc32)
        );
        let mut c = b.clone();
        c.fifo_leases.values_mut().for_each(|l| l.attempt = 2);
        assert_ne!(state_digest(&c).fifo_leases_crc32, da.fifo_leases_crc32);
        let mut c = b.clone();
        c.topics.values_mut().for_each(|t| t.perm = TopicPerm::READ);
        assert_ne!(state_digest(&c).topics_crc32, da.topics_crc32);
        let mut c = b.clone();
        c.groups.values_mut().for_each(|g| g.broadcast = true);
        assert_ne!(state_digest(&c).groups_crc32, da.groups_crc32);
        // A group's retry policy is part of its digest: given, and changed.
        let mut c = b;
        c.retry_policies.insert(
            "G0".into(),
            RetryPolicy::Customized {
                next_ms: vec![1_000],
            },
        );
        let with = state_digest(&c).groups_crc32;
        assert_ne!(with, da.groups_crc32);
        c.retry_policies.insert(
            "G0".into(),
            RetryPolicy::Customized {
                next_ms: vec![2_000],
            },
        );
        assert_ne!(state_digest(&c).groups_crc32, with);
        // Delivery attempts are a part of their own.
        let mut d = GroupMeta {
            applied_index: Some(9),
            ..Default::default()
        };
        d.delivery_attempts
            .insert(("G0".into(), "T".into(), 0), [(4, 2)].into());
        let dd = state_digest(&d);
        assert_eq!(dd.delivery_attempts, 1);
        d.delivery_attempts
            .insert(("G0".into(), "T".into(), 0), [(4, 3)].into());
        assert_ne!(
            state_digest(&d).delivery_attempts_crc32,
            dd.delivery_attempts_crc32
        );
    }
}
