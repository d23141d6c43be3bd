//! Dispatch: placing committed entries' messages in ConsumeQueues and the IndexFile,
//! and moving the dispatch position (snapshots, rebuilds).

use crate::consume_queue::CqEntry;
use crate::error::Result;
use crate::half_index::{
    HalfEnd, PendingHalf, HALF_TOPIC, OP_HALF_TOPIC, PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_TRANSACTION_END, PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
};
use crate::record::{tag_hash, RecordKind, RecordView, PROPERTY_TAGS};
use crate::timer_index::{
    PendingTimer, PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_QUEUE_OFFSET, TIMER_TOPIC,
};

use super::{
    for_each_record, Dispatched, DispatchedMessage, MessageStore, QueuePosition, NOT_PLACED,
};

impl MessageStore {
    /// First log index not yet dispatched.
    pub fn dispatched_next_log_index(&self) -> u64 {
        self.dispatched.lock().unwrap().next_log_index
    }

    /// CommitLog offset up to which entries are dispatched.
    pub fn dispatched_offset(&self) -> u64 {
        self.dispatched.lock().unwrap().offset
    }

    /// Rebuilds every ConsumeQueue from the CommitLog from `log_index` on: their
    /// entries for records at or after that entry are dropped and the next
    /// `dispatch_through` places them again (same queue offsets: dispatch is
    /// deterministic). `OutOfRange` if the log no longer holds `log_index`.
    pub fn rebuild_consume_queues_from(&self, log_index: u64) -> Result<()> {
        self.check_open()?;
        let mut d = self.dispatched.lock().unwrap();
        if log_index >= d.next_log_index {
            return Ok(());
        }
        let at = self.log.entry_location(log_index)?.physical_offset;
        let replace_from = super::queue_repair::cut_queues(&self.cqs, at, self.log.wrote_offset())?;
        *d = Dispatched {
            next_log_index: log_index,
            offset: at,
        };
        if let Some(from) = replace_from {
            self.replace_cut_queue_entries(from, *d)?;
        }
        Ok(())
    }

    /// Dispatches every entry up to and including `log_index` that has not been
    /// dispatched: each message record gets the next queue offset of its
    /// (topic, queue id) and is indexed by key and message id. The caller promises
    /// these entries are committed. Returns the messages placed, in log order.
    pub fn dispatch_through(&self, log_index: u64) -> Result<Vec<DispatchedMessage>> {
        self.check_open()?;
        let mut d = self.dispatched.lock().unwrap();
        self.dispatch_from(&mut d, log_index)
    }

    /// The `dispatch-before-apply` canary (debug builds, tests only; see
    /// [`crate::canary`]): places the messages of every appended entry through
    /// `log_index` in their ConsumeQueues before it commits, while the dispatch
    /// position stays where apply left it ([`Self::dispatch_through`] then reuses
    /// these placements). Does nothing while the canary is off.
    pub fn dispatch_appended_through(&self, log_index: u64) -> Result<()> {
        if !crate::canary::enabled(crate::canary::Canary::DispatchBeforeApply) {
            return Ok(());
        }
        self.check_open()?;
        let d = self.dispatched.lock().unwrap();
        let mut ahead = *d;
        self.dispatch_from(&mut ahead, log_index).map(|_| ())
    }

    /// [`Self::dispatch_through`] from position `d` (its lock held), moving it.
    fn dispatch_from(&self, d: &mut Dispatched, log_index: u64) -> Result<Vec<DispatchedMessage>> {
        let mut placed = Vec::new();
        while d.next_log_index <= log_index {
            let entry = self.log.read_entry(d.next_log_index)?;
            for_each_record(&self.log, &entry, |view, phys| {
                if view.kind() != RecordKind::Message {
                    return Ok(());
                }
                // Every message passes here: the property is looked up once.
                let half = half_named(&view);
                let queue_offset = if self.loses(&view, half, phys)? {
                    // A commit copy of a half another record ended first: in no
                    // queue and no index, so never delivered.
                    NOT_PLACED
                } else {
                    let cq = self.cqs.get_or_create(view.topic(), view.queue_id())?;
                    let queue_offset = match cq.last_commit_log_offset() {
                        // Placed by an earlier attempt that failed later on (e.g.
                        // in the IndexFile): keep that placement.
                        Some(last) if phys <= last => {
                            cq.find_by_commit_log_offset(phys)?.ok_or_else(|| {
                                self.log.corrupted(
                                    phys,
                                    "a dispatched message is missing from its ConsumeQueue".into(),
                                )
                            })?
                        }
                        _ => cq.append(&placement(&view, phys))?,
                    };
                    self.index.put_record(&view, phys)?;
                    self.track_timer(&view, queue_offset, phys)?;
                    self.track_half(&view, half, queue_offset, phys)?;
                    queue_offset
                };
                placed.push(DispatchedMessage {
                    log_index: entry.location.log_index,
                    topic: view.topic().to_owned(),
                    queue_id: view.queue_id(),
                    queue_offset,
                    physical_offset: phys,
                    size_bytes: view.len() as u32,
                });
                Ok(())
            })?;
            d.next_log_index += 1;
            d.offset = entry.location.end_offset();
        }
        Ok(placed)
    }

    /// Keeps the timer index in step with the message record `view` just placed
    /// at `queue_offset` of its queue (CommitLog offset `phys`): a record of
    /// [`TIMER_TOPIC`] becomes a pending timer; a delivered copy (it carries
    /// [`PROPERTY_TIMER_QUEUE_OFFSET`]) removes the timer it delivers. Both repeat
    /// harmlessly when an entry is dispatched again. A timer record without a
    /// valid delivery time (the broker never writes one) is left out, with a
    /// warning.
    pub(super) fn track_timer(
        &self,
        view: &RecordView<'_>,
        queue_offset: u64,
        phys: u64,
    ) -> Result<()> {
        // Every message passes here: an ordinary one costs one property lookup.
        let deliver_ms = || {
            view.property(PROPERTY_TIMER_DELIVER_MS)
                .and_then(|v| v.parse::<i64>().ok())
        };
        if view.topic() == TIMER_TOPIC {
            let Some(deliver_ms) = deliver_ms() else {
                tracing::warn!(
                    physical_offset = phys,
                    "a timer message without a valid {PROPERTY_TIMER_DELIVER_MS}: it is never delivered"
                );
                return Ok(());
            };
            return self.timers.insert(PendingTimer {
                deliver_ms,
                timer_queue_offset: queue_offset,
                physical_offset: phys,
                size_bytes: view.len() as u32,
            });
        }
        let delivers = view
            .property(PROPERTY_TIMER_QUEUE_OFFSET)
            .and_then(|v| v.parse::<u64>().ok());
        if let Some(timer_queue_offset) = delivers {
            if let Some(deliver_ms) = deliver_ms() {
                self.timers.remove(deliver_ms, timer_queue_offset)?;
            }
        }
        Ok(())
    }

    /// Keeps the half index in step with the message record `view` just placed
    /// at `queue_offset` of its queue (CommitLog offset `phys`): a record of
    /// [`HALF_TOPIC`] becomes a pending half, first checked its immunity after
    /// its store time; a record that carries
    /// [`PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET`] ends the half it names, if
    /// that is pending: a commit copy in any other topic, an op record of
    /// [`OP_HALF_TOPIC`] a rollback or discard. Both repeat harmlessly when an
    /// entry is dispatched again.
    /// `half` is [`half_named`]`(view)`.
    pub(super) fn track_half(
        &self,
        view: &RecordView<'_>,
        half: Option<u64>,
        queue_offset: u64,
        phys: u64,
    ) -> Result<()> {
        if view.topic() == HALF_TOPIC {
            let immunity_ms = view
                .property(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
                .and_then(|v| v.parse::<i64>().ok())
                .unwrap_or(0)
                .saturating_mul(1000);
            return self.timers.halves().insert(PendingHalf {
                half_queue_offset: queue_offset,
                first_check_ms: view.store_timestamp_ms().saturating_add(immunity_ms),
                physical_offset: phys,
                size_bytes: view.len() as u32,
            });
        }
        let Some(half) = half else {
            return Ok(());
        };
        let end = if view.topic() == OP_HALF_TOPIC {
            match view
                .property(PROPERTY_TRANSACTION_END)
                .and_then(HalfEnd::from_op_value)
            {
                Some(e) => e,
                None => {
                    tracing::warn!(
                        physical_offset = phys,
                        "an op record without a valid {PROPERTY_TRANSACTION_END}: ignored"
                    );
                    return Ok(());
                }
            }
        } else {
            HalfEnd::Committed
        };
        self.timers.halves().end(half, end, phys).map(|_| ())
    }

    /// True if the message record `view` (at CommitLog offset `phys`) is a commit
    /// copy ([`PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET`] outside the half and op
    /// topics) of a half that another record ended: the first end in log order
    /// wins, so such a copy is placed in no queue (dispatch, and the queue
    /// repairs, skip it). Decided by the winner's offset, which never changes
    /// once recorded, so dispatching again decides the same. A copy of a
    /// committed message (a dead letter) must not carry the property: the
    /// broker's `dead_letter_copy` removes it.
    pub(super) fn is_losing_end(&self, view: &RecordView<'_>, phys: u64) -> Result<bool> {
        self.loses(view, half_named(view), phys)
    }

    /// [`Self::is_losing_end`] with `half` = [`half_named`]`(view)`.
    fn loses(&self, view: &RecordView<'_>, half: Option<u64>, phys: u64) -> Result<bool> {
        match half {
            Some(half) if view.topic() != HALF_TOPIC && view.topic() != OP_HALF_TOPIC => Ok(self
                .timers
                .halves()
                .end_of(half)?
                .is_some_and(|(_, winner)| winner != phys)),
            _ => Ok(false),
        }
    }

    /// The next queue offset of every message queue, sorted by (topic, queue id): what
    /// a Raft snapshot records so a follower installing it continues the same offsets.
    pub fn queue_next_offsets(&self) -> Vec<QueuePosition> {
        self.cqs
            .all()
            .into_iter()
            .map(|((topic, queue_id), cq)| QueuePosition {
                topic,
                queue_id,
                next_offset: cq.max_offset(),
            })
            .collect()
    }

    /// Installs a snapshot's dispatch position: every entry before `next_log_index` counts
    /// as dispatched (the snapshot covers it) and each listed queue continues at its
    /// `next_offset`. Queues already at or past it are left alone. Entries at and after
    /// `next_log_index` are dispatched as usual later.
    pub fn skip_dispatch_to(&self, next_log_index: u64, positions: &[QueuePosition]) -> Result<()> {
        self.check_open()?;
        let mut d = self.dispatched.lock().unwrap();
        for p in positions {
            let cq = self.cqs.get_or_create(&p.topic, p.queue_id)?;
            if cq.max_offset() < p.next_offset {
                cq.reset(p.next_offset)?;
            }
        }
        if next_log_index > d.next_log_index {
            let offset = match self.log.entry_location(next_log_index) {
                Ok(loc) => loc.physical_offset,
                Err(_) => self.log.wrote_offset(),
            };
            *d = Dispatched {
                next_log_index,
                offset: offset.max(d.offset),
            };
        }
        Ok(())
    }
}

/// The half queue offset the record `view` names in
/// [`PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET`] (a commit copy or an op
/// record), if any.
pub(super) fn half_named(view: &RecordView<'_>) -> Option<u64> {
    view.property(PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET)
        .and_then(|v| v.parse::<u64>().ok())
}

/// The ConsumeQueue entry dispatch writes for the message record `view` at
/// CommitLog offset `phys` (also what a repair writes again).
pub(super) fn placement(view: &RecordView<'_>, phys: u64) -> CqEntry {
    CqEntry {
        commit_log_offset: phys,
        size_bytes: view.len() as u32,
        tag_hash: tag_hash(view.property(PROPERTY_TAGS)),
    }
}
