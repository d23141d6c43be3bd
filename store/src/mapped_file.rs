//! Fixed-size memory-mapped segment files and the ordered set of them that makes one
//! logical, append-only byte space (RocketMQ's `MappedFile` / `MappedFileQueue`).
//!
//! A segment is named by the 20-digit zero-padded offset of its first byte in the
//! logical space (`00000000000000000000`, `00000000001073741824`, ...). Segments are
//! contiguous: segment `k` starts where segment `k-1` ends.
//!
//! Concurrency contract: one writer at a time per queue (the owner serialises
//! appends), any number of readers. Readers only read bytes that the owner has
//! published as written (with Release/Acquire ordering on the owner's position), and
//! the owner never rewrites published bytes while readers may see them except under
//! its own exclusive lock (truncation). Under that contract the raw mapping is used
//! without data races.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use memmap2::MmapRaw;

use crate::error::{IoContext, Result, StoreError};

/// Width of a segment name: RocketMQ's 20-digit zero-padded start offset.
pub const SEGMENT_NAME_DIGITS: usize = 20;

/// Formats the file name of the segment that starts at `start_offset`.
pub fn segment_name(start_offset: u64) -> String {
    format!("{start_offset:0width$}", width = SEGMENT_NAME_DIGITS)
}

/// Creates `dir` if needed and returns the start offsets of the files in it named
/// by 20 decimal digits, sorted. Other names are ignored; a 20-digit name beyond
/// `u64::MAX` is `Corrupted`.
pub fn list_segment_starts(dir: &Path) -> Result<Vec<u64>> {
    std::fs::create_dir_all(dir).at(dir)?;
    let mut starts = Vec::new();
    for entry in std::fs::read_dir(dir).at(dir)? {
        let entry = entry.at(dir)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.len() != SEGMENT_NAME_DIGITS || !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        starts.push(name.parse().map_err(|_| StoreError::Corrupted {
            path: entry.path(),
            file_offset: 0,
            reason: "segment name out of range".into(),
        })?);
    }
    starts.sort_unstable();
    Ok(starts)
}

/// fsyncs a directory so that a file created, renamed or deleted in it survives a
/// power loss.
pub fn fsync_dir(dir: &Path) -> Result<()> {
    crate::fault_hooks::before_fsync();
    File::open(dir).and_then(|d| d.sync_all()).at(dir)
}

/// Sizes `file` to `size_bytes` with its blocks allocated (`posix_fallocate`), so a
/// full disk is reported here as an error (ENOSPC) rather than as SIGBUS when a
/// write through the mapping first touches an unallocated page.
fn allocate(file: &File, size_bytes: u64) -> std::io::Result<()> {
    fs4::fs_std::FileExt::allocate(file, size_bytes)?;
    if file.metadata()?.len() < size_bytes {
        file.set_len(size_bytes)?;
    }
    Ok(())
}

/// One memory-mapped segment file of `size_bytes` bytes whose first byte sits at
/// `start_offset` in the logical space.
pub struct MappedFile {
    path: PathBuf,
    start_offset: u64,
    size_bytes: u64,
    map: MmapRaw,
}

// SAFETY: `MmapRaw` is a raw pointer plus length; all access goes through the methods
// below, whose callers follow the module's single-writer / published-prefix contract.
unsafe impl Send for MappedFile {}
unsafe impl Sync for MappedFile {}

impl MappedFile {
    /// Creates the segment file `dir/<20-digit start_offset>` of exactly `size_bytes`
    /// zero bytes, fsyncs it and its directory, and maps it. Fails if it exists; a
    /// file it could not size (ENOSPC) is removed again.
    pub fn create(dir: &Path, start_offset: u64, size_bytes: u64) -> Result<Self> {
        let path = dir.join(segment_name(start_offset));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .at(&path)?;
        let sized = allocate(&file, size_bytes)
            .and_then(|_| file.sync_all())
            .at(&path);
        if let Err(e) = sized {
            // Holds nothing yet: remove it, so the same creation can be tried again
            // (e.g. once a full disk has room).
            drop(file);
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        fsync_dir(dir)?;
        Self::map(path, file, start_offset, size_bytes)
    }

    /// Opens an existing segment. A file shorter than `size_bytes` (a crash between
    /// creating it and sizing it) is extended with zeros; a longer one is an error.
    pub fn open(path: &Path, start_offset: u64, size_bytes: u64) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .at(path)?;
        let len = file.metadata().at(path)?.len();
        if len > size_bytes {
            return Err(StoreError::Corrupted {
                path: path.to_path_buf(),
                file_offset: 0,
                reason: format!("segment is {len} bytes, expected {size_bytes}"),
            });
        }
        if len < size_bytes {
            allocate(&file, size_bytes).at(path)?;
            file.sync_all().at(path)?;
        }
        Self::map(path.to_path_buf(), file, start_offset, size_bytes)
    }

    fn map(path: PathBuf, file: File, start_offset: u64, size_bytes: u64) -> Result<Self> {
        let map = MmapRaw::map_raw(&file).at(&path)?;
        debug_assert_eq!(map.len() as u64, size_bytes);
        // No fault read-around: without this, the first fault in a not-yet-cached
        // region (the warm-up thread's populate, or an append) makes the kernel read
        // `read_ahead_kb` (8 MiB here) around it in one go — for our fallocated,
        // unwritten tail that is ~20 ms of non-preemptible zero-filling per node,
        // every `read_ahead_kb` of log, which starves the tokio workers on a small
        // machine. Pages are faulted in ahead of the writer by `populate` instead.
        if let Err(e) = map.advise(memmap2::Advice::Random) {
            tracing::debug!(error = %e, path = %path.display(), "madvise(MADV_RANDOM) failed");
        }
        Ok(Self {
            path,
            start_offset,
            size_bytes,
            map,
        })
    }

    /// The segment's file path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Logical offset of the segment's first byte.
    pub fn start_offset(&self) -> u64 {
        self.start_offset
    }

    /// One past the logical offset of the segment's last byte.
    pub fn end_offset(&self) -> u64 {
        self.start_offset + self.size_bytes
    }

    /// The segment's size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn check(&self, pos: u64, len: usize) {
        assert!(
            pos.checked_add(len as u64)
                .is_some_and(|e| e <= self.size_bytes),
            "access [{pos}, +{len}) outside segment {} of {} bytes",
            self.path.display(),
            self.size_bytes
        );
    }

    /// Copies `data` to file position `pos`. Only the queue's single writer calls it,
    /// on bytes no reader has been told are written, or (a damaged CommitLog entry
    /// written back, `CommitLog::rewrite_entry`) while holding off every reader.
    pub fn write_at(&self, pos: u64, data: &[u8]) {
        self.check(pos, data.len());
        // SAFETY: in bounds (checked); single writer; readers do not read these bytes
        // until the owner publishes them.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.map.as_mut_ptr().add(pos as usize),
                data.len(),
            )
        }
    }

    /// Fills `[pos, pos + len)` with zeros (used to erase a truncated tail).
    pub fn zero(&self, pos: u64, len: usize) {
        self.check(pos, len);
        // SAFETY: as for `write_at`; truncation runs under the owner's exclusive lock.
        unsafe { std::ptr::write_bytes(self.map.as_mut_ptr().add(pos as usize), 0, len) }
    }

    /// Borrows `len` bytes at file position `pos`. The caller must only ask for
    /// published bytes and must not hold the slice across a truncation of them.
    pub fn slice(&self, pos: u64, len: usize) -> &[u8] {
        self.check(pos, len);
        // SAFETY: in bounds; the mapping lives as long as `self`; the caller reads
        // only published bytes (module contract).
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(pos as usize), len) }
    }

    /// Durably writes `[from, to)` of this file to disk: `msync(MS_SYNC)` through
    /// memmap2's `flush_range` (never `flush_async`).
    pub fn flush_range(&self, from: u64, to: u64) -> Result<()> {
        if to <= from {
            return Ok(());
        }
        self.check(from, (to - from) as usize);
        crate::fault_hooks::before_fsync();
        self.map
            .flush_range(from as usize, (to - from) as usize)
            .at(&self.path)
    }

    /// Faults in `[from, to)` writable without changing its contents
    /// (`madvise(MADV_POPULATE_WRITE)`), so later writes through the mapping do not
    /// stall on page faults. Safe while the range is being written. Fails on kernels
    /// before 5.14 (callers treat that as "not available").
    pub fn populate(&self, from: u64, to: u64) -> std::io::Result<()> {
        if to <= from {
            return Ok(());
        }
        self.check(from, (to - from) as usize);
        self.map.advise_range(
            memmap2::Advice::PopulateWrite,
            from as usize,
            (to - from) as usize,
        )
    }

    /// Drops this process's page-table entries for the whole pages in `[from, to)`
    /// (`madvise(MADV_DONTNEED)`; for a shared file mapping the data stays in the page
    /// cache, dirty pages stay dirty, and a later access maps the same page again).
    /// Done before write-back of written bytes: write-back must write-protect every
    /// page still mapped writable, one TLB-shootdown IPI per 4 KiB page; pages no
    /// longer mapped cost one shootdown for the whole range. Only the queue's owner
    /// calls it, for bytes it will not write again.
    pub fn unmap_pages(&self, from: u64, to: u64) -> std::io::Result<()> {
        const PAGE: u64 = 4096;
        let (from, to) = (from.next_multiple_of(PAGE), to / PAGE * PAGE);
        if to <= from {
            return Ok(());
        }
        self.check(from, (to - from) as usize);
        // SAFETY: MADV_DONTNEED on a MAP_SHARED file mapping does not change what the
        // mapping reads as (the page cache holds the bytes); the range is in bounds.
        unsafe {
            self.map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                from as usize,
                (to - from) as usize,
            )
        }
    }

    /// Schedules `[from, to)` for write-back without waiting (`MS_ASYNC`). Not durable.
    pub fn flush_range_async(&self, from: u64, to: u64) -> Result<()> {
        if to <= from {
            return Ok(());
        }
        self.check(from, (to - from) as usize);
        self.map
            .flush_async_range(from as usize, (to - from) as usize)
            .at(&self.path)
    }
}

/// The ordered, contiguous set of segments of one logical byte space
/// (the CommitLog, one ConsumeQueue, the Raft log index).
pub struct MappedFileQueue {
    dir: PathBuf,
    segment_bytes: u64,
    files: RwLock<Vec<Arc<MappedFile>>>,
    /// Bytes of the disk a new segment must leave free ([`crate::room`]); 0: none.
    keep_free_bytes: std::sync::atomic::AtomicU64,
}

impl MappedFileQueue {
    /// Opens (creating `dir` if needed) the segments under `dir`. Files whose names are
    /// not 20 digits are ignored. Fails with `Corrupted` if a name is not a multiple of
    /// `segment_bytes` or the segments are not contiguous.
    pub fn open(dir: &Path, segment_bytes: u64) -> Result<Self> {
        if segment_bytes == 0 {
            return Err(StoreError::Config("segment size must be > 0".into()));
        }
        let starts = list_segment_starts(dir)?;
        let mut files = Vec::with_capacity(starts.len());
        for (i, &start) in starts.iter().enumerate() {
            let path = dir.join(segment_name(start));
            if start % segment_bytes != 0 || (i > 0 && start != starts[i - 1] + segment_bytes) {
                return Err(StoreError::Corrupted {
                    path,
                    file_offset: 0,
                    reason: format!(
                        "segment start {start} breaks the contiguous sequence of {segment_bytes}-byte segments"
                    ),
                });
            }
            files.push(Arc::new(MappedFile::open(&path, start, segment_bytes)?));
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            segment_bytes,
            files: RwLock::new(files),
            keep_free_bytes: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// From now on a new segment is made only if `bytes` of the disk stay free after
    /// it; otherwise [`Self::find_or_create`] fails with ENOSPC ([`crate::room`]).
    /// 0 (the default) leaves it to the file system.
    pub fn keep_free(&self, bytes: u64) {
        self.keep_free_bytes
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// The directory holding the segments.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Size of every segment in bytes.
    pub fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    /// Start offset of the oldest segment, or `None` when there is none.
    pub fn first_start(&self) -> Option<u64> {
        self.files.read().unwrap().first().map(|f| f.start_offset())
    }

    /// End offset of the newest segment, or `None` when there is none.
    pub fn last_end(&self) -> Option<u64> {
        self.files.read().unwrap().last().map(|f| f.end_offset())
    }

    /// A snapshot of the current segments, oldest first.
    pub fn segments(&self) -> Vec<Arc<MappedFile>> {
        self.files.read().unwrap().clone()
    }

    /// The segment containing logical `offset`, if it exists.
    pub fn find(&self, offset: u64) -> Option<Arc<MappedFile>> {
        let files = self.files.read().unwrap();
        let first = files.first()?.start_offset();
        if offset < first {
            return None;
        }
        files
            .get(((offset - first) / self.segment_bytes) as usize)
            .cloned()
    }

    /// The segment containing `offset`, creating it (and only it) if `offset` is the
    /// first byte after the last segment, or the first segment of an empty queue.
    pub fn find_or_create(&self, offset: u64) -> Result<Arc<MappedFile>> {
        if let Some(f) = self.find(offset) {
            return Ok(f);
        }
        let mut files = self.files.write().unwrap();
        let start = offset - offset % self.segment_bytes;
        match files.last() {
            Some(last) if last.end_offset() != start => {
                return Err(StoreError::InvalidInput(format!(
                    "offset {offset} is not next to the last segment ending at {}",
                    last.end_offset()
                )))
            }
            _ => {}
        }
        let keep = self
            .keep_free_bytes
            .load(std::sync::atomic::Ordering::Relaxed);
        if keep > 0 {
            let available = crate::room::available_bytes(&self.dir)?;
            if !crate::room::may_make_file(available, self.segment_bytes, keep) {
                return Err(crate::room::no_space(&self.dir));
            }
        }
        let f = Arc::new(MappedFile::create(&self.dir, start, self.segment_bytes)?);
        files.push(f.clone());
        Ok(f)
    }

    /// Deletes every segment that starts after `offset` (when `offset` is a segment
    /// start, that segment stays). Files are unlinked newest first, then the directory
    /// is fsynced. Readers holding a segment keep a valid mapping until they drop it.
    pub fn remove_segments_after(&self, offset: u64) -> Result<()> {
        let mut files = self.files.write().unwrap();
        let mut removed = false;
        while files.last().is_some_and(|f| f.start_offset() > offset) {
            let f = files.pop().expect("checked non-empty");
            std::fs::remove_file(f.path()).at(f.path())?;
            removed = true;
        }
        if removed {
            fsync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Deletes the oldest segments while `keep_oldest(segment) == false`, stopping at
    /// the first one to keep. Never deletes the newest segment. Returns how many were
    /// deleted. The directory is fsynced afterwards.
    pub fn remove_oldest_while(
        &self,
        mut remove: impl FnMut(&MappedFile) -> bool,
    ) -> Result<usize> {
        let mut files = self.files.write().unwrap();
        let mut n = 0;
        while files.len() > 1 && remove(&files[0]) {
            let f = files.remove(0);
            std::fs::remove_file(f.path()).at(f.path())?;
            n += 1;
        }
        if n > 0 {
            fsync_dir(&self.dir)?;
        }
        Ok(n)
    }

    /// Deletes every segment; used when a queue is rebuilt from scratch.
    pub fn remove_all(&self) -> Result<()> {
        let mut files = self.files.write().unwrap();
        for f in files.drain(..) {
            std::fs::remove_file(f.path()).at(f.path())?;
        }
        fsync_dir(&self.dir)
    }

    /// Copies `dst.len()` bytes starting at logical `offset` into `dst`; the range must
    /// lie inside one segment and be published by the owner.
    pub fn read_into(&self, offset: u64, dst: &mut [u8]) -> Option<()> {
        let f = self.find(offset)?;
        let pos = offset - f.start_offset();
        if pos + dst.len() as u64 > f.size_bytes() {
            return None;
        }
        dst.copy_from_slice(f.slice(pos, dst.len()));
        Some(())
    }

    /// Durably flushes logical `[from, to)` across every segment it touches (MS_SYNC).
    pub fn flush_range(&self, from: u64, to: u64) -> Result<()> {
        self.for_each_range(from, to, |f, a, b| f.flush_range(a, b))
    }

    /// [`MappedFile::unmap_pages`] over logical `[from, to)`.
    pub fn unmap_pages(&self, from: u64, to: u64) -> Result<()> {
        self.for_each_range(from, to, |f, a, b| f.unmap_pages(a, b).at(f.path()))
    }

    /// Schedules logical `[from, to)` for write-back (MS_ASYNC, not durable).
    pub fn flush_range_async(&self, from: u64, to: u64) -> Result<()> {
        self.for_each_range(from, to, |f, a, b| f.flush_range_async(a, b))
    }

    fn for_each_range(
        &self,
        from: u64,
        to: u64,
        mut op: impl FnMut(&MappedFile, u64, u64) -> Result<()>,
    ) -> Result<()> {
        // Segments below the oldest one were deleted: nothing left to do there.
        let mut at = from.max(self.first_start().unwrap_or(from));
        while at < to {
            let Some(f) = self.find(at) else { break };
            let end = to.min(f.end_offset());
            op(&f, at - f.start_offset(), end - f.start_offset())?;
            at = end;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_roll_and_reopen_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let q = MappedFileQueue::open(dir.path(), 64).unwrap();
        for off in [0u64, 64, 128] {
            let f = q.find_or_create(off).unwrap();
            f.write_at(0, &off.to_be_bytes());
        }
        assert!(q.find_or_create(256).is_err(), "a gap must be refused");
        q.flush_range(0, 192).unwrap();
        drop(q);
        let q = MappedFileQueue::open(dir.path(), 64).unwrap();
        assert_eq!(q.first_start(), Some(0));
        assert_eq!(q.last_end(), Some(192));
        let mut b = [0u8; 8];
        q.read_into(128, &mut b).unwrap();
        assert_eq!(u64::from_be_bytes(b), 128);
        q.remove_segments_after(64).unwrap();
        assert_eq!(q.last_end(), Some(128));
        assert_eq!(q.remove_oldest_while(|_| true).unwrap(), 1);
        assert_eq!(q.first_start(), Some(64));
    }

    #[test]
    fn a_gap_between_segments_is_reported_as_corruption() {
        let dir = tempfile::tempdir().unwrap();
        MappedFile::create(dir.path(), 0, 64).unwrap();
        MappedFile::create(dir.path(), 128, 64).unwrap();
        assert!(matches!(
            MappedFileQueue::open(dir.path(), 64),
            Err(StoreError::Corrupted { .. })
        ));
    }
}
