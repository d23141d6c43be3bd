//! Membership changes (`mqadmin addNode` / `removeNode`), from any member: a
//! follower passes the change to the leader over the peer transport
//! (`ChangeMembership`), and the leader makes it with openraft's joint consensus.
//!
//! - Adding node `id` at a peer address: it joins as a learner (it started with
//!   `RaftNodeConfig::join`, so it never initializes a group of its own), the
//!   leader waits until it holds the leader's whole log as it was when the wait
//!   began, then makes it a voter.
//! - Removing node `id`: a voter is first made a learner (it keeps receiving the
//!   log, so it learns it no longer votes and never campaigns), then, once it
//!   holds that change or after a short wait (a dead node never will), removed
//!   from the membership. A leader asked to remove itself hands leadership over
//!   first (`transfer_leadership`), and the new leader makes the change.
//!
//! What to do is decided by [`plan_add`] and [`plan_remove`] (no I/O); the
//! membership watch ([`follow_membership`]) keeps the quorum count, the peers a
//! damaged entry is fetched from, and the peers pinged, on the latest
//! membership in the log (openraft's effective one).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, Membership};
use serde::{Deserialize, Serialize};

use super::RaftNode;
use crate::error::RaftNodeError;
use crate::network::pb::raft_peer_client::RaftPeerClient;
use crate::network::{decode, peer_request};
use crate::types::NodeId;

/// A change to a group's membership.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MembershipChange {
    /// Add node `id`, whose peer server listens at `addr` (`host:port`), as a
    /// voter: first a learner that catches up, then a voter.
    AddVoter {
        /// The new node's id (unused in the group).
        id: NodeId,
        /// Its peer address.
        addr: String,
    },
    /// Remove node `id` (a voter or a learner) from the group.
    Remove {
        /// The node's id.
        id: NodeId,
    },
}

/// What a change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeDone {
    /// The node was added and votes.
    Added,
    /// The node already was a voter at that address: nothing changed.
    AlreadyVoter,
    /// The node was removed.
    Removed,
    /// The node was not a member: nothing changed.
    NotMember,
}

/// The group's membership after a change, as the leader saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembershipOutcome {
    /// What the change did.
    pub done: ChangeDone,
    /// The voters, in id order.
    pub voters: Vec<NodeId>,
    /// The learners (members that receive the log and do not vote), in id order.
    pub learners: Vec<NodeId>,
}

/// A change a member passes to its leader (postcard, the `ChangeMembership`
/// request).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardedChange {
    /// The change.
    pub change: MembershipChange,
    /// How long the leader may take, in ms (the sender stops waiting then).
    pub timeout_ms: u64,
}

/// Why the leader did not make a forwarded change (postcard, in the
/// `ChangeMembership` reply: `Result<MembershipOutcome, MembershipRefusal>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MembershipRefusal {
    /// The node asked does not lead (any more): the sender asks the leader.
    NotLeader,
    /// Refused as asked ([`RaftNodeError::MembershipRefused`]).
    Refused(String),
    /// The learner did not catch up in time ([`RaftNodeError::CatchUpTimeout`]).
    CatchUpTimeout {
        /// The learner.
        id: NodeId,
        /// The last log index it was known to hold.
        matched_index: Option<u64>,
        /// The leader's log index it had to reach.
        target_index: u64,
        /// How long the leader waited.
        timeout_ms: u64,
    },
    /// Anything else (openraft failed, the node stops), as text.
    Failed(String),
}

impl From<RaftNodeError> for MembershipRefusal {
    fn from(e: RaftNodeError) -> Self {
        match e {
            RaftNodeError::NotLeader { .. } | RaftNodeError::NoLeader => Self::NotLeader,
            RaftNodeError::MembershipRefused(r) => Self::Refused(r),
            RaftNodeError::CatchUpTimeout {
                id,
                matched_index,
                target_index,
                timeout_ms,
            } => Self::CatchUpTimeout {
                id,
                matched_index,
                target_index,
                timeout_ms,
            },
            other => Self::Failed(other.to_string()),
        }
    }
}

/// The first step of adding a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddStep {
    /// Already a voter at that address: nothing to do.
    AlreadyVoter,
    /// Not a member: add it as a learner, then wait for it to catch up.
    AddLearner,
    /// Already a learner at that address (an earlier ask that timed out): wait
    /// for it to catch up.
    CatchUp,
}

/// The first step of removing a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoveStep {
    /// Not a member: nothing to do.
    NotMember,
    /// A voter: make it a learner first.
    DemoteVoter,
    /// A learner: remove it.
    RemoveLearner,
}

fn in_progress(m: &Membership<NodeId, BasicNode>) -> Result<(), String> {
    if m.get_joint_config().len() > 1 {
        return Err(format!(
            "a membership change is in progress (joint configuration {:?}); ask again once it is done",
            m.get_joint_config()
        ));
    }
    Ok(())
}

/// What adding node `id` at peer address `addr` to a group of membership `m`
/// starts with; refused (message for the operator) when the id is a member at
/// another address, the address is another member's, the address is not
/// `host:port`, or a change is in progress. No I/O.
pub fn plan_add(
    m: &Membership<NodeId, BasicNode>,
    id: NodeId,
    addr: &str,
) -> Result<AddStep, String> {
    let valid = addr
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if !valid {
        return Err(format!("peer address {addr:?} is not host:port"));
    }
    // A joint configuration's voters are those of both halves: decided only on
    // a uniform one (the leader finishes a joint one first).
    in_progress(m)?;
    if let Some(n) = m.get_node(&id) {
        if n.addr != addr {
            return Err(format!(
                "node {id} is already a member at {}, not {addr}: remove it first, or give the new node an unused id",
                n.addr
            ));
        }
        if m.voter_ids().any(|v| v == id) {
            return Ok(AddStep::AlreadyVoter);
        }
        return Ok(AddStep::CatchUp);
    }
    if let Some((other, _)) = m.nodes().find(|(_, n)| n.addr == addr) {
        return Err(format!(
            "peer address {addr} is already node {other}'s: remove node {other} first"
        ));
    }
    Ok(AddStep::AddLearner)
}

/// What removing node `id` from a group of membership `m` starts with; refused
/// for the group's only voter, and while a change is in progress. No I/O.
pub fn plan_remove(m: &Membership<NodeId, BasicNode>, id: NodeId) -> Result<RemoveStep, String> {
    if m.get_node(&id).is_none() {
        return Ok(RemoveStep::NotMember);
    }
    in_progress(m)?;
    if m.voter_ids().any(|v| v == id) {
        if m.voter_ids().count() == 1 {
            return Err(format!(
                "node {id} is the group's only voter: add another node first"
            ));
        }
        return Ok(RemoveStep::DemoteVoter);
    }
    Ok(RemoveStep::RemoveLearner)
}

/// The membership `m` as an outcome.
fn outcome(done: ChangeDone, m: &Membership<NodeId, BasicNode>) -> MembershipOutcome {
    MembershipOutcome {
        done,
        voters: m.voter_ids().collect(),
        learners: m.learner_ids().collect(),
    }
}

/// openraft's answer to a membership write, typed.
fn change_error(e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> RaftNodeError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => RaftNodeError::NotLeader {
            leader: f.leader_id,
        },
        RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => {
            RaftNodeError::MembershipRefused(c.to_string())
        }
        RaftError::Fatal(f) => RaftNodeError::Raft(f.to_string()),
    }
}

/// The longest a leader asked to remove itself spends handing leadership over
/// (writes pause meanwhile); past it the removal fails with `Timeout`.
const REMOVAL_HAND_OVER: Duration = Duration::from_secs(10);

/// How long a removed voter is given to receive the change that made it a learner
/// before it is removed anyway (a dead node never receives it); no longer than
/// the change's own deadline.
const DEMOTION_REACH: Duration = Duration::from_secs(3);

impl RaftNode {
    /// Makes `change` from any member, waiting at most `timeout` (adding a node
    /// includes its catch-up): the leader makes it, a follower passes it to the
    /// leader and waits for one while there is none. Errors:
    /// `MembershipRefused` (nothing changed), `CatchUpTimeout` (the node stays a
    /// learner), `Timeout` (no leader answered in time; part of the change may
    /// be made, and asking again goes on from there), `Raft`.
    pub async fn change_membership(
        self: &Arc<Self>,
        change: MembershipChange,
        timeout: Duration,
    ) -> Result<MembershipOutcome, RaftNodeError> {
        let timeout = timeout.min(MAX_CHANGE_TIME);
        let deadline = tokio::time::Instant::now() + timeout;
        let timed_out = || RaftNodeError::Timeout {
            timeout_ms: timeout.as_millis() as u64,
        };
        loop {
            let attempt = if self.is_leader() {
                self.change_here(change.clone(), deadline).await
            } else if let Some((leader, addr)) = self.leader() {
                self.forward_change(leader, &addr, &change, deadline).await
            } else {
                Err(RaftNodeError::NoLeader)
            };
            match attempt {
                // No leader, or not this one any more (a removal of the leader
                // handed leadership over: it goes on at the new leader), or no
                // answer: ask again.
                Err(RaftNodeError::NotLeader { .. } | RaftNodeError::NoLeader)
                | Err(RaftNodeError::Transport(_)) => {}
                Ok(o) => return Ok(o),
                Err(other) => return Err(other),
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(timed_out());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// True if this node is a member (voter or learner) of the latest membership
    /// in its log (openraft's effective one, which may not be committed yet):
    /// false for a node that joins before the leader adds it. A removed node
    /// does not receive the entry that removes it, so it stays a learner in its
    /// own view: [`Self::leader_heard_lately`] tells it apart.
    pub fn is_member(&self) -> bool {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .get_node(&self.id)
            .is_some()
    }

    /// True if a leader's AppendEntries (entries or heartbeat) arrived within
    /// the maximum election timeout: false for a node that was removed from its
    /// group (nothing is replicated to it any more), or cut off from its leader.
    pub fn leader_heard_lately(&self) -> bool {
        self.contacts.leader_heard_lately()
    }

    /// Passes `change` to leader `leader` at peer address `addr`. Errors:
    /// `Transport` (not answered: ask again), `NotLeader`, and the leader's.
    async fn forward_change(
        &self,
        leader: NodeId,
        addr: &str,
        change: &MembershipChange,
        deadline: tokio::time::Instant,
    ) -> Result<MembershipOutcome, RaftNodeError> {
        let ttl = deadline.saturating_duration_since(tokio::time::Instant::now());
        let channel = self.channel(addr).map_err(RaftNodeError::Transport)?;
        // The leader stops a margin before this call's deadline, so that its
        // answer (a catch-up that timed out, say) comes back rather than the
        // call being cut off.
        let asked = ForwardedChange {
            change: change.clone(),
            timeout_ms: leader_budget(ttl).as_millis() as u64,
        };
        let req = peer_request(self.id, &asked, ttl)
            .map_err(|e| RaftNodeError::Transport(e.to_string()))?;
        let reply = RaftPeerClient::new(channel)
            .change_membership(req)
            .await
            .map_err(|s| RaftNodeError::Transport(format!("leader {leader}: {s}")))?;
        let answer: Result<MembershipOutcome, MembershipRefusal> = decode(reply.get_ref())
            .map_err(|s| RaftNodeError::Raft(format!("leader {leader}'s answer: {s}")))?;
        answer.map_err(|r| match r {
            MembershipRefusal::NotLeader => RaftNodeError::NotLeader { leader: None },
            MembershipRefusal::Refused(r) => RaftNodeError::MembershipRefused(r),
            MembershipRefusal::CatchUpTimeout {
                id,
                matched_index,
                target_index,
                timeout_ms,
            } => RaftNodeError::CatchUpTimeout {
                id,
                matched_index,
                target_index,
                timeout_ms,
            },
            MembershipRefusal::Failed(f) => RaftNodeError::Raft(format!("leader {leader}: {f}")),
        })
    }

    /// Makes `change` while this node leads, in a task of its own: a caller
    /// that stops waiting (a cancelled call) does not stop a change between
    /// openraft's two steps (the joint configuration, then the new one).
    /// Errors: as [`Self::change_as_leader`].
    pub(crate) async fn change_here(
        self: &Arc<Self>,
        change: MembershipChange,
        deadline: tokio::time::Instant,
    ) -> Result<MembershipOutcome, RaftNodeError> {
        let me = self.clone();
        tokio::spawn(async move { me.change_as_leader(change, deadline).await })
            .await
            .map_err(|e| RaftNodeError::Raft(format!("the membership change task failed: {e}")))?
    }

    /// Makes `change` while this node leads, after finishing a change an
    /// earlier leader left in its joint configuration. A leader asked to remove
    /// itself hands leadership over and answers `NotLeader` (the caller asks the
    /// new leader). Errors: as [`Self::change_membership`], and `NotLeader`.
    async fn change_as_leader(
        &self,
        change: MembershipChange,
        deadline: tokio::time::Instant,
    ) -> Result<MembershipOutcome, RaftNodeError> {
        let mut m = self.raft.metrics().borrow().membership_config.clone();
        if let Some(goal) = unfinished(m.membership()) {
            tracing::warn!(
                ?goal,
                "finishing a membership change an earlier leader left joint"
            );
            self.write_membership(ChangeMembers::ReplaceAllVoters(goal), true, deadline)
                .await?;
            m = self.raft.metrics().borrow().membership_config.clone();
        }
        let m = m.membership();
        tracing::info!(?change, voters = ?m.voter_ids().collect::<Vec<_>>(), "membership change asked");
        match change {
            MembershipChange::AddVoter { id, addr } => {
                match plan_add(m, id, &addr).map_err(RaftNodeError::MembershipRefused)? {
                    AddStep::AlreadyVoter => return Ok(outcome(ChangeDone::AlreadyVoter, m)),
                    AddStep::AddLearner => {
                        self.raft
                            .add_learner(id, BasicNode::new(addr.clone()), false)
                            .await
                            .map_err(change_error)?;
                        tracing::info!(id, addr, "added as a learner; waiting for it to catch up");
                    }
                    AddStep::CatchUp => {}
                }
                self.wait_caught_up(id, deadline).await?;
                let r = self
                    .write_membership(
                        ChangeMembers::AddVoterIds(BTreeSet::from([id])),
                        false,
                        deadline,
                    )
                    .await?;
                let m = r.membership.unwrap_or_else(|| m.clone());
                tracing::info!(id, voters = ?m.voter_ids().collect::<Vec<_>>(), "node added as a voter");
                Ok(outcome(ChangeDone::Added, &m))
            }
            MembershipChange::Remove { id } => {
                match plan_remove(m, id).map_err(RaftNodeError::MembershipRefused)? {
                    RemoveStep::NotMember => return Ok(outcome(ChangeDone::NotMember, m)),
                    RemoveStep::DemoteVoter if id == self.id => {
                        // Writes pause during a hand-over: only toward a voter
                        // heard from and caught up.
                        if let Some(why) = self.hand_over_refusal(None) {
                            return Err(RaftNodeError::MembershipRefused(format!(
                                "node {id} leads, and {why} to take over: not removed"
                            )));
                        }
                        // Writes pause during a hand-over: bounded apart from
                        // the change's own (possibly long) deadline.
                        let left = deadline
                            .saturating_duration_since(tokio::time::Instant::now())
                            .min(REMOVAL_HAND_OVER);
                        let to = self.transfer_leadership(None, left).await?;
                        tracing::info!(to, "handed leadership over to be removed");
                        return Err(RaftNodeError::NotLeader { leader: Some(to) });
                    }
                    RemoveStep::DemoteVoter => {
                        let r = self
                            .write_membership(
                                ChangeMembers::RemoveVoters(BTreeSet::from([id])),
                                true,
                                deadline,
                            )
                            .await?;
                        tracing::info!(id, "voter made a learner");
                        self.wait_holds(id, r.log_id.index, deadline).await?;
                    }
                    RemoveStep::RemoveLearner => {}
                }
                let r = self
                    .write_membership(
                        ChangeMembers::RemoveNodes(BTreeSet::from([id])),
                        false,
                        deadline,
                    )
                    .await?;
                let m = r.membership.unwrap_or_else(|| m.clone());
                tracing::info!(id, voters = ?m.voter_ids().collect::<Vec<_>>(), "node removed");
                Ok(outcome(ChangeDone::Removed, &m))
            }
        }
    }

    /// Waits until learner `id` holds this leader's log through the last index
    /// it had when the wait began. Errors: `NotLeader`, `CatchUpTimeout`.
    async fn wait_caught_up(
        &self,
        id: NodeId,
        deadline: tokio::time::Instant,
    ) -> Result<(), RaftNodeError> {
        let started = tokio::time::Instant::now();
        let target = self.raft.metrics().borrow().last_log_index.unwrap_or(0);
        loop {
            let matched = {
                let m = self.raft.metrics();
                let m = m.borrow();
                if m.current_leader != Some(self.id) {
                    return Err(RaftNodeError::NotLeader {
                        leader: m.current_leader,
                    });
                }
                matched_index(&m, id)
            };
            if matched.is_some_and(|i| i >= target) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(RaftNodeError::CatchUpTimeout {
                    id,
                    matched_index: matched,
                    target_index: target,
                    timeout_ms: started.elapsed().as_millis() as u64,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits up to [`DEMOTION_REACH`] (and no later than `deadline`) for member
    /// `id` to hold log index `index`; a node that does not (down) is let go
    /// anyway, with a warning. Errors: `NotLeader`.
    async fn wait_holds(
        &self,
        id: NodeId,
        index: u64,
        deadline: tokio::time::Instant,
    ) -> Result<(), RaftNodeError> {
        let until = (tokio::time::Instant::now() + DEMOTION_REACH).min(deadline);
        while tokio::time::Instant::now() < until {
            {
                let m = self.raft.metrics();
                let m = m.borrow();
                if m.current_leader != Some(self.id) {
                    return Err(RaftNodeError::NotLeader {
                        leader: m.current_leader,
                    });
                }
                if matched_index(&m, id).is_some_and(|i| i >= index) {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tracing::warn!(
            id,
            index,
            "the removed node did not receive its removal in time (down?); removing it anyway: do not restart it with its old store"
        );
        Ok(())
    }

    /// Writes membership change `changes` (openraft's two steps), asking again
    /// while openraft answers that the previous change is not committed yet (a
    /// new leader commits it with its first entry), until `deadline`. Errors:
    /// `NotLeader`, `MembershipRefused`, `Raft`.
    async fn write_membership(
        &self,
        changes: ChangeMembers<NodeId, BasicNode>,
        retain: bool,
        deadline: tokio::time::Instant,
    ) -> Result<openraft::raft::ClientWriteResponse<crate::types::TypeConfig>, RaftNodeError> {
        loop {
            match self.raft.change_membership(changes.clone(), retain).await {
                Ok(r) => return Ok(r),
                Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(
                    ChangeMembershipError::InProgress(p),
                ))) => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(RaftNodeError::MembershipRefused(p.to_string()));
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(change_error(e)),
            }
        }
    }
}

/// The voters a joint configuration `m` is on its way to, if `m` is one (an
/// earlier leader lost leadership, or stopped, between openraft's two steps).
/// No I/O.
pub fn unfinished(m: &Membership<NodeId, BasicNode>) -> Option<BTreeSet<NodeId>> {
    let joint = m.get_joint_config();
    (joint.len() > 1).then(|| joint.last().cloned().unwrap_or_default())
}

/// How long a leader may take for a change forwarded with `ttl` left: a margin
/// (a tenth, at most 2 s) less, for its answer to come back. No I/O.
pub fn leader_budget(ttl: Duration) -> Duration {
    ttl.saturating_sub((ttl / 10).min(Duration::from_secs(2)))
}

/// The longest a membership change may be given (a day); longer asks are cut
/// to it.
pub const MAX_CHANGE_TIME: Duration = Duration::from_secs(24 * 3600);

/// The last log index leader metrics `m` say member `id` holds.
fn matched_index(m: &openraft::RaftMetrics<NodeId, BasicNode>, id: NodeId) -> Option<u64> {
    m.replication.as_ref()?.get(&id)?.as_ref().map(|l| l.index)
}

/// The members of membership `m` (learners included): id → peer address.
fn member_addrs(m: &Membership<NodeId, BasicNode>) -> BTreeMap<NodeId, String> {
    m.nodes().map(|(&id, n)| (id, n.addr.clone())).collect()
}

/// Keeps what depends on the group's membership on the latest membership in
/// this node's log (openraft's effective one, as its metrics report it): the voters counted for a quorum
/// (`Contacts`), and the peers a damaged entry is fetched from. Ends when the
/// node is dropped.
pub(super) async fn follow_membership(
    node: std::sync::Weak<RaftNode>,
    repair: Arc<crate::repair::EntryRepair>,
) {
    let mut metrics = match node.upgrade() {
        Some(n) => n.raft.metrics(),
        None => return,
    };
    let mut seen = None;
    loop {
        let m = metrics.borrow_and_update().membership_config.clone();
        let members = member_addrs(m.membership());
        // A node that joins starts with no membership: it keeps its configured
        // one until the leader's reaches it.
        if !members.is_empty() && seen.as_ref() != Some(&m) {
            let Some(n) = node.upgrade() else { return };
            let voters: Vec<NodeId> = m.membership().voter_ids().collect();
            tracing::info!(?voters, learners = ?m.membership().learner_ids().collect::<Vec<_>>(), "membership");
            n.contacts.set_members(voters);
            repair.set_peers(&members);
            seen = Some(m);
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// The peers a node pings ([`super::upkeep::probe_peers`]): the applied
/// membership's other nodes, learners included, else (before a joining node has
/// one) the configured members.
pub(super) fn peers_to_probe(
    raft: &crate::types::Raft,
    configured: &BTreeMap<NodeId, String>,
) -> BTreeMap<NodeId, String> {
    let m = member_addrs(raft.metrics().borrow().membership_config.membership());
    if m.is_empty() {
        configured.clone()
    } else {
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn membership(voters: &[NodeId], learners: &[NodeId]) -> Membership<NodeId, BasicNode> {
        let nodes: BTreeMap<NodeId, BasicNode> = voters
            .iter()
            .chain(learners)
            .map(|&id| (id, BasicNode::new(format!("10.0.0.{id}:9000"))))
            .collect();
        Membership::new(vec![voters.iter().copied().collect()], nodes)
    }

    #[test]
    fn adding_a_node_checks_its_id_and_address() {
        let m = membership(&[0, 1, 2], &[3]);
        assert_eq!(plan_add(&m, 4, "10.0.0.4:9000"), Ok(AddStep::AddLearner));
        assert_eq!(plan_add(&m, 3, "10.0.0.3:9000"), Ok(AddStep::CatchUp));
        assert_eq!(plan_add(&m, 1, "10.0.0.1:9000"), Ok(AddStep::AlreadyVoter));
        // An id taken at another address, an address taken by another id.
        assert!(plan_add(&m, 1, "10.0.0.9:9000")
            .unwrap_err()
            .contains("already a member"));
        assert!(plan_add(&m, 5, "10.0.0.2:9000")
            .unwrap_err()
            .contains("node 2's"));
        for bad in ["", "host", ":9000", "host:0", "host:port", "host:70000"] {
            assert!(plan_add(&m, 5, bad).is_err(), "{bad:?}");
        }
        assert_eq!(plan_add(&m, 5, "[::1]:9000"), Ok(AddStep::AddLearner));
    }

    #[test]
    fn removing_a_node_demotes_a_voter_first_and_keeps_one_voter() {
        let m = membership(&[0, 1, 2], &[3]);
        assert_eq!(plan_remove(&m, 1), Ok(RemoveStep::DemoteVoter));
        assert_eq!(plan_remove(&m, 3), Ok(RemoveStep::RemoveLearner));
        assert_eq!(plan_remove(&m, 7), Ok(RemoveStep::NotMember));
        let one = membership(&[0], &[1]);
        assert!(plan_remove(&one, 0).unwrap_err().contains("only voter"));
        assert_eq!(plan_remove(&one, 1), Ok(RemoveStep::RemoveLearner));
    }

    #[test]
    fn no_change_starts_during_a_joint_configuration() {
        let nodes: BTreeMap<NodeId, BasicNode> = (0..4)
            .map(|id| (id, BasicNode::new(format!("10.0.0.{id}:9000"))))
            .collect();
        let joint = Membership::new(
            vec![BTreeSet::from([0, 1, 2]), BTreeSet::from([0, 1, 2, 3])],
            nodes,
        );
        assert!(plan_add(&joint, 4, "10.0.0.4:9000")
            .unwrap_err()
            .contains("in progress"));
        assert!(plan_remove(&joint, 1).unwrap_err().contains("in progress"));
        // Node 3 votes only in the new half: not yet a voter, whatever the
        // union of the halves says.
        assert!(plan_add(&joint, 3, "10.0.0.3:9000")
            .unwrap_err()
            .contains("in progress"));
        assert_eq!(plan_remove(&joint, 9), Ok(RemoveStep::NotMember));
        // What the leader finishes it with: the new half.
        assert_eq!(unfinished(&joint), Some(BTreeSet::from([0, 1, 2, 3])));
        assert_eq!(unfinished(&membership(&[0, 1, 2], &[3])), None);
    }

    #[test]
    fn a_forwarded_change_leaves_its_answer_time_to_come_back() {
        assert_eq!(
            leader_budget(Duration::from_secs(10)),
            Duration::from_secs(9)
        );
        assert_eq!(
            leader_budget(Duration::from_secs(600)),
            Duration::from_secs(598)
        );
        assert_eq!(leader_budget(Duration::ZERO), Duration::ZERO);
    }
}
