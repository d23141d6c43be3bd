//! Who leads, as the nodes say and as the name server says.
//!
//! The nemesis asks the nodes themselves ([`nodes_leader`]: each node's LogDigest
//! admin answer names the leader it knows and its current term), so a name server
//! that is cut off, or has expired every node during a partition, does not leave
//! it without a target. After a name-server partition heals, [`route_check`] waits
//! for the name server's route (`mqadmin topicRoute`) to name the leader the nodes
//! report again: a route still stale after [`ROUTE_BOUND`] is a finding.

use std::time::{Duration, Instant};

use crate::access::Access;
use crate::hosts::Network;
use crate::procs::{client_addr, Cluster, CLIENT_HOST, NODES};
use crate::workload::in_namespace;

/// Deadline of one node's answer.
const CALL_TIMEOUT: Duration = Duration::from_millis(800);

/// How long after a name-server partition heals its route must name the actual
/// leader again.
pub const ROUTE_BOUND: Duration = Duration::from_secs(10);

/// The topic whose route [`route_check`] reads (one the workload uses).
pub const ROUTE_TOPIC: &str = "JNormal";

/// One node's own view: (the leader it knows, its current term); None when it
/// did not answer within [`CALL_TIMEOUT`] or knows no leader.
async fn view(access: Access, addr: String) -> Option<(u64, u64)> {
    let (_, leader, term) = crate::roles::self_view(&access, &addr, CALL_TIMEOUT).await?;
    Some((leader?, term))
}

/// The leader named with the highest term among `views` (node id, term), if
/// any names one.
pub fn highest_claim(views: &[Option<(u64, u64)>]) -> Option<(usize, u64)> {
    views
        .iter()
        .flatten()
        .max_by_key(|(_, term)| *term)
        .map(|&(l, t)| (l as usize, t))
        .filter(|(l, _)| *l < NODES)
}

/// The leader and its term as the nodes reachable from the clients' host say
/// (the highest term's claim: a node cut off from the clients is still named by
/// its followers). None when no node answers or none knows a leader.
pub fn nodes_leader(c: &Cluster, net: &Network) -> Option<(usize, u64)> {
    let access = c.access().clone();
    let views = in_namespace(&net.host_ns(CLIENT_HOST), move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        Some(rt.block_on(async {
            let calls: Vec<_> = (0..NODES)
                .map(|i| tokio::spawn(view(access.clone(), client_addr(i))))
                .collect();
            let mut out = Vec::new();
            for c in calls {
                out.push(c.await.ok().flatten());
            }
            out
        }))
    })
    .ok()
    .flatten()?;
    highest_claim(&views)
}

/// The leader node id the first broker group of `mqadmin topicRoute` output
/// names (`... leader ADDR (node N, term T)`); None for `(none)` or no group.
pub fn parse_route_leader(text: &str) -> Option<usize> {
    let line = text.lines().find(|l| l.starts_with("topic "))?;
    if line.contains("leader (none)") {
        return None;
    }
    let rest = line.split("(node ").nth(1)?;
    rest.split(',').next()?.trim().parse().ok()
}

/// After a name-server partition heals: polls every 250 ms until the name
/// server's route for [`ROUTE_TOPIC`] names the leader the nodes report, for up
/// to `bound`. Returns `Ok(ms it took)`, or `Err(a finding)` naming what the
/// route said last.
pub fn route_check(c: &Cluster, net: &Network, bound: Duration) -> Result<u64, String> {
    let start = Instant::now();
    let mut last = String::from("nothing asked yet");
    while start.elapsed() < bound {
        let actual = nodes_leader(c, net).map(|l| l.0);
        match c.admin(net, &["topicRoute", "-t", ROUTE_TOPIC]) {
            Ok(out) => {
                let named = parse_route_leader(&out);
                if named.is_some() && named == actual {
                    return Ok(start.elapsed().as_millis() as u64);
                }
                last = format!(
                    "the route named leader {named:?} while the nodes said {actual:?}: {}",
                    out.lines().next().unwrap_or("").trim()
                );
            }
            Err(e) => last = format!("topicRoute failed: {e}"),
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Err(format!(
        "{} s after a name-server partition healed its route for {ROUTE_TOPIC} still did not name the actual leader ({last})",
        bound.as_secs()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_highest_terms_claim_wins_and_silence_names_nobody() {
        assert_eq!(highest_claim(&[None, None, None]), None);
        assert_eq!(
            highest_claim(&[Some((0, 3)), None, Some((2, 4))]),
            Some((2, 4))
        );
        // A claim naming a node outside the group is not a target.
        assert_eq!(highest_claim(&[Some((7, 9))]), None);
    }

    #[test]
    fn route_leaders_are_read_from_topic_route() {
        let text = "topic JNormal group broker-a cluster JepsenCluster: 4 queues, perm 6, leader 10.77.0.12:8081 (node 2, term 5)\n  node 0 10.77.0.10:8081 follower term 5 commit 9\n";
        assert_eq!(parse_route_leader(text), Some(2));
        let none = "topic JNormal group broker-a cluster JepsenCluster: 4 queues, perm 6, leader (none) (node 0, term 0)\n";
        assert_eq!(parse_route_leader(none), None);
        assert_eq!(parse_route_leader(""), None);
    }
}
