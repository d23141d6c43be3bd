//! Storage faults on a stopped node's files: a power loss and a damaged tail.
//!
//! **Power loss.** A process crash loses nothing that was written (the page cache
//! survives it); a power loss loses what was not yet fsynced. The node runs with a
//! durable mark file (`durable_mark_file` in its config): after every fsync of its
//! CommitLog, and before anyone is told the bytes are durable, it records the new
//! flushed offset there. After SIGKILL, [`power_loss`] erases (zeroes, as a
//! preallocated segment reads after losing its unflushed pages) every CommitLog byte
//! at or past the mark. Nothing the node acknowledged as durable lies past the mark,
//! so under SYNC_FLUSH this is exactly what a power loss may do; under ASYNC_FLUSH
//! it also takes entries the node had acknowledged, which the group survives as long
//! as one node at a time loses power (what ASYNC_FLUSH promises). The Raft index,
//! ConsumeQueues and metadata are left as the page cache had them; recovery must
//! reconcile them with the shorter CommitLog.
//!
//! **Damaged tail.** [`damage_tail`] truncates (zeroes from a point on) or flips one
//! bit within the last 4 KiB written after the last checkpoint: the part of the log
//! crash recovery scans and must cut at the first bad record.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use rand::Rng;
use serde::Serialize;

/// Width of a CommitLog segment name (RocketMQ: 20-digit zero-padded start offset).
const SEGMENT_NAME_DIGITS: usize = 20;
/// Size of the region of the tail [`damage_tail`] picks from, bytes.
pub const TAIL_REGION_BYTES: u64 = 4096;

/// What a storage fault did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiskFault {
    /// CommitLog offset the damage starts at.
    pub offset: u64,
    /// Bytes changed (zeroed or flipped).
    pub bytes: u64,
    /// What was done.
    pub what: String,
}

/// The CommitLog segments under `commitlog_dir`: (start offset, path), sorted.
fn segments(commitlog_dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(commitlog_dir)? {
        let e = e?;
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.len() == SEGMENT_NAME_DIGITS && name.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(start) = name.parse() {
                out.push((start, e.path()));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Zeroes `[from, len)` of `file` in 1 MiB writes and fsyncs it; returns the bytes
/// that were not zero before.
fn zero_from(file: &mut File, from: u64) -> std::io::Result<u64> {
    let len = file.metadata()?.len();
    let mut changed = 0;
    let mut buf = vec![0u8; 1 << 20];
    let zeros = vec![0u8; 1 << 20];
    let mut at = from;
    while at < len {
        let n = ((len - at) as usize).min(buf.len());
        file.seek(SeekFrom::Start(at))?;
        file.read_exact(&mut buf[..n])?;
        let nonzero = buf[..n].iter().filter(|&&b| b != 0).count() as u64;
        if nonzero > 0 {
            changed += nonzero;
            file.seek(SeekFrom::Start(at))?;
            file.write_all(&zeros[..n])?;
        }
        at += n as u64;
    }
    file.sync_all()?;
    Ok(changed)
}

/// Reads the durable mark a node wrote (8 bytes, big-endian).
pub fn read_mark(mark_file: &Path) -> std::io::Result<u64> {
    let bytes = std::fs::read(mark_file)?;
    let arr: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, "durable mark is short")
        })?;
    Ok(u64::from_be_bytes(arr))
}

/// Simulates a power loss on a stopped node whose store root is `store_root`:
/// zeroes every CommitLog byte at or past the offset in `mark_file`.
pub fn power_loss(store_root: &Path, mark_file: &Path) -> std::io::Result<DiskFault> {
    let mark = read_mark(mark_file)?;
    let mut changed = 0;
    for (start, path) in segments(&store_root.join("commitlog"))? {
        let mut f = OpenOptions::new().read(true).write(true).open(&path)?;
        let len = f.metadata()?.len();
        if start + len <= mark {
            continue;
        }
        changed += zero_from(&mut f, mark.saturating_sub(start))?;
    }
    Ok(DiskFault {
        offset: mark,
        bytes: changed,
        what: "unflushed CommitLog bytes erased".into(),
    })
}

/// The CommitLog offset the store's checkpoint says is durable (bytes 4..12 of
/// `<root>/checkpoint`, big-endian; 0 without a checkpoint).
pub fn checkpoint_offset(store_root: &Path) -> std::io::Result<u64> {
    match std::fs::read(store_root.join("checkpoint")) {
        Ok(b) if b.len() >= 12 => Ok(u64::from_be_bytes(b[4..12].try_into().expect("8 bytes"))),
        Ok(_) => Ok(0),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

/// The end of what was written to the CommitLog at or after `from`: one past its
/// last non-zero byte (`from` if nothing is). Segments ending at or before `from`
/// are not read.
pub fn written_end(store_root: &Path, from: u64) -> std::io::Result<u64> {
    let mut end = from;
    for (start, path) in segments(&store_root.join("commitlog"))? {
        if start + std::fs::metadata(&path)?.len() <= from {
            continue;
        }
        let bytes = std::fs::read(&path)?;
        if let Some(last) = bytes.iter().rposition(|&b| b != 0) {
            end = start + last as u64 + 1;
        }
    }
    Ok(end)
}

/// Damages the tail of a stopped node's CommitLog: picks a point in the last
/// [`TAIL_REGION_BYTES`] written after the checkpoint and, by `rng`, either zeroes
/// everything from there (a torn, truncated tail) or flips one byte there (a
/// corrupted one). Returns `None` when nothing was written after the checkpoint.
pub fn damage_tail(store_root: &Path, rng: &mut impl Rng) -> std::io::Result<Option<DiskFault>> {
    let checkpoint = checkpoint_offset(store_root)?;
    let end = written_end(store_root, checkpoint)?;
    if end <= checkpoint {
        return Ok(None);
    }
    let at = rng.gen_range(checkpoint.max(end.saturating_sub(TAIL_REGION_BYTES))..end);
    let Some((start, path)) = segments(&store_root.join("commitlog"))?
        .into_iter()
        .rev()
        .find(|(s, _)| *s <= at)
    else {
        return Ok(None);
    };
    let mut f = OpenOptions::new().read(true).write(true).open(&path)?;
    if rng.gen_bool(0.5) {
        let bytes = zero_from(&mut f, at - start)?;
        return Ok(Some(DiskFault {
            offset: at,
            bytes,
            what: "CommitLog tail truncated (zeroed)".into(),
        }));
    }
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(at - start))?;
    f.read_exact(&mut b)?;
    b[0] ^= 1 << rng.gen_range(0..8);
    f.seek(SeekFrom::Start(at - start))?;
    f.write_all(&b)?;
    f.sync_all()?;
    Ok(Some(DiskFault {
        offset: at,
        bytes: 1,
        what: "CommitLog tail corrupted (one bit flipped)".into(),
    }))
}

/// Where node stores keep their durable mark (next to the store root).
pub fn mark_path(store_root: &Path) -> PathBuf {
    store_root.with_extension("durable-mark")
}
