//! The Raft log index: log index → (physical offset, size, term) in O(1).
//!
//! A [`FixedLog`] of 32-byte entries; the entry of log index `i` sits at byte `i × 32`
//! of the index's logical space (DLedger's index file does the same). Layout, big-endian:
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0  | 4 | magic u32 = [`RAFT_INDEX_MAGIC`] (an all-zero entry means "not written") |
//! | 4  | 4 | size u32: bytes of all the entry's records in the CommitLog |
//! | 8  | 8 | physical offset u64 of the entry's first record |
//! | 16 | 8 | term u64 |
//! | 24 | 8 | log index u64 (repeated, so a misplaced entry is caught) |
//!
//! The index is derived data: crash recovery rebuilds its tail from the CommitLog, so
//! it only needs to be fsynced when a checkpoint is written.

use std::path::Path;

use crate::error::{Result, StoreError};
use crate::fixed_log::FixedLog;

/// Width of one index entry in bytes.
pub const RAFT_INDEX_ENTRY_BYTES: usize = 32;
/// Marks a written index entry.
pub const RAFT_INDEX_MAGIC: u32 = 0x5249_4458; // "RIDX"
/// Default entries per index file (32 MiB files).
pub const DEFAULT_RAFT_INDEX_ENTRIES_PER_FILE: u64 = 1 << 20;

/// Where one Raft entry sits in the CommitLog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryLocation {
    /// Raft log index.
    pub log_index: u64,
    /// Raft term.
    pub term: u64,
    /// CommitLog offset of the entry's first record.
    pub physical_offset: u64,
    /// Bytes of all the entry's records.
    pub size_bytes: u32,
}

impl EntryLocation {
    /// One past the entry's last byte in the CommitLog.
    pub fn end_offset(&self) -> u64 {
        self.physical_offset + u64::from(self.size_bytes)
    }

    fn encode(&self) -> [u8; RAFT_INDEX_ENTRY_BYTES] {
        let mut b = [0u8; RAFT_INDEX_ENTRY_BYTES];
        b[0..4].copy_from_slice(&RAFT_INDEX_MAGIC.to_be_bytes());
        b[4..8].copy_from_slice(&self.size_bytes.to_be_bytes());
        b[8..16].copy_from_slice(&self.physical_offset.to_be_bytes());
        b[16..24].copy_from_slice(&self.term.to_be_bytes());
        b[24..32].copy_from_slice(&self.log_index.to_be_bytes());
        b
    }

    fn decode(b: &[u8; RAFT_INDEX_ENTRY_BYTES]) -> Option<Self> {
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap());
        if u32::from_be_bytes(b[0..4].try_into().unwrap()) != RAFT_INDEX_MAGIC {
            return None;
        }
        Some(Self {
            size_bytes: u32::from_be_bytes(b[4..8].try_into().unwrap()),
            physical_offset: u64_at(8),
            term: u64_at(16),
            log_index: u64_at(24),
        })
    }
}

/// The Raft log index files under one directory.
pub struct RaftIndex {
    log: FixedLog,
}

impl RaftIndex {
    /// Opens (or creates) the index under `dir`.
    pub fn open(dir: &Path, entries_per_file: u64) -> Result<Self> {
        Ok(Self {
            log: FixedLog::open(dir, RAFT_INDEX_ENTRY_BYTES, entries_per_file)?,
        })
    }

    /// First log index held (after purges), or the next one to append if empty.
    pub fn first_index(&self) -> u64 {
        self.log.min()
    }

    /// One past the last log index held.
    pub fn next_index(&self) -> u64 {
        self.log.max()
    }

    /// Records `loc`, which must be for `next_index()`.
    pub fn append(&self, loc: &EntryLocation) -> Result<()> {
        let at = self.log.append(&loc.encode())?;
        assert_eq!(at, loc.log_index, "raft index appended out of place");
        Ok(())
    }

    /// The location of `log_index`; `OutOfRange` when it is not held, `Corrupted`
    /// when the stored entry is not the one for that index.
    pub fn get(&self, log_index: u64) -> Result<EntryLocation> {
        let mut b = [0u8; RAFT_INDEX_ENTRY_BYTES];
        self.log.get(log_index, &mut b)?;
        match EntryLocation::decode(&b) {
            Some(loc) if loc.log_index == log_index => Ok(loc),
            _ => Err(StoreError::Corrupted {
                path: self.log.dir().to_path_buf(),
                file_offset: log_index * RAFT_INDEX_ENTRY_BYTES as u64,
                reason: format!("raft index entry for log index {log_index} is invalid"),
            }),
        }
    }

    /// Rewrites the entry of `loc.log_index`, which must be held (`OutOfRange`
    /// otherwise): the repair of a damaged entry from the CommitLog.
    pub fn overwrite(&self, loc: &EntryLocation) -> Result<()> {
        self.log.overwrite(loc.log_index, &loc.encode())
    }

    /// Drops every entry at or after `log_index`.
    pub fn truncate(&self, log_index: u64) -> Result<()> {
        self.log.truncate(log_index)
    }

    /// Drops everything; the next append must be for `next_index`.
    pub fn reset(&self, next_index: u64) -> Result<()> {
        self.log.reset(next_index)
    }

    /// Forgets entries below `log_index` (deleting whole files that hold only such entries).
    pub fn purge_below(&self, log_index: u64) -> Result<()> {
        self.log.remove_segments_below(log_index)?;
        self.log.set_min(log_index);
        Ok(())
    }

    /// fsyncs everything appended so far.
    pub fn flush(&self) -> Result<()> {
        self.log.flush().map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(i: u64) -> EntryLocation {
        EntryLocation {
            log_index: i,
            term: 1 + i / 3,
            physical_offset: i * 100,
            size_bytes: 100,
        }
    }

    #[test]
    fn entries_round_trip_truncate_and_purge() {
        let dir = tempfile::tempdir().unwrap();
        let idx = RaftIndex::open(dir.path(), 4).unwrap();
        for i in 0..10 {
            idx.append(&loc(i)).unwrap();
        }
        assert_eq!(idx.get(7).unwrap(), loc(7));
        idx.truncate(8).unwrap();
        assert!(matches!(idx.get(8), Err(StoreError::OutOfRange { .. })));
        idx.purge_below(5).unwrap();
        assert_eq!(idx.first_index(), 5);
        assert!(idx.get(4).is_err());
        idx.flush().unwrap();
        drop(idx);
        let idx = RaftIndex::open(dir.path(), 4).unwrap();
        assert_eq!(idx.next_index(), 8);
        assert_eq!(idx.get(5).unwrap(), loc(5));
    }
}
