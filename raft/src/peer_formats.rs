//! Which log command set ([`crate::format::LOG_COMMANDS`]) each peer decodes, as
//! its AppendEntries answers say, and the decision whether every member of the
//! group decodes a set. A leader writes a command of a newer set only then, so a
//! member still on an earlier release (upgraded last in a rolling upgrade) is
//! never sent an entry it cannot read; the exception, `DeliveryAttempts`, is
//! written by the weaker rule ([`no_member_says_below`]) past a member that is
//! down.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::types::NodeId;

/// What one peer last said: its log command set, in its answer to an
/// AppendEntries of the leader of `term`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetSaid {
    /// The log command set.
    pub set: u8,
    /// The term of the AppendEntries it answered.
    pub term: u64,
}

/// True if every member in `members` other than `self_id` has said, answering
/// an AppendEntries of `term` (this leader's), that it decodes log command set
/// `set` or a later one (`reported`: what each peer said last). A peer that has
/// said nothing in `term` counts as set 1, the set of releases that do not say:
/// an answer from an earlier term may come from a binary since replaced. This
/// node decodes its own sets. No I/O.
pub fn members_decode(
    reported: &HashMap<NodeId, SetSaid>,
    members: impl IntoIterator<Item = NodeId>,
    self_id: NodeId,
    set: u8,
    term: u64,
) -> bool {
    members.into_iter().filter(|&m| m != self_id).all(|m| {
        reported
            .get(&m)
            .filter(|s| s.term == term)
            .map_or(1, |s| s.set)
            >= set
    })
}

/// True unless a member in `members` other than `self_id` last said (in any
/// term) that it decodes only a set below `set`: the weaker rule, for message
/// records a member of an earlier release would store but not apply as this
/// one does (transactional messages) and for the one command that must be
/// written while a member is down (`Command::DeliveryAttempts`, after a wait
/// for the members' answers: `crate::writer`), so that a member that is down,
/// or not heard from yet in this term, does not stop them; a member still on
/// an earlier release that answers does. No I/O.
pub fn no_member_says_below(
    reported: &HashMap<NodeId, SetSaid>,
    members: impl IntoIterator<Item = NodeId>,
    self_id: NodeId,
    set: u8,
) -> bool {
    members
        .into_iter()
        .filter(|&m| m != self_id)
        .all(|m| reported.get(&m).is_none_or(|s| s.set >= set))
}

/// The set a peer's answer header carries (`None`: no header, an earlier
/// release: set 1). A header that is not a number counts as set 1 too.
pub fn set_of_header(value: Option<&str>) -> u8 {
    value.and_then(|v| v.trim().parse().ok()).unwrap_or(1)
}

/// What each peer last said about the log command set it decodes; cheap to
/// clone (shared by the peer clients and the node). A peer's latest answer
/// replaces what it said before, and only answers in the leader's current term
/// count, so a member restarted on an earlier release closes the set for the
/// writes after its next answer, or after the next election. Entries of the set
/// already written stay unreadable to it (a downgrade is not possible), and so
/// do writes made in the moment before that answer or while it was down.
#[derive(Clone, Debug, Default)]
pub struct PeerFormats(Arc<Mutex<HashMap<NodeId, SetSaid>>>);

impl PeerFormats {
    /// Records that `peer`'s answer to an AppendEntries of the leader of `term`
    /// said set `set`.
    pub fn record(&self, peer: NodeId, set: u8, term: u64) {
        self.0.lock().unwrap().insert(peer, SetSaid { set, term });
    }

    /// [`no_member_says_below`] over what the peers said so far.
    pub fn no_member_says_below(
        &self,
        members: impl IntoIterator<Item = NodeId>,
        self_id: NodeId,
        set: u8,
    ) -> bool {
        no_member_says_below(&self.0.lock().unwrap(), members, self_id, set)
    }

    /// [`members_decode`] over what the peers said so far.
    pub fn members_decode(
        &self,
        members: impl IntoIterator<Item = NodeId>,
        self_id: NodeId,
        set: u8,
        term: u64,
    ) -> bool {
        members_decode(&self.0.lock().unwrap(), members, self_id, set, term)
    }

    /// [`no_member_says_below`] over `raft`'s current membership (learners
    /// included), for the node `self_id`; false for a set this release does not
    /// know ([`crate::format::LOG_COMMANDS`]).
    pub fn no_member_says_below_now(
        &self,
        raft: &crate::types::Raft,
        self_id: NodeId,
        set: u8,
    ) -> bool {
        if set > crate::format::LOG_COMMANDS {
            return false;
        }
        let (members, _) = members_and_term(raft);
        self.no_member_says_below(members, self_id, set)
    }

    /// [`members_decode`] over `raft`'s current membership (learners included)
    /// and term, for the node `self_id`; false for a set this release does not
    /// know ([`crate::format::LOG_COMMANDS`]).
    pub fn members_decode_now(&self, raft: &crate::types::Raft, self_id: NodeId, set: u8) -> bool {
        if set > crate::format::LOG_COMMANDS {
            return false;
        }
        // Every release decodes set 1 (the writer asks for every command).
        if set <= 1 {
            return true;
        }
        let (members, term) = members_and_term(raft);
        self.members_decode(members, self_id, set, term)
    }
}

/// `raft`'s current members (learners included) and term.
fn members_and_term(raft: &crate::types::Raft) -> (Vec<NodeId>, u64) {
    let m = raft.metrics();
    let m = m.borrow();
    let nodes = m.membership_config.membership().nodes();
    (nodes.map(|(&id, _)| id).collect(), m.current_term)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 4;

    #[test]
    fn a_member_that_said_an_earlier_set_stops_the_weaker_rule_and_silence_does_not() {
        let mut said_by = HashMap::new();
        assert!(no_member_says_below(&said_by, [0, 1, 2], 0, 5));
        said_by.insert(1, said(5, T - 1));
        assert!(no_member_says_below(&said_by, [0, 1, 2], 0, 5));
        said_by.insert(2, said(4, T));
        assert!(!no_member_says_below(&said_by, [0, 1, 2], 0, 5));
        // This node's own set does not count.
        assert!(no_member_says_below(&said_by, [0, 1, 2], 2, 5));
        said_by.insert(2, said(5, T + 1));
        assert!(no_member_says_below(&said_by, [0, 1, 2], 0, 5));
    }

    fn said(set: u8, term: u64) -> SetSaid {
        SetSaid { set, term }
    }

    #[test]
    fn a_set_is_used_only_when_every_other_member_said_it_decodes_it_in_this_term() {
        let mut said_by = HashMap::new();
        // Nobody has answered yet: only set 1.
        assert!(members_decode(&said_by, [0, 1, 2], 0, 1, T));
        assert!(!members_decode(&said_by, [0, 1, 2], 0, 2, T));
        said_by.insert(1, said(2, T));
        assert!(
            !members_decode(&said_by, [0, 1, 2], 0, 2, T),
            "node 2 has not said"
        );
        said_by.insert(2, said(1, T));
        assert!(
            !members_decode(&said_by, [0, 1, 2], 0, 2, T),
            "node 2 is on set 1"
        );
        said_by.insert(2, said(3, T));
        assert!(members_decode(&said_by, [0, 1, 2], 0, 2, T));
        // A member that is not in the group any more does not count; one added
        // later does until it says.
        assert!(members_decode(&said_by, [0, 1], 0, 2, T));
        assert!(!members_decode(&said_by, [0, 1, 2, 3], 0, 2, T));
        // A single-node group decodes what its one member does.
        assert!(members_decode(&HashMap::new(), [0], 0, 2, T));
    }

    #[test]
    fn what_a_peer_said_in_an_earlier_term_does_not_count() {
        // Node 2 said set 2 while node 0 led term T; node 0 leads again in a
        // later term, and node 2 may since have been restarted on an earlier
        // release: until it answers in the new term, only set 1.
        let said_by: HashMap<_, _> = [(1, said(2, T + 1)), (2, said(2, T))].into();
        assert!(!members_decode(&said_by, [0, 1, 2], 0, 2, T + 1));
        assert!(members_decode(&said_by, [0, 1, 2], 0, 1, T + 1));
    }

    #[test]
    fn an_answer_without_the_header_or_with_garbage_is_set_1() {
        assert_eq!(set_of_header(None), 1);
        assert_eq!(set_of_header(Some("x")), 1);
        assert_eq!(set_of_header(Some("2")), 2);
        let f = PeerFormats::default();
        f.record(1, 2, T);
        f.record(1, set_of_header(None), T);
        assert!(
            !f.members_decode([0, 1], 0, 2, T),
            "the latest answer counts"
        );
    }
}
