//! Rebuilding the timer index's wheel and the half index from the CommitLog,
//! for a store where either is missing while it holds dispatched entries: the
//! first start of a release on a store an earlier release wrote (one that kept
//! no index, or the timers in sled rather than in the wheel's files; either may
//! hold delay messages other members stored), or an index directory an operator
//! deleted.

use crate::error::Result;
use crate::half_index::HALF_TOPIC;
use crate::record::RecordKind;
use crate::timer_index::TIMER_TOPIC;

use super::{for_each_record, MessageStore};

/// Which indexes [`MessageStore::rebuild_timer_index`] rebuilds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rebuild {
    /// The timer wheel.
    pub timers: bool,
    /// The half index.
    pub halves: bool,
}

impl MessageStore {
    /// Replays, in log order, what dispatch does to the timer and half indexes
    /// for every message record of the entries before `next_log_index` still
    /// held, for the indexes `what` names: timer and half records are added at
    /// their queue offset (read back from their ConsumeQueue), delivered copies
    /// remove their timers, ends end their halves. Then flushes the index.
    /// Returns the timers pending afterwards. Errors: reading the log or a
    /// ConsumeQueue, the index's.
    pub(super) fn rebuild_timer_index(&self, next_log_index: u64, what: Rebuild) -> Result<usize> {
        let timer_queue = self.cqs.get(TIMER_TOPIC, 0);
        let half_queue = self.cqs.get(HALF_TOPIC, 0);
        for index in self.log.first_log_index()..next_log_index {
            let entry = self.log.read_entry(index)?;
            for_each_record(&self.log, &entry, |view, phys| {
                if view.kind() != RecordKind::Message {
                    return Ok(());
                }
                let queue = match view.topic() {
                    TIMER_TOPIC if what.timers => Some(&timer_queue),
                    HALF_TOPIC if what.halves => Some(&half_queue),
                    TIMER_TOPIC | HALF_TOPIC => return Ok(()),
                    _ => None,
                };
                let queue_offset = if let Some(queue) = queue {
                    match queue
                        .as_ref()
                        .map(|q| q.find_by_commit_log_offset(phys))
                        .transpose()?
                        .flatten()
                    {
                        Some(q) => q,
                        None => {
                            tracing::warn!(
                                physical_offset = phys,
                                topic = view.topic(),
                                "a timer or half message missing from its ConsumeQueue is not indexed"
                            );
                            return Ok(());
                        }
                    }
                } else {
                    0
                };
                if what.timers {
                    self.track_timer(&view, queue_offset, phys)?;
                }
                if what.halves {
                    self.track_half(
                        &view,
                        super::dispatch::half_named(&view),
                        queue_offset,
                        phys,
                    )?;
                }
                Ok(())
            })?;
        }
        self.timers.flush()?;
        Ok(self.timers.pending())
    }
}
