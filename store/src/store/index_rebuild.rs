//! The IndexFile after a crash: the file that was active is rebuilt from the
//! CommitLog, and an entry that rebuild skipped as damaged is indexed once it is
//! written back from a peer's copy.

use crate::error::{Result, StoreError};
use crate::record::{RecordKind, RecordView};

use super::{Dispatched, MessageStore};

impl MessageStore {
    /// Re-indexes the records of the IndexFile that was active at the crash (its
    /// entries past the checkpoint may be torn): it is deleted and rebuilt from its
    /// first record up to the dispatch checkpoint; later records are indexed by
    /// `dispatch_through`.
    pub(super) fn rebuild_last_index_file(&self, dispatched: Dispatched) -> Result<()> {
        let Some(begin) = self.index.remove_last_file()? else {
            return Ok(());
        };
        if begin >= dispatched.offset {
            return Ok(());
        }
        // Retention may have deleted the file's first records: start at the oldest kept.
        let begin = begin.max(self.log.min_offset());
        if begin >= self.log.wrote_offset() {
            return Ok(());
        }
        let mut log_index = self.log_index_at(begin)?;
        while log_index < dispatched.next_log_index {
            match self.index_entry(log_index, begin, Indexing::InOrder) {
                // A damaged record cannot be indexed; reads of it report the damage,
                // and it is indexed once written back from a peer's copy.
                Err(e @ StoreError::Corrupted { .. }) => {
                    tracing::error!(log_index, error = %e, "skipping a damaged entry while rebuilding the IndexFile");
                    self.unindexed
                        .lock()
                        .unwrap()
                        .insert(log_index, SkippedEntry { begin });
                }
                other => other?,
            }
            log_index += 1;
        }
        Ok(())
    }

    /// The log index of the record starting at physical `offset`.
    fn log_index_at(&self, offset: u64) -> Result<u64> {
        let head = self.log.read_bytes(offset, 4)?;
        let len = i32::from_be_bytes(head[..4].try_into().unwrap());
        if len <= 0 {
            return Err(self.log.corrupted(offset, format!("no record at {offset}")));
        }
        let bytes = self.log.read_record(offset, len as usize)?;
        Ok(RecordView::parse(&bytes)
            .map_err(|e| self.log.corrupted(offset, e))?
            .log_index())
    }

    /// Indexes the message records of entry `log_index` that lie at or after
    /// physical offset `begin` (where the IndexFile being rebuilt begins), as
    /// `how` says. Errors: `Corrupted` if a record does not check out (nothing of
    /// the entry is indexed then), `OutOfRange`, `Io`.
    fn index_entry(&self, log_index: u64, begin: u64, how: Indexing) -> Result<()> {
        let entry = self.log.read_entry(log_index)?;
        // Every record checked (once) before any is indexed.
        for view in self.log.verified_records(&entry)? {
            let phys = view.physical_offset();
            if phys >= begin && view.kind() == RecordKind::Message {
                match how {
                    Indexing::InOrder => self.index.put_record(&view, phys)?,
                    Indexing::Skipped => self.index.put_skipped_record(&view, phys)?,
                }
            }
        }
        Ok(())
    }

    /// After entry `log_index` was written back: indexes it if the IndexFile
    /// rebuild skipped it as damaged (it is forgotten only once indexed).
    /// Errors: as [`Self::index_entry`].
    pub(super) fn index_rewritten(&self, log_index: u64) -> Result<()> {
        let Some(skipped) = self.unindexed.lock().unwrap().get(&log_index).copied() else {
            return Ok(());
        };
        self.index_entry(log_index, skipped.begin, Indexing::Skipped)?;
        self.unindexed.lock().unwrap().remove(&log_index);
        Ok(())
    }
}

/// How an entry's records go into the IndexFile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Indexing {
    /// In CommitLog order (the rebuild): a record below the newest file's end is
    /// taken as indexed already.
    InOrder,
    /// A record the rebuild skipped, written back since
    /// (`IndexService::put_skipped_record`).
    Skipped,
}

/// An entry the IndexFile rebuild at open skipped as damaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SkippedEntry {
    /// Physical offset the rebuilt IndexFile begins at.
    pub begin: u64,
}
