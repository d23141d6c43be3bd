//! The acknowledged mark: the log id (term, log index) of the last entry this
//! node has told others is durable. Raised (written and fdatasync'd) after every
//! CommitLog fsync and before anyone is told it completed; lowered only by Raft
//! truncation and reset, never by crash recovery. So when recovery cuts a damaged
//! tail below the mark, the node knows it lost entries it had acknowledged, and the
//! Raft layer keeps it out of elections until its log is back past the mark (in the
//! spirit of protocol-aware recovery, Alagappan et al., FAST 2018).
//!
//! File format (`<store root>/ack_mark`, 20 bytes): term and log index as big-endian
//! u64s, then the CRC32 (crc32fast) of those 16 bytes, big-endian. A missing file
//! (a store from before the mark existed), an empty one, or one that fails its
//! CRC reads as no mark; so does the 12-byte index-only mark of the previous
//! release (logged as damaged), until the next CommitLog fsync writes it anew.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{IoContext, Result};

/// Bytes of the mark file.
pub const ACK_MARK_BYTES: usize = 20;

/// A Raft log id, ordered by term, then log index (as Raft compares logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct AckedId {
    /// Term of the entry.
    pub term: u64,
    /// Log index of the entry.
    pub index: u64,
}

/// The mark file and its current value.
pub struct AckMark {
    path: PathBuf,
    file: File,
    mark: Mutex<Option<AckedId>>,
}

fn encode(m: Option<AckedId>) -> [u8; ACK_MARK_BYTES] {
    let mut b = [0u8; ACK_MARK_BYTES];
    if let Some(m) = m {
        b[..8].copy_from_slice(&m.term.to_be_bytes());
        b[8..16].copy_from_slice(&m.index.to_be_bytes());
        let crc = crc32fast::hash(&b[..16]);
        b[16..].copy_from_slice(&crc.to_be_bytes());
    }
    b
}

fn decode(b: &[u8]) -> Option<AckedId> {
    let b: &[u8; ACK_MARK_BYTES] = b.try_into().ok()?;
    let crc = u32::from_be_bytes(b[16..].try_into().ok()?);
    (crc32fast::hash(&b[..16]) == crc).then(|| AckedId {
        term: u64::from_be_bytes(b[..8].try_into().unwrap_or_default()),
        index: u64::from_be_bytes(b[8..16].try_into().unwrap_or_default()),
    })
}

impl AckMark {
    /// Opens (creating, and fsyncing its directory) `<root>/ack_mark`. Errors: `Io`.
    pub fn open(root: &Path) -> Result<Self> {
        let path = root.join("ack_mark");
        let existed = path.exists();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .at(&path)?;
        if !existed {
            file.sync_all().at(&path)?;
            crate::mapped_file::fsync_dir(root)?;
        }
        let bytes = std::fs::read(&path).at(&path)?;
        let mark = decode(&bytes);
        if mark.is_none() && bytes.iter().any(|&b| b != 0) {
            tracing::warn!(path = %path.display(), "the acknowledged mark is damaged; ignoring it");
        }
        Ok(Self {
            path,
            file,
            mark: Mutex::new(mark),
        })
    }

    /// The mark: the entry with this log id and every one before it were
    /// acknowledged as durable.
    pub fn get(&self) -> Option<AckedId> {
        *self.mark.lock().unwrap()
    }

    /// Moves the mark up to `id` (durably) if it is higher. Errors: `Io`.
    pub fn raise(&self, id: AckedId) -> Result<()> {
        let mut cur = self.mark.lock().unwrap();
        if Some(id) > *cur {
            // The skip-fsync canary (debug builds, tests only) leaves the raised
            // mark in the page cache.
            let skip = crate::canary::enabled(crate::canary::Canary::SkipFsync);
            self.write(Some(id), !skip)?;
            *cur = Some(id);
        }
        Ok(())
    }

    /// Moves the mark down to `id` (durably) if it is lower: the entries past it
    /// were truncated or reset away by Raft, not lost. Errors: `Io`.
    pub fn lower(&self, id: Option<AckedId>) -> Result<()> {
        let mut cur = self.mark.lock().unwrap();
        if id < *cur {
            self.write(id, true)?;
            *cur = id;
        }
        Ok(())
    }

    /// Writes `m`, then fdatasyncs it if `sync`.
    fn write(&self, m: Option<AckedId>, sync: bool) -> Result<()> {
        self.file.write_all_at(&encode(m), 0).at(&self.path)?;
        if sync {
            crate::fault_hooks::before_fsync();
            self.file.sync_data().at(&self.path)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(term: u64, index: u64) -> AckedId {
        AckedId { term, index }
    }

    #[test]
    fn the_mark_survives_a_reopen_moves_as_told_and_ignores_damage() {
        let dir = tempfile::tempdir().unwrap();
        let m = AckMark::open(dir.path()).unwrap();
        assert_eq!(m.get(), None);
        m.raise(id(2, 100)).unwrap();
        m.raise(id(2, 50)).unwrap();
        assert_eq!(m.get(), Some(id(2, 100)));
        // A higher term is higher whatever the index.
        m.raise(id(3, 10)).unwrap();
        drop(m);
        let m = AckMark::open(dir.path()).unwrap();
        assert_eq!(m.get(), Some(id(3, 10)));
        m.lower(Some(id(3, 11))).unwrap();
        assert_eq!(m.get(), Some(id(3, 10)));
        m.lower(Some(id(2, 40))).unwrap();
        assert_eq!(AckMark::open(dir.path()).unwrap().get(), Some(id(2, 40)));
        m.lower(None).unwrap();
        assert_eq!(AckMark::open(dir.path()).unwrap().get(), None);
        m.raise(id(1, 1)).unwrap();
        let p = dir.path().join("ack_mark");
        let mut b = std::fs::read(&p).unwrap();
        b[3] ^= 1;
        std::fs::write(&p, b).unwrap();
        assert_eq!(AckMark::open(dir.path()).unwrap().get(), None);
    }
}
