//! The RaftStatus admin call: a node's own view of its Raft group, from its
//! openraft metrics (no I/O here), for `mqadmin raftStatus`.

use ledgermq_raft::NodeId;
use openraft::{BasicNode, RaftMetrics, ServerState};

use crate::admin_pb::{FollowerProgress, RaftStatusResponse};

/// The status `metrics` (of node `node_id`) describe: role (`stopped` once
/// the Raft core has ended), term, leader, last log and applied index,
/// voters, and for a running leader each other member's match index and lag
/// in entries (unknown until it first answers in this term).
pub fn raft_status(
    node_id: NodeId,
    metrics: &RaftMetrics<NodeId, BasicNode>,
) -> RaftStatusResponse {
    let role = match metrics.state {
        _ if metrics.running_state.is_err() => "stopped",
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "stopped",
    };
    let last = metrics.last_log_index;
    let followers = match (&metrics.replication, metrics.state) {
        (Some(replication), ServerState::Leader) if metrics.running_state.is_ok() => replication
            .iter()
            .filter(|(id, _)| **id != node_id)
            .map(|(id, matched)| {
                let match_index = matched.as_ref().map(|l| l.index);
                FollowerProgress {
                    node_id: *id,
                    match_index,
                    lag_entries: match_index.map(|m| last.unwrap_or(0).saturating_sub(m)),
                }
            })
            .collect(),
        _ => Vec::new(),
    };
    RaftStatusResponse {
        node_id,
        role: role.into(),
        term: metrics.current_term,
        leader_id: metrics.current_leader,
        last_log_index: last,
        applied_index: metrics.last_applied.map(|l| l.index),
        voters: metrics.membership_config.membership().voter_ids().collect(),
        learners: metrics
            .membership_config
            .membership()
            .learner_ids()
            .collect(),
        followers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_leader_reports_each_followers_match_and_lag() {
        let mut m = RaftMetrics::new_initial(1);
        m.state = ServerState::Leader;
        m.current_term = 3;
        m.current_leader = Some(1);
        m.last_log_index = Some(100);
        m.last_applied = Some(openraft::LogId::new(
            openraft::CommittedLeaderId::new(3, 1),
            99,
        ));
        m.replication = Some(BTreeMap::from([
            (
                0,
                Some(openraft::LogId::new(
                    openraft::CommittedLeaderId::new(3, 1),
                    90,
                )),
            ),
            (
                1,
                Some(openraft::LogId::new(
                    openraft::CommittedLeaderId::new(3, 1),
                    100,
                )),
            ),
            (2, None),
        ]));
        let s = raft_status(1, &m);
        assert_eq!(
            (s.role.as_str(), s.term, s.leader_id),
            ("leader", 3, Some(1))
        );
        assert_eq!((s.last_log_index, s.applied_index), (Some(100), Some(99)));
        let f: Vec<_> = s
            .followers
            .iter()
            .map(|f| (f.node_id, f.match_index, f.lag_entries))
            .collect();
        assert_eq!(f, vec![(0, Some(90), Some(10)), (2, None, None)]);
        // A follower lists none.
        m.state = ServerState::Follower;
        m.current_leader = Some(0);
        let s = raft_status(1, &m);
        assert_eq!(
            (s.role.as_str(), s.leader_id, s.followers.len()),
            ("follower", Some(0), 0)
        );
        // A core that ended: stopped, whatever its last state.
        m.state = ServerState::Leader;
        m.running_state = Err(openraft::error::Fatal::Panicked);
        let s = raft_status(1, &m);
        assert_eq!((s.role.as_str(), s.followers.len()), ("stopped", 0));
    }
}
