//! Rewinding a consumer group (`mqadmin resetOffsetByTime`): the leader sets the
//! group's offsets on a topic's queues to exactly the ones asked, through Raft
//! ([`Command::ResetOffsets`]), and forgets what it tracked of those queues.

use std::sync::Arc;

use ledgermq_meta::{Command, OffsetCommit};
use ledgermq_raft::format::SET_RESET_OFFSETS;
use ledgermq_raft::RaftNodeError;

use super::{Consumers, QueueKey};
use crate::error::{refuse, BrokerError, ErrorKind};
use crate::leader_write::{may_have_been_proposed, settle, SETTLE_WAIT};

/// One queue's reset: where the group was and where it is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueReset {
    /// Message queue id.
    pub queue_id: i32,
    /// The group's offset before (the lowest offset not acked, as this leader
    /// tracked it: acks not yet committed through Raft included).
    pub previous_offset: u64,
    /// The next queue offset the group consumes from now on.
    pub offset: u64,
}

impl Consumers {
    /// Sets `consumer`'s offsets on `topic`'s queues to `offsets` (queue id, next
    /// queue offset), backwards or forwards, as this node's own proposal while it
    /// leads (never passed on to a later leader). Runs in a task of its own, so a
    /// caller that goes away (a client's deadline) does not cut it short between
    /// its write and what follows the write.
    ///
    /// It holds the gate exclusively, so every pop, ack and offset commit under
    /// way finishes first and none starts before the reset is decided: no offset
    /// commit or FIFO lease this leader decided before it lands after it (a
    /// dead-letter copy decided by a pop just before may: that message is then
    /// both dead-lettered and delivered again from the new offset). Receives and
    /// acks of every group therefore wait for the reset's Raft write. Once the reset is written
    /// this leader rebuilds those queues' states from the replicated offsets at
    /// their next use (messages in flight are forgotten; they are delivered again
    /// from the new offset) and refuses receipt handles of deliveries it made
    /// before (an ack of one would otherwise skip a message of the rewound
    /// range). A write refused before it was proposed changes nothing here. One
    /// whose outcome is unknown (a timeout) holds the gate until this node has
    /// applied every entry its log held (at most [`SETTLE_WAIT`]) or the term
    /// ended, then does the same as a written one; if this node still leads and
    /// the replicated offsets are then the reset's, the reset is answered as
    /// made (no commit can have moved them meanwhile: the gate is held).
    ///
    /// Not covered: a commit that an earlier leader proposed before it was
    /// deposed and that reaches this leader, passed on, after the reset (commits
    /// only move offsets forward); receipt handles of an earlier leader presented
    /// to a later one; an unknown outcome still unsettled after [`SETTLE_WAIT`].
    ///
    /// Errors: `Unsupported` while a member does not decode log command set 4
    /// (checked before anything is touched); `NoLeader` when this node is not a
    /// ready leader; the Raft write's (an unknown outcome among them).
    pub async fn reset_offsets(
        self: &Arc<Self>,
        consumer: &str,
        topic: &str,
        offsets: &[(i32, u64)],
        fifo: bool,
    ) -> Result<Vec<QueueReset>, BrokerError> {
        if !self.node.members_decode(SET_RESET_OFFSETS) {
            return Err(BrokerError::Raft(RaftNodeError::MembersCannotDecode {
                set: SET_RESET_OFFSETS,
            }));
        }
        let this = self.clone();
        let (consumer, topic, offsets) = (consumer.to_owned(), topic.to_owned(), offsets.to_vec());
        tokio::spawn(async move { this.reset_now(&consumer, &topic, &offsets, fifo).await })
            .await
            .map_err(|e| refuse(ErrorKind::Internal, format!("the reset task failed: {e}")))?
    }

    async fn reset_now(
        &self,
        consumer: &str,
        topic: &str,
        offsets: &[(i32, u64)],
        fifo: bool,
    ) -> Result<Vec<QueueReset>, BrokerError> {
        let _gate = self.gate.write().await;
        let term = self.ready_term().ok_or_else(Self::not_ready)?;
        let key = |queue_id: i32| QueueKey {
            consumer: consumer.to_owned(),
            topic: topic.to_owned(),
            queue_id,
        };
        let mut done = Vec::with_capacity(offsets.len());
        for &(queue_id, offset) in offsets {
            let q = self.queue(&key(queue_id), term, fifo)?;
            let previous_offset = q.lock().await.base();
            done.push(QueueReset {
                queue_id,
                previous_offset,
                offset,
            });
        }
        let commits = offsets
            .iter()
            .map(|&(queue_id, offset)| OffsetCommit {
                group: consumer.to_owned(),
                topic: topic.to_owned(),
                queue_id,
                offset,
            })
            .collect();
        // Every delivery id issued from here on is at least this.
        let seq = self.delivery_seq.load(std::sync::atomic::Ordering::Relaxed);
        let floor = (term << 40) | (seq & ((1 << 40) - 1));
        // The reset's entry comes after every entry the log holds now.
        let before = self.node.raft().metrics().borrow().last_log_index;
        let written = self
            .node
            .write_command_as_leader(Command::ResetOffsets(commits))
            .await;
        let keys: Vec<QueueKey> = offsets.iter().map(|&(q, _)| key(q)).collect();
        match written {
            Err(e) if !may_have_been_proposed(&e) => Err(e.into()),
            Err(e) => {
                let target = before.map_or(1, |i| i + 1);
                let settled = settle(&self.node, term, target, SETTLE_WAIT).await;
                self.forget(term, keys, floor);
                let meta = self.node.shared_meta().read().unwrap();
                let made = offsets.iter().all(|&(queue_id, offset)| {
                    let k = (consumer.to_owned(), topic.to_owned(), queue_id);
                    meta.offsets.get(&k) == Some(&offset)
                });
                if settled && made {
                    tracing::info!(consumer, topic, error = %e, "a consumer offset reset whose write timed out was made");
                    Ok(done)
                } else {
                    Err(e.into())
                }
            }
            Ok(_) => {
                self.forget(term, keys, floor);
                Ok(done)
            }
        }
    }

    /// Drops the states of `keys` (rebuilt from the replicated offsets at their
    /// next use) and refuses handles below `floor` on them, if the table is
    /// still of `term`.
    fn forget(&self, term: u64, keys: Vec<QueueKey>, floor: u64) {
        let mut t = self.table.lock().unwrap();
        if t.term == term {
            for k in keys {
                t.queues.remove(&k);
                t.reset_floors.insert(k, floor);
            }
        }
    }
}
