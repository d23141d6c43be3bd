//! Canaries: test-only switches that each break one promise, so that the jepsen
//! harness can show it catches a broken broker (issue 14). They are read from the
//! `LEDGERMQ_CANARY` environment variable (comma-separated names) in debug builds
//! only; a release build has none and never reads the variable. They live in the
//! store crate because some break the store's promises; the raft crate re-exports
//! this module (`ledgermq_raft::canary`).

/// A promise a canary breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Canary {
    /// `ack-before-commit`: the leader answers a send as soon as its entry is
    /// proposed, before a majority holds it.
    AckBeforeCommit,
    /// `skip-fsync`: the CommitLog's flush skips its `msync(MS_SYNC)` and the
    /// acknowledged mark skips its `fdatasync`, while both report success; under
    /// SYNC_FLUSH an entry is then acknowledged as durable while only the page
    /// cache holds it.
    SkipFsync,
    /// `lost-entries-vote`: a node whose store lost entries it had acknowledged (a
    /// damaged CommitLog tail cut by recovery) votes and campaigns as if it had
    /// lost nothing, so it can elect a leader that lacks committed entries.
    LostEntriesVote,
    /// `dispatch-before-apply`: an entry's messages are placed in their
    /// ConsumeQueues as soon as it is appended, before it commits; consumers of
    /// the leader can be handed messages that a later leader never commits.
    DispatchBeforeApply,
    /// `forward-fifo-leases`: a FIFO delivery lease the leader could not commit in
    /// its own term (it was handing over or deposed) is forwarded to the next
    /// leader and applied from an entry of that leader's term, and the delivery is
    /// answered; the next leader may have handed the same message out meanwhile.
    ForwardFifoLeases,
}

impl Canary {
    /// Every canary.
    pub const ALL: [Canary; 5] = [
        Canary::AckBeforeCommit,
        Canary::SkipFsync,
        Canary::LostEntriesVote,
        Canary::DispatchBeforeApply,
        Canary::ForwardFifoLeases,
    ];

    /// The name in `LEDGERMQ_CANARY`.
    pub fn name(self) -> &'static str {
        match self {
            Canary::AckBeforeCommit => "ack-before-commit",
            Canary::SkipFsync => "skip-fsync",
            Canary::LostEntriesVote => "lost-entries-vote",
            Canary::DispatchBeforeApply => "dispatch-before-apply",
            Canary::ForwardFifoLeases => "forward-fifo-leases",
        }
    }
}

/// Whether canary `c` is on (never in a release build).
pub fn enabled(c: Canary) -> bool {
    #[cfg(debug_assertions)]
    {
        static ON: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
        let on = ON.get_or_init(|| {
            let names = std::env::var("LEDGERMQ_CANARY").unwrap_or_default();
            let on: Vec<String> = names
                .split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect();
            if !on.is_empty() {
                tracing::error!(canaries = ?on, "test-only canaries are on: this node breaks promises on purpose");
            }
            for name in &on {
                if !Canary::ALL.iter().any(|c| c.name() == name) {
                    tracing::error!(canary = %name, "unknown canary in LEDGERMQ_CANARY: ignored");
                }
            }
            on
        });
        on.iter().any(|n| n == c.name())
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = c;
        false
    }
}
