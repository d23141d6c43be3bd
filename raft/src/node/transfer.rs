//! Graceful leadership transfer (rolling restarts, SIGTERM): the leader stops
//! taking writes, waits for a follower to hold its whole log, then has it campaign.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::RaftNode;
use crate::elections::Hold;
use crate::error::RaftNodeError;
use crate::network::pb::raft_peer_client::RaftPeerClient;
use crate::network::{decode, lazy_channel, peer_request};
use crate::types::NodeId;

impl RaftNode {
    /// Graceful leadership transfer (rolling restarts): waits until `target` (or the
    /// most caught-up follower) has every entry of this leader's log, then asks it to
    /// start an election at once (Raft's TimeoutNow). Returns the new leader.
    pub async fn transfer_leadership(
        &self,
        target: Option<NodeId>,
        timeout: Duration,
    ) -> Result<NodeId, RaftNodeError> {
        let deadline = tokio::time::Instant::now() + timeout;
        // No new writes from here on (the target must catch up with a log that
        // stops growing); everything is restored by the guard even if this future
        // is dropped part way.
        let _restore = TransferGuard { node: self };
        self.writer.set_paused(true);
        // Until some follower holds the whole log (the caller's target, if
        // given); the rounds below ask whichever does then.
        loop {
            let m = self.raft.metrics().borrow().clone();
            if m.current_leader != Some(self.id) {
                return Err(RaftNodeError::NotLeader {
                    leader: m.current_leader,
                });
            }
            let step = hand_over_step(self.id, target, &m, &mut HandOverState::default());
            if matches!(step, HandOver::Ask(_)) {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(RaftNodeError::Timeout {
                    timeout_ms: timeout.as_millis() as u64,
                });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // openraft 0.9 followers refuse votes while the leader's lease (the maximum
        // election timeout since its last heartbeat) holds, so the leader stops
        // heartbeating and stays out of elections, and asks the target to
        // campaign (`hand_over_step` says whom).
        self.raft.runtime_config().heartbeat(false);
        self.elections.hold(Hold::Transfer);
        let result = self.campaign_until_leader(target, deadline).await;
        result.map_err(|e| match e {
            RaftNodeError::Timeout { .. } => RaftNodeError::Timeout {
                timeout_ms: timeout.as_millis() as u64,
            },
            other => other,
        })
    }

    /// Asks a caught-up follower to campaign (Raft's TimeoutNow) once per round
    /// of 200 ms as [`hand_over_step`] says, for one election lease (then the
    /// group's own elections finish it), until another node leads or
    /// `deadline`. `target`: the only follower to ask, if given.
    async fn campaign_until_leader(
        &self,
        target: Option<NodeId>,
        deadline: tokio::time::Instant,
    ) -> Result<NodeId, RaftNodeError> {
        let mut rx = self.raft.metrics();
        let mut seen = HandOverState::default();
        let mut channels = BTreeMap::new();
        // Voters refuse campaigns while the lease (the maximum election
        // timeout) from the old leader's last heartbeat holds; heartbeats
        // stopped here. An ask made once it has ended is answered by a campaign
        // the voters take; asks after that one only break up elections under
        // way, so there is one, and then the group's own elections go on.
        let lease = Duration::from_millis(self.raft.config().election_timeout_max);
        let lease_end = tokio::time::Instant::now() + lease;
        let mut asked_after_lease = false;
        loop {
            let m = rx.borrow().clone();
            let mut step = hand_over_step(self.id, target, &m, &mut seen);
            if asked_after_lease && matches!(step, HandOver::Ask(_)) {
                step = HandOver::Wait;
            }
            match step {
                HandOver::Done(l) => return Ok(l),
                HandOver::Ask(t) => {
                    let sent_at = tokio::time::Instant::now();
                    match self.timeout_now(t, &mut channels, deadline).await {
                        Asked::Accepted => asked_after_lease |= sent_at >= lease_end,
                        Asked::Refused => {
                            seen.refused.insert(t);
                        }
                        Asked::Failed => seen.unreachable = Some(t),
                    }
                }
                HandOver::Wait => {}
            }
            let round_end =
                (tokio::time::Instant::now() + Duration::from_millis(200)).min(deadline);
            loop {
                if let Some(l) = rx.borrow().current_leader.filter(|l| *l != self.id) {
                    return Ok(l);
                }
                match tokio::time::timeout_at(round_end, rx.changed()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return Err(RaftNodeError::ShuttingDown),
                    Err(_) => break,
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(RaftNodeError::Timeout { timeout_ms: 0 });
            }
        }
    }

    /// Sends TimeoutNow to member `target` (its channel kept in `channels`),
    /// waiting no later than `deadline` and at most one round (200 ms). A call
    /// that failed or timed out is logged.
    async fn timeout_now(
        &self,
        target: NodeId,
        channels: &mut BTreeMap<NodeId, tonic::transport::Channel>,
        deadline: tokio::time::Instant,
    ) -> Asked {
        if let std::collections::btree_map::Entry::Vacant(slot) = channels.entry(target) {
            let addr = self
                .raft
                .metrics()
                .borrow()
                .membership_config
                .membership()
                .get_node(&target)
                .map(|n| n.addr.clone());
            let Some(addr) = addr else {
                tracing::warn!(target, "TimeoutNow: not a member");
                return Asked::Failed;
            };
            match lazy_channel(&addr, Duration::from_millis(500), self.peer_tls.as_ref()) {
                Ok(c) => slot.insert(c),
                Err(e) => {
                    tracing::warn!(target, error = %e, "TimeoutNow: bad address");
                    return Asked::Failed;
                }
            };
        }
        let ttl = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .min(Duration::from_millis(200));
        if ttl.is_zero() {
            return Asked::Failed;
        }
        let Ok(req) = peer_request(self.id, &(), ttl) else {
            return Asked::Failed;
        };
        let mut client = RaftPeerClient::new(channels[&target].clone());
        match tokio::time::timeout(ttl, client.timeout_now(req)).await {
            Ok(Ok(reply)) => match decode::<Result<(), String>>(reply.get_ref()) {
                Ok(Err(why)) => {
                    tracing::info!(target, %why, "TimeoutNow refused; asking it no more");
                    Asked::Refused
                }
                _ => Asked::Accepted,
            },
            Ok(Err(s)) => {
                tracing::warn!(target, error = %s, "TimeoutNow failed");
                Asked::Failed
            }
            Err(_) => {
                tracing::warn!(target, "TimeoutNow timed out");
                Asked::Failed
            }
        }
    }
}

/// How a TimeoutNow went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asked {
    /// The follower campaigns.
    Accepted,
    /// It will not (it lost acknowledged entries, or follows another leader
    /// or candidate): not asked again.
    Refused,
    /// No answer (unreachable, timed out): another follower as caught up is
    /// asked next round.
    Failed,
}

/// One round of a leader's hand-over, decided from its own metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandOver {
    /// Another node leads: the hand-over is done.
    Done(NodeId),
    /// Ask this follower to campaign now.
    Ask(NodeId),
    /// Ask no one this round.
    Wait,
}

/// What a hand-over remembers between rounds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct HandOverState {
    /// This leader's last log index and each member's match index, from the
    /// last round in which it still led (none yet: `matches` is empty).
    last: Option<u64>,
    matches: Vec<(NodeId, Option<u64>)>,
    /// The follower asked last.
    asked: Option<NodeId>,
    /// Followers that refused to take over: never asked again.
    pub(crate) refused: BTreeSet<NodeId>,
    /// A follower that did not answer the last ask: next round another one
    /// as caught up is asked, if there is one.
    pub(crate) unreachable: Option<NodeId>,
}

/// How far behind the leader's log a follower may be to be handed leadership
/// by [`RaftNode::hand_over_refusal`]'s callers (it must catch up while writes
/// are paused).
pub const HAND_OVER_MAX_LAG: u64 = 10_000;

/// Why leader `me` should not start handing leadership to `target` (or, if
/// `None`, to any follower), given its `voters` and the followers `caught_up`
/// (heard from lately and within [`HAND_OVER_MAX_LAG`] entries): a target that
/// is not another voter, or none that is up and near, would leave writes
/// paused for the whole timeout. `None` also when `target` is `me`. No I/O.
pub fn hand_over_refusal(
    me: NodeId,
    target: Option<NodeId>,
    voters: &[NodeId],
    caught_up: &[NodeId],
) -> Option<String> {
    match target {
        Some(t) if t == me => None,
        Some(t) if !voters.contains(&t) => Some(format!(
            "node {t} is not another voter of this group (voters {voters:?})"
        )),
        Some(t) if !caught_up.contains(&t) => Some(format!(
            "node {t} is not heard from or is more than {HAND_OVER_MAX_LAG} entries behind"
        )),
        None if !caught_up.iter().any(|f| voters.contains(f)) => Some(format!(
            "no other voter is heard from and within {HAND_OVER_MAX_LAG} entries of the leader's log"
        )),
        _ => None,
    }
}

impl RaftNode {
    /// [`hand_over_refusal`] for this node (the leader) as it stands now.
    pub fn hand_over_refusal(&self, target: Option<NodeId>) -> Option<String> {
        let voters: Vec<NodeId> = self
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect();
        // The grace only matters to a node that does not lead.
        let view = self.replica_view(HAND_OVER_MAX_LAG, Duration::ZERO);
        hand_over_refusal(self.id, target, &voters, &view.caught_up)
    }
}

/// What node `me`, handing leadership over, does this round (`target`: the
/// only follower it may ask). `state` keeps its view from the last round in
/// which it still led: once a campaign it asked for has taken its leadership
/// (a newer term), it has no view of its own, and goes on by that one. It asks
/// a follower with the greatest match index, if that one holds the whole log
/// as last seen, every round until another node leads: a voter under this
/// leader's lease refuses the first campaigns, so asking again ends the
/// hand-over as soon as the lease does. It keeps asking the same follower
/// while that one stays among the most caught up (two asked in turn would
/// campaign against each other) and answers, never one that refused. A
/// follower whose log fell short of another's (an entry in flight as the hand-over began) is
/// never the one asked: asking it again and again starts round after round it
/// cannot win and breaks up the campaigns of the follower that can (seen in
/// deploy/compose: terms 5 to 27 in 5 s). No I/O.
pub(crate) fn hand_over_step(
    me: NodeId,
    target: Option<NodeId>,
    m: &openraft::RaftMetrics<NodeId, openraft::BasicNode>,
    state: &mut HandOverState,
) -> HandOver {
    if let Some(l) = m.current_leader.filter(|l| *l != me) {
        return HandOver::Done(l);
    }
    if m.state == openraft::ServerState::Leader {
        if let Some(r) = &m.replication {
            state.last = m.last_log_index;
            // Voters only: a learner told to campaign does not.
            let membership = m.membership_config.membership();
            state.matches = r
                .iter()
                .filter(|(id, _)| membership.voter_ids().any(|v| v == **id))
                .map(|(id, l)| (*id, l.map(|l| l.index)))
                .collect();
        }
    }
    let others = || state.matches.iter().filter(|(id, _)| *id != me);
    let Some(top) = others().map(|(_, matched)| *matched).max() else {
        return HandOver::Wait;
    };
    if top < state.last {
        return HandOver::Wait;
    }
    let mut candidates = others()
        .filter(|(id, matched)| {
            *matched == top && target.is_none_or(|t| t == *id) && !state.refused.contains(id)
        })
        .map(|(id, _)| *id);
    let skip = state.unreachable.take();
    let pick = match state.asked {
        Some(a) if a != skip.unwrap_or(me) && candidates.clone().any(|id| id == a) => Some(a),
        _ => candidates
            .clone()
            .filter(|id| Some(*id) != skip)
            .max()
            .or_else(|| candidates.next_back()),
    };
    state.asked = pick.or(state.asked);
    pick.map_or(HandOver::Wait, HandOver::Ask)
}

/// Re-enables heartbeats, elections and writes after a leadership transfer, however
/// it ends.
struct TransferGuard<'a> {
    node: &'a RaftNode,
}

impl Drop for TransferGuard<'_> {
    fn drop(&mut self) {
        self.node.raft.runtime_config().heartbeat(true);
        self.node.elections.release(Hold::Transfer);
        self.node.writer.set_paused(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{RaftMetrics, ServerState};
    use std::collections::BTreeMap;

    /// Leader 1 in term 3 with last log index 100 and these matches.
    fn leading(matches: &[(NodeId, Option<u64>)]) -> RaftMetrics<NodeId, openraft::BasicNode> {
        let mut m = RaftMetrics::new_initial(1);
        m.state = ServerState::Leader;
        m.current_term = 3;
        m.current_leader = Some(1);
        m.last_log_index = Some(100);
        let mut r: BTreeMap<NodeId, Option<crate::types::LogId>> =
            BTreeMap::from([(1, Some(crate::codec::log_id(3, 100)))]);
        for (id, i) in matches {
            r.insert(*id, i.map(|i| crate::codec::log_id(3, i)));
        }
        m.replication = Some(r);
        m.membership_config = voters(&[0, 1, 2], &[]);
        m
    }

    /// A membership of `voters` and `learners`.
    fn voters(
        voters: &[NodeId],
        learners: &[NodeId],
    ) -> std::sync::Arc<openraft::StoredMembership<NodeId, openraft::BasicNode>> {
        let nodes: BTreeMap<NodeId, openraft::BasicNode> = voters
            .iter()
            .chain(learners)
            .map(|&id| (id, openraft::BasicNode::new(format!("n{id}:1"))))
            .collect();
        std::sync::Arc::new(openraft::StoredMembership::new(
            None,
            openraft::Membership::new(vec![voters.iter().copied().collect()], nodes),
        ))
    }

    #[test]
    fn a_hand_over_starts_only_to_a_caught_up_voter() {
        let voters = [0, 1, 2];
        assert_eq!(hand_over_refusal(1, Some(2), &voters, &[0, 2]), None);
        assert_eq!(hand_over_refusal(1, None, &voters, &[2]), None);
        // Already the leader: nothing to refuse (and nothing to do).
        assert_eq!(hand_over_refusal(1, Some(1), &voters, &[]), None);
        assert!(hand_over_refusal(1, Some(9), &voters, &[0, 2])
            .unwrap()
            .contains("not another voter"));
        assert!(hand_over_refusal(1, Some(2), &voters, &[0])
            .unwrap()
            .contains("not heard from"));
        assert!(hand_over_refusal(1, None, &voters, &[]).is_some());
        // A learner caught up does not count.
        assert!(hand_over_refusal(1, None, &voters, &[3]).is_some());
    }

    #[test]
    fn a_learner_is_never_asked() {
        // Learner 3 holds the whole log, voter 0 does not yet.
        let mut m = leading(&[(0, Some(99)), (2, Some(90)), (3, Some(100))]);
        m.membership_config = voters(&[0, 1, 2], &[3]);
        assert_eq!(hand_over_step(1, None, &m, &mut fresh()), HandOver::Wait);
        let mut m = leading(&[(0, Some(100)), (2, Some(90)), (3, Some(100))]);
        m.membership_config = voters(&[0, 1, 2], &[3]);
        assert_eq!(hand_over_step(1, None, &m, &mut fresh()), HandOver::Ask(0));
    }

    /// The metrics of node 1 once a campaign in term 4 took its leadership.
    fn deposed() -> RaftMetrics<NodeId, openraft::BasicNode> {
        let mut m = leading(&[]);
        m.state = ServerState::Follower;
        m.current_term = 4;
        m.current_leader = None;
        m.replication = None;
        m
    }

    fn fresh() -> HandOverState {
        HandOverState::default()
    }

    #[test]
    fn a_leader_asks_only_a_follower_with_its_whole_log() {
        let m = leading(&[(0, Some(100)), (2, Some(99))]);
        assert_eq!(hand_over_step(1, None, &m, &mut fresh()), HandOver::Ask(0));
        assert_eq!(hand_over_step(1, Some(2), &m, &mut fresh()), HandOver::Wait);
        let m = leading(&[(0, Some(90)), (2, None)]);
        assert_eq!(hand_over_step(1, None, &m, &mut fresh()), HandOver::Wait);
        // Two with the whole log: a target given is asked when it holds it.
        let m = leading(&[(0, Some(100)), (2, Some(100))]);
        assert_eq!(hand_over_step(1, None, &m, &mut fresh()), HandOver::Ask(2));
        assert_eq!(
            hand_over_step(1, Some(0), &m, &mut fresh()),
            HandOver::Ask(0)
        );
    }

    #[test]
    fn the_follower_asked_stays_the_one_asked_unless_outrun_or_refusing() {
        let mut state = fresh();
        let m = leading(&[(0, Some(100)), (2, Some(99))]);
        assert_eq!(hand_over_step(1, None, &m, &mut state), HandOver::Ask(0));
        // Follower 2 catches up: still 0, not two candidates in turn.
        let m = leading(&[(0, Some(100)), (2, Some(100))]);
        assert_eq!(hand_over_step(1, None, &m, &mut state), HandOver::Ask(0));
        // 0 refuses: 2 is asked, and 0 never again.
        state.refused.insert(0);
        assert_eq!(hand_over_step(1, None, &m, &mut state), HandOver::Ask(2));
        state.refused.insert(2);
        assert_eq!(hand_over_step(1, None, &m, &mut state), HandOver::Wait);
    }

    #[test]
    fn a_follower_that_did_not_answer_gives_way_to_one_as_caught_up_for_a_round() {
        let mut state = fresh();
        let m = leading(&[(0, Some(100)), (2, Some(100))]);
        assert_eq!(hand_over_step(1, None, &m, &mut state), HandOver::Ask(2));
        state.unreachable = Some(2);
        assert_eq!(hand_over_step(1, None, &m, &mut state), HandOver::Ask(0));
        // 0 is now the one asked.
        assert_eq!(hand_over_step(1, None, &m, &mut state), HandOver::Ask(0));
        // Alone at the top, an unanswering follower is asked again.
        let mut state = fresh();
        let m = leading(&[(0, Some(90)), (2, Some(100))]);
        state.unreachable = Some(2);
        assert_eq!(hand_over_step(1, None, &m, &mut state), HandOver::Ask(2));
    }

    #[test]
    fn a_deposed_leader_asks_again_by_its_last_view_and_never_a_shorter_log() {
        // The asked follower campaigned and lost to the old leader's lease:
        // asked again, by the view from the last round it led in.
        let mut state = fresh();
        let m = leading(&[(0, Some(100)), (2, Some(98))]);
        assert_eq!(hand_over_step(1, None, &m, &mut state), HandOver::Ask(0));
        assert_eq!(
            hand_over_step(1, None, &deposed(), &mut state),
            HandOver::Ask(0)
        );
        // An entry in flight reached follower 2 but not 0 before the campaign:
        // 2 is asked, 0 (which cannot win) never again.
        let mut state = fresh();
        let mut m = leading(&[(0, Some(100)), (2, Some(100))]);
        assert_eq!(hand_over_step(1, None, &m, &mut state), HandOver::Ask(2));
        let mut state = fresh();
        m = leading(&[(0, Some(100)), (2, Some(99))]);
        assert_eq!(hand_over_step(1, None, &m, &mut state), HandOver::Ask(0));
        m = leading(&[(0, Some(100)), (2, Some(101))]);
        m.last_log_index = Some(101);
        assert_eq!(hand_over_step(1, None, &m, &mut state), HandOver::Ask(2));
        assert_eq!(
            hand_over_step(1, None, &deposed(), &mut state),
            HandOver::Ask(2)
        );
        assert_eq!(
            hand_over_step(1, Some(0), &deposed(), &mut state),
            HandOver::Wait
        );
        // Never led during the hand-over: no view, no ask.
        assert_eq!(
            hand_over_step(1, None, &deposed(), &mut fresh()),
            HandOver::Wait
        );
        // Another node leads: done.
        let mut m = deposed();
        m.current_leader = Some(2);
        assert_eq!(hand_over_step(1, None, &m, &mut state), HandOver::Done(2));
    }
}
