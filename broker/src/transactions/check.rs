//! Checking orphaned transactions back, while this node leads: a half message
//! not ended by its first check time (store time plus the client's recovery
//! duration, or the broker's `transaction_timeout_ms`) is shown to one live
//! producer of its topic as a RecoverOrphanedTransactionCommand over its
//! Telemetry stream, then again every `transaction_check_interval_ms`, up to
//! `transaction_check_max` checks; once the time of the next check comes with
//! none answered, the leader discards it (RocketMQ's defaults: 6 s, 30 s, 15).
//!
//! The schedule depends on replicated times only ([`checks_due`]), so a new
//! leader neither restarts it nor checks a half more often than it allows: it
//! sends the check due now (again, if the old leader had sent it), and
//! discards at the same time as the old leader would have. The producer may be
//! connected to any member: a check no producer on this node takes is passed to
//! the others ([`crate::grpc::transaction::relay_check`]). Each check and where
//! it went are logged; the answer is an EndTransaction, logged by
//! [`Broker::end_transaction`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use ledgermq_store::half_index::{HalfEnd, PendingHalf};
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

/// What a round does with one half.
enum Step {
    /// Send check number `n` (from 1).
    Check(PendingHalf, u64),
    /// Its checks are spent: discard it.
    Discard(PendingHalf),
}

impl TransactionCheck {
    /// One round: checks due now are sent, spent halves discarded. `sent`: the
    /// number of checks this term sent per half queue offset.
    async fn round(&self, term: u64, sent: &mut HashMap<u64, u64>) {
        if self.broker.consumers.ready_term() != Some(term) {
            return;
        }
        let s = &self.broker.settings;
        let now = now_ms();
        let due = match self
            .broker
            .node
            .store()
            .timers()
            .halves()
            .due(now, MAX_PER_ROUND)
        {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %e, "reading the half index failed");
                return;
            }
        };
        if due.len() < MAX_PER_ROUND {
            // Every pending half due is listed: forget the ended ones.
            let listed: HashSet<u64> = due.iter().map(|h| h.half_queue_offset).collect();
            sent.retain(|k, _| listed.contains(k));
        }
        let mut steps = Vec::new();
        for h in due {
            let n = checks_due(h.first_check_ms, now, s.transaction_check_interval_ms);
            if n > u64::from(s.transaction_check_max) {
                steps.push(Step::Discard(h));
            } else if sent.get(&h.half_queue_offset).copied().unwrap_or(0) < n {
                sent.insert(h.half_queue_offset, n);
                steps.push(Step::Check(h, n));
            }
        }
        futures::stream::iter(steps)
            .for_each_concurrent(CONCURRENT_CHECKS, |step| async move {
                match step {
                    Step::Check(h, n) => self.check(h, n).await,
                    Step::Discard(h) => self.discard(h).await,
                }
            })
            .await;
    }

    /// The half's record, its real topic and message id; None (logged) when it
    /// cannot be read.
    fn read(&self, h: &PendingHalf) -> Option<(ledgermq_store::MessageRecord, String, String)> {
        match self.broker.node.store().read_half(h) {
            Ok(rec) => {
                let topic = rec.properties.get(PROPERTY_REAL_TOPIC).cloned()?;
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
        let copy = match committed_copy(rec, h.half_queue_offset) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(half = ?h, error = %e, "a pending half message cannot be checked back");
                return;
            }
        };
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
            Err(e) => {
                tracing::warn!(topic, transaction_id = txid, error = %e, "discarding a transaction failed; will retry")
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
            let mut sent = HashMap::new();
            let mut ticks = end.ticks(self.tick);
            while ticks.next().await {
                self.round(term, &mut sent).await;
            }
        })
    }
}
