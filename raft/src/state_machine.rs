//! openraft's `RaftStateMachine`: applying a committed entry dispatches its messages
//! into the ConsumeQueues and IndexFile (the store assigns queue offsets in log
//! order, identically on every replica) and applies metadata commands.
//!
//! Metadata (consumer offsets, topic and group configs, last applied log id,
//! membership) lives in sled and is the snapshot, with every queue's next offset;
//! message bytes stay in the log. A follower installing a snapshot continues each
//! queue at the snapshot's next offset.

use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use ledgermq_store::{DispatchedMessage, MessageStore};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, OptionalSend, SnapshotMeta, StorageIOError, StoredMembership};

use crate::error::RaftNodeError;
use crate::format;
use crate::meta::{attempt_key, offset_key, parse_attempt_key, parse_offset_key, MetaDb};
use crate::types::{
    Entry, FifoBatchLease, FifoLease, GroupConfig, LogId, NodeId, Placed, Request, Response,
    StorageError, TopicConfig, TypeConfig,
};

mod commands;
mod snapshot;

pub(crate) use snapshot::SnapshotData;

type Membership = StoredMembership<NodeId, openraft::BasicNode>;

/// The group's metadata and its FIFO lease deadlines (the `ledgermq-meta` crate,
/// whose pure rules this state machine applies).
pub use ledgermq_meta::{GroupMeta, LeaseDeadline, LeaseDeadlines};

/// Metadata shared with readers (the broker); updated on every apply.
pub type SharedMeta = Arc<RwLock<GroupMeta>>;

/// A read-only view of the group's metadata as of the last applied entry: what
/// the broker gets (`crate::RaftNode::shared_meta`); only the state machine
/// writes the metadata, and it holds the write lock only while a command's rules
/// run in memory, never across metadata-store I/O.
#[derive(Clone, Debug)]
pub struct MetaView(SharedMeta);

impl MetaView {
    /// A view of `shared`.
    pub fn new(shared: SharedMeta) -> Self {
        Self(shared)
    }

    /// Locks the metadata for reading. Errors: the lock is poisoned (a panic
    /// while a command was applied).
    pub fn read(&self) -> std::sync::LockResult<std::sync::RwLockReadGuard<'_, GroupMeta>> {
        self.0.read()
    }
}

use crate::error::any_err as io_err;

/// The state machine of one node.
pub struct StateMachine {
    store: Arc<MessageStore>,
    db: MetaDb,
    shared: SharedMeta,
    last_applied: Option<LogId>,
    membership: Membership,
    /// Start offset of the CommitLog segment holding the last applied entry (None
    /// until known, e.g. right after a snapshot was installed).
    last_segment: Option<u64>,
    /// Log index of the segment-boundary snapshot the next build returns
    /// ([`NO_SNAPSHOT_TARGET`]: none set; the current state is built).
    snapshot_target: Arc<AtomicU64>,
    /// Notified when the group's retention point moves.
    purge_point_moved: Arc<tokio::sync::Notify>,
}

/// [`StateMachine::snapshot_target`] when no boundary is set.
pub const NO_SNAPSHOT_TARGET: u64 = u64::MAX;

impl StateMachine {
    /// Loads the metadata from `db` and brings the store's dispatch up to the last
    /// applied entry (ConsumeQueue entries past the store's checkpoint are rebuilt
    /// after a crash; if the log no longer holds them, the last snapshot's queue
    /// positions are reinstalled).
    pub fn open(store: Arc<MessageStore>, db: MetaDb) -> Result<Self, RaftNodeError> {
        let mut last_applied: Option<LogId> =
            MetaDb::get::<Option<LogId>>(&db.sm, "last_applied")?.flatten();
        if let Some(applied) = last_applied {
            let log = store.commit_log();
            if log.next_log_index() <= applied.index && log.first_log_index() <= applied.index {
                // A power loss took the log's unflushed tail, entries this node had
                // applied among them (sled kept the newer last_applied). Continue from
                // what the store still holds and has dispatched; the leader sends
                // the lost entries again and applying them again is idempotent.
                let next = store.dispatched_next_log_index().min(log.next_log_index());
                last_applied = if next > log.first_log_index() {
                    let loc = log.entry_location(next - 1)?;
                    Some(crate::codec::log_id(loc.term, loc.log_index))
                } else {
                    MetaDb::get::<SnapshotMeta<NodeId, openraft::BasicNode>>(
                        &db.sm,
                        "snapshot_meta",
                    )?
                    .and_then(|m| m.last_log_id)
                };
                tracing::warn!(
                    saved = applied.index,
                    resumed = ?last_applied,
                    "the log ends before the last applied entry (lost unflushed tail); applying again from the log"
                );
            }
        }
        let membership: Membership = MetaDb::get(&db.sm, "membership")?.unwrap_or_default();
        let mut meta = GroupMeta::default();
        for kv in db.offsets.iter() {
            let (k, v) = kv?;
            let Some(key) = parse_offset_key(&k) else {
                continue;
            };
            match format::decode_offset(&v) {
                Ok(offset) => {
                    meta.offsets.insert(key, offset);
                }
                Err(e @ RaftNodeError::FormatTooNew { .. }) => return Err(e),
                // As before the format version: a row that is no offset is skipped.
                Err(e) => tracing::warn!(?key, error = %e, "skipping a consumer offset row"),
            }
        }
        for kv in db.topics.iter() {
            let (_, v) = kv?;
            let t: TopicConfig = format::decode("topic config", &v)?;
            meta.topics.insert(t.name.clone(), t);
        }
        for kv in db.groups.iter() {
            let (_, v) = kv?;
            let g: GroupConfig = format::decode("group config", &v)?;
            meta.groups.insert(g.name.clone(), g);
        }
        for kv in db.fifo_leases.iter() {
            let (_, v) = kv?;
            let l: FifoLease = format::decode("FIFO lease", &v)?;
            meta.fifo_leases
                .insert((l.group.clone(), l.topic.clone(), l.queue_id), l);
        }
        for kv in db.fifo_batches.iter() {
            let (_, v) = kv?;
            let b: FifoBatchLease = format::decode("FIFO batch lease", &v)?;
            meta.fifo_batches
                .insert((b.group.clone(), b.topic.clone(), b.queue_id), b);
        }
        for kv in db.acl_users.iter() {
            let (_, v) = kv?;
            let u: ledgermq_meta::AclUser = format::decode("user", &v)?;
            meta.acl_users.insert(u.username.clone(), u);
        }
        for kv in db.delivery_attempts.iter() {
            let (k, v) = kv?;
            let (key, offset) = parse_attempt_key(&k).ok_or_else(|| {
                RaftNodeError::MetadataDamaged("a delivery attempt row's key is malformed".into())
            })?;
            let attempt: u32 = format::decode("delivery attempt", &v)?;
            meta.delivery_attempts
                .entry(key)
                .or_default()
                .insert(offset, attempt);
        }
        for kv in db.retry_policies.iter() {
            let (k, v) = kv?;
            let group = String::from_utf8(k.to_vec()).map_err(|_| {
                RaftNodeError::MetadataDamaged("a retry policy row's key is not UTF-8".into())
            })?;
            meta.retry_policies
                .insert(group, format::decode("retry policy", &v)?);
        }
        if let Some(applied) = last_applied {
            let log = store.commit_log();
            if store.dispatched_next_log_index() < log.first_log_index() {
                // The log no longer holds the next entry to dispatch: a snapshot
                // covers it; continue from the snapshot's queue positions.
                let snap_meta: Option<SnapshotMeta<NodeId, openraft::BasicNode>> =
                    MetaDb::get(&db.sm, "snapshot_meta")?;
                if let (Some(m), Some(bytes)) = (snap_meta, db.sm.get("snapshot")?) {
                    let data = SnapshotData::decode(&bytes)?;
                    store
                        .skip_dispatch_to(m.last_log_id.map_or(0, |l| l.index + 1), &data.queues)?;
                }
            }
            if store.dispatched_next_log_index() <= applied.index
                && log.next_log_index() > applied.index
            {
                // ConsumeQueue entries lost with the store's last checkpoint: rebuild.
                store.dispatch_through(applied.index)?;
            }
        }
        // The store may have dispatched past what sled says was applied (sled is not
        // flushed on every apply). openraft will apply those entries again, so their
        // ConsumeQueue entries are dropped and placed again then, in order: a
        // snapshot taken in between must see queue positions that match its index.
        let next_applied =
            last_applied.map_or(store.commit_log().first_log_index(), |l| l.index + 1);
        if store.dispatched_next_log_index() > next_applied
            && store.commit_log().first_log_index() <= next_applied
        {
            store.rebuild_consume_queues_from(next_applied)?;
        }
        meta.applied_index = last_applied.map(|l| l.index);
        meta.purge_point = MetaDb::get::<u64>(&db.sm, "purge_point")?;
        Ok(Self {
            store,
            db,
            shared: Arc::new(RwLock::new(meta)),
            last_applied,
            membership,
            last_segment: None,
            snapshot_target: Arc::new(AtomicU64::new(NO_SNAPSHOT_TARGET)),
            purge_point_moved: Arc::new(tokio::sync::Notify::new()),
        })
    }

    /// Notified each time an applied [`crate::types::Command::PurgeThrough`] moves the group's
    /// retention point (the node's retention loop then purges at once).
    pub fn purge_point_moved(&self) -> Arc<tokio::sync::Notify> {
        self.purge_point_moved.clone()
    }

    /// The metadata readers see.
    pub fn shared(&self) -> SharedMeta {
        self.shared.clone()
    }

    /// Where the next snapshot build comes from: a log index with a saved
    /// segment-boundary snapshot (`crate::boundary`) makes the build return that
    /// snapshot, so the snapshot openraft holds (and sends to a lagging follower) is
    /// the one at the index the log is about to be purged through. Retention sets it
    /// before it asks openraft for a snapshot.
    pub fn snapshot_target(&self) -> Arc<AtomicU64> {
        self.snapshot_target.clone()
    }

    /// Start offset of the CommitLog segment holding entry `index`, if this node's
    /// log holds it.
    fn segment_of(&self, index: u64) -> Option<u64> {
        let log = self.store.commit_log();
        let loc = log.entry_location(index).ok()?;
        log.segments()
            .find(loc.physical_offset)
            .map(|f| f.start_offset())
    }

    /// Before applying entry `index`: if it opens a new segment, saves a snapshot of
    /// the state as of the previous entry (the last of the previous segment).
    fn snapshot_at_boundary(&mut self, index: u64) -> Result<(), RaftNodeError> {
        let seg = self.segment_of(index);
        if let (Some(prev), Some(seg)) = (self.last_applied, seg) {
            let prev_seg = self.last_segment.or_else(|| self.segment_of(prev.index));
            if prev_seg.is_some_and(|p| p != seg) {
                assert_eq!(
                    self.store.dispatched_next_log_index(),
                    prev.index + 1,
                    "a boundary snapshot must hold exactly what was dispatched"
                );
                let snapshot = crate::boundary::BoundarySnapshot {
                    meta: SnapshotMeta {
                        last_log_id: Some(prev),
                        last_membership: self.membership.clone(),
                        snapshot_id: format!("{}-{}-segment", prev.leader_id.term, prev.index),
                    },
                    data: self.snapshot_data().encode()?,
                };
                crate::boundary::save(&self.db, &snapshot)?;
            }
        }
        self.last_segment = seg;
        Ok(())
    }

    /// Dispatches entry `index`: by log index, in order, it places exactly this
    /// entry's messages (nothing if a restart already dispatched it). Applied
    /// entries are always in the local log (committed ⇒ appended here); dispatch
    /// reads them from it. Safe to call again after a failure (a placement already
    /// made is reused).
    fn dispatch(&mut self, index: u64) -> Result<Vec<DispatchedMessage>, RaftNodeError> {
        self.snapshot_at_boundary(index)?;
        Ok(self.store.dispatch_through(index)?)
    }

    /// [`Self::dispatch`] despite a full disk (ENOSPC): a committed entry is the
    /// same on every replica, so failing it would stop every replica at the same
    /// entry at every restart. The disk reserve is given up first; past that it
    /// waits for space (an operator must free some: retention runs queue behind
    /// this apply). The node stays up meanwhile (reads, Raft), and new messages
    /// are refused (`MessageStore::check_room_for_writes`).
    async fn dispatch_when_room(
        &mut self,
        index: u64,
    ) -> Result<Vec<DispatchedMessage>, RaftNodeError> {
        let mut wait = std::time::Duration::from_millis(100);
        loop {
            match self.dispatch(index) {
                Err(RaftNodeError::Store(e)) if e.is_no_space() => {
                    if self.store.release_disk_reserve()? {
                        continue;
                    }
                    tracing::error!(index, error = %e, "no space to apply a committed entry; free space: retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(std::time::Duration::from_secs(5));
                }
                other => return other,
            }
        }
    }

    fn apply_one(
        &mut self,
        entry: Entry,
        placed: Vec<DispatchedMessage>,
    ) -> Result<Response, RaftNodeError> {
        let index = entry.log_id.index;
        assert!(
            placed.iter().all(|p| p.log_index == index),
            "entry {index} applied with another entry's placements"
        );
        let response = match entry.payload {
            EntryPayload::Normal(Request::Messages(_)) => Response::Messages(
                placed
                    .into_iter()
                    .map(|p| Placed {
                        queue_id: p.queue_id,
                        queue_offset: p.queue_offset,
                        physical_offset: p.physical_offset,
                    })
                    .collect(),
            ),
            EntryPayload::Normal(Request::Command(cmd)) => {
                self.apply_command(cmd, index, entry.log_id.leader_id.term)?
            }
            EntryPayload::Blank => Response::Applied,
            EntryPayload::Membership(m) => {
                self.membership = StoredMembership::new(Some(entry.log_id), m);
                MetaDb::put(&self.db.sm, "membership", &self.membership)?;
                Response::Applied
            }
        };
        self.last_applied = Some(entry.log_id);
        Ok(response)
    }

    fn snapshot_data(&self) -> SnapshotData {
        SnapshotData {
            meta: self.shared.read().unwrap().clone(),
            queues: self.store.queue_next_offsets(),
        }
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = crate::boundary::SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, Membership), StorageError> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut out = Vec::new();
        let mut last = None;
        for entry in entries {
            let id = entry.log_id;
            // Applies go forward, one entry at a time: checked before the entry is
            // dispatched or a boundary snapshot is taken for it.
            assert!(
                self.last_applied.is_none_or(|l| l.index < id.index),
                "entry {} applied after {:?}: applies go forward",
                id.index,
                self.last_applied
            );
            let placed = self
                .dispatch_when_room(id.index)
                .await
                .map_err(|e| StorageIOError::apply(id, io_err(e)))?;
            out.push(
                self.apply_one(entry, placed)
                    .map_err(|e| StorageIOError::apply(id, io_err(e)))?,
            );
            last = Some(id);
        }
        if let Some(id) = last {
            // Entries other than commands leave the maps as they were: readers see
            // them as of the batch's last entry from here on.
            self.shared.write().unwrap().applied_index = Some(id.index);
            // Not fsynced: on restart, entries after the persisted last_applied are
            // applied again, and applying is idempotent (dispatch skips what is
            // dispatched; commands set values).
            MetaDb::put(&self.db.sm, "last_applied", &Some(id))
                .map_err(|e| StorageIOError::apply(id, io_err(e)))?;
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        use crate::boundary::{build_source, builder, BuildSource};
        let target = Some(
            self.snapshot_target
                .swap(NO_SNAPSHOT_TARGET, Ordering::AcqRel),
        )
        .filter(|&t| t != NO_SNAPSHOT_TARGET);
        let choose = || -> Result<Self::SnapshotBuilder, RaftNodeError> {
            // The stored snapshot counts only whole (its meta and its data).
            let stored = MetaDb::get::<crate::boundary::SnapMeta>(&self.db.sm, "snapshot_meta")?
                .filter(|_| self.db.sm.contains_key("snapshot").unwrap_or(false));
            let purged: Option<LogId> =
                MetaDb::get::<Option<LogId>>(&self.db.raft, "last_purged")?.flatten();
            let source = build_source(
                target,
                stored.map(|m| m.last_log_id.map_or(0, |l| l.index)),
                purged.map(|p| p.index),
                |i| crate::boundary::has(&self.db, i),
            );
            if let Some(t) = target.filter(|&t| source != BuildSource::Boundary(t)) {
                tracing::warn!(
                    target = t,
                    ?source,
                    "the snapshot asked for is not the one built"
                );
            }
            builder(&self.db, source)
        };
        choose().unwrap_or_else(|e| {
            tracing::error!(error = %e, "reading snapshots failed; building none");
            crate::boundary::empty_builder(&self.db)
        })
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, openraft::BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let sig = Some(meta.signature());
        let bytes = snapshot.into_inner();
        let fail = |e: RaftNodeError| {
            StorageError::from(StorageIOError::read_snapshot(sig.clone(), io_err(e)))
        };
        let data = SnapshotData::decode(&bytes).map_err(fail)?;
        let next = meta.last_log_id.map_or(0, |l| l.index + 1);
        self.store
            .skip_dispatch_to(next, &data.queues)
            .map_err(|e| fail(e.into()))?;
        // The leader purged through this snapshot's index: the group's point is at
        // least there.
        let purge_point = self
            .shared
            .read()
            .unwrap()
            .purge_point
            .max(meta.last_log_id.map(|l| l.index));
        let persist = || -> Result<(), RaftNodeError> {
            self.db.offsets.clear()?;
            self.db.topics.clear()?;
            self.db.groups.clear()?;
            self.db.fifo_leases.clear()?;
            self.db.retry_policies.clear()?;
            self.db.delivery_attempts.clear()?;
            self.db.fifo_batches.clear()?;
            self.db.acl_users.clear()?;
            for u in data.meta.acl_users.values() {
                MetaDb::put(&self.db.acl_users, &u.username, u)?;
            }
            for b in data.meta.fifo_batches.values() {
                self.db.fifo_batches.insert(
                    offset_key(&b.group, &b.topic, b.queue_id),
                    format::encode(b)?,
                )?;
            }
            for ((g, t, q), attempts) in &data.meta.delivery_attempts {
                for (offset, attempt) in attempts {
                    self.db
                        .delivery_attempts
                        .insert(attempt_key(g, t, *q, *offset), format::encode(attempt)?)?;
                }
            }
            for (group, policy) in &data.meta.retry_policies {
                MetaDb::put(&self.db.retry_policies, group, policy)?;
            }
            for l in data.meta.fifo_leases.values() {
                self.db.fifo_leases.insert(
                    offset_key(&l.group, &l.topic, l.queue_id),
                    format::encode(l)?,
                )?;
            }
            for ((g, t, q), off) in &data.meta.offsets {
                self.db
                    .offsets
                    .insert(offset_key(g, t, *q), format::encode_offset(*off))?;
            }
            for t in data.meta.topics.values() {
                MetaDb::put(&self.db.topics, &t.name, t)?;
            }
            for g in data.meta.groups.values() {
                MetaDb::put(&self.db.groups, &g.name, g)?;
            }
            MetaDb::put(&self.db.sm, "last_applied", &meta.last_log_id)?;
            MetaDb::put(&self.db.sm, "membership", &meta.last_membership)?;
            MetaDb::put(&self.db.sm, "snapshot_meta", meta)?;
            if let Some(p) = purge_point {
                MetaDb::put(&self.db.sm, "purge_point", &p)?;
            }
            self.db.sm.insert("snapshot", bytes.as_slice())?;
            // The log restarts right after it: the snapshot to serve from here.
            crate::boundary::save(
                &self.db,
                &crate::boundary::BoundarySnapshot {
                    meta: meta.clone(),
                    data: bytes.clone(),
                },
            )?;
            self.db.flush()
        };
        persist().map_err(fail)?;
        *self.shared.write().unwrap() = GroupMeta {
            applied_index: meta.last_log_id.map(|l| l.index),
            purge_point,
            ..data.meta
        };
        self.last_applied = meta.last_log_id;
        self.last_segment = None;
        self.membership = meta.last_membership.clone();
        tracing::info!(
            last_log_id = ?meta.last_log_id,
            "installed a snapshot from the leader: the log continues after it"
        );
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let read = || -> Result<Option<Snapshot<TypeConfig>>, RaftNodeError> {
            // The latest snapshot built (always the one at the purge point, see
            // `get_snapshot_builder`) or installed.
            let Some(meta) = MetaDb::get::<SnapshotMeta<NodeId, openraft::BasicNode>>(
                &self.db.sm,
                "snapshot_meta",
            )?
            else {
                return Ok(None);
            };
            let data = self
                .db
                .sm
                .get("snapshot")?
                .map(|v| v.to_vec())
                .unwrap_or_default();
            Ok(Some(Snapshot {
                meta,
                snapshot: Box::new(Cursor::new(data)),
            }))
        };
        read().map_err(|e| StorageIOError::read_snapshot(None, io_err(e)).into())
    }
}
