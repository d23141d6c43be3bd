//! FIFO leases: recording a FIFO delivery through Raft (leader-only, bound to
//! its term), and the lease a delivery makes.

use std::time::{Duration, Instant};

use ledgermq_meta::{Command, FifoLease, TimedFifoLease};

use super::{Consumers, PopRequest};
use crate::error::BrokerError;
use crate::receipt::ReceiptHandle;

impl Consumers {
    /// Records FIFO deliveries decided in `term` through Raft, proposed only by this
    /// node while it leads (never forwarded, except by the test-only
    /// `forward-fifo-leases` canary); the state machine refuses them if they reach
    /// the log in a later term. With their time left when every member decodes
    /// that (log command set 2), else with the wall-clock deadline alone.
    pub(super) async fn commit_leases(
        &self,
        term: u64,
        leases: Vec<TimedFifoLease>,
    ) -> Result<(), BrokerError> {
        let timed = self
            .node
            .members_decode(ledgermq_raft::format::SET_TIMED_FIFO_LEASES);
        let command = Command::fifo_leases(term, leases, timed);
        if ledgermq_raft::canary::enabled(ledgermq_raft::canary::Canary::ForwardFifoLeases) {
            return self.forward_leases_canary(command).await;
        }
        self.node.write_command_as_leader(command).await?;
        Ok(())
    }

    /// The `forward-fifo-leases` canary (debug builds, tests only), broken on
    /// purpose: leases this node could not commit as leader (it is handing over or
    /// was deposed) are forwarded to the next leader, whose state machine applies
    /// them from an entry of its own term (`ledgermq_raft::canary`), and the
    /// deliveries are answered.
    pub(super) async fn forward_leases_canary(&self, command: Command) -> Result<(), BrokerError> {
        match self.node.write_command_as_leader(command.clone()).await {
            Err(ledgermq_raft::RaftNodeError::NotLeader { .. }) => {}
            other => {
                other?;
                return Ok(());
            }
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while self.node.is_leader() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The forward arrives late, as a slow network can make any forward: after
        // the new leader has begun to serve.
        tokio::time::sleep(Duration::from_millis(500)).await;
        tracing::warn!(
            "canary forward-fifo-leases: forwarding leases this node could not commit as leader"
        );
        self.node.write_command(command).await?;
        Ok(())
    }
}

/// The lease of a FIFO delivery of `req` under `h`: its wall-clock deadline
/// `visible_at_ms` and its time left, `req.invisible_ms`.
pub(super) fn lease(
    req: &PopRequest,
    h: &ReceiptHandle,
    attempt: u32,
    visible_at_ms: i64,
) -> TimedFifoLease {
    TimedFifoLease {
        lease: FifoLease {
            group: req.consumer.clone(),
            topic: h.topic.clone(),
            queue_id: h.queue_id,
            queue_offset: h.queue_offset,
            delivery_id: h.delivery_id,
            attempt,
            visible_at_ms,
        },
        invisible_ms: req.invisible_ms,
    }
}
