//! [`MessageStore`]: one broker node's store. It opens and recovers the CommitLog,
//! ConsumeQueues and IndexFiles, runs group commit and the periodic checkpoint, and
//! dispatches committed entries into the ConsumeQueues and the IndexFile.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::checkpoint::{Checkpoint, CheckpointFile};
use crate::commit_log::{CommitLog, StoredEntry};
use crate::config::{FlushMode, StoreConfig};
use crate::consume_queue::ConsumeQueueTable;
use crate::error::{IoContext, Result, StoreError};
use crate::group_commit::{DurableCallback, GroupCommit};
use crate::index_file::IndexService;
use crate::raft_index::EntryLocation;
use crate::record::{MessageRecord, RecordKind, RecordView};
use crate::recovery::{finish_interrupted_reset, recover_log};
use crate::timer_index::TimerIndex;

mod background;
mod dispatch;
mod index_rebuild;
mod queue_repair;
mod timer_rebuild;

pub use background::WARM_AHEAD_BYTES;

/// The queue offset of a message record dispatch placed in no queue (a losing
/// end of a transaction: `half_index`).
pub const NOT_PLACED: u64 = u64::MAX;

/// A message placed in a ConsumeQueue by [`MessageStore::dispatch_through`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DispatchedMessage {
    /// Log index of the entry that carried it.
    pub log_index: u64,
    /// Topic.
    pub topic: String,
    /// Message queue id.
    pub queue_id: i32,
    /// Its queue offset (assigned here, identically on every replica), or
    /// [`NOT_PLACED`] for a losing end of a transaction (a commit copy of a half
    /// another record ended first), which no queue holds.
    pub queue_offset: u64,
    /// Its CommitLog offset.
    pub physical_offset: u64,
    /// Its record size in bytes.
    pub size_bytes: u32,
}

/// Where a message queue continues: its next queue offset.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueuePosition {
    /// Topic.
    pub topic: String,
    /// Message queue id.
    pub queue_id: i32,
    /// The queue offset the next message gets.
    pub next_offset: u64,
}

/// How the last open went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The previous run shut down cleanly (no scan was needed).
    pub clean: bool,
    /// Physical offset the scan started at (`None` after a clean shutdown).
    pub scanned_from: Option<u64>,
    /// Whole entries the scan found.
    pub entries_scanned: u64,
    /// Where the scan met damage, and why; the log was cut there.
    pub damage: Option<(u64, String)>,
    /// The CommitLog's written end after recovery.
    pub end_offset: u64,
    /// The next log index after recovery.
    pub next_log_index: u64,
    /// First log index not yet dispatched to ConsumeQueues.
    pub dispatched_next_log_index: u64,
}

#[derive(Debug, Clone, Copy)]
struct Dispatched {
    next_log_index: u64,
    offset: u64,
}

/// One broker node's store. Cheap to share (`Arc`); all methods take `&self`.
pub struct MessageStore {
    cfg: StoreConfig,
    log: Arc<CommitLog>,
    cqs: ConsumeQueueTable,
    index: IndexService,
    timers: TimerIndex,
    dispatched: Mutex<Dispatched>,
    checkpoint_file: CheckpointFile,
    checkpoint_lock: Mutex<()>,
    group_commit: GroupCommit,
    ticker: Mutex<Option<JoinHandle<()>>>,
    warmer: Mutex<Option<JoinHandle<()>>>,
    ticker_stop: Arc<(Mutex<bool>, Condvar)>,
    closed: AtomicBool,
    report: RecoveryReport,
    /// Entries (by log index) the IndexFile rebuild at open skipped as damaged:
    /// indexed once written back from a peer's copy (`rewrite_entry`).
    unindexed: Mutex<std::collections::BTreeMap<u64, index_rebuild::SkippedEntry>>,
    /// Last disk usage measured for `check_room_for_writes`, and when.
    pub(crate) disk_used_cache: Mutex<Option<(std::time::Instant, f64)>>,
}

impl MessageStore {
    /// Opens the store at `cfg.root`, recovering after a crash: the CommitLog is
    /// scanned from the last checkpoint, a torn or damaged tail is cut and erased, the
    /// Raft index is rebuilt past the checkpoint, ConsumeQueue entries past the
    /// dispatch checkpoint are dropped (they are rebuilt by `dispatch_through`) and
    /// the IndexFile written after the checkpoint is rebuilt.
    pub fn open(cfg: StoreConfig) -> Result<Arc<Self>> {
        std::fs::create_dir_all(&cfg.root).at(&cfg.root)?;
        let checkpoint_file = CheckpointFile::new(&cfg.root);
        let checkpoint = match checkpoint_file.load() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "ignoring a damaged checkpoint; recovering from the oldest segment");
                None
            }
        };
        let crashed = checkpoint_file.abort_exists() || !checkpoint.is_some_and(|c| c.clean);
        let cp = checkpoint.unwrap_or_default();
        if crashed && cp.reset {
            finish_interrupted_reset(&cfg, &cp)?;
        }
        let log = Arc::new(CommitLog::open_at(
            cfg.commit_log.clone(),
            &cfg.root,
            cp.commit_log_offset,
            cp.last_term,
        )?);
        let cqs = ConsumeQueueTable::open(&cfg.root, cfg.consume_queue_entries_per_file)?;
        let index = IndexService::open(
            &cfg.root.join("index"),
            cfg.index_hash_slot_num,
            cfg.index_num,
        )?;
        let halves_missing = !cfg.root.join("timers").exists();
        let timers = TimerIndex::open(&cfg.root.join("timers"))?;
        if !crashed
            && cp.commit_log_offset <= log.min_offset()
            && log.next_log_index() != cp.next_log_index
        {
            // The log held no record at shutdown (reset for a snapshot, or truncated to
            // empty): the index files cannot say where it starts, the checkpoint does.
            log.raft_index().reset(cp.next_log_index)?;
        }
        let clean = !crashed && log.next_log_index() == cp.next_log_index;
        let mut report = RecoveryReport {
            clean,
            scanned_from: None,
            entries_scanned: 0,
            damage: None,
            end_offset: cp.commit_log_offset,
            next_log_index: cp.next_log_index,
            dispatched_next_log_index: cp.dispatched_next_log_index,
        };
        let mut dispatched = Dispatched {
            next_log_index: cp.dispatched_next_log_index,
            offset: cp.dispatched_offset,
        };
        if clean {
            log.set_recovered_end(cp.commit_log_offset, cp.last_term)?;
            log.forget_purged_index_entries()?;
        } else {
            recover_log(&log, checkpoint, &mut report)?;
            if crashed && !cfg.forget_lost_acknowledged {
                if let Some(bound) = log.adopt_ack_bound_after_reboot()? {
                    tracing::warn!(
                        ?bound,
                        "the machine restarted since this node last acknowledged entries it had only written (ASYNC_FLUSH): they may be lost, so the bound written ahead of them stands for what it acknowledged"
                    );
                }
            }
            if log.lost_acknowledged() {
                tracing::warn!(
                    acked = ?log.acked_log_id(),
                    next_log_index = report.next_log_index,
                    "recovery cut CommitLog records this node had acknowledged as durable"
                );
            }
            // Dispatch state: never past what the CommitLog still holds.
            if dispatched.offset > report.end_offset
                || dispatched.next_log_index > report.next_log_index
            {
                dispatched = Dispatched {
                    next_log_index: report.next_log_index,
                    offset: report.end_offset,
                };
            }
            if dispatched.next_log_index < log.first_log_index() {
                dispatched = Dispatched {
                    next_log_index: log.first_log_index(),
                    offset: log.min_offset(),
                };
            }
            report.dispatched_next_log_index = dispatched.next_log_index;
        }
        if cfg.forget_lost_acknowledged {
            // After a clean stop too: the mark adopted at an earlier start stays.
            let forgot = log.forget_lost_acknowledged()?;
            tracing::warn!(
                ?forgot,
                "told to forget lost acknowledged entries: this node takes part in elections though it may lack entries it acknowledged"
            );
        }
        // ConsumeQueue entries past the dispatch position (written after the last
        // checkpoint, possibly torn) go; dispatch rebuilds them from the CommitLog.
        // A damaged entry cut with them may have stood for a message below the
        // dispatch position: such queues are filled again from `replace_from`.
        let replace_from = queue_repair::cut_queues(&cqs, dispatched.offset, log.wrote_offset())?;
        // Retention state is derived, not stored: queues start at the oldest
        // CommitLog offset still held.
        for (_, cq) in cqs.all() {
            cq.set_min_commit_log_offset(log.min_offset())?;
        }
        let group_commit = GroupCommit::start(log.clone());
        let store = Arc::new(Self {
            cfg,
            log,
            cqs,
            index,
            timers,
            dispatched: Mutex::new(dispatched),
            checkpoint_file,
            checkpoint_lock: Mutex::new(()),
            group_commit,
            ticker: Mutex::new(None),
            warmer: Mutex::new(None),
            ticker_stop: Arc::new((Mutex::new(false), Condvar::new())),
            closed: AtomicBool::new(false),
            disk_used_cache: Mutex::new(None),
            report,
            unindexed: Mutex::new(std::collections::BTreeMap::new()),
        });
        if !clean {
            store.rebuild_last_index_file(dispatched)?;
        }
        if let Some(from) = replace_from {
            store.replace_cut_queue_entries(from, dispatched)?;
        }
        // The timer wheel opens once the timer queue is repaired: its entries
        // past the queue's end are dispatched again.
        let wheel_dir = store.cfg.root.join("timerlog");
        let timer_queue_end = store
            .cqs
            .get(crate::timer_index::TIMER_TOPIC, 0)
            .map_or(0, |q| q.max_offset());
        let wheel_missing = !store.timers.open_wheel(&wheel_dir, timer_queue_end)?;
        if crashed && cp.reset {
            store.timers.clear()?;
        }
        if (wheel_missing || halves_missing)
            && dispatched.next_log_index > store.log.first_log_index()
        {
            let pending = store.rebuild_timer_index(
                dispatched.next_log_index,
                timer_rebuild::Rebuild {
                    timers: wheel_missing,
                    halves: halves_missing,
                },
            )?;
            tracing::warn!(
                pending,
                wheel_missing,
                halves_missing,
                "the timer or half index was missing: rebuilt from the CommitLog"
            );
        }
        if wheel_missing {
            store.timers.mark_wheel_ready(&wheel_dir)?;
        }
        if let Err(e) = store.ensure_disk_reserve() {
            tracing::warn!(error = %e, "no disk reserve: committed entries will find no spare room if the disk fills");
        }
        // The CommitLog never takes the room kept for metadata on a full disk
        // (`crate::room`); a start on a full disk gives the reserve up at once.
        store.log.segments().keep_free(store.metadata_floor_bytes());
        if let Err(e) = store.keep_room_for_metadata() {
            tracing::warn!(error = %e, "measuring the disk failed");
        }
        store.checkpoint_file.create_abort()?;
        store.start_ticker();
        store.start_warmer();
        tracing::info!(report = ?store.report, "store opened");
        Ok(store)
    }

    /// The timer index: pending delay messages by delivery time.
    pub fn timers(&self) -> &TimerIndex {
        &self.timers
    }

    /// The settings the store was opened with.
    pub fn config(&self) -> &StoreConfig {
        &self.cfg
    }

    /// How the last open went.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.report
    }

    /// The CommitLog (also the Raft log).
    pub fn commit_log(&self) -> &CommitLog {
        &self.log
    }

    /// The ConsumeQueues.
    pub fn consume_queues(&self) -> &ConsumeQueueTable {
        &self.cqs
    }

    /// The IndexFiles.
    pub fn index(&self) -> &IndexService {
        &self.index
    }

    /// SYNC_FLUSH or ASYNC_FLUSH.
    pub fn flush_mode(&self) -> FlushMode {
        self.cfg.flush_mode
    }

    /// True after [`MessageStore::shutdown`].
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StoreError::NotWritable("the store is shut down".into()));
        }
        Ok(())
    }

    /// Appends one Raft entry (see [`CommitLog::append_entry`]). Message records must
    /// name a valid topic and a queue id >= 0, so that dispatch cannot fail later.
    /// Written, not yet durable: see [`MessageStore::when_durable`].
    pub fn append_entry(
        &self,
        term: u64,
        log_index: u64,
        records: &[MessageRecord],
    ) -> Result<EntryLocation> {
        self.check_open()?;
        for r in records.iter().filter(|r| r.kind == RecordKind::Message) {
            self.validate_message(r)?;
        }
        self.log.append_entry(term, log_index, records)
    }

    /// Checks that `m` can be stored and dispatched: a valid topic name, a non-negative
    /// queue id, a body within `max_message_size_bytes`, fields the layout can carry, and
    /// a record that fits a segment. Returns its encoded size in bytes. The Raft layer
    /// calls it before proposing, so bad input never reaches the log.
    pub fn validate_message(&self, m: &MessageRecord) -> Result<usize> {
        crate::consume_queue::validate_topic(&m.topic)?;
        if m.queue_id < 0 {
            return Err(StoreError::InvalidInput(format!(
                "queue id {} is negative",
                m.queue_id
            )));
        }
        let max = self.cfg.commit_log.max_message_size_bytes;
        if m.body.len() > max {
            return Err(StoreError::MessageTooLarge {
                size_bytes: m.body.len(),
                max_bytes: max,
            });
        }
        let props = crate::record::encode_properties(&m.properties);
        let len = crate::record::encoded_len(m, &props).map_err(StoreError::InvalidInput)?;
        if len as u64 > self.max_entry_bytes() {
            return Err(StoreError::EntryTooLarge {
                size_bytes: len as u64,
                segment_bytes: self.cfg.commit_log.segment_bytes,
            });
        }
        Ok(len)
    }

    /// The largest Raft entry (all its records) the CommitLog accepts, in bytes.
    pub fn max_entry_bytes(&self) -> u64 {
        self.cfg.commit_log.segment_bytes - crate::record::BLANK_MIN_BYTES
    }

    /// Calls `done` once CommitLog offset `upto` is durable (group commit). In either
    /// flush mode this means fsynced; an ASYNC_FLUSH caller that only needs "written"
    /// does not call it.
    pub fn when_durable(&self, upto: u64, done: DurableCallback) {
        self.group_commit.when_durable(upto, done)
    }

    /// Blocks until CommitLog offset `upto` is durable.
    pub fn wait_durable(&self, upto: u64) -> Result<u64> {
        self.group_commit.wait_durable(upto)
    }

    /// Reads entry `log_index` back.
    pub fn read_entry(&self, log_index: u64) -> Result<StoredEntry> {
        self.log.read_entry(log_index)
    }

    /// Writes a damaged entry again from a peer's copy
    /// ([`CommitLog::rewrite_entry`]: same term, a pinned slot, same size,
    /// fsynced), then indexes it in the IndexFile if the rebuild after a crash
    /// skipped it. Errors: as [`CommitLog::rewrite_entry`]; once the entry is
    /// written back it is reported repaired, and a failure to index it (derived
    /// data) is only logged.
    pub fn rewrite_entry(
        &self,
        term: u64,
        log_index: u64,
        records: &[MessageRecord],
    ) -> Result<EntryLocation> {
        self.check_open()?;
        let loc = self.log.rewrite_entry(term, log_index, records)?;
        if let Err(e) = self.index_rewritten(log_index) {
            tracing::warn!(log_index, error = %e, "an entry written back could not be indexed; queries by key miss it on this node");
        }
        Ok(loc)
    }

    /// Drops the whole log and every ConsumeQueue entry, so that the next entry
    /// appended is `next_log_index` (a follower that installed a snapshot covering
    /// everything before it). The reset is first recorded in the checkpoint, so a
    /// crash part way is finished by the next open.
    pub fn reset(&self, next_log_index: u64, last_term: u64) -> Result<()> {
        self.check_open()?;
        let _one_at_a_time = self.checkpoint_lock.lock().unwrap();
        let mut d = self.dispatched.lock().unwrap();
        let fresh = self.log.reset_offset();
        self.cqs.flush_all()?;
        self.index.flush()?;
        let cp = Checkpoint {
            commit_log_offset: fresh,
            next_log_index,
            last_term,
            dispatched_offset: fresh,
            dispatched_next_log_index: next_log_index,
            timestamp_ms: now_ms(),
            clean: false,
            reset: true,
        };
        self.checkpoint_file.store(&cp)?;
        self.log.reset(next_log_index, last_term)?;
        // The records pending timers point at went with the log (a crash before
        // this is finished at the next open, which sees the reset recorded).
        self.timers.clear()?;
        debug_assert_eq!(self.log.min_offset(), fresh);
        for (_, cq) in self.cqs.all() {
            cq.set_min_commit_log_offset(fresh)?;
        }
        self.index.remove_files_below(fresh)?;
        *d = Dispatched {
            next_log_index,
            offset: fresh,
        };
        Ok(())
    }

    /// Removes entries at and after `log_index` (Raft conflict resolution). Refuses
    /// with `InvalidInput` to cut an entry that was already dispatched (applied):
    /// that would be a committed entry, which Raft never truncates.
    pub fn truncate_from(&self, log_index: u64) -> Result<()> {
        self.check_open()?;
        // Lock order everywhere: checkpoint, then dispatch state.
        let _one_at_a_time = self.checkpoint_lock.lock().unwrap();
        let d = self.dispatched.lock().unwrap();
        if log_index < d.next_log_index {
            return Err(StoreError::InvalidInput(format!(
                "refusing to truncate from log index {log_index}: entries up to {} are already applied",
                d.next_log_index - 1
            )));
        }
        if log_index >= self.log.next_log_index() {
            return Ok(());
        }
        // First move the checkpoint back to the cut, so that a crash during or after
        // the truncation never finds a checkpoint vouching for erased entries.
        let cut = self.log.entry_location(log_index)?;
        if crate::canary::enabled(crate::canary::Canary::DispatchBeforeApply) {
            // The canary's early placements of the cut entries go with them.
            for (_, cq) in self.cqs.all() {
                cq.truncate_from_commit_log_offset(cut.physical_offset, u64::MAX)?;
            }
        }
        let last_term = match log_index.checked_sub(1) {
            Some(prev) if prev >= self.log.first_log_index() => self.log.entry_location(prev)?.term,
            _ => 0,
        };
        // The dispatch fields keep their checkpointed values (those ConsumeQueue
        // entries are the ones known durable); entries below the cut are made durable.
        let mut cp = self
            .checkpoint_file
            .load()
            .ok()
            .flatten()
            .unwrap_or_default();
        self.log.flush()?;
        self.log.raft_index().flush()?;
        cp.commit_log_offset = cut.physical_offset;
        cp.next_log_index = log_index;
        cp.last_term = last_term;
        cp.clean = false;
        // A reset recorded earlier has completed (it holds the same lock).
        cp.reset = false;
        cp.timestamp_ms = now_ms();
        debug_assert!(cp.dispatched_offset <= cp.commit_log_offset);
        self.checkpoint_file.store(&cp)?;
        self.log.truncate_from(log_index)
    }

    /// Writes a checkpoint: flushes the CommitLog, the Raft index, every ConsumeQueue
    /// and the IndexFile, then durably records those positions. Runs every
    /// `flush_interval_ms` in the background (this is also ASYNC_FLUSH's flush).
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        self.write_checkpoint(false)
    }

    fn write_checkpoint(&self, clean: bool) -> Result<Checkpoint> {
        let _one_at_a_time = self.checkpoint_lock.lock().unwrap();
        let d = *self.dispatched.lock().unwrap();
        let (end, next_log_index, last_term) = self.log.tail();
        self.log.flush()?;
        self.log.raft_index().flush()?;
        self.cqs.flush_all()?;
        self.index.flush()?;
        self.timers.flush()?;
        let cp = Checkpoint {
            commit_log_offset: end,
            next_log_index,
            last_term,
            dispatched_offset: d.offset,
            dispatched_next_log_index: d.next_log_index,
            timestamp_ms: now_ms(),
            clean,
            reset: false,
        };
        debug_assert!(cp.dispatched_offset <= cp.commit_log_offset);
        self.checkpoint_file.store(&cp)?;
        Ok(cp)
    }

    /// Clean shutdown: stops the background threads, flushes everything, writes a
    /// clean checkpoint and removes the abort file, so the next open needs no scan.
    pub fn shutdown(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.stop_threads();
        let tail = self.log.tail();
        let d = *self.dispatched.lock().unwrap();
        let cp = self.write_checkpoint(true)?;
        self.timers.close()?;
        debug_assert_eq!(
            (cp.commit_log_offset, cp.dispatched_offset),
            (tail.0, d.offset)
        );
        self.checkpoint_file.remove_abort()
    }

    fn stop_threads(&self) {
        {
            let (lock, cv) = &*self.ticker_stop;
            *lock.lock().unwrap() = true;
            cv.notify_all();
        }
        for slot in [&self.ticker, &self.warmer] {
            if let Some(t) = slot.lock().unwrap().take() {
                if t.thread().id() != std::thread::current().id() {
                    let _ = t.join();
                }
            }
        }
        self.group_commit.stop();
    }
}

impl Drop for MessageStore {
    fn drop(&mut self) {
        // Without `shutdown` this is a crash as far as the files are concerned: the
        // abort file stays and the next open recovers.
        self.stop_threads();
    }
}

/// Calls `f(view, physical offset)` for each record of `entry`; a bad record is
/// reported as `Corrupted` at its offset.
pub(crate) fn for_each_record(
    log: &CommitLog,
    entry: &StoredEntry,
    mut f: impl FnMut(RecordView<'_>, u64) -> Result<()>,
) -> Result<()> {
    let mut phys = entry.location.physical_offset;
    for r in entry.records() {
        let view = r.map_err(|why| log.corrupted(phys, why))?;
        f(view, phys)?;
        phys += view.len() as u64;
    }
    Ok(())
}

/// Wall clock in ms since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
