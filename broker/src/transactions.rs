//! Transactional messages: a send stores a half message, invisible to consumers;
//! the producer's EndTransaction (or its answer to a check back) commits it into
//! its real queue or rolls it back; the leader checks orphans back with a live
//! producer and drops them after the last check, as RocketMQ does.
//!
//! Every end is one record the leader writes ([`committed_copy`] or
//! [`op_record`]), only as its own proposal. On apply, on every replica, the
//! first end in log order that reaches a pending half wins: the store's half
//! index (`ledgermq_store::half_index`) records it, and a commit copy that comes
//! after another end is placed in no queue. The leader decides ends of one half
//! one at a time on what it has applied ([`end`]), so it rarely writes a losing
//! end, and it answers by what the first end was once its own is applied: a
//! commit answered OK won, so it is in the log and delivered whatever leader
//! comes next; a rollback answered OK won, so no commit copy of that half is
//! ever placed in a queue.
//!
//! The records and the decision are here, without I/O; [`end`] writes an end on
//! the leader, [`check`] is the leader-term service that checks orphans back and
//! [`producers`] the producers connected to this node that a check can reach.

pub mod check;
pub mod end;
pub mod producers;
pub mod remoting_producers;

use ledgermq_store::half_index::{
    HalfEnd, HalfState, HALF_TOPIC, OP_HALF_TOPIC, PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_PRODUCER_GROUP, PROPERTY_TRANSACTION_END, PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
};
use ledgermq_store::record::PROPERTY_TAGS;
use ledgermq_store::MessageRecord;

use crate::timers::{put_real_queue, take_real_queue};

/// The record that stores the transactional message `rec` (topic and queue
/// chosen) until it is ended: under [`HALF_TOPIC`] queue 0, with RocketMQ's
/// `REAL_TOPIC`, `REAL_QID`, `TRAN_MSG`, `PGROUP` (the producer group a 4.x
/// producer sent it with; else the topic, as the reference proxy names 5.x
/// producers) and `CHECK_IMMUNITY_TIME_IN_SECONDS` properties.
pub fn into_half(mut rec: MessageRecord, check_immunity_s: u64) -> MessageRecord {
    let topic = rec.topic.clone();
    rec.properties
        .entry(PROPERTY_PRODUCER_GROUP.into())
        .or_insert(topic);
    rec.properties
        .insert(PROPERTY_TRANSACTION_PREPARED.into(), "true".into());
    rec.properties.insert(
        PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS.into(),
        check_immunity_s.to_string(),
    );
    put_real_queue(&mut rec, HALF_TOPIC);
    rec
}

/// The message a commit of the half record `half` (at `half_queue_offset` of
/// [`HALF_TOPIC`]'s queue 0) stores: its real topic and queue, the same body,
/// message id and properties, without the half's own (`REAL_*`, `TRAN_MSG`,
/// the immunity, as RocketMQ's `EndTransactionProcessor` clears them), with
/// `TRAN_PREPARED_QUEUE_OFFSET` (its apply ends the half). Also what a check
/// back shows the producer. Error: the record lacks its real topic or queue (the
/// broker never writes one so).
pub fn committed_copy(
    mut half: MessageRecord,
    half_queue_offset: u64,
) -> Result<MessageRecord, String> {
    let (topic, queue_id) = take_real_queue(&mut half, "half message")?;
    half.properties.remove(PROPERTY_TRANSACTION_PREPARED);
    half.properties
        .remove(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS);
    half.properties.insert(
        PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET.into(),
        half_queue_offset.to_string(),
    );
    half.topic = topic;
    half.queue_id = queue_id;
    Ok(half)
}

/// The op record that ends the half at `half_queue_offset` without a commit: a
/// rollback, or with `discard` the broker's discard after the last check. In
/// [`OP_HALF_TOPIC`] queue 0, body the offset in decimal and tag `d`, as
/// RocketMQ writes op messages.
pub fn op_record(half_queue_offset: u64, discard: bool) -> MessageRecord {
    let end = if discard {
        HalfEnd::Discarded
    } else {
        HalfEnd::RolledBack
    };
    let offset = half_queue_offset.to_string();
    MessageRecord::message(OP_HALF_TOPIC, 0, offset.clone().into_bytes(), 0)
        .with_property(PROPERTY_TAGS, "d")
        .with_property(PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET, &offset)
        .with_property(
            PROPERTY_TRANSACTION_END,
            end.op_value().unwrap_or("ROLLBACK"),
        )
}

/// Prefix of the transaction ids this broker hands out.
const ID_PREFIX: &str = "half-";

/// The transaction id of the half at `half_queue_offset`: valid on every member,
/// since the half queue's offsets are the same everywhere.
pub fn transaction_id(half_queue_offset: u64) -> String {
    format!("{ID_PREFIX}{half_queue_offset}")
}

/// The half queue offset a transaction id names; None when it is not one of
/// [`transaction_id`]'s.
pub fn parse_transaction_id(id: &str) -> Option<u64> {
    id.strip_prefix(ID_PREFIX)?.parse().ok()
}

/// What the leader does with an end asked for a half in `state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Write the end: the half is pending.
    Write,
    /// Nothing to write: the half ended so already (the producer asked again,
    /// or its check answer came after its own call), or was discarded and a
    /// rollback is asked. Answered OK.
    Done,
    /// Refused: unknown, or ended otherwise.
    Refuse(&'static str),
}

/// The decision for `asked` (a commit or a rollback) on a half in `state`
/// (None: no such half, or its end forgotten with its record).
pub fn decide(state: Option<HalfState>, asked: HalfEnd) -> Decision {
    match (state, asked) {
        (None, _) => Decision::Refuse(
            "no such transaction here: never stored, or ended and removed by retention",
        ),
        (Some(HalfState::Pending(_)), _) => Decision::Write,
        (Some(HalfState::Ended(e)), a) if e == a => Decision::Done,
        (Some(HalfState::Ended(HalfEnd::Discarded)), HalfEnd::RolledBack) => Decision::Done,
        (Some(HalfState::Ended(HalfEnd::Committed)), _) => {
            Decision::Refuse("the transaction was committed already")
        }
        (Some(HalfState::Ended(HalfEnd::RolledBack)), _) => {
            Decision::Refuse("the transaction was rolled back already")
        }
        (Some(HalfState::Ended(HalfEnd::Discarded)), _) => Decision::Refuse(
            "the transaction was discarded after its last check back went unanswered",
        ),
    }
}

/// How many checks back are due for a half first checked at `first_check_ms`, at
/// `now_ms`, one every `interval_ms`: 0 before its first check, then 1, 2, ...
/// It is discarded once this exceeds the most checks allowed. The same on every
/// member and in every term: it depends on replicated times only.
pub fn checks_due(first_check_ms: i64, now_ms: i64, interval_ms: u64) -> u64 {
    if now_ms < first_check_ms {
        return 0;
    }
    (now_ms - first_check_ms) as u64 / interval_ms.max(1) + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use ledgermq_store::half_index::PendingHalf;
    use ledgermq_store::timer_index::{PROPERTY_REAL_QID, PROPERTY_REAL_TOPIC};

    #[test]
    fn a_half_commits_into_the_message_that_was_sent() {
        let sent = MessageRecord::message("Orders", 3, b"body".to_vec(), 5)
            .with_property("UNIQ_KEY", "ID1")
            .with_property("TAGS", "t")
            .with_property("color", "red");
        let half = into_half(sent.clone(), 6);
        assert_eq!((half.topic.as_str(), half.queue_id), (HALF_TOPIC, 0));
        assert_eq!(half.properties[PROPERTY_REAL_TOPIC], "Orders");
        assert_eq!(half.properties[PROPERTY_REAL_QID], "3");
        assert_eq!(half.properties[PROPERTY_PRODUCER_GROUP], "Orders");
        assert_eq!(half.properties[PROPERTY_TRANSACTION_PREPARED], "true");
        assert_eq!(
            half.properties[PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS],
            "6"
        );
        let copy = committed_copy(half, 41).unwrap();
        assert_eq!((copy.topic.as_str(), copy.queue_id), ("Orders", 3));
        assert_eq!(copy.body, sent.body);
        for k in ["UNIQ_KEY", "TAGS", "color"] {
            assert_eq!(copy.properties[k], sent.properties[k], "{k}");
        }
        assert_eq!(
            copy.properties[PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET],
            "41"
        );
        for k in [
            PROPERTY_REAL_TOPIC,
            PROPERTY_REAL_QID,
            PROPERTY_TRANSACTION_PREPARED,
            PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
        ] {
            assert!(!copy.properties.contains_key(k), "{k} kept");
        }
        let mut broken = into_half(sent, 6);
        broken.properties.remove(PROPERTY_REAL_QID);
        assert!(committed_copy(broken, 0).is_err());
    }

    #[test]
    fn op_records_name_the_half_and_the_end() {
        let op = op_record(9, true);
        assert_eq!((op.topic.as_str(), op.queue_id), (OP_HALF_TOPIC, 0));
        assert_eq!(op.body, b"9");
        assert_eq!(
            op.properties[PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET],
            "9"
        );
        assert_eq!(op.properties[PROPERTY_TRANSACTION_END], "DISCARD");
        assert_eq!(
            op_record(9, false).properties[PROPERTY_TRANSACTION_END],
            "ROLLBACK"
        );
    }

    #[test]
    fn transaction_ids_round_trip_and_others_are_refused() {
        assert_eq!(parse_transaction_id(&transaction_id(0)), Some(0));
        assert_eq!(
            parse_transaction_id(&transaction_id(u64::MAX)),
            Some(u64::MAX)
        );
        for bad in ["", "17", "half-", "half--1", "half-1x", "HALF-1"] {
            assert_eq!(parse_transaction_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_half_ends_once_and_a_repeated_end_is_answered_as_it_ended() {
        use Decision::*;
        use HalfEnd::*;
        let pending = Some(HalfState::Pending(PendingHalf {
            half_queue_offset: 1,
            first_check_ms: 0,
            physical_offset: 0,
            size_bytes: 1,
        }));
        let ended = |e| Some(HalfState::Ended(e));
        assert_eq!(decide(pending, Committed), Write);
        assert_eq!(decide(pending, RolledBack), Write);
        assert_eq!(decide(ended(Committed), Committed), Done);
        assert_eq!(decide(ended(RolledBack), RolledBack), Done);
        assert_eq!(decide(ended(Discarded), RolledBack), Done);
        assert!(matches!(decide(ended(Committed), RolledBack), Refuse(_)));
        assert!(matches!(decide(ended(RolledBack), Committed), Refuse(_)));
        assert!(matches!(decide(ended(Discarded), Committed), Refuse(_)));
        assert!(matches!(decide(None, Committed), Refuse(_)));
    }

    #[test]
    fn checks_fall_due_one_per_interval_from_the_first() {
        assert_eq!(checks_due(10_000, 9_999, 30_000), 0);
        assert_eq!(checks_due(10_000, 10_000, 30_000), 1);
        assert_eq!(checks_due(10_000, 39_999, 30_000), 1);
        assert_eq!(checks_due(10_000, 40_000, 30_000), 2);
        assert_eq!(checks_due(0, 15 * 30_000, 30_000), 16);
        assert_eq!(checks_due(0, 5, 0), 6);
    }
}
