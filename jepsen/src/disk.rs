//! Storage faults on a stopped node's files: a power loss, a damaged tail, and
//! damage beyond the tail ([`corrupt`]).
//!
//! **Power loss.** A process crash loses nothing that was written (the page cache
//! survives it); a power loss loses what the kernel had not yet written back. The
//! harness does not ask the node what it fsynced (an fsync bug in the node would
//! then hide itself): after the node was SIGKILLed and reaped (so its mappings are
//! torn down and the dirty bits of its mmap'd pages have reached the page cache),
//! [`power_loss`] asks the kernel, with cachestat(2) (Linux 6.5+), which pages of
//! every file under the store root are still dirty or under write-back, and puts
//! back what the disk holds for them. Pages the kernel wrote back by itself before
//! the check count as durable, as they would be. Under SYNC_FLUSH nothing the node
//! acknowledged may be lost this way; under ASYNC_FLUSH the unflushed tail of the
//! CommitLog goes, which the group survives as long as one node at a time loses
//! power.
//!
//! What the disk holds: the kernel tracks dirtiness per folio (a page, or up to
//! several MiB of a file written in one go), not per byte, so a dirty folio may
//! hold bytes fsynced before its last write-back next to bytes written since.
//! When the store root's file system sits on a block device this process can
//! read with `O_DIRECT` (the harness's per-node loop devices), a dirty page gets
//! the device's bytes for its written extents (FIEMAP, without syncing) and zeros
//! for unwritten, delayed-allocation and unmapped ones: what a restart after a
//! power loss reads. Otherwise (no such device, e.g. the machine's root disk) a
//! dirty page is zeroed whole: what a preallocated or appended region reads after
//! losing its unflushed pages, but harsher than a power loss for a page that also
//! holds fsynced bytes. Either way directory entries and file sizes are kept (a
//! file created or grown and never fsynced keeps its name and length), and so is
//! the file system's own metadata (extents the journal had not committed).
//!
//! **Damaged tail.** [`damage_tail`] truncates (zeroes from a point on) or flips one
//! bit within the last 4 KiB written after the last checkpoint: the part of the log
//! crash recovery scans and must cut at the first bad record.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rand::Rng;
use serde::Serialize;

mod corrupt;
mod device;
pub use corrupt::{corrupt, written_span, Part};
pub use device::Device;

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
pub fn segments(commitlog_dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
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

/// The x86_64 (and generic) number of the cachestat(2) system call (Linux 6.5+).
const SYS_CACHESTAT: libc::c_long = 451;

/// `struct cachestat_range` of cachestat(2): a byte range of a file.
#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

/// What cachestat(2) says of a byte range of a file, in pages (the kernel's page
/// size, [`page_bytes`]).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheStat {
    /// Pages in the page cache.
    pub cached: u64,
    /// Pages dirty (written, not yet written back).
    pub dirty: u64,
    /// Pages being written back.
    pub writeback: u64,
    /// Pages evicted from the page cache.
    pub evicted: u64,
    /// Pages evicted recently (would have been a cache hit).
    pub recently_evicted: u64,
}

/// The kernel's page size, bytes.
pub fn page_bytes() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// cachestat(2) over bytes `[offset, offset + len)` of `file` (`len` > 0). Errors:
/// the system call's (`ENOSYS` before Linux 6.5).
pub fn cachestat(file: &File, offset: u64, len: u64) -> std::io::Result<CacheStat> {
    use std::os::fd::AsRawFd;
    let range = CachestatRange { off: offset, len };
    let mut out = CacheStat::default();
    // SAFETY: both pointers are valid for the call, the structs are `repr(C)` with
    // the kernel's layout (five and two u64s), and flags must be 0.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const CachestatRange,
            &mut out as *mut CacheStat,
            0u32,
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(std::io::Error::new(
            e.kind(),
            format!("cachestat(2) (needs Linux 6.5 or later): {e}"),
        ));
    }
    Ok(out)
}

/// The byte ranges `[start, end)` of `file` (page-aligned; the last may end past
/// the file's length) whose pages are dirty or under write-back, in order and
/// merged. Bisects: a range with none is not looked into.
pub fn unflushed_ranges(file: &File) -> std::io::Result<Vec<(u64, u64)>> {
    let page = page_bytes();
    let len = file.metadata()?.len().div_ceil(page) * page;
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut todo = vec![(0u64, len)];
    while let Some((off, n)) = todo.pop() {
        if n == 0 {
            continue;
        }
        let s = cachestat(file, off, n)?;
        let pages = n / page;
        if s.dirty == 0 && s.writeback == 0 {
            continue;
        }
        if pages == 1 || s.dirty == pages || s.writeback == pages {
            match out.last_mut() {
                Some(last) if last.1 == off => last.1 = off + n,
                _ => out.push((off, off + n)),
            }
            continue;
        }
        let half = pages / 2 * page;
        // Popped last-in first: the lower half first, so `out` stays in order.
        todo.push((off + half, n - half));
        todo.push((off, half));
    }
    Ok(out)
}

/// What a power loss took from some files, bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Dropped {
    /// Bytes in pages that were dirty or under write-back (all put back to what
    /// the disk holds, or zeroed).
    pub unflushed: u64,
    /// Of those, bytes that changed (what was actually lost).
    pub changed: u64,
}

impl std::ops::AddAssign for Dropped {
    fn add_assign(&mut self, o: Self) {
        self.unflushed += o.unflushed;
        self.changed += o.changed;
    }
}

/// Puts back what the disk holds (`dev`; zeros without one, see the module docs)
/// over `ranges` of `file`, clamped to its length, with `pwrite`, skipping chunks
/// that would not change; not fsynced (the next start reads the same either way).
/// Returns what was dropped.
fn restore_ranges(
    file: &File,
    ranges: &[(u64, u64)],
    dev: Option<&Device>,
) -> std::io::Result<Dropped> {
    const CHUNK: u64 = 1 << 20;
    let len = file.metadata()?.len();
    let mut d = Dropped::default();
    let mut now = vec![0u8; CHUNK as usize];
    let mut disk = vec![0u8; CHUNK as usize];
    for &(start, end) in ranges {
        let mut at = start;
        while at < end.min(len) {
            // Whole pages from the device; only what lies inside the file is kept.
            let n = (end - at).min(CHUNK) as usize;
            let inside = ((len - at) as usize).min(n);
            match dev {
                Some(dev) => dev.read_file_range(file, at, &mut disk[..n])?,
                None => disk[..n].fill(0),
            }
            file.read_exact_at(&mut now[..inside], at)?;
            let changed = now[..inside]
                .iter()
                .zip(&disk[..inside])
                .filter(|(a, b)| a != b)
                .count() as u64;
            if changed > 0 {
                file.write_all_at(&disk[..inside], at)?;
            }
            d.unflushed += inside as u64;
            d.changed += changed;
            at += n as u64;
        }
    }
    Ok(d)
}

/// Drops the unflushed pages of one file (see the module docs): every page
/// cachestat(2) reports dirty or under write-back gets what the disk holds for it
/// (zeros without a readable device). The file's writers must be gone (a killed
/// process must have been reaped). Returns what was dropped and the device read.
pub fn drop_unflushed(path: &Path) -> std::io::Result<(Dropped, Option<PathBuf>)> {
    let f = OpenOptions::new().read(true).write(true).open(path)?;
    let dev = Device::of(path);
    let ranges = unflushed_ranges(&f)?;
    let d = restore_ranges(&f, &ranges, dev.as_ref())?;
    Ok((d, dev.map(|d| d.path)))
}

/// Every regular file under `dir`, recursively (symbolic links are not followed).
fn files_under(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let t = e.file_type()?;
        if t.is_dir() {
            files_under(&e.path(), out)?;
        } else if t.is_file() {
            out.push(e.path());
        }
    }
    Ok(())
}

/// What a simulated power loss took from one node's store.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct PowerLoss {
    /// Files looked at.
    pub files: usize,
    /// What was dropped, by kind of file: the first component of its path under
    /// the store root (`commitlog`, `raftindex`, `consumequeue`, `index`, `meta`
    /// for the sled metadata db, or a file's own name: `checkpoint`, `ack_mark`).
    pub by_kind: BTreeMap<String, Dropped>,
    /// The block device the disk's bytes were read from; `None`: dirty pages
    /// were zeroed whole.
    pub device: Option<PathBuf>,
}

impl PowerLoss {
    /// Everything dropped.
    pub fn total(&self) -> Dropped {
        let mut t = Dropped::default();
        for d in self.by_kind.values() {
            t += *d;
        }
        t
    }

    /// One line: the bytes lost per kind (unflushed bytes in brackets) and
    /// where the disk's bytes came from.
    pub fn describe(&self) -> String {
        let kinds: Vec<String> = self
            .by_kind
            .iter()
            .filter(|(_, d)| d.unflushed > 0)
            .map(|(k, d)| format!("{k} {} ({} unflushed)", d.changed, d.unflushed))
            .collect();
        let how = match &self.device {
            Some(dev) => format!("disk bytes read from {}", dev.display()),
            None => "dirty pages zeroed, no readable device".into(),
        };
        if kinds.is_empty() {
            format!("nothing unflushed in {} files ({how})", self.files)
        } else {
            let kinds = kinds.join(", ");
            format!("bytes lost of {} files: {kinds} ({how})", self.files)
        }
    }
}

/// Simulates a power loss on a stopped (killed and reaped) node whose store root
/// is `store_root`: drops the unflushed pages of every file under it (see the
/// module docs). Every file is looked at before any is changed.
pub fn power_loss(store_root: &Path) -> std::io::Result<PowerLoss> {
    let mut paths = Vec::new();
    files_under(store_root, &mut paths)?;
    paths.sort();
    let mut found = Vec::with_capacity(paths.len());
    for p in &paths {
        let f = match OpenOptions::new().read(true).write(true).open(p) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("{}: {e}", p.display()),
                ))
            }
        };
        let ranges = unflushed_ranges(&f)?;
        found.push((p, f, ranges));
    }
    let dev = Device::of(store_root);
    let mut out = PowerLoss {
        files: found.len(),
        device: dev.as_ref().map(|d| d.path.clone()),
        ..PowerLoss::default()
    };
    for (p, f, ranges) in found {
        let kind = p
            .strip_prefix(store_root)
            .ok()
            .and_then(|r| r.components().next())
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .unwrap_or_default();
        let d = restore_ranges(&f, &ranges, dev.as_ref())?;
        *out.by_kind.entry(kind).or_default() += d;
    }
    Ok(out)
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
