//! The AddNode and RemoveNode admin calls (`mqadmin addNode` / `removeNode`):
//! membership changes made by the group's leader through
//! `RaftNode::change_membership`, from whichever member the call reaches.

use std::sync::Arc;
use std::time::Duration;

use ledgermq_raft::node::{ChangeDone, MembershipChange, MembershipOutcome};
use ledgermq_raft::{RaftNode, RaftNodeError};

use crate::admin_pb::{AddNodeRequest, MembershipResponse, RemoveNodeRequest};

/// How long an AddNode waits when the request names no timeout: catching up
/// may copy a whole CommitLog.
const DEFAULT_ADD_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a RemoveNode waits when the request names no timeout.
const DEFAULT_REMOVE_TIMEOUT: Duration = Duration::from_secs(60);

fn timeout(ms: u64, default: Duration) -> Duration {
    if ms == 0 {
        default
    } else {
        Duration::from_millis(ms)
    }
}

/// The answer for a change's `result`.
pub fn response(result: Result<MembershipOutcome, RaftNodeError>) -> MembershipResponse {
    match result {
        Ok(o) => MembershipResponse {
            error: String::new(),
            done: match o.done {
                ChangeDone::Added => "added",
                ChangeDone::AlreadyVoter => "already_voter",
                ChangeDone::Removed => "removed",
                ChangeDone::NotMember => "not_member",
            }
            .into(),
            voters: o.voters,
            learners: o.learners,
        },
        Err(e) => MembershipResponse {
            error: e.to_string(),
            ..Default::default()
        },
    }
}

/// Adds the node `r` names, through `node`'s group leader.
pub async fn add_node(node: &Arc<RaftNode>, r: AddNodeRequest) -> MembershipResponse {
    tracing::info!(node_id = r.node_id, peer_addr = %r.peer_addr, "addNode asked");
    let change = MembershipChange::AddVoter {
        id: r.node_id,
        addr: r.peer_addr,
    };
    response(
        node.change_membership(change, timeout(r.timeout_ms, DEFAULT_ADD_TIMEOUT))
            .await,
    )
}

/// Removes the node `r` names, through `node`'s group leader.
pub async fn remove_node(node: &Arc<RaftNode>, r: RemoveNodeRequest) -> MembershipResponse {
    tracing::info!(node_id = r.node_id, "removeNode asked");
    let change = MembershipChange::Remove { id: r.node_id };
    response(
        node.change_membership(change, timeout(r.timeout_ms, DEFAULT_REMOVE_TIMEOUT))
            .await,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outcome_and_an_error_read_as_the_operator_needs() {
        let r = response(Ok(MembershipOutcome {
            done: ChangeDone::Added,
            voters: vec![0, 1, 3],
            learners: vec![2],
        }));
        assert_eq!(
            (r.error.as_str(), r.done.as_str(), r.voters, r.learners),
            ("", "added", vec![0, 1, 3], vec![2])
        );
        let r = response(Err(RaftNodeError::CatchUpTimeout {
            id: 3,
            matched_index: Some(10),
            target_index: 99,
            timeout_ms: 5,
        }));
        assert!(r.error.contains("stays a learner"), "{}", r.error);
        assert!(r.done.is_empty() && r.voters.is_empty());
    }
}
