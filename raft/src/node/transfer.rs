//! Graceful leadership transfer (rolling restarts, SIGTERM): the leader stops
//! taking writes, waits for a follower to hold its whole log, then has it campaign.

use std::time::Duration;

use super::RaftNode;
use crate::elections::Hold;
use crate::error::RaftNodeError;
use crate::network::pb::raft_peer_client::RaftPeerClient;
use crate::network::{lazy_channel, peer_request};
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
        let target = loop {
            let m = self.raft.metrics().borrow().clone();
            if m.current_leader != Some(self.id) {
                return Err(RaftNodeError::NotLeader {
                    leader: m.current_leader,
                });
            }
            let last = m.last_log_index;
            let repl = m.replication.clone().unwrap_or_default();
            let caught_up = repl
                .iter()
                .filter(|(id, _)| **id != self.id && target.is_none_or(|t| t == **id))
                .filter(|(_, matched)| matched.map(|l| l.index) >= last)
                .map(|(id, _)| *id)
                .next();
            if let Some(t) = caught_up {
                break t;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(RaftNodeError::Timeout {
                    timeout_ms: timeout.as_millis() as u64,
                });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let addr = self
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .get_node(&target)
            .map(|n| n.addr.clone())
            .ok_or(RaftNodeError::InvalidInput(format!(
                "node {target} is not a member"
            )))?;
        // openraft 0.9 followers refuse votes while the leader's lease (the maximum
        // election timeout since its last heartbeat) holds, so the leader stops
        // heartbeating and stays out of elections, and keeps asking the target to
        // campaign until it wins.
        self.raft.runtime_config().heartbeat(false);
        self.elections.hold(Hold::Transfer);
        let result = self.campaign_until_leader(target, &addr, deadline).await;
        result.map_err(|e| match e {
            RaftNodeError::Timeout { .. } => RaftNodeError::Timeout {
                timeout_ms: timeout.as_millis() as u64,
            },
            other => other,
        })
    }

    async fn campaign_until_leader(
        &self,
        target: NodeId,
        addr: &str,
        deadline: tokio::time::Instant,
    ) -> Result<NodeId, RaftNodeError> {
        let fail = |reason: String| RaftNodeError::Forward {
            leader: target,
            reason,
            sent: true,
        };
        let channel = lazy_channel(addr, Duration::from_millis(500)).map_err(fail)?;
        let mut rx = self.raft.metrics();
        loop {
            let req = peer_request(self.id, &(), Duration::from_secs(1))
                .map_err(|s| fail(s.to_string()))?;
            let mut client = RaftPeerClient::new(channel.clone());
            match tokio::time::timeout(Duration::from_secs(1), client.timeout_now(req)).await {
                Ok(Ok(_)) => {}
                Ok(Err(s)) => tracing::warn!(target, error = %s, "TimeoutNow failed"),
                Err(_) => tracing::warn!(target, "TimeoutNow timed out"),
            }
            let round_end =
                (tokio::time::Instant::now() + Duration::from_millis(200)).min(deadline);
            loop {
                let leader = rx.borrow().current_leader;
                if let Some(l) = leader.filter(|l| *l != self.id) {
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
