//! Ending a half message on the leader: EndTransaction from the producer, its
//! answer to a check back, and the discard after the last check.

use ledgermq_store::half_index::{HalfEnd, HalfState};
use ledgermq_store::record::PROPERTY_UNIQ_KEY;
use ledgermq_store::timer_index::PROPERTY_REAL_TOPIC;

use crate::broker::Broker;
use crate::error::{refuse, BrokerError, ErrorKind};
use crate::leader_write::{may_have_been_proposed, settle, SETTLE_WAIT};
use crate::transactions::{committed_copy, decide, op_record, parse_transaction_id, Decision};

/// Locks that make the ends of one half message one at a time on this node
/// (half queue offset modulo their number picks one), while ends of other halves
/// go on beside them.
pub struct EndLocks(Vec<tokio::sync::Mutex<()>>);

impl Default for EndLocks {
    fn default() -> Self {
        Self((0..64).map(|_| tokio::sync::Mutex::new(())).collect())
    }
}

impl EndLocks {
    fn of(&self, half_queue_offset: u64) -> &tokio::sync::Mutex<()> {
        &self.0[(half_queue_offset % self.0.len() as u64) as usize]
    }
}

/// Who asked for an end: logged with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndSource {
    /// The producer's own EndTransaction.
    Client,
    /// The producer's answer to a check back.
    ServerCheck,
    /// The leader, after the last check went unanswered.
    Discard,
}

impl Broker {
    /// Ends the transaction `transaction_id` of message `message_id` on `topic`
    /// with `end` (a commit or a rollback; a discard from the check service), on
    /// this node, which must be the ready leader. Answered once the end is
    /// committed and applied here, or was already (the same end asked again; a
    /// rollback of a discarded half).
    ///
    /// Errors: INVALID_TRANSACTION_ID (an id this broker did not hand out, no such
    /// half, one whose topic or message id differ, one ended otherwise);
    /// `NoLeader` when this node is not the ready leader; the write's, with an
    /// unknown outcome only when the write may still commit and had not been
    /// applied within 10 s.
    pub async fn end_transaction(
        &self,
        topic: &str,
        message_id: &str,
        transaction_id: &str,
        end: HalfEnd,
        source: EndSource,
    ) -> Result<(), BrokerError> {
        let invalid = |why: &str| {
            refuse(
                ErrorKind::InvalidTransactionId,
                format!(
                    "transaction {transaction_id:?} of message {message_id:?} on {topic}: {why}"
                ),
            )
        };
        let offset = parse_transaction_id(transaction_id)
            .ok_or_else(|| invalid("not a transaction id of this broker"))?;
        let _one_at_a_time = self.end_locks.of(offset).lock().await;
        let term = self.consumers.ready_term().ok_or_else(|| {
            refuse(
                ErrorKind::NoLeader,
                format!("node {} is not the ready leader", self.node.id()),
            )
        })?;
        let store = self.node.store();
        let state = store.timers().halves().state(offset).map_err(internal)?;
        match decide(state, end) {
            Decision::Refuse(why) => return Err(invalid(why)),
            Decision::Done => {
                tracing::info!(
                    topic,
                    message_id,
                    transaction_id,
                    ?end,
                    ?source,
                    "transaction end asked again: ended so already"
                );
                return Ok(());
            }
            Decision::Write => {}
        }
        let Some(HalfState::Pending(half)) = state else {
            unreachable!("decide writes pending halves only");
        };
        let rec = store.read_half(&half).map_err(internal)?;
        if rec.properties.get(PROPERTY_REAL_TOPIC).map(String::as_str) != Some(topic)
            || (source != EndSource::Discard
                && rec.properties.get(PROPERTY_UNIQ_KEY).map(String::as_str) != Some(message_id))
        {
            return Err(invalid("the transaction is of another message"));
        }
        let record = match end {
            HalfEnd::Committed => {
                committed_copy(rec, offset).map_err(|e| refuse(ErrorKind::Internal, e))?
            }
            HalfEnd::RolledBack => op_record(offset, false),
            HalfEnd::Discarded => op_record(offset, true),
        };
        let before = self.node.raft().metrics().borrow().last_log_index;
        let written = self.node.write_messages_as_leader(vec![record]).await;
        if let Err(e) = &written {
            if !may_have_been_proposed(e) {
                return written.map(|_| ()).map_err(Into::into);
            }
            // The lock stays held: no other end of this half is written before
            // this one is known to be applied or not. (Should that take longer,
            // dispatch still lets only the first end in log order count.)
            settle(&self.node, term, before.map_or(1, |i| i + 1), SETTLE_WAIT).await;
        }
        // Answered by what the first end in log order made of the half: an end
        // written meanwhile (by this node in an earlier term, or by another
        // leader) wins over this one.
        let now = store.timers().halves().state(offset).map_err(internal)?;
        match (now, written) {
            (Some(HalfState::Ended(_)), w) if decide(now, end) == Decision::Done => {
                tracing::info!(topic, message_id, transaction_id, ?end, ?source, term, write_error = ?w.err(), "transaction ended");
                Ok(())
            }
            (Some(HalfState::Ended(e)), _) => {
                tracing::warn!(topic, message_id, transaction_id, asked = ?end, ended = ?e, ?source, "an earlier end of the transaction won");
                Err(invalid(match decide(now, end) {
                    Decision::Refuse(why) => why,
                    _ => "the transaction ended otherwise",
                }))
            }
            (_, Err(e)) => Err(e.into()),
            (_, Ok(_)) => Err(refuse(
                ErrorKind::Internal,
                format!(
                    "transaction {transaction_id}: its end was applied, but the half index \
                     does not show it ended"
                ),
            )),
        }
    }
}

fn internal(e: ledgermq_store::StoreError) -> BrokerError {
    refuse(
        ErrorKind::Internal,
        format!("the half index or its record: {e}"),
    )
}
