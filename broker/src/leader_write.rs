//! Leader-local writes (`RaftNode::write_messages_as_leader`,
//! `write_command_as_leader`) whose outcome may be unknown: which errors come
//! before the entry is proposed, and waiting until an entry that may have been
//! proposed is applied, or the term ends. Used by the timer delivery, consumer
//! offset resets and transaction ends.

use std::time::Duration;

use ledgermq_raft::{RaftNode, RaftNodeError};

/// Longest wait for a write whose outcome is unknown to be applied or not.
pub(crate) const SETTLE_WAIT: Duration = Duration::from_secs(10);

/// True unless `e`, from a leader-local write ([`RaftNode::write_messages_as_leader`],
/// `write_command_as_leader`),
/// was raised before the entry was proposed: refusals of the leader's checks
/// (not the leader, cut off, overloaded, the store's room and size checks, a
/// command set) come first; a timeout, an abandoned wait, openraft's own
/// failures and a shutdown may come after the proposal.
pub(crate) fn may_have_been_proposed(e: &RaftNodeError) -> bool {
    !matches!(
        e,
        RaftNodeError::NotLeader { .. }
            | RaftNodeError::NoLeader
            | RaftNodeError::Expired
            | RaftNodeError::CutOff { .. }
            | RaftNodeError::LeaderUnreachable { .. }
            | RaftNodeError::Overloaded { .. }
            | RaftNodeError::InvalidInput(_)
            | RaftNodeError::Store(_)
            | RaftNodeError::MembersCannotDecode { .. }
    )
}

/// Waits, at most `limit`, until `node` has applied every entry its log holds
/// now and at least log index `at_least`, or its term is no longer `term`.
/// True if it did so within `term`.
pub(crate) async fn settle(node: &RaftNode, term: u64, at_least: u64, limit: Duration) -> bool {
    let mut metrics = node.raft().metrics();
    let target = metrics.borrow().last_log_index.unwrap_or(0).max(at_least);
    let waited = tokio::time::timeout(
        limit,
        metrics.wait_for(|m| {
            m.current_term != term || m.last_applied.is_some_and(|l| l.index >= target)
        }),
    )
    .await;
    match waited {
        Ok(Ok(m)) => m.current_term == term,
        _ => {
            tracing::warn!(
                term,
                "a write's outcome (a consumer offset reset, a transaction's end) is still unknown after {limit:?}"
            );
            false
        }
    }
}
