//! Checking orphaned transactions back, while this node leads: a half message
//! not ended by its first check time (store time plus the client's recovery
//! duration, or the broker's `transaction_timeout_ms`) is shown to one live
//! producer of its topic as a RecoverOrphanedTransactionCommand over its
//! Telemetry stream, then again every `transaction_check_interval_ms`, up to
//! `transaction_check_max` checks; once the time of the next check comes with
//! none answered, the leader discards it (RocketMQ's defaults: 6 s, 30 s, 15).
//!
//! The schedule is counted from the replicated store time ([`checks_due`]) on
//! the leader's wall clock, so a new leader does not restart it: it sends the
//! check due now (again, if the old leader had sent it: a leader change may
//! add a check). It discards only after a check of its own term went
//! unanswered for an interval on its monotonic clock ([`next_step`]), so a
//! leader whose clock runs ahead, or one back after a long outage, checks once
//! before it discards. The producer may be
//! connected to any member: a check no producer on this node takes is passed to
//! the others ([`crate::grpc::transaction::relay_check`]). A half a 4.x
//! producer sent goes first to a producer of its group connected to this
//! node's remoting port (CHECK_TRANSACTION_STATE; 4.x producers talk to the
//! leader, broker id 0 of their route). Each check and where
//! it went are logged; the answer is an EndTransaction, logged by
//! [`Broker::end_transaction`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use ledgermq_store::half_index::{HalfEnd, PendingHalf, PROPERTY_PRODUCER_GROUP};
use ledgermq_store::record::PROPERTY_UNIQ_KEY;
use ledgermq_store::store::now_ms;
use ledgermq_store::timer_index::PROPERTY_REAL_TOPIC;
use tokio::task::JoinHandle;

use crate::broker::Broker;
use crate::grpc::message::outgoing;
use crate::leader_term::{TermEnd, TermService};
use crate::message::DeliveryFields;
use crate::pb;
use crate::transactions::end::EndSource;
use crate::transactions::{checks_due, committed_copy, transaction_id};

/// Most halves looked at in one round.
const MAX_PER_ROUND: usize = 1024;
/// Most checks (or discards) under way at once.
const CONCURRENT_CHECKS: usize = 16;

/// The leader-term service that checks orphaned half messages back.
pub struct TransactionCheck {
    /// The broker whose halves, producers and members it uses.
    pub broker: Arc<Broker>,
    /// Time between rounds (500 ms in `crate::grpc::server::serve`).
    pub tick: Duration,
}

/// What a round does with a half `n_due` checks are due for by the replicated
/// schedule ([`checks_due`]), given the last check this term sent it, if any
/// (its number, and when on this node's monotonic clock): the next check when
/// one is due that this term has not sent; a discard only once more than
/// `max` are due *and* this term sent a check at least `interval` ago, so a
/// leader whose wall clock runs ahead, or that comes back after a long
/// outage, still checks once before it discards. No I/O.
pub(crate) fn next_step(
    n_due: u64,
    max: u32,
    sent: Option<(u64, Instant)>,
    now: Instant,
    interval: Duration,
) -> Option<Action> {
    let max = u64::from(max);
    match sent {
        _ if n_due == 0 => None,
        Some((_, at)) if n_due > max => {
            (now.saturating_duration_since(at) >= interval).then_some(Action::Discard)
        }
        None => Some(Action::Check(n_due.min(max))),
        Some((n, _)) if n < n_due.min(max) => Some(Action::Check(n_due.min(max))),
        Some(_) => None,
    }
}

/// A round's action on one half.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Send check number n (from 1).
    Check(u64),
    /// Its checks are spent: discard it.
    Discard,
}

impl TransactionCheck {
    /// One round: checks due now are sent, spent halves discarded, at most
    /// [`MAX_PER_ROUND`] of them (halves with nothing to do cost a read only,
    /// so later halves are never starved). `sent`: this term's last check per
    /// half queue offset.
    async fn round(&self, term: u64, sent: &mut HashMap<u64, (u64, Instant)>) {
        if self.broker.consumers.ready_term() != Some(term) {
            return;
        }
        let s = &self.broker.settings;
        let (now, now_mono) = (now_ms(), Instant::now());
        let interval = Duration::from_millis(s.transaction_check_interval_ms);
        let mut steps = Vec::new();
        let mut seen = HashSet::new();
        let mut complete = true;
        let mut last_seen = None;
        let scanned = self
            .broker
            .node
            .store()
            .timers()
            .halves()
            .for_each_due(now, |h| {
                let off = h.half_queue_offset;
                seen.insert(off);
                last_seen = Some(off);
                let n = checks_due(h.first_check_ms, now, s.transaction_check_interval_ms);
                match next_step(
                    n,
                    s.transaction_check_max,
                    sent.get(&off).copied(),
                    now_mono,
                    interval,
                ) {
                    Some(Action::Check(n)) => {
                        sent.insert(off, (n, now_mono));
                        steps.push((h, Action::Check(n)));
                    }
                    Some(Action::Discard) => {
                        // A discard that fails (an unreadable half) is tried
                        // again an interval later, not every round.
                        let n = sent.get(&off).map_or(0, |s| s.0);
                        sent.insert(off, (n, now_mono));
                        steps.push((h, Action::Discard));
                    }
                    None => {}
                }
                complete = steps.len() < MAX_PER_ROUND;
                complete
            });
        if let Err(e) = scanned {
            tracing::error!(error = %e, "reading the half index failed");
            return;
        }
        // Forget the halves that ended: those the scan passed without seeing
        // (halves are scanned in offset order; with the round cut short, the
        // ones past where it stopped are kept).
        sent.retain(|k, _| seen.contains(k) || (!complete && last_seen.is_some_and(|l| *k > l)));
        futures::stream::iter(steps)
            .for_each_concurrent(CONCURRENT_CHECKS, |(h, action)| async move {
                match action {
                    Action::Check(n) => self.check(h, n).await,
                    Action::Discard => self.discard(h).await,
                }
            })
            .await;
    }

    /// The half's record, its real topic and message id; None (logged) when it
    /// cannot be read.
    fn read(&self, h: &PendingHalf) -> Option<(ledgermq_store::MessageRecord, String, String)> {
        match self.broker.node.store().read_half(h) {
            Ok(rec) => {
                let Some(topic) = rec.properties.get(PROPERTY_REAL_TOPIC).cloned() else {
                    tracing::error!(half = ?h, "a pending half message without REAL_TOPIC: not checked back");
                    return None;
                };
                let id = rec
                    .properties
                    .get(PROPERTY_UNIQ_KEY)
                    .cloned()
                    .unwrap_or_default();
                Some((rec, topic, id))
            }
            Err(e) => {
                tracing::error!(half = ?h, error = %e, "a pending half message is unreadable: not checked back");
                None
            }
        }
    }

    async fn check(&self, h: PendingHalf, n: u64) {
        let Some((rec, topic, message_id)) = self.read(&h) else {
            return;
        };
        let max = self.broker.settings.transaction_check_max;
        let txid = transaction_id(h.half_queue_offset);
        // A half a 4.x producer sent names its producer group (a 5.x one's
        // PGROUP is its topic): a producer of that group connected to this
        // node's remoting port is asked over it.
        let group = rec
            .properties
            .get(PROPERTY_PRODUCER_GROUP)
            .filter(|g| **g != topic)
            .cloned();
        let store_host = self
            .broker
            .remoting_producers
            .store_host()
            .unwrap_or(rec.store_host);
        let copy = match committed_copy(rec, h.half_queue_offset) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(half = ?h, error = %e, "a pending half message cannot be checked back");
                return;
            }
        };
        if let Some(group) = group {
            let command = crate::remoting::transaction::check_command(
                &copy,
                h.half_queue_offset,
                h.physical_offset,
                &message_id,
                &txid,
                store_host,
            );
            // The check shows the whole message: only to a producer whose
            // user may publish to its topic (as the users are now).
            let need = [crate::auth::Need::publish(&topic)];
            let mut producers = self.broker.remoting_producers.producers(&group);
            {
                let meta = self.broker.meta();
                producers.retain(|p| {
                    p.principal
                        .refreshed(&meta.acl_users)
                        .and_then(|p| p.authorize(&need))
                        .is_ok()
                });
            }
            let taken = self.broker.remoting_producers.offer(&producers, &command);
            if let Some(client) = taken {
                tracing::info!(
                    topic,
                    message_id,
                    transaction_id = txid,
                    check = n,
                    max,
                    client,
                    group,
                    node = self.broker.node.id(),
                    "transaction checked back over remoting"
                );
                return;
            }
            // Only a producer of its group knows a 4.x transaction: no 5.x
            // producer of the topic is asked. 4.x producers talk to the
            // leader; after a leader change one reconnects with its next
            // route refresh, and a later check reaches it.
            tracing::warn!(
                topic,
                message_id,
                transaction_id = txid,
                check = n,
                max,
                group,
                "no 4.x producer of the group on this node (whose user may publish to the topic) to check the transaction back with"
            );
            return;
        }
        let fields = DeliveryFields {
            receipt_handle: String::new(),
            queue_offset: h.half_queue_offset,
            invisible_ms: 0,
            delivery_attempt: n as u32,
        };
        let command = pb::TelemetryCommand {
            status: Some(pb::Status::ok()),
            command: Some(
                pb::telemetry_command::Command::RecoverOrphanedTransactionCommand(
                    pb::RecoverOrphanedTransactionCommand {
                        message: Some(outgoing(copy, h.physical_offset, &fields)),
                        transaction_id: txid.clone(),
                    },
                ),
            ),
        };
        if let Some(client) = self.broker.producers.offer(&topic, &command) {
            tracing::info!(
                topic,
                message_id,
                transaction_id = txid,
                check = n,
                max,
                client,
                node = self.broker.node.id(),
                "transaction checked back"
            );
            return;
        }
        for peer in self.broker.members().configured().keys().copied() {
            if peer == self.broker.node.id() {
                continue;
            }
            match crate::grpc::transaction::relay_check(&self.broker, peer, &topic, &command).await
            {
                Ok(Some(client)) => {
                    tracing::info!(
                        topic,
                        message_id,
                        transaction_id = txid,
                        check = n,
                        max,
                        client,
                        node = peer,
                        "transaction checked back"
                    );
                    return;
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(peer, error = %e, "passing a transaction check on failed")
                }
            }
        }
        tracing::warn!(
            topic,
            message_id,
            transaction_id = txid,
            check = n,
            max,
            "no live producer of the topic to check the transaction back with"
        );
    }

    async fn discard(&self, h: PendingHalf) {
        let Some((_, topic, message_id)) = self.read(&h) else {
            return;
        };
        let txid = transaction_id(h.half_queue_offset);
        match self
            .broker
            .end_transaction(
                &topic,
                &message_id,
                &txid,
                HalfEnd::Discarded,
                EndSource::Discard,
            )
            .await
        {
            Ok(()) => tracing::warn!(
                topic,
                message_id,
                transaction_id = txid,
                checks = self.broker.settings.transaction_check_max,
                "transaction discarded: no check back was answered"
            ),
            Err(e) if e.kind() == crate::error::ErrorKind::InvalidTransactionId => {
                tracing::info!(topic, transaction_id = txid, error = %e, "the transaction ended before its discard")
            }
            Err(e) => {
                tracing::warn!(topic, transaction_id = txid, error = %e, "discarding a transaction failed; will retry an interval later")
            }
        }
    }
}

impl TermService for TransactionCheck {
    fn name(&self) -> &'static str {
        "transaction check"
    }

    fn start(self: Arc<Self>, term: u64, end: TermEnd) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut sent: HashMap<u64, (u64, Instant)> = HashMap::new();
            let mut ticks = end.ticks(self.tick);
            while ticks.next().await {
                self.round(term, &mut sent).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_follow_the_schedule_and_a_discard_waits_for_a_check_of_this_term() {
        let t0 = Instant::now();
        let iv = Duration::from_secs(30);
        let later = |s| t0 + Duration::from_secs(s);
        assert_eq!(next_step(0, 15, None, t0, iv), None);
        assert_eq!(next_step(1, 15, None, t0, iv), Some(Action::Check(1)));
        assert_eq!(next_step(1, 15, Some((1, t0)), later(5), iv), None);
        assert_eq!(
            next_step(2, 15, Some((1, t0)), later(30), iv),
            Some(Action::Check(2))
        );
        // A new leader (nothing sent this term) sends the check due now.
        assert_eq!(next_step(7, 15, None, t0, iv), Some(Action::Check(7)));
        // Past the last check: a leader that sent none checks once first (its
        // clock may run ahead), then discards an interval later.
        assert_eq!(next_step(40, 15, None, t0, iv), Some(Action::Check(15)));
        assert_eq!(next_step(40, 15, Some((15, t0)), later(29), iv), None);
        assert_eq!(
            next_step(40, 15, Some((15, t0)), later(30), iv),
            Some(Action::Discard)
        );
        assert_eq!(
            next_step(16, 15, Some((15, t0)), later(30), iv),
            Some(Action::Discard)
        );
    }
}
