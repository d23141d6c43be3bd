//! The raft crate's one error type.

use crate::types::NodeId;

/// Failures of a Raft node and its storage.
#[derive(Debug, thiserror::Error)]
pub enum RaftNodeError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] ledgermq_store::StoreError),
    /// The metadata database failed.
    #[error("metadata database: {0}")]
    Meta(#[from] sled::Error),
    /// Encoding or decoding a value failed.
    #[error("encoding: {0}")]
    Codec(#[from] postcard::Error),
    /// This node is not the leader (`leader` is the one it knows, if any).
    #[error("this node is not the leader (leader: {leader:?})")]
    NotLeader {
        /// The leader known to this node.
        leader: Option<NodeId>,
    },
    /// This node is not the leader and no leader is known right now.
    #[error("no leader is known for the group right now")]
    NoLeader,
    /// The leader could not be reached to forward a write.
    #[error("forwarding to leader {leader} failed: {reason}")]
    Forward {
        /// The leader's node id.
        leader: NodeId,
        /// Why.
        reason: String,
        /// False when the request surely never reached the leader (no connection,
        /// blocked): trying again cannot duplicate it.
        sent: bool,
    },
    /// The write did not commit within its deadline; it may still commit later.
    #[error("the write did not commit within {timeout_ms} ms (it may still commit)")]
    Timeout {
        /// The deadline in ms.
        timeout_ms: u64,
    },
    /// This node stopped waiting for the write's outcome before its deadline,
    /// because no answer could come soon: it has not heard from a majority for an
    /// election timeout with the write proposed here (as leader) or forwarded (as
    /// follower), or it forwarded the write to a leader since replaced by
    /// another. The write may still commit
    /// (the caller learns the outcome by reading, or sends again: at least once).
    #[error("stopped waiting for the write ({reason}); it may still commit")]
    Abandoned {
        /// Why no answer could come soon.
        reason: String,
    },
    /// The write's deadline passed before it was proposed: it was not written (the
    /// caller had given up; proposing it late could place it after writes its
    /// sender made since).
    #[error("the write's deadline passed before it was proposed (not written)")]
    Expired,
    /// A command bound to its proposer's term (a FIFO lease) reached the log in a
    /// later term's entry and was not applied: the proposer had been deposed.
    #[error("a command decided in term {proposed_term} reached the log in term {entry_term} and was not applied")]
    StaleTerm {
        /// The term the command was decided in.
        proposed_term: u64,
        /// The term of the entry that carried it.
        entry_term: u64,
    },
    /// This node has not heard from a majority of its group (itself included) for
    /// `window_ms`: it is cut off, so a write it took would only wait for its
    /// timeout. Nothing was proposed or forwarded; another node may take it.
    #[error("this node has not heard from a majority of its group for {window_ms} ms (cut off); not written")]
    CutOff {
        /// The window, ms (the maximum election timeout).
        window_ms: u64,
    },
    /// The leader holds `max_pending_bytes` of writes not yet committed already:
    /// refused at once, not written. Retry later.
    #[error(
        "too many writes pending on the leader (more than {max_pending_bytes} bytes); not written"
    )]
    Overloaded {
        /// The bound, bytes.
        max_pending_bytes: usize,
    },
    /// This follower has not heard from a live leader for `window_ms` (it is cut
    /// off from it, or an election is taking long): nothing was forwarded; another
    /// node may take the write.
    #[error("this node has not heard from a leader for {window_ms} ms; not written")]
    LeaderUnreachable {
        /// The window, ms (the maximum election timeout).
        window_ms: u64,
    },
    /// openraft refused or failed.
    #[error("raft: {0}")]
    Raft(String),
    /// Bad input (empty batch, bad configuration, ...).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The node is shutting down.
    #[error("the node is shutting down")]
    ShuttingDown,
    /// The Raft vote is lost: the vote file (`crate::vote_file`) has no valid
    /// slot, or is missing while the store holds a log and no earlier release's
    /// vote. This node cannot know whom it voted for, and voting again could
    /// elect two leaders in one term. It does not start: replacing the node is
    /// left to an operator (membership changes are not built yet).
    #[error("the Raft vote in {path} is lost ({why}); refusing to start")]
    VoteLost {
        /// The vote file.
        path: String,
        /// What was found.
        why: String,
    },
    /// The metadata store is damaged: sled reported corruption, or it
    /// contradicts the log (`crate::meta_check`).
    #[error("the metadata store is damaged: {0}")]
    MetadataDamaged(String),
    /// A stored value (a metadata row, a snapshot) is in a format version this
    /// release does not read (`crate::format`): written by a later release.
    #[error("{what} is in format version {version}; this release reads up to {supported}")]
    FormatTooNew {
        /// What the value is.
        what: String,
        /// Its format version.
        version: u8,
        /// The highest version this release reads.
        supported: u8,
    },
    /// The command belongs to log command set `set` (`crate::format`), which a
    /// member of the group has not said it decodes in the leader's current term
    /// (it runs an earlier release, or is down or unreachable): not written,
    /// since that member would stop applying at the entry. Written once every
    /// member has answered the leader with that set. For half messages (set 5,
    /// `format::SET_TRANSACTIONS`): a member said it decodes an earlier set.
    #[error("a member of the group does not decode log command set {set} ({}) yet: it runs an earlier release (for a command: or is down or not heard from in this term); not written", crate::format::set_brings(*set))]
    MembersCannotDecode {
        /// The command's log command set.
        set: u8,
    },
    /// Network or server setup failed.
    #[error("transport: {0}")]
    Transport(String),

    /// A membership change that cannot be made as asked (`RaftNode::change_membership`):
    /// the operator's mistake (an id or address already taken, the last voter) or a
    /// change already in progress; nothing was changed by this call.
    #[error("membership change refused: {0}")]
    MembershipRefused(String),

    /// Node `id` was added as a learner but did not catch up with the leader's log
    /// (through `target_index`) within `timeout_ms`; it stays a learner, and asking
    /// again goes on from there.
    #[error("node {id} did not catch up within {timeout_ms} ms (it holds through log index {matched_index:?} of {target_index}); it stays a learner, ask again to go on")]
    CatchUpTimeout {
        /// The learner.
        id: u64,
        /// The last log index it was known to hold.
        matched_index: Option<u64>,
        /// The leader's last log index it has to reach.
        target_index: u64,
        /// How long this call waited.
        timeout_ms: u64,
    },
}

/// Wraps an error for openraft's `StorageIOError` constructors.
pub(crate) fn any_err(e: impl std::error::Error + 'static) -> openraft::AnyError {
    openraft::AnyError::new(&e)
}

impl RaftNodeError {
    /// True when this error, met by the leader a write was forwarded to, means
    /// the write cannot commit: refused before it was proposed (not the leader, no
    /// leader, its deadline passed first), or proposed and then truncated away
    /// (openraft's `ForwardToLeader` after a proposal comes only with the entry's
    /// truncation). Every other failure may leave it proposed.
    pub fn cannot_commit(&self) -> bool {
        matches!(
            self,
            RaftNodeError::NotLeader { .. }
                | RaftNodeError::NoLeader
                | RaftNodeError::Expired
                | RaftNodeError::MembersCannotDecode { .. }
        )
    }
}

/// A leader's refusal of a write forwarded to it, as it travels back to the
/// follower (postcard, in the `Forward` reply: `Result<Response, ForwardRefusal>`).
/// Whether the write may still commit is the variant, decided by the leader on
/// its typed error ([`RaftNodeError::cannot_commit`]), never read from text.
/// Either carries the leader's error as text, for messages only.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ForwardRefusal {
    /// The write cannot commit: trying again, at this or the next leader, cannot
    /// store it twice.
    NotWritten(String),
    /// The write may have been proposed and may still commit.
    MaybeWritten(String),
    /// Not written: a member does not decode the command's log command set
    /// ([`RaftNodeError::MembersCannotDecode`]); trying again soon will not help.
    /// Appended: a follower of an earlier release that forwards a command never
    /// gets this answer, since it cannot make a command of a later set.
    MembersCannotDecode(u8),
}

impl From<RaftNodeError> for ForwardRefusal {
    fn from(e: RaftNodeError) -> Self {
        if let RaftNodeError::MembersCannotDecode { set } = e {
            ForwardRefusal::MembersCannotDecode(set)
        } else if e.cannot_commit() {
            ForwardRefusal::NotWritten(e.to_string())
        } else {
            ForwardRefusal::MaybeWritten(e.to_string())
        }
    }
}
