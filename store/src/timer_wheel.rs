//! Pending timers on disk, with a heap that does not grow with them: a timer log
//! of fixed-size entries, one per queue offset of the timer topic's queue 0, in
//! memory-mapped segment files, and a wheel of one-second slots, each the head
//! and tail of a chain of entries linked through the log (RocketMQ 5's
//! `TimerLog` and `TimerWheel`, `store/timer/`). What the heap holds is one slot
//! per second that has a pending timer (at most `max_delay_ms` / 1,000 of them
//! plus those overdue) and one record per segment file, whatever the number of
//! timers; the entries are page cache, as the CommitLog is.
//!
//! Entry (32 bytes, big-endian, at `(queue offset - segment start) * 32` of the
//! segment file named by its first queue offset, 20 digits):
//! `deliver_ms: i64, physical_offset: u64, size_bytes: u32, state: u32, next: u64`.
//! `state` is [`PENDING`], [`DELIVERED`] or anything else for no timer (a zeroed
//! entry); `next` is the queue offset of the next entry of the same slot's chain,
//! `u64::MAX` at its end.
//!
//! The chains are rebuilt when the wheel opens (a scan of every entry, writing
//! only `next` fields that differ), so a crash cannot leave them broken: only
//! the entries themselves need to be durable, and [`TimerWheel::flush`] makes
//! them so before the store's checkpoint moves past what they reflect. Entries
//! at or past the end the opener gives (the timer queue's end after recovery)
//! are wiped at open: dispatch writes them again.
//!
//! A delivered entry stays delivered: inserting it again (dispatch repeated
//! after a crash) changes nothing, since a delivered timer's copy is committed
//! and is dispatched again too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{IoContext, Result, StoreError};
use crate::mapped_file::{fsync_dir, list_segment_starts, segment_name, MappedFile};
use crate::timer_index::PendingTimer;

/// Bytes per timer log entry.
pub const ENTRY_BYTES: u64 = 32;
/// Entries per segment file (32 MiB files).
pub const ENTRIES_PER_FILE: u64 = 1 << 20;
/// `state` of a pending timer ("TPND").
pub const PENDING: u32 = 0x5450_4e44;
/// `state` of a delivered timer ("TDLV").
pub const DELIVERED: u32 = 0x5444_4c56;
/// `next` at the end of a chain.
const END: u64 = u64::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Entry {
    deliver_ms: i64,
    physical_offset: u64,
    size_bytes: u32,
    state: u32,
    next: u64,
}

impl Entry {
    fn decode(b: &[u8]) -> Self {
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap());
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
        Self {
            deliver_ms: u64_at(0) as i64,
            physical_offset: u64_at(8),
            size_bytes: u32_at(16),
            state: u32_at(20),
            next: u64_at(24),
        }
    }

    fn encode(&self) -> [u8; ENTRY_BYTES as usize] {
        let mut b = [0u8; ENTRY_BYTES as usize];
        b[0..8].copy_from_slice(&self.deliver_ms.to_be_bytes());
        b[8..16].copy_from_slice(&self.physical_offset.to_be_bytes());
        b[16..20].copy_from_slice(&self.size_bytes.to_be_bytes());
        b[20..24].copy_from_slice(&self.state.to_be_bytes());
        b[24..32].copy_from_slice(&self.next.to_be_bytes());
        b
    }
}

/// The delivery second a slot stands for.
fn second_of(deliver_ms: i64) -> i64 {
    deliver_ms.div_euclid(1000)
}

struct Segment {
    /// Shared with a flush that msyncs it without the wheel's lock.
    file: Arc<MappedFile>,
    /// Pending entries in it.
    live: u64,
    /// No entry below this queue offset is pending (a hint that
    /// [`TimerWheel::oldest_physical_offset`] moves up and an insert moves down).
    first_pending: u64,
    /// Written since the last flush.
    dirty: bool,
}

impl Segment {
    /// A file starting at queue offset `start`, before its entries are counted.
    fn new(file: MappedFile, start: u64) -> Self {
        Self {
            file: Arc::new(file),
            live: 0,
            first_pending: start,
            dirty: false,
        }
    }

    /// Unmaps and deletes the file (the caller fsyncs the directory).
    fn delete(self) -> Result<()> {
        let path = self.file.path().to_owned();
        drop(self);
        std::fs::remove_file(&path).at(&path)
    }
}

/// One second of the wheel: its chain's first entry that may still be pending,
/// its last entry, and how many of its entries are pending (never 0: a slot
/// whose last pending timer is delivered goes).
#[derive(Debug, Clone, Copy)]
struct Slot {
    head: u64,
    tail: u64,
    live: u64,
}

/// The segment files and their entries, by queue offset.
struct Log {
    dir: PathBuf,
    entries_per_file: u64,
    segments: BTreeMap<u64, Segment>,
}

impl Log {
    fn start_of(&self, q: u64) -> u64 {
        q - q % self.entries_per_file
    }

    fn pos(&self, q: u64) -> u64 {
        (q % self.entries_per_file) * ENTRY_BYTES
    }

    /// The entry at `q`, None if no segment holds it.
    fn get(&self, q: u64) -> Option<Entry> {
        let seg = self.segments.get(&self.start_of(q))?;
        Some(Entry::decode(
            seg.file.slice(self.pos(q), ENTRY_BYTES as usize),
        ))
    }

    /// The entry at `q` that a chain names: `Corrupted` if no segment holds it.
    fn linked(&self, q: u64) -> Result<Entry> {
        self.get(q).ok_or_else(|| StoreError::Corrupted {
            path: self.dir.join(segment_name(self.start_of(q))),
            file_offset: self.pos(q),
            reason: format!("a timer wheel chain names queue offset {q}, in no segment"),
        })
    }

    fn put(&mut self, q: u64, e: &Entry) {
        let (start, pos) = (self.start_of(q), self.pos(q));
        let seg = self
            .segments
            .get_mut(&start)
            .expect("the segment was looked up");
        seg.file.write_at(pos, &e.encode());
        seg.dirty = true;
    }

    /// Sets `next` of the entry at `q` (in a segment) unless it already is.
    fn set_next(&mut self, q: u64, next: u64) {
        let mut e = self.get(q).expect("a linked entry is in a segment");
        if e.next != next {
            e.next = next;
            self.put(q, &e);
        }
    }

    /// The segment holding `q`, made if missing.
    fn segment_for(&mut self, q: u64) -> Result<&mut Segment> {
        let start = self.start_of(q);
        if !self.segments.contains_key(&start) {
            let file = MappedFile::create(&self.dir, start, self.entries_per_file * ENTRY_BYTES)?;
            self.segments.insert(start, Segment::new(file, start));
        }
        Ok(self.segments.get_mut(&start).expect("just made"))
    }
}

/// The pending timers by delivery second (see the module documentation). Not
/// synchronized: [`crate::timer_index::TimerIndex`] holds it under a lock.
pub struct TimerWheel {
    log: Log,
    slots: BTreeMap<i64, Slot>,
    pending: usize,
    /// One past the highest queue offset with an entry.
    end: u64,
    /// Every timer below this queue offset is delivered (their files were
    /// deleted, or there never were any): inserting one again, as dispatch does
    /// when it repeats entries, changes nothing.
    floor: u64,
}

impl TimerWheel {
    /// Opens (or creates) the wheel in `dir` with `entries_per_file` entries per
    /// segment ([`ENTRIES_PER_FILE`] in the store), wipes every entry at or past
    /// `end` (the timer queue's end), and links the pending ones into their
    /// slots. Reads every entry: O(timers). Errors: `Io`; `Corrupted` for a
    /// segment file whose name is not a multiple of `entries_per_file` or whose
    /// size is not `entries_per_file` entries.
    pub fn open(dir: &Path, entries_per_file: u64, end: u64) -> Result<Self> {
        assert!(entries_per_file > 0);
        let fresh = !dir.exists();
        let starts = list_segment_starts(dir)?;
        if fresh {
            if let Some(parent) = dir.parent() {
                fsync_dir(parent)?;
            }
        }
        let mut log = Log {
            dir: dir.to_owned(),
            entries_per_file,
            segments: BTreeMap::new(),
        };
        let mut removed = false;
        for start in starts {
            let path = dir.join(segment_name(start));
            if start % entries_per_file != 0 {
                return Err(StoreError::Corrupted {
                    path,
                    file_offset: 0,
                    reason: format!("not a multiple of {entries_per_file} entries"),
                });
            }
            if start >= end {
                std::fs::remove_file(&path).at(&path)?;
                removed = true;
                continue;
            }
            let file = MappedFile::open(&path, start, entries_per_file * ENTRY_BYTES)?;
            log.segments.insert(start, Segment::new(file, start));
        }
        if removed {
            fsync_dir(dir)?;
        }
        let floor = log.segments.keys().next().copied().unwrap_or(0);
        let mut wheel = Self {
            log,
            slots: BTreeMap::new(),
            pending: 0,
            end: 0,
            floor,
        };
        let mut wiped = 0u64;
        let starts: Vec<u64> = wheel.log.segments.keys().copied().collect();
        for start in starts {
            for q in start..start + entries_per_file {
                let Some(e) = wheel.log.get(q) else { break };
                if q >= end {
                    wiped += u64::from(e.state == PENDING);
                    if e != Entry::default() {
                        wheel.log.put(q, &Entry::default());
                    }
                    continue;
                }
                if e.state == PENDING || e.state == DELIVERED {
                    wheel.end = q + 1;
                }
                if e.state == PENDING {
                    wheel.link(q, second_of(e.deliver_ms), false);
                }
            }
        }
        if wiped > 0 {
            tracing::warn!(
                wiped,
                end,
                "pending timers at or past the timer queue's end were wiped: dispatch indexes them again"
            );
        }
        // Chain ends, written last so that an unchanged chain dirties nothing.
        let tails: Vec<u64> = wheel.slots.values().map(|s| s.tail).collect();
        for tail in tails {
            wheel.log.set_next(tail, END);
        }
        Ok(wheel)
    }

    /// Links pending entry `q` into the chain of `second`, in queue offset
    /// order, and counts it. Appending is the rule (dispatch indexes timers in
    /// queue offset order); an entry below the tail (dispatch repeated after a
    /// restart) is spliced in after a walk from the head. With `end_chain`, an
    /// appended `q`'s own `next` is set to the chain's end (at open the tails
    /// are ended after the scan instead).
    fn link(&mut self, q: u64, second: i64, end_chain: bool) {
        let mut appended = true;
        match self.slots.get_mut(&second) {
            Some(slot) if q > slot.tail => {
                let tail = slot.tail;
                slot.tail = q;
                slot.live += 1;
                self.log.set_next(tail, q);
            }
            Some(slot) => {
                appended = false;
                slot.live += 1;
                if q < slot.head {
                    let head = slot.head;
                    slot.head = q;
                    self.log.set_next(q, head);
                } else {
                    let mut prev = slot.head;
                    loop {
                        let next = self.log.get(prev).expect("a linked entry").next;
                        if next == END || next > q {
                            self.log.set_next(q, next);
                            self.log.set_next(prev, q);
                            break;
                        }
                        prev = next;
                    }
                }
            }
            None => {
                self.slots.insert(
                    second,
                    Slot {
                        head: q,
                        tail: q,
                        live: 1,
                    },
                );
            }
        }
        if end_chain && appended {
            self.log.set_next(q, END);
        }
        let start = self.log.start_of(q);
        let seg = self.log.segments.get_mut(&start).expect("in a segment");
        seg.live += 1;
        seg.first_pending = seg.first_pending.min(q);
        self.pending += 1;
    }

    /// Adds a pending timer. Inserting one already pending or delivered changes
    /// nothing. Errors: `Io` (a new segment file cannot be made).
    pub fn insert(&mut self, t: PendingTimer) -> Result<()> {
        let q = t.timer_queue_offset;
        if q < self.floor {
            return Ok(());
        }
        self.log.segment_for(q)?;
        let e = self.log.get(q).expect("the segment was just made");
        match e.state {
            PENDING if e.deliver_ms != t.deliver_ms => {
                tracing::warn!(
                    timer_queue_offset = q,
                    held_ms = e.deliver_ms,
                    inserted_ms = t.deliver_ms,
                    "a timer inserted again with another delivery time: the first stays"
                );
                return Ok(());
            }
            PENDING | DELIVERED => return Ok(()),
            _ => {}
        }
        self.log.put(
            q,
            &Entry {
                deliver_ms: t.deliver_ms,
                physical_offset: t.physical_offset,
                size_bytes: t.size_bytes,
                state: PENDING,
                next: END,
            },
        );
        self.link(q, second_of(t.deliver_ms), true);
        self.end = self.end.max(q + 1);
        Ok(())
    }

    /// Marks a timer delivered; true if it was pending with that delivery time.
    pub fn remove(&mut self, deliver_ms: i64, q: u64) -> bool {
        let Some(mut e) = self.log.get(q) else {
            return false;
        };
        if e.state != PENDING || e.deliver_ms != deliver_ms {
            return false;
        }
        e.state = DELIVERED;
        self.log.put(q, &e);
        let start = self.log.start_of(q);
        self.log
            .segments
            .get_mut(&start)
            .expect("in a segment")
            .live -= 1;
        self.pending -= 1;
        let second = second_of(deliver_ms);
        match self.slots.get_mut(&second) {
            Some(slot) if slot.live > 1 => slot.live -= 1,
            Some(_) => {
                self.slots.remove(&second);
            }
            None => tracing::error!(
                timer_queue_offset = q,
                deliver_ms,
                "a pending timer had no slot in the wheel"
            ),
        }
        true
    }

    /// Up to `limit` pending timers due at or before `now_ms`: by delivery
    /// second, earliest first, and within a second in the order they were
    /// indexed (queue offset order, unless dispatch was repeated). Advances each
    /// slot's head past the delivered entries it starts with. Error: `Corrupted`
    /// (a chain leads outside the segments).
    pub fn due(&mut self, now_ms: i64, limit: usize) -> Result<Vec<PendingTimer>> {
        let mut out = Vec::new();
        let log = &self.log;
        for (&second, slot) in self.slots.range_mut(..=second_of(now_ms)) {
            if out.len() >= limit {
                break;
            }
            let mut q = slot.head;
            let mut at_head = true;
            while q != END && out.len() < limit {
                let e = log.linked(q)?;
                if e.state == PENDING && second_of(e.deliver_ms) == second {
                    at_head = false;
                    if e.deliver_ms <= now_ms {
                        out.push(PendingTimer {
                            deliver_ms: e.deliver_ms,
                            timer_queue_offset: q,
                            physical_offset: e.physical_offset,
                            size_bytes: e.size_bytes,
                        });
                    }
                } else if at_head && e.next != END {
                    slot.head = e.next;
                }
                q = e.next;
            }
        }
        Ok(out)
    }

    /// The earliest pending delivery time, if any (walks the earliest slot).
    /// Error: `Corrupted`, as [`TimerWheel::due`].
    pub fn next_deliver_ms(&self) -> Result<Option<i64>> {
        let Some((&second, slot)) = self.slots.iter().next() else {
            return Ok(None);
        };
        let mut earliest: Option<i64> = None;
        let mut q = slot.head;
        while q != END {
            let e = self.log.linked(q)?;
            if e.state == PENDING && second_of(e.deliver_ms) == second {
                earliest = Some(earliest.map_or(e.deliver_ms, |m| m.min(e.deliver_ms)));
            }
            q = e.next;
        }
        Ok(earliest)
    }

    /// The CommitLog offset of the first pending timer whose record is at or
    /// above `from`, if any: timer records are in queue offset order in the
    /// CommitLog, so it is the lowest. Reads the files holding pending timers
    /// from the oldest, each from its first pending entry as last seen, until
    /// one is found.
    pub fn oldest_physical_offset(&mut self, from: u64) -> Option<u64> {
        let epf = self.log.entries_per_file;
        let files: Vec<(u64, u64)> = self
            .log
            .segments
            .iter()
            .filter(|(_, seg)| seg.live > 0)
            .map(|(&start, seg)| (start, seg.first_pending.max(start)))
            .collect();
        let mut found = None;
        let mut hints = Vec::new();
        'files: for (start, hint) in files {
            let mut first = None;
            for q in hint..start + epf {
                let e = self.log.get(q).expect("in this segment");
                if e.state == PENDING {
                    first.get_or_insert(q);
                    if e.physical_offset >= from {
                        found = Some(e.physical_offset);
                        hints.push((start, first.unwrap_or(q)));
                        break 'files;
                    }
                }
            }
            if let Some(q) = first {
                hints.push((start, q));
            }
        }
        for (start, q) in hints {
            if let Some(seg) = self.log.segments.get_mut(&start) {
                seg.first_pending = q;
            }
        }
        found
    }

    /// Pending timers.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Makes every entry written so far durable (msync), then deletes the
    /// files no walk reaches ([`TimerWheel::drop_done_files`]).
    pub fn flush(&mut self) -> Result<()> {
        let dirty = self.take_dirty();
        if let Err(e) = sync_files(&dirty) {
            self.mark_dirty();
            return Err(e);
        }
        self.drop_done_files()
    }

    /// The files written since the last call, for [`sync_files`] (which may
    /// run without the wheel's lock: writes meanwhile mark them dirty again).
    pub fn take_dirty(&mut self) -> Vec<Arc<MappedFile>> {
        self.log
            .segments
            .values_mut()
            .filter_map(|seg| std::mem::take(&mut seg.dirty).then(|| seg.file.clone()))
            .collect()
    }

    /// Marks every file dirty again (a sync of the taken ones failed).
    pub fn mark_dirty(&mut self) {
        for seg in self.log.segments.values_mut() {
            seg.dirty = true;
        }
    }

    /// Deletes the files before the first one that holds a pending timer, is
    /// not all written yet, or is the last one (whose start stays the floor
    /// for a later open).
    pub fn drop_done_files(&mut self) -> Result<()> {
        // Chains run in queue offset order, so once every head is a pending
        // entry no walk reaches a file before the first one holding a pending
        // timer.
        self.advance_heads()?;
        let epf = self.log.entries_per_file;
        let last = self.log.segments.keys().next_back().copied();
        let done: Vec<u64> = self
            .log
            .segments
            .iter()
            .take_while(|(&start, seg)| {
                seg.live == 0 && start + epf <= self.end && Some(start) != last
            })
            .map(|(&start, _)| start)
            .collect();
        for start in &done {
            self.log.segments.remove(start).expect("listed").delete()?;
        }
        if let Some(&first) = self.log.segments.keys().next() {
            self.floor = self.floor.max(first);
        }
        if !done.is_empty() {
            fsync_dir(&self.log.dir)?;
        }
        Ok(())
    }

    /// Moves every slot's head to its first pending entry. Error: `Corrupted`,
    /// as [`TimerWheel::due`].
    fn advance_heads(&mut self) -> Result<()> {
        for slot in self.slots.values_mut() {
            loop {
                let e = self.log.linked(slot.head)?;
                if e.state == PENDING || e.next == END {
                    break;
                }
                slot.head = e.next;
            }
        }
        Ok(())
    }

    /// Forgets every timer and deletes every segment file, durably.
    pub fn clear(&mut self) -> Result<()> {
        let segments = std::mem::take(&mut self.log.segments);
        for (_, seg) in segments {
            seg.delete()?;
        }
        fsync_dir(&self.log.dir)?;
        self.slots.clear();
        self.pending = 0;
        self.end = 0;
        self.floor = 0;
        Ok(())
    }

    /// Segment files held (for tests and status).
    pub fn segment_files(&self) -> usize {
        self.log.segments.len()
    }
}

/// msyncs whole files (their clean pages cost nothing).
pub fn sync_files(files: &[Arc<MappedFile>]) -> Result<()> {
    for f in files {
        f.flush_range(0, f.size_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
