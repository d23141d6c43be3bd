//! The acknowledged mark: the log id (term, log index) of the last entry this
//! node has told others is durable. Under SYNC_FLUSH it is raised (written and
//! fdatasync'd) after every CommitLog fsync and before anyone is told it completed.
//! Under ASYNC_FLUSH an entry is acknowledged once written, so the mark is written
//! (not fsynced) before that acknowledgement ([`AckMark::raise_written`]): it
//! survives a crash of the process, as the written entries do, and is fsynced with
//! the next CommitLog fsync; a power loss that takes it is covered by the durable
//! bound written ahead of it ([`crate::ack_bound`]). It is lowered only by Raft
//! truncation, never by crash recovery nor by a reset for a snapshot. So when recovery cuts a damaged
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

use crate::ack_bound::AckBound;
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
    mark: Mutex<Marks>,
    /// Locked after `mark` when both are.
    bound: Mutex<AckBound>,
}

/// The mark as written (what the file holds, in the page cache at least) and as
/// fdatasync'd.
#[derive(Debug, Clone, Copy, Default)]
struct Marks {
    written: Option<AckedId>,
    durable: Option<AckedId>,
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

/// Opens `<root>/<name>` for reading and writing, creating it (and fsyncing it and
/// its directory) if missing; returns its path, the file and its bytes. Errors:
/// `Io`.
pub fn open_small_file(root: &Path, name: &str) -> Result<(PathBuf, File, Vec<u8>)> {
    let path = root.join(name);
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
    Ok((path, file, bytes))
}

impl AckMark {
    /// Opens (creating, and fsyncing its directory) `<root>/ack_mark`. Errors: `Io`.
    pub fn open(root: &Path) -> Result<Self> {
        let (path, file, bytes) = open_small_file(root, "ack_mark")?;
        let mark = decode(&bytes);
        if mark.is_none() && bytes.iter().any(|&b| b != 0) {
            tracing::warn!(path = %path.display(), "the acknowledged mark is damaged; ignoring it");
        }
        Ok(Self {
            path,
            file,
            mark: Mutex::new(Marks {
                written: mark,
                durable: mark,
            }),
            bound: Mutex::new(AckBound::open(root)?),
        })
    }

    /// The mark: the entry with this log id and every one before it were
    /// acknowledged.
    pub fn get(&self) -> Option<AckedId> {
        self.mark.lock().unwrap().written
    }

    /// Makes the mark durable at `id` or higher (after a CommitLog fsync that
    /// covered `id`): if `id` is above the durable mark, writes the higher of `id`
    /// and the written mark and fdatasyncs it. Errors: `Io`.
    /// The fdatasync runs without the lock held, so acknowledgements
    /// ([`AckMark::raise_written`]) do not wait for it; once every acknowledged
    /// entry is durable the bound is brought down to the mark.
    pub fn raise(&self, id: AckedId) -> Result<()> {
        let m = {
            let mut cur = self.mark.lock().unwrap();
            if Some(id) <= cur.durable {
                return Ok(());
            }
            let m = cur.written.max(Some(id));
            self.write(m, false)?;
            cur.written = m;
            m
        };
        // The skip-fsync canary (debug builds, tests only) leaves the raised mark
        // in the page cache. Whatever the file holds now is at or above `m` (only
        // a truncation lowers it, and it syncs what it writes).
        if !crate::canary::enabled(crate::canary::Canary::SkipFsync) {
            crate::fault_hooks::before_fsync();
            self.file.sync_data().at(&self.path)?;
        }
        let mut cur = self.mark.lock().unwrap();
        if m > cur.durable && m <= cur.written {
            cur.durable = m;
        }
        if cur.durable == cur.written {
            self.bound.lock().unwrap().settle(cur.durable)?;
        }
        Ok(())
    }

    /// Moves the written mark up to `id` if it is higher, without fsync (ASYNC_FLUSH,
    /// before entries only written are acknowledged): it then survives a crash of
    /// the process, not a loss of power. Errors: `Io`.
    /// The durable bound ([`crate::ack_bound`]) is moved past `id` first if needed.
    pub fn raise_written(&self, id: AckedId) -> Result<()> {
        let mut cur = self.mark.lock().unwrap();
        if Some(id) > cur.written {
            self.bound.lock().unwrap().cover(id)?;
            self.write(Some(id), false)?;
            cur.written = Some(id);
        }
        Ok(())
    }

    /// Moves the mark down to `id` (durably) if it is lower, and the bound too:
    /// the entries past it were truncated away by Raft, not lost.
    /// Errors: `Io`.
    pub fn lower(&self, id: Option<AckedId>) -> Result<()> {
        let mut cur = self.mark.lock().unwrap();
        if id < cur.written {
            self.write(id, true)?;
            *cur = Marks {
                written: id,
                durable: id,
            };
        }
        let mut bound = self.bound.lock().unwrap();
        if bound.get() > id {
            bound.set(id)?;
        }
        Ok(())
    }

    /// Sets the mark to `id` and the bound to `id` as well, durably, whatever they
    /// were (an operator's decision to forget lost entries). Errors: `Io`.
    pub fn reset_to(&self, id: Option<AckedId>) -> Result<()> {
        let mut cur = self.mark.lock().unwrap();
        self.write(id, true)?;
        *cur = Marks {
            written: id,
            durable: id,
        };
        self.bound.lock().unwrap().set(id)
    }

    /// After an unclean stop: if the machine restarted since the durable bound was
    /// written ([`crate::ack_bound`], ASYNC_FLUSH), the page cache that held the
    /// mark and the last entries is gone, so the bound becomes the mark (durably)
    /// when it is higher. Returns the adopted mark. Errors: `Io`.
    pub fn adopt_bound_after_reboot(&self) -> Result<Option<AckedId>> {
        let mut cur = self.mark.lock().unwrap();
        let Some(b) = self.bound.lock().unwrap().left_by_another_boot() else {
            return Ok(None);
        };
        if Some(b) <= cur.written {
            return Ok(None);
        }
        self.write(Some(b), true)?;
        *cur = Marks {
            written: Some(b),
            durable: Some(b),
        };
        Ok(Some(b))
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

    #[test]
    fn a_written_mark_is_read_back_and_made_durable_at_or_above_it() {
        let dir = tempfile::tempdir().unwrap();
        let m = AckMark::open(dir.path()).unwrap();
        m.raise(id(1, 5)).unwrap();
        m.raise_written(id(1, 9)).unwrap();
        m.raise_written(id(1, 7)).unwrap();
        assert_eq!(m.get(), Some(id(1, 9)));
        // A process crash keeps what was written (the page cache holds it).
        assert_eq!(AckMark::open(dir.path()).unwrap().get(), Some(id(1, 9)));
        // A flush that covered less than was acknowledged never lowers the mark.
        m.raise(id(1, 8)).unwrap();
        assert_eq!(m.get(), Some(id(1, 9)));
        assert_eq!(AckMark::open(dir.path()).unwrap().get(), Some(id(1, 9)));
        // Truncation below the durable mark lowers both.
        // Everything acknowledged is durable: the bound comes down to the mark.
        assert_eq!(m.bound.lock().unwrap().get(), Some(id(1, 9)));
        m.raise_written(id(1, 12)).unwrap();
        assert_eq!(
            m.bound.lock().unwrap().get(),
            Some(id(1, 12 + crate::ack_bound::BOUND_AHEAD_ENTRIES))
        );
        m.lower(Some(id(1, 6))).unwrap();
        assert_eq!(m.get(), Some(id(1, 6)));
        assert_eq!(m.bound.lock().unwrap().get(), Some(id(1, 6)));
        m.raise(id(1, 7)).unwrap();
        assert_eq!(AckMark::open(dir.path()).unwrap().get(), Some(id(1, 7)));
    }
}
