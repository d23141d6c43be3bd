//! The timer index: pending delay/timer messages ordered by delivery time, on
//! disk (a sled tree under `<root>/timers`, whose page cache is bounded to 16
//! MB). sled's memory still grows with the rows it holds, about 35 MiB per
//! million (`examples/timer_index_heap.rs`, `docs/benchmarks.md`): files of
//! fixed-size entries are to replace it.
//!
//! A delay message is stored in the CommitLog under the internal topic
//! [`TIMER_TOPIC`] (RocketMQ 5's `rmq_sys_wheel_timer`), queue 0, with its real
//! topic and queue in [`PROPERTY_REAL_TOPIC`] / [`PROPERTY_REAL_QID`] and its
//! delivery time in [`PROPERTY_TIMER_DELIVER_MS`] (the properties RocketMQ 5
//! stores, `MessageConst`). Dispatch places it in the timer topic's ConsumeQueue,
//! like any message, and adds it here keyed by (delivery ms, its queue offset in
//! that ConsumeQueue): both are the same on every replica, since dispatch is
//! deterministic. When its time comes the leader writes a copy to the real topic
//! carrying [`PROPERTY_TIMER_QUEUE_OFFSET`]; dispatching the copy removes the
//! timer here. So the index is a function of the committed log: rebuilt by
//! dispatching it again after a crash (inserts and removals repeat harmlessly, in
//! log order), and flushed before a checkpoint moves the dispatch position past
//! what it holds.

use std::path::{Path, PathBuf};
use std::sync::RwLock;

use crate::error::{Result, StoreError};

/// The internal topic delay messages are stored under until their time
/// (RocketMQ 5's `TimerMessageStore.TIMER_TOPIC`).
pub const TIMER_TOPIC: &str = "rmq_sys_wheel_timer";
/// A delay message's real topic (RocketMQ's `MessageConst.PROPERTY_REAL_TOPIC`).
pub const PROPERTY_REAL_TOPIC: &str = "REAL_TOPIC";
/// A delay message's real queue id (RocketMQ's `PROPERTY_REAL_QUEUE_ID`).
pub const PROPERTY_REAL_QID: &str = "REAL_QID";
/// A delay message's delivery time, ms since the Unix epoch, decimal
/// (RocketMQ's `PROPERTY_TIMER_DELIVER_MS`). Kept on the delivered copy.
pub const PROPERTY_TIMER_DELIVER_MS: &str = "TIMER_DELIVER_MS";
/// On a delivered copy: the queue offset of the timer it delivers, in
/// [`TIMER_TOPIC`]'s queue 0 (LedgerMQ's own property).
pub const PROPERTY_TIMER_QUEUE_OFFSET: &str = "TIMER_QUEUE_OFFSET";

/// The page cache sled may keep for the index, bytes.
const CACHE_BYTES: u64 = 16 << 20;

/// A pending timer, as the index holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingTimer {
    /// When it is due, ms since the Unix epoch.
    pub deliver_ms: i64,
    /// Its queue offset in [`TIMER_TOPIC`]'s queue 0 (the same on every replica).
    pub timer_queue_offset: u64,
    /// Where its record is in this node's CommitLog.
    pub physical_offset: u64,
    /// Its record's size, bytes.
    pub size_bytes: u32,
}

/// Pending timers by (delivery ms, timer queue offset). Shared by reference.
pub struct TimerIndex {
    dir: PathBuf,
    /// None once closed ([`TimerIndex::close`]): sled holds a lock on its files
    /// while open, which a store opened again in the same process must get.
    db: RwLock<Option<sled::Db>>,
}

fn key(deliver_ms: i64, timer_queue_offset: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    // Order-preserving for negative times too (none is stored; a bad property is
    // not indexed).
    k[..8].copy_from_slice(&((deliver_ms as u64) ^ (1 << 63)).to_be_bytes());
    k[8..].copy_from_slice(&timer_queue_offset.to_be_bytes());
    k
}

fn decode(k: &[u8], v: &[u8]) -> Option<PendingTimer> {
    let (k, v): (&[u8; 16], &[u8; 12]) = (k.try_into().ok()?, v.try_into().ok()?);
    Some(PendingTimer {
        deliver_ms: (u64::from_be_bytes(k[..8].try_into().ok()?) ^ (1 << 63)) as i64,
        timer_queue_offset: u64::from_be_bytes(k[8..].try_into().ok()?),
        physical_offset: u64::from_be_bytes(v[..8].try_into().ok()?),
        size_bytes: u32::from_be_bytes(v[8..].try_into().ok()?),
    })
}

impl TimerIndex {
    /// Opens (or creates) the index in `dir`. Errors: `Io` (sled's failures,
    /// reported on `dir`).
    pub fn open(dir: &Path) -> Result<Self> {
        wait_for_lock(dir)?;
        // No periodic background flush (it stalls every insert while it runs, so
        // every apply): the store flushes it with each checkpoint, and what came
        // after is rebuilt by dispatching again.
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(CACHE_BYTES)
            .flush_every_ms(None)
            .open()
            .map_err(|e| sled_error(dir, e))?;
        // The files and directories sled just made survive a power loss.
        std::fs::File::open(dir.join("conf"))
            .and_then(|f| f.sync_all())
            .map_err(|source| StoreError::Io {
                path: dir.join("conf"),
                source,
            })?;
        crate::mapped_file::fsync_dir(&dir.join("blobs"))?;
        crate::mapped_file::fsync_dir(dir)?;
        if let Some(parent) = dir.parent() {
            crate::mapped_file::fsync_dir(parent)?;
        }
        Ok(Self {
            dir: dir.to_owned(),
            db: RwLock::new(Some(db)),
        })
    }

    /// The open database (a cheap handle). Error: `NotWritable` once closed.
    fn db(&self) -> Result<sled::Db> {
        self.db
            .read()
            .unwrap()
            .clone()
            .ok_or_else(|| StoreError::NotWritable("the timer index is closed".into()))
    }

    /// The half index of transactional messages, kept in two more trees of
    /// this database ([`crate::half_index`]).
    pub fn halves(&self) -> crate::half_index::HalfIndex<'_> {
        crate::half_index::HalfIndex { db: self }
    }

    /// The directory of the database.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The database's tree `name` (a cheap handle). Error: `NotWritable` once
    /// closed.
    pub(crate) fn tree(&self, name: &str) -> Result<sled::Tree> {
        self.db()?.open_tree(name).map_err(|e| self.err(e))
    }

    /// A sled failure on this database as the store's error.
    pub(crate) fn err(&self, e: sled::Error) -> StoreError {
        sled_error(&self.dir, e)
    }

    /// Flushes and closes the index (a clean shutdown); later calls fail with
    /// `NotWritable`. Its files are unlocked once every call under way returns.
    pub fn close(&self) -> Result<()> {
        let db = self.db.write().unwrap().take();
        match db {
            Some(db) => db.flush().map(|_| ()).map_err(|e| sled_error(&self.dir, e)),
            None => Ok(()),
        }
    }

    /// Adds a timer (again: the same key and place are written as before).
    pub fn insert(&self, t: PendingTimer) -> Result<()> {
        let mut v = [0u8; 12];
        v[..8].copy_from_slice(&t.physical_offset.to_be_bytes());
        v[8..].copy_from_slice(&t.size_bytes.to_be_bytes());
        self.db()?
            .insert(key(t.deliver_ms, t.timer_queue_offset), &v[..])
            .map(|_| ())
            .map_err(|e| sled_error(&self.dir, e))
    }

    /// Removes a delivered timer; true if it was pending.
    pub fn remove(&self, deliver_ms: i64, timer_queue_offset: u64) -> Result<bool> {
        self.db()?
            .remove(key(deliver_ms, timer_queue_offset))
            .map(|old| old.is_some())
            .map_err(|e| sled_error(&self.dir, e))
    }

    /// Up to `limit` pending timers due at or before `now_ms`, earliest first
    /// (ties by timer queue offset, i.e. in the order they were sent).
    pub fn due(&self, now_ms: i64, limit: usize) -> Result<Vec<PendingTimer>> {
        let end = key(now_ms, u64::MAX);
        let mut out = Vec::new();
        for kv in self.db()?.range(..=end).take(limit) {
            let (k, v) = kv.map_err(|e| sled_error(&self.dir, e))?;
            match decode(&k, &v) {
                Some(t) => out.push(t),
                None => {
                    return Err(StoreError::Corrupted {
                        path: self.dir.clone(),
                        file_offset: 0,
                        reason: format!("a timer index row of {} + {} bytes", k.len(), v.len()),
                    })
                }
            }
        }
        Ok(out)
    }

    /// The earliest pending timer's delivery time, if any.
    pub fn next_deliver_ms(&self) -> Result<Option<i64>> {
        match self.db()?.first().map_err(|e| sled_error(&self.dir, e))? {
            Some((k, v)) => Ok(decode(&k, &v).map(|t| t.deliver_ms)),
            None => Ok(None),
        }
    }

    /// The lowest CommitLog offset at or above `from` (the log's first offset)
    /// that a pending timer's record is at, if any: retention, expired or forced,
    /// keeps those records. A row below `from` points at a record already gone
    /// and bounds nothing. Reads every row: O(n), so retention asks only when
    /// something is due.
    pub fn oldest_physical_offset(&self, from: u64) -> Result<Option<u64>> {
        let mut oldest: Option<u64> = None;
        for kv in self.db()?.iter() {
            let (k, v) = kv.map_err(|e| sled_error(&self.dir, e))?;
            if let Some(t) = decode(&k, &v).filter(|t| t.physical_offset >= from) {
                oldest = Some(oldest.map_or(t.physical_offset, |o| o.min(t.physical_offset)));
            }
        }
        Ok(oldest)
    }

    /// Pending timers (counts every row: O(n), for tests and status).
    pub fn pending(&self) -> usize {
        self.db().map_or(0, |db| db.len())
    }

    /// Makes every change so far durable (fsync).
    pub fn flush(&self) -> Result<()> {
        self.db()?
            .flush()
            .map(|_| ())
            .map_err(|e| sled_error(&self.dir, e))
    }

    /// Forgets every timer and half message (the log was reset for a snapshot:
    /// the records they point at are gone from this node), durably.
    pub fn clear(&self) -> Result<()> {
        self.db()?.clear().map_err(|e| sled_error(&self.dir, e))?;
        self.halves().clear()?;
        self.flush()
    }
}

/// Waits up to 10 s while another handle in this process still holds sled's
/// exclusive lock on `<dir>/db` (a store of the same node dropped a moment ago,
/// whose sled threads are finishing): sled itself fails at once. The lock is
/// probed with flock and released again before sled takes it. Errors: `Io` (the
/// file cannot be opened; still locked after 10 s).
fn wait_for_lock(dir: &Path) -> Result<()> {
    use fs4::fs_std::FileExt;
    let path = dir.join("db");
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
    {
        Ok(f) => f,
        // Not made yet: nobody holds it.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(StoreError::Io { path, source }),
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match FileExt::try_lock_exclusive(&file) {
            Ok(true) => return Ok(()),
            Ok(false) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Ok(false) => {
                return Err(StoreError::Io {
                    path,
                    source: std::io::Error::new(
                        std::io::ErrorKind::WouldBlock,
                        "the timer index is locked by another open store for over 10 s",
                    ),
                })
            }
            Err(source) => return Err(StoreError::Io { path, source }),
        }
    }
}

/// A sled failure as the store's error: its I/O error on `dir` (so a full disk
/// reads as one), else the damage it reports.
fn sled_error(dir: &Path, e: sled::Error) -> StoreError {
    match e {
        sled::Error::Io(source) => StoreError::Io {
            path: dir.to_owned(),
            source,
        },
        other => StoreError::Corrupted {
            path: dir.to_owned(),
            file_offset: 0,
            reason: format!("timer index: {other}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timer(deliver_ms: i64, q: u64) -> PendingTimer {
        PendingTimer {
            deliver_ms,
            timer_queue_offset: q,
            physical_offset: q * 100,
            size_bytes: 90,
        }
    }

    #[test]
    fn due_timers_come_earliest_first_and_only_once_due() {
        let dir = tempfile::tempdir().unwrap();
        let idx = TimerIndex::open(dir.path()).unwrap();
        for t in [
            timer(3_000, 0),
            timer(1_000, 1),
            timer(2_000, 2),
            timer(1_000, 3),
        ] {
            idx.insert(t).unwrap();
        }
        // Inserting again (dispatch after a crash) changes nothing.
        idx.insert(timer(2_000, 2)).unwrap();
        assert_eq!(idx.pending(), 4);
        assert_eq!(idx.due(999, 10).unwrap(), vec![]);
        assert_eq!(
            idx.due(2_000, 10).unwrap(),
            vec![timer(1_000, 1), timer(1_000, 3), timer(2_000, 2)]
        );
        assert_eq!(idx.due(i64::MAX, 2).unwrap().len(), 2);
        assert_eq!(idx.next_deliver_ms().unwrap(), Some(1_000));
        assert_eq!(idx.oldest_physical_offset(0).unwrap(), Some(0));
        // timer(1_000, 1) is at 100, timer(2_000, 2) at 200, timer(3_000, 0) at 0.
        assert_eq!(idx.oldest_physical_offset(1).unwrap(), Some(100));
        assert_eq!(idx.oldest_physical_offset(301).unwrap(), None);
        assert!(idx.remove(1_000, 1).unwrap());
        assert!(!idx.remove(1_000, 1).unwrap());
        assert_eq!(idx.due(1_000, 10).unwrap(), vec![timer(1_000, 3)]);
    }

    #[test]
    fn the_index_survives_a_reopen_once_flushed_and_clears() {
        let dir = tempfile::tempdir().unwrap();
        {
            let idx = TimerIndex::open(dir.path()).unwrap();
            idx.insert(timer(5, 7)).unwrap();
            idx.flush().unwrap();
        }
        let idx = TimerIndex::open(dir.path()).unwrap();
        assert_eq!(idx.due(10, 10).unwrap(), vec![timer(5, 7)]);
        idx.clear().unwrap();
        assert_eq!(idx.pending(), 0);
        assert_eq!(idx.next_deliver_ms().unwrap(), None);
    }

    #[test]
    fn keys_order_by_delivery_time_then_queue_offset() {
        let mut keys = [
            key(2, 0),
            key(1, u64::MAX),
            key(1, 5),
            key(0, 9),
            key(i64::MAX, 0),
        ];
        keys.sort();
        assert_eq!(
            keys,
            [
                key(0, 9),
                key(1, 5),
                key(1, u64::MAX),
                key(2, 0),
                key(i64::MAX, 0)
            ]
        );
    }
}
