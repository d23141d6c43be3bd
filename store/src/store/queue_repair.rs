//! Reading a message through its ConsumeQueue entry, and repairing a damaged entry
//! from the CommitLog it is derived from.
//!
//! A ConsumeQueue is derived data: dispatch gives every message record of a
//! (topic, queue id) the next queue offset, in CommitLog order
//! (`dispatch.rs`). So an entry that does not decode, or points at a record that
//! is not a message of its queue, is rebuilt by walking the CommitLog (each
//! record CRC-checked) from the nearest intact entry before it, counting that
//! queue's messages, and the entries up to it are rewritten; so is an entry whose
//! tag hash is not that of its record's tags. RocketMQ's 20-byte entry has no
//! checksum: damage that leaves an entry pointing at another message of the same
//! queue is not seen, and a consumer's tag filter, which reads the entry's tag
//! hash without the record, may skip a message whose hash was damaged before a
//! read of the record repaired it.

use crate::consume_queue::{ConsumeQueue, ConsumeQueueTable, CqEntry};
use crate::error::{Result, StoreError};
use crate::record::{RecordKind, RecordView};

use super::dispatch::placement;
use super::{for_each_record, Dispatched, MessageStore};

impl MessageStore {
    /// The entry at `queue_offset` of `cq` and the record it points at, checked
    /// (a message of `cq`'s topic and queue id); a damaged entry is rebuilt from
    /// the CommitLog and rewritten (see the module docs). Errors: `OutOfRange`
    /// when the entry or its record is no longer held, `Corrupted` when neither
    /// the queue nor the CommitLog can say where the message is.
    pub fn queue_message(
        &self,
        cq: &ConsumeQueue,
        queue_offset: u64,
    ) -> Result<(CqEntry, Vec<u8>)> {
        match cq.get(queue_offset) {
            Ok(e) if e.commit_log_offset < self.log.min_offset() => {
                // Retention deleted the record's segment: the read says so.
                let bytes = self
                    .log
                    .read_record(e.commit_log_offset, e.size_bytes as usize)?;
                Ok((e, bytes))
            }
            Ok(e) => match self.checked_record(cq, &e) {
                Some(bytes) => Ok((e, bytes)),
                None => self.repair_queue_entry(cq, queue_offset),
            },
            Err(StoreError::Corrupted { .. }) => self.repair_queue_entry(cq, queue_offset),
            Err(e) => Err(e),
        }
    }

    /// The entry at `queue_offset` of `cq`; one that does not decode is rebuilt as
    /// [`Self::queue_message`] does. The record it points at is not read.
    pub fn queue_entry(&self, cq: &ConsumeQueue, queue_offset: u64) -> Result<CqEntry> {
        match cq.get(queue_offset) {
            Err(StoreError::Corrupted { .. }) => {
                self.repair_queue_entry(cq, queue_offset).map(|(e, _)| e)
            }
            other => other,
        }
    }

    /// The record `e` points at, if it is a whole message of `cq`'s queue and `e`
    /// is the entry dispatch made of it (its size and the hash of its tags: a
    /// damaged tag hash would otherwise go unseen and fail tag filters).
    fn checked_record(&self, cq: &ConsumeQueue, e: &CqEntry) -> Option<Vec<u8>> {
        let bytes = self
            .log
            .read_record(e.commit_log_offset, e.size_bytes as usize)
            .ok()?;
        let v = RecordView::parse_checked_before(&bytes).ok()?;
        (is_message_of(&v, cq) && placement(&v, e.commit_log_offset) == *e).then_some(bytes)
    }

    fn repair_queue_entry(
        &self,
        cq: &ConsumeQueue,
        queue_offset: u64,
    ) -> Result<(CqEntry, Vec<u8>)> {
        let unrepairable = |why: String| StoreError::Corrupted {
            path: cq.dir().to_path_buf(),
            file_offset: queue_offset * crate::consume_queue::CQ_ENTRY_BYTES as u64,
            reason: format!(
                "consume queue {}#{} entry {queue_offset} is damaged and cannot be rebuilt: {why}",
                cq.topic(),
                cq.queue_id()
            ),
        };
        let (min, max) = (cq.min_offset(), cq.max_offset());
        if queue_offset < min || queue_offset >= max {
            return Err(StoreError::OutOfRange {
                what: "queue offset",
                requested: queue_offset,
                min,
                max,
            });
        }
        // The nearest intact entry before it: a snapshot may have counted
        // messages the CommitLog still holds, so the queue's first entry cannot be
        // found from the log's start.
        let Some((before, after)) = (min..queue_offset).rev().find_map(|q| {
            cq.get(q)
                .ok()
                .filter(|e| self.checked_record(cq, e).is_some())
                .map(|e| (q, e.commit_log_offset))
        }) else {
            return Err(unrepairable("no intact entry before it".into()));
        };
        let mut next = before + 1;
        // Walk the dispatched entries from the one holding the intact entry's record.
        let first = self
            .log
            .last_entry_ending_by(after)?
            .map_or(self.log.first_log_index(), |loc| loc.log_index + 1);
        let dispatched = self.dispatched_next_log_index();
        let start = next;
        let mut found = None;
        for log_index in first..dispatched {
            let entry = self.log.read_entry(log_index)?;
            for_each_record(&self.log, &entry, |view, phys| {
                if found.is_some()
                    || phys <= after
                    || !is_message_of(&view, cq)
                    || self.is_losing_end(&view, phys)?
                {
                    return Ok(());
                }
                let e = placement(&view, phys);
                if cq.get(next).ok() != Some(e) {
                    cq.overwrite(next, &e)?;
                }
                if next == queue_offset {
                    found = Some((e, view.bytes().to_vec()));
                }
                next += 1;
                Ok(())
            })?;
            if found.is_some() {
                break;
            }
        }
        match found {
            Some(f) => {
                tracing::warn!(
                    topic = cq.topic(),
                    queue_id = cq.queue_id(),
                    queue_offset,
                    from = start,
                    "a damaged ConsumeQueue entry was rebuilt from the CommitLog"
                );
                Ok(f)
            }
            None => Err(unrepairable(format!(
                "the CommitLog from entry {first} to the dispatch position ({dispatched}) holds {} of the queue's messages from queue offset {start}",
                next - start
            ))),
        }
    }

    /// After [`cut_queues`] cut damaged ConsumeQueue entries:
    /// places again every message of the CommitLog from physical `from` up to the
    /// dispatch position that its queue lacks (its CommitLog offset is past the
    /// queue's last entry), in log order, as dispatch placed it. The IndexFile
    /// already holds them.
    pub(super) fn replace_cut_queue_entries(
        &self,
        from: u64,
        dispatched: Dispatched,
    ) -> Result<()> {
        let first = match self.log.last_entry_ending_by(from)? {
            Some(loc) => loc.log_index + 1,
            None => self.log.first_log_index(),
        };
        let mut placed = 0u64;
        for log_index in first..dispatched.next_log_index {
            let entry = self.log.read_entry(log_index)?;
            for_each_record(&self.log, &entry, |view, phys| {
                if phys < from
                    || view.kind() != RecordKind::Message
                    || self.is_losing_end(&view, phys)?
                {
                    return Ok(());
                }
                let cq = self.cqs.get_or_create(view.topic(), view.queue_id())?;
                if cq.last_commit_log_offset().is_none_or(|last| last < phys) {
                    cq.append(&placement(&view, phys))?;
                    placed += 1;
                }
                Ok(())
            })?;
        }
        tracing::warn!(
            from,
            placed,
            "damaged ConsumeQueue entries were cut at recovery; their messages were placed again from the CommitLog"
        );
        Ok(())
    }
}

/// True if `view` is a message of `cq`'s topic and queue id.
fn is_message_of(view: &RecordView<'_>, cq: &ConsumeQueue) -> bool {
    view.kind() == RecordKind::Message
        && view.topic() == cq.topic()
        && view.queue_id() == cq.queue_id()
}

/// Cuts every queue of `cqs` at CommitLog offset `phys`
/// ([`ConsumeQueue::truncate_from_commit_log_offset`], `log_end` the CommitLog's
/// written end) and returns where [`MessageStore::replace_cut_queue_entries`] must
/// start if a cut dropped a damaged entry: after the last entry such a queue kept
/// (the earliest over them). A queue that kept no entry cannot say where its
/// messages begin (a snapshot may have counted earlier ones): its damaged entries
/// stay cut, and that is logged.
pub(super) fn cut_queues(cqs: &ConsumeQueueTable, phys: u64, log_end: u64) -> Result<Option<u64>> {
    let mut replace_from: Option<u64> = None;
    for (_, cq) in cqs.all() {
        if !cq.truncate_from_commit_log_offset(phys, log_end)? {
            continue;
        }
        match cq.last_commit_log_offset() {
            Some(last) => replace_from = Some(replace_from.map_or(last + 1, |r| r.min(last + 1))),
            None => tracing::error!(
                topic = cq.topic(),
                queue_id = cq.queue_id(),
                "a damaged ConsumeQueue entry was cut with no intact entry before it: its message cannot be placed again here"
            ),
        }
    }
    Ok(replace_from)
}
