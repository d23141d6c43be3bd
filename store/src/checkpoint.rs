//! RocketMQ's checkpoint and abort files.
//!
//! The **checkpoint** (`<root>/checkpoint`) records how far each structure is known to
//! be durable, so crash recovery scans only what came after. It is written whole to a
//! temporary file, fsynced, renamed over the old one and the directory fsynced, so a
//! crash leaves either the old or the new checkpoint. Layout, big-endian, 64 bytes:
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0  | 4 | magic u32 = [`CHECKPOINT_MAGIC`] |
//! | 4  | 8 | `commit_log_offset`: CommitLog bytes below it are durable; an entry boundary |
//! | 12 | 8 | `next_log_index`: log index of the entry that starts at `commit_log_offset` |
//! | 20 | 8 | `last_term`: term of the entry before it (0 if none) |
//! | 28 | 8 | `dispatched_offset`: ConsumeQueue / IndexFile entries of records below it are durable |
//! | 36 | 8 | `dispatched_next_log_index`: first log index not yet dispatched at that point |
//! | 44 | 8 | `timestamp_ms`: wall clock when written |
//! | 52 | 4 | flags: bit 0 = written by a clean shutdown; bit 1 = written by a reset (the log is empty from `commit_log_offset` on; anything below it is to be deleted) |
//! | 56 | 4 | reserved (0) |
//! | 60 | 4 | CRC32 of bytes `[0, 60)` |
//!
//! The **abort** file (`<root>/abort`) exists while a store is open; finding it at start
//! means the last run did not shut down cleanly.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{IoContext, Result, StoreError};
use crate::mapped_file::fsync_dir;

/// Marks a checkpoint file.
pub const CHECKPOINT_MAGIC: u32 = 0x4C4D_4350; // "LMCP"
const CHECKPOINT_BYTES: usize = 64;

/// Durable positions recorded by the last checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Checkpoint {
    /// CommitLog bytes below this physical offset are durable (an entry boundary).
    pub commit_log_offset: u64,
    /// Log index of the entry that starts at `commit_log_offset`.
    pub next_log_index: u64,
    /// Term of the entry just before `commit_log_offset` (0 if none).
    pub last_term: u64,
    /// ConsumeQueue and IndexFile entries for records below this offset are durable.
    pub dispatched_offset: u64,
    /// First log index that was not yet dispatched when the checkpoint was taken.
    pub dispatched_next_log_index: u64,
    /// Wall clock when written, ms since the Unix epoch.
    pub timestamp_ms: i64,
    /// Written by a clean shutdown.
    pub clean: bool,
    /// Written by a reset: every CommitLog byte below `commit_log_offset` is to be
    /// deleted and the log continues at `next_log_index` (recovery finishes a reset a
    /// crash interrupted).
    pub reset: bool,
}

impl Checkpoint {
    /// Encodes the 64-byte file image.
    pub fn encode(&self) -> [u8; CHECKPOINT_BYTES] {
        let mut b = [0u8; CHECKPOINT_BYTES];
        b[0..4].copy_from_slice(&CHECKPOINT_MAGIC.to_be_bytes());
        b[4..12].copy_from_slice(&self.commit_log_offset.to_be_bytes());
        b[12..20].copy_from_slice(&self.next_log_index.to_be_bytes());
        b[20..28].copy_from_slice(&self.last_term.to_be_bytes());
        b[28..36].copy_from_slice(&self.dispatched_offset.to_be_bytes());
        b[36..44].copy_from_slice(&self.dispatched_next_log_index.to_be_bytes());
        b[44..52].copy_from_slice(&self.timestamp_ms.to_be_bytes());
        let flags = u32::from(self.clean) | (u32::from(self.reset) << 1);
        b[52..56].copy_from_slice(&flags.to_be_bytes());
        let crc = crc32fast::hash(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_be_bytes());
        b
    }

    /// Decodes a file image; `None` if it is not a valid checkpoint.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != CHECKPOINT_BYTES
            || u32::from_be_bytes(b[0..4].try_into().unwrap()) != CHECKPOINT_MAGIC
            || u32::from_be_bytes(b[60..64].try_into().unwrap()) != crc32fast::hash(&b[..60])
        {
            return None;
        }
        let u = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap());
        let flags = u32::from_be_bytes(b[52..56].try_into().unwrap());
        Some(Self {
            commit_log_offset: u(4),
            next_log_index: u(12),
            last_term: u(20),
            dispatched_offset: u(28),
            dispatched_next_log_index: u(36),
            timestamp_ms: u(44) as i64,
            clean: flags & 1 == 1,
            reset: flags & 2 == 2,
        })
    }
}

/// Reads and writes `<root>/checkpoint` and `<root>/abort`.
pub struct CheckpointFile {
    root: PathBuf,
}

impl CheckpointFile {
    /// For the store rooted at `root`.
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }

    fn path(&self) -> PathBuf {
        self.root.join("checkpoint")
    }

    fn abort_path(&self) -> PathBuf {
        self.root.join("abort")
    }

    /// The stored checkpoint; `Ok(None)` when there is none; `Corrupted` when the file
    /// exists but fails its checks (recovery then scans from the start).
    pub fn load(&self) -> Result<Option<Checkpoint>> {
        let path = self.path();
        match std::fs::read(&path) {
            Ok(b) => Checkpoint::decode(&b)
                .map(Some)
                .ok_or(StoreError::Corrupted {
                    path,
                    file_offset: 0,
                    reason: "checkpoint fails its magic or CRC check".into(),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).at(&path),
        }
    }

    /// Durably replaces the checkpoint (write temp, fsync, rename, fsync directory).
    pub fn store(&self, cp: &Checkpoint) -> Result<()> {
        let tmp = self.root.join("checkpoint.tmp");
        let mut f = File::create(&tmp).at(&tmp)?;
        f.write_all(&cp.encode()).at(&tmp)?;
        f.sync_all().at(&tmp)?;
        std::fs::rename(&tmp, self.path()).at(&tmp)?;
        fsync_dir(&self.root)
    }

    /// True if the abort file exists (the last run crashed).
    pub fn abort_exists(&self) -> bool {
        self.abort_path().exists()
    }

    /// Creates the abort file durably (at open).
    pub fn create_abort(&self) -> Result<()> {
        let p = self.abort_path();
        OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&p)
            .at(&p)?;
        fsync_dir(&self.root)
    }

    /// Removes the abort file durably (at clean shutdown, after the final checkpoint).
    pub fn remove_abort(&self) -> Result<()> {
        let p = self.abort_path();
        match std::fs::remove_file(&p) {
            Ok(()) => fsync_dir(&self.root),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).at(&p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_damage() {
        let cp = Checkpoint {
            commit_log_offset: 1 << 33,
            next_log_index: 17,
            last_term: 3,
            dispatched_offset: 99,
            dispatched_next_log_index: 12,
            timestamp_ms: 1_700_000_000_000,
            clean: true,
            reset: true,
        };
        let b = cp.encode();
        assert_eq!(Checkpoint::decode(&b), Some(cp));
        for i in 0..b.len() {
            let mut d = b;
            d[i] ^= 0x10;
            assert_eq!(Checkpoint::decode(&d), None, "byte {i}");
        }
        let dir = tempfile::tempdir().unwrap();
        let f = CheckpointFile::new(dir.path());
        assert_eq!(f.load().unwrap(), None);
        f.store(&cp).unwrap();
        assert_eq!(f.load().unwrap(), Some(cp));
        assert!(!f.abort_exists());
        f.create_abort().unwrap();
        assert!(f.abort_exists());
        f.remove_abort().unwrap();
        assert!(!f.abort_exists());
    }
}
