//! Each node's role and term over the run, for the report's plot: sampled from
//! the clients' host by asking every node for its own view (the LogDigest admin
//! call with no entries), so a node that cannot be reached shows as such.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ledgermq_proto::admin_pb::LogDigestRequest;
use serde::Serialize;

use crate::access::Access;
use crate::workload::Recorder;

/// What a node said of itself at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// It leads (its known leader is itself).
    Leader,
    /// It follows a leader it knows.
    Follower,
    /// It knows no leader (an election is under way, or it is cut off).
    NoLeader,
    /// It did not answer within the sample's deadline (down, paused, cut off
    /// from the clients).
    Unreachable,
}

/// One sample of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RoleSample {
    /// When, ms since the run started.
    pub t_ms: u64,
    /// Which node (index into the run's nodes).
    pub node: usize,
    /// Its role.
    pub role: Role,
    /// Its current term (None when unreachable).
    pub term: Option<u64>,
}

/// Time between two rounds of samples.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(250);

/// Deadline of one node's answer.
const SAMPLE_TIMEOUT: Duration = Duration::from_millis(400);

/// One node's own view, from its LogDigest answer with no entries: (its node id,
/// the leader it knows, its current term); None when it did not answer within
/// `timeout` or answered an error. Call from inside the clients' namespace.
pub async fn self_view(
    access: &Access,
    addr: &str,
    timeout: Duration,
) -> Option<(u64, Option<u64>, u64)> {
    let call = async {
        let mut c = access.admin(addr, Some(timeout)).await.ok()?;
        let r = c
            .log_digest(LogDigestRequest {
                from_index: u64::MAX,
                max_entries: 1,
            })
            .await
            .ok()?
            .into_inner();
        r.error
            .is_empty()
            .then_some((r.node_id, r.leader_id, r.current_term))
    };
    tokio::time::timeout(timeout, call).await.ok()?
}

async fn sample_one(access: Access, addr: String) -> Option<(Role, u64)> {
    let (node_id, leader, term) = self_view(&access, &addr, SAMPLE_TIMEOUT).await?;
    let role = match leader {
        Some(l) if l == node_id => Role::Leader,
        Some(_) => Role::Follower,
        None => Role::NoLeader,
    };
    Some((role, term))
}

/// Samples every node every [`SAMPLE_INTERVAL`] until `done` is set; returns the
/// samples in time order. Call from inside the clients' namespace.
pub async fn sample(
    access: Access,
    nodes: Vec<String>,
    rec: Recorder,
    done: Arc<AtomicBool>,
) -> Vec<RoleSample> {
    let mut out = Vec::new();
    while !done.load(Ordering::Relaxed) {
        let t_ms = rec.now_ms();
        let round: Vec<_> = nodes
            .iter()
            .map(|n| tokio::spawn(sample_one(access.clone(), n.clone())))
            .collect();
        for (node, h) in round.into_iter().enumerate() {
            let a = h.await.ok().flatten();
            out.push(RoleSample {
                t_ms,
                node,
                role: a.map_or(Role::Unreachable, |a| a.0),
                term: a.map(|a| a.1),
            });
        }
        tokio::time::sleep(SAMPLE_INTERVAL).await;
    }
    out
}

/// The spans (from, to, role) of one node's samples where its role stayed the
/// same, ms; a span ends where the next begins (the last at its last sample).
pub fn role_spans(samples: &[RoleSample], node: usize) -> Vec<(u64, u64, Role)> {
    let mine: Vec<&RoleSample> = samples.iter().filter(|s| s.node == node).collect();
    let mut spans: Vec<(u64, u64, Role)> = Vec::new();
    for s in &mine {
        match spans.last_mut() {
            Some(last) if last.2 == s.role => last.1 = s.t_ms,
            Some(last) => {
                last.1 = s.t_ms;
                spans.push((s.t_ms, s.t_ms, s.role));
            }
            None => spans.push((s.t_ms, s.t_ms, s.role)),
        }
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_join_equal_roles_and_meet_at_changes() {
        let s = |t_ms, node, role| RoleSample {
            t_ms,
            node,
            role,
            term: Some(1),
        };
        let samples = [
            s(0, 0, Role::Leader),
            s(0, 1, Role::Follower),
            s(250, 0, Role::Leader),
            s(500, 0, Role::Unreachable),
            s(750, 0, Role::Unreachable),
            s(1000, 0, Role::Follower),
        ];
        assert_eq!(
            role_spans(&samples, 0),
            vec![
                (0, 500, Role::Leader),
                (500, 1000, Role::Unreachable),
                (1000, 1000, Role::Follower)
            ]
        );
        assert_eq!(role_spans(&samples, 1), vec![(0, 0, Role::Follower)]);
        assert!(role_spans(&samples, 2).is_empty());
    }
}
