//! A node's role as the layers above Raft need it: role, term, known leader and the
//! term it is ready to serve as leader in, published on a watch that changes only
//! when one of them does (openraft's metrics change with every applied entry).

use openraft::{RaftMetrics, ServerState};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::types::NodeId;

/// This node's part in its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeRole {
    /// Leads its term.
    Leader,
    /// Follows a leader (or waits for one).
    Follower,
    /// Campaigns for votes.
    Candidate,
    /// Receives the log without a vote.
    Learner,
    /// The Raft core stopped (shut down or failed).
    Stopped,
}

/// What [`crate::RaftNode::status`] publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeStatus {
    /// This node's role.
    pub role: NodeRole,
    /// Its current term.
    pub term: u64,
    /// The leader it knows of in that term, if any (itself when it leads).
    pub leader: Option<NodeId>,
    /// `Some(term)` once this node leads `term` (openraft's state is Leader) and
    /// has applied an entry of that term, so every command committed by earlier leaders (consumer offsets, FIFO
    /// leases) is in its metadata; `None` otherwise. Services that belong to one
    /// leader term start when it becomes `Some` and stop when it changes.
    pub ready_term: Option<u64>,
}

impl NodeStatus {
    /// The status that openraft's metrics `m` describe (pure).
    pub fn from_metrics(m: &RaftMetrics<NodeId, openraft::BasicNode>) -> Self {
        let role = match (m.state, &m.running_state) {
            (_, Err(_)) | (ServerState::Shutdown, _) => NodeRole::Stopped,
            (ServerState::Leader, _) => NodeRole::Leader,
            (ServerState::Follower, _) => NodeRole::Follower,
            (ServerState::Candidate, _) => NodeRole::Candidate,
            (ServerState::Learner, _) => NodeRole::Learner,
        };
        let applied_term = m.last_applied.map(|l| l.leader_id.term);
        let ready = role == NodeRole::Leader && applied_term == Some(m.current_term);
        Self {
            role,
            term: m.current_term,
            leader: m.current_leader,
            ready_term: ready.then_some(m.current_term),
        }
    }
}

/// Publishes [`NodeStatus::from_metrics`] of every metrics change on a watch that
/// notifies only real changes. The task ends (after publishing `NodeRole::Stopped`)
/// when openraft drops its metrics, or when no receiver is left.
pub(crate) fn spawn_status_watch(
    mut metrics: watch::Receiver<RaftMetrics<NodeId, openraft::BasicNode>>,
) -> (watch::Receiver<NodeStatus>, JoinHandle<()>) {
    let first = NodeStatus::from_metrics(&metrics.borrow_and_update());
    let (tx, rx) = watch::channel(first);
    let task = tokio::spawn(async move {
        loop {
            tokio::select! {
                changed = metrics.changed() => {
                    let next = match changed {
                        Ok(()) => NodeStatus::from_metrics(&metrics.borrow_and_update()),
                        Err(_) => NodeStatus { role: NodeRole::Stopped, ready_term: None, ..*tx.borrow() },
                    };
                    tx.send_if_modified(|cur| {
                        let modified = *cur != next;
                        *cur = next;
                        modified
                    });
                    if changed.is_err() {
                        return;
                    }
                }
                _ = tx.closed() => return,
            }
        }
    });
    (rx, task)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::log_id;

    fn metrics(
        state: ServerState,
        term: u64,
        leader: Option<NodeId>,
        applied_term: Option<u64>,
    ) -> RaftMetrics<NodeId, openraft::BasicNode> {
        let mut m = RaftMetrics::new_initial(1);
        m.state = state;
        m.current_term = term;
        m.current_leader = leader;
        m.last_applied = applied_term.map(|t| log_id(t, 7));
        m
    }

    #[test]
    fn a_leader_is_ready_only_once_it_applied_an_entry_of_its_own_term() {
        let s = NodeStatus::from_metrics(&metrics(ServerState::Leader, 5, Some(1), Some(4)));
        assert_eq!((s.role, s.term, s.ready_term), (NodeRole::Leader, 5, None));
        let s = NodeStatus::from_metrics(&metrics(ServerState::Leader, 5, Some(1), Some(5)));
        assert_eq!(s.ready_term, Some(5));
        let s = NodeStatus::from_metrics(&metrics(ServerState::Leader, 5, Some(1), None));
        assert_eq!(s.ready_term, None);
    }

    #[test]
    fn followers_candidates_learners_and_a_stopped_node_are_not_ready() {
        for (state, role) in [
            (ServerState::Follower, NodeRole::Follower),
            (ServerState::Candidate, NodeRole::Candidate),
            (ServerState::Learner, NodeRole::Learner),
            (ServerState::Shutdown, NodeRole::Stopped),
        ] {
            let s = NodeStatus::from_metrics(&metrics(state, 5, Some(2), Some(5)));
            assert_eq!((s.role, s.leader, s.ready_term), (role, Some(2), None));
        }
        let mut failed = metrics(ServerState::Leader, 5, Some(1), Some(5));
        failed.running_state = Err(openraft::error::Fatal::Panicked);
        let s = NodeStatus::from_metrics(&failed);
        assert_eq!((s.role, s.ready_term), (NodeRole::Stopped, None));
    }

    /// Lets the status task (on this current-thread runtime) handle what was sent.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn the_watch_notifies_changes_of_status_only_and_ends_stopped() {
        let (tx, rx) = watch::channel(metrics(ServerState::Follower, 1, None, Some(1)));
        let (mut status, task) = spawn_status_watch(rx);
        assert_eq!(status.borrow().role, NodeRole::Follower);
        // An apply that changes nothing the status holds is not published.
        tx.send_modify(|m| m.last_log_index = Some(9));
        settle().await;
        assert!(!status.has_changed().unwrap());
        tx.send_modify(|m| {
            m.state = ServerState::Leader;
            m.current_term = 2;
            m.current_leader = Some(1);
        });
        status.changed().await.unwrap();
        assert_eq!(
            *status.borrow_and_update(),
            NodeStatus {
                role: NodeRole::Leader,
                term: 2,
                leader: Some(1),
                ready_term: None
            }
        );
        tx.send_modify(|m| {
            m.last_applied = Some(log_id(2, 10));
        });
        status.changed().await.unwrap();
        assert_eq!(status.borrow_and_update().ready_term, Some(2));
        // More applies in the same term: nothing new to publish.
        tx.send_modify(|m| {
            m.last_applied = Some(log_id(2, 11));
        });
        settle().await;
        assert!(!status.has_changed().unwrap());
        drop(tx);
        status.changed().await.unwrap();
        let last = *status.borrow_and_update();
        assert_eq!((last.role, last.ready_term), (NodeRole::Stopped, None));
        task.await.unwrap();
        assert!(status.changed().await.is_err());
    }
}
