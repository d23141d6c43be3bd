//! Leader-side writes. Client messages that arrive while earlier batches are being
//! appended and replicated are gathered into the next Raft entry, so one entry (one
//! append, one fsync, one replication round) carries many messages: openraft 0.9
//! appends one entry batch at a time, so group commit has to happen here.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ledgermq_store::{MessageRecord, MessageStore};
use openraft::error::{ClientWriteError, RaftError};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;

use crate::error::RaftNodeError;
use crate::peer_formats::PeerFormats;
use crate::types::{NodeId, Placed, Raft, Request, Response};

/// How long a command of a later log command set waits for every member to
/// say, in the leader's current term, that it decodes the set (right after an
/// election the followers' first answers may not have come yet) before it is
/// refused with `MembersCannotDecode`.
pub const MEMBERS_ANSWER_WAIT: Duration = Duration::from_secs(1);

/// Batching limits.
#[derive(Debug, Clone)]
pub struct BatchConfig {
    /// Most messages in one entry.
    pub max_messages: usize,
    /// Most encoded bytes in one entry (also capped by the CommitLog segment size).
    /// Keep it small enough that `max_payload_entries` entries replicate within one
    /// AppendEntries deadline.
    pub max_bytes: usize,
    /// Entries proposed and not yet applied at once (a slot frees when the entry's
    /// write returns, i.e. once it is committed and applied); while all are in
    /// flight, new messages wait and join the next entry.
    pub in_flight: usize,
    /// Most encoded bytes of one write request of several messages (RocketMQ: a
    /// batch is at most 4 MiB); a larger one is refused (`InvalidInput`), since
    /// one request is one entry. A single message is bounded by the store's
    /// message size limit instead.
    pub max_request_bytes: usize,
    /// Most entry bytes one AppendEntries carries, or one entry if that alone is
    /// larger (at most about `max_request_bytes`). openraft 0.9 gives the call the
    /// heartbeat interval (100 ms) as its deadline: either crosses a 1 Gbit/s link
    /// with 10 ms of latency well within it.
    pub max_replication_bytes: usize,
    /// Most encoded bytes of message writes taken by the leader and not yet
    /// committed; a write past it is refused at once (`Overloaded`), so a burst of
    /// requests cannot buffer without bound.
    pub max_pending_bytes: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_messages: 1024,
            max_bytes: 1 << 20,
            // 4 and 8 measured no faster in alternating A/B runs (mqbench-compare,
            // 1 KiB, 1 producer x 128: 2 gave 15.5-16.3k msgs/s SYNC_FLUSH and
            // 18.4-18.5k ASYNC_FLUSH, 4 gave 14.1-15.4k and 15.6-18.3k).
            in_flight: 2,
            max_request_bytes: 4 << 20,
            max_replication_bytes: 1 << 20,
            max_pending_bytes: 256 << 20,
        }
    }
}

struct Pending {
    messages: Vec<MessageRecord>,
    encoded_bytes: usize,
    /// Its share of `max_pending_bytes`, returned when its write is answered.
    budget: tokio::sync::OwnedSemaphorePermit,
    done: oneshot::Sender<Result<Vec<Placed>, RaftNodeError>>,
    /// Not proposed at or after this instant (a forwarded write's deadline).
    deadline: Option<Instant>,
}

impl Pending {
    /// Nobody waits for it any more (the caller gave up or its deadline passed):
    /// it must not be proposed. Answers `Expired` to a caller still listening.
    fn expired(self) -> Option<Self> {
        let late = self.deadline.is_some_and(|d| Instant::now() >= d);
        if self.done.is_closed() {
            return None;
        }
        if late {
            let _ = self.done.send(Err(RaftNodeError::Expired));
            return None;
        }
        Some(self)
    }
}

/// Writes proposed by this node while it leads.
pub struct Writer {
    raft: Raft,
    store: Arc<MessageStore>,
    tx: mpsc::Sender<Pending>,
    paused: AtomicBool,
    max_request_bytes: usize,
    pending_budget: Arc<Semaphore>,
    max_pending_bytes: usize,
    /// This node and what its peers said they decode (log command sets).
    node_id: NodeId,
    formats: PeerFormats,
    /// The leader term in which this writer was first asked to write a command
    /// whose set not every member has confirmed, and when: the weaker rule's
    /// grace counts from there ([`Writer::may_write`]).
    term_seen: std::sync::Mutex<(u64, Instant)>,
}

pub(crate) fn map_write_error(
    e: RaftError<NodeId, ClientWriteError<NodeId, openraft::BasicNode>>,
) -> RaftNodeError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => RaftNodeError::NotLeader {
            leader: f.leader_id,
        },
        RaftError::APIError(other) => RaftNodeError::Raft(other.to_string()),
        RaftError::Fatal(f) => match f {
            openraft::error::Fatal::Stopped => RaftNodeError::ShuttingDown,
            other => RaftNodeError::Raft(other.to_string()),
        },
    }
}

impl Writer {
    /// Starts the batching task for `raft`; messages get `store_host` and the
    /// proposal time as store host and store timestamp. `formats` is what the
    /// peers of this node (`node_id`) said they decode: a command of a later log
    /// command set is refused until every member does.
    pub fn start(
        raft: Raft,
        store: Arc<MessageStore>,
        cfg: BatchConfig,
        store_host: SocketAddr,
        (node_id, formats): (NodeId, PeerFormats),
    ) -> Arc<Self> {
        let (tx, rx) = mpsc::channel(65_536);
        let max_request_bytes = cfg.max_request_bytes;
        let max_pending_bytes = cfg.max_pending_bytes.clamp(1, u32::MAX as usize);
        let max_entry_bytes = (cfg.max_bytes as u64).min(store.max_entry_bytes()) as usize;
        tokio::spawn(batch_loop(
            raft.clone(),
            cfg,
            max_entry_bytes,
            store_host,
            rx,
        ));
        Arc::new(Self {
            raft,
            store,
            tx,
            paused: AtomicBool::new(false),
            max_request_bytes,
            pending_budget: Arc::new(Semaphore::new(max_pending_bytes)),
            max_pending_bytes,
            node_id,
            formats,
            term_seen: std::sync::Mutex::new((0, Instant::now())),
        })
    }

    /// While paused (a leadership transfer), writes answer `NotLeader` at once, so
    /// no new entry refreshes the followers' leader lease.
    pub fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::Release);
    }

    fn check_not_paused(&self) -> Result<(), RaftNodeError> {
        if self.paused.load(Ordering::Acquire) {
            return Err(RaftNodeError::NotLeader { leader: None });
        }
        Ok(())
    }

    /// Refuses a request of `count` messages encoding to `encoded_bytes` over
    /// `max_request_bytes` (a single message is bounded by the store instead).
    /// Errors: `InvalidInput`.
    pub fn check_request_bytes(
        &self,
        count: usize,
        encoded_bytes: usize,
    ) -> Result<(), RaftNodeError> {
        if count > 1 && encoded_bytes > self.max_request_bytes {
            return Err(RaftNodeError::InvalidInput(format!(
                "{encoded_bytes} bytes of messages in one request exceed its {} bytes",
                self.max_request_bytes
            )));
        }
        Ok(())
    }

    /// Commits `request` through the local Raft (this node must lead). Dropping the
    /// returned future before a message write was proposed withdraws it.
    pub async fn write_local(&self, request: Request) -> Result<Response, RaftNodeError> {
        self.write_local_until(request, None).await
    }

    /// [`Self::write_local`], but a message write still unproposed at `deadline` is
    /// dropped (answered `Expired`); so is a command whose deadline has passed.
    pub async fn write_local_until(
        &self,
        request: Request,
        deadline: Option<Instant>,
    ) -> Result<Response, RaftNodeError> {
        self.check_not_paused()?;
        match request {
            Request::Messages(messages) => self
                .write_messages_until(messages, deadline)
                .await
                .map(Response::Messages),
            _ if deadline.is_some_and(|d| Instant::now() >= d) => Err(RaftNodeError::Expired),
            Request::Command(c) => {
                if !self.may_write_soon(&c, deadline).await {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(RaftNodeError::Expired);
                    }
                    // A member that cannot decode the entry would stop applying there.
                    return Err(RaftNodeError::MembersCannotDecode {
                        set: c.log_command_set(),
                    });
                }
                self.raft
                    .client_write(Request::Command(c))
                    .await
                    .map(|r| r.data)
                    .map_err(map_write_error)
            }
        }
    }

    /// [`Self::may_write`], waiting up to [`MEMBERS_ANSWER_WAIT`] (and not past
    /// `deadline`) for the members to answer: right after an election a member
    /// may not have said yet, in this term, what it decodes.
    async fn may_write_soon(&self, c: &crate::types::Command, deadline: Option<Instant>) -> bool {
        // A little past the wait, so the weaker rule's grace, which may have
        // begun just now, has passed at the last check.
        let until = Instant::now() + MEMBERS_ANSWER_WAIT + Duration::from_millis(50);
        let until = deadline.map_or(until, |d| d.min(until));
        loop {
            if self.may_write(c) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// True if every member may be sent `c` now: every member said, in this
    /// term, that it decodes its log command set; or, for a command written
    /// past silent members (`Command::written_past_silent_members`), none said
    /// it decodes only an earlier one and this leader has waited
    /// [`MEMBERS_ANSWER_WAIT`] in this term for the members' answers, so that a
    /// live member of an earlier release has had time to say so (only one that
    /// is down, or cut off that long, is passed over).
    fn may_write(&self, c: &crate::types::Command) -> bool {
        let set = c.log_command_set();
        if self
            .formats
            .members_decode_now(&self.raft, self.node_id, set)
        {
            return true;
        }
        c.written_past_silent_members()
            && self
                .formats
                .no_member_says_below_now(&self.raft, self.node_id, set)
            && self.waited_for_answers()
    }

    /// True once [`MEMBERS_ANSWER_WAIT`] has passed since this writer first
    /// asked in the current term.
    fn waited_for_answers(&self) -> bool {
        let term = self.raft.metrics().borrow().current_term;
        let mut seen = self.term_seen.lock().unwrap();
        if seen.0 != term {
            *seen = (term, Instant::now());
        }
        seen.1.elapsed() >= MEMBERS_ANSWER_WAIT
    }

    async fn write_messages_until(
        &self,
        messages: Vec<MessageRecord>,
        deadline: Option<Instant>,
    ) -> Result<Vec<Placed>, RaftNodeError> {
        if messages.is_empty() {
            return Err(RaftNodeError::InvalidInput("no messages to write".into()));
        }
        self.check_not_paused()?;
        // Bad input is refused here: once proposed, an entry the store cannot take
        // would be a storage failure that stops the node.
        let mut encoded_bytes = 0usize;
        for m in &messages {
            encoded_bytes += self.store.validate_message(m)?;
        }
        // Half messages not while a member on an earlier release answers: it
        // would neither index nor end them (a member down is no reason to
        // refuse: `PeerFormats::no_member_says_below`).
        if messages
            .iter()
            .any(|m| m.topic == ledgermq_store::half_index::HALF_TOPIC)
            && !self.formats.no_member_says_below_now(
                &self.raft,
                self.node_id,
                crate::format::SET_TRANSACTIONS,
            )
        {
            return Err(RaftNodeError::MembersCannotDecode {
                set: crate::format::SET_TRANSACTIONS,
            });
        }
        // A full disk refuses new messages before anything is proposed: every
        // replica would have to store them.
        self.store.check_room_for_writes()?;
        self.check_request_bytes(messages.len(), encoded_bytes)?;
        if encoded_bytes as u64 > self.store.max_entry_bytes() {
            return Err(RaftNodeError::InvalidInput(format!(
                "{encoded_bytes} bytes of messages exceed one entry's {} bytes",
                self.store.max_entry_bytes()
            )));
        }
        let overloaded = || RaftNodeError::Overloaded {
            max_pending_bytes: self.max_pending_bytes,
        };
        let units = encoded_bytes.clamp(1, self.max_pending_bytes) as u32;
        let budget = self
            .pending_budget
            .clone()
            .try_acquire_many_owned(units)
            .map_err(|_| overloaded())?;
        let (done, rx) = oneshot::channel();
        self.tx
            .try_send(Pending {
                messages,
                encoded_bytes,
                budget,
                done,
                deadline,
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => overloaded(),
                mpsc::error::TrySendError::Closed(_) => RaftNodeError::ShuttingDown,
            })?;
        rx.await.map_err(|_| RaftNodeError::ShuttingDown)?
    }
}

async fn batch_loop(
    raft: Raft,
    cfg: BatchConfig,
    max_entry_bytes: usize,
    store_host: SocketAddr,
    mut rx: mpsc::Receiver<Pending>,
) {
    let permits = Arc::new(Semaphore::new(cfg.in_flight.max(1)));
    // A request taken from the queue that did not fit the previous entry.
    let mut carry: Option<Pending> = None;
    loop {
        // Wait for a free slot first: while every slot is busy, messages queue up and
        // all go into the next entry.
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let first = match carry.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        let Some(first) = first.expired() else {
            continue;
        };
        let mut bytes = first.encoded_bytes;
        let mut count = first.messages.len();
        let mut batch = vec![first];
        while count < cfg.max_messages {
            let Ok(p) = rx.try_recv() else { break };
            let Some(p) = p.expired() else { continue };
            if bytes + p.encoded_bytes > max_entry_bytes {
                carry = Some(p);
                break;
            }
            count += p.messages.len();
            bytes += p.encoded_bytes;
            batch.push(p);
        }
        let raft = raft.clone();
        tokio::spawn(async move {
            let now = ledgermq_store::store::now_ms();
            let mut sizes = Vec::with_capacity(batch.len());
            let mut all = Vec::with_capacity(count);
            let mut waiters = Vec::with_capacity(batch.len());
            let mut budgets = Vec::with_capacity(batch.len());
            for p in batch {
                sizes.push(p.messages.len());
                for mut m in p.messages {
                    m.store_timestamp_ms = now;
                    m.store_host = store_host;
                    all.push(m);
                }
                waiters.push(p.done);
                budgets.push(p.budget);
            }
            if crate::canary::enabled(crate::canary::Canary::AckBeforeCommit) {
                // Broken on purpose: every send answered before its entry commits.
                let mut queue_ids = all.iter().map(|m| m.queue_id);
                for (w, n) in waiters.drain(..).zip(sizes.iter().copied()) {
                    let placed = queue_ids
                        .by_ref()
                        .take(n)
                        .map(|queue_id| Placed {
                            queue_id,
                            queue_offset: 0,
                            physical_offset: 0,
                        })
                        .collect();
                    let _ = w.send(Ok(placed));
                }
            }
            let result = raft.client_write(Request::Messages(all)).await;
            drop(permit);
            drop(budgets);
            match result {
                Ok(resp) => {
                    let Response::Messages(placed) = resp.data else {
                        for w in waiters {
                            let _ = w.send(Err(RaftNodeError::Raft(
                                "a message entry applied without placements".into(),
                            )));
                        }
                        return;
                    };
                    if placed.len() != sizes.iter().sum::<usize>() {
                        // The entry was dispatched before (cannot happen for a fresh proposal).
                        for w in waiters {
                            let _ = w.send(Err(RaftNodeError::Raft(
                                "placements missing for a committed entry".into(),
                            )));
                        }
                        return;
                    }
                    let mut it = placed.into_iter();
                    for (w, n) in waiters.into_iter().zip(sizes) {
                        let _ = w.send(Ok(it.by_ref().take(n).collect()));
                    }
                }
                Err(e) => {
                    let e = map_write_error(e);
                    for w in waiters {
                        let _ = w.send(Err(match &e {
                            RaftNodeError::NotLeader { leader } => {
                                RaftNodeError::NotLeader { leader: *leader }
                            }
                            RaftNodeError::ShuttingDown => RaftNodeError::ShuttingDown,
                            other => RaftNodeError::Raft(other.to_string()),
                        }));
                    }
                }
            }
        });
    }
}
