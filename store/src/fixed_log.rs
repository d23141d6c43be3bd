//! A log of fixed-width entries over a [`MappedFileQueue`]: entry `n` (its "offset",
//! counted in entries) sits at byte `n × W` of the logical space, so reading any entry
//! is O(1). The ConsumeQueue (W = 20) and the Raft log index (W = 32) are built on it.
//!
//! An all-zero entry means "not written": callers guarantee that a real entry is never
//! all zero. That is how [`FixedLog::open`] finds the end of the data, and why
//! [`FixedLog::truncate`] zeroes (and fsyncs) what it drops.
//!
//! Concurrency: one writer at a time (append, truncate, reset, set_min,
//! remove_segments_below — the caller serialises them), any number of concurrent
//! readers ([`FixedLog::get`], [`FixedLog::partition_point`]). `append` writes beyond
//! the published `max` and then publishes it with Release; readers load it with
//! Acquire. Truncation and reset rewrite published bytes, so they take an exclusive
//! lock that readers take shared while they copy an entry out: no reader can see bytes
//! being zeroed.
//!
//! What survives a restart: the entries themselves and, through the segment files, the
//! positions. The logical minimum raised by [`FixedLog::set_min`] is not stored: after
//! reopening, `min` is the first non-zero entry of the first segment (normally its
//! first entry; after [`FixedLog::reset`] the entry it restarted at), so the owner must
//! re-apply its retention point after a restart.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::error::{Result, StoreError};
use crate::mapped_file::{segment_name, MappedFile, MappedFileQueue};

/// How many bytes after the end of the data [`FixedLog::open`] checks for stray
/// entries. After an OS crash, a later page of unflushed entries may have reached the
/// disk while an earlier one did not, leaving written entries beyond the first zero
/// entry; open zeroes those it finds in this window so that later appends cannot join
/// up with them. Unflushed data is normally far smaller than this.
pub const TAIL_CHECK_BYTES: u64 = 64 * 1024;

fn is_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

/// A log of fixed-width entries stored in fixed-size memory-mapped segments.
pub struct FixedLog {
    files: MappedFileQueue,
    entry_bytes: usize,
    entries_per_file: u64,
    /// Name of an offset in `OutOfRange` errors.
    offset_name: &'static str,
    /// First readable entry.
    min: AtomicU64,
    /// One past the last written entry.
    max: AtomicU64,
    /// Entries below this are known to be on disk.
    flushed: AtomicU64,
    /// Taken shared while bytes are copied out (and by other ops that must not overlap
    /// a rewrite), exclusively by truncate and reset.
    rewrite: RwLock<()>,
}

impl FixedLog {
    /// Opens (creating `dir` if needed) the log of `entry_bytes`-wide entries stored
    /// `entries_per_file` to a segment, and finds its bounds: `max` is the first
    /// all-zero entry after the start of the last segment holding data (trailing empty
    /// segments, e.g. one created just before a crash, are skipped), `min` is the first
    /// non-zero entry of the first segment. Stray non-zero entries within
    /// [`TAIL_CHECK_BYTES`] after `max` are zeroed. `flushed` starts at the start of
    /// the segment holding the last entry, so the first [`FixedLog::flush`] re-syncs it.
    pub fn open(dir: &Path, entry_bytes: usize, entries_per_file: u64) -> Result<Self> {
        if entry_bytes == 0 || entries_per_file == 0 {
            return Err(StoreError::Config(format!(
                "fixed log needs entries of > 0 bytes and > 0 entries per file, got {entry_bytes} and {entries_per_file}"
            )));
        }
        let segment_bytes = (entry_bytes as u64)
            .checked_mul(entries_per_file)
            .filter(|&b| usize::try_from(b).is_ok())
            .ok_or_else(|| {
                StoreError::Config(format!(
                    "{entries_per_file} entries of {entry_bytes} bytes do not fit one segment"
                ))
            })?;
        let log = Self {
            files: MappedFileQueue::open(dir, segment_bytes)?,
            entry_bytes,
            entries_per_file,
            offset_name: "entry offset",
            min: AtomicU64::new(0),
            max: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
            rewrite: RwLock::new(()),
        };
        let (min, max) = log.scan_bounds();
        log.min.store(min, Ordering::Release);
        log.max.store(max, Ordering::Release);
        let last_segment_start = max.saturating_sub(1) / entries_per_file * entries_per_file;
        log.flushed
            .store(last_segment_start.clamp(min, max), Ordering::Release);
        log.zero_strays()?;
        log.check_invariants();
        Ok(log)
    }

    /// Sets the name given to offsets in `OutOfRange` errors ("queue offset",
    /// "log index"); the default is "entry offset".
    pub fn with_offset_name(mut self, name: &'static str) -> Self {
        self.offset_name = name;
        self
    }

    /// Finds `(min, max)` from the segment contents.
    fn scan_bounds(&self) -> (u64, u64) {
        let segs = self.files.segments();
        let Some(first) = segs.first() else {
            return (0, 0);
        };
        let w = self.entry_bytes;
        fn entries(s: &MappedFile, w: usize) -> std::slice::ChunksExact<'_, u8> {
            s.slice(0, s.size_bytes() as usize).chunks_exact(w)
        }
        let first_entry = first.start_offset() / w as u64;
        let first_data = entries(first, w)
            .position(|e| !is_zero(e))
            .map(|i| i as u64);
        // Later segments hold data from their first entry on; skip trailing empty ones.
        let last_data = segs[1..].iter().rev().find(|s| !is_zero(s.slice(0, w)));
        let (min, scan_from, seg) = match (first_data, last_data) {
            (None, None) => return (first_entry, first_entry),
            (Some(i), None) => (first_entry + i, i as usize, first),
            (first_data, Some(seg)) => {
                if first_data.is_none() {
                    tracing::warn!(
                        path = %first.path().display(),
                        "first segment holds no entry though later ones do; its entries will read as corrupted"
                    );
                }
                (first_entry + first_data.unwrap_or(0), 0, seg)
            }
        };
        let written = entries(seg, w)
            .skip(scan_from)
            .take_while(|e| !is_zero(e))
            .count();
        let max = seg.start_offset() / w as u64 + (scan_from + written) as u64;
        (min, max)
    }

    /// Zeroes (and fsyncs) non-zero entries in the [`TAIL_CHECK_BYTES`] after `max`.
    fn zero_strays(&self) -> Result<()> {
        let w = self.entry_bytes;
        let from = self.max.load(Ordering::Acquire) * w as u64;
        let to = from.saturating_add(TAIL_CHECK_BYTES);
        self.for_each_segment_range(from, to, |seg, a, b| {
            let mut dirty = None;
            for (i, e) in seg.slice(a, (b - a) as usize).chunks_exact(w).enumerate() {
                if !is_zero(e) {
                    let pos = a + (i * w) as u64;
                    tracing::warn!(path = %seg.path().display(), file_offset = pos, "zeroing a stray entry past the end of the log");
                    seg.zero(pos, w);
                    dirty = Some((dirty.map_or(pos, |(s, _)| s), pos + w as u64));
                }
            }
            match dirty {
                Some((s, e)) => seg.flush_range(s, e),
                None => Ok(()),
            }
        })
    }

    /// Runs `op(segment, from_in_file, to_in_file)` on every current segment that
    /// overlaps logical bytes `[from, to)`, oldest first. Works on a snapshot, so a
    /// segment deleted meanwhile is still valid (its mapping lives as long as the Arc).
    fn for_each_segment_range(
        &self,
        from: u64,
        to: u64,
        mut op: impl FnMut(&MappedFile, u64, u64) -> Result<()>,
    ) -> Result<()> {
        for seg in self.files.segments() {
            let a = from.max(seg.start_offset());
            let b = to.min(seg.end_offset());
            if a < b {
                op(&seg, a - seg.start_offset(), b - seg.start_offset())?;
            }
        }
        Ok(())
    }

    fn read_lock(&self) -> RwLockReadGuard<'_, ()> {
        self.rewrite.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_lock(&self) -> RwLockWriteGuard<'_, ()> {
        self.rewrite.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn check_invariants(&self) {
        let (min, flushed, max) = (self.min(), self.flushed(), self.max());
        debug_assert!(min <= max, "fixed log min {min} > max {max}");
        debug_assert!(flushed <= max, "fixed log flushed {flushed} > max {max}");
    }

    /// Logical byte position of entry `n`, refusing offsets whose segment would
    /// overflow the u64 byte space.
    fn byte_pos(&self, n: u64) -> Result<u64> {
        n.checked_mul(self.entry_bytes as u64)
            .filter(|p| p.checked_add(2 * self.files.segment_bytes()).is_some())
            .ok_or_else(|| StoreError::InvalidInput(format!("entry offset {n} is too large")))
    }

    fn check_width(&self, len: usize) -> Result<()> {
        if len == self.entry_bytes {
            Ok(())
        } else {
            Err(StoreError::InvalidInput(format!(
                "entry buffer of {len} bytes, the log's entries are {} bytes",
                self.entry_bytes
            )))
        }
    }

    fn out_of_range(&self, requested: u64) -> StoreError {
        StoreError::OutOfRange {
            what: self.offset_name,
            requested,
            min: self.min(),
            max: self.max(),
        }
    }

    /// A `Corrupted` error naming the segment file and file offset of entry `n`, for
    /// callers whose checks of an entry's contents fail.
    pub fn corrupted(&self, n: u64, reason: impl Into<String>) -> StoreError {
        let pos = n.saturating_mul(self.entry_bytes as u64);
        let seg_start = pos - pos % self.files.segment_bytes();
        let path = self
            .files
            .find(pos)
            .map(|f| f.path().to_path_buf())
            .unwrap_or_else(|| self.files.dir().join(segment_name(seg_start)));
        StoreError::Corrupted {
            path,
            file_offset: pos - seg_start,
            reason: reason.into(),
        }
    }

    /// The directory holding the segments.
    pub fn dir(&self) -> &Path {
        self.files.dir()
    }

    /// Width of one entry in bytes.
    pub fn entry_bytes(&self) -> usize {
        self.entry_bytes
    }

    /// Entries per segment file.
    pub fn entries_per_file(&self) -> u64 {
        self.entries_per_file
    }

    /// Number of segment files currently held.
    pub fn segment_count(&self) -> usize {
        self.files.segments().len()
    }

    /// The first readable entry offset.
    pub fn min(&self) -> u64 {
        self.min.load(Ordering::Acquire)
    }

    /// One past the last written entry offset (the offset the next append gets).
    pub fn max(&self) -> u64 {
        self.max.load(Ordering::Acquire)
    }

    /// Entries below this offset are durable (fsynced by [`FixedLog::flush`]).
    pub fn flushed(&self) -> u64 {
        self.flushed.load(Ordering::Acquire)
    }

    /// Appends `entry` (exactly `entry_bytes` long, not all zero, else `InvalidInput`)
    /// at offset `max`, creating a segment when needed, and returns that offset.
    pub fn append(&self, entry: &[u8]) -> Result<u64> {
        self.check_width(entry.len())?;
        if is_zero(entry) {
            return Err(StoreError::InvalidInput(
                "an all-zero entry cannot be stored: it means \"not written\"".into(),
            ));
        }
        let _shared = self.read_lock();
        let n = self.max.load(Ordering::Acquire);
        let pos = self.byte_pos(n)?;
        let seg = self.files.find_or_create(pos)?;
        let at = pos - seg.start_offset();
        debug_assert!(
            is_zero(seg.slice(at, entry.len())),
            "slot of entry {n} in {} is not blank",
            seg.path().display()
        );
        seg.write_at(at, entry);
        self.max.store(n + 1, Ordering::Release);
        Ok(n)
    }

    /// Copies entry `n` into `out` (exactly `entry_bytes` long). `OutOfRange` outside
    /// `[min, max)`; `Corrupted` if the stored entry is all zero (data lost on disk).
    pub fn get(&self, n: u64, out: &mut [u8]) -> Result<()> {
        self.check_width(out.len())?;
        let _shared = self.read_lock();
        if n < self.min() || n >= self.max() {
            return Err(self.out_of_range(n));
        }
        let pos = n * self.entry_bytes as u64;
        // `None` only if retention deleted the segment after the bounds check.
        self.files
            .read_into(pos, out)
            .ok_or_else(|| self.out_of_range(n))?;
        if is_zero(out) {
            return Err(self.corrupted(n, "entry below the end of the log is all zero"));
        }
        Ok(())
    }

    /// Rewrites entry `n` (in `[min, max)`, else `OutOfRange`) with `entry` (exactly
    /// `entry_bytes` long, not all zero, else `InvalidInput`): the repair of a damaged
    /// entry from the data it is derived from. Readers are held off while it is
    /// written; it is made durable by the next [`FixedLog::flush`] that covers it.
    pub fn overwrite(&self, n: u64, entry: &[u8]) -> Result<()> {
        self.check_width(entry.len())?;
        if is_zero(entry) {
            return Err(StoreError::InvalidInput(
                "an all-zero entry cannot be stored: it means \"not written\"".into(),
            ));
        }
        let _exclusive = self.write_lock();
        if n < self.min() || n >= self.max() {
            return Err(self.out_of_range(n));
        }
        let pos = self.byte_pos(n)?;
        let seg = self.files.find(pos).ok_or_else(|| self.out_of_range(n))?;
        seg.write_at(pos - seg.start_offset(), entry);
        // A flush covering `n` must write it again.
        self.flushed.fetch_min(n, Ordering::AcqRel);
        Ok(())
    }

    /// Raises the logical minimum to `n` (retention), clamped to `max`. Never lowers
    /// it. Not stored: re-apply it after reopening.
    pub fn set_min(&self, n: u64) {
        let _shared = self.read_lock();
        self.min.fetch_max(n.min(self.max()), Ordering::AcqRel);
        self.check_invariants();
    }

    /// Drops every entry at or after `n` (a no-op if `n >= max`). `max` is lowered
    /// first (under the exclusive lock), then segments starting after the cut are
    /// deleted, newest first, then the dropped bytes of the segment holding the cut are
    /// zeroed and fsynced, so a restart cannot bring them back. Deleting before zeroing
    /// means a crash in between leaves a shorter, gap-free log. If `n < min` the log
    /// becomes empty at `n`.
    pub fn truncate(&self, n: u64) -> Result<()> {
        let _exclusive = self.write_lock();
        let old_max = self.max.load(Ordering::Acquire);
        if n >= old_max {
            return Ok(());
        }
        self.max.store(n, Ordering::Release);
        self.min.fetch_min(n, Ordering::AcqRel);
        self.flushed.fetch_min(n, Ordering::AcqRel);
        self.check_invariants();
        let w = self.entry_bytes as u64;
        let (from, to) = (n * w, old_max * w);
        self.files.remove_segments_after(from)?;
        self.for_each_segment_range(from, to, |seg, a, b| {
            seg.zero(a, (b - a) as usize);
            seg.flush_range(a, b)
        })
    }

    /// Drops everything and restarts empty at offset `n`: every segment is deleted; the
    /// next append creates the segment holding `n`, whose entries before `n` stay
    /// zero. `min = max = flushed = n`. Survives a restart once an entry has been
    /// appended and flushed (reopen takes `min` from the first non-zero entry); before
    /// that a reopened log is empty at offset 0.
    pub fn reset(&self, n: u64) -> Result<()> {
        self.byte_pos(n)?;
        let _exclusive = self.write_lock();
        self.max.store(n, Ordering::Release);
        self.min.store(n, Ordering::Release);
        self.flushed.store(n, Ordering::Release);
        self.files.remove_all()
    }

    /// Durably writes (msync `MS_SYNC`) the entries appended since the last flush and
    /// returns the durable `max`.
    pub fn flush(&self) -> Result<u64> {
        let _shared = self.read_lock();
        let max = self.max();
        let flushed = self.flushed();
        if flushed < max {
            let w = self.entry_bytes as u64;
            self.for_each_segment_range(flushed * w, max * w, |seg, a, b| seg.flush_range(a, b))?;
            self.flushed.fetch_max(max, Ordering::AcqRel);
        }
        self.check_invariants();
        Ok(self.flushed())
    }

    /// Deletes the oldest segments whose every entry is below `n` (clamped to `max`),
    /// never the newest one, and raises `min` to the first entry still held. Returns how
    /// many segments were deleted.
    pub fn remove_segments_below(&self, n: u64) -> Result<usize> {
        let _shared = self.read_lock();
        let limit = n.min(self.max()) * self.entry_bytes as u64;
        let removed = self
            .files
            .remove_oldest_while(|seg| seg.end_offset() <= limit)?;
        if let Some(first) = self.files.first_start() {
            self.min
                .fetch_max(first / self.entry_bytes as u64, Ordering::AcqRel);
        }
        self.check_invariants();
        Ok(removed)
    }

    /// Binary search over entries `[lo, hi)` (which must lie in `[min, max]`, else
    /// `OutOfRange`): returns the first offset where `pred(offset, entry)` is false,
    /// `pred` being true on a prefix of the range (`hi` if it is true everywhere).
    /// `pred` runs without any lock held.
    pub fn partition_point(
        &self,
        lo: u64,
        hi: u64,
        mut pred: impl FnMut(u64, &[u8]) -> Result<bool>,
    ) -> Result<u64> {
        if lo > hi {
            return Err(StoreError::InvalidInput(format!(
                "search range [{lo}, {hi}) is reversed"
            )));
        }
        if lo < self.min() {
            return Err(self.out_of_range(lo));
        }
        if hi > self.max() {
            return Err(self.out_of_range(hi));
        }
        let (mut lo, mut hi) = (lo, hi);
        let mut buf = vec![0u8; self.entry_bytes];
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            self.get(mid, &mut buf)?;
            if pred(mid, &buf)? {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const W: usize = 8;

    fn entry(v: u64) -> [u8; W] {
        (v + 1).to_be_bytes()
    }

    fn read(log: &FixedLog, n: u64) -> Result<u64> {
        let mut b = [0u8; W];
        log.get(n, &mut b)?;
        Ok(u64::from_be_bytes(b) - 1)
    }

    fn open4(dir: &Path) -> FixedLog {
        FixedLog::open(dir, W, 4).unwrap()
    }

    fn oor<T: std::fmt::Debug>(r: Result<T>) -> bool {
        matches!(r, Err(StoreError::OutOfRange { .. }))
    }

    fn files_in(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn append_get_across_segments_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let log = open4(dir.path());
        for v in 0..10 {
            assert_eq!(log.append(&entry(v * 7)).unwrap(), v);
        }
        assert_eq!(log.segment_count(), 3);
        assert_eq!((log.min(), log.max()), (0, 10));
        assert_eq!(read(&log, 5).unwrap(), 35);
        assert_eq!(log.flush().unwrap(), 10);
        drop(log);
        let log = open4(dir.path());
        assert_eq!((log.min(), log.max()), (0, 10));
        for v in 0..10 {
            assert_eq!(read(&log, v).unwrap(), v * 7);
        }
        assert_eq!(log.append(&entry(99)).unwrap(), 10);
        assert_eq!(
            files_in(dir.path()),
            vec![segment_name(0), segment_name(32), segment_name(64)]
        );
    }

    #[test]
    fn bad_inputs_and_out_of_range() {
        let dir = tempfile::tempdir().unwrap();
        let log = open4(dir.path()).with_offset_name("queue offset");
        let invalid = |r: Result<u64>| matches!(r, Err(StoreError::InvalidInput(_)));
        assert!(invalid(log.append(&[0u8; W])), "all-zero entry accepted");
        assert!(invalid(log.append(&[1u8; 3])), "short entry accepted");
        log.append(&entry(1)).unwrap();
        let err = log.get(1, &mut [0u8; W]).unwrap_err();
        assert_eq!(err.to_string(), "queue offset 1 is out of range [0, 1)");
        assert!(FixedLog::open(dir.path(), 0, 4).is_err());
    }

    #[test]
    fn truncate_is_durable_and_appends_continue_at_the_cut() {
        let dir = tempfile::tempdir().unwrap();
        let log = open4(dir.path());
        for v in 0..11 {
            log.append(&entry(v)).unwrap();
        }
        log.flush().unwrap();
        log.truncate(6).unwrap();
        assert_eq!(log.max(), 6);
        assert_eq!(log.flushed(), 6);
        assert!(oor(read(&log, 6)));
        assert_eq!(log.segment_count(), 2);
        drop(log);
        let log = open4(dir.path());
        assert_eq!(log.max(), 6);
        assert!(read(&log, 6).is_err());
        assert_eq!(log.append(&entry(100)).unwrap(), 6);
        assert_eq!(read(&log, 6).unwrap(), 100);
        // A cut on a segment boundary keeps the (now empty) segment; reopen skips it.
        log.truncate(4).unwrap();
        drop(log);
        let log = open4(dir.path());
        assert_eq!((log.min(), log.max()), (0, 4));
        assert_eq!(read(&log, 3).unwrap(), 3);
    }

    #[test]
    fn remove_segments_below_raises_min() {
        let dir = tempfile::tempdir().unwrap();
        let log = open4(dir.path());
        for v in 0..10 {
            log.append(&entry(v)).unwrap();
        }
        assert_eq!(log.remove_segments_below(7).unwrap(), 1);
        assert_eq!(log.min(), 4);
        assert!(oor(read(&log, 3)));
        assert_eq!(read(&log, 4).unwrap(), 4);
        // Never the newest segment, even when everything is below.
        assert_eq!(log.remove_segments_below(u64::MAX).unwrap(), 1);
        assert_eq!((log.min(), log.max()), (8, 10));
        log.set_min(9);
        assert_eq!(log.min(), 9);
        log.set_min(3);
        assert_eq!(log.min(), 9, "set_min never lowers");
        log.set_min(50);
        assert_eq!(log.min(), 10, "set_min is clamped to max");
        drop(log);
        let log = open4(dir.path());
        assert_eq!((log.min(), log.max()), (8, 10));
    }

    #[test]
    fn reset_restarts_mid_segment_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let log = open4(dir.path());
        for v in 0..5 {
            log.append(&entry(v)).unwrap();
        }
        log.reset(42).unwrap();
        assert_eq!((log.min(), log.max()), (42, 42));
        assert_eq!(log.segment_count(), 0);
        assert_eq!(log.append(&entry(7)).unwrap(), 42);
        assert_eq!(files_in(dir.path()), vec![segment_name(40 * W as u64)]);
        log.flush().unwrap();
        drop(log);
        let log = open4(dir.path());
        assert_eq!((log.min(), log.max()), (42, 43));
        assert_eq!(read(&log, 42).unwrap(), 7);
        assert!(read(&log, 41).is_err());
    }

    #[test]
    fn open_skips_an_empty_last_segment_and_zeroes_strays() {
        let dir = tempfile::tempdir().unwrap();
        let log = open4(dir.path());
        for v in 0..6 {
            log.append(&entry(v)).unwrap();
        }
        // Simulate a crash that lost entries 2..=3 and 5's page but kept entry 4's:
        // zero 2, 3 in segment 0 and leave a stray in segment 1.
        let segs = log.files.segments();
        segs[0].zero(2 * W as u64, 2 * W);
        segs[1].zero(W as u64, W);
        drop((segs, log));
        let log = open4(dir.path());
        assert_eq!((log.min(), log.max()), (0, 5));
        assert!(matches!(read(&log, 2), Err(StoreError::Corrupted { .. })));
        // Truncating to 4 leaves segment 1 empty: reopen looks for the end in segment
        // 0, where it stops at the lost entry 2.
        log.truncate(4).unwrap();
        drop(log);
        let log = open4(dir.path());
        assert_eq!((log.min(), log.max(), log.segment_count()), (0, 2, 2));
        // Stray entries past the end are zeroed at open.
        log.files.segments()[0].write_at(3 * W as u64, &entry(9));
        drop(log);
        let log = open4(dir.path());
        assert_eq!(log.max(), 2);
        log.append(&entry(20)).unwrap();
        drop(log);
        let log = open4(dir.path());
        assert_eq!(log.max(), 3, "the zeroed stray must not extend the log");
    }

    #[test]
    fn partition_point_finds_the_boundary() {
        let dir = tempfile::tempdir().unwrap();
        let log = open4(dir.path());
        for v in 0..9 {
            log.append(&entry(v * 10)).unwrap();
        }
        let below = |t: u64| {
            log.partition_point(log.min(), log.max(), |_, e| {
                Ok(u64::from_be_bytes(e.try_into().unwrap()) - 1 < t)
            })
            .unwrap()
        };
        assert_eq!(below(0), 0);
        assert_eq!(below(35), 4);
        assert_eq!(below(40), 4);
        assert_eq!(below(1000), 9);
        assert!(log.partition_point(0, 10, |_, _| Ok(true)).is_err());
    }

    #[test]
    fn readers_run_concurrently_with_appends() {
        let dir = tempfile::tempdir().unwrap();
        let log = FixedLog::open(dir.path(), W, 16).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                for v in 0..2000 {
                    log.append(&entry(v)).unwrap();
                }
            });
            s.spawn(|| {
                while log.max() < 2000 {
                    let max = log.max();
                    if max > 0 {
                        assert_eq!(read(&log, max - 1).unwrap(), max - 1);
                    }
                }
            });
        });
    }

    #[derive(Debug, Clone)]
    enum Op {
        Append(u8),
        Truncate(u64),
        Reopen,
        Flush,
        Reset(u64),
        RemoveBelow(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1u8..7).prop_map(Op::Append),
            2 => any::<u64>().prop_map(Op::Truncate),
            2 => Just(Op::Reopen),
            1 => Just(Op::Flush),
            1 => (0u64..40).prop_map(Op::Reset),
            1 => any::<u64>().prop_map(Op::RemoveBelow),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn matches_a_vec_model(ops in proptest::collection::vec(op(), 1..40)) {
            let dir = tempfile::tempdir().unwrap();
            let mut log = open4(dir.path());
            let (mut base, mut model, mut next) = (0u64, Vec::<u64>::new(), 0u64);
            for op in ops {
                match op {
                    Op::Append(k) => for _ in 0..k {
                        prop_assert_eq!(log.append(&entry(next)).unwrap(), base + model.len() as u64);
                        model.push(next);
                        next += 1;
                    },
                    Op::Truncate(x) => {
                        let cut = x % (model.len() as u64 + 1);
                        log.truncate(base + cut).unwrap();
                        model.truncate(cut as usize);
                    }
                    Op::Reopen => {
                        drop(log);
                        log = open4(dir.path());
                        if model.is_empty() {
                            // An empty log reopens empty at its first segment (or 0).
                            prop_assert_eq!(log.min(), log.max());
                            base = log.min();
                        }
                    }
                    Op::Flush => prop_assert_eq!(log.flush().unwrap(), base + model.len() as u64),
                    Op::Reset(n) => {
                        log.reset(n).unwrap();
                        base = n;
                        model.clear();
                    }
                    Op::RemoveBelow(x) => {
                        let n = base + x % (model.len() as u64 + 1);
                        log.remove_segments_below(n).unwrap();
                        let new_min = log.min();
                        prop_assert!(new_min >= base && new_min <= n);
                        model.drain(..(new_min - base) as usize);
                        base = new_min;
                    }
                }
                prop_assert_eq!((log.min(), log.max()), (base, base + model.len() as u64));
                for (i, &v) in model.iter().enumerate() {
                    prop_assert_eq!(read(&log, base + i as u64).unwrap(), v);
                }
                prop_assert!(oor(read(&log, base + model.len() as u64)));
            }
        }
    }
}
