//! Finding and reading a Raft entry in the CommitLog through the Raft index, and
//! repairing a damaged index entry from the CommitLog it is derived from.
//!
//! The Raft index (`raft_index.rs`) is derived data: every field of an index entry
//! can be read back from the records it points at (each record carries its term,
//! log index and physical offset, `record.rs`). So a damaged index entry, one that
//! does not decode or points at a record of another entry, does not stop the node:
//! the CommitLog is scanned from the nearest intact entry before it (each record's
//! CRC checked, as recovery does) and the entries up to it are rewritten. Only a
//! damaged CommitLog record on that path leaves the entry unreadable (`Corrupted`);
//! an index entry that decodes is then kept as it is, so that damage to a record
//! fails only reads of that record, never a flush or a search that passes it
//! (jepsen `corrupt-mid-log`: a flush's search met the damaged entry and the node
//! exited).

use std::ops::ControlFlow;

use super::{CommitLog, StoredEntry};
use crate::error::{Result, StoreError};
use crate::raft_index::EntryLocation;
use crate::record::{min_record_len, pos, RecordView, MAGIC_MESSAGE, MAGIC_SYSTEM};

impl CommitLog {
    /// Location of entry `log_index`. An index entry that is damaged is rebuilt
    /// from the CommitLog and rewritten (see the module docs). Errors: `OutOfRange`
    /// when the entry is not held, `Corrupted` when neither the index nor the
    /// CommitLog can say where it is.
    pub fn entry_location(&self, log_index: u64) -> Result<EntryLocation> {
        match self.raft_index.get(log_index) {
            // Below the oldest retained offset: retention deleted its segment and
            // has not yet moved the index's first entry past it (reading it
            // answers `OutOfRange`), if the oldest retained segment begins after
            // this entry; otherwise the index entry is damaged.
            Ok(loc) if loc.physical_offset < self.min_offset() && self.purged(log_index) => Ok(loc),
            Ok(loc) if self.begins_entry(&loc) => Ok(loc),
            Ok(loc) => match self.repair_index_entry(log_index) {
                // The index entry decodes but its record does not check out, and
                // the CommitLog cannot say where the entry is: the record itself
                // is damaged. The index entry stands (what it says of size and
                // term serves flushes, purges and searches); reading the record
                // answers `Corrupted` as before.
                Err(StoreError::Corrupted { .. }) => Ok(loc),
                other => other,
            },
            Err(StoreError::Corrupted { .. }) => self.repair_index_entry(log_index),
            Err(e) => Err(e),
        }
    }

    /// True if `log_index` comes before the first entry of the oldest retained
    /// segment (or the log holds no record there).
    fn purged(&self, log_index: u64) -> bool {
        match self.first_log_index_at(self.min_offset()) {
            Ok(Some(first)) => log_index < first,
            Ok(None) => true,
            Err(_) => false,
        }
    }

    /// True if the record at `loc.physical_offset` is the first record of entry
    /// `loc`: a message or system record of that term and log index that says it
    /// sits there and fits in `loc.size_bytes`. Reads its fixed header only (the
    /// CRC is checked by whoever reads the entry).
    pub(super) fn begins_entry(&self, loc: &EntryLocation) -> bool {
        self.entry_head(loc.physical_offset)
            .is_some_and(|head| head_begins_entry(&head, loc))
    }

    /// The fixed header of the record at `offset`, read from its segment even past
    /// the written end: an entry being appended is in the index before the written
    /// end covers it, and its bytes were written before it was indexed. None if the
    /// header would lie outside the retained segments.
    pub(super) fn entry_head(&self, offset: u64) -> Option<[u8; pos::SYSFLAG]> {
        let _guard = self.erase.read().unwrap();
        if offset < self.min_offset() {
            return None;
        }
        let f = self.segments.find(offset)?;
        let at = offset - f.start_offset();
        if at + pos::SYSFLAG as u64 > f.size_bytes() {
            return None;
        }
        let mut head = [0u8; pos::SYSFLAG];
        head.copy_from_slice(f.slice(at, pos::SYSFLAG));
        Some(head)
    }

    /// Rebuilds the index entries from the nearest intact one before `log_index`
    /// through `log_index` by scanning the CommitLog, rewrites them, and returns
    /// `log_index`'s location.
    fn repair_index_entry(&self, log_index: u64) -> Result<EntryLocation> {
        let (first, next) = (self.raft_index.first_index(), self.raft_index.next_index());
        if log_index < first || log_index >= next {
            return Err(StoreError::OutOfRange {
                what: "log index",
                requested: log_index,
                min: first,
                max: next,
            });
        }
        let intact_before = (first..log_index).rev().find_map(|i| {
            self.raft_index
                .get(i)
                .ok()
                .filter(|loc| self.begins_entry(loc))
        });
        let (start, expect, last_term) = match intact_before {
            Some(loc) => (loc.end_offset(), loc.log_index + 1, loc.term),
            // The first entry held begins the oldest retained segment.
            None => (self.min_offset(), first, 0),
        };
        let mut found = None;
        let outcome = crate::recovery::scan(self, start, Some(expect), last_term, |loc| {
            if loc.log_index > log_index || loc.end_offset() > self.wrote_offset() {
                return Ok(ControlFlow::Break(()));
            }
            if self.raft_index.get(loc.log_index).ok() != Some(loc) {
                self.raft_index.overwrite(&loc)?;
            }
            if loc.log_index == log_index {
                found = Some(loc);
                return Ok(ControlFlow::Break(()));
            }
            Ok(ControlFlow::Continue(()))
        })?;
        match found {
            Some(loc) => {
                tracing::warn!(
                    log_index,
                    scanned_from = start,
                    "a damaged Raft index entry was rebuilt from the CommitLog"
                );
                Ok(loc)
            }
            None => Err(self.corrupted(
                outcome.damage.as_ref().map_or(outcome.end_offset, |d| d.0),
                format!(
                    "entry {log_index}: its Raft index entry is damaged and the CommitLog scan from offset {start} did not reach it ({})",
                    outcome.damage.map_or("log ended".into(), |d| d.1)
                ),
            )),
        }
    }

    /// Reads entry `log_index` back. Errors: `OutOfRange` when not held, `Corrupted`.
    pub fn read_entry(&self, log_index: u64) -> Result<StoredEntry> {
        // The usual case: the index entry points at its records, whose header is
        // checked on the one copy made of them.
        if let Ok(location) = self.raft_index.get(log_index) {
            let (at, len) = (location.physical_offset, location.size_bytes as usize);
            let checked = self.with_bytes(at, len, |b| {
                head_begins_entry(b, &location).then(|| b.to_vec())
            });
            if let Ok(Some(bytes)) = checked {
                return Ok(StoredEntry { location, bytes });
            }
        }
        // A damaged index entry, or one not readable (yet, or any more): the
        // lookup repairs or explains it.
        let location = self.entry_location(log_index)?;
        let bytes = self.read_bytes(location.physical_offset, location.size_bytes as usize)?;
        Ok(StoredEntry { location, bytes })
    }

    /// Copies `len` bytes at physical `offset` (which must lie in one segment, below
    /// the written end and at or above the oldest retained offset).
    pub fn read_bytes(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        self.with_bytes(offset, len, <[u8]>::to_vec)
    }

    /// Runs `f` on the `len` bytes at physical `offset`, under the same bounds as
    /// [`CommitLog::read_bytes`], without copying them.
    fn with_bytes<T>(&self, offset: u64, len: usize, f: impl FnOnce(&[u8]) -> T) -> Result<T> {
        let _guard = self.erase.read().unwrap();
        let (min, max) = (self.min_offset(), self.wrote_offset());
        let end = offset.saturating_add(len as u64);
        if offset < min || end > max {
            return Err(StoreError::OutOfRange {
                what: "physical offset",
                requested: offset,
                min,
                max,
            });
        }
        let seg = self.segments.find(offset).ok_or(StoreError::OutOfRange {
            what: "physical offset",
            requested: offset,
            min,
            max,
        })?;
        let pos = offset - seg.start_offset();
        if pos + len as u64 > seg.size_bytes() {
            return Err(StoreError::Corrupted {
                path: seg.path().to_path_buf(),
                file_offset: pos,
                reason: format!("a read of {len} bytes crosses the segment end"),
            });
        }
        Ok(f(seg.slice(pos, len)))
    }

    /// Reads and checks the single record at `offset` of `size_bytes` bytes (a
    /// ConsumeQueue or IndexFile position). Errors: `OutOfRange`, `Corrupted` (naming
    /// the segment file and the offset in it).
    pub fn read_record(&self, offset: u64, size_bytes: usize) -> Result<Vec<u8>> {
        let bytes = self.read_bytes(offset, size_bytes)?;
        match RecordView::parse(&bytes) {
            Ok(v) if v.physical_offset() == offset => Ok(bytes),
            Ok(v) => Err(self.corrupted(
                offset,
                format!("record says it is at {}", v.physical_offset()),
            )),
            Err(reason) => Err(self.corrupted(offset, reason)),
        }
    }
}

/// True if `bytes`, read at `loc.physical_offset`, begin with the first record of
/// entry `loc`: a message or system record of that term and log index that says it
/// sits there and fits in `loc.size_bytes` (exactly, for a single-record entry).
/// Reads the fixed header only; the CRC is checked by whoever reads the entry.
pub(super) fn head_begins_entry(bytes: &[u8], loc: &EntryLocation) -> bool {
    if bytes.len() < pos::SYSFLAG || (loc.size_bytes as usize) < min_record_len() {
        return false;
    }
    let u32_at = |i: usize| u32::from_be_bytes(bytes[i..i + 4].try_into().unwrap());
    let u64_at = |i: usize| u64::from_be_bytes(bytes[i..i + 8].try_into().unwrap());
    let total = u32_at(pos::TOTAL_SIZE) as usize;
    let size_fits = match u32_at(pos::ENTRY_REMAINING) {
        0 => total == loc.size_bytes as usize,
        _ => total < loc.size_bytes as usize,
    };
    matches!(u32_at(pos::MAGIC), MAGIC_MESSAGE | MAGIC_SYSTEM)
        && total >= min_record_len()
        && size_fits
        && u64_at(pos::TERM) == loc.term
        && u64_at(pos::LOG_INDEX) == loc.log_index
        && u64_at(pos::PHYSICAL_OFFSET) == loc.physical_offset
}
