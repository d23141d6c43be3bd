//! A damaged Raft entry written back in place from a copy a peer holds.
//!
//! Recovery scans only what lies past the checkpoint; a record before it that was
//! damaged later (bit rot, a torn or misdirected write, an operator's mistake) fails
//! its CRC whenever it is read. Raft's log matching says that any replica holding
//! an entry with the same log index and term holds the same entry, so the Raft
//! layer fetches it from a peer and hands its records to
//! [`CommitLog::rewrite_entry`], which encodes them at the entry's own physical
//! offset and writes them over the damaged bytes, but only if the encoding fills
//! exactly the entry's slot: nothing around it moves, and the Raft index, the
//! ConsumeQueues and the IndexFiles, all derived from where and what the entry is,
//! stay true. (The protocol-aware recovery of Alagappan et al., FAST 2018:
//! a damaged committed entry is repaired from the replicas instead of being cut.)

use super::CommitLog;
use crate::error::{Result, StoreError};
use crate::raft_index::EntryLocation;
use crate::record::{encode_into, encode_properties, encoded_len, MessageRecord, Placement};

impl CommitLog {
    /// Reads entry `log_index` and checks every record of it (length, CRC, term and
    /// log index), as [`CommitLog::read_entry`] checks only the first record's
    /// header. Errors: `OutOfRange` when not held; `Corrupted` (at the entry's
    /// offset) when any record does not check out.
    pub fn read_entry_verified(&self, log_index: u64) -> Result<super::StoredEntry> {
        let entry = self.read_entry(log_index)?;
        self.verified_records(&entry)?;
        Ok(entry)
    }

    /// The records of `entry` (read from this log), each checked (length, CRC, term
    /// and log index). Errors: `Corrupted` at the entry's offset, naming the first
    /// record that does not check out.
    pub fn verified_records<'a>(
        &self,
        entry: &'a super::StoredEntry,
    ) -> Result<Vec<crate::record::RecordView<'a>>> {
        entry
            .records()
            .collect::<std::result::Result<_, _>>()
            .map_err(|reason| {
                self.corrupted(
                    entry.location.physical_offset,
                    format!("entry {}: {reason}", entry.location.log_index),
                )
            })
    }

    /// Writes entry `(term, log_index)` again from `records` (the entry as a peer
    /// holds it) over its own bytes, and fsyncs them (`msync(MS_SYNC)`) before
    /// returning. The Raft index must place an entry of that `term` there, the slot
    /// must be pinned by the entries around it (the one before ends where it
    /// begins, or in the segment before when it begins a segment, or it is the
    /// log's first entry at the oldest retained offset; the one after begins where
    /// it ends, or begins the next segment, or it ends at the written end; see
    /// `unpinned`), so that a damaged index entry never sends the copy over other
    /// entries, and the records must encode to exactly its size. The bytes written are checked to
    /// read back as the entry. Returns the entry's location.
    ///
    /// Errors: `EntryReplaced` when the log holds another term at `log_index` now;
    /// `InvalidInput` when the records do not fill the slot exactly (the copy is
    /// not this entry); `Corrupted` when the slot cannot be pinned or the index
    /// cannot say where the entry is; `OutOfRange` when it is not held (truncated,
    /// or purged with its index entry); `NotWritable` after a failed fsync (this
    /// one's too, which poisons the log like a failed flush); `Io`. Nothing is
    /// written on any error but the last two.
    pub fn rewrite_entry(
        &self,
        term: u64,
        log_index: u64,
        records: &[MessageRecord],
    ) -> Result<EntryLocation> {
        // One writer: no append, truncation or purge moves entries meanwhile.
        let _w = self.writer.lock().unwrap();
        if let Some(why) = self.poisoned.lock().unwrap().as_ref() {
            return Err(StoreError::NotWritable(why.clone()));
        }
        let loc = self.entry_location(log_index)?;
        if loc.term != term {
            return Err(StoreError::EntryReplaced {
                log_index,
                held_term: loc.term,
                given_term: term,
            });
        }
        let buf = encode_at(&loc, records)?;
        if let Some(why) = self.unpinned(&loc) {
            return Err(self.corrupted(
                loc.physical_offset,
                format!("entry {log_index}: not written back, its slot is not pinned: {why}"),
            ));
        }
        let f = self
            .segments
            .find(loc.physical_offset)
            .filter(|f| loc.end_offset() <= f.end_offset())
            .ok_or_else(|| {
                self.corrupted(
                    loc.physical_offset,
                    format!("entry {log_index} does not lie within one segment"),
                )
            })?;
        let at = loc.physical_offset - f.start_offset();
        {
            // Readers copy bytes under the shared lock: none sees a half-written
            // entry (`MappedFile::write_at` is otherwise for unpublished bytes).
            let _erase = self.erase.write().unwrap();
            f.write_at(at, &buf);
        }
        if let Err(e) = f.flush_range(at, at + buf.len() as u64) {
            *self.poisoned.lock().unwrap() = Some(format!("an fsync failed: {e}"));
            return Err(e);
        }
        self.read_entry_verified(log_index)?;
        Ok(loc)
    }

    /// Why the slot of `loc` is not pinned by the entries around it (see
    /// [`CommitLog::rewrite_entry`]), or `None` if it is. A neighbour's place is
    /// what its own index entry says; at least one side must be confirmed by
    /// a record header that begins its neighbour (or by the log's bounds), so that
    /// damage crossing into the next entry's header still leaves the slot pinned
    /// while a damaged index entry pointing elsewhere does not.
    fn unpinned(&self, loc: &EntryLocation) -> Option<String> {
        let seg = self.cfg.segment_bytes;
        let (phys, end, min, wrote) = (
            loc.physical_offset,
            loc.end_offset(),
            self.min_offset(),
            self.wrote_offset(),
        );
        if phys < min || end > wrote {
            return Some("outside the written log".into());
        }
        // A neighbour held below the oldest retained offset (its segment purged
        // before the index was) counts as none.
        let near = |i: u64| {
            self.raft_index
                .get(i)
                .ok()
                .filter(|l| l.log_index == i && l.physical_offset >= min)
                .map(|l| (l, self.begins_entry(&l)))
        };
        let next_segment = |a: u64, b: u64| b % seg == 0 && a / seg + 1 == b / seg;
        let first = self.raft_index.first_index();
        let before = loc.log_index.checked_sub(1).filter(|&p| p >= first);
        let (start_pinned, start_seen) = match before.and_then(near) {
            Some((prev, seen)) => (
                prev.end_offset() == phys || next_segment(prev.physical_offset, phys),
                seen,
            ),
            None => (phys == min, true),
        };
        let after = Some(loc.log_index + 1).filter(|&n| n < self.raft_index.next_index());
        let (end_pinned, end_seen) = match after {
            Some(n) => match near(n) {
                Some((next, seen)) => (
                    next.physical_offset == end || next_segment(phys, next.physical_offset),
                    seen,
                ),
                None => (false, false),
            },
            // The last entry ends at the written end, or the written end begins the
            // next segment (a truncation at an entry that began a segment leaves
            // this one's padding in place).
            None => (end == wrote || next_segment(phys, wrote), true),
        };
        if !start_pinned {
            Some("the entry before does not end where it begins".into())
        } else if !end_pinned {
            Some("the entry after does not begin where it ends".into())
        } else if !start_seen && !end_seen {
            Some("neither entry around it begins with an intact header".into())
        } else {
            None
        }
    }
}

/// The bytes of `records` as entry `loc` (its term and log index, from its
/// physical offset on). Errors: `InvalidInput` for an empty entry, a field the
/// layout cannot carry, or records that do not encode to exactly
/// `loc.size_bytes` (nothing is encoded then).
fn encode_at(loc: &EntryLocation, records: &[MessageRecord]) -> Result<Vec<u8>> {
    if records.is_empty() {
        return Err(StoreError::InvalidInput(
            "a Raft entry needs at least one record".into(),
        ));
    }
    let mut sized = Vec::with_capacity(records.len());
    for m in records {
        let props = encode_properties(&m.properties);
        let len = encoded_len(m, &props).map_err(StoreError::InvalidInput)?;
        sized.push((props, len));
    }
    let total: usize = sized.iter().map(|s| s.1).sum();
    if total != loc.size_bytes as usize {
        return Err(StoreError::InvalidInput(format!(
            "entry {} holds {} bytes here; the copy given encodes to {total}",
            loc.log_index, loc.size_bytes
        )));
    }
    let mut buf = Vec::with_capacity(total);
    for (i, (m, (props, len))) in records.iter().zip(&sized).enumerate() {
        let placement = Placement {
            term: loc.term,
            log_index: loc.log_index,
            entry_remaining: (records.len() - 1 - i) as u32,
            physical_offset: loc.physical_offset + buf.len() as u64,
        };
        encode_into(&mut buf, m, props, *len, placement);
    }
    Ok(buf)
}
