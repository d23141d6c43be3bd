//! Applying metadata commands: the rules run on the shared copy under its lock
//! (`ledgermq_meta::apply::apply`, no I/O), then the rows they changed are stored in sled
//! with the lock released, so readers (the broker) never wait on the disk.

use ledgermq_meta::apply::{self, AppliedAt, Canaries, RowChange};

use super::StateMachine;
use crate::error::RaftNodeError;
use crate::format;
use crate::meta::{attempt_key, offset_key, MetaDb};
use crate::types::{Command, Response};

impl StateMachine {
    /// Applies a metadata command from the entry at log `index` of `entry_term`:
    /// the shared copy shows it (as of `index`) as soon as the lock is released,
    /// and its rows are stored before this returns, so openraft records the entry
    /// as applied only after. A reader may see the change before its rows are
    /// stored: a crash in between replays the entry from the log at restart
    /// (applying resumes after the stored `last_applied`). Errors: the metadata
    /// store's.
    pub(super) fn apply_command(
        &self,
        cmd: Command,
        index: u64,
        entry_term: u64,
    ) -> Result<Response, RaftNodeError> {
        let canaries = Canaries {
            // The forward-fifo-leases canary (debug builds, tests only) applies a
            // lease from an entry of any term.
            forward_fifo_leases: crate::canary::enabled(crate::canary::Canary::ForwardFifoLeases),
        };
        let at = AppliedAt {
            instant: std::time::Instant::now(),
            wall_ms: ledgermq_store::store::now_ms(),
        };
        let applied = {
            let mut meta = self.shared.write().unwrap();
            meta.applied_index = Some(index);
            apply::apply(&mut meta, cmd, entry_term, at, canaries)
        };
        self.store_rows(&applied.rows)?;
        Ok(applied.outcome.into())
    }

    /// Stores `rows` in order, each in its tree in the current format.
    fn store_rows(&self, rows: &[RowChange]) -> Result<(), RaftNodeError> {
        let db = &self.db;
        for row in rows {
            match row {
                RowChange::Offset((group, topic, queue_id), offset) => {
                    db.offsets.insert(
                        offset_key(group, topic, *queue_id),
                        format::encode_offset(*offset),
                    )?;
                }
                RowChange::RemoveOffset((group, topic, queue_id)) => {
                    db.offsets.remove(offset_key(group, topic, *queue_id))?;
                }
                RowChange::Lease(l) => {
                    db.fifo_leases.insert(
                        offset_key(&l.group, &l.topic, l.queue_id),
                        format::encode(l)?,
                    )?;
                }
                RowChange::RemoveLease((group, topic, queue_id)) => {
                    db.fifo_leases.remove(offset_key(group, topic, *queue_id))?;
                }
                RowChange::BatchLease(b) => {
                    db.fifo_batches.insert(
                        offset_key(&b.group, &b.topic, b.queue_id),
                        format::encode(b)?,
                    )?;
                }
                RowChange::RemoveBatchLease((group, topic, queue_id)) => {
                    db.fifo_batches
                        .remove(offset_key(group, topic, *queue_id))?;
                }
                RowChange::AclUser(u) => MetaDb::put(&db.acl_users, &u.username, u)?,
                RowChange::RemoveAclUser(name) => {
                    db.acl_users.remove(name)?;
                }
                RowChange::Topic(t) => MetaDb::put(&db.topics, &t.name, t)?,
                RowChange::RemoveTopic(name) => {
                    db.topics.remove(name)?;
                }
                RowChange::Group(g) => MetaDb::put(&db.groups, &g.name, g)?,
                RowChange::RemoveGroup(name) => {
                    db.groups.remove(name)?;
                }
                RowChange::RetryPolicy(group, policy) => {
                    MetaDb::put(&db.retry_policies, group, policy)?;
                }
                RowChange::RemoveRetryPolicy(group) => {
                    db.retry_policies.remove(group)?;
                }
                RowChange::DeliveryAttempt((group, topic, queue_id), offset, attempt) => {
                    db.delivery_attempts.insert(
                        attempt_key(group, topic, *queue_id, *offset),
                        format::encode(attempt)?,
                    )?;
                }
                RowChange::PruneDeliveryAttempts((group, topic, queue_id), below) => {
                    let rows: Vec<_> = if *below == u64::MAX {
                        // Every row of the queue (offset u64::MAX included).
                        db.delivery_attempts
                            .scan_prefix(offset_key(group, topic, *queue_id))
                            .keys()
                            .collect::<Result<_, _>>()?
                    } else {
                        let from = attempt_key(group, topic, *queue_id, 0);
                        let to = attempt_key(group, topic, *queue_id, *below);
                        db.delivery_attempts
                            .range(from..to)
                            .keys()
                            .collect::<Result<_, _>>()?
                    };
                    for k in rows {
                        db.delivery_attempts.remove(k)?;
                    }
                }
                RowChange::PurgePoint(index) => {
                    MetaDb::put(&db.sm, "purge_point", index)?;
                    self.purge_point_moved.notify_one();
                }
            }
        }
        Ok(())
    }
}
