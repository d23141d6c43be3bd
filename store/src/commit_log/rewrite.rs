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
    /// returning. The Raft index must place an entry of that `term` there, and the
    /// records must encode to exactly its size; the bytes written are checked to read
    /// back as the entry. Returns the entry's location.
    ///
    /// Errors: `OutOfRange` when the entry is not held (purged or truncated);
    /// `InvalidInput` when the index holds another term there or the records do not
    /// fill the entry's slot exactly (then nothing was written); `Corrupted` when
    /// the index cannot say where the entry is; `Io`.
    pub fn rewrite_entry(
        &self,
        term: u64,
        log_index: u64,
        records: &[MessageRecord],
    ) -> Result<EntryLocation> {
        // One writer: no append, truncation or purge moves entries meanwhile.
        let _w = self.writer.lock().unwrap();
        let loc = self.entry_location(log_index)?;
        if loc.term != term {
            return Err(StoreError::InvalidInput(format!(
                "entry {log_index} is of term {} here, not {term}",
                loc.term
            )));
        }
        let buf = encode_at(&loc, records)?;
        if loc.end_offset() > self.wrote_offset() || loc.physical_offset < self.min_offset() {
            return Err(self.corrupted(
                loc.physical_offset,
                format!("the raft index puts log index {log_index} outside the written log"),
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
            // Readers copy bytes under the shared lock: none sees a half-written entry.
            let _erase = self.erase.write().unwrap();
            f.write_at(at, &buf);
        }
        f.flush_range(at, at + buf.len() as u64)?;
        self.read_entry_verified(log_index)?;
        Ok(loc)
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
