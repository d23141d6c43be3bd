//! The acknowledged mark: the CommitLog offset below which this node has told
//! others its records are durable. Raised (written and fdatasync'd) after every
//! CommitLog fsync and before anyone is told it completed; lowered only by Raft
//! truncation and reset, never by crash recovery. So when recovery cuts a damaged
//! tail below the mark, the node knows it lost entries it had acknowledged, and the
//! Raft layer keeps it out of elections until its log is back past the mark (in the
//! spirit of protocol-aware recovery, Alagappan et al., FAST 2018).
//!
//! File format (`<store root>/ack_mark`, 12 bytes): the offset as a big-endian u64,
//! then the CRC32 (crc32fast) of those 8 bytes, big-endian. A missing file (a store
//! written by an earlier release) or one that fails its CRC reads as offset 0.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{IoContext, Result};

/// Bytes of the mark file.
pub const ACK_MARK_BYTES: usize = 12;

/// The mark file and its current value.
pub struct AckMark {
    path: PathBuf,
    file: File,
    offset: Mutex<u64>,
}

fn encode(offset: u64) -> [u8; ACK_MARK_BYTES] {
    let mut b = [0u8; ACK_MARK_BYTES];
    let o = offset.to_be_bytes();
    b[..8].copy_from_slice(&o);
    b[8..].copy_from_slice(&crc32fast::hash(&o).to_be_bytes());
    b
}

fn decode(b: &[u8]) -> Option<u64> {
    let b: &[u8; ACK_MARK_BYTES] = b.try_into().ok()?;
    let crc = u32::from_be_bytes(b[8..].try_into().ok()?);
    (crc32fast::hash(&b[..8]) == crc).then(|| u64::from_be_bytes(b[..8].try_into().unwrap()))
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
        let offset = match decode(&bytes) {
            Some(o) => o,
            None if bytes.is_empty() => 0,
            None => {
                tracing::warn!(path = %path.display(), "the acknowledged mark is damaged; ignoring it");
                0
            }
        };
        Ok(Self {
            path,
            file,
            offset: Mutex::new(offset),
        })
    }

    /// The mark: CommitLog bytes below it were acknowledged as durable.
    pub fn offset(&self) -> u64 {
        *self.offset.lock().unwrap()
    }

    /// Moves the mark up to `offset` (durably) if it is higher. Errors: `Io`.
    pub fn raise(&self, offset: u64) -> Result<()> {
        let mut cur = self.offset.lock().unwrap();
        if offset > *cur {
            self.write(offset)?;
            *cur = offset;
        }
        Ok(())
    }

    /// Moves the mark down to `offset` (durably) if it is lower: the bytes past it
    /// were truncated or reset away by Raft, not lost. Errors: `Io`.
    pub fn lower(&self, offset: u64) -> Result<()> {
        let mut cur = self.offset.lock().unwrap();
        if offset < *cur {
            self.write(offset)?;
            *cur = offset;
        }
        Ok(())
    }

    fn write(&self, offset: u64) -> Result<()> {
        self.file.write_all_at(&encode(offset), 0).at(&self.path)?;
        self.file.sync_data().at(&self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_survives_a_reopen_moves_as_told_and_ignores_damage() {
        let dir = tempfile::tempdir().unwrap();
        let m = AckMark::open(dir.path()).unwrap();
        assert_eq!(m.offset(), 0);
        m.raise(100).unwrap();
        m.raise(50).unwrap();
        assert_eq!(m.offset(), 100);
        drop(m);
        let m = AckMark::open(dir.path()).unwrap();
        assert_eq!(m.offset(), 100);
        m.lower(150).unwrap();
        assert_eq!(m.offset(), 100);
        m.lower(40).unwrap();
        assert_eq!(AckMark::open(dir.path()).unwrap().offset(), 40);
        let p = dir.path().join("ack_mark");
        let mut b = std::fs::read(&p).unwrap();
        b[3] ^= 1;
        std::fs::write(&p, b).unwrap();
        assert_eq!(AckMark::open(dir.path()).unwrap().offset(), 0);
    }
}
