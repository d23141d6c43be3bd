//! The leader's consumption state for every (consumer group, topic, queue), and the
//! reads, acks and offset commits over it (see [`crate::pop`] for the rules).
//!
//! The state belongs to one leader term: it is built only after the leader has
//! applied an entry of its own term (so every consumer offset committed by earlier
//! leaders is in the metadata), and dropped when the term changes. Offsets of
//! clustering groups are committed through Raft by a background task every
//! `commit_interval`. A FIFO group's deliveries are recorded through Raft before
//! the receive is answered, and its acks before the ack call is answered (a
//! queue's batch lease, [`Consumers::ack_many`]; while a member decodes no
//! batch leases, one lease per delivery and the offset commits acks make); with `PopRequest::record_attempts` (the node option
//! `exact_delivery_attempts`) so are another group's (`Command::DeliveryAttempts`),
//! from which the next leader counts on.
//!
//! Invisible deadlines are judged on this node's monotonic clock. A FIFO lease
//! carries its time left when every member decodes that
//! (`Command::FifoLeasesTimed`): each member counts it from its own apply, and a
//! new leader adopts that deadline. Otherwise (a member on an earlier release, or
//! a lease restored since at a restart or from a snapshot) an adopted lease's
//! time left is read off the wall clock once ([`crate::pop::deadline_from_wall`], whose doc
//! names the gap that leaves).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use ledgermq_meta::{
    Command, DeliveryAttempts, FifoBatchLease, FifoLease, OffsetCommit, TimedFifoLease,
};
use ledgermq_raft::format::{SET_DELIVERY_ATTEMPTS, SET_FIFO_BATCHES};
use ledgermq_raft::{RaftNode, RaftNodeError};
use ledgermq_store::record::PROPERTY_TAGS;
use ledgermq_store::store::now_ms;
use ledgermq_store::{MessageRecord, RecordView, StoreError};
use tokio::sync::Mutex;

use crate::error::ErrorKind;
use crate::error::{refuse, BrokerError};
use crate::filter::TagFilter;
use crate::message::{Delivery, DeliveryFields};
use crate::pop::{AckOutcome, QueueState};
use crate::receipt::ReceiptHandle;

mod adopt;
mod attempts;
mod committer;
mod fifo;
mod leases;
mod reset;
pub use committer::OffsetCommitter;
pub use reset::QueueReset;

/// Entries read past per queue and call at most (filtered-out messages included).
const MAX_SCAN_PER_QUEUE: usize = 4096;

/// Names one queue's state: the consumer group's offset key (`group`, or
/// `group@client-id` for a broadcasting consumer), topic and queue id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QueueKey {
    /// Offset key of the consumer.
    pub consumer: String,
    /// Topic.
    pub topic: String,
    /// Message queue id.
    pub queue_id: i32,
}

/// One receive: which queues of `topic`, how many messages, for how long they
/// stay invisible.
#[derive(Debug, Clone)]
pub struct PopRequest {
    /// The consumer group.
    pub group: String,
    /// Offset key of the consumer (see [`QueueKey::consumer`]).
    pub consumer: String,
    /// Topic.
    pub topic: String,
    /// Queues to take from, in order of preference.
    pub queue_ids: Vec<i32>,
    /// Most messages.
    pub max_messages: usize,
    /// Invisible time of each delivery, ms.
    pub invisible_ms: u64,
    /// FIFO consumer group.
    pub fifo: bool,
    /// Tag filter.
    pub filter: TagFilter,
    /// Deliveries before a message goes to the dead-letter queue.
    pub max_delivery_attempts: u32,
    /// Record a non-FIFO group's deliveries through Raft before answering
    /// (`ServiceSettings::exact_delivery_attempts`).
    pub record_attempts: bool,
}

/// A message that used up its delivery attempts: the caller copies it to the
/// dead-letter queue and then acks `handle`.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The delivery to ack once the copy is stored.
    pub handle: ReceiptHandle,
    /// The message as stored.
    pub record: MessageRecord,
}

/// What a receive took.
#[derive(Debug, Default)]
pub struct PopResult {
    /// Messages to deliver, with their receipt handles.
    pub messages: Vec<Delivery>,
    /// Messages for the dead-letter queue.
    pub dead: Vec<DeadLetter>,
    /// FIFO deliveries to record through Raft before answering, one lease per
    /// message (while a member decodes no batch leases).
    leases: Vec<TimedFifoLease>,
    /// FIFO deliveries to record through Raft before answering: every
    /// delivery in flight on each queue that gave messages.
    batches: Vec<FifoBatchLease>,
    /// Other groups' deliveries to record through Raft before answering, one
    /// record per queue (unless a member said it decodes only an earlier set).
    attempts: Vec<DeliveryAttempts>,
    /// Every delivery recorded in `leases` or `attempts`: (queue id, queue
    /// offset, delivery id), made visible again if the record fails.
    recorded: Vec<(i32, u64, u64)>,
}

#[derive(Default)]
struct Table {
    term: u64,
    queues: HashMap<QueueKey, Arc<Mutex<QueueState>>>,
    /// Queues whose offsets were reset in this term ([`Consumers::reset_offsets`]):
    /// the lowest delivery id issued after the reset. A receipt handle below it is
    /// of a delivery from before the reset.
    reset_floors: HashMap<QueueKey, u64>,
}

/// The consumption state of this node while it leads.
pub struct Consumers {
    node: Arc<RaftNode>,
    table: StdMutex<Table>,
    delivery_seq: AtomicU64,
    /// Taken shared by pops, acks, changes of invisible duration and the offset
    /// committer (each across its Raft write), exclusively by an offset reset:
    /// no commit or FIFO lease decided before a reset lands after it.
    gate: tokio::sync::RwLock<()>,
    /// Tests: record FIFO deliveries one lease per message, as while a member
    /// decodes no batch leases.
    #[cfg(test)]
    single_fifo_leases: std::sync::atomic::AtomicBool,
}

impl Consumers {
    /// An empty table for `node`.
    pub fn new(node: Arc<RaftNode>) -> Arc<Self> {
        Arc::new(Self {
            node,
            table: StdMutex::new(Table::default()),
            delivery_seq: AtomicU64::new(1),
            gate: tokio::sync::RwLock::new(()),
            #[cfg(test)]
            single_fifo_leases: Default::default(),
        })
    }

    /// True if FIFO deliveries are recorded as batch leases: no member said
    /// it decodes only a log command set below 8 (the weaker rule: a member
    /// that is down does not stop them, `Command::written_past_silent_members`).
    fn fifo_batches(&self) -> bool {
        #[cfg(test)]
        if self.single_fifo_leases.load(Ordering::Relaxed) {
            return false;
        }
        self.node.no_member_says_below(SET_FIFO_BATCHES)
    }

    /// The term this node leads in, once it has applied an entry of that term
    /// (consumer offsets from earlier terms are then all applied); None otherwise
    /// ([`ledgermq_raft::NodeStatus::ready_term`]).
    pub fn ready_term(&self) -> Option<u64> {
        self.node.status_now().ready_term
    }

    /// The state of `key` in `term`. A table of an older term is dropped; a call
    /// still working for an older term gets `NoLeader`. A FIFO queue new to
    /// this term takes over the previous leader's deliveries in flight (its
    /// batch lease or single lease), each until the deadline this node counted
    /// from its apply of the lease, or, for a lease without one, for the time
    /// its wall-clock deadline has left by this node's wall clock.
    fn queue(
        &self,
        key: &QueueKey,
        term: u64,
        fifo: bool,
    ) -> Result<Arc<Mutex<QueueState>>, BrokerError> {
        let mut t = self.table.lock().unwrap();
        match term.cmp(&t.term) {
            std::cmp::Ordering::Less => return Err(Self::not_ready()),
            std::cmp::Ordering::Greater => {
                t.queues.clear();
                t.reset_floors.clear();
                t.term = term;
            }
            std::cmp::Ordering::Equal => {}
        }
        let q = t.queues.entry(key.clone()).or_insert_with(|| {
            let (min, max) = self.node.store().queue_offsets(&key.topic, key.queue_id);
            let meta = self.node.shared_meta().read().unwrap();
            Arc::new(Mutex::new(adopt::initial_state(&meta, key, fifo, min, max)))
        });
        Ok(q.clone())
    }

    /// A receipt handle for a new delivery. Delivery ids hold the term in their top
    /// 24 bits, so they are unique across terms.
    fn new_handle(&self, term: u64, topic: &str, queue_id: i32, offset: u64) -> ReceiptHandle {
        let seq = self.delivery_seq.fetch_add(1, Ordering::Relaxed) & ((1 << 40) - 1);
        ReceiptHandle {
            term,
            delivery_id: (term << 40) | seq,
            topic: topic.to_owned(),
            queue_id,
            queue_offset: offset,
        }
    }

    fn handle_queue(
        &self,
        consumer: &str,
        handle: &ReceiptHandle,
        term: u64,
        fifo: bool,
    ) -> Result<Arc<Mutex<QueueState>>, BrokerError> {
        let key = QueueKey {
            consumer: consumer.to_owned(),
            topic: handle.topic.clone(),
            queue_id: handle.queue_id,
        };
        let floor = self.table.lock().unwrap().reset_floors.get(&key).copied();
        if floor.is_some_and(|f| handle.delivery_id < f) {
            return Err(refuse(
                ErrorKind::InvalidReceiptHandle,
                "the receipt handle is of a delivery made before the consumer group's \
                 offsets were reset",
            ));
        }
        self.queue(&key, term, fifo)
    }

    /// Error unless the queue of `handle` holds its offset.
    fn check_held(&self, handle: &ReceiptHandle) -> Result<(), BrokerError> {
        let (_, max) = self
            .node
            .store()
            .queue_offsets(&handle.topic, handle.queue_id);
        if handle.queue_offset >= max {
            return Err(refuse(
                ErrorKind::InvalidReceiptHandle,
                "the receipt handle names a message the queue does not hold",
            ));
        }
        Ok(())
    }

    fn not_ready() -> BrokerError {
        refuse(
            ErrorKind::NoLeader,
            "this node is not (yet) a ready leader of its group",
        )
    }

    /// Takes up to `req.max_messages` messages. Their deliveries are recorded
    /// through Raft before they are returned: a FIFO group's as leases, another
    /// group's as delivery attempts if `req.record_attempts` (not while a member
    /// says it decodes only an earlier log command set). Errors:
    /// `NoLeader` when this node is not a ready leader; a store failure when
    /// nothing could be taken (a queue that fails after others gave messages is
    /// skipped and logged).
    pub async fn pop(&self, req: &PopRequest) -> Result<PopResult, BrokerError> {
        let _gate = self.gate.read().await;
        let term = self.ready_term().ok_or_else(Self::not_ready)?;
        let mut out = PopResult::default();
        // Recorded while a member is down too (the time a failover may follow).
        let record = Record {
            attempts: !req.fifo
                && req.record_attempts
                && self.node.no_member_says_below(SET_DELIVERY_ATTEMPTS),
            // A FIFO queue hands out a batch unless a member says it cannot
            // decode its lease.
            fifo_batches: req.fifo && self.fifo_batches(),
        };
        for &queue_id in &req.queue_ids {
            if out.messages.len() >= req.max_messages {
                break;
            }
            let key = QueueKey {
                consumer: req.consumer.clone(),
                topic: req.topic.clone(),
                queue_id,
            };
            let q = self.queue(&key, term, req.fifo)?;
            let mut st = q.lock().await;
            let taken_before = out.messages.len() + out.dead.len();
            let popped = self.pop_queue(req, term, queue_id, record, &mut st, &mut out);
            if record.fifo_batches && out.messages.len() + out.dead.len() > taken_before {
                // Made under the queue's lock: a later lease of it has a higher id.
                let lease_id = self.new_handle(term, &req.topic, queue_id, 0).delivery_id;
                let lease = fifo::batch_lease(&key, &st, lease_id, Instant::now(), now_ms());
                out.batches.push(lease);
            }
            if let Err(e) = popped {
                if out.messages.is_empty() && out.dead.is_empty() {
                    return Err(e);
                }
                tracing::warn!(topic = %req.topic, queue_id, error = %e, "skipping a queue this time");
            }
        }
        let leases = std::mem::take(&mut out.leases);
        let batches = std::mem::take(&mut out.batches);
        let attempts = std::mem::take(&mut out.attempts);
        let recorded = if !batches.is_empty() {
            self.commit_batches(term, batches).await
        } else if !leases.is_empty() {
            self.commit_leases(term, leases).await
        } else if !attempts.is_empty() {
            match self.commit_attempts(attempts).await {
                Err(BrokerError::Raft(RaftNodeError::MembersCannotDecode { .. })) => {
                    // A member said, since this pop began, that it decodes only
                    // an earlier set: answered unrecorded, as with such a member.
                    tracing::warn!(
                        "delivery attempts not recorded: a member runs an earlier release"
                    );
                    Ok(())
                }
                r => r,
            }
        } else {
            Ok(())
        };
        if let Err(e) = recorded {
            // Not returned: make them deliverable again at once.
            self.release(req, term, &out).await;
            return Err(e);
        }
        Ok(out)
    }

    fn pop_queue(
        &self,
        req: &PopRequest,
        term: u64,
        queue_id: i32,
        record: Record,
        st: &mut QueueState,
        out: &mut PopResult,
    ) -> Result<(), BrokerError> {
        let store = self.node.store();
        let (min, max) = store.queue_offsets(&req.topic, queue_id);
        st.clamp_to_min(min);
        let now = Instant::now();
        let visible_at = now + Duration::from_millis(req.invisible_ms);
        // Only for the replicated lease: what a new leader would hold it until.
        let lease_at_ms = now_ms().saturating_add(req.invisible_ms as i64);
        if req.fifo && st.fifo_blocked(now) {
            return Ok(());
        }
        // A queue whose batch a single lease cannot describe waits for its
        // acks in queue order (or for batch leases).
        if req.fifo && !record.fifo_batches && !st.single_lease_fits() {
            return Ok(());
        }
        // A FIFO group takes a batch of a queue's messages, or one at a time
        // while a member decodes no batch leases.
        let taken_before = out.messages.len();
        let one_at_a_time = req.fifo && !record.fifo_batches;
        let room = |out: &PopResult| {
            out.messages.len() < req.max_messages
                && !(one_at_a_time && out.messages.len() > taken_before)
        };
        // Deliveries whose invisible time ended come first, lowest offset first.
        for (offset, inflight) in st.expired(now) {
            if !room(out) {
                return Ok(());
            }
            let handle = self.new_handle(term, &req.topic, queue_id, offset);
            let id = handle.delivery_id;
            let stored = match store.get_message(&req.topic, queue_id, offset) {
                Ok(m) => m,
                Err(StoreError::OutOfRange { .. }) => {
                    // Retention removed it while in flight.
                    st.ack(offset, Some(inflight.delivery_id));
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let attempt = st.deliver(offset, id, visible_at);
            if inflight.attempt >= req.max_delivery_attempts {
                out.dead.push(DeadLetter {
                    handle,
                    record: stored.view().to_record(),
                });
                if req.fifo {
                    return Ok(());
                }
                continue;
            }
            attempts::record(req, record, &handle, attempt, lease_at_ms, out);
            out.messages
                .push(delivered(&stored.view(), handle, req, attempt));
        }
        // New messages follow only once every expired one went out again (the
        // loop above returns otherwise), and one at a time only alone.
        if one_at_a_time && st.in_flight() > 0 {
            return Ok(());
        }
        let Some(cq) = store.consume_queues().get(&req.topic, queue_id) else {
            return Ok(());
        };
        for _ in 0..MAX_SCAN_PER_QUEUE {
            if !room(out) {
                break;
            }
            let Some(offset) = st.next_new() else { break };
            if offset >= max {
                break;
            }
            let e = store.queue_entry(&cq, offset)?;
            if !req.filter.accepts_hash(e.tag_hash) {
                st.skip(offset);
                continue;
            }
            let (e, bytes) = store.queue_message(&cq, offset)?;
            let view = RecordView::parse_checked_before(&bytes).map_err(|reason| {
                BrokerError::Store(StoreError::Corrupted {
                    path: "CommitLog".into(),
                    file_offset: e.commit_log_offset,
                    reason,
                })
            })?;
            if !req.filter.accepts_tag(view.property(PROPERTY_TAGS)) {
                st.skip(offset);
                continue;
            }
            let handle = self.new_handle(term, &req.topic, queue_id, offset);
            let used_up = st.prior_attempts(offset) >= req.max_delivery_attempts;
            let attempt = st.deliver(offset, handle.delivery_id, visible_at);
            if used_up {
                // Earlier leaders made its last attempt: in flight until the
                // caller has copied it to the dead-letter queue and acked it.
                out.dead.push(DeadLetter {
                    handle,
                    record: view.to_record(),
                });
                continue;
            }
            attempts::record(req, record, &handle, attempt, lease_at_ms, out);
            out.messages.push(delivered(&view, handle, req, attempt));
        }
        Ok(())
    }

    /// Acks one delivery. Errors: `INVALID_RECEIPT_HANDLE` when the handle names an
    /// offset the queue does not hold or a delivery replaced by a newer one;
    /// `NoLeader` when not a ready leader; for a FIFO group (as
    /// [`Consumers::ack_many`]), the Raft write that records the ack failing
    /// (nothing is acked then).
    pub async fn ack(
        &self,
        consumer: &str,
        handle: &ReceiptHandle,
        fifo: bool,
    ) -> Result<(), BrokerError> {
        if fifo {
            let mut one = self
                .ack_many(consumer, std::slice::from_ref(handle), true)
                .await;
            return one.pop().unwrap_or_else(|| Err(Self::not_ready()));
        }
        self.ack_unordered(consumer, handle).await
    }

    /// Acks one delivery of a group that is not FIFO (its offset is committed
    /// later, by the offset committer). Errors: as [`Consumers::ack`].
    async fn ack_unordered(
        &self,
        consumer: &str,
        handle: &ReceiptHandle,
    ) -> Result<(), BrokerError> {
        let _gate = self.gate.read().await;
        let term = self.ready_term().ok_or_else(Self::not_ready)?;
        self.check_held(handle)?;
        let q = self.handle_queue(consumer, handle, term, false)?;
        let mut st = q.lock().await;
        match st.ack(handle.queue_offset, Some(handle.delivery_id)) {
            AckOutcome::Acked | AckOutcome::AlreadyAcked => Ok(()),
            AckOutcome::Stale => Err(fifo::stale()),
        }
    }

    /// Moves a delivery's invisible deadline to now + `invisible_ms`; returns the
    /// handle to use from now on. Error: `INVALID_RECEIPT_HANDLE` if the handle is
    /// not the message's current delivery.
    pub async fn change_invisible(
        &self,
        consumer: &str,
        handle: &ReceiptHandle,
        invisible_ms: u64,
        fifo: bool,
    ) -> Result<ReceiptHandle, BrokerError> {
        let _gate = self.gate.read().await;
        let term = self.ready_term().ok_or_else(Self::not_ready)?;
        self.check_held(handle)?;
        let q = self.handle_queue(consumer, handle, term, fifo)?;
        let mut st = q.lock().await;
        let visible_at = Instant::now() + Duration::from_millis(invisible_ms);
        let lease_at_ms = now_ms().saturating_add(invisible_ms as i64);
        let attempt = st.attempt_of(handle.queue_offset, handle.delivery_id);
        let Some(attempt) = attempt else {
            return Err(refuse(
                ErrorKind::InvalidReceiptHandle,
                "the receipt handle is not the message's current delivery",
            ));
        };
        if fifo && self.fifo_batches() {
            // A new leader must keep the message invisible as long: the
            // queue's deliveries in flight as they will be.
            let mut next = st.clone();
            next.change_invisible(handle.queue_offset, handle.delivery_id, visible_at);
            let key = QueueKey {
                consumer: consumer.to_owned(),
                topic: handle.topic.clone(),
                queue_id: handle.queue_id,
            };
            let lease_id = self
                .new_handle(term, &key.topic, key.queue_id, 0)
                .delivery_id;
            let batch = fifo::batch_lease(&key, &next, lease_id, Instant::now(), now_ms());
            self.commit_batches(term, vec![batch]).await?;
        } else if fifo && (!st.single_lease_fits() || self.batch_leased(consumer, handle)) {
            // A single lease would say everything below it is acked, and
            // nothing above it.
            return Err(refuse(
                ErrorKind::Unsupported,
                "this FIFO queue holds a batch, which a member of an earlier \
                 release cannot record: the invisible time stays as it was",
            ));
        } else if fifo {
            // A new leader must keep the message invisible as long.
            self.commit_leases(
                term,
                vec![TimedFifoLease {
                    lease: FifoLease {
                        group: consumer.to_owned(),
                        topic: handle.topic.clone(),
                        queue_id: handle.queue_id,
                        queue_offset: handle.queue_offset,
                        delivery_id: handle.delivery_id,
                        attempt,
                        visible_at_ms: lease_at_ms,
                    },
                    invisible_ms,
                }],
            )
            .await?;
        }
        st.change_invisible(handle.queue_offset, handle.delivery_id, visible_at);
        Ok(handle.clone())
    }

    /// True if `handle` is a delivery that an ack would take now (its message is
    /// in flight under this handle, or was never delivered by this leader).
    pub async fn is_current(
        &self,
        consumer: &str,
        handle: &ReceiptHandle,
        fifo: bool,
    ) -> Result<bool, BrokerError> {
        let term = self.ready_term().ok_or_else(Self::not_ready)?;
        self.check_held(handle)?;
        let q = self.handle_queue(consumer, handle, term, fifo)?;
        let st = q.lock().await;
        Ok(st.peek_ack(handle.queue_offset, Some(handle.delivery_id)) == AckOutcome::Acked)
    }

    async fn commit(&self, commits: Vec<OffsetCommit>) -> Result<(), BrokerError> {
        self.node
            .write_command(Command::CommitOffsets(commits))
            .await?;
        Ok(())
    }

    /// Commits a FIFO group's offsets only as this node's own proposal while it leads
    /// (never forwarded to a later leader).
    async fn commit_as_leader(&self, commits: Vec<OffsetCommit>) -> Result<(), BrokerError> {
        self.node
            .write_command_as_leader(Command::CommitOffsets(commits))
            .await?;
        Ok(())
    }

    /// Commits the consumer offsets that moved in `term` through Raft, once; none
    /// if this node's table is of another term. Returns how many queues'
    /// offsets were committed. A commit this node proposed as leader of `term` is
    /// passed on to the next leader if the term ends before it is committed
    /// (offsets only move forward, so a late one cannot take a group back).
    /// Errors: the Raft write's.
    pub async fn commit_offsets_once(&self, term: u64) -> Result<usize, BrokerError> {
        let _gate = self.gate.read().await;
        let queues: Vec<_> = {
            let t = self.table.lock().unwrap();
            if t.term != term {
                return Ok(0);
            }
            t.queues
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        let mut taken = Vec::new();
        for (key, q) in queues {
            let mut st = q.lock().await;
            if let Some(offset) = st.take_commit() {
                taken.push((
                    OffsetCommit {
                        group: key.consumer.clone(),
                        topic: key.topic.clone(),
                        queue_id: key.queue_id,
                        offset,
                    },
                    q.clone(),
                ));
            }
        }
        if taken.is_empty() {
            return Ok(0);
        }
        let n = taken.len();
        let commits = taken.iter().map(|(c, _)| c.clone()).collect();
        if let Err(e) = self.commit(commits).await {
            for (_, q) in taken {
                q.lock().await.commit_failed();
            }
            return Err(e);
        }
        Ok(n)
    }
}

/// What a receive records through Raft before it answers.
#[derive(Debug, Clone, Copy)]
struct Record {
    /// A non-FIFO group's delivery attempts.
    attempts: bool,
    /// A FIFO group's deliveries as batch leases (every member decodes them),
    /// not one lease per message (and one message per queue and receive).
    fifo_batches: bool,
}

fn delivered(
    view: &RecordView<'_>,
    handle: ReceiptHandle,
    req: &PopRequest,
    attempt: u32,
) -> Delivery {
    Delivery {
        record: view.to_record(),
        physical_offset: view.physical_offset(),
        fields: DeliveryFields {
            receipt_handle: handle.encode(),
            queue_offset: handle.queue_offset,
            invisible_ms: req.invisible_ms,
            delivery_attempt: attempt,
        },
    }
}

#[cfg(test)]
mod tests;
