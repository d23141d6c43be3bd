//! The consumer-offset committer: a leader-term service that commits clustering
//! groups' moved offsets through Raft every interval.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::Consumers;
use crate::leader_term::{TermEnd, TermService};

/// Commits the offsets acks moved in one leader term
/// ([`Consumers::commit_offsets_once`]) every `interval` (100 ms in
/// `crate::grpc::server::serve`), while that term lasts. FIFO groups do not wait for it:
/// they commit each ack before answering it.
pub struct OffsetCommitter {
    /// The consumption state whose offsets it commits.
    pub consumers: Arc<Consumers>,
    /// Time between commits.
    pub interval: Duration,
}

impl TermService for OffsetCommitter {
    fn name(&self) -> &'static str {
        "consumer-offset committer"
    }

    fn start(self: Arc<Self>, term: u64, end: TermEnd) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut ticks = end.ticks(self.interval);
            while ticks.next().await {
                // No new commit once the term is over, or while this node is not
                // (or no longer) the ready leader of it: the supervisor learns of
                // a step-down one task hop after openraft's metrics show it.
                if self.consumers.ready_term() != Some(term) {
                    continue;
                }
                // A commit under way when the term ends is finished, not dropped.
                if let Err(e) = self.consumers.commit_offsets_once(term).await {
                    tracing::warn!(term, error = %e, "committing consumer offsets failed; will retry");
                }
            }
        })
    }
}
