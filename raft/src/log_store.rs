//! openraft's `RaftLogStorage` over the store's CommitLog: the Raft log is the
//! CommitLog, read and written through [`MessageStore`].
//!
//! Durability: under SYNC_FLUSH the append callback runs only after the group-commit
//! fsync covered the entries. Under ASYNC_FLUSH it runs once they are written to the
//! page cache and the acknowledged mark records them: a process crash loses
//! nothing, but a power loss can lose the entries written since the last background
//! flush (500 ms by default) on that node; the durable bound written ahead of the
//! mark (`ledgermq_store::ack_bound`) then keeps the node out of elections until it
//! has them again.
//!
//! A full disk: an entry the store has no room for (ENOSPC, or a new CommitLog
//! segment that would take the room kept for metadata, see `ledgermq_store::room`)
//! is appended again after 100 ms, then at doubling waits up to every second, until
//! it fits, instead of failing, which would
//! stop the node for good (openraft treats every storage error as fatal). Raft on
//! this node waits meanwhile: it falls behind and the rest of the group serves.

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ledgermq_store::{FlushMode, MessageStore};
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{AnyError, LogState, OptionalSend, RaftLogReader, StorageIOError, Vote};

use crate::codec::{entry_to_records, log_id, records_to_entry};
use crate::error::RaftNodeError;
use crate::meta::MetaDb;
use crate::repair::EntryRepair;
use crate::types::{Entry, LogId, NodeId, StorageError, TypeConfig};
use crate::vote_file::VoteFile;

/// The Raft log of one node. Cheap to clone (readers are clones).
#[derive(Clone)]
pub struct LogStore {
    store: Arc<MessageStore>,
    meta: MetaDb,
    node_id: NodeId,
    /// Most entry bytes one AppendEntries carries (at least one entry is sent).
    max_replication_bytes: usize,
    /// Set when the node stops: an append waiting for disk space gives up.
    stopping: Arc<AtomicBool>,
    /// Fetches an entry that reads back damaged from a peer (`crate::repair`).
    repair: Arc<EntryRepair>,
    /// Where the vote is kept (`crate::vote_file`).
    vote: Arc<std::sync::Mutex<VoteFile>>,
}

use crate::error::any_err as io_err;

impl LogStore {
    /// The log of node `node_id`'s `store`, with purge state in `meta` and the
    /// vote in `vote`;
    /// one AppendEntries carries at most `max_replication_bytes` of entries (or one
    /// entry, if that alone is larger); an entry that reads back damaged is
    /// fetched again through `repair` before it is returned.
    pub fn new(
        store: Arc<MessageStore>,
        meta: MetaDb,
        vote: VoteFile,
        node_id: NodeId,
        max_replication_bytes: usize,
        repair: Arc<EntryRepair>,
    ) -> Self {
        Self {
            store,
            meta,
            vote: Arc::new(std::sync::Mutex::new(vote)),
            node_id,
            max_replication_bytes,
            stopping: repair.stop_flag(),
            repair,
        }
    }

    /// The flag that makes an append waiting for disk space give up (with a
    /// storage error, which stops Raft), and a repair of a damaged entry
    /// (`crate::repair`, whose flag it is): set it before shutting Raft down, or
    /// the shutdown waits for space or for peers.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stopping.clone()
    }

    /// Appends one entry, waiting for disk space as long as there is none (see the
    /// module docs): 100 ms, then doubling up to 1 s between attempts. A failed
    /// append changed nothing, so it is simply made again.
    async fn append_when_room(
        &self,
        id: LogId,
        records: &[ledgermq_store::MessageRecord],
    ) -> Result<ledgermq_store::EntryLocation, StorageError> {
        let mut wait = Duration::from_millis(100);
        let mut waited = false;
        loop {
            match self
                .store
                .append_entry(id.leader_id.term, id.index, records)
            {
                Err(e) if e.is_no_space() && !self.stopping.load(Ordering::Acquire) => {
                    if !waited {
                        tracing::error!(index = id.index, error = %e, "no disk space to append a Raft entry: waiting for space (this node falls behind); free space");
                        waited = true;
                    }
                    keep_room_for_metadata(&self.store);
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(1));
                }
                Ok(loc) => {
                    if waited {
                        tracing::warn!(index = id.index, "the disk has room again: appending");
                    }
                    return Ok(loc);
                }
                Err(e) => return Err(StorageIOError::write_log_entry(id, io_err(e)).into()),
            }
        }
    }

    /// The last purged log id. Stored as `Option<LogId>` ([`RaftLogStorage::purge`]
    /// writes `Some(id)`); reading it as a bare `LogId` took the option's tag for
    /// the term and the term for the index, so a node that had purged its log
    /// could not start again (openraft read entries below the real purge point).
    fn last_purged(&self) -> Result<Option<LogId>, StorageError> {
        MetaDb::get::<Option<LogId>>(&self.meta.raft, "last_purged")
            .map(Option::flatten)
            .map_err(|e| StorageIOError::read_logs(io_err(e)).into())
    }

    /// Entries `[start, end)` that the log holds; with `max_bytes`, only as many as
    /// fit in that many CommitLog bytes (at least one). An entry whose records do
    /// not check out is repaired from a peer first (`crate::repair`); if no peer
    /// can give it, the read fails (openraft then stops the node).
    async fn read_range(
        &self,
        start: u64,
        end: u64,
        max_bytes: Option<usize>,
    ) -> Result<Vec<Entry>, StorageError> {
        let log = self.store.commit_log();
        let (first, next) = (log.first_log_index(), log.next_log_index());
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for index in start.max(first)..end.min(next) {
            if let Some(m) = max_bytes {
                let loc = log
                    .entry_location(index)
                    .map_err(|e| StorageIOError::read_log_at_index(index, io_err(e)))?;
                bytes = bytes.saturating_add(loc.size_bytes as usize);
                if bytes > m && !out.is_empty() {
                    break;
                }
            }
            // Each record's CRC is checked once, as the entry is decoded.
            let read = log.read_entry(index).and_then(|stored| {
                let records = log.verified_records(&stored)?;
                Ok(records_to_entry(stored.location.term, index, records))
            });
            let entry = match read {
                Ok(decoded) => decoded
                    .map_err(|e| StorageIOError::read_log_at_index(index, AnyError::error(e)))?,
                Err(e @ ledgermq_store::StoreError::Corrupted { .. }) => {
                    tracing::error!(index, error = %e, "a log entry reads back damaged: fetching it from a peer");
                    match self.repair.repair(index, crate::repair::READ_BUDGET).await {
                        Some(entry) => entry,
                        None => {
                            return Err(StorageIOError::read_log_at_index(index, io_err(e)).into())
                        }
                    }
                }
                Err(e) => return Err(StorageIOError::read_log_at_index(index, io_err(e)).into()),
            };
            out.push(entry);
        }
        Ok(out)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        use std::ops::Bound;
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => u64::MAX,
        };
        self.read_range(start, end, None).await
    }

    /// What one AppendEntries carries: openraft 0.9 gives the call the heartbeat
    /// interval as its deadline, so the entries are bounded by bytes, not only by
    /// count (`max_payload_entries`): a call that cannot cross the link in time is
    /// never answered, and the follower never catches up.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        self.read_range(start, end, Some(self.max_replication_bytes))
            .await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id = self.last_purged()?;
        let last = self
            .store
            .commit_log()
            .last_entry()
            .map_err(|e| StorageIOError::read_logs(io_err(e)))?
            .map(|loc| log_id(loc.term, loc.log_index));
        Ok(LogState {
            last_purged_log_id,
            last_log_id: last.or(last_purged_log_id),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        // Durable before returning: written in place and fdatasync'd (off the
        // async runtime's threads) into a file whose blocks were written at its
        // creation.
        // A full disk gives the disk reserve up first (on a file system that
        // writes a new block for an overwrite).
        let (file, vote, store) = (self.vote.clone(), *vote, self.store.clone());
        blocking(move || {
            keep_room_for_metadata(&store);
            file.lock().unwrap().save(&vote)
        })
        .await
        .map_err(|e| StorageIOError::write_vote(io_err(e)).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        let vote = self.vote.lock().unwrap().current();
        Ok(vote.map(|v| resume_vote(v, self.node_id)))
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // Need not be durable (openraft re-learns the commit index); it only lets a
        // restarted node re-apply sooner.
        MetaDb::put(&self.meta.raft, COMMITTED_KEY, &committed)
            .map_err(|e| StorageIOError::write_logs(io_err(e)).into())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        let committed =
            saved_committed(&self.meta).map_err(|e| StorageIOError::read_logs(io_err(e)))?;
        let last = self
            .store
            .commit_log()
            .last_entry()
            .map_err(|e| StorageIOError::read_logs(io_err(e)))?;
        Ok(clamp_committed(
            committed,
            last.map(|l| log_id(l.term, l.log_index)),
        ))
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let (mut end, mut last) = (None, None);
        for entry in entries {
            let id = entry.log_id;

            let records = entry_to_records(entry)
                .map_err(|e| StorageIOError::write_log_entry(id, io_err(e)))?;
            let loc = self.append_when_room(id, &records).await?;
            end = Some(loc.end_offset());
            last = Some(id);
        }
        if let Some(index) = last.map(|id| id.index) {
            // Does nothing unless the dispatch-before-apply canary is on (debug
            // builds, tests only).
            self.store
                .dispatch_appended_through(index)
                .map_err(|e| StorageIOError::write_logs(io_err(e)))?;
        }
        match (self.store.flush_mode(), end) {
            (FlushMode::Sync, Some(end)) => self.store.when_durable(
                end,
                Box::new(move |r| {
                    callback.log_io_completed(r.map(|_| ()).map_err(std::io::Error::other));
                }),
            ),
            // ASYNC_FLUSH: "persisted" means written (see the module docs). The
            // acknowledged mark records it first, so that recovery cutting these
            // entries after a crash of the process is known to have lost them.
            (FlushMode::Async, Some(_)) => {
                let marked = last.map_or(Ok(()), |id| {
                    self.store
                        .commit_log()
                        .acknowledge_written(ledgermq_store::ack_mark::AckedId {
                            term: id.leader_id.term,
                            index: id.index,
                        })
                });
                callback.log_io_completed(marked.map_err(std::io::Error::other));
            }
            _ => callback.log_io_completed(Ok(())),
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        // Flushes, erases and fsyncs: off the async runtime's threads.
        let store = self.store.clone();
        blocking(move || {
            store
                .truncate_from(log_id.index)
                .map_err(RaftNodeError::from)
        })
        .await
        .map_err(|e| StorageIOError::write_logs(io_err(e)).into())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let (store, meta) = (self.store.clone(), self.meta.clone());
        blocking(move || {
            // Record the purge point durably before deleting anything.
            // The flush also makes the boundary snapshot at the purge point durable
            // (the one a lagging follower will be sent).
            keep_room_for_metadata(&store);
            MetaDb::put(&meta.raft, "last_purged", &Some(log_id)).and_then(|_| meta.flush())?;
            let next = store.commit_log().next_log_index();
            if log_id.index + 1 >= next {
                // Everything goes (a snapshot covers more than this node's log).
                store.reset(log_id.index + 1, log_id.leader_id.term)?;
            } else {
                store.purge_through(log_id.index)?;
            }
            crate::boundary::remove_below(&meta, log_id.index)?;
            Ok(())
        })
        .await
        .map_err(|e| StorageIOError::write_logs(io_err(e)).into())
    }
}

/// Gives the disk reserve up if the disk is nearly full
/// (`MessageStore::keep_room_for_metadata`); a failure to measure is logged, the
/// caller goes on.
pub(crate) fn keep_room_for_metadata(store: &MessageStore) {
    if let Err(e) = store.keep_room_for_metadata() {
        tracing::warn!(error = %e, "measuring the disk failed");
    }
}

/// Key of the commit index openraft last saved (`save_committed`).
const COMMITTED_KEY: &str = "committed";

/// The commit index openraft last saved in `meta` (`None` before the first
/// commit); it may lag the leader's. Errors: `Storage`.
pub(crate) fn saved_committed(meta: &MetaDb) -> Result<Option<LogId>, RaftNodeError> {
    Ok(MetaDb::get::<Option<LogId>>(&meta.raft, COMMITTED_KEY)?.flatten())
}

/// The vote a restarting node resumes with. A node that led a term before it
/// stopped must not lead that term again: its log may have lost a tail it had
/// proposed in that term (a power loss, a damaged tail cut by recovery), and
/// proposing new entries at those log indexes in the same term would give two
/// different entries one log id, which Raft's log matching cannot tell apart (the
/// jepsen corrupt-tail nemesis found exactly that). So its own committed vote comes
/// back uncommitted: same term and candidate, so it still never votes twice in the
/// term, but it has to win a new election (in a higher term) to lead again.
fn resume_vote(mut vote: Vote<NodeId>, node_id: NodeId) -> Vote<NodeId> {
    if vote.committed && vote.leader_id.voted_for() == Some(node_id) {
        vote.committed = false;
    }
    vote
}

/// The commit index a restarted node may re-apply up to: the saved one, but never
/// past its own last entry. After a power loss the log may have lost its unflushed
/// tail while the saved commit index survived; the entries it still holds up to that
/// point are committed (a committed entry is never truncated), the rest it learns
/// from the leader again.
fn clamp_committed(committed: Option<LogId>, last: Option<LogId>) -> Option<LogId> {
    match (committed, last) {
        (Some(c), Some(l)) if l.index < c.index => Some(l),
        (Some(_), None) => None,
        (c, _) => c,
    }
}

/// Runs file-system work (fsyncs, deletions) on tokio's blocking pool, so it never
/// stalls the runtime threads that carry heartbeats.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RaftNodeError> + Send + 'static,
) -> Result<T, RaftNodeError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RaftNodeError::Raft(format!("blocking storage task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restarted_leader_does_not_resume_its_term() {
        let led = Vote::new_committed(5, 1);
        let resumed = resume_vote(led, 1);
        assert!(!resumed.committed);
        assert_eq!(resumed.leader_id, led.leader_id);
        // Another node's leadership, or a vote still being collected, stays as is.
        assert_eq!(resume_vote(led, 2), led);
        let voting = Vote::new(6, 1);
        assert_eq!(resume_vote(voting, 1), voting);
    }

    #[test]
    fn a_saved_commit_index_never_passes_the_last_entry() {
        let (c, l) = (log_id(3, 10), log_id(3, 7));
        assert_eq!(clamp_committed(Some(c), Some(l)), Some(l));
        assert_eq!(clamp_committed(Some(l), Some(c)), Some(l));
        assert_eq!(clamp_committed(Some(c), None), None);
        assert_eq!(clamp_committed(None, Some(l)), None);
    }
}
