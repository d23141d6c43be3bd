//! `mqadmin addNode` and `removeNode`: membership changes of one broker group,
//! asked of the first of its members that can be reached (it passes the change
//! to the leader).

use std::time::Duration;

use anyhow::{bail, Result};
use ledgermq_broker::admin_pb::{AddNodeRequest, MembershipResponse, RemoveNodeRequest};

/// A change to ask of a group.
pub enum Change {
    /// Add node `id` at Raft peer address `peer_addr`.
    Add { id: u64, peer_addr: String },
    /// Remove node `id`.
    Remove { id: u64 },
}

/// Asks `change` of the first of `members` (client addresses, the leader first)
/// that can be connected to, waiting up to `timeout` for the answer; prints the
/// membership afterwards. A member that cannot be connected to is skipped; one
/// that took the call answers for the group (asking another could not undo it).
pub async fn change(
    group: &str,
    members: &[String],
    change: Change,
    timeout: Duration,
) -> Result<()> {
    let mut unreachable = Vec::new();
    for addr in members {
        // Connecting is bounded by `channel`; the call by the change's own timeout
        // plus a margin for the answer to come back.
        let channel =
            match crate::cluster::channel(addr, Some(timeout + Duration::from_secs(5))).await {
                Ok(c) => c,
                Err(e) => {
                    unreachable.push(format!("{addr}: {e}"));
                    continue;
                }
            };
        let mut client = crate::cluster::admin_client(channel);
        let timeout_ms = timeout.as_millis() as u64;
        let answer = match &change {
            Change::Add { id, peer_addr } => {
                client
                    .add_node(AddNodeRequest {
                        node_id: *id,
                        peer_addr: peer_addr.clone(),
                        timeout_ms,
                    })
                    .await
            }
            Change::Remove { id } => {
                client
                    .remove_node(RemoveNodeRequest {
                        node_id: *id,
                        timeout_ms,
                    })
                    .await
            }
        };
        let r = match answer {
            Ok(r) => r.into_inner(),
            Err(s) => bail!("{group}: {addr} took the change and failed: {s} (raftStatus shows where it stands)"),
        };
        return report(group, &change, &r);
    }
    bail!(
        "{group}: no member could be reached: {}",
        unreachable.join("; ")
    )
}

/// Prints `r`, the answer to `change` of `group`; an error answer is the error.
fn report(group: &str, change: &Change, r: &MembershipResponse) -> Result<()> {
    if !r.error.is_empty() {
        bail!("{group}: {}", r.error);
    }
    let id = match change {
        Change::Add { id, .. } | Change::Remove { id } => *id,
    };
    let what = match r.done.as_str() {
        "added" => format!("node {id} added: it votes"),
        "already_voter" => format!("node {id} already votes at that address: nothing changed"),
        "removed" => format!(
            "node {id} removed: stop it, and do not start it again with its store (a node that comes back gets a new id and an empty store)"
        ),
        "not_member" => format!("node {id} is not a member: nothing changed"),
        other => format!("node {id}: {other}"),
    };
    println!("{group}: {what}");
    println!("{group}: voters {:?}, learners {:?}", r.voters, r.learners);
    Ok(())
}
