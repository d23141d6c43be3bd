//! The FIFO delivery checker, over receives and acks of messages with a message
//! group (RocketMQ 5 FIFO semantics, as the 5.x clients rely on them):
//!
//! - one message of a group in flight at a time: a message is delivered only after
//!   the group's previous message was acked (its ack invoked before this delivery
//!   was answered) or its invisible time ran out (counted from the invoke of the
//!   receive that delivered it, the earliest its lease can have begun). Messages
//!   handed out in one receive answer are one delivery, in order;
//! - an ack answered OK is final: the message is never delivered again by a
//!   receive invoked after that answer;
//! - one delivery of a message in flight at a time: a message is delivered again
//!   only once an ack of it was invoked or its previous delivery's invisible time
//!   ran out (the same bounds as above; deliveries are taken in the order they
//!   were answered).
//!
//! An ack releases its message from its invoke on, unless it was answered with a
//! definite failure (`fail`: the broker says it did nothing), which releases
//! nothing; one answered OK or with an unknown outcome (`info`, or no answer by
//! the end of the history) may have taken effect, so it counts. The workload
//! acks at once, so a release is seldom far from its delivery: these checks see
//! two consumers holding a message mostly when an ack failed, or when the second
//! delivery is answered before the first consumer's ack was invoked.
//!
//! Plain functions of the history: no I/O.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::checker::note_example;
use crate::history::{Op, OpFn, OpType};

/// Findings of the FIFO delivery checker.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FifoDelivery {
    /// Deliveries of FIFO messages.
    pub deliveries: usize,
    /// Acks of FIFO messages answered OK.
    pub acks_ok: usize,
    /// Deliveries of a message whose ack had been answered OK before the receive
    /// was invoked.
    pub redelivered_after_ack: usize,
    /// Deliveries of a group's next message while the previous one was still in
    /// flight (neither acked nor past its invisible time).
    pub delivered_while_previous_in_flight: usize,
    /// Deliveries of a message while an earlier delivery of that same message was
    /// still in flight (neither acked nor past its invisible time).
    pub delivered_again_while_in_flight: usize,
    /// Examples, one line each.
    pub examples: Vec<String>,
    /// No finding.
    pub valid: bool,
}

/// One delivery of a FIFO message.
struct Delivery<'a> {
    id: &'a str,
    group: &'a str,
    /// The receive's invoke and answer, ms.
    invoked_ms: u64,
    answered_ms: u64,
    /// Which receive answer it came in.
    receive: usize,
}

/// Records that the FIFO messages of ack `invoke`, invoked at `t` ms, may be
/// released from then on (the earliest such time per message is kept).
fn release<'a>(first: &mut HashMap<&'a str, u64>, invoke: &'a Op, t: u64) {
    for d in invoke.delivered.iter().filter(|d| d.group.is_some()) {
        let e = first.entry(&d.id).or_insert(t);
        *e = (*e).min(t);
    }
}

/// Runs the checker; `invisible_ms` is the invisible duration the consumers ask.
pub fn fifo_delivery(ops: &[Op], invisible_ms: u64) -> FifoDelivery {
    let mut receive_invoked: HashMap<u64, u64> = HashMap::new();
    let mut deliveries: Vec<Delivery<'_>> = Vec::new();
    // Per message: when an ack that may have taken effect was first invoked, and
    // when one was first answered OK. Per process: the ack it has in flight.
    let mut first_ack_invoke: HashMap<&str, u64> = HashMap::new();
    let mut first_ack_ok: HashMap<&str, u64> = HashMap::new();
    let mut ack_in_flight: HashMap<u64, (u64, &Op)> = HashMap::new();
    for (i, o) in ops.iter().enumerate() {
        match (o.f, o.op_type) {
            (OpFn::Receive, OpType::Invoke) => {
                receive_invoked.insert(o.process, o.time_ms);
            }
            (OpFn::Receive, t) => {
                let Some(invoked_ms) = receive_invoked.remove(&o.process) else {
                    continue;
                };
                if t != OpType::Ok {
                    continue;
                }
                for d in &o.delivered {
                    if let Some(group) = d.group.as_deref() {
                        deliveries.push(Delivery {
                            id: &d.id,
                            group,
                            invoked_ms,
                            answered_ms: o.time_ms,
                            receive: i,
                        });
                    }
                }
            }
            (OpFn::Ack, OpType::Invoke) => {
                // An earlier one never answered: unknown, it releases.
                if let Some((t, prev)) = ack_in_flight.insert(o.process, (o.time_ms, o)) {
                    release(&mut first_ack_invoke, prev, t);
                }
            }
            (OpFn::Ack, t) => {
                let Some((invoked_ms, invoke)) = ack_in_flight.remove(&o.process) else {
                    continue;
                };
                if t != OpType::Fail {
                    release(&mut first_ack_invoke, invoke, invoked_ms);
                }
                if t == OpType::Ok {
                    for d in o.delivered.iter().filter(|d| d.group.is_some()) {
                        first_ack_ok.entry(&d.id).or_insert(o.time_ms);
                    }
                }
            }
            (OpFn::Send, _) => {}
        }
    }
    for (t, invoke) in ack_in_flight.into_values() {
        release(&mut first_ack_invoke, invoke, t);
    }
    let mut r = FifoDelivery {
        deliveries: deliveries.len(),
        acks_ok: first_ack_ok.len(),
        ..Default::default()
    };
    for d in &deliveries {
        if let Some(&acked) = first_ack_ok.get(d.id) {
            if d.invoked_ms > acked {
                r.redelivered_after_ack += 1;
                note_example(
                    &mut r.examples,
                    format!(
                        "{} delivered by a receive invoked at {} ms, after its ack was answered OK at {acked} ms",
                        d.id, d.invoked_ms
                    ),
                );
            }
        }
    }
    let mut by_group: BTreeMap<&str, Vec<&Delivery<'_>>> = BTreeMap::new();
    for d in &deliveries {
        by_group.entry(d.group).or_default().push(d);
    }
    for (group, mut ds) in by_group {
        ds.sort_by_key(|d| (d.answered_ms, d.receive));
        // The message in flight and when its latest lease can have begun.
        let mut current: Option<(&str, u64, usize)> = None;
        for d in ds {
            if let Some((prev, leased_ms, receive)) = current {
                let acked = first_ack_invoke
                    .get(prev)
                    .is_some_and(|&t| t <= d.answered_ms);
                let expired = d.answered_ms >= leased_ms + invisible_ms;
                if receive != d.receive && !acked && !expired {
                    if prev != d.id {
                        r.delivered_while_previous_in_flight += 1;
                        note_example(
                            &mut r.examples,
                            format!(
                                "group {group}: {} delivered at {} ms while {prev} (leased from {leased_ms} ms) was neither acked nor expired",
                                d.id, d.answered_ms
                            ),
                        );
                    } else {
                        r.delivered_again_while_in_flight += 1;
                        note_example(
                            &mut r.examples,
                            format!(
                                "group {group}: {prev} delivered again at {} ms while its delivery leased from {leased_ms} ms was neither acked nor expired",
                                d.answered_ms
                            ),
                        );
                    }
                }
            }
            current = Some((d.id, d.invoked_ms, d.receive));
        }
    }
    r.valid = r.redelivered_after_ack == 0
        && r.delivered_while_previous_in_flight == 0
        && r.delivered_again_while_in_flight == 0;
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Delivered;

    fn op(time_ms: u64, process: u64, f: OpFn, t: OpType, ids: &[&str]) -> Op {
        Op {
            time_ms,
            process,
            op_type: t,
            f,
            sent: None,
            delivered: ids
                .iter()
                .map(|id| Delivered {
                    id: id.to_string(),
                    broker: "broker-a".into(),
                    topic: "F".into(),
                    queue_id: 0,
                    queue_offset: 0,
                    group: Some("g".into()),
                    seq: None,
                })
                .collect(),
            error: None,
            node: None,
            pinned_to: None,
        }
    }

    /// A receive of `ids` invoked at `t` and answered at `t + 10`.
    fn receive(h: &mut Vec<Op>, t: u64, p: u64, ids: &[&str]) {
        h.push(op(t, p, OpFn::Receive, OpType::Invoke, &[]));
        h.push(op(t + 10, p, OpFn::Receive, OpType::Ok, ids));
    }

    /// An ack of `id` invoked at `t` and answered `outcome` at `t + 5`.
    fn ack(h: &mut Vec<Op>, t: u64, p: u64, id: &str, outcome: OpType) {
        h.push(op(t, p, OpFn::Ack, OpType::Invoke, &[id]));
        h.push(op(t + 5, p, OpFn::Ack, outcome, &[id]));
    }

    #[test]
    fn one_message_of_a_group_in_flight_and_acks_are_final() {
        let mut h = Vec::new();
        receive(&mut h, 0, 1, &["a"]);
        ack(&mut h, 20, 1, "a", OpType::Ok);
        receive(&mut h, 30, 2, &["b", "c"]); // a batch: b then c, in order
        ack(&mut h, 50, 2, "b", OpType::Ok);
        ack(&mut h, 60, 2, "c", OpType::Info); // unknown: c may come back
        receive(&mut h, 70, 1, &["c"]); // ...and it does, at once: it is c again
        ack(&mut h, 90, 1, "c", OpType::Ok);
        let r = fifo_delivery(&h, 1_000);
        assert!(r.valid, "{r:?}");
        assert_eq!((r.deliveries, r.acks_ok), (4, 3));

        // d handed out while c's successor e is unacked and not expired.
        let mut bad = h.clone();
        receive(&mut bad, 100, 1, &["e"]);
        receive(&mut bad, 200, 2, &["f"]);
        let r = fifo_delivery(&bad, 1_000);
        assert_eq!(r.delivered_while_previous_in_flight, 1, "{r:?}");
        assert!(!r.valid);
        // The same after e's invisible time ran out is fine.
        let r = fifo_delivery(&bad, 50);
        assert_eq!(r.delivered_while_previous_in_flight, 0, "{r:?}");

        // a delivered again by a receive invoked after its ack was answered OK.
        let mut again = h.clone();
        receive(&mut again, 100, 2, &["a"]);
        let r = fifo_delivery(&again, 1_000);
        assert_eq!(r.redelivered_after_ack, 1, "{r:?}");
        assert!(r.examples[0].starts_with("a delivered"), "{r:?}");
        // A receive invoked before the ack's answer may still deliver it.
        let mut racing = Vec::new();
        receive(&mut racing, 0, 1, &["a"]);
        racing.push(op(20, 1, OpFn::Ack, OpType::Invoke, &["a"]));
        racing.push(op(21, 2, OpFn::Receive, OpType::Invoke, &[]));
        racing.push(op(25, 1, OpFn::Ack, OpType::Ok, &["a"]));
        racing.push(op(30, 2, OpFn::Receive, OpType::Ok, &["a"]));
        assert!(fifo_delivery(&racing, 1_000).valid);
    }

    #[test]
    fn a_message_is_in_flight_once_at_a_time() {
        // a handed to process 1, then to process 2 before its invisible time ran
        // out and with no ack invoked: two consumers hold it at once.
        let mut h = Vec::new();
        receive(&mut h, 0, 1, &["a"]);
        receive(&mut h, 100, 2, &["a"]);
        let r = fifo_delivery(&h, 1_000);
        assert_eq!(r.delivered_again_while_in_flight, 1, "{r:?}");
        assert_eq!(r.delivered_while_previous_in_flight, 0, "{r:?}");
        assert!(!r.valid);
        assert!(
            r.examples[0].contains("a delivered again at 110 ms"),
            "{r:?}"
        );
        // After its invisible time (counted from the first receive's invoke).
        assert!(fifo_delivery(&h, 110).valid);
        assert!(!fifo_delivery(&h, 111).valid);
        // After an ack was invoked whose outcome is unknown (answered so, or
        // never answered): it may have taken effect.
        for outcome in [Some(OpType::Info), None] {
            let mut unknown = Vec::new();
            receive(&mut unknown, 0, 1, &["a"]);
            match outcome {
                Some(t) => ack(&mut unknown, 50, 1, "a", t),
                None => unknown.push(op(50, 3, OpFn::Ack, OpType::Invoke, &["a"])),
            }
            receive(&mut unknown, 100, 2, &["a"]);
            assert!(fifo_delivery(&unknown, 1_000).valid, "{outcome:?}");
        }
        // An ack answered with a definite failure released nothing.
        let mut failed = Vec::new();
        receive(&mut failed, 0, 1, &["a"]);
        ack(&mut failed, 50, 1, "a", OpType::Fail);
        receive(&mut failed, 100, 2, &["a"]);
        let r = fifo_delivery(&failed, 1_000);
        assert_eq!(r.delivered_again_while_in_flight, 1, "{r:?}");
        // Nor does it let the group's next message out.
        let mut next = Vec::new();
        receive(&mut next, 0, 1, &["a"]);
        ack(&mut next, 50, 1, "a", OpType::Fail);
        receive(&mut next, 100, 2, &["b"]);
        let r = fifo_delivery(&next, 1_000);
        assert_eq!(r.delivered_while_previous_in_flight, 1, "{r:?}");
        // A later ack of unknown outcome, invoked before the delivery, does.
        let mut retried = Vec::new();
        receive(&mut retried, 0, 1, &["a"]);
        ack(&mut retried, 50, 1, "a", OpType::Fail);
        ack(&mut retried, 60, 1, "a", OpType::Info);
        receive(&mut retried, 100, 2, &["a"]);
        assert!(fifo_delivery(&retried, 1_000).valid);
        // Twice in one answer is one delivery, not two.
        let mut batch = Vec::new();
        receive(&mut batch, 0, 1, &["a", "a"]);
        assert!(fifo_delivery(&batch, 1_000).valid);
    }
}
