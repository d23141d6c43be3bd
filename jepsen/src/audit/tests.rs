use super::*;
use ledgermq_proto::admin_pb::QueueTail;

/// A view of node `id` that applied through `applied`, holding `entries` (log
/// index, term, crc) and queue T#0 with `queue` = (max offset, last CommitLog
/// offset); it leads when `id` is 0. Its queue digest and metadata digest are the
/// same as every other such view's.
fn view(id: u64, applied: u64, entries: &[(u64, u64, u32)], queue: (u64, u64)) -> NodeView {
    let mut v = NodeView {
        state: LogDigestResponse {
            node_id: id,
            first_index: entries.first().map_or(0, |e| e.0),
            next_index: entries.last().map_or(0, |e| e.0 + 1),
            applied_index: Some(applied),
            applied_end_offset: 1000,
            current_term: 2,
            leader_id: Some(0),
            queues: vec![QueueTail {
                topic: "T".into(),
                queue_id: 0,
                max_offset: queue.0,
                last_physical_offset: Some(queue.1),
                min_offset: 0,
            }],
            state: Some(StateDigest {
                applied_index: Some(applied),
                consumer_offsets_crc32: 11,
                consumer_offsets: 3,
                fifo_leases_crc32: 12,
                fifo_leases: 1,
                topics_crc32: 13,
                topics: 2,
                groups_crc32: 14,
                groups: 2,
                purge_point: None,
                delivery_attempts_crc32: 15,
                delivery_attempts: 4,
            }),
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
        queue_digests: BTreeMap::new(),
    };
    digest_queues(&mut v, 77);
    v
}

/// Gives `v` a digest `crc` of each queue range it holds.
fn digest_queues(v: &mut NodeView, crc: u32) {
    v.queue_digests = shared_queue_ranges(&v.state, &v.state)
        .into_iter()
        .map(|r| {
            let d = QueueRangeDigest {
                entries: r.to - r.from,
                unreadable: 0,
                crc32s: vec![crc],
            };
            (r, d)
        })
        .collect();
}

/// Gives every pair of `views` equal digests (77) of the queue ranges they share,
/// as [`fetch`] digests them.
fn digest_shared(mut views: Vec<NodeView>) -> Vec<NodeView> {
    for (i, j) in pairs(views.len()) {
        for range in shared_queue_ranges(&views[i].state, &views[j].state) {
            for k in [i, j] {
                let d = QueueRangeDigest {
                    entries: range.to - range.from,
                    unreadable: 0,
                    crc32s: vec![77],
                };
                views[k].queue_digests.insert(range.clone(), d);
            }
        }
    }
    views
}

fn set_min(v: &mut NodeView, min: u64) {
    v.state.queues[0].min_offset = min;
    digest_queues(v, 77);
}

const E: [(u64, u64, u32); 3] = [(0, 1, 7), (1, 1, 8), (2, 2, 9)];

#[test]
fn identical_replicas_pass() {
    let r = check(&[
        view(0, 2, &E, (3, 900)),
        view(1, 2, &E, (3, 900)),
        view(2, 2, &E, (3, 900)),
    ]);
    assert!(r.valid, "{r:?}");
    assert_eq!(r.entries_compared, 3);
    assert_eq!(r.pairs.len(), 3);
    assert_eq!((r.queue_digests_compared, r.queue_entries_compared), (3, 9));
    assert_eq!(r.state_digests_compared, 3);
    assert_eq!(
        (
            r.pairs[0].state_applied_index,
            r.pairs[0].state_entries_compared
        ),
        (Some(2), 12)
    );
    assert!(r
        .summary()
        .contains("3 log entries compared over 3 node pairs, 0 divergent"));
}

#[test]
fn divergence_queue_overrun_and_length_mismatch_are_found() {
    let b = [(0, 1, 7), (1, 1, 5), (2, 2, 9)];
    let r = check(&[view(0, 2, &E, (3, 900)), view(1, 2, &b, (3, 900))]);
    assert_eq!((r.divergent_entries, r.valid), (1, false));
    let r = check(&[view(0, 2, &E, (3, 1000)), view(1, 2, &E, (3, 900))]);
    assert_eq!((r.queue_entries_past_commit, r.valid), (1, false));
    let r = check(&[view(0, 2, &E, (3, 900)), view(1, 2, &E, (2, 900))]);
    assert_eq!((r.queue_length_mismatches, r.valid), (1, false));
    // A node that lacks a committed entry diverges too.
    let r = check(&[view(0, 2, &E, (3, 900)), view(1, 2, &E[..2], (3, 900))]);
    assert_eq!(r.divergent_entries, 1);
}

#[test]
fn a_replica_that_never_caught_up_fails_the_audit() {
    // Identical over the prefix both applied, but node 1 stopped at index 1.
    let r = check(&[view(0, 2, &E, (3, 900)), view(1, 1, &E[..2], (2, 900))]);
    assert_eq!(
        (r.divergent_entries, r.lagging_nodes, r.valid),
        (0, 1, false)
    );
    // Nodes at different applied indexes compare neither queues nor metadata.
    assert_eq!((r.queue_digests_compared, r.state_digests_compared), (0, 0));
}

#[test]
fn each_pair_is_compared_over_what_the_two_hold() {
    // Node 2 holds only index 2 (it installed a snapshot), so no index is held by
    // all three; nodes 0 and 1 still hold 0 and 1, and differ at 1.
    let b = [(0, 1, 7), (1, 1, 5), (2, 2, 9)];
    let r = check(&[
        view(0, 2, &E, (3, 900)),
        view(1, 2, &b, (3, 900)),
        view(2, 2, &E[2..], (3, 900)),
    ]);
    assert_eq!(r.compared_from, 2);
    assert_eq!((r.entries_compared, r.divergent_entries), (3, 1));
    assert_eq!(
        r.pairs
            .iter()
            .map(|p| (p.nodes, p.entries_compared, p.divergent_entries))
            .collect::<Vec<_>>(),
        [((0, 1), 3, 1), ((0, 2), 1, 0), ((1, 2), 1, 0)]
    );
    assert!(!r.valid);
}

#[test]
fn a_node_missing_messages_the_leader_serves_is_flagged() {
    // Node 1 (lagging or not) starts T#0 at 2; the leader, node 0, serves from 0.
    let mut lagging = view(1, 1, &E[..2], (3, 900));
    set_min(&mut lagging, 2);
    let r = check(&[view(0, 2, &E, (3, 900)), lagging]);
    assert_eq!((r.queues_missing_retained, r.valid), (1, false));
    assert!(
        r.examples.iter().any(|e| e.contains("node 0 (leader)")),
        "{r:?}"
    );
    // Two followers at the same applied index, no leader among the views.
    let (mut a, mut b) = (view(1, 2, &E, (3, 900)), view(2, 2, &E, (3, 900)));
    set_min(&mut b, 1);
    let r = check(&digest_shared(vec![a.clone(), b]));
    assert_eq!((r.queues_missing_retained, r.valid), (1, false));
    assert_eq!(
        (r.queue_digests_compared, r.queue_digest_mismatches),
        (1, 0)
    );
    assert!(r
        .examples
        .iter()
        .any(|e| e.starts_with("node 2: T#0 starts at queue offset 1")));
    // A leader that purged more than a follower loses nothing on a failover.
    set_min(&mut a, 0);
    let mut leader = view(0, 2, &E, (3, 900));
    set_min(&mut leader, 1);
    let r = check(&digest_shared(vec![leader, a]));
    assert_eq!((r.queues_missing_retained, r.valid), (0, true), "{r:?}");
}

#[test]
fn a_node_that_purged_first_through_the_group_retention_point_is_not_flagged() {
    // Node 1 purged entry 0 (its log begins at 1, T#0 at 1) on the group's
    // retention point 0; the leader applied the point and has yet to purge.
    let with_point = |mut v: NodeView, point: Option<u64>| {
        v.state.state.as_mut().unwrap().purge_point = point;
        v
    };
    let mut purged = with_point(view(1, 2, &E[1..], (3, 900)), Some(0));
    set_min(&mut purged, 1);
    let leader = with_point(view(0, 2, &E, (3, 900)), Some(0));
    let r = check(&digest_shared(vec![leader.clone(), purged.clone()]));
    assert_eq!((r.queues_missing_retained, r.valid), (0, true), "{r:?}");
    // Without a point that covers entry 0, node 1 lacks what the group retains.
    let r = check(&digest_shared(vec![
        with_point(leader.clone(), None),
        with_point(purged.clone(), None),
    ]));
    assert_eq!((r.queues_missing_retained, r.valid), (1, false), "{r:?}");
    // Retention points that differ at the same applied index are a mismatch.
    let r = check(&digest_shared(vec![leader, with_point(purged, Some(1))]));
    assert_eq!(r.state_mismatches, 1, "{r:?}");
}

#[test]
fn queue_contents_that_differ_are_found() {
    let a = view(0, 2, &E, (3, 900));
    let mut b = view(1, 2, &E, (3, 900));
    digest_queues(&mut b, 78);
    let r = check(&[a.clone(), b.clone()]);
    assert_eq!((r.queue_digest_mismatches, r.valid), (1, false));
    assert_eq!(r.pairs[0].queue_digest_mismatches, 1);
    // A range a node did not digest cannot be shown to agree.
    b.queue_digests.clear();
    let r = check(&[a.clone(), b]);
    assert_eq!((r.queue_digest_mismatches, r.valid), (1, false));
    // Entries whose message a node cannot read.
    let mut c = view(1, 2, &E, (3, 900));
    c.queue_digests.values_mut().for_each(|d| d.unreadable = 2);
    let r = check(&[a, c]);
    assert_eq!(
        (
            r.queue_digest_mismatches,
            r.queue_entries_unreadable,
            r.valid
        ),
        (0, 2, false)
    );
}

#[test]
fn replicated_state_that_differs_at_the_same_applied_index_is_found() {
    let a = view(0, 2, &E, (3, 900));
    for part in 0..5 {
        let mut b = view(1, 2, &E, (3, 900));
        let s = b.state.state.as_mut().unwrap();
        match part {
            0 => s.consumer_offsets_crc32 ^= 1,
            1 => s.fifo_leases = 2,
            2 => s.topics_crc32 ^= 1,
            3 => s.delivery_attempts_crc32 ^= 1,
            _ => s.groups_crc32 ^= 1,
        }
        let r = check(&[a.clone(), b]);
        assert_eq!(
            (r.state_digests_compared, r.state_mismatches, r.valid),
            (1, 1, false),
            "part {part}"
        );
    }
    // Digests taken at different applied indexes are not compared.
    let mut b = view(1, 2, &E, (3, 900));
    let s = b.state.state.as_mut().unwrap();
    s.applied_index = Some(1);
    s.topics_crc32 ^= 1;
    let r = check(&[a, b]);
    assert_eq!((r.state_digests_compared, r.state_mismatches), (0, 0));
}

#[test]
fn shared_queue_ranges_are_what_both_hold() {
    let q = |topic: &str, queue_id, min_offset, max_offset| QueueTail {
        topic: topic.into(),
        queue_id,
        min_offset,
        max_offset,
        last_physical_offset: None,
    };
    let a = LogDigestResponse {
        queues: vec![q("T", 0, 2, 10), q("T", 1, 0, 5), q("U", 0, 0, 3)],
        ..Default::default()
    };
    let b = LogDigestResponse {
        queues: vec![q("T", 0, 0, 8), q("T", 1, 5, 9), q("V", 0, 0, 3)],
        ..Default::default()
    };
    let range = |topic: &str, queue_id, from, to| QueueRange {
        topic: topic.into(),
        queue_id,
        from,
        to,
    };
    assert_eq!(shared_queue_ranges(&a, &b), [range("T", 0, 2, 8)]);
    assert_eq!(union_len(vec![(0, 4), (2, 6), (9, 9)]), 8);
    assert_eq!(union_len(vec![]), 0);
}
