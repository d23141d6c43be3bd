//! Applying metadata commands to the group's metadata (sled and the shared copy).

use super::{GroupMeta, StateMachine};
use crate::error::RaftNodeError;
use crate::format;
use crate::meta::{offset_key, MetaDb};
use crate::types::{Command, FifoLease, Response};

impl StateMachine {
    /// Stores FIFO leases that passed the term check: each replaces its queue's
    /// stored lease unless that one has a higher delivery id (a newer delivery).
    fn apply_leases(
        &self,
        meta: &mut GroupMeta,
        leases: Vec<FifoLease>,
    ) -> Result<(), RaftNodeError> {
        for l in leases {
            let key = (l.group.clone(), l.topic.clone(), l.queue_id);
            if meta
                .fifo_leases
                .get(&key)
                .is_some_and(|cur| cur.delivery_id > l.delivery_id)
            {
                continue;
            }
            // Everything below a FIFO delivery is acked or skipped: the group's
            // offset is at least the leased offset, so a new leader adopts the
            // lease even if the last offset commit did not land.
            let cur = meta.offsets.get(&key).copied().unwrap_or(0);
            if l.queue_offset > cur {
                self.db.offsets.insert(
                    offset_key(&l.group, &l.topic, l.queue_id),
                    format::encode_offset(l.queue_offset),
                )?;
                meta.offsets.insert(key.clone(), l.queue_offset);
            }
            let db_key = offset_key(&l.group, &l.topic, l.queue_id);
            self.db.fifo_leases.insert(db_key, format::encode(&l)?)?;
            meta.fifo_leases.insert(key, l);
        }
        Ok(())
    }

    /// Applies a metadata command from an entry of `entry_term`.
    pub(super) fn apply_command(
        &self,
        meta: &mut GroupMeta,
        cmd: Command,
        entry_term: u64,
    ) -> Result<Response, RaftNodeError> {
        match cmd {
            Command::CommitOffsets(commits) => {
                for mut c in commits {
                    // Offsets only move forward: commits from concurrent paths on
                    // the leader may land out of order. (Rewinding a group is a
                    // command of its own.)
                    let key = (c.group.clone(), c.topic.clone(), c.queue_id);
                    if let Some(&cur) = meta.offsets.get(&key) {
                        c.offset = c.offset.max(cur);
                    }
                    self.db.offsets.insert(
                        offset_key(&c.group, &c.topic, c.queue_id),
                        format::encode_offset(c.offset),
                    )?;
                    meta.offsets
                        .insert((c.group, c.topic, c.queue_id), c.offset);
                }
            }
            Command::EnsureTopic(t) => {
                if !meta.topics.contains_key(&t.name) {
                    MetaDb::put(&self.db.topics, &t.name, &t)?;
                    meta.topics.insert(t.name.clone(), t);
                }
            }
            Command::EnsureGroup(g) => {
                if !meta.groups.contains_key(&g.name) {
                    MetaDb::put(&self.db.groups, &g.name, &g)?;
                    meta.groups.insert(g.name.clone(), g);
                }
            }
            Command::FifoLeases(leases) => {
                // Written by earlier releases (and by tests): the proposer's term is
                // the one in each delivery id.
                let stale = leases.iter().find(|l| l.delivery_term() < entry_term);
                if let Some(l) = stale {
                    return Ok(Response::StaleTerm {
                        proposed_term: l.delivery_term(),
                        entry_term,
                    });
                }
                self.apply_leases(meta, leases)?;
            }
            Command::FifoLeasesOfTerm { term, leases } => {
                // The forward-fifo-leases canary (debug builds, tests only) applies
                // a lease from an entry of any term.
                let canary = crate::canary::enabled(crate::canary::Canary::ForwardFifoLeases);
                if term != entry_term && !canary {
                    return Ok(Response::StaleTerm {
                        proposed_term: term,
                        entry_term,
                    });
                }
                self.apply_leases(meta, leases)?;
            }
            Command::UpdateTopic(t) => {
                MetaDb::put(&self.db.topics, &t.name, &t)?;
                meta.topics.insert(t.name.clone(), t);
            }
            Command::DeleteTopic(name) => {
                self.db.topics.remove(&name)?;
                meta.topics.remove(&name);
            }
            Command::UpdateGroup(g) => {
                MetaDb::put(&self.db.groups, &g.name, &g)?;
                meta.groups.insert(g.name.clone(), g);
            }
            Command::DeleteGroup(name) => {
                self.db.groups.remove(&name)?;
                let keys: Vec<_> = meta
                    .offsets
                    .keys()
                    .filter(|k| k.0 == name || k.0.starts_with(&format!("{name}@")))
                    .cloned()
                    .collect();
                for k in keys {
                    self.db.offsets.remove(offset_key(&k.0, &k.1, k.2))?;
                    meta.offsets.remove(&k);
                }
                let leases: Vec<_> = meta
                    .fifo_leases
                    .keys()
                    .filter(|k| k.0 == name || k.0.starts_with(&format!("{name}@")))
                    .cloned()
                    .collect();
                for k in leases {
                    self.db.fifo_leases.remove(offset_key(&k.0, &k.1, k.2))?;
                    meta.fifo_leases.remove(&k);
                }
                meta.groups.remove(&name);
            }
            Command::PurgeThrough { index } => {
                if meta.purge_point.is_none_or(|p| p < index) {
                    MetaDb::put(&self.db.sm, "purge_point", &index)?;
                    meta.purge_point = Some(index);
                    self.purge_point_moved.notify_one();
                }
            }
        }
        Ok(Response::Applied)
    }
}
