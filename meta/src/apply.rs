//! The metadata state machine's rules: [`apply`] changes the group's metadata in
//! memory for one committed command and lists the rows to store, with no I/O.
//! The Raft layer's thin persistence (`state_machine/commands.rs`) takes the
//! readers' lock only around it and writes the rows to sled after releasing it,
//! so no reader waits on the disk.

use std::time::{Duration, Instant};

use crate::acl::AclUser;
use crate::command::{Command, FifoBatchLease, FifoLease, TimedFifoLease};
use crate::config::{GroupConfig, TopicConfig};
use crate::retry::RetryPolicy;
use crate::state::{GroupMeta, LeaseDeadline, QueueKey};

/// What a command did to the metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Applied (possibly changing nothing, as an offset that does not move).
    Applied,
    /// A command bound to the term of the leader that proposed it reached the
    /// log in another term's entry and was not applied.
    StaleTerm {
        /// The term the command was decided in.
        proposed_term: u64,
        /// The term of the entry that carried it.
        entry_term: u64,
    },
}

/// One stored metadata row a command set or removed, in the order it did so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowChange {
    /// The next queue offset of a consumer on a queue.
    Offset(QueueKey, u64),
    /// A consumer's offset on a queue removed.
    RemoveOffset(QueueKey),
    /// A queue's FIFO delivery in flight.
    Lease(FifoLease),
    /// A queue's FIFO lease removed.
    RemoveLease(QueueKey),
    /// A queue's FIFO deliveries in flight, as a batch.
    BatchLease(FifoBatchLease),
    /// A queue's FIFO batch lease removed.
    RemoveBatchLease(QueueKey),
    /// A topic's config.
    Topic(TopicConfig),
    /// A topic removed.
    RemoveTopic(String),
    /// A consumer group's config.
    Group(GroupConfig),
    /// A consumer group removed.
    RemoveGroup(String),
    /// A consumer group's retry policy (group name, policy).
    RetryPolicy(String, RetryPolicy),
    /// A consumer group's retry policy removed.
    RemoveRetryPolicy(String),
    /// The highest delivery attempt recorded for a message (its queue, queue
    /// offset, attempt).
    DeliveryAttempt(QueueKey, u64, u32),
    /// A queue's delivery attempts below a queue offset removed (`u64::MAX`:
    /// all of them).
    PruneDeliveryAttempts(QueueKey, u64),
    /// The group's retention point (a Raft log index).
    PurgePoint(u64),
    /// A user and its permissions, as they are now.
    AclUser(AclUser),
    /// A user removed.
    RemoveAclUser(String),
}

/// What applying one command did: the answer for its proposer and the rows to
/// store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// `Applied`, or `StaleTerm` when a term-bound command reached the log in
    /// another term's entry (then nothing changed and `rows` is empty).
    pub outcome: Outcome,
    /// The rows to store, in order.
    pub rows: Vec<RowChange>,
}

/// Test-only switches (the store's `canary` module) that change a rule; the caller
/// reads them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Canaries {
    /// Apply a FIFO lease from an entry of any term (`forward-fifo-leases`).
    pub forward_fifo_leases: bool,
}

/// How far this member's wall clock may be ahead of the deciding leader's
/// before a timed lease applied late is cut short: a timed lease is held at most
/// this long past its wall-clock deadline as this member reads it
/// ([`timed_lease_left_ms`]).
pub const LEASE_CLOCK_SKEW_ALLOWANCE_MS: u64 = 60_000;

/// The longest time left a timed lease is given, ms: the longest invisible
/// duration a client may ask (12 h).
pub const LEASE_TIME_LEFT_MAX_MS: u64 = 12 * 3_600_000;

/// When this member applies the entry: its monotonic instant and its wall clock
/// (ms since the Unix epoch), the two inputs of a timed lease's deadline.
#[derive(Debug, Clone, Copy)]
pub struct AppliedAt {
    /// This member's monotonic clock.
    pub instant: Instant,
    /// This member's wall clock, ms since the Unix epoch.
    pub wall_ms: i64,
}

/// Applies `cmd`, committed in an entry of `entry_term`, to `meta`; `at` is when
/// this node applies it (a timed lease's time left starts there). No I/O.
pub fn apply(
    meta: &mut GroupMeta,
    cmd: Command,
    entry_term: u64,
    at: AppliedAt,
    canaries: Canaries,
) -> Applied {
    let mut rows = Vec::new();
    match cmd {
        Command::CommitOffsets(commits) => {
            for c in commits {
                // Offsets only move forward: commits from concurrent paths on the
                // leader may land out of order. (Rewinding a group is
                // `ResetOffsets`.)
                let key = (c.group, c.topic, c.queue_id);
                let offset = meta
                    .offsets
                    .get(&key)
                    .map_or(c.offset, |&cur| c.offset.max(cur));
                meta.offsets.insert(key.clone(), offset);
                rows.push(RowChange::Offset(key.clone(), offset));
                prune_attempts(meta, &key, offset, &mut rows);
            }
        }
        Command::DeliveryAttempts(queues) => {
            for q in queues {
                let key = (q.group, q.topic, q.queue_id);
                // Messages the group's offset has passed are consumed.
                let consumed = meta.offsets.get(&key).copied().unwrap_or(0);
                for (offset, attempt) in q.attempts {
                    if offset < consumed || attempt == 0 {
                        continue;
                    }
                    let queue = meta.delivery_attempts.entry(key.clone()).or_default();
                    let kept = queue.entry(offset).or_insert(attempt);
                    if attempt >= *kept {
                        *kept = attempt;
                        rows.push(RowChange::DeliveryAttempt(key.clone(), offset, attempt));
                    }
                }
            }
        }
        // Auto-creation never overrides an admin's config committed just before.
        Command::EnsureTopic(t) => {
            if !meta.topics.contains_key(&t.name) {
                meta.topics.insert(t.name.clone(), t.clone());
                rows.push(RowChange::Topic(t));
            }
        }
        Command::EnsureGroup(g) => {
            if !meta.groups.contains_key(&g.name) {
                meta.groups.insert(g.name.clone(), g.clone());
                rows.push(RowChange::Group(g));
            }
        }
        Command::FifoLeases(leases) => {
            // Written by earlier releases (and by tests): the proposer's term is
            // the one in each delivery id.
            if let Some(l) = leases.iter().find(|l| l.delivery_term() < entry_term) {
                return stale(l.delivery_term(), entry_term);
            }
            apply_leases(meta, leases, &mut rows);
        }
        Command::FifoLeasesOfTerm { term, leases } => {
            if term != entry_term && !canaries.forward_fifo_leases {
                return stale(term, entry_term);
            }
            apply_leases(meta, leases, &mut rows);
        }
        Command::FifoLeasesTimed { term, leases } => {
            if term != entry_term && !canaries.forward_fifo_leases {
                return stale(term, entry_term);
            }
            apply_timed_leases(meta, leases, at, &mut rows);
        }
        Command::FifoBatchLeases { term, batches } => {
            if term != entry_term && !canaries.forward_fifo_leases {
                return stale(term, entry_term);
            }
            batches::apply_batches(meta, batches, at, &mut rows);
        }
        Command::PutAclUser {
            username,
            secret_key,
            admin,
        } => {
            let user = meta
                .acl_users
                .entry(username.clone())
                .or_insert_with(|| AclUser::new(&username, secret_key.expose(), admin));
            user.secret_key = secret_key;
            user.admin = admin;
            rows.push(RowChange::AclUser(user.clone()));
        }
        Command::SetAclPerm {
            username,
            resource,
            perm,
        } => {
            if let Some(user) = meta.acl_users.get_mut(&username) {
                user.set_perm(&resource, perm);
                rows.push(RowChange::AclUser(user.clone()));
            }
        }
        Command::CreateAclUser(user) => {
            if !meta.acl_users.contains_key(&user.username) {
                meta.acl_users.insert(user.username.clone(), user.clone());
                rows.push(RowChange::AclUser(user));
            }
        }
        Command::DeleteAclUser(username) => {
            if meta.acl_users.remove(&username).is_some() {
                rows.push(RowChange::RemoveAclUser(username));
            }
        }
        Command::UpdateTopic(t) => {
            meta.topics.insert(t.name.clone(), t.clone());
            rows.push(RowChange::Topic(t));
        }
        Command::DeleteTopic(name) => {
            meta.topics.remove(&name);
            rows.push(RowChange::RemoveTopic(name));
        }
        Command::UpdateGroup(g) => {
            // The whole config is replaced: a policy given before goes.
            remove_retry_policy(meta, &g.name, &mut rows);
            meta.groups.insert(g.name.clone(), g.clone());
            rows.push(RowChange::Group(g));
        }
        Command::UpdateGroupWithRetryPolicy {
            group,
            retry_policy,
        } => {
            meta.groups.insert(group.name.clone(), group.clone());
            meta.retry_policies
                .insert(group.name.clone(), retry_policy.clone());
            rows.push(RowChange::RetryPolicy(group.name.clone(), retry_policy));
            rows.push(RowChange::Group(group));
        }
        Command::DeleteGroup(name) => {
            // The group's own keys and its broadcasting consumers' (`group@client`).
            let owned = |k: &QueueKey| k.0 == name || k.0.starts_with(&format!("{name}@"));
            let offsets: Vec<QueueKey> =
                meta.offsets.keys().filter(|k| owned(k)).cloned().collect();
            for k in offsets {
                meta.offsets.remove(&k);
                rows.push(RowChange::RemoveOffset(k));
            }
            let leases: Vec<QueueKey> = meta
                .fifo_leases
                .keys()
                .filter(|k| owned(k))
                .cloned()
                .collect();
            for k in leases {
                meta.fifo_leases.remove(&k);
                meta.lease_deadlines.0.remove(&k);
                rows.push(RowChange::RemoveLease(k));
            }
            let batched: Vec<QueueKey> = meta
                .fifo_batches
                .keys()
                .filter(|k| owned(k))
                .cloned()
                .collect();
            for k in batched {
                batches::remove_batch(meta, &k, &mut rows);
            }
            let attempted: Vec<QueueKey> = meta
                .delivery_attempts
                .keys()
                .filter(|k| owned(k))
                .cloned()
                .collect();
            for k in attempted {
                prune_attempts(meta, &k, u64::MAX, &mut rows);
            }
            remove_retry_policy(meta, &name, &mut rows);
            meta.groups.remove(&name);
            rows.push(RowChange::RemoveGroup(name));
        }
        Command::ResetOffsets(resets) => {
            for r in resets {
                let key = (r.group, r.topic, r.queue_id);
                meta.offsets.insert(key.clone(), r.offset);
                rows.push(RowChange::Offset(key.clone(), r.offset));
                // Messages consumed again count their deliveries from 1.
                prune_attempts(meta, &key, u64::MAX, &mut rows);
                // The queue's FIFO delivery in flight is void: a new leader must
                // not adopt it (nor its offset, which `store_lease` raised to).
                if meta.fifo_leases.remove(&key).is_some() {
                    meta.lease_deadlines.0.remove(&key);
                    rows.push(RowChange::RemoveLease(key.clone()));
                }
                batches::remove_batch(meta, &key, &mut rows);
            }
        }
        Command::PurgeThrough { index } => {
            // The retention point only moves forward.
            if meta.purge_point.is_none_or(|p| p < index) {
                meta.purge_point = Some(index);
                rows.push(RowChange::PurgePoint(index));
            }
        }
    }
    Applied {
        outcome: Outcome::Applied,
        rows,
    }
}

/// Drops `key`'s delivery attempts below queue offset `below` (`u64::MAX`: all).
fn prune_attempts(meta: &mut GroupMeta, key: &QueueKey, below: u64, rows: &mut Vec<RowChange>) {
    let Some(queue) = meta.delivery_attempts.get_mut(key) else {
        return;
    };
    if queue.first_key_value().is_none_or(|(&o, _)| o >= below) {
        return;
    }
    if below == u64::MAX {
        queue.clear();
    } else {
        *queue = queue.split_off(&below);
    }
    if queue.is_empty() {
        meta.delivery_attempts.remove(key);
    }
    rows.push(RowChange::PruneDeliveryAttempts(key.clone(), below));
}

fn remove_retry_policy(meta: &mut GroupMeta, group: &str, rows: &mut Vec<RowChange>) {
    if meta.retry_policies.remove(group).is_some() {
        rows.push(RowChange::RemoveRetryPolicy(group.to_owned()));
    }
}

fn stale(proposed_term: u64, entry_term: u64) -> Applied {
    Applied {
        outcome: Outcome::StaleTerm {
            proposed_term,
            entry_term,
        },
        rows: Vec::new(),
    }
}

/// Stores FIFO leases that passed the term check: each replaces its queue's
/// lease unless that one has a higher delivery id (a newer delivery). A lease
/// stored here has no monotonic deadline (a lease before it may have had one).
fn apply_leases(meta: &mut GroupMeta, leases: Vec<FifoLease>, rows: &mut Vec<RowChange>) {
    for l in leases {
        if let Some(key) = store_lease(meta, l, rows) {
            meta.lease_deadlines.0.remove(&key);
        }
    }
}

/// The time a timed lease applied at `at` is held, ms: its invisible duration
/// counted from the apply, but no longer than its wall-clock deadline
/// (`visible_at_ms`, the deciding leader's clock) as this member's wall clock
/// reads it plus [`LEASE_CLOCK_SKEW_ALLOWANCE_MS`], and at most
/// [`LEASE_TIME_LEFT_MAX_MS`]. The wall-clock bound matters only for an entry
/// applied late (replayed after a restart, or by a follower catching up):
/// without it a delivery that ended long ago would be held its whole time again.
/// It cuts a lease short only if this member's clock is ahead of the deciding
/// leader's by more than the allowance.
pub fn timed_lease_left_ms(invisible_ms: u64, visible_at_ms: i64, at: AppliedAt) -> u64 {
    let wall_left_ms = u64::try_from(visible_at_ms.saturating_sub(at.wall_ms)).unwrap_or(0);
    invisible_ms
        .min(wall_left_ms.saturating_add(LEASE_CLOCK_SKEW_ALLOWANCE_MS))
        .min(LEASE_TIME_LEFT_MAX_MS)
}

/// [`apply_leases`] for leases with their time left: each stored one gets its
/// deadline, the apply's instant plus [`timed_lease_left_ms`].
fn apply_timed_leases(
    meta: &mut GroupMeta,
    leases: Vec<TimedFifoLease>,
    at: AppliedAt,
    rows: &mut Vec<RowChange>,
) {
    for t in leases {
        let delivery_id = t.lease.delivery_id;
        let left_ms = timed_lease_left_ms(t.invisible_ms, t.lease.visible_at_ms, at);
        let Some(key) = store_lease(meta, t.lease, rows) else {
            continue;
        };
        // At most 12 h ahead: no Instant overflows there.
        let deadline = LeaseDeadline {
            delivery_id,
            visible_at: at.instant + Duration::from_millis(left_ms),
        };
        meta.lease_deadlines.0.insert(key, deadline);
    }
}

/// Stores `l` as its queue's lease unless the stored one (single or batch)
/// has a higher delivery id; the queue's key if it stored it. It replaces a
/// batch lease of the queue.
fn store_lease(meta: &mut GroupMeta, l: FifoLease, rows: &mut Vec<RowChange>) -> Option<QueueKey> {
    let key = (l.group.clone(), l.topic.clone(), l.queue_id);
    if meta
        .fifo_leases
        .get(&key)
        .is_some_and(|cur| cur.delivery_id > l.delivery_id)
        || !batches::single_replaces_batch(meta, &l, rows)
    {
        return None;
    }
    // Everything below a single lease's delivery is acked or skipped (a
    // leader records single leases only with one message in flight on the
    // queue): the group's offset is at least the leased offset, so a new
    // leader adopts the lease even if the last offset commit did not land.
    let cur = meta.offsets.get(&key).copied().unwrap_or(0);
    if l.queue_offset > cur {
        meta.offsets.insert(key.clone(), l.queue_offset);
        rows.push(RowChange::Offset(key.clone(), l.queue_offset));
    }
    meta.fifo_leases.insert(key.clone(), l.clone());
    rows.push(RowChange::Lease(l));
    Some(key)
}

mod batches;
#[cfg(test)]
mod tests;
