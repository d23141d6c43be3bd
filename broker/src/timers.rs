//! Delay (timer) messages: how a send stores one until its time, and the
//! leader-term service that delivers it then.
//!
//! A delay message due later than its send is stored under the internal topic
//! [`TIMER_TOPIC`] with its real topic, queue and delivery time in properties
//! ([`into_timer`]); it reaches no ConsumeQueue of its real topic, so nothing can
//! deliver it early. Every replica's store indexes it by delivery time on apply
//! (`ledgermq_store::timer_index`). While this node leads, [`TimerDelivery`]
//! writes a copy of each due timer to its real queue ([`delivered_copy`]), only
//! as the leader's own proposal; the copy's apply removes the timer from every
//! replica's index, in the same entry that makes the message visible. A new
//! leader's service starts only once it has applied an entry of its own term, so
//! every copy an earlier leader committed has removed its timer by then: a timer
//! is delivered once, and one that fell due during an election is delivered as
//! soon as the next leader is ready.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use ledgermq_raft::RaftNode;
use ledgermq_store::store::now_ms;
use ledgermq_store::timer_index::{
    PendingTimer, PROPERTY_REAL_QID, PROPERTY_REAL_TOPIC, PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_QUEUE_OFFSET, TIMER_TOPIC,
};
use ledgermq_store::MessageRecord;
use tokio::task::JoinHandle;

use crate::error::{refuse, BrokerError, ErrorKind};
use crate::leader_term::{TermEnd, TermService};
use crate::leader_write::may_have_been_proposed;

/// Checks a delay message's delivery time against the latest one allowed, as the
/// reference proxy does (`SendMessageActivity.validateDelayTime`): at most
/// `max_delay_ms` after `now_ms`. A time already past is allowed (the message is
/// stored as a normal one). Error: ILLEGAL_DELIVERY_TIME.
pub fn check_delivery_time(
    deliver_at_ms: i64,
    now_ms: i64,
    max_delay_ms: u64,
) -> Result<(), BrokerError> {
    let ahead_ms = deliver_at_ms.saturating_sub(now_ms);
    if ahead_ms > 0 && ahead_ms as u64 > max_delay_ms {
        return Err(refuse(
            ErrorKind::IllegalDeliveryTime,
            format!(
                "the delivery time is {ahead_ms} ms ahead; at most {max_delay_ms} ms is allowed \
                 (max_delay_ms; the official clients send the timestamp in seconds)"
            ),
        ));
    }
    Ok(())
}

/// The record that stores the delay message `rec` (topic and queue chosen)
/// until `deliver_at_ms`: under [`TIMER_TOPIC`] queue 0, with RocketMQ 5's
/// `REAL_TOPIC`, `REAL_QID` and `TIMER_DELIVER_MS` properties.
pub fn into_timer(mut rec: MessageRecord, deliver_at_ms: i64) -> MessageRecord {
    rec.properties
        .insert(PROPERTY_TIMER_DELIVER_MS.into(), deliver_at_ms.to_string());
    put_real_queue(&mut rec, TIMER_TOPIC);
    rec
}

/// Moves `rec` (topic and queue chosen) to queue 0 of the internal topic
/// `internal_topic` (timer, half message), keeping its message queue in
/// `REAL_TOPIC` and `REAL_QID`; [`take_real_queue`] undoes it.
pub(crate) fn put_real_queue(rec: &mut MessageRecord, internal_topic: &str) {
    rec.properties
        .insert(PROPERTY_REAL_TOPIC.into(), std::mem::take(&mut rec.topic));
    rec.properties
        .insert(PROPERTY_REAL_QID.into(), rec.queue_id.to_string());
    rec.topic = internal_topic.into();
    rec.queue_id = 0;
}

/// The message that delivers the stored timer record `timer` (at
/// `timer_queue_offset` in the timer topic's queue): its real topic and queue,
/// the same body, message id and properties, `TIMER_DELIVER_MS` kept and
/// `TIMER_QUEUE_OFFSET` added (its apply removes the timer). Error: the record
/// lacks its real topic or queue (the broker never writes one so).
pub fn delivered_copy(
    mut timer: MessageRecord,
    timer_queue_offset: u64,
) -> Result<MessageRecord, String> {
    let (topic, queue_id) = take_real_queue(&mut timer, "timer")?;
    if !timer.properties.contains_key(PROPERTY_TIMER_DELIVER_MS) {
        return Err("a timer record without TIMER_DELIVER_MS".into());
    }
    timer.properties.insert(
        PROPERTY_TIMER_QUEUE_OFFSET.into(),
        timer_queue_offset.to_string(),
    );
    timer.topic = topic;
    timer.queue_id = queue_id;
    Ok(timer)
}

/// Removes `REAL_TOPIC` and `REAL_QID` from the internal record `rec` (a
/// `kind` of record: timer, half message) and returns them: the message queue
/// it is for ([`put_real_queue`] put them there). Error: either is missing or the queue id is not valid.
pub(crate) fn take_real_queue(
    rec: &mut MessageRecord,
    kind: &str,
) -> Result<(String, i32), String> {
    let topic = rec
        .properties
        .remove(PROPERTY_REAL_TOPIC)
        .ok_or_else(|| format!("a {kind} record without REAL_TOPIC"))?;
    let queue_id = rec
        .properties
        .remove(PROPERTY_REAL_QID)
        .and_then(|q| q.parse::<i32>().ok())
        .filter(|q| *q >= 0)
        .ok_or_else(|| format!("a {kind} record without a valid REAL_QID"))?;
    Ok((topic, queue_id))
}

/// Delivers due timers while this node leads a term: every `interval` it writes
/// the copies of the timers due by then, in delivery-time order, up to
/// `max_messages` and `max_bytes` of records per Raft entry.
pub struct TimerDelivery {
    /// The node whose store and Raft group it uses.
    pub node: Arc<RaftNode>,
    /// Time between looks at the index (20 ms in `crate::grpc::server::serve`).
    pub interval: Duration,
    /// Most copies in one entry.
    pub max_messages: usize,
    /// Most record bytes in one entry.
    pub max_bytes: usize,
}

/// The pause after a write refused before it was proposed (a full disk, an
/// overloaded leader, one cut off from its group), so the retries do not spin.
const RETRY_AFTER: Duration = Duration::from_millis(200);

/// A timer's key in the index.
type TimerKey = (i64, u64);

fn key_of(t: &PendingTimer) -> TimerKey {
    (t.deliver_ms, t.timer_queue_offset)
}

impl TimerDelivery {
    /// Writes the copies of the timers due now, one entry at a time, until none
    /// is due or a write fails. `skip`: timers this term must not write again
    /// (a write whose outcome is unknown: it may still commit, and its apply
    /// removes them) or cannot (their record is unreadable). Returns the copies
    /// written.
    async fn deliver_due(&self, term: u64, skip: &mut HashSet<TimerKey>) -> usize {
        let store = self.node.store();
        let mut written = 0;
        loop {
            if self.node.status().borrow().ready_term != Some(term) {
                return written;
            }
            let due = match store.timers().due(now_ms(), self.max_messages + skip.len()) {
                Ok(d) => d,
                Err(e) => {
                    tracing::error!(error = %e, "reading the timer index failed");
                    return written;
                }
            };
            let (mut copies, mut keys, mut bytes) = (Vec::new(), Vec::new(), 0usize);
            for t in &due {
                if skip.contains(&key_of(t)) {
                    continue;
                }
                if copies.len() == self.max_messages
                    || (!copies.is_empty() && bytes + t.size_bytes as usize > self.max_bytes)
                {
                    break;
                }
                match store
                    .read_timer(t)
                    .map_err(|e| e.to_string())
                    .and_then(|r| delivered_copy(r, t.timer_queue_offset))
                {
                    Ok(c) => {
                        copies.push(c);
                        keys.push(key_of(t));
                        bytes += t.size_bytes as usize;
                    }
                    Err(e) => {
                        tracing::error!(timer = ?t, error = %e, "a due timer cannot be delivered: its record is unreadable");
                        skip.insert(key_of(t));
                    }
                }
            }
            if copies.is_empty() {
                return written;
            }
            let n = copies.len();
            match self.node.write_messages_as_leader(copies).await {
                Ok(_) => {
                    written += n;
                    tracing::debug!(term, delivered = n, "delivered due timers");
                }
                Err(e) => {
                    if may_have_been_proposed(&e) {
                        // It may still commit: never written twice in this term
                        // (its apply removes the timers).
                        skip.extend(keys);
                        tracing::warn!(term, error = %e, timers = n, "delivering due timers: the outcome is unknown; not written again in this term");
                    } else {
                        tracing::warn!(term, error = %e, timers = n, "delivering due timers failed before they were proposed; will retry");
                        tokio::time::sleep(RETRY_AFTER).await;
                    }
                    return written;
                }
            }
        }
    }
}

impl TermService for TimerDelivery {
    fn name(&self) -> &'static str {
        "timer delivery"
    }

    fn start(self: Arc<Self>, term: u64, end: TermEnd) -> JoinHandle<()> {
        tokio::spawn(async move {
            // Timers written this term with an unknown outcome, or unreadable.
            let mut skip = HashSet::new();
            let mut ticks = end.ticks(self.interval);
            while ticks.next().await {
                self.deliver_due(term, &mut skip).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_times_are_bounded_ahead_and_past_ones_pass() {
        let now = 1_700_000_000_000;
        assert!(check_delivery_time(now + 86_400_000, now, 86_400_000).is_ok());
        assert!(check_delivery_time(now - 5_000, now, 86_400_000).is_ok());
        let e = check_delivery_time(now + 86_400_001, now, 86_400_000).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::IllegalDeliveryTime);
        // Milliseconds put in the seconds field (the Python client's docstring
        // trap) are tens of thousands of years ahead.
        let e = check_delivery_time(now.saturating_mul(1000), now, 86_400_000).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::IllegalDeliveryTime);
    }

    #[test]
    fn a_timer_record_delivers_the_message_that_was_sent() {
        let sent = MessageRecord::message("Orders", 3, b"body".to_vec(), 5)
            .with_property("UNIQ_KEY", "ID1")
            .with_property("TAGS", "t");
        let timer = into_timer(sent.clone(), 42_000);
        assert_eq!((timer.topic.as_str(), timer.queue_id), (TIMER_TOPIC, 0));
        assert_eq!(timer.properties[PROPERTY_REAL_TOPIC], "Orders");
        assert_eq!(timer.properties[PROPERTY_REAL_QID], "3");
        assert_eq!(timer.properties[PROPERTY_TIMER_DELIVER_MS], "42000");
        let copy = delivered_copy(timer, 17).unwrap();
        assert_eq!((copy.topic.as_str(), copy.queue_id), ("Orders", 3));
        assert_eq!(copy.body, sent.body);
        assert_eq!(copy.properties["UNIQ_KEY"], "ID1");
        assert_eq!(copy.properties["TAGS"], "t");
        assert_eq!(copy.properties[PROPERTY_TIMER_DELIVER_MS], "42000");
        assert_eq!(copy.properties[PROPERTY_TIMER_QUEUE_OFFSET], "17");
        assert!(!copy.properties.contains_key(PROPERTY_REAL_TOPIC));
        let mut broken = into_timer(sent, 1);
        broken.properties.remove(PROPERTY_REAL_QID);
        assert!(delivered_copy(broken, 0).is_err());
    }
}
