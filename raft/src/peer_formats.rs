//! Which log command set ([`crate::format::LOG_COMMANDS`]) each peer decodes, as
//! its AppendEntries answers say, and the decision whether every member of the
//! group decodes a set. A leader writes a command of a newer set only then, so a
//! member still on an earlier release (upgraded last in a rolling upgrade) is
//! never sent an entry it cannot read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::types::NodeId;

/// True if every member in `members` other than `self_id` has said it decodes
/// log command set `set` or a later one (`reported`: the last set each peer
/// said; a peer that has said nothing yet counts as set 1, the set of releases
/// that do not say). This node decodes its own sets. No I/O.
pub fn members_decode(
    reported: &HashMap<NodeId, u8>,
    members: impl IntoIterator<Item = NodeId>,
    self_id: NodeId,
    set: u8,
) -> bool {
    members
        .into_iter()
        .filter(|&m| m != self_id)
        .all(|m| reported.get(&m).copied().unwrap_or(1) >= set)
}

/// The set a peer's answer header carries (`None`: no header, an earlier
/// release: set 1). A header that is not a number counts as set 1 too.
pub fn set_of_header(value: Option<&str>) -> u8 {
    value.and_then(|v| v.trim().parse().ok()).unwrap_or(1)
}

/// The last log command set each peer said it decodes; cheap to clone (shared by
/// the peer clients and the node). A peer's latest answer replaces what it said
/// before, so a member restarted on an earlier release closes the set for the
/// writes after its next answer; entries of the set already written stay
/// unreadable to it (a downgrade is not possible), and so do writes made in the
/// moment before that answer or while it was down.
#[derive(Clone, Debug, Default)]
pub struct PeerFormats(Arc<Mutex<HashMap<NodeId, u8>>>);

impl PeerFormats {
    /// Records that `peer`'s latest AppendEntries answer said set `set`.
    pub fn record(&self, peer: NodeId, set: u8) {
        self.0.lock().unwrap().insert(peer, set);
    }

    /// [`members_decode`] over what the peers said so far.
    pub fn members_decode(
        &self,
        members: impl IntoIterator<Item = NodeId>,
        self_id: NodeId,
        set: u8,
    ) -> bool {
        members_decode(&self.0.lock().unwrap(), members, self_id, set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_is_used_only_when_every_other_member_said_it_decodes_it() {
        let mut said = HashMap::new();
        // Nobody has answered yet: only set 1.
        assert!(members_decode(&said, [0, 1, 2], 0, 1));
        assert!(!members_decode(&said, [0, 1, 2], 0, 2));
        said.insert(1, 2);
        assert!(
            !members_decode(&said, [0, 1, 2], 0, 2),
            "node 2 has not said"
        );
        said.insert(2, 1);
        assert!(
            !members_decode(&said, [0, 1, 2], 0, 2),
            "node 2 is on set 1"
        );
        said.insert(2, 3);
        assert!(members_decode(&said, [0, 1, 2], 0, 2));
        // A member that is not in the group any more does not count; one added
        // later does until it says.
        assert!(members_decode(&said, [0, 1], 0, 2));
        assert!(!members_decode(&said, [0, 1, 2, 3], 0, 2));
        // A single-node group decodes what its one member does.
        assert!(members_decode(&HashMap::new(), [0], 0, 2));
    }

    #[test]
    fn an_answer_without_the_header_or_with_garbage_is_set_1() {
        assert_eq!(set_of_header(None), 1);
        assert_eq!(set_of_header(Some("x")), 1);
        assert_eq!(set_of_header(Some("2")), 2);
        let f = PeerFormats::default();
        f.record(1, 2);
        f.record(1, set_of_header(None));
        assert!(!f.members_decode([0, 1], 0, 2), "the latest answer counts");
    }
}
