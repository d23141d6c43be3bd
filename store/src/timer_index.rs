//! The timer index: pending delay/timer messages ordered by delivery time, in
//! the files of [`crate::timer_wheel`] under `<root>/timerlog` (a log of
//! fixed-size entries and a wheel of one-second slots: the heap does not grow
//! with the timers), and the half index of transactional messages
//! ([`crate::half_index`]) in a sled database under `<root>/timers`. The
//! release before kept the timers in that database's default tree: the wheel
//! is rebuilt from the CommitLog, and those rows are dropped once it is marked
//! ready (a `READY` file in its directory; a wheel without one, a rebuild cut
//! short, is opened empty and rebuilt again).
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
use std::sync::{Mutex, RwLock};

use crate::error::{Result, StoreError};
use crate::timer_wheel::{TimerWheel, ENTRIES_PER_FILE};

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

/// In the wheel's directory once it holds every pending timer.
const READY_FILE: &str = "READY";

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

/// Pending timers by delivery time, and the half index's database. Shared by
/// reference.
pub struct TimerIndex {
    dir: PathBuf,
    /// None once closed ([`TimerIndex::close`]): sled holds a lock on its files
    /// while open, which a store opened again in the same process must get.
    db: RwLock<Option<sled::Db>>,
    /// None until [`TimerIndex::open_wheel`], and once closed.
    wheel: Mutex<Option<TimerWheel>>,
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
            wheel: Mutex::new(None),
        })
    }

    /// Opens the pending timers' files in `dir` ([`TimerWheel::open`] with
    /// [`ENTRIES_PER_FILE`]; `end` is the timer queue's end after recovery).
    /// Returns whether the wheel is ready: a wheel never marked ready
    /// ([`TimerIndex::mark_wheel_ready`]: new, or its rebuild from the log was
    /// cut short) is opened empty, every entry wiped, and must be rebuilt.
    /// Errors: the wheel's.
    pub fn open_wheel(&self, dir: &Path, end: u64) -> Result<bool> {
        let ready = dir.join(READY_FILE).exists();
        let wheel = TimerWheel::open(dir, ENTRIES_PER_FILE, if ready { end } else { 0 })?;
        *self.wheel.lock().unwrap() = Some(wheel);
        Ok(ready)
    }

    /// Once the wheel holds every pending timer of the dispatched log: makes
    /// it durable, marks it ready in `dir` (a later open keeps its entries),
    /// and drops the timer rows the previous release kept in the database's
    /// default tree. Errors: `Io`, sled's.
    pub fn mark_wheel_ready(&self, dir: &Path) -> Result<()> {
        self.flush()?;
        let path = dir.join(READY_FILE);
        std::fs::File::create(&path)
            .and_then(|f| f.sync_all())
            .map_err(|source| StoreError::Io { path, source })?;
        crate::mapped_file::fsync_dir(dir)?;
        let db = self.db()?;
        if !db.is_empty() {
            db.clear().map_err(|e| self.err(e))?;
            db.flush().map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// Runs `f` on the open wheel. Error: `NotWritable` when it is not open.
    fn with_wheel<T>(&self, f: impl FnOnce(&mut TimerWheel) -> Result<T>) -> Result<T> {
        match self.wheel.lock().unwrap().as_mut() {
            Some(w) => f(w),
            None => Err(StoreError::NotWritable(
                "the timer index is not open".into(),
            )),
        }
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
        if let Some(mut wheel) = self.wheel.lock().unwrap().take() {
            wheel.flush()?;
        }
        let db = self.db.write().unwrap().take();
        match db {
            Some(db) => db.flush().map(|_| ()).map_err(|e| sled_error(&self.dir, e)),
            None => Ok(()),
        }
    }

    /// Adds a timer (again: the same timer, or one already delivered, changes
    /// nothing). Errors: `Io`; `NotWritable` when closed.
    pub fn insert(&self, t: PendingTimer) -> Result<()> {
        self.with_wheel(|w| w.insert(t))
    }

    /// Removes a delivered timer; true if it was pending.
    pub fn remove(&self, deliver_ms: i64, timer_queue_offset: u64) -> Result<bool> {
        self.with_wheel(|w| Ok(w.remove(deliver_ms, timer_queue_offset)))
    }

    /// Up to `limit` pending timers due at or before `now_ms`, by delivery
    /// second, earliest first, and within a second in the order they were sent
    /// ([`TimerWheel::due`]).
    pub fn due(&self, now_ms: i64, limit: usize) -> Result<Vec<PendingTimer>> {
        self.with_wheel(|w| w.due(now_ms, limit))
    }

    /// The earliest pending timer's delivery time, if any.
    pub fn next_deliver_ms(&self) -> Result<Option<i64>> {
        self.with_wheel(|w| w.next_deliver_ms())
    }

    /// The lowest CommitLog offset at or above `from` (the log's first offset)
    /// that a pending timer's record is at, if any: retention, expired or forced,
    /// keeps those records. A timer below `from` points at a record already gone
    /// and bounds nothing.
    pub fn oldest_physical_offset(&self, from: u64) -> Result<Option<u64>> {
        self.with_wheel(|w| Ok(w.oldest_physical_offset(from)))
    }

    /// Pending timers (0 when not open).
    pub fn pending(&self) -> usize {
        self.with_wheel(|w| Ok(w.pending())).unwrap_or(0)
    }

    /// Makes every change so far durable (msync of the wheel, if open; sled's
    /// fsync).
    pub fn flush(&self) -> Result<()> {
        // The msync runs without the lock, so dispatch goes on meanwhile.
        let dirty = match self.wheel.lock().unwrap().as_mut() {
            Some(w) => w.take_dirty(),
            None => Vec::new(),
        };
        let synced = crate::timer_wheel::sync_files(&dirty);
        if let Some(w) = self.wheel.lock().unwrap().as_mut() {
            match synced {
                Ok(()) => w.drop_done_files()?,
                Err(e) => {
                    w.mark_dirty();
                    return Err(e);
                }
            }
        }
        self.db()?
            .flush()
            .map(|_| ())
            .map_err(|e| sled_error(&self.dir, e))
    }

    /// Forgets every timer and half message (the log was reset for a snapshot:
    /// the records they point at are gone from this node), durably. The wheel
    /// is cleared if open (the store opens it before it may clear).
    pub fn clear(&self) -> Result<()> {
        if let Some(w) = self.wheel.lock().unwrap().as_mut() {
            w.clear()?;
        }
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
    fn timers_survive_a_reopen_once_flushed_and_clear() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join("timerlog");
        {
            let idx = TimerIndex::open(&dir.path().join("timers")).unwrap();
            assert!(matches!(
                idx.insert(timer(5, 7)),
                Err(StoreError::NotWritable(_))
            ));
            assert!(!idx.open_wheel(&wheel, 0).unwrap());
            idx.mark_wheel_ready(&wheel).unwrap();
            idx.insert(timer(5, 7)).unwrap();
            idx.insert(timer(3, 8)).unwrap();
            idx.flush().unwrap();
        }
        let idx = TimerIndex::open(&dir.path().join("timers")).unwrap();
        assert!(idx.open_wheel(&wheel, 9).unwrap());
        assert_eq!(idx.due(10, 10).unwrap(), vec![timer(5, 7), timer(3, 8)]);
        assert_eq!(idx.next_deliver_ms().unwrap(), Some(3));
        assert_eq!(idx.oldest_physical_offset(701).unwrap(), Some(800));
        idx.clear().unwrap();
        assert_eq!(idx.pending(), 0);
        assert_eq!(idx.next_deliver_ms().unwrap(), None);
        idx.close().unwrap();
        assert!(matches!(idx.due(10, 10), Err(StoreError::NotWritable(_))));
    }

    #[test]
    fn a_wheel_never_marked_ready_opens_empty_and_old_rows_go_once_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let (db_dir, wheel) = (dir.path().join("timers"), dir.path().join("timerlog"));
        {
            let db = sled::open(&db_dir).unwrap();
            db.insert([0u8; 16], &[0u8; 12][..]).unwrap();
            db.open_tree("kept").unwrap().insert(b"k", b"v").unwrap();
            db.flush().unwrap();
        }
        {
            // A rebuild cut short: entries written, never marked ready.
            let idx = TimerIndex::open(&db_dir).unwrap();
            assert!(!idx.open_wheel(&wheel, 0).unwrap());
            idx.insert(timer(5, 7)).unwrap();
            idx.close().unwrap();
        }
        let idx = TimerIndex::open(&db_dir).unwrap();
        assert!(!idx.open_wheel(&wheel, 8).unwrap());
        assert_eq!(idx.pending(), 0, "rebuilt from the log instead");
        assert_eq!(idx.db().unwrap().len(), 1, "the old rows stay until ready");
        idx.mark_wheel_ready(&wheel).unwrap();
        assert!(idx.db().unwrap().is_empty());
        assert_eq!(idx.tree("kept").unwrap().len(), 1, "other trees stay");
    }
}
