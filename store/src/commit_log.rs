//! The CommitLog: one append-only log of records shared by every topic, in fixed-size
//! mmap'd segments, which is at the same time the Raft log (each record carries the
//! term and log index of its entry; see [`crate::record`] for the layout).
//!
//! Positions: `wrote_offset` is the end of what has been written (readable by this
//! process); `flushed_offset` is the end of what is durable (fsynced). They are kept
//! apart: an append only writes; [`CommitLog::flush`] makes data durable.
//!
//! A Raft entry (one or more records) never straddles two segments: when it does not
//! fit in what is left of the current segment, the rest of that segment is padded
//! with a blank record and the entry starts the next segment. Every record leaves at
//! least [`BLANK_MIN_BYTES`] free, so the padding always fits.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

mod acked;
mod flush_timing;
mod locate;
mod rewrite;
mod segment_heads;

use crate::ack_mark::AckedId;
use crate::error::{Result, StoreError};
use crate::mapped_file::MappedFileQueue;
use crate::raft_index::{EntryLocation, RaftIndex};
use crate::record::{
    encode_into, encode_properties, encoded_len, MessageRecord, Placement, RecordView,
    BLANK_MIN_BYTES, MAGIC_BLANK,
};

/// RocketMQ's default CommitLog segment size: 1 GiB.
pub const DEFAULT_SEGMENT_BYTES: u64 = 1 << 30;
/// RocketMQ's default `maxMessageSize`: 4 MiB.
pub const DEFAULT_MAX_MESSAGE_SIZE_BYTES: usize = 4 << 20;

/// CommitLog settings.
#[derive(Debug, Clone)]
pub struct CommitLogConfig {
    /// Size of each segment file in bytes (every replica of a group must use the same).
    pub segment_bytes: u64,
    /// Largest message body accepted, in bytes.
    pub max_message_size_bytes: usize,
    /// Entries per Raft index file.
    pub raft_index_entries_per_file: u64,
}

impl Default for CommitLogConfig {
    fn default() -> Self {
        Self {
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            max_message_size_bytes: DEFAULT_MAX_MESSAGE_SIZE_BYTES,
            raft_index_entries_per_file: crate::raft_index::DEFAULT_RAFT_INDEX_ENTRIES_PER_FILE,
        }
    }
}

/// One Raft entry's bytes as read back from the CommitLog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEntry {
    /// Where the entry sits.
    pub location: EntryLocation,
    /// All its records, back to back.
    pub bytes: Vec<u8>,
}

impl StoredEntry {
    /// The entry's records, each checked (CRC, term and log index).
    pub fn records(&self) -> impl Iterator<Item = Result<RecordView<'_>, String>> + '_ {
        let mut at = 0usize;
        std::iter::from_fn(move || {
            if at >= self.bytes.len() {
                return None;
            }
            let rest = &self.bytes[at..];
            if rest.len() < 4 {
                at = self.bytes.len();
                return Some(Err("entry ends inside a record header".into()));
            }
            let len = i32::from_be_bytes(rest[..4].try_into().unwrap());
            if len <= 0 || len as usize > rest.len() {
                at = self.bytes.len();
                return Some(Err(format!("record length {len} overruns the entry")));
            }
            at += len as usize;
            Some(RecordView::parse(&rest[..len as usize]).and_then(|v| {
                if v.term() == self.location.term && v.log_index() == self.location.log_index {
                    Ok(v)
                } else {
                    Err(format!(
                        "record carries ({}, {}) inside entry ({}, {})",
                        v.term(),
                        v.log_index(),
                        self.location.term,
                        self.location.log_index
                    ))
                }
            }))
        })
    }
}

struct Writer {
    last_term: u64,
    buf: Vec<u8>,
}

/// The CommitLog plus its Raft log index. One writer at a time (appends, truncation
/// and purges serialise on an internal lock); reads run concurrently.
pub struct CommitLog {
    cfg: CommitLogConfig,
    segments: MappedFileQueue,
    raft_index: RaftIndex,
    writer: Mutex<Writer>,
    /// Serialises fsyncs with truncation, so `flushed` never passes `wrote`.
    flush_lock: Mutex<()>,
    /// Set when an fsync failed: the page cache may no longer match the disk
    /// (fsyncgate), so the log refuses every later write.
    poisoned: Mutex<Option<String>>,
    /// Readers hold it shared while copying bytes; truncation holds it exclusively
    /// while it erases bytes.
    erase: RwLock<()>,
    wrote: AtomicU64,
    flushed: AtomicU64,
    min_offset: AtomicU64,
    /// How far the log was acknowledged as durable ([`crate::ack_mark`]).
    ack_mark: crate::ack_mark::AckMark,
    /// Told how long each fsync took ([`Self::set_flush_observer`]).
    flush_observer: std::sync::OnceLock<flush_timing::FlushObserver>,
}

impl CommitLog {
    /// Opens the segments under `dir/commitlog` and the index under `dir/raftindex`
    /// with every position at `end_offset` (a record boundary established by recovery
    /// or by the checkpoint of a clean shutdown). `last_term` is the term of the last
    /// entry (0 when empty).
    pub(crate) fn open_at(
        cfg: CommitLogConfig,
        dir: &Path,
        end_offset: u64,
        last_term: u64,
    ) -> Result<Self> {
        let min_record = crate::record::min_record_len() as u64 + BLANK_MIN_BYTES;
        if cfg.segment_bytes < min_record || cfg.segment_bytes > i32::MAX as u64 {
            return Err(StoreError::Config(format!(
                "CommitLog segment size {} must be in [{min_record}, {}]",
                cfg.segment_bytes,
                i32::MAX
            )));
        }
        let segments = MappedFileQueue::open(&dir.join("commitlog"), cfg.segment_bytes)?;
        let raft_index = RaftIndex::open(&dir.join("raftindex"), cfg.raft_index_entries_per_file)?;
        let min_offset = segments.first_start().unwrap_or(end_offset);
        Ok(Self {
            cfg,
            segments,
            raft_index,
            writer: Mutex::new(Writer {
                last_term,
                buf: Vec::new(),
            }),
            flush_lock: Mutex::new(()),
            poisoned: Mutex::new(None),
            flush_observer: std::sync::OnceLock::new(),
            erase: RwLock::new(()),
            wrote: AtomicU64::new(end_offset),
            flushed: AtomicU64::new(end_offset),
            min_offset: AtomicU64::new(min_offset),
            ack_mark: crate::ack_mark::AckMark::open(dir)?,
        })
    }

    /// The segment files.
    pub fn segments(&self) -> &MappedFileQueue {
        &self.segments
    }

    /// The Raft log index.
    pub fn raft_index(&self) -> &RaftIndex {
        &self.raft_index
    }

    /// The settings.
    pub fn config(&self) -> &CommitLogConfig {
        &self.cfg
    }

    /// End of written data (physical offset).
    pub fn wrote_offset(&self) -> u64 {
        self.wrote.load(Ordering::Acquire)
    }

    /// End of durable data (physical offset).
    pub fn flushed_offset(&self) -> u64 {
        self.flushed.load(Ordering::Acquire)
    }

    /// Oldest retained physical offset.
    pub fn min_offset(&self) -> u64 {
        self.min_offset.load(Ordering::Acquire)
    }

    /// First log index held.
    pub fn first_log_index(&self) -> u64 {
        self.raft_index.first_index()
    }

    /// One past the last log index held.
    pub fn next_log_index(&self) -> u64 {
        self.raft_index.next_index()
    }

    /// The last entry's location, or `None` when the log is empty.
    pub fn last_entry(&self) -> Result<Option<EntryLocation>> {
        let next = self.raft_index.next_index();
        if next == self.raft_index.first_index() {
            return Ok(None);
        }
        self.entry_location(next - 1).map(Some)
    }

    /// `(wrote offset, next log index, last term)` read together.
    pub fn tail(&self) -> (u64, u64, u64) {
        let w = self.writer.lock().unwrap();
        (
            self.wrote_offset(),
            self.raft_index.next_index(),
            w.last_term,
        )
    }

    /// Sets the written end after recovery established it. The flushed end stays
    /// where the checkpoint put it (lowered to `end_offset` if that is less): bytes
    /// recovered past it may only have been in the page cache of a killed process,
    /// so they count as durable only once [`CommitLog::flush`] has fsynced them.
    pub(crate) fn set_recovered_end(&self, end_offset: u64, last_term: u64) -> Result<()> {
        let mut w = self.writer.lock().unwrap();
        w.last_term = last_term;
        self.wrote.store(end_offset, Ordering::Release);
        self.flushed.fetch_min(end_offset, Ordering::AcqRel);
        if self.segments.first_start().is_none() {
            self.min_offset.store(end_offset, Ordering::Release);
        }
        Ok(())
    }

    /// The location of the last entry that ends at or before CommitLog `offset`, if
    /// any (a binary search over the Raft index). Errors: `Io`, `Corrupt`.
    pub fn last_entry_ending_by(&self, offset: u64) -> Result<Option<EntryLocation>> {
        let (first, next) = (self.raft_index.first_index(), self.raft_index.next_index());
        if first == next || self.entry_location(first)?.end_offset() > offset {
            return Ok(None);
        }
        let (mut lo, mut hi) = (first, next);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.entry_location(mid)?.end_offset() <= offset {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        self.entry_location(lo).map(Some)
    }

    /// Appends one Raft entry made of `records` (at least one). `log_index` must be
    /// `next_log_index()` and `term` at least the last entry's term. Writes only: the
    /// entry is durable once [`CommitLog::flush`] has covered its `end_offset`.
    ///
    /// Errors: `InvalidInput` (empty entry, field too long), `MessageTooLarge`,
    /// `EntryTooLarge`, `NonContiguousLog`, `Io`. On error nothing is published.
    pub fn append_entry(
        &self,
        term: u64,
        log_index: u64,
        records: &[MessageRecord],
    ) -> Result<EntryLocation> {
        if records.is_empty() {
            return Err(StoreError::InvalidInput(
                "a Raft entry needs at least one record".into(),
            ));
        }
        let mut w = self.writer.lock().unwrap();
        if let Some(why) = self.poisoned.lock().unwrap().as_ref() {
            return Err(StoreError::NotWritable(why.clone()));
        }
        let expected = self.raft_index.next_index();
        if log_index != expected || term < w.last_term {
            return Err(StoreError::NonContiguousLog {
                expected,
                got: log_index,
                term,
                last_term: w.last_term,
            });
        }
        let mut sized = Vec::with_capacity(records.len());
        let mut total = 0u64;
        for m in records {
            if m.body.len() > self.cfg.max_message_size_bytes {
                return Err(StoreError::MessageTooLarge {
                    size_bytes: m.body.len(),
                    max_bytes: self.cfg.max_message_size_bytes,
                });
            }
            let props = encode_properties(&m.properties);
            let len = encoded_len(m, &props).map_err(StoreError::InvalidInput)?;
            total += len as u64;
            sized.push((props, len));
        }
        let seg = self.cfg.segment_bytes;
        if total + BLANK_MIN_BYTES > seg || total > u64::from(u32::MAX) {
            return Err(StoreError::EntryTooLarge {
                size_bytes: total,
                segment_bytes: seg,
            });
        }
        let mut start = self.wrote.load(Ordering::Acquire);
        let room = seg - start % seg;
        if total + BLANK_MIN_BYTES > room {
            // Pad the rest of this segment; the entry starts the next one.
            assert!(
                room >= BLANK_MIN_BYTES,
                "a record left less than the blank minimum"
            );
            let f = self.segments.find_or_create(start)?;
            let mut blank = [0u8; 8];
            blank[..4].copy_from_slice(&(room as i32).to_be_bytes());
            blank[4..].copy_from_slice(&MAGIC_BLANK.to_be_bytes());
            f.write_at(start - f.start_offset(), &blank);
            start += room;
        }
        let buf = &mut w.buf;
        buf.clear();
        let count = records.len();
        for (i, (m, (props, len))) in records.iter().zip(&sized).enumerate() {
            let at = Placement {
                term,
                log_index,
                entry_remaining: (count - 1 - i) as u32,
                physical_offset: start + buf.len() as u64,
            };
            encode_into(buf, m, props, *len, at);
        }
        // What is written must be the size the placement was planned for: the
        // segment padding, the next entry's offset and the Raft index rely on it.
        assert_eq!(
            buf.len() as u64,
            total,
            "entry {log_index} encoded to another size than planned"
        );
        let f = self.segments.find_or_create(start)?;
        f.write_at(start - f.start_offset(), buf);
        let loc = EntryLocation {
            log_index,
            term,
            physical_offset: start,
            size_bytes: total as u32,
        };
        // The index names the entry before the written end covers it: a flush
        // (which raises the acknowledged mark to the last indexed entry it covers)
        // never covers an entry the index does not hold yet. A lookup of the entry
        // meanwhile reads its header past the written end (`commit_log/locate.rs`).
        self.raft_index.append(&loc)?;
        w.last_term = term;
        self.wrote.store(start + total, Ordering::Release);
        Ok(loc)
    }

    pub(crate) fn corrupted(&self, offset: u64, reason: String) -> StoreError {
        let seg = self.cfg.segment_bytes;
        let start = offset - offset % seg;
        StoreError::Corrupted {
            path: self
                .segments
                .dir()
                .join(crate::mapped_file::segment_name(start)),
            file_offset: offset - start,
            reason,
        }
    }

    /// Makes everything written so far durable (MS_SYNC of the unflushed range; the
    /// segment files and directory were fsynced when created). Returns the new
    /// flushed offset. Concurrent callers are fine; one fsync covers every record
    /// written before it started.
    pub fn flush(&self) -> Result<u64> {
        let _f = self.flush_lock.lock().unwrap();
        let target = self.wrote_offset();
        let from = self.flushed_offset();
        if let Some(why) = self.poisoned.lock().unwrap().as_ref() {
            return Err(StoreError::NotWritable(why.clone()));
        }
        if target > from {
            // Fully written pages are never written again: unmap them first so
            // write-back need not write-protect them page by page (see unmap_pages).
            if let Err(e) = self.segments.unmap_pages(from / 4096 * 4096, target) {
                tracing::debug!(error = %e, "unmapping written CommitLog pages failed");
            }
            // The skip-fsync canary (debug builds, tests only) reports success
            // without making anything durable.
            let started = std::time::Instant::now();
            let synced = if crate::canary::enabled(crate::canary::Canary::SkipFsync) {
                Ok(())
            } else {
                self.segments.flush_range(from, target)
            };
            self.observe_flush(started.elapsed());
            if let Err(e) = synced {
                *self.poisoned.lock().unwrap() = Some(format!("an fsync failed: {e}"));
                return Err(e);
            }
            // Before anyone is told these bytes are durable (under the flush lock,
            // so no truncation moves entries meanwhile).
            if let Some(loc) = self.last_entry_ending_by(target)? {
                self.ack_mark.raise(AckedId {
                    term: loc.term,
                    index: loc.log_index,
                })?;
            }
            self.flushed.store(target, Ordering::Release);
        }
        Ok(target.max(from))
    }

    /// Removes every entry at or after `log_index` (Raft conflict resolution). The
    /// bytes are zeroed and fsynced and later segments deleted before this returns,
    /// so nothing truncated can be read again or resurrected by a restart.
    /// Errors: `OutOfRange` when `log_index` is below the first held index.
    pub fn truncate_from(&self, log_index: u64) -> Result<()> {
        let mut w = self.writer.lock().unwrap();
        let next = self.raft_index.next_index();
        if log_index >= next {
            return Ok(());
        }
        let first = self.raft_index.first_index();
        if log_index < first {
            return Err(StoreError::OutOfRange {
                what: "log index",
                requested: log_index,
                min: first,
                max: next,
            });
        }
        let cut = self.entry_location(log_index)?.physical_offset;
        // Read before the erase lock is taken (a lookup reads the CommitLog).
        let prev_term = if log_index > first {
            self.entry_location(log_index - 1)?.term
        } else {
            0
        };
        if cut < self.min_offset() || cut > self.wrote_offset() {
            return Err(self.corrupted(
                cut,
                format!("the raft index puts log index {log_index} outside the written log"),
            ));
        }
        let _f = self.flush_lock.lock().unwrap();
        let _erase = self.erase.write().unwrap();
        let old_end = self.wrote.swap(cut, Ordering::AcqRel);
        self.raft_index.truncate(log_index)?;
        self.erase_range(cut, old_end)?;
        self.segments.remove_segments_after(cut)?;
        // Bytes written again below the old flushed end are not durable until the
        // next fsync.
        self.flushed.fetch_min(cut, Ordering::AcqRel);
        w.last_term = prev_term;
        // Truncated by Raft (never committed), not lost.
        let last = log_index.checked_sub(1).map(|index| AckedId {
            term: w.last_term,
            index,
        });
        self.ack_mark.lower(last)?;
        Ok(())
    }

    /// Zeroes and fsyncs physical `[from, to)` (only bytes in existing segments).
    pub(crate) fn erase_range(&self, from: u64, to: u64) -> Result<()> {
        let mut at = from;
        while at < to {
            let Some(f) = self.segments.find(at) else {
                break;
            };
            let end = to.min(f.end_offset());
            let (a, b) = (at - f.start_offset(), end - f.start_offset());
            f.zero(a, (b - a) as usize);
            f.flush_range(a, b)?;
            at = end;
        }
        Ok(())
    }

    /// Drops the whole log; the next entry appended must be `next_log_index` and goes
    /// at the start of a fresh segment (used after installing a snapshot).
    pub fn reset(&self, next_log_index: u64, last_term: u64) -> Result<()> {
        let max_index = u64::MAX / crate::raft_index::RAFT_INDEX_ENTRY_BYTES as u64;
        if next_log_index >= max_index {
            return Err(StoreError::InvalidInput(format!(
                "log index {next_log_index} is beyond the largest the index can hold ({max_index})"
            )));
        }
        let mut w = self.writer.lock().unwrap();
        let _f = self.flush_lock.lock().unwrap();
        let _erase = self.erase.write().unwrap();
        let fresh = self.reset_offset();
        self.segments.remove_all()?;
        self.raft_index.reset(next_log_index)?;
        self.wrote.store(fresh, Ordering::Release);
        self.flushed.store(fresh, Ordering::Release);
        // The acknowledged mark stays: a snapshot below it does not hold the
        // entries this node acknowledged past it, which it may have lost, and
        // every entry it acknowledged below it is in the snapshot.
        self.min_offset.store(fresh, Ordering::Release);
        w.last_term = last_term;
        Ok(())
    }

    /// Prepares the `ahead_bytes` after the written end for the writer: creates the
    /// next segment early when that range reaches it (under the writer lock, so it
    /// never races a truncation or reset), and faults the range's pages in. Returns
    /// the offset prepared up to. Called by the store's warm-up thread; appends then
    /// neither create files nor take page faults while holding the writer lock.
    pub fn warm_ahead(&self, from: u64, ahead_bytes: u64) -> Result<u64> {
        let wrote = self.wrote_offset();
        let from = from.max(wrote);
        let target = wrote + ahead_bytes;
        if from >= target {
            return Ok(from);
        }
        let seg = self.cfg.segment_bytes;
        let next_start = (wrote / seg + 1) * seg;
        if target > next_start && self.segments.find(next_start).is_none() {
            let _w = self.writer.lock().unwrap();
            let wrote_now = self.wrote_offset();
            if (wrote_now / seg + 1) * seg == next_start && self.segments.find(wrote_now).is_some()
            {
                self.segments.find_or_create(next_start)?;
            }
        }
        let mut at = from;
        while at < target {
            let Some(f) = self.segments.find(at) else {
                break;
            };
            let end = target.min(f.end_offset());
            if let Err(e) = f.populate(at - f.start_offset(), end - f.start_offset()) {
                tracing::debug!(error = %e, "MADV_POPULATE_WRITE unavailable; appends take page faults");
                return Ok(target);
            }
            at = end;
        }
        Ok(at)
    }

    /// Where the log starts after a [`CommitLog::reset`]: the first segment boundary at
    /// or after the written end, so offsets are never reused.
    pub fn reset_offset(&self) -> u64 {
        self.wrote_offset().div_ceil(self.cfg.segment_bytes) * self.cfg.segment_bytes
    }

    /// Deletes the oldest segments while `expired(segment start, segment end)` says so,
    /// never the segment holding the written end, and never a segment that ends after
    /// `limit_offset`. Moves the minimum offset and the index's first log index.
    /// Returns the new minimum physical offset and how many segments were deleted
    /// (counted under the writer lock, so a segment the warm-up thread creates
    /// meanwhile cannot hide a deletion).
    pub fn remove_segments(
        &self,
        limit_offset: u64,
        mut expired: impl FnMut(u64, u64) -> bool,
    ) -> Result<(u64, usize)> {
        let _w = self.writer.lock().unwrap();
        // Never delete what is not durable yet: a later flush must still find it.
        let durable = self.flushed_offset();
        let wrote = self.wrote_offset();
        let removed = self.segments.remove_oldest_while(|f| {
            f.end_offset() <= limit_offset
                && f.end_offset() <= durable
                && expired(f.start_offset(), f.end_offset())
        })?;
        if removed > 0 {
            let min = self.segments.first_start().unwrap_or(wrote);
            self.min_offset.store(min, Ordering::Release);
            if let Some(first_index) = self.first_log_index_at(min)? {
                self.raft_index.purge_below(first_index)?;
            }
        }
        Ok((self.min_offset(), removed))
    }

    /// After a restart: the Raft index may still hold entries of segments deleted by
    /// retention (the index files are deleted whole); forget them.
    pub(crate) fn forget_purged_index_entries(&self) -> Result<()> {
        if self.min_offset() >= self.wrote_offset() {
            // No record is held: the log is empty and starts at its next index.
            self.raft_index.purge_below(self.raft_index.next_index())?;
            return Ok(());
        }
        if let Some(first) = self.first_log_index_at(self.min_offset())? {
            if first > self.raft_index.first_index() {
                self.raft_index.purge_below(first)?;
            }
        }
        Ok(())
    }
}
