//! The acknowledged bound (ASYNC_FLUSH): a durable log id at or above every entry
//! this node has acknowledged, written ahead of the acknowledgements, with the
//! boot id of the machine that wrote it.
//!
//! Under ASYNC_FLUSH an entry is acknowledged once written to the page cache, and
//! so is the acknowledged mark ([`crate::ack_mark`]); a power loss can take both.
//! The node would then not know that it lost entries it had acknowledged, and
//! could help elect a leader without them (issue 13, item 3). So before the mark
//! passes the bound, the bound is moved [`BOUND_AHEAD_ENTRIES`] entries ahead and
//! fdatasync'd: one fsync of a small file per that many entries. After an unclean
//! stop, a boot id that differs from the one stored means the machine restarted and
//! the page cache is gone: the bound then stands in for the mark (see
//! [`crate::ack_mark::AckMark::adopt_bound_after_reboot`]). It over-estimates, so
//! the node stays out of elections until its log passes the bound or holds an
//! entry of a later term. Once a flush has made every acknowledged entry durable,
//! the bound is brought down to the mark ([`AckBound::settle`]): a node that lost
//! power while idle adopts its exact mark and loses no time.
//!
//! File format (`<store root>/ack_bound`, 68 bytes): the boot id as 48 bytes of
//! ASCII padded with zeros, term and log index as big-endian u64s, then the CRC32
//! (crc32fast) of those 64 bytes, big-endian. A missing, short or damaged file
//! reads as no bound.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::ack_mark::AckedId;
use crate::error::{IoContext, Result};

/// Bytes of the bound file.
pub const ACK_BOUND_BYTES: usize = 68;

/// Bytes kept for the boot id (Linux's is a 36-character UUID).
const BOOT_ID_BYTES: usize = 48;

/// How far ahead of the acknowledged mark the bound is written, in log entries.
pub const BOUND_AHEAD_ENTRIES: u64 = 1024;

/// A stored bound: the log id and the boot id of the machine that wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBound {
    /// At or above every entry acknowledged while that machine was up.
    pub id: AckedId,
    /// The boot id when it was written ([`crate::fault_hooks::boot_id`]).
    pub boot_id: String,
}

/// Encodes a bound (no bound: all zeros, which reads back as none).
pub fn encode(b: Option<&StoredBound>) -> [u8; ACK_BOUND_BYTES] {
    let mut out = [0u8; ACK_BOUND_BYTES];
    if let Some(b) = b {
        let id = b.boot_id.as_bytes();
        let n = id.len().min(BOOT_ID_BYTES);
        out[..n].copy_from_slice(&id[..n]);
        out[48..56].copy_from_slice(&b.id.term.to_be_bytes());
        out[56..64].copy_from_slice(&b.id.index.to_be_bytes());
        let crc = crc32fast::hash(&out[..64]);
        out[64..].copy_from_slice(&crc.to_be_bytes());
    }
    out
}

/// Decodes a bound; None if `b` is not exactly one valid bound.
pub fn decode(b: &[u8]) -> Option<StoredBound> {
    let b: &[u8; ACK_BOUND_BYTES] = b.try_into().ok()?;
    let crc = u32::from_be_bytes(b[64..].try_into().ok()?);
    if crc32fast::hash(&b[..64]) != crc {
        return None;
    }
    let id_len = b[..BOOT_ID_BYTES]
        .iter()
        .position(|&c| c == 0)
        .unwrap_or(BOOT_ID_BYTES);
    Some(StoredBound {
        boot_id: String::from_utf8_lossy(&b[..id_len]).into_owned(),
        id: AckedId {
            term: u64::from_be_bytes(b[48..56].try_into().ok()?),
            index: u64::from_be_bytes(b[56..64].try_into().ok()?),
        },
    })
}

/// The bound file.
pub struct AckBound {
    path: PathBuf,
    file: File,
    /// What the file holds (durably).
    stored: Option<StoredBound>,
    /// This boot's id; None if it cannot be read (every unclean stop then counts
    /// as a reboot).
    boot_id: Option<String>,
}

impl AckBound {
    /// Opens (creating, and fsyncing its directory) `<root>/ack_bound`. Errors: `Io`.
    pub fn open(root: &Path) -> Result<Self> {
        let (path, file, bytes) = crate::ack_mark::open_small_file(root, "ack_bound")?;
        let stored = decode(&bytes);
        if stored.is_none() && bytes.iter().any(|&b| b != 0) {
            tracing::warn!(path = %path.display(), "the acknowledged bound is damaged; ignoring it");
        }
        Ok(Self {
            path,
            file,
            stored,
            boot_id: crate::fault_hooks::boot_id(),
        })
    }

    /// The stored bound if the machine restarted since it was written (its boot id
    /// differs, or this boot's cannot be read): what this node may have
    /// acknowledged and lost with the page cache.
    pub fn left_by_another_boot(&self) -> Option<AckedId> {
        let s = self.stored.as_ref()?;
        (self.boot_id.is_none() || !self.same_boot(s)).then_some(s.id)
    }

    /// True if `s` was written in this boot (an unknown boot id is stored as
    /// empty, and matches itself, so that the bound is not written at every
    /// acknowledgement).
    fn same_boot(&self, s: &StoredBound) -> bool {
        self.boot_id.as_deref().unwrap_or_default() == s.boot_id
    }

    /// The stored bound's log id.
    pub fn get(&self) -> Option<AckedId> {
        self.stored.as_ref().map(|s| s.id)
    }

    /// Before acknowledging `id`: if it is above the bound, or the bound was
    /// written in another boot, writes and fdatasyncs a bound
    /// [`BOUND_AHEAD_ENTRIES`] past it. Errors: `Io`.
    pub fn cover(&mut self, id: AckedId) -> Result<()> {
        let current = self
            .stored
            .as_ref()
            .filter(|s| self.same_boot(s))
            .map(|s| s.id);
        if Some(id) <= current {
            return Ok(());
        }
        self.set(Some(AckedId {
            term: id.term,
            index: id.index.saturating_add(BOUND_AHEAD_ENTRIES),
        }))
    }

    /// Once every acknowledged entry is durable (`acked` is the durable mark and
    /// nothing was acknowledged past it): brings a bound of this boot down to it,
    /// so that a power loss while idle costs a rebooted node no wait. Errors: `Io`.
    pub fn settle(&mut self, acked: Option<AckedId>) -> Result<()> {
        match &self.stored {
            Some(s) if self.same_boot(s) && Some(s.id) > acked => self.set(acked),
            _ => Ok(()),
        }
    }

    /// Writes `id` (none: clears) as the bound, with this boot's id, and
    /// fdatasyncs it. Errors: `Io`.
    pub fn set(&mut self, id: Option<AckedId>) -> Result<()> {
        let stored = id.map(|id| StoredBound {
            id,
            boot_id: self.boot_id.clone().unwrap_or_default(),
        });
        self.file
            .write_all_at(&encode(stored.as_ref()), 0)
            .at(&self.path)?;
        crate::fault_hooks::before_fsync();
        self.file.sync_data().at(&self.path)?;
        self.stored = stored;
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
    fn a_bound_round_trips_and_damage_reads_as_none() {
        let b = StoredBound {
            id: id(3, 77),
            boot_id: "2f1e0c55-6a8b-4c1e-9d7e-3b0a7c5e9f10".into(),
        };
        let bytes = encode(Some(&b));
        assert_eq!(decode(&bytes), Some(b));
        assert_eq!(decode(&encode(None)), None);
        let mut bad = bytes;
        bad[50] ^= 1;
        assert_eq!(decode(&bad), None);
        assert_eq!(decode(&bytes[..67]), None);
    }

    #[test]
    fn the_bound_is_written_ahead_and_read_back_only_across_a_boot() {
        let dir = tempfile::tempdir().unwrap();
        let mut b = AckBound::open(dir.path()).unwrap();
        assert_eq!(b.get(), None);
        b.cover(id(2, 10)).unwrap();
        assert_eq!(b.get(), Some(id(2, 10 + BOUND_AHEAD_ENTRIES)));
        // Under the bound: nothing is written.
        b.cover(id(2, 500)).unwrap();
        assert_eq!(b.get(), Some(id(2, 10 + BOUND_AHEAD_ENTRIES)));
        // A later term passes any bound of an earlier one.
        b.cover(id(3, 1)).unwrap();
        assert_eq!(b.get(), Some(id(3, 1 + BOUND_AHEAD_ENTRIES)));
        // Same boot: the bound says nothing lost.
        let again = AckBound::open(dir.path()).unwrap();
        assert_eq!(again.get(), b.get());
        assert_eq!(again.left_by_another_boot(), None);
        // Another boot: it does.
        let mut rebooted = AckBound::open(dir.path()).unwrap();
        rebooted.boot_id = Some("another boot".into());
        assert_eq!(rebooted.left_by_another_boot(), b.get());
        // A bound of another boot is written anew at the first acknowledgement.
        rebooted.cover(id(3, 5)).unwrap();
        assert_eq!(rebooted.get(), Some(id(3, 5 + BOUND_AHEAD_ENTRIES)));
        assert_eq!(rebooted.left_by_another_boot(), None);
    }
}
