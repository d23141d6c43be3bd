//! A node's background upkeep: retention (purging the Raft log through segment
//! boundaries), pinging peers it has not heard from, and rejoining elections once
//! a node that lost acknowledged entries has them back.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ledgermq_store::MessageStore;
use openraft::BasicNode;

use super::RaftNode;
use crate::error::RaftNodeError;
use crate::network::pb::raft_peer_client::RaftPeerClient;
use crate::network::peer_request;
use crate::purge_point::RetentionView;
use crate::types::Command;
use crate::types::NodeId;

impl RaftNode {
    /// Purges the Raft log (retention) through the highest segment boundary at or
    /// below `upto` that has a snapshot (`crate::boundary`): the snapshot a
    /// lagging follower is then sent sits exactly where this log begins, so it gets
    /// every retained entry. Takes a snapshot covering that index first if needed,
    /// since openraft purges only what a snapshot covers. Purging is asynchronous and
    /// waits for replication tasks that still read those entries. Returns the index
    /// purged through, or None when no boundary at or below `upto` has a snapshot
    /// (nothing is purged). Errors: `Timeout`, `ShuttingDown`, `Raft`, `Meta`.
    pub async fn purge_log_through(
        &self,
        upto: u64,
        timeout: Duration,
    ) -> Result<Option<u64>, RaftNodeError> {
        let _one = self.purging.lock().await;
        let Some(upto) = crate::boundary::latest_at_or_below(&self.meta, upto)? else {
            return Ok(None);
        };
        let covered = |m: &openraft::RaftMetrics<NodeId, BasicNode>| {
            m.snapshot.is_some_and(|s| s.index >= upto)
        };
        if !covered(&self.raft.metrics().borrow()) {
            // The build returns the snapshot saved at `upto`.
            self.snapshot_target
                .store(upto, std::sync::atomic::Ordering::Release);
            self.raft
                .trigger()
                .snapshot()
                .await
                .map_err(|e| RaftNodeError::Raft(e.to_string()))?;
            let mut rx = self.raft.metrics();
            let deadline = tokio::time::Instant::now() + timeout;
            while !covered(&rx.borrow()) {
                match tokio::time::timeout_at(deadline, rx.changed()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return Err(RaftNodeError::ShuttingDown),
                    Err(_) => {
                        return Err(RaftNodeError::Timeout {
                            timeout_ms: timeout.as_millis() as u64,
                        })
                    }
                }
            }
        }
        self.raft
            .trigger()
            .purge_log(upto)
            .await
            .map_err(|e| RaftNodeError::Raft(e.to_string()))?;
        Ok(Some(upto))
    }

    /// One retention run. This member's store says which old CommitLog segments
    /// are due (expired, or forced by disk pressure); forced ones are cut at the
    /// oldest message some consumer group has not consumed. If that moves the
    /// group's retention point ([`crate::purge_point`]), the point is proposed
    /// ([`Command::PurgeThrough`]; a follower forwards it to the leader). Then this
    /// member purges through the committed point ([`Self::purge_to_group_point`]).
    /// Returns the log index purged through, if any. Errors: as
    /// [`Self::purge_to_group_point`]; a failure to decide what is due or to
    /// propose it is logged, and the purge to the committed point goes on.
    pub async fn run_retention_once(&self) -> Result<Option<u64>, RaftNodeError> {
        match self.retention_view().await {
            Ok(view) => {
                if let Some(index) = crate::purge_point::to_propose(view) {
                    match self.write_command(Command::PurgeThrough { index }).await {
                        Ok(_) => tracing::info!(
                            index,
                            forced = view.forced_through.is_some(),
                            "retention point proposed"
                        ),
                        Err(e) => {
                            tracing::warn!(index, error = %e, "proposing a retention point failed")
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "retention could not decide what is due; purging to the group's point only")
            }
        }
        self.purge_to_group_point().await
    }

    /// What this member's store says is due for retention, as log indexes
    /// ([`RetentionView`]). Errors: `Store`, `Meta`, `Raft` (the blocking task).
    async fn retention_view(&self) -> Result<RetentionView, RaftNodeError> {
        let store = self.store.clone();
        let shared = self.shared.clone();
        let applied = self.raft.metrics().borrow().last_applied.map(|l| l.index);
        tokio::task::spawn_blocking(move || -> Result<RetentionView, RaftNodeError> {
            if let Err(e) = store.ensure_disk_reserve() {
                tracing::warn!(error = %e, "the disk reserve could not be made; retention goes on");
            }
            let clock = store.retention_clock_now()?;
            let due = store.retention_offsets(clock)?;
            let (offsets, current) = {
                let m = shared.read().unwrap();
                (m.offsets.clone(), m.purge_point)
            };
            let min = store.commit_log().min_offset();
            // Pending delay messages' and half messages' records stay, expired or
            // not: they are still to be delivered or ended (read only when
            // something is due: it scans them all).
            let pending_timer_from = if due.expired_below > min || due.forced_below > min {
                let timers = store.timers();
                let timer = timers.oldest_physical_offset(min)?.unwrap_or(u64::MAX);
                let half = timers
                    .halves()
                    .oldest_physical_offset(min)?
                    .unwrap_or(u64::MAX);
                timer.min(half)
            } else {
                u64::MAX
            };
            let consumed_through = if due.forced_below > min {
                let consumers: BTreeSet<(&str, &str)> = offsets
                    .keys()
                    .map(|(c, t, _)| (c.as_str(), t.as_str()))
                    .collect();
                let from = store.unconsumed_from(consumers, |c, t, q| {
                    offsets.get(&(c.to_owned(), t.to_owned(), q)).copied()
                })?;
                store.last_log_index_below(from.min(pending_timer_from))?
            } else {
                None
            };
            let through = |below: u64| -> Result<Option<u64>, RaftNodeError> {
                Ok(if below > min {
                    store.last_log_index_below(below)?
                } else {
                    None
                })
            };
            Ok(RetentionView {
                expired_through: through(due.expired_below.min(pending_timer_from))?,
                forced_through: through(due.forced_below)?,
                consumed_through,
                applied,
                current,
            })
        })
        .await
        .map_err(|e| RaftNodeError::Raft(e.to_string()))?
    }

    /// Purges this member's log through the group's committed retention point
    /// (never past what it applied), at the highest segment boundary at or below
    /// it ([`Self::purge_log_through`]), unless the log already begins past that
    /// boundary. Returns the log index purged through, if anything was purged.
    /// Errors: as [`Self::purge_log_through`].
    pub async fn purge_to_group_point(&self) -> Result<Option<u64>, RaftNodeError> {
        let point = self.shared.read().unwrap().purge_point;
        let (applied, purged) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            (m.last_applied.map(|l| l.index), m.purged.map(|l| l.index))
        };
        let Some(upto) = point.zip(applied).map(|(p, a)| p.min(a)) else {
            return Ok(None);
        };
        match crate::boundary::latest_at_or_below(&self.meta, upto)? {
            Some(b) if purged.is_none_or(|p| p < b) => {
                self.purge_log_through(b, Duration::from_secs(30)).await
            }
            _ => Ok(None),
        }
    }
}

/// Every `every`, pings each peer not heard from within two periods (followers do
/// not otherwise talk to each other; a leader hears from them on every heartbeat),
/// so [`RaftNode::in_contact_with_quorum`] knows whether this node is cut off; and
/// each peer that left a call unanswered, so that an answer clears it. The
/// peers are the nodes of the latest membership in the log; `members` (the configured ones)
/// until a joining node has a membership.
pub(super) async fn probe_peers(
    node: std::sync::Weak<RaftNode>,
    members: BTreeMap<NodeId, String>,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(node) = node.upgrade() else { return };
        if node.store.is_closed() {
            return;
        }
        for (peer, addr) in super::membership::peers_to_probe(&node.raft, &members) {
            if peer == node.id
                || (node.contacts.heard_within(peer, every * 2) && !node.contacts.unanswered(peer))
                || node.filter.is_blocked(node.id, peer)
            {
                continue;
            }
            let Ok(channel) = node.channel(&addr) else {
                continue;
            };
            let contacts = node.contacts.clone();
            let from = node.id;
            let filter = node.filter.clone();
            tokio::spawn(async move {
                let Ok(req) = peer_request(from, &(), every * 2) else {
                    return;
                };
                let mut client = RaftPeerClient::new(channel);
                let ping = async {
                    // The test network's latency, both ways.
                    tokio::time::sleep(filter.transfer_delay(from, peer, 0)).await;
                    let r = client.ping(req).await;
                    tokio::time::sleep(filter.transfer_delay(peer, from, 0)).await;
                    r
                };
                if let Ok(Ok(_)) = tokio::time::timeout(every * 2, ping).await {
                    contacts.heard_from(peer);
                    contacts.call_answered(peer);
                }
            });
        }
    }
}

/// Waits until `store` holds again everything it had acknowledged (its log is
/// back past its acknowledged mark), looking every 100 ms; false if the store
/// closes first.
pub(super) async fn caught_up(store: &MessageStore) -> bool {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tick.tick().await;
        if store.is_closed() {
            return false;
        }
        if !store.commit_log().lost_acknowledged() {
            return true;
        }
    }
}

/// Re-enables elections once the store holds again everything it had acknowledged
/// (see `RaftNode::start`).
pub(super) async fn rejoin_elections_when_caught_up(
    elections: Arc<crate::elections::ElectionGate>,
    store: Arc<MessageStore>,
) {
    if caught_up(&store).await {
        tracing::info!("caught up past every acknowledged entry: taking part in elections again");
        elections.release(crate::elections::Hold::LostEntries);
    }
}

/// Every `every`, a retention run ([`RaftNode::run_retention_once`]); in between,
/// a purge as soon as the group's retention point moves, so members purge within
/// moments of each other.
pub(super) async fn retention_loop(
    node: std::sync::Weak<RaftNode>,
    every: Duration,
    moved: Arc<tokio::sync::Notify>,
) {
    let mut tick = tokio::time::interval(every);
    // A purge can wait up to 30 s for its snapshot: no burst of runs after it.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        let run = tokio::select! {
            _ = tick.tick() => true,
            _ = moved.notified() => false,
        };
        let Some(node) = node.upgrade() else { return };
        if node.store.is_closed() {
            return;
        }
        let done = if run {
            node.run_retention_once().await
        } else {
            node.purge_to_group_point().await
        };
        match done {
            Ok(Some(upto)) => tracing::info!(upto, "retention purged the Raft log"),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "retention run failed"),
        }
    }
}
