//! FIFO batches against a real one-member Raft group: what a receive hands
//! out, what it records through Raft, and what a new leader takes over.

use std::time::Duration;

use super::super::tests::{any_tag, bodies, handle, request, OneNode, GROUP};
use super::super::Consumers;
use crate::error::ErrorKind;

#[tokio::test]
async fn a_fifo_queue_hands_out_a_batch_in_order_and_one_ack_call_commits_once() {
    let n = OneNode::start().await;
    n.send(0, &["f0", "f1", "f2", "f3"], any_tag).await;
    n.send(1, &["g0"], any_tag).await;
    let c = Consumers::new(n.node.clone());
    let req = request(&[0, 1], 10, 60_000, true);

    let first = c.pop(&req).await.unwrap();
    assert_eq!(bodies(&first), ["f0", "f1", "f2", "f3", "g0"]);
    // Every delivery of the queue is replicated before the answer.
    let batch = n.batch(GROUP, 0).expect("the batch lease is replicated");
    let ids: Vec<_> = batch.deliveries.iter().map(|d| d.delivery_id).collect();
    let handles: Vec<_> = first.messages.iter().map(handle).collect();
    assert_eq!(
        ids,
        handles[..4]
            .iter()
            .map(|h| h.delivery_id)
            .collect::<Vec<_>>()
    );
    assert_eq!(n.leased(GROUP, 1), [0]);
    assert!(
        c.pop(&req).await.unwrap().messages.is_empty(),
        "the queues wait"
    );

    // f0 and f1 in one call: one commit to 2 before the answer.
    let applied_before = n.node.shared_meta().read().unwrap().applied_index;
    let acked = c.ack_many(GROUP, &handles[..2], true).await;
    assert!(acked.iter().all(|r| r.is_ok()), "{acked:?}");
    assert_eq!(n.committed(GROUP, 0), Some(2));
    let applied_after = n.node.shared_meta().read().unwrap().applied_index;
    assert_eq!(
        applied_after.unwrap() - applied_before.unwrap(),
        1,
        "one Raft write"
    );
    assert!(
        c.pop(&req).await.unwrap().messages.is_empty(),
        "f2 and f3 still in flight"
    );
    // Out of order in one call: f3, then f2 (and f3 again): committed to 4.
    let acked = c
        .ack_many(
            GROUP,
            &[handles[3].clone(), handles[2].clone(), handles[3].clone()],
            true,
        )
        .await;
    assert!(acked.iter().all(|r| r.is_ok()), "{acked:?}");
    assert_eq!(n.committed(GROUP, 0), Some(4));
    n.send(0, &["f4"], any_tag).await;
    assert_eq!(
        bodies(&c.pop(&request(&[0], 10, 60_000, true)).await.unwrap()),
        ["f4"]
    );
}

#[tokio::test]
async fn a_batch_comes_back_whole_and_in_order_once_all_of_it_is_visible() {
    let n = OneNode::start().await;
    n.send(0, &["f0", "f1", "f2"], any_tag).await;
    let c = Consumers::new(n.node.clone());
    let first = c.pop(&request(&[0], 10, 1_000, true)).await.unwrap();
    let h: Vec<_> = first.messages.iter().map(handle).collect();
    // f1 acked out of order: nothing committed, and it is not delivered again.
    assert!(c.ack_many(GROUP, &h[1..2], true).await[0].is_ok());
    assert_eq!(n.committed(GROUP, 0), Some(0));
    // f0's invisible time is longer now: f2, visible first, waits for it.
    c.change_invisible(GROUP, &h[0], 2_000, true).await.unwrap();
    let d = n.batch(GROUP, 0).unwrap().deliveries;
    assert_eq!(d.iter().map(|d| d.queue_offset).collect::<Vec<_>>(), [0, 2]);
    assert!(
        d[0].invisible_ms > 1_500 && d[1].invisible_ms <= 1_000,
        "{d:?}"
    );
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let req = request(&[0], 10, 60_000, true);
    assert!(
        c.pop(&req).await.unwrap().messages.is_empty(),
        "f0 still invisible"
    );
    tokio::time::sleep(Duration::from_millis(900)).await;
    n.send(0, &["f3"], any_tag).await;
    let again = c.pop(&req).await.unwrap();
    assert_eq!(bodies(&again), ["f0", "f2", "f3"]);
    let attempts: Vec<_> = again
        .messages
        .iter()
        .map(|m| m.fields.delivery_attempt)
        .collect();
    assert_eq!(attempts, [2, 2, 1]);
    // The old handles are stale; the call answers each on its own.
    let mixed = c
        .ack_many(GROUP, &[h[0].clone(), handle(&again.messages[0])], true)
        .await;
    assert_eq!(
        mixed[0].as_ref().unwrap_err().kind(),
        ErrorKind::InvalidReceiptHandle
    );
    assert!(mixed[1].is_ok());
    assert_eq!(n.committed(GROUP, 0), Some(2), "f1 was acked before");
}

#[tokio::test]
async fn a_new_table_adopts_the_batch_in_flight_and_never_delivers_an_acked_message_again() {
    let n = OneNode::start().await;
    n.send(0, &["f0", "f1", "f2", "f3"], any_tag).await;
    let c = Consumers::new(n.node.clone());
    // Long enough that the new table surely adopts it before it ends.
    let first = c.pop(&request(&[0], 3, 3_000, true)).await.unwrap();
    assert_eq!(bodies(&first), ["f0", "f1", "f2"]);
    let h: Vec<_> = first.messages.iter().map(handle).collect();
    // f0 and, out of order, f2: the lease says only f1 is in flight.
    let acked = c.ack_many(GROUP, &[h[0].clone(), h[2].clone()], true).await;
    assert!(acked.iter().all(|r| r.is_ok()), "{acked:?}");
    assert_eq!(n.committed(GROUP, 0), Some(1));
    assert_eq!(n.leased(GROUP, 0), [1]);

    let next = Consumers::new(n.node.clone());
    // Its ids above the first table's, as a new term's would be.
    next.delivery_seq
        .store(1_000, std::sync::atomic::Ordering::Relaxed);
    let req = request(&[0], 10, 60_000, true);
    assert!(
        next.pop(&req).await.unwrap().messages.is_empty(),
        "f1 is still invisible, and f3 waits for it"
    );
    assert!(next.is_current(GROUP, &h[1], true).await.unwrap());
    let mut other = h[1].clone();
    other.delivery_id += 100;
    assert!(!next.is_current(GROUP, &other, true).await.unwrap());
    tokio::time::sleep(Duration::from_millis(3_100)).await;
    let again = next.pop(&req).await.unwrap();
    assert_eq!(bodies(&again), ["f1", "f3"], "f2 was acked");
    assert_eq!(again.messages[0].fields.delivery_attempt, 2);
    // The old handle of f1 is stale now; the new one acks it and moves the
    // group past the acked f2.
    let r = next
        .ack_many(GROUP, &[h[1].clone(), handle(&again.messages[0])], true)
        .await;
    assert_eq!(
        r[0].as_ref().unwrap_err().kind(),
        ErrorKind::InvalidReceiptHandle
    );
    assert!(r[1].is_ok());
    assert_eq!(n.committed(GROUP, 0), Some(3));
}

#[tokio::test]
async fn with_a_member_of_an_earlier_release_a_batch_is_only_acked_in_order_and_then_continued_one_by_one(
) {
    let n = OneNode::start().await;
    n.send(0, &["f0", "f1", "f2"], any_tag).await;
    let c = Consumers::new(n.node.clone());
    let first = c.pop(&request(&[0], 10, 1_000, true)).await.unwrap();
    let h: Vec<_> = first.messages.iter().map(handle).collect();
    // As once a member says it decodes no batch leases: a single lease on f1
    // would say f0 is acked, and an offset commit cannot record f2's ack.
    c.single_fifo_leases
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let e = c
        .change_invisible(GROUP, &h[1], 90_000, true)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    let r = c.ack_many(GROUP, &h[2..], true).await;
    assert_eq!(r[0].as_ref().unwrap_err().kind(), ErrorKind::Unsupported);
    assert_eq!(n.leased(GROUP, 0), [0, 1, 2]);
    // Once visible again, the batch is not handed out by single leases.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let req = request(&[0], 10, 60_000, true);
    assert!(c.pop(&req).await.unwrap().messages.is_empty());
    // In queue order (given in any order in one call): offset commits.
    let r = c.ack_many(GROUP, &[h[1].clone(), h[0].clone()], true).await;
    assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
    assert_eq!(n.committed(GROUP, 0), Some(2));
    // f2 alone in flight: a single lease says it all; one message at a time.
    n.send(0, &["f3"], any_tag).await;
    let again = c.pop(&req).await.unwrap();
    assert_eq!(bodies(&again), ["f2"]);
    assert_eq!(n.lease(GROUP, 0).unwrap().queue_offset, 2);
    assert!(n.batch(GROUP, 0).is_none());
}

#[tokio::test]
async fn a_handle_given_twice_is_acked_once_and_one_acked_before_writes_nothing() {
    let n = OneNode::start().await;
    n.send(0, &["f0"], any_tag).await;
    let c = Consumers::new(n.node.clone());
    let first = c.pop(&request(&[0], 10, 60_000, true)).await.unwrap();
    let h = handle(&first.messages[0]);
    let r = c.ack_many(GROUP, &[h.clone(), h.clone()], true).await;
    assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
    assert_eq!(n.committed(GROUP, 0), Some(1));
    // Acked by an earlier call: OK, and nothing written.
    let before = n.node.shared_meta().read().unwrap().applied_index;
    assert!(c.ack_many(GROUP, &[h], true).await[0].is_ok());
    assert_eq!(n.node.shared_meta().read().unwrap().applied_index, before);
}

#[tokio::test]
async fn an_ack_of_a_fifo_message_not_in_flight_is_refused_and_the_message_still_comes() {
    let n = OneNode::start().await;
    n.send(0, &["f0", "f1"], any_tag).await;
    let c = Consumers::new(n.node.clone());
    let first = c.pop(&request(&[0], 1, 60_000, true)).await.unwrap();
    assert_eq!(bodies(&first), ["f0"]);
    // A handle of f1, which no receive handed out.
    let mut forged = handle(&first.messages[0]);
    forged.queue_offset = 1;
    let r = c.ack_many(GROUP, &[forged], true).await;
    assert_eq!(
        r[0].as_ref().unwrap_err().kind(),
        ErrorKind::InvalidReceiptHandle
    );
    assert!(c.ack_many(GROUP, &[handle(&first.messages[0])], true).await[0].is_ok());
    let next = c.pop(&request(&[0], 10, 60_000, true)).await.unwrap();
    assert_eq!(bodies(&next), ["f1"]);
}

#[tokio::test]
async fn with_a_member_of_an_earlier_release_a_batch_leased_message_keeps_its_invisible_time() {
    let n = OneNode::start().await;
    n.send(0, &["f0"], any_tag).await;
    let c = Consumers::new(n.node.clone());
    let first = c.pop(&request(&[0], 10, 60_000, true)).await.unwrap();
    let h = handle(&first.messages[0]);
    c.single_fifo_leases
        .store(true, std::sync::atomic::Ordering::Relaxed);
    // One message in flight, but its batch lease is newer than its delivery:
    // a single lease of it would not be stored.
    let e = c
        .change_invisible(GROUP, &h, 90_000, true)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert!(n.batch(GROUP, 0).is_some() && n.lease(GROUP, 0).is_none());
}
