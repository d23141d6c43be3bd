//! Whether this node is in touch with its group: the last time it heard from each
//! peer (an RPC the peer sent it, or a reply to one it sent), and the decision
//! whether a majority (itself included) was heard from within a window.
//!
//! openraft 0.9 has no check-quorum: a leader cut off in a minority keeps its role,
//! and a follower cut off from the leader keeps forwarding to it, so every write
//! sent to such a node waits for the whole write timeout. With this a node that has
//! not heard from a majority for an election timeout answers writes at once with a
//! retryable error, and tells the name servers it is cut off.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::types::NodeId;

/// True if `self_id` plus the peers heard from within `window` before `now` make
/// a majority of `members` (which includes `self_id`). No I/O.
pub fn quorum_in_contact(
    now: Instant,
    last_heard: &HashMap<NodeId, Instant>,
    members: &[NodeId],
    self_id: NodeId,
    window: Duration,
) -> bool {
    let heard = members
        .iter()
        .filter(|&&m| {
            m == self_id
                || last_heard
                    .get(&m)
                    .is_some_and(|&t| now.saturating_duration_since(t) <= window)
        })
        .count();
    heard > members.len() / 2
}

/// Last contact with each peer; cheap to clone (shared by the peer server, the
/// peer client and the node).
#[derive(Clone, Debug)]
pub struct Contacts {
    self_id: NodeId,
    /// The voters of the group's membership (followed by
    /// `RaftNode`'s membership watch as changes are applied).
    members: Arc<Mutex<Vec<NodeId>>>,
    window: Duration,
    last_heard: Arc<Mutex<HashMap<NodeId, Instant>>>,
    /// When a leader's AppendEntries (entries or heartbeat) last arrived.
    last_leader: Arc<Mutex<Instant>>,
    /// Peers whose answer to a call from this node did not come before its
    /// deadline, and no call to them has been answered since: hearing from a peer
    /// does not prove it hears this node (packets lost one way).
    unanswered: Arc<Mutex<HashMap<NodeId, Instant>>>,
}

impl Contacts {
    /// For `self_id` in a group of `members`; every peer counts as heard from now
    /// (a node just started is given one window to make contact).
    pub fn new(self_id: NodeId, members: Vec<NodeId>, window: Duration) -> Self {
        let now = Instant::now();
        let last_heard = members.iter().map(|&m| (m, now)).collect();
        Self {
            self_id,
            members: Arc::new(Mutex::new(members)),
            window,
            last_heard: Arc::new(Mutex::new(last_heard)),
            last_leader: Arc::new(Mutex::new(now)),
            unanswered: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Replaces the voters counted for a quorum (a membership change); a voter
    /// new to the set counts as heard from now, given one window to make contact
    /// as at start.
    pub fn set_members(&self, members: Vec<NodeId>) {
        let mut current = self.members.lock().unwrap();
        if *current == members {
            return;
        }
        let now = Instant::now();
        let mut heard = self.last_heard.lock().unwrap();
        for &m in &members {
            if !current.contains(&m) {
                heard.insert(m, now);
            }
        }
        heard.retain(|id, _| members.contains(id));
        *current = members;
    }

    /// The voters counted for a quorum, as last set.
    pub fn members(&self) -> Vec<NodeId> {
        self.members.lock().unwrap().clone()
    }

    /// Records that a call to `peer` got no answer before its deadline.
    pub fn call_unanswered(&self, peer: NodeId) {
        self.unanswered
            .lock()
            .unwrap()
            .entry(peer)
            .or_insert_with(Instant::now);
    }

    /// Records that `peer` answered a call from this node.
    pub fn call_answered(&self, peer: NodeId) {
        self.unanswered.lock().unwrap().remove(&peer);
    }

    /// True if `peer`'s answer to a call from this node did not come and no later
    /// call was answered: a write passed to it would wait out its deadline.
    pub fn unanswered(&self, peer: NodeId) -> bool {
        self.unanswered.lock().unwrap().contains_key(&peer)
    }

    /// Records that `peer` was heard from just now.
    pub fn heard_from(&self, peer: NodeId) {
        if peer != self.self_id && self.members.lock().unwrap().contains(&peer) {
            self.last_heard.lock().unwrap().insert(peer, Instant::now());
        }
    }

    /// Records that a leader's AppendEntries arrived just now.
    pub fn heard_from_leader(&self) {
        *self.last_leader.lock().unwrap() = Instant::now();
    }

    /// Records that this node granted a candidate its vote: counts as hearing from
    /// a leader for `grace` only (the time the candidate's first AppendEntries
    /// takes), not a whole window, so a candidate that never wins does not keep
    /// this node trusting it.
    pub fn granted_vote(&self, grace: Duration) {
        let mut last = self.last_leader.lock().unwrap();
        if let Some(at) = Instant::now().checked_sub(self.window.saturating_sub(grace)) {
            *last = (*last).max(at);
        }
    }

    /// True if a leader's AppendEntries arrived within the window: a follower that
    /// has not heard from a live leader for that long has nobody to pass a write
    /// to (a partition between it and the leader, or an election that is taking
    /// long).
    pub fn leader_heard_lately(&self) -> bool {
        self.last_leader.lock().unwrap().elapsed() <= self.window
    }

    /// True if a leader (or a candidate this node voted for) was heard from
    /// within `within`.
    pub fn leader_heard_within(&self, within: Duration) -> bool {
        self.last_leader.lock().unwrap().elapsed() <= within
    }

    /// True if `peer` was heard from within `within`.
    pub fn heard_within(&self, peer: NodeId, within: Duration) -> bool {
        self.last_heard
            .lock()
            .unwrap()
            .get(&peer)
            .is_some_and(|t| t.elapsed() <= within)
    }

    /// True if a majority of the group (this node included) was heard from within
    /// the window.
    pub fn in_contact_with_quorum(&self) -> bool {
        let members = self.members.lock().unwrap().clone();
        quorum_in_contact(
            Instant::now(),
            &self.last_heard.lock().unwrap(),
            &members,
            self.self_id,
            self.window,
        )
    }

    /// The other members heard from within the window, in id order (the
    /// members are counted as heard from at start).
    pub fn peers_in_contact(&self) -> Vec<NodeId> {
        let members = self.members.lock().unwrap().clone();
        let heard = self.last_heard.lock().unwrap();
        let mut peers: Vec<NodeId> = members
            .iter()
            .copied()
            .filter(|&m| m != self.self_id)
            .filter(|m| heard.get(m).is_some_and(|t| t.elapsed() <= self.window))
            .collect();
        peers.sort_unstable();
        peers
    }

    /// The window, in ms.
    pub fn window_ms(&self) -> u64 {
        self.window.as_millis() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_majority_counts_this_node_and_recent_peers_only() {
        let now = Instant::now();
        let w = Duration::from_millis(700);
        let members = [0, 1, 2];
        let mut heard = HashMap::new();
        assert!(!quorum_in_contact(now, &heard, &members, 0, w));
        heard.insert(1, now - Duration::from_millis(800));
        assert!(!quorum_in_contact(now, &heard, &members, 0, w));
        heard.insert(2, now - Duration::from_millis(100));
        assert!(quorum_in_contact(now, &heard, &members, 0, w));
        // Five members: this node and two peers.
        let five = [0, 1, 2, 3, 4];
        assert!(!quorum_in_contact(now, &heard, &five, 0, w));
        heard.insert(3, now);
        assert!(quorum_in_contact(now, &heard, &five, 0, w));
        // A one-node group is always in contact with itself.
        assert!(quorum_in_contact(now, &HashMap::new(), &[7], 7, w));
    }

    #[test]
    fn contacts_start_in_contact_and_ignore_strangers() {
        let c = Contacts::new(0, vec![0, 1, 2], Duration::from_millis(50));
        assert!(c.in_contact_with_quorum());
        std::thread::sleep(Duration::from_millis(80));
        assert!(!c.in_contact_with_quorum());
        c.heard_from(9);
        c.heard_from(0);
        assert!(!c.in_contact_with_quorum());
        c.heard_from(2);
        assert!(c.in_contact_with_quorum());
    }

    #[test]
    fn a_membership_change_moves_the_quorum() {
        let c = Contacts::new(3, vec![0, 1, 2], Duration::from_millis(50));
        std::thread::sleep(Duration::from_millis(80));
        // A learner (not among the voters) needs a majority of the voters.
        c.heard_from(0);
        assert!(!c.in_contact_with_quorum());
        c.heard_from(1);
        assert!(c.in_contact_with_quorum());
        // Now a voter of four: a voter new to the set starts heard from.
        c.set_members(vec![0, 1, 2, 3]);
        assert_eq!(c.peers_in_contact(), vec![0, 1]);
        std::thread::sleep(Duration::from_millis(80));
        c.heard_from(0);
        assert!(!c.in_contact_with_quorum());
        c.heard_from(1);
        assert!(c.in_contact_with_quorum());
        // A removed voter is a stranger again.
        c.set_members(vec![1, 3]);
        c.heard_from(0);
        assert_eq!(c.peers_in_contact(), vec![1]);
    }
}
