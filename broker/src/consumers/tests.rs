//! [`Consumers`] against a real one-member Raft group in a temporary directory:
//! every lease and offset commit below goes through Raft and is read back from
//! the replicated metadata.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ledgermq_raft::{
    BatchConfig, NetworkFilter, RaftNode, RaftNodeConfig, RaftNodeError, RaftTiming,
};
use ledgermq_store::record::PROPERTY_TAGS;
use ledgermq_store::{MessageRecord, StoreConfig};
use tempfile::TempDir;

use super::*;
use crate::filter::FilterExpr;

pub(super) const TOPIC: &str = "T";
pub(super) const GROUP: &str = "G";

/// A started one-member group and the directory it stores in.
pub(super) struct OneNode {
    pub(super) node: Arc<RaftNode>,
    _dir: TempDir,
}

impl OneNode {
    /// Starts a one-member group and waits until it is a ready leader.
    pub(super) async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let addr = format!("127.0.0.1:{}", ledgermq_testkit::ports::free_port());
        let members = BTreeMap::from([(0, addr.clone())]);
        let node = RaftNode::start(
            RaftNodeConfig {
                node_id: 0,
                listen_addr: addr.parse().unwrap(),
                members,
                store: StoreConfig::small(dir.path(), 64 * 1024),
                timing: RaftTiming {
                    heartbeat_interval_ms: 50,
                    election_timeout_min_ms: 150,
                    election_timeout_max_ms: 300,
                },
                batch: BatchConfig::default(),
                store_host: addr.parse().unwrap(),
                write_timeout_ms: 3000,
                cluster_name: "test-group".into(),
                retention_interval_ms: 0,
                join: false,
                peer_tls: None,
            },
            NetworkFilter::default(),
        )
        .await
        .unwrap();
        let mut status = node.status();
        tokio::time::timeout(
            Duration::from_secs(10),
            status.wait_for(|s| s.ready_term.is_some()),
        )
        .await
        .expect("the one member became a ready leader")
        .unwrap();
        Self { node, _dir: dir }
    }

    /// Stores messages `bodies` on queue `queue_id`, the tag of each from `tag`.
    pub(super) async fn send(
        &self,
        queue_id: i32,
        bodies: &[&str],
        tag: impl Fn(&str) -> &'static str,
    ) {
        let messages = bodies
            .iter()
            .map(|b| {
                MessageRecord::message(TOPIC, queue_id, b.as_bytes().to_vec(), 0)
                    .with_property(PROPERTY_TAGS, tag(b))
            })
            .collect();
        self.node.write_messages(messages).await.unwrap();
    }

    pub(super) fn term(&self) -> u64 {
        self.node.status_now().ready_term.unwrap()
    }

    /// The committed offset of `consumer` on queue `queue_id`.
    pub(super) fn committed(&self, consumer: &str, queue_id: i32) -> Option<u64> {
        let meta = self.node.shared_meta().read().unwrap();
        meta.offsets
            .get(&(consumer.to_owned(), TOPIC.to_owned(), queue_id))
            .copied()
    }

    /// The offsets of `consumer`'s stored FIFO lease on queue `queue_id`: its
    /// batch's, or its single lease's.
    pub(super) fn leased(&self, consumer: &str, queue_id: i32) -> Vec<u64> {
        let k = (consumer.to_owned(), TOPIC.to_owned(), queue_id);
        let meta = self.node.shared_meta().read().unwrap();
        match meta.fifo_batches.get(&k) {
            Some(b) => b.deliveries.iter().map(|d| d.queue_offset).collect(),
            None => meta
                .fifo_leases
                .get(&k)
                .map(|l| l.queue_offset)
                .into_iter()
                .collect(),
        }
    }

    /// The stored FIFO batch lease of `consumer` on queue `queue_id`.
    pub(super) fn batch(&self, consumer: &str, queue_id: i32) -> Option<FifoBatchLease> {
        let meta = self.node.shared_meta().read().unwrap();
        meta.fifo_batches
            .get(&(consumer.to_owned(), TOPIC.to_owned(), queue_id))
            .cloned()
    }

    /// The stored FIFO lease of `consumer` on queue `queue_id`.
    pub(super) fn lease(&self, consumer: &str, queue_id: i32) -> Option<FifoLease> {
        let meta = self.node.shared_meta().read().unwrap();
        meta.fifo_leases
            .get(&(consumer.to_owned(), TOPIC.to_owned(), queue_id))
            .cloned()
    }
}

pub(super) fn request(
    queue_ids: &[i32],
    max_messages: usize,
    invisible_ms: u64,
    fifo: bool,
) -> PopRequest {
    PopRequest {
        record_attempts: false,
        group: GROUP.into(),
        consumer: GROUP.into(),
        topic: TOPIC.into(),
        queue_ids: queue_ids.to_vec(),
        max_messages,
        invisible_ms,
        fifo,
        filter: TagFilter::All,
        max_delivery_attempts: 16,
    }
}

pub(super) fn bodies(r: &PopResult) -> Vec<String> {
    r.messages
        .iter()
        .map(|d| String::from_utf8(d.record.body.clone()).unwrap())
        .collect()
}

pub(super) fn handle(d: &Delivery) -> ReceiptHandle {
    ReceiptHandle::decode(&d.fields.receipt_handle).unwrap()
}

pub(super) fn any_tag(_: &str) -> &'static str {
    "a"
}

#[tokio::test]
async fn messages_are_taken_in_queue_order_and_stay_hidden_while_in_flight() {
    let n = OneNode::start().await;
    n.send(0, &["m0", "m1", "m2"], any_tag).await;
    let c = Consumers::new(n.node.clone());
    let req = request(&[0], 2, 60_000, false);

    let first = c.pop(&req).await.unwrap();
    assert_eq!(bodies(&first), ["m0", "m1"]);
    let offsets: Vec<u64> = first
        .messages
        .iter()
        .map(|d| d.fields.queue_offset)
        .collect();
    assert_eq!(offsets, [0, 1]);
    assert!(first
        .messages
        .iter()
        .all(|d| d.fields.delivery_attempt == 1));
    assert_eq!(bodies(&c.pop(&req).await.unwrap()), ["m2"]);
    assert!(c.pop(&req).await.unwrap().messages.is_empty());
}

#[tokio::test]
async fn an_expired_delivery_comes_back_with_its_next_attempt_and_the_old_handle_is_stale() {
    let n = OneNode::start().await;
    n.send(0, &["m0"], any_tag).await;
    let c = Consumers::new(n.node.clone());
    let req = request(&[0], 1, 30, false);

    let first = c.pop(&req).await.unwrap();
    let old = handle(&first.messages[0]);
    tokio::time::sleep(Duration::from_millis(60)).await;
    let again = c.pop(&req).await.unwrap();
    assert_eq!(bodies(&again), ["m0"]);
    assert_eq!(again.messages[0].fields.delivery_attempt, 2);

    let e = c.ack(GROUP, &old, false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidReceiptHandle);
    let e = c
        .change_invisible(GROUP, &old, 1000, false)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidReceiptHandle);
    c.ack(GROUP, &handle(&again.messages[0]), false)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_handle_past_the_queue_end_is_refused() {
    let n = OneNode::start().await;
    n.send(0, &["m0"], any_tag).await;
    let c = Consumers::new(n.node.clone());
    let mut h = handle(
        &c.pop(&request(&[0], 1, 60_000, false))
            .await
            .unwrap()
            .messages[0],
    );
    h.queue_offset = 5;
    let e = c.ack(GROUP, &h, false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidReceiptHandle);
}

#[tokio::test]
async fn clustering_acks_are_committed_through_raft_for_the_tables_term_once_they_move() {
    let n = OneNode::start().await;
    n.send(0, &["m0", "m1", "m2"], any_tag).await;
    let c = Consumers::new(n.node.clone());
    let term = n.term();
    let got = c.pop(&request(&[0], 3, 60_000, false)).await.unwrap();
    // m0 and m2 acked, m1 still in flight: the group may continue after m0 only.
    c.ack(GROUP, &handle(&got.messages[0]), false)
        .await
        .unwrap();
    c.ack(GROUP, &handle(&got.messages[2]), false)
        .await
        .unwrap();
    assert_eq!(n.committed(GROUP, 0), None, "acks wait for the committer");

    assert_eq!(
        c.commit_offsets_once(term + 1).await.unwrap(),
        0,
        "another term's"
    );
    assert_eq!(c.commit_offsets_once(term).await.unwrap(), 1);
    assert_eq!(n.committed(GROUP, 0), Some(1));
    assert_eq!(
        c.commit_offsets_once(term).await.unwrap(),
        0,
        "nothing moved"
    );

    c.ack(GROUP, &handle(&got.messages[1]), false)
        .await
        .unwrap();
    assert_eq!(c.commit_offsets_once(term).await.unwrap(), 1);
    assert_eq!(n.committed(GROUP, 0), Some(3));
}

#[tokio::test]
async fn a_new_table_starts_at_the_committed_offset() {
    let n = OneNode::start().await;
    n.send(0, &["m0", "m1", "m2"], any_tag).await;
    let c = Consumers::new(n.node.clone());
    let got = c.pop(&request(&[0], 2, 60_000, false)).await.unwrap();
    for d in &got.messages {
        c.ack(GROUP, &handle(d), false).await.unwrap();
    }
    c.commit_offsets_once(n.term()).await.unwrap();

    // The table a new leader builds from the replicated metadata.
    let next = Consumers::new(n.node.clone());
    let got = next.pop(&request(&[0], 3, 60_000, false)).await.unwrap();
    assert_eq!(bodies(&got), ["m2"]);
}

#[tokio::test]
async fn a_fifo_queue_hands_out_one_message_at_a_time_and_commits_each_ack_before_answering() {
    let n = OneNode::start().await;
    n.send(0, &["f0", "f1"], any_tag).await;
    n.send(1, &["g0"], any_tag).await;
    let c = Consumers::new(n.node.clone());
    // As while a member decodes no batch leases.
    c.single_fifo_leases.store(true, Ordering::Relaxed);
    let req = request(&[0, 1], 10, 60_000, true);

    let first = c.pop(&req).await.unwrap();
    assert_eq!(
        bodies(&first),
        ["f0", "g0"],
        "one message per queue and call"
    );
    let lease = n
        .lease(GROUP, 0)
        .expect("the delivery's lease is replicated");
    let h0 = handle(&first.messages[0]);
    assert_eq!((lease.queue_offset, lease.delivery_id), (0, h0.delivery_id));
    assert!(
        c.pop(&req).await.unwrap().messages.is_empty(),
        "f1 waits for f0"
    );

    c.ack(GROUP, &h0, true).await.unwrap();
    assert_eq!(
        n.committed(GROUP, 0),
        Some(1),
        "committed before the answer"
    );
    assert_eq!(bodies(&c.pop(&req).await.unwrap()), ["f1"]);
}

#[tokio::test]
async fn a_new_table_adopts_the_fifo_delivery_in_flight() {
    let n = OneNode::start().await;
    n.send(0, &["f0", "f1"], any_tag).await;
    let c = Consumers::new(n.node.clone());
    // Long enough that the new table surely adopts it before it ends.
    let first = c.pop(&request(&[0], 1, 3_000, true)).await.unwrap();
    assert_eq!(bodies(&first), ["f0"]);

    let next = Consumers::new(n.node.clone());
    let req = request(&[0], 1, 60_000, true);
    assert!(
        next.pop(&req).await.unwrap().messages.is_empty(),
        "f0 is still invisible, and f1 waits for it"
    );
    // The old handle is the adopted delivery: its ack counts, another's does not.
    let old = handle(&first.messages[0]);
    assert!(next.is_current(GROUP, &old, true).await.unwrap());
    let mut other = old.clone();
    other.delivery_id += 1;
    assert!(!next.is_current(GROUP, &other, true).await.unwrap());
    tokio::time::sleep(Duration::from_millis(3_100)).await;
    let again = next.pop(&req).await.unwrap();
    assert_eq!(bodies(&again), ["f0"]);
    assert_eq!(again.messages[0].fields.delivery_attempt, 2);
}

#[tokio::test]
async fn a_fifo_change_of_invisible_time_is_replicated_before_it_is_answered() {
    let n = OneNode::start().await;
    n.send(0, &["f0"], any_tag).await;
    let c = Consumers::new(n.node.clone());
    c.single_fifo_leases.store(true, Ordering::Relaxed);
    let got = c.pop(&request(&[0], 1, 1_000, true)).await.unwrap();
    let h = handle(&got.messages[0]);
    let before = n.lease(GROUP, 0).unwrap().visible_at_ms;
    c.change_invisible(GROUP, &h, 600_000, true).await.unwrap();
    let after = n.lease(GROUP, 0).unwrap();
    assert_eq!(after.delivery_id, h.delivery_id);
    assert!(
        after.visible_at_ms >= before + 500_000,
        "{before} -> {after:?}"
    );
}

#[tokio::test]
async fn a_message_out_of_attempts_goes_to_the_dead_letters_not_to_the_consumer() {
    let n = OneNode::start().await;
    n.send(0, &["m0", "m1"], any_tag).await;
    let c = Consumers::new(n.node.clone());
    let mut req = request(&[0], 1, 20, false);
    req.max_delivery_attempts = 1;
    assert_eq!(bodies(&c.pop(&req).await.unwrap()), ["m0"]);
    tokio::time::sleep(Duration::from_millis(50)).await;

    let got = c.pop(&req).await.unwrap();
    assert_eq!(got.dead.len(), 1);
    assert_eq!(got.dead[0].record.body, b"m0");
    assert_eq!(got.dead[0].handle.queue_offset, 0);
    assert_eq!(bodies(&got), ["m1"], "the call goes on to the next message");
}

#[tokio::test]
async fn a_tag_filter_skips_other_tags_and_the_group_moves_past_them() {
    let n = OneNode::start().await;
    n.send(0, &["a0", "b0", "a1", "b1"], |b| {
        if b.starts_with('a') {
            "a"
        } else {
            "b"
        }
    })
    .await;
    let c = Consumers::new(n.node.clone());
    let mut req = request(&[0], 10, 60_000, false);
    req.filter = TagFilter::parse(Some(&FilterExpr::Tag("b".into()))).unwrap();
    let got = c.pop(&req).await.unwrap();
    assert_eq!(bodies(&got), ["b0", "b1"]);
    for d in &got.messages {
        c.ack(GROUP, &handle(d), false).await.unwrap();
    }
    c.commit_offsets_once(n.term()).await.unwrap();
    assert_eq!(
        n.committed(GROUP, 0),
        Some(4),
        "skipped messages count as consumed"
    );
}

#[tokio::test]
async fn a_lease_bound_to_another_term_is_refused_and_leaves_the_message_deliverable() {
    let n = OneNode::start().await;
    n.send(0, &["f0"], any_tag).await;
    let c = Consumers::new(n.node.clone());
    let term = n.term();
    let stale = c
        .commit_leases(
            term + 7,
            vec![TimedFifoLease {
                lease: FifoLease {
                    group: GROUP.into(),
                    topic: TOPIC.into(),
                    queue_id: 0,
                    queue_offset: 0,
                    delivery_id: 1,
                    attempt: 1,
                    visible_at_ms: now_ms() + 60_000,
                },
                invisible_ms: 60_000,
            }],
        )
        .await;
    assert!(
        matches!(
            stale,
            Err(BrokerError::Raft(RaftNodeError::StaleTerm { proposed_term, entry_term }))
                if proposed_term == term + 7 && entry_term == term
        ),
        "a lease of another term is refused by the term rule: {stale:?}"
    );
    assert!(n.lease(GROUP, 0).is_none());
    let got = c.pop(&request(&[0], 1, 60_000, true)).await.unwrap();
    assert_eq!(bodies(&got), ["f0"]);
    assert_eq!(got.messages[0].fields.delivery_attempt, 1);
}

#[tokio::test]
async fn a_reset_rewinds_the_group_drops_what_the_leader_tracked_and_refuses_older_handles() {
    let n = OneNode::start().await;
    n.send(0, &["m0", "m1", "m2", "m3", "m4"], any_tag).await;
    let c = Consumers::new(n.node.clone());
    let term = n.term();
    let acked = c.pop(&request(&[0], 4, 60_000, false)).await.unwrap();
    assert_eq!(bodies(&acked), ["m0", "m1", "m2", "m3"]);
    for d in &acked.messages {
        c.ack(GROUP, &handle(d), false).await.unwrap();
    }
    let in_flight = c.pop(&request(&[0], 1, 60_000, false)).await.unwrap();
    assert_eq!(bodies(&in_flight), ["m4"]);
    // The acks are not committed yet: the reset must not let them land after it.
    let done = c
        .reset_offsets(GROUP, TOPIC, &[(0, 1)], false)
        .await
        .unwrap();
    assert_eq!(
        done,
        [QueueReset {
            queue_id: 0,
            previous_offset: 4,
            offset: 1
        }]
    );
    assert_eq!(n.committed(GROUP, 0), Some(1));
    assert_eq!(c.commit_offsets_once(term).await.unwrap(), 0);
    assert_eq!(n.committed(GROUP, 0), Some(1));
    // m4's delivery was made before the reset: its handle no longer acks.
    let e = c
        .ack(GROUP, &handle(&in_flight.messages[0]), false)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidReceiptHandle, "{e}");
    // The rewound range is delivered again, as first deliveries, m4 included.
    let again = c.pop(&request(&[0], 10, 60_000, false)).await.unwrap();
    assert_eq!(bodies(&again), ["m1", "m2", "m3", "m4"]);
    assert!(again
        .messages
        .iter()
        .all(|d| d.fields.delivery_attempt == 1));
    c.ack(GROUP, &handle(&again.messages[0]), false)
        .await
        .unwrap();
    assert_eq!(c.commit_offsets_once(term).await.unwrap(), 1);
    assert_eq!(n.committed(GROUP, 0), Some(2));
}

#[tokio::test]
async fn a_reset_voids_a_fifo_delivery_in_flight() {
    let n = OneNode::start().await;
    n.send(0, &["f0", "f1"], any_tag).await;
    let c = Consumers::new(n.node.clone());
    let fifo = request(&[0], 1, 60_000, true);
    let first = c.pop(&fifo).await.unwrap();
    assert_eq!(bodies(&first), ["f0"]);
    c.ack(GROUP, &handle(&first.messages[0]), true)
        .await
        .unwrap();
    let second = c.pop(&fifo).await.unwrap();
    assert_eq!(bodies(&second), ["f1"]);
    assert_eq!(n.leased(GROUP, 0), [1]);
    // Back to the start: the lease on f1 goes, and f0 is next at once.
    c.reset_offsets(GROUP, TOPIC, &[(0, 0)], true)
        .await
        .unwrap();
    assert_eq!(n.leased(GROUP, 0), Vec::<u64>::new());
    assert_eq!(n.committed(GROUP, 0), Some(0));
    assert_eq!(bodies(&c.pop(&fifo).await.unwrap()), ["f0"]);
}

#[tokio::test]
async fn a_reset_waits_for_the_calls_under_way() {
    let n = OneNode::start().await;
    n.send(0, &["m0", "m1"], any_tag).await;
    let c = Consumers::new(n.node.clone());
    let got = c.pop(&request(&[0], 2, 60_000, false)).await.unwrap();
    assert_eq!(bodies(&got), ["m0", "m1"]);
    // A call under way (an ack's or the committer's Raft write) holds the gate.
    let under_way = c.gate.read().await;
    let reset = tokio::spawn({
        let c = c.clone();
        async move { c.reset_offsets(GROUP, TOPIC, &[(0, 0)], false).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !reset.is_finished(),
        "the reset went ahead of a call under way"
    );
    drop(under_way);
    let done = reset.await.unwrap().unwrap();
    assert_eq!(done[0].offset, 0);
    assert_eq!(n.committed(GROUP, 0), Some(0));
}
