//! Snapshots at CommitLog segment boundaries, so that a follower that catches up by
//! snapshot gets every message its leader still holds.
//!
//! A snapshot holds metadata and queue positions only; message bytes stay in the
//! log. A follower that installs a snapshot at log index S continues its log at
//! S + 1, so the snapshot openraft sends must sit exactly where the leader's log
//! begins: any entry between the leader's first retained index and S would never
//! reach the follower. Retention deletes whole segments, so the state machine saves
//! a snapshot each time it applies the first entry of a new segment (the state as of
//! the previous segment's last entry), retention purges the log only through such an
//! index, and the snapshot a node serves is the one at its purge point
//! ([`crate::state_machine::StateMachine`]'s `get_current_snapshot`). One snapshot
//! per segment (1 GiB by default) costs next to nothing; those below the purge
//! point are dropped when the log is purged.

use std::io::Cursor;

use openraft::storage::Snapshot;
use openraft::{BasicNode, RaftSnapshotBuilder, SnapshotMeta, StorageIOError};
use serde::{Deserialize, Serialize};

use crate::error::{any_err, RaftNodeError};
use crate::meta::MetaDb;
use crate::types::{NodeId, StorageError, TypeConfig};

/// openraft's snapshot metadata for this crate's types.
pub type SnapMeta = SnapshotMeta<NodeId, BasicNode>;

/// A snapshot saved at a segment boundary (in sled as [`crate::format`] says,
/// keyed by the big-endian log index it was taken at).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundarySnapshot {
    /// openraft's metadata: last log id, membership, id.
    pub meta: SnapMeta,
    /// The snapshot data (the state machine's encoding).
    pub data: Vec<u8>,
}

/// Saves `snapshot` under its last log index (not flushed: a purge flushes before
/// it deletes anything, and a lost one is taken again when its entries are
/// applied again after a restart). Errors: `Meta`, `Codec`.
pub fn save(db: &MetaDb, snapshot: &BoundarySnapshot) -> Result<(), RaftNodeError> {
    let index = snapshot.meta.last_log_id.map_or(0, |l| l.index);
    db.boundaries
        .insert(index.to_be_bytes(), crate::format::encode(snapshot)?)?;
    Ok(())
}

/// The snapshot saved at exactly `index`, if any. Errors: `Meta`, `Codec`.
pub fn at(db: &MetaDb, index: u64) -> Result<Option<BoundarySnapshot>, RaftNodeError> {
    match db.boundaries.get(index.to_be_bytes())? {
        Some(v) => Ok(Some(crate::format::decode("boundary snapshot", &v)?)),
        None => Ok(None),
    }
}

/// The highest log index at or below `index` with a saved snapshot. Errors: `Meta`.
pub fn latest_at_or_below(db: &MetaDb, index: u64) -> Result<Option<u64>, RaftNodeError> {
    match db.boundaries.range(..=index.to_be_bytes()).next_back() {
        Some(kv) => {
            let (k, _) = kv?;
            Ok(<[u8; 8]>::try_from(k.as_ref()).ok().map(u64::from_be_bytes))
        }
        None => Ok(None),
    }
}

/// Drops the snapshots below `index` (the log no longer starts there); returns how
/// many. Errors: `Meta`.
pub fn remove_below(db: &MetaDb, index: u64) -> Result<usize, RaftNodeError> {
    let keys: Vec<_> = db
        .boundaries
        .range(..index.to_be_bytes())
        .keys()
        .collect::<Result<_, _>>()?;
    for k in &keys {
        db.boundaries.remove(k)?;
    }
    Ok(keys.len())
}

/// Which snapshot a build returns. A build never takes the current state: the
/// snapshot openraft holds must be the one at the purge point, since openraft
/// purges the log through it (`max_in_snapshot_log_to_keep = 0`) and sends it to
/// a follower that needs purged entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildSource {
    /// The boundary snapshot at this log index (newer than the stored one).
    Boundary(u64),
    /// The stored current snapshot stands (never replaced by an older one):
    /// nothing new is built, as openraft already holds it.
    Stored,
    /// No snapshot: one with no last log id, which openraft ignores.
    Nothing,
}

/// Chooses a build's snapshot (no I/O): the boundary at `target` (what retention
/// asked for) if saved and newer than the stored snapshot; else the stored one;
/// else the boundary at `last_purged` (openraft rebuilding a lost snapshot at
/// start); else nothing.
pub fn build_source(
    target: Option<u64>,
    stored_index: Option<u64>,
    last_purged: Option<u64>,
    has_boundary: impl Fn(u64) -> bool,
) -> BuildSource {
    if let Some(t) = target.filter(|&t| has_boundary(t)) {
        if stored_index.is_none_or(|s| s < t) {
            return BuildSource::Boundary(t);
        }
    }
    if stored_index.is_some() {
        return BuildSource::Stored;
    }
    match last_purged.filter(|&p| has_boundary(p)) {
        Some(p) => BuildSource::Boundary(p),
        None => BuildSource::Nothing,
    }
}

/// Returns a chosen snapshot to openraft, first saving it as the node's current
/// snapshot (sled `snapshot_meta` and `snapshot`, flushed); one with no last log
/// id (nothing chosen) is neither saved nor used by openraft.
pub struct SnapshotBuilder {
    /// The snapshot.
    pub snapshot: BoundarySnapshot,
    /// Where.
    pub db: MetaDb,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(
        &mut self,
    ) -> Result<openraft::storage::Snapshot<TypeConfig>, StorageError> {
        let BoundarySnapshot { meta, data } = &self.snapshot;
        if meta.last_log_id.is_some() {
            MetaDb::put(&self.db.sm, "snapshot_meta", meta)
                .and_then(|_| {
                    self.db.sm.insert("snapshot", data.as_slice())?;
                    self.db.flush()
                })
                .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), any_err(e)))?;
        }
        Ok(Snapshot {
            meta: meta.clone(),
            snapshot: Box::new(Cursor::new(data.clone())),
        })
    }
}

/// The builder for `source`: the boundary snapshot it names, else an empty one
/// (for `Stored` and `Nothing`, or a boundary no longer there). Errors: `Meta`,
/// `Codec`.
pub fn builder(db: &MetaDb, source: BuildSource) -> Result<SnapshotBuilder, RaftNodeError> {
    let chosen = match source {
        BuildSource::Boundary(i) => at(db, i)?,
        BuildSource::Stored | BuildSource::Nothing => None,
    };
    Ok(match chosen {
        Some(snapshot) => SnapshotBuilder {
            snapshot,
            db: db.clone(),
        },
        None => empty_builder(db),
    })
}

/// Whether a boundary snapshot is saved at `index` (without reading it).
pub fn has(db: &MetaDb, index: u64) -> bool {
    db.boundaries
        .contains_key(index.to_be_bytes())
        .unwrap_or(false)
}

/// A builder of a snapshot with no last log id, which openraft ignores.
pub fn empty_builder(db: &MetaDb) -> SnapshotBuilder {
    SnapshotBuilder {
        snapshot: BoundarySnapshot {
            meta: SnapMeta {
                last_log_id: None,
                last_membership: Default::default(),
                snapshot_id: "none".into(),
            },
            data: Vec::new(),
        },
        db: db.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(index: u64) -> BoundarySnapshot {
        BoundarySnapshot {
            meta: SnapMeta {
                last_log_id: Some(crate::codec::log_id(1, index)),
                last_membership: Default::default(),
                snapshot_id: format!("b-{index}"),
            },
            data: index.to_le_bytes().to_vec(),
        }
    }

    #[test]
    fn a_build_takes_the_target_boundary_and_never_goes_back() {
        let has = |i| [100, 200, 300].contains(&i);
        use BuildSource::*;
        assert_eq!(
            build_source(Some(200), Some(100), Some(100), has),
            Boundary(200)
        );
        assert_eq!(build_source(Some(200), None, None, has), Boundary(200));
        // Never older than the stored snapshot (e.g. one installed meanwhile).
        assert_eq!(build_source(Some(200), Some(250), Some(250), has), Stored);
        assert_eq!(build_source(Some(200), Some(200), Some(200), has), Stored);
        // A target without a saved boundary, or none: the stored one.
        assert_eq!(build_source(Some(150), Some(100), Some(100), has), Stored);
        assert_eq!(build_source(None, Some(100), Some(100), has), Stored);
        // Nothing stored but the log purged (openraft rebuilding at start).
        assert_eq!(build_source(None, None, Some(300), has), Boundary(300));
        assert_eq!(build_source(None, None, Some(301), has), Nothing);
        assert_eq!(build_source(None, None, None, has), Nothing);
    }

    #[test]
    fn boundaries_are_found_at_or_below_an_index_and_dropped_below_one() {
        let dir = tempfile::tempdir().unwrap();
        let db = MetaDb::open(dir.path()).unwrap();
        assert_eq!(latest_at_or_below(&db, 100).unwrap(), None);
        for i in [10, 300, 256, 2000] {
            save(&db, &snap(i)).unwrap();
        }
        assert_eq!(latest_at_or_below(&db, 9).unwrap(), None);
        assert_eq!(latest_at_or_below(&db, 10).unwrap(), Some(10));
        assert_eq!(latest_at_or_below(&db, 299).unwrap(), Some(256));
        assert_eq!(latest_at_or_below(&db, u64::MAX).unwrap(), Some(2000));
        assert_eq!(at(&db, 256).unwrap().unwrap().data, 256u64.to_le_bytes());
        assert!(at(&db, 257).unwrap().is_none());
        assert_eq!(remove_below(&db, 300).unwrap(), 2);
        assert_eq!(latest_at_or_below(&db, 299).unwrap(), None);
        assert_eq!(latest_at_or_below(&db, 300).unwrap(), Some(300));
    }
}
