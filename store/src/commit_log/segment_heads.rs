//! Reading the start of a CommitLog segment: its first record, the log index
//! that begins it, and the first message after it (which dates the segment for
//! retention).

use super::CommitLog;
use crate::error::Result;
use crate::record::{parse_header, Header, RecordKind, RecordView};

impl CommitLog {
    /// The first record of the segment starting at `segment_start`, CRC-checked, if
    /// the segment starts with one below the written end.
    pub(super) fn first_record_of_segment(&self, segment_start: u64) -> Result<Option<Vec<u8>>> {
        if segment_start >= self.wrote_offset() {
            return Ok(None);
        }
        let Some(f) = self.segments.find(segment_start) else {
            return Ok(None);
        };
        let head = {
            let _guard = self.erase.read().unwrap();
            let mut h = [0u8; 8];
            h.copy_from_slice(f.slice(0, 8));
            h
        };
        match parse_header(&head, f.size_bytes()) {
            Ok(Header::Record { len, .. }) => {
                self.read_record(segment_start, len as usize).map(Some)
            }
            Ok(_) => Ok(None),
            Err(reason) => Err(self.corrupted(segment_start, reason)),
        }
    }

    /// The log index of the record at the start of the segment beginning at `offset`.
    /// A first record whose bytes fail their CRC (damage the Raft layer repairs
    /// from a peer, `crate::commit_log::rewrite`) still answers, from its header,
    /// if the Raft index puts that entry at `offset` and the header agrees with it
    /// (magic, size, term, log index, offset): the store must open to be repaired.
    /// Errors: `Io`, `Corrupted` when neither says.
    pub(super) fn first_log_index_at(&self, offset: u64) -> Result<Option<u64>> {
        match self.first_record_of_segment(offset) {
            Ok(first) => Ok(first.map(|b| {
                RecordView::parse_checked_before(&b)
                    .expect("checked by read_record")
                    .log_index()
            })),
            Err(e @ crate::error::StoreError::Corrupted { .. }) => {
                let indexed = self.entry_head(offset).and_then(|head| {
                    let at = crate::record::pos::LOG_INDEX;
                    let log_index = u64::from_be_bytes(head[at..at + 8].try_into().unwrap());
                    self.raft_index
                        .get(log_index)
                        .ok()
                        .filter(|loc| {
                            loc.physical_offset == offset
                                && super::locate::head_begins_entry(&head, loc)
                        })
                        .map(|_| log_index)
                });
                match indexed {
                    Some(log_index) => Ok(Some(log_index)),
                    None => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// The store timestamp (ms) of the first message record in the entries from the
    /// one that begins segment `segment_start` on, reading at most `max_entries`
    /// entries; None if there is none among them (Raft system entries carry no
    /// time: they are stored with store timestamp 0) or the segment holds no entry.
    /// Errors: `Io`, `Corrupted`.
    pub fn first_message_timestamp_ms(
        &self,
        segment_start: u64,
        max_entries: u64,
    ) -> Result<Option<i64>> {
        let Some(first) = self.first_log_index_at(segment_start)? else {
            return Ok(None);
        };
        let end = self.next_log_index().min(first.saturating_add(max_entries));
        for index in first..end {
            let entry = self.read_entry(index)?;
            let first = match entry.records().next() {
                Some(Ok(r)) => (r.kind() == RecordKind::Message).then(|| r.store_timestamp_ms()),
                Some(Err(reason)) => {
                    return Err(self.corrupted(entry.location.physical_offset, reason))
                }
                None => None,
            };
            if first.is_some() {
                return Ok(first);
            }
        }
        Ok(None)
    }
}
