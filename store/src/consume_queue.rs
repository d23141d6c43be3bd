//! RocketMQ's ConsumeQueue: per (topic, queue id), the list of the queue's messages as
//! fixed 20-byte entries pointing into the CommitLog; the entry at queue offset `q`
//! sits at byte `q × 20` of the queue's logical space (a [`FixedLog`]).
//!
//! Entry layout, big-endian, as RocketMQ's `ConsumeQueue.CQ_STORE_UNIT_SIZE` (= 20):
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0  | 8 | CommitLog offset i64 of the message's record |
//! | 8  | 4 | size i32 of the record in bytes (> 0, so an entry is never all zero) |
//! | 12 | 8 | tag hash code i64 |
//!
//! Files live in `<store_root>/consumequeue/<topic>/<queue_id>/`, named by the
//! 20-digit byte offset of their first entry, [`DEFAULT_ENTRIES_PER_FILE`] entries each
//! (RocketMQ's `mappedFileSizeConsumeQueue` default of 300,000 × 20 bytes).
//!
//! Entries are ordered by CommitLog offset (strictly increasing), so lookups by
//! CommitLog offset are binary searches. The retention minimum is not stored: after
//! reopening, the owner re-applies it with
//! [`ConsumeQueue::set_min_commit_log_offset`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use crate::error::{IoContext, Result, StoreError};
use crate::fixed_log::FixedLog;
use crate::mapped_file::fsync_dir;

/// Bytes per entry: RocketMQ's `ConsumeQueue.CQ_STORE_UNIT_SIZE`.
pub const CQ_ENTRY_BYTES: usize = 20;
/// Default entries per ConsumeQueue file (RocketMQ's default, 6,000,000-byte files).
pub const DEFAULT_ENTRIES_PER_FILE: u64 = 300_000;
/// Longest topic name accepted (RocketMQ's `TopicValidator` limit).
pub const MAX_TOPIC_CHARS: usize = 127;
/// Name of the ConsumeQueue directory under the store root.
pub const CONSUME_QUEUE_DIR: &str = "consumequeue";

/// `last_commit_log_offset` when no previous entry is known.
const NO_LAST: u64 = u64::MAX;

/// Checks a topic name against RocketMQ's rule `^[%|a-zA-Z0-9_-]+$`, at most
/// [`MAX_TOPIC_CHARS`] characters, so it is safe as a directory name (no `/`, no `.`).
pub fn validate_topic(topic: &str) -> Result<()> {
    if topic.is_empty() {
        return Err(StoreError::InvalidInput("topic name is empty".into()));
    }
    if topic.len() > MAX_TOPIC_CHARS {
        return Err(StoreError::InvalidInput(format!(
            "topic name is {} characters, at most {MAX_TOPIC_CHARS} are allowed",
            topic.len()
        )));
    }
    if let Some(c) = topic
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '%' | '|' | '_' | '-')))
    {
        return Err(StoreError::InvalidInput(format!(
            "topic name {topic:?} contains {c:?}; only [%|a-zA-Z0-9_-] are allowed"
        )));
    }
    Ok(())
}

fn validate_queue_id(queue_id: i32) -> Result<()> {
    if queue_id < 0 {
        return Err(StoreError::InvalidInput(format!(
            "queue id {queue_id} is negative"
        )));
    }
    Ok(())
}

const BASE_FILE: &str = "base";

/// The base offset left by the last [`ConsumeQueue::reset`], if any.
fn read_base(dir: &Path) -> Result<Option<u64>> {
    let path = dir.join(BASE_FILE);
    match std::fs::read(&path) {
        Ok(b) => {
            let arr: [u8; 8] = b.as_slice().try_into().map_err(|_| StoreError::Corrupted {
                path: path.clone(),
                file_offset: 0,
                reason: format!("base offset file holds {} bytes, expected 8", b.len()),
            })?;
            Ok(Some(u64::from_be_bytes(arr)))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).at(&path),
    }
}

/// Durably records `base` (write temp, fsync, rename, fsync directory).
fn write_base(dir: &Path, base: u64) -> Result<()> {
    let tmp = dir.join("base.tmp");
    std::fs::write(&tmp, base.to_be_bytes()).at(&tmp)?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .at(&tmp)?;
    std::fs::rename(&tmp, dir.join(BASE_FILE)).at(&tmp)?;
    fsync_dir(dir)
}

/// One ConsumeQueue entry: where a message of the queue sits in the CommitLog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqEntry {
    /// CommitLog offset of the message's record (at most `i64::MAX`).
    pub commit_log_offset: u64,
    /// Size of the record in bytes (1 ..= `i32::MAX`).
    pub size_bytes: u32,
    /// RocketMQ's tag hash code (`tagsString2tagsCode`).
    pub tag_hash: i64,
}

impl CqEntry {
    /// Encodes the entry in RocketMQ's 20-byte layout (see the module docs).
    pub fn encode(&self) -> [u8; CQ_ENTRY_BYTES] {
        let mut b = [0u8; CQ_ENTRY_BYTES];
        b[0..8].copy_from_slice(&self.commit_log_offset.to_be_bytes());
        b[8..12].copy_from_slice(&self.size_bytes.to_be_bytes());
        b[12..20].copy_from_slice(&self.tag_hash.to_be_bytes());
        b
    }

    /// Decodes a 20-byte entry; `Err(reason)` if it has the wrong length or a field no
    /// stored entry can have (negative offset, size <= 0).
    pub fn decode(bytes: &[u8]) -> std::result::Result<Self, String> {
        let b: &[u8; CQ_ENTRY_BYTES] = bytes
            .try_into()
            .map_err(|_| format!("consume queue entry of {} bytes", bytes.len()))?;
        let e = Self {
            commit_log_offset: u64::from_be_bytes(b[0..8].try_into().expect("8 bytes")),
            size_bytes: u32::from_be_bytes(b[8..12].try_into().expect("4 bytes")),
            tag_hash: i64::from_be_bytes(b[12..20].try_into().expect("8 bytes")),
        };
        e.check()?;
        Ok(e)
    }

    fn check(&self) -> std::result::Result<(), String> {
        if self.commit_log_offset > i64::MAX as u64 {
            return Err(format!(
                "commit log offset {} does not fit an i64",
                self.commit_log_offset
            ));
        }
        if self.size_bytes == 0 || self.size_bytes > i32::MAX as u32 {
            return Err(format!(
                "record size {} is not in 1..=i32::MAX",
                self.size_bytes
            ));
        }
        Ok(())
    }
}

/// The ConsumeQueue of one (topic, queue id). Same concurrency contract as
/// [`FixedLog`]: one writer, concurrent readers.
pub struct ConsumeQueue {
    topic: String,
    queue_id: i32,
    log: FixedLog,
    /// CommitLog offset of the last entry, or [`NO_LAST`]; lets `append` check the
    /// ordering without reading the file.
    last_commit_log_offset: AtomicU64,
}

impl ConsumeQueue {
    /// Opens (creating if needed) the queue in `<consume_queue_root>/<topic>/<queue_id>/`
    /// with `entries_per_file` entries per file. `InvalidInput` for a bad topic name
    /// ([`validate_topic`]) or a negative queue id.
    pub fn open(
        consume_queue_root: &Path,
        topic: &str,
        queue_id: i32,
        entries_per_file: u64,
    ) -> Result<Self> {
        validate_topic(topic)?;
        validate_queue_id(queue_id)?;
        let topic_dir = consume_queue_root.join(topic);
        let dir = topic_dir.join(queue_id.to_string());
        let created = !dir.exists();
        let log = FixedLog::open(&dir, CQ_ENTRY_BYTES, entries_per_file)?
            .with_offset_name("queue offset");
        if created {
            // Make the new directories themselves survive a power loss.
            fsync_dir(&topic_dir)?;
            fsync_dir(consume_queue_root)?;
        }
        if let Some(base) = read_base(&dir)? {
            if log.max() < base {
                log.reset(base)?;
            }
        }
        let q = Self {
            topic: topic.to_string(),
            queue_id,
            log,
            last_commit_log_offset: AtomicU64::new(NO_LAST),
        };
        q.refresh_last();
        Ok(q)
    }

    /// Drops every entry and makes `next_offset` the next queue offset (a follower
    /// that installed a snapshot taken when the queue was that long). The base offset
    /// is written durably to `<dir>/base`, so a restart keeps it even before any entry
    /// is appended.
    pub fn reset(&self, next_offset: u64) -> Result<()> {
        write_base(self.log.dir(), next_offset)?;
        self.log.reset(next_offset)?;
        self.refresh_last();
        Ok(())
    }

    /// Re-reads the last entry's CommitLog offset after the end moved backwards.
    fn refresh_last(&self) {
        let (min, max) = (self.log.min(), self.log.max());
        let last = if max > min {
            match self.get(max - 1) {
                Ok(e) => e.commit_log_offset,
                Err(err) => {
                    tracing::warn!(topic = %self.topic, queue_id = self.queue_id, %err, "cannot read the last consume queue entry");
                    NO_LAST
                }
            }
        } else {
            NO_LAST
        };
        self.last_commit_log_offset.store(last, Ordering::Release);
    }

    /// The queue's topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The queue's id.
    pub fn queue_id(&self) -> i32 {
        self.queue_id
    }

    /// The directory holding the queue's files.
    pub fn dir(&self) -> &Path {
        self.log.dir()
    }

    /// Number of files currently held.
    pub fn file_count(&self) -> usize {
        self.log.segment_count()
    }

    /// Appends `entry` and returns its queue offset. `InvalidInput` if a field cannot be
    /// stored or its CommitLog offset is not above the previous entry's.
    pub fn append(&self, entry: &CqEntry) -> Result<u64> {
        entry.check().map_err(StoreError::InvalidInput)?;
        let last = self.last_commit_log_offset.load(Ordering::Acquire);
        if last != NO_LAST && entry.commit_log_offset <= last {
            return Err(StoreError::InvalidInput(format!(
                "consume queue {}/{}: commit log offset {} does not follow the last entry's {last}",
                self.topic, self.queue_id, entry.commit_log_offset
            )));
        }
        let q = self.log.append(&entry.encode())?;
        self.last_commit_log_offset
            .store(entry.commit_log_offset, Ordering::Release);
        Ok(q)
    }

    /// Rewrites the entry at `queue_offset` (held, else `OutOfRange`): the repair
    /// of a damaged entry from the CommitLog (`MessageStore::queue_message`).
    /// `InvalidInput` if a field cannot be stored.
    pub fn overwrite(&self, queue_offset: u64, entry: &CqEntry) -> Result<()> {
        entry.check().map_err(StoreError::InvalidInput)?;
        self.log.overwrite(queue_offset, &entry.encode())?;
        if queue_offset + 1 == self.log.max() {
            self.refresh_last();
        }
        Ok(())
    }

    /// The entry at `queue_offset`: `OutOfRange` outside `[min_offset, max_offset)`,
    /// `Corrupted` (naming file and file offset) if the stored bytes are not an entry.
    pub fn get(&self, queue_offset: u64) -> Result<CqEntry> {
        let mut b = [0u8; CQ_ENTRY_BYTES];
        self.log.get(queue_offset, &mut b)?;
        CqEntry::decode(&b).map_err(|reason| self.log.corrupted(queue_offset, reason))
    }

    /// The first readable queue offset.
    pub fn min_offset(&self) -> u64 {
        self.log.min()
    }

    /// One past the last queue offset (the offset the next append gets).
    pub fn max_offset(&self) -> u64 {
        self.log.max()
    }

    /// Queue offsets below this are durable.
    pub fn flushed_offset(&self) -> u64 {
        self.log.flushed()
    }

    /// Drops every entry at or after `queue_offset` (durably, see [`FixedLog::truncate`]).
    pub fn truncate(&self, queue_offset: u64) -> Result<()> {
        self.log.truncate(queue_offset)?;
        self.refresh_last();
        Ok(())
    }

    /// The first queue offset in `[min, max)` whose CommitLog offset is `>= phys`
    /// (`max` if none), by binary search. An entry that does not decode (or is all
    /// zero) counts as below `phys` only if the next one that decodes is (offsets
    /// rise along the queue), so damage can keep an entry too many, never drop one.
    fn lower_bound(&self, phys: u64) -> Result<u64> {
        let (mut lo, mut hi) = (self.log.min(), self.log.max());
        let mut b = [0u8; CQ_ENTRY_BYTES];
        let mut offset_at = |q: u64| -> Result<Option<u64>> {
            match self.log.get(q, &mut b) {
                Ok(()) => Ok(CqEntry::decode(&b).ok().map(|e| e.commit_log_offset)),
                Err(StoreError::Corrupted { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        };
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let mut below = false;
            for q in mid..hi {
                if let Some(o) = offset_at(q)? {
                    below = o < phys;
                    break;
                }
            }
            if below {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }

    /// Drops the entries at or past CommitLog offset `phys` (where dispatch
    /// restarts: crash recovery's dispatch position, a rebuild, a truncation),
    /// found walking back from the end to the last entry that decodes and lies
    /// below `phys` (after a crash, those written since the checkpoint: few), then
    /// [`ConsumeQueue::truncate`]. An entry damaged in the middle of the queue (it
    /// decodes to any offset) cannot cut the entries after it;
    /// `MessageStore::queue_message` reads past it by rebuilding it.
    ///
    /// Returns true if an entry it dropped may have been damaged rather than
    /// written past `phys`: it does not decode to an offset in `[phys, log_end)`
    /// (the CommitLog's written end) and is not all zero (a write lost with the
    /// page cache). Such an entry may have stood for a message below `phys`, which
    /// dispatch will not place again: the caller does
    /// (`MessageStore::replace_cut_queue_entries`, which places only what the
    /// queue lacks, so a false alarm costs a scan, never a message). Damage that
    /// decodes into `[phys, log_end)`, in the last entries below `phys`, is not seen.
    pub fn truncate_from_commit_log_offset(&self, phys: u64, log_end: u64) -> Result<bool> {
        let min = self.log.min();
        let mut q = self.log.max();
        let mut b = [0u8; CQ_ENTRY_BYTES];
        let mut damaged = false;
        while q > min {
            let entry = match self.log.get(q - 1, &mut b) {
                Ok(()) => CqEntry::decode(&b).ok(),
                // All zero: a hole.
                Err(StoreError::Corrupted { .. }) => {
                    q -= 1;
                    continue;
                }
                Err(e) => return Err(e),
            };
            match entry {
                Some(e) if e.commit_log_offset < phys => break,
                Some(e) if e.commit_log_offset < log_end => {}
                _ => damaged = true,
            }
            q -= 1;
        }
        self.truncate(q)?;
        Ok(damaged)
    }

    /// CommitLog offset of the last entry, if any.
    pub fn last_commit_log_offset(&self) -> Option<u64> {
        match self.last_commit_log_offset.load(Ordering::Acquire) {
            NO_LAST => None,
            v => Some(v),
        }
    }

    /// The queue offset of the entry whose CommitLog offset is exactly `phys`, if any.
    pub fn find_by_commit_log_offset(&self, phys: u64) -> Result<Option<u64>> {
        let q = self.lower_bound(phys)?;
        if q < self.log.max() && self.get(q)?.commit_log_offset == phys {
            Ok(Some(q))
        } else {
            Ok(None)
        }
    }

    /// Retention: the minimum offset becomes the first entry whose CommitLog offset is
    /// `>= phys` (`max_offset` if none) and files holding only entries below it are
    /// deleted (never the newest file). Returns the new minimum offset.
    pub fn set_min_commit_log_offset(&self, phys: u64) -> Result<u64> {
        let q = self.lower_bound(phys)?;
        self.log.set_min(q);
        self.log.remove_segments_below(q)?;
        Ok(self.log.min())
    }

    /// Durably writes the entries appended since the last flush; returns the durable
    /// `max_offset`.
    pub fn flush(&self) -> Result<u64> {
        self.log.flush()
    }

    /// Binary search over queue offsets `[lo, hi)` (inside `[min_offset, max_offset]`):
    /// the first offset where `pred(queue_offset, entry)` is false, `pred` being true
    /// on a prefix. For the store's search by time (it reads timestamps from the
    /// CommitLog); `pred` runs without locks held.
    pub fn partition_point(
        &self,
        lo: u64,
        hi: u64,
        mut pred: impl FnMut(u64, &CqEntry) -> Result<bool>,
    ) -> Result<u64> {
        self.log.partition_point(lo, hi, |q, bytes| {
            let e = CqEntry::decode(bytes).map_err(|reason| self.log.corrupted(q, reason))?;
            pred(q, &e)
        })
    }
}

type QueueMap = BTreeMap<String, BTreeMap<i32, Arc<ConsumeQueue>>>;

/// Every ConsumeQueue of the store, under `<store_root>/consumequeue/`.
pub struct ConsumeQueueTable {
    dir: PathBuf,
    entries_per_file: u64,
    queues: RwLock<QueueMap>,
    /// Serialises queue creation, so the map lock is only held to insert.
    create: Mutex<()>,
}

impl ConsumeQueueTable {
    /// Opens `<store_root>/consumequeue/` (creating it if needed) and every queue in
    /// it. Directories that are not a valid topic name / non-negative decimal queue id
    /// are skipped with a warning.
    pub fn open(store_root: &Path, entries_per_file: u64) -> Result<Self> {
        let dir = store_root.join(CONSUME_QUEUE_DIR);
        if !dir.exists() {
            std::fs::create_dir_all(&dir).at(&dir)?;
            fsync_dir(store_root)?;
        }
        let mut queues = QueueMap::new();
        for topic_entry in std::fs::read_dir(&dir).at(&dir)? {
            let topic_path = topic_entry.at(&dir)?.path();
            if !topic_path.is_dir() {
                continue;
            }
            let Some(topic) = topic_path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if let Err(err) = validate_topic(topic) {
                tracing::warn!(path = %topic_path.display(), %err, "skipping directory in consumequeue");
                continue;
            }
            for queue_entry in std::fs::read_dir(&topic_path).at(&topic_path)? {
                let queue_path = queue_entry.at(&topic_path)?.path();
                let name = queue_path.file_name().and_then(|n| n.to_str());
                let queue_id = name
                    .and_then(|n| n.parse::<i32>().ok())
                    .filter(|&id| id >= 0 && name == Some(id.to_string().as_str()));
                let Some(queue_id) = queue_id.filter(|_| queue_path.is_dir()) else {
                    tracing::warn!(path = %queue_path.display(), "skipping entry that is not a queue directory");
                    continue;
                };
                let q = ConsumeQueue::open(&dir, topic, queue_id, entries_per_file)?;
                queues
                    .entry(topic.to_string())
                    .or_default()
                    .insert(queue_id, Arc::new(q));
            }
        }
        Ok(Self {
            dir,
            entries_per_file,
            queues: RwLock::new(queues),
            create: Mutex::new(()),
        })
    }

    /// The `consumequeue` directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The queue of (`topic`, `queue_id`), if it exists.
    pub fn get(&self, topic: &str, queue_id: i32) -> Option<Arc<ConsumeQueue>> {
        let queues = self.queues.read().unwrap_or_else(PoisonError::into_inner);
        queues.get(topic)?.get(&queue_id).cloned()
    }

    /// The queue of (`topic`, `queue_id`), created if missing. `InvalidInput` for a bad
    /// topic name or negative queue id. Creating a queue holds the map's write lock only
    /// to insert it.
    pub fn get_or_create(&self, topic: &str, queue_id: i32) -> Result<Arc<ConsumeQueue>> {
        if let Some(q) = self.get(topic, queue_id) {
            return Ok(q);
        }
        validate_topic(topic)?;
        validate_queue_id(queue_id)?;
        let _creating = self.create.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(q) = self.get(topic, queue_id) {
            return Ok(q);
        }
        let q = Arc::new(ConsumeQueue::open(
            &self.dir,
            topic,
            queue_id,
            self.entries_per_file,
        )?);
        self.queues
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(topic.to_string())
            .or_default()
            .insert(queue_id, q.clone());
        Ok(q)
    }

    /// Every queue, ordered by topic then queue id.
    pub fn all(&self) -> Vec<((String, i32), Arc<ConsumeQueue>)> {
        let queues = self.queues.read().unwrap_or_else(PoisonError::into_inner);
        queues
            .iter()
            .flat_map(|(t, qs)| qs.iter().map(|(&id, q)| ((t.clone(), id), q.clone())))
            .collect()
    }

    /// Every topic that has at least one queue, sorted.
    pub fn topics(&self) -> Vec<String> {
        let queues = self.queues.read().unwrap_or_else(PoisonError::into_inner);
        queues.keys().cloned().collect()
    }

    /// Flushes every queue; tries them all and returns the first error.
    pub fn flush_all(&self) -> Result<()> {
        let mut first_err = None;
        for (_, q) in self.all() {
            if let Err(e) = q.flush() {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(phys: u64) -> CqEntry {
        CqEntry {
            commit_log_offset: phys,
            size_bytes: 100 + phys as u32 % 7,
            tag_hash: -(phys as i64),
        }
    }

    /// A queue with entries at CommitLog offsets 0, 100, 200, ... (`n` of them).
    fn queue(root: &Path, n: u64) -> ConsumeQueue {
        let q = ConsumeQueue::open(root, "TopicA", 3, 4).unwrap();
        for i in 0..n {
            assert_eq!(q.append(&e(i * 100)).unwrap(), i);
        }
        q
    }

    #[test]
    fn entry_layout_is_rocketmq_s() {
        let entry = CqEntry {
            commit_log_offset: 0x0102_0304_0506_0708,
            size_bytes: 0x0A0B_0C0D,
            tag_hash: -2,
        };
        let b = entry.encode();
        assert_eq!(&b[0..8], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[8..12], &[0x0A, 0x0B, 0x0C, 0x0D]);
        assert_eq!(
            &b[12..20],
            &[0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFE]
        );
        assert_eq!(CqEntry::decode(&b).unwrap(), entry);
        assert!(CqEntry::decode(&[0u8; 20]).is_err());
        assert!(CqEntry::decode(&[0u8; 19]).is_err());
    }

    #[test]
    fn entries_round_trip_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let q = queue(dir.path(), 10);
        assert_eq!(q.dir(), dir.path().join("TopicA").join("3"));
        assert_eq!(q.get(7).unwrap(), e(700));
        assert_eq!((q.min_offset(), q.max_offset()), (0, 10));
        assert!(matches!(q.get(10), Err(StoreError::OutOfRange { .. })));
        assert!(matches!(
            q.append(&e(900)),
            Err(StoreError::InvalidInput(_))
        ));
        let zero_size = CqEntry {
            size_bytes: 0,
            ..e(5000)
        };
        assert!(matches!(
            q.append(&zero_size),
            Err(StoreError::InvalidInput(_))
        ));
        assert_eq!(q.flush().unwrap(), 10);
        drop(q);
        let q = ConsumeQueue::open(dir.path(), "TopicA", 3, 4).unwrap();
        assert_eq!(q.max_offset(), 10);
        assert_eq!(q.get(9).unwrap(), e(900));
        assert!(q.append(&e(900)).is_err(), "ordering is known after reopen");
        assert_eq!(q.append(&e(1000)).unwrap(), 10);
    }

    #[test]
    fn truncate_from_commit_log_offset_cuts_at_the_first_entry_at_or_after() {
        let dir = tempfile::tempdir().unwrap();
        let q = queue(dir.path(), 10);
        q.truncate_from_commit_log_offset(650, u64::MAX).unwrap();
        assert_eq!(q.max_offset(), 7);
        q.truncate_from_commit_log_offset(500, u64::MAX).unwrap();
        assert_eq!(q.max_offset(), 5);
        q.truncate_from_commit_log_offset(10_000, u64::MAX).unwrap();
        assert_eq!(q.max_offset(), 5);
        // The ordering check follows the cut.
        assert_eq!(q.append(&e(450)).unwrap(), 5);
        drop(q);
        let q = ConsumeQueue::open(dir.path(), "TopicA", 3, 4).unwrap();
        assert_eq!(q.max_offset(), 6);
        assert_eq!(q.get(5).unwrap(), e(450));
        q.truncate_from_commit_log_offset(0, u64::MAX).unwrap();
        assert_eq!((q.min_offset(), q.max_offset()), (0, 0));
        assert_eq!(q.append(&e(3)).unwrap(), 0);
    }

    #[test]
    fn find_by_commit_log_offset_is_exact() {
        let dir = tempfile::tempdir().unwrap();
        let q = queue(dir.path(), 10);
        assert_eq!(q.find_by_commit_log_offset(0).unwrap(), Some(0));
        assert_eq!(q.find_by_commit_log_offset(600).unwrap(), Some(6));
        assert_eq!(q.find_by_commit_log_offset(900).unwrap(), Some(9));
        assert_eq!(q.find_by_commit_log_offset(601).unwrap(), None);
        assert_eq!(q.find_by_commit_log_offset(5000).unwrap(), None);
        let by_time = q
            .partition_point(2, 8, |_, e| Ok(e.commit_log_offset <= 400))
            .unwrap();
        assert_eq!(by_time, 5);
    }

    #[test]
    fn set_min_commit_log_offset_deletes_whole_files() {
        let dir = tempfile::tempdir().unwrap();
        let q = queue(dir.path(), 10);
        assert_eq!(q.file_count(), 3);
        assert_eq!(q.set_min_commit_log_offset(250).unwrap(), 3);
        assert_eq!(q.file_count(), 3, "file 0 still holds entry 3");
        assert!(matches!(q.get(2), Err(StoreError::OutOfRange { .. })));
        assert_eq!(q.set_min_commit_log_offset(450).unwrap(), 5);
        assert_eq!(q.file_count(), 2);
        assert!(!q.dir().join(crate::mapped_file::segment_name(0)).exists());
        assert_eq!(q.get(5).unwrap(), e(500));
        assert_eq!(q.set_min_commit_log_offset(u64::MAX).unwrap(), 10);
        assert_eq!(q.file_count(), 1, "the newest file stays");
        assert_eq!(q.append(&e(1000)).unwrap(), 10);
        assert_eq!(q.get(10).unwrap(), e(1000));
    }

    #[test]
    fn table_creates_and_reopens_all_queues() {
        let dir = tempfile::tempdir().unwrap();
        let t = ConsumeQueueTable::open(dir.path(), 4).unwrap();
        assert!(t.get("T1", 0).is_none());
        let a = t.get_or_create("T1", 0).unwrap();
        assert!(Arc::ptr_eq(&a, &t.get_or_create("T1", 0).unwrap()));
        a.append(&e(10)).unwrap();
        t.get_or_create("T1", 2).unwrap().append(&e(20)).unwrap();
        t.get_or_create("%RETRY%g|x-y_z", 1).unwrap();
        t.flush_all().unwrap();
        // Junk in the directory is skipped.
        std::fs::create_dir_all(t.dir().join("bad.name").join("0")).unwrap();
        std::fs::create_dir_all(t.dir().join("T1").join("07")).unwrap();
        std::fs::write(t.dir().join("T1").join("x"), b"").unwrap();
        drop(t);
        let t = ConsumeQueueTable::open(dir.path(), 4).unwrap();
        let keys: Vec<_> = t.all().into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            vec![
                ("%RETRY%g|x-y_z".to_string(), 1),
                ("T1".to_string(), 0),
                ("T1".to_string(), 2)
            ]
        );
        assert_eq!(t.topics(), vec!["%RETRY%g|x-y_z", "T1"]);
        assert_eq!(t.get("T1", 2).unwrap().get(0).unwrap(), e(20));
        assert_eq!(t.get("T1", 0).unwrap().max_offset(), 1);
    }

    #[test]
    fn bad_topics_and_queue_ids_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let t = ConsumeQueueTable::open(dir.path(), 4).unwrap();
        let long = "a".repeat(128);
        for bad in ["../x", "", long.as_str(), "a/b", "..", "a b", "é"] {
            assert!(
                matches!(t.get_or_create(bad, 0), Err(StoreError::InvalidInput(_))),
                "{bad:?} accepted"
            );
        }
        assert!(t.get_or_create(&"a".repeat(127), 0).is_ok());
        assert!(matches!(
            t.get_or_create("ok", -1),
            Err(StoreError::InvalidInput(_))
        ));
        assert!(!dir.path().join("x").exists());
        assert_eq!(t.topics(), vec!["a".repeat(127)]);
    }
}
