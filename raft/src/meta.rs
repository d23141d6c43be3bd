//! The node's small durable metadata in sled: committed and purged log ids, and
//! the state machine's metadata (consumer offsets, topic and group configs, last
//! applied log id, membership, current snapshot). Message bytes never go here,
//! nor does the Raft vote (`crate::vote_file`: sled silently rolls back past a
//! damaged page, and a forgotten vote can elect two leaders in one term). A store
//! written by an earlier release keeps its vote under the `vote` key here; it is
//! moved to the vote file at the first start (`crate::node` opening the storage).

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::RaftNodeError;

/// Key/value trees of one node's metadata database.
#[derive(Clone)]
pub struct MetaDb {
    db: sled::Db,
    /// Raft log-store keys: `committed`, `last_purged`; `vote` in stores written
    /// before the vote file.
    pub raft: sled::Tree,
    /// State machine keys: `last_applied`, `membership`, `snapshot`, `snapshot_meta`.
    pub sm: sled::Tree,
    /// `group \0 topic \0 queue id` → next queue offset to consume (u64 big-endian).
    pub offsets: sled::Tree,
    /// Topic name → `TopicConfig`.
    pub topics: sled::Tree,
    /// Group name → `GroupConfig`.
    pub groups: sled::Tree,
    /// Offset key (as `offsets`) → the queue's current `FifoLease`.
    pub fifo_leases: sled::Tree,
    /// Group name → its `RetryPolicy` (groups given one; a tree earlier
    /// releases never open).
    pub retry_policies: sled::Tree,
    /// [`attempt_key`] → the highest delivery attempt recorded for that message
    /// (u32; a tree earlier releases never open).
    pub delivery_attempts: sled::Tree,
    /// Offset key (as `offsets`) → the queue's `FifoBatchLease` (queues whose
    /// last lease was a batch; a tree earlier releases never open).
    pub fifo_batches: sled::Tree,
    /// Username → its `AclUser` (a tree earlier releases never open).
    pub acl_users: sled::Tree,
    /// Log index (u64 big-endian) → snapshot taken at that segment boundary
    /// (`crate::boundary`).
    pub boundaries: sled::Tree,
}

/// fsyncs what sled creates with a database and never fsyncs itself: its `conf`
/// file (a power loss before the kernel wrote it back, about 30 s, left a database
/// sled refuses to open: found by the jepsen power-loss runs), and the directories
/// `dir/blobs`, `dir` and `dir`'s parent, so the entries made in them survive too.
/// Its `db` file is fsynced by every flush.
fn sync_created(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir.join("conf"))?.sync_all()?;
    for d in [dir.join("blobs"), dir.to_path_buf()] {
        std::fs::File::open(d)?.sync_all()?;
    }
    match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => std::fs::File::open(p)?.sync_all(),
        _ => Ok(()),
    }
}

impl MetaDb {
    /// Opens (creating) the database in `dir`. Errors: `MetadataDamaged` when
    /// sled reports corruption, `Meta` otherwise.
    pub fn open(dir: &Path) -> Result<Self, RaftNodeError> {
        // No periodic background flush: sled's flush stalls every insert while it
        // runs (tens of ms here), which would stall every apply. Durability comes from
        // explicit flushes where Raft needs them (purge point, snapshot,
        // shutdown); what the state machine writes between them is re-derived on
        // restart by re-applying the log from the last persisted `last_applied`.
        let db = sled::Config::new()
            .path(dir)
            .flush_every_ms(None)
            .open()
            .map_err(damage_of)?;
        sync_created(dir).map_err(sled::Error::Io)?;
        Ok(Self {
            raft: db.open_tree("raft").map_err(damage_of)?,
            sm: db.open_tree("sm").map_err(damage_of)?,
            offsets: db.open_tree("offsets").map_err(damage_of)?,
            topics: db.open_tree("topics").map_err(damage_of)?,
            groups: db.open_tree("groups").map_err(damage_of)?,
            fifo_leases: db.open_tree("fifo_leases").map_err(damage_of)?,
            retry_policies: db.open_tree("retry_policies").map_err(damage_of)?,
            delivery_attempts: db.open_tree("delivery_attempts").map_err(damage_of)?,
            fifo_batches: db.open_tree("fifo_batches").map_err(damage_of)?,
            acl_users: db.open_tree("acl_users").map_err(damage_of)?,
            boundaries: db.open_tree("boundary_snapshots").map_err(damage_of)?,
            db,
        })
    }

    /// Reads every row of every tree, so that sled checks every page it holds
    /// now, at start, rather than at some later read in the middle of an apply.
    /// Returns the rows read. Errors: `MetadataDamaged` when sled reports
    /// corruption, `Meta` for its other failures.
    pub fn scan(&self) -> Result<usize, RaftNodeError> {
        let mut rows = 0;
        for name in self.db.tree_names() {
            let tree = self.db.open_tree(&name).map_err(damage_of)?;
            for kv in tree.iter() {
                kv.map_err(damage_of)?;
                rows += 1;
            }
        }
        Ok(rows)
    }

    /// Durably writes everything inserted so far (sled's `flush`: writes and fsyncs).
    pub fn flush(&self) -> Result<(), RaftNodeError> {
        self.db.flush()?;
        Ok(())
    }

    /// Reads and decodes `key` of `tree` (any format version this release reads:
    /// [`crate::format`]).
    pub fn get<T: DeserializeOwned>(
        tree: &sled::Tree,
        key: &str,
    ) -> Result<Option<T>, RaftNodeError> {
        match tree.get(key)? {
            Some(v) => Ok(Some(crate::format::decode(key, &v)?)),
            None => Ok(None),
        }
    }

    /// Encodes (in the current format version) and writes `value` at `key` of
    /// `tree` (not flushed).
    pub fn put<T: Serialize>(tree: &sled::Tree, key: &str, value: &T) -> Result<(), RaftNodeError> {
        tree.insert(key, crate::format::encode(value)?)?;
        Ok(())
    }
}

/// A sled error as this crate reports it: corruption sled found in its own
/// files is `MetadataDamaged`, anything else `Meta`.
pub fn damage_of(e: sled::Error) -> RaftNodeError {
    match e {
        sled::Error::Corruption { .. } => RaftNodeError::MetadataDamaged(format!("sled: {e}")),
        e => RaftNodeError::Meta(e),
    }
}

/// The sled key of a consumer offset.
pub fn offset_key(group: &str, topic: &str, queue_id: i32) -> Vec<u8> {
    let mut k = Vec::with_capacity(group.len() + topic.len() + 6);
    k.extend_from_slice(group.as_bytes());
    k.push(0);
    k.extend_from_slice(topic.as_bytes());
    k.push(0);
    k.extend_from_slice(&queue_id.to_be_bytes());
    k
}

/// Key of a message's delivery attempt row: its queue's [`offset_key`], then the
/// queue offset (u64 big-endian), so one queue's rows sort by offset.
pub fn attempt_key(group: &str, topic: &str, queue_id: i32, queue_offset: u64) -> Vec<u8> {
    let mut k = offset_key(group, topic, queue_id);
    k.extend_from_slice(&queue_offset.to_be_bytes());
    k
}

/// Splits a delivery attempt key back into ((group, topic, queue id), queue offset).
pub fn parse_attempt_key(k: &[u8]) -> Option<((String, String, i32), u64)> {
    let (queue, offset) = k.split_at_checked(k.len().checked_sub(8)?)?;
    Some((
        parse_offset_key(queue)?,
        u64::from_be_bytes(offset.try_into().ok()?),
    ))
}

/// Splits an offset key back into (group, topic, queue id).
pub fn parse_offset_key(k: &[u8]) -> Option<(String, String, i32)> {
    let mut parts = k.splitn(3, |&b| b == 0);
    let group = std::str::from_utf8(parts.next()?).ok()?.to_owned();
    let topic = std::str::from_utf8(parts.next()?).ok()?.to_owned();
    let q = parts.next()?;
    Some((group, topic, i32::from_be_bytes(q.try_into().ok()?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_keys_round_trip_and_sort_by_offset() {
        let k = attempt_key("g1", "TopicA", 7, 300);
        assert_eq!(
            parse_attempt_key(&k),
            Some((("g1".into(), "TopicA".into(), 7), 300))
        );
        assert!(attempt_key("g1", "TopicA", 7, 299) < k);
        assert!(k < attempt_key("g1", "TopicA", 7, 256 * 256));
        assert_eq!(parse_attempt_key(b"short"), None);
    }

    #[test]
    fn offset_keys_round_trip() {
        let k = offset_key("g1", "TopicA", 7);
        assert_eq!(
            parse_offset_key(&k),
            Some(("g1".into(), "TopicA".into(), 7))
        );
    }
}
