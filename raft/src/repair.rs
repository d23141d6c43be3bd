//! Damaged log entries fetched again from a peer (protocol-aware recovery).
//!
//! Recovery after a crash scans only the CommitLog past its checkpoint. A record
//! before it that is damaged later fails its CRC whenever it is read: openraft then
//! stops the node (a read at start, to find term boundaries, or to apply or
//! replicate the entry), and a consumer or the replica audit cannot read it. By
//! Raft's log matching, a peer holding an entry with the same log index and term
//! holds the same entry, so this node asks its peers for it
//! ([`EntryRepair::repair`], the peer call `ReadEntry`) and writes it back in place
//! (`ledgermq_store::CommitLog::rewrite_entry`, fsynced).
//!
//! Who repairs:
//! - the log store, when openraft reads a damaged entry (`LogStore`), and waits
//!   for the repair before it answers, up to [`READ_BUDGET`] (the read then
//!   fails, which stops openraft on this node);
//! - a scrub after every start ([`scrub`]), which reads the whole log once at a
//!   bounded rate, so that damage openraft never reads again (entries already
//!   applied and replicated) is found before a consumer or a failover needs it.
//!
//! An entry no peer holds intact under the same log id (every copy damaged, or
//! this node's entry was never committed and the others hold another term there)
//! stays damaged: reads of it keep failing, and the scrub logs it. The peer server
//! answers `ReadEntry` from before openraft starts on that node (`crate::server`),
//! so nodes of a group that restarts together can repair each other.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ledgermq_store::{MessageStore, StoreError};
use serde::{Deserialize, Serialize};
use tonic::transport::Channel;

use crate::codec::{entry_to_records, log_id, records_to_entry};
use crate::error::RaftNodeError;
use crate::network::pb::raft_peer_client::RaftPeerClient;
use crate::network::{decode, lazy_channel, peer_request, NetworkFilter, PeerTls};
use crate::types::{Entry, NodeId};

/// The `ReadEntry` request: the entry with this log index and term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryWanted {
    /// Raft log index.
    pub log_index: u64,
    /// Raft term the asking node's index gives the entry.
    pub term: u64,
}

/// How long one `ReadEntry` call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// The wait between rounds over the peers that have not answered yet.
const ROUND_GAP: Duration = Duration::from_millis(200);
/// How long a read through openraft waits for a repair before it fails (openraft
/// awaits the read in its core or in a follower's replication task, so this is
/// kept short; the scrub goes on trying).
pub const READ_BUDGET: Duration = Duration::from_secs(3);
/// How long the scrub tries to repair one entry.
const SCRUB_BUDGET: Duration = Duration::from_secs(20);
/// The scrub reads at most this many CommitLog bytes, then pauses for
/// [`SCRUB_PAUSE`]: at most 80 MiB/s, so a start with a large log does not starve
/// the node of CPU or disk.
const SCRUB_CHUNK_BYTES: u64 = 4 << 20;
const SCRUB_PAUSE: Duration = Duration::from_millis(50);
/// Largest `ReadEntry` answer accepted: as the peer server's request limit (an
/// entry can be up to a segment; tonic's default of 4 MiB would refuse a
/// single 4 MiB message).
const MAX_ANSWER_BYTES: usize = 256 << 20;

/// The peer side of `ReadEntry`: this node's entry `wanted`, if it holds it intact
/// under that log id (`None` if not held, of another term, or damaged here too).
/// Errors: a store failure other than those, as text for the peer.
pub fn read_intact(store: &MessageStore, wanted: EntryWanted) -> Result<Option<Entry>, String> {
    let log = store.commit_log();
    let entry = match log.read_entry(wanted.log_index) {
        Ok(e) if e.location.term == wanted.term => e,
        Ok(_) | Err(StoreError::OutOfRange { .. } | StoreError::Corrupted { .. }) => {
            return Ok(None)
        }
        Err(e) => return Err(e.to_string()),
    };
    match log.verified_records(&entry) {
        Ok(records) => records_to_entry(wanted.term, wanted.log_index, records).map(Some),
        // Damaged here too.
        Err(_) => Ok(None),
    }
}

/// Takes an entry out of [`EntryRepair`]'s set of repairs under way when dropped.
struct InFlight<'a> {
    set: &'a Mutex<BTreeSet<u64>>,
    log_index: u64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Ok(mut set) = self.set.lock() {
            set.remove(&self.log_index);
        }
    }
}

/// What one peer said of an entry.
enum Answer {
    /// Its intact copy.
    Entry(Entry),
    /// It holds no intact entry under that log id: not worth asking again.
    NotHeld,
    /// No answer (unreachable, starting, timed out): ask again next round.
    Failed,
}

/// Fetches damaged entries from this node's peers and writes them back. Cheap to
/// share (`Arc`).
pub struct EntryRepair {
    self_id: NodeId,
    /// Every other member: id → peer address.
    /// The other members (id → peer address), learners included; follows the
    /// membership once it is applied ([`Self::set_peers`]).
    peers: Mutex<BTreeMap<NodeId, String>>,
    store: Arc<MessageStore>,
    filter: NetworkFilter,
    /// Mutual TLS to the peers, if the group has it.
    tls: Option<PeerTls>,
    channels: Mutex<BTreeMap<NodeId, Channel>>,
    /// Entries being repaired (by the log store or the scrub): a second caller
    /// waits for the first.
    in_flight: Mutex<BTreeSet<u64>>,
    /// Set when the node stops: a repair gives up.
    stopping: Arc<AtomicBool>,
}

impl EntryRepair {
    /// For node `self_id` of a group of `members` (id → peer address, this node
    /// included), whose store is `store`.
    pub fn new(
        self_id: NodeId,
        members: &BTreeMap<NodeId, String>,
        store: Arc<MessageStore>,
        filter: NetworkFilter,
        tls: Option<PeerTls>,
    ) -> Self {
        let peers = members
            .iter()
            .filter(|(&id, _)| id != self_id)
            .map(|(&id, a)| (id, a.clone()))
            .collect();
        Self {
            self_id,
            peers: Mutex::new(peers),
            store,
            filter,
            tls,
            channels: Mutex::new(BTreeMap::new()),
            in_flight: Mutex::new(BTreeSet::new()),
            stopping: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Replaces the members asked for copies (a membership change): every node of
    /// `members` but this one.
    pub fn set_peers(&self, members: &BTreeMap<NodeId, String>) {
        let peers: BTreeMap<NodeId, String> = members
            .iter()
            .filter(|(&id, _)| id != self.self_id)
            .map(|(&id, a)| (id, a.clone()))
            .collect();
        let mut current = self.peers.lock().unwrap();
        if *current != peers {
            // A peer's address may have changed: its cached channel goes.
            self.channels.lock().unwrap().clear();
            *current = peers;
        }
    }

    /// The flag that stops every repair (set when the node stops).
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stopping.clone()
    }

    fn stopped(&self) -> bool {
        self.stopping.load(Ordering::Acquire) || self.store.is_closed()
    }

    /// Repairs entry `log_index` from a peer's copy (of the term this node's Raft
    /// index gives it) and returns the entry, asking each peer that has not said
    /// it holds no such entry, round after round, for up to `budget`. `None` when
    /// this node cannot say which term the entry is of, no peer gave a copy that
    /// could be written back in time, the entry is gone meanwhile (truncated,
    /// purged or replaced), or the node stops; each case is logged.
    pub async fn repair(&self, log_index: u64, budget: Duration) -> Option<Entry> {
        let deadline = tokio::time::Instant::now() + budget;
        // One repair of an entry at a time; a second caller waits for the first.
        loop {
            if self.in_flight.lock().unwrap().insert(log_index) {
                break;
            }
            if self.stopped() || tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Forgotten however the repair ends (a panic, or the caller dropping it).
        let _done = InFlight {
            set: &self.in_flight,
            log_index,
        };
        self.repair_alone(log_index, deadline).await
    }

    async fn repair_alone(&self, log_index: u64, deadline: tokio::time::Instant) -> Option<Entry> {
        let loc = match self.store.commit_log().entry_location(log_index) {
            Ok(loc) => loc,
            Err(e) => {
                tracing::error!(log_index, error = %e, "a damaged entry cannot be repaired: its place in the log is unknown");
                return None;
            }
        };
        let wanted = EntryWanted {
            log_index,
            term: loc.term,
        };
        // Repaired meanwhile (by another caller)?
        if let Ok(Some(entry)) = read_intact(&self.store, wanted) {
            return Some(entry);
        }
        let mut asking: Vec<NodeId> = self.peers.lock().unwrap().keys().copied().collect();
        while !asking.is_empty() {
            let mut still = Vec::new();
            for peer in asking {
                if self.stopped() {
                    return None;
                }
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                let entry = match self.ask(peer, wanted, left.min(CALL_TIMEOUT)).await {
                    Answer::Entry(e) => e,
                    Answer::NotHeld => continue,
                    Answer::Failed => {
                        still.push(peer);
                        continue;
                    }
                };
                if self.stopped() {
                    return None;
                }
                match self.write_back(wanted, entry.clone()).await {
                    Ok(()) => {
                        tracing::warn!(
                            log_index,
                            term = loc.term,
                            from = peer,
                            "a damaged CommitLog entry was written again from a peer's copy"
                        );
                        return Some(entry);
                    }
                    // Gone, or not this log's to change any more: no copy helps.
                    Err(RaftNodeError::Store(
                        e @ (StoreError::EntryReplaced { .. }
                        | StoreError::OutOfRange { .. }
                        | StoreError::NotWritable(_)
                        | StoreError::Corrupted { .. }),
                    )) => {
                        tracing::warn!(log_index, error = %e, "a damaged entry was not written back");
                        return None;
                    }
                    // The copy does not fill the entry's slot: this peer's entry under
                    // that log id is not the one this log holds, which log matching
                    // rules out. Loud; another peer may do.
                    Err(e) => {
                        tracing::error!(log_index, from = peer, error = %e, "a peer's copy of a damaged entry could not be written back");
                    }
                }
            }
            if tokio::time::Instant::now() + ROUND_GAP >= deadline || still.is_empty() {
                break;
            }
            asking = still;
            tokio::time::sleep(ROUND_GAP).await;
        }
        tracing::error!(
            log_index,
            term = loc.term,
            "no peer gave an intact copy of a damaged entry in time; it stays damaged here for now"
        );
        None
    }

    /// Asks `peer` for `wanted`, waiting at most `timeout`.
    async fn ask(&self, peer: NodeId, wanted: EntryWanted, timeout: Duration) -> Answer {
        if self.filter.is_blocked(self.self_id, peer) || self.filter.is_blocked(peer, self.self_id)
        {
            return Answer::Failed;
        }
        let Some(channel) = self.channel(peer) else {
            return Answer::Failed;
        };
        let Ok(req) = peer_request(self.self_id, &wanted, timeout) else {
            return Answer::Failed;
        };
        let mut client = RaftPeerClient::new(channel).max_decoding_message_size(MAX_ANSWER_BYTES);
        let reply = match tokio::time::timeout(timeout, client.read_entry(req)).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(status)) => {
                tracing::debug!(peer, %status, "ReadEntry failed");
                return Answer::Failed;
            }
            Err(_) => return Answer::Failed,
        };
        match decode::<Result<Option<Entry>, String>>(reply.get_ref()) {
            Ok(Ok(Some(e))) if e.log_id == log_id(wanted.term, wanted.log_index) => {
                Answer::Entry(e)
            }
            Ok(Ok(_)) => Answer::NotHeld,
            Ok(Err(e)) => {
                tracing::warn!(peer, error = %e, "ReadEntry answered an error");
                Answer::Failed
            }
            Err(status) => {
                tracing::warn!(peer, %status, "ReadEntry's answer does not decode");
                Answer::NotHeld
            }
        }
    }

    fn channel(&self, peer: NodeId) -> Option<Channel> {
        // The address first, its lock released: `set_peers` takes the two locks
        // in the other order.
        let addr = self.peers.lock().unwrap().get(&peer)?.clone();
        let mut cache = self.channels.lock().unwrap();
        if let Some(c) = cache.get(&peer) {
            return Some(c.clone());
        }
        let c = lazy_channel(&addr, Duration::from_millis(500), self.tls.as_ref()).ok()?;
        cache.insert(peer, c.clone());
        Some(c)
    }

    /// Writes `entry` over this node's damaged copy (off the runtime's threads: it
    /// fsyncs). Errors: `Store` as `MessageStore::rewrite_entry`, `Codec`.
    async fn write_back(&self, wanted: EntryWanted, entry: Entry) -> Result<(), RaftNodeError> {
        let records = entry_to_records(entry)?;
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            store
                .rewrite_entry(wanted.term, wanted.log_index, &records)
                .map(|_| ())
                .map_err(RaftNodeError::from)
        })
        .await
        .map_err(|e| RaftNodeError::Raft(format!("writing an entry back failed: {e}")))?
    }
}

/// Reads every entry this node's log holds at start once, each record's CRC
/// checked, at most `SCRUB_CHUNK_BYTES` per `SCRUB_PAUSE`, and repairs each
/// damaged one from a peer. Ends with the log's end as of its start, or when the
/// node stops (its log store, the last holder of `repair`, is dropped) or closes
/// its store.
pub async fn scrub(repair: std::sync::Weak<EntryRepair>) {
    let Some((mut next, end)) = repair.upgrade().map(|r| {
        let log = r.store.commit_log();
        (log.first_log_index(), log.next_log_index())
    }) else {
        return;
    };
    let (mut checked, mut repaired, mut left) = (0u64, 0u64, 0u64);
    while next < end {
        let Some(r) = repair.upgrade().filter(|r| !r.stopped()) else {
            return;
        };
        let (store, from) = (r.store.clone(), next);
        let read = tokio::task::spawn_blocking(move || damaged_in_chunk(&store, from, end)).await;
        let Ok((upto, damaged)) = read else { return };
        checked += upto - next;
        next = upto;
        for log_index in damaged {
            if r.repair(log_index, SCRUB_BUDGET).await.is_some() {
                repaired += 1;
            } else {
                left += 1;
            }
        }
        drop(r);
        tokio::time::sleep(SCRUB_PAUSE).await;
    }
    if repaired + left > 0 {
        tracing::warn!(
            checked,
            repaired,
            left_damaged = left,
            "scrub of the CommitLog done"
        );
    } else {
        tracing::info!(checked, "scrub of the CommitLog done: no damage");
    }
}

/// Checks entries from `from` (below `end`) until [`SCRUB_CHUNK_BYTES`] were read;
/// returns where the next chunk starts and the damaged entries found. An entry
/// no longer held (purged or truncated meanwhile) is skipped.
fn damaged_in_chunk(store: &MessageStore, from: u64, end: u64) -> (u64, Vec<u64>) {
    let log = store.commit_log();
    let stop = end.min(log.next_log_index());
    let (mut at, mut bytes, mut damaged) = (from.max(log.first_log_index()), 0u64, Vec::new());
    while at < stop && bytes < SCRUB_CHUNK_BYTES {
        match log.read_entry_verified(at) {
            Ok(e) => bytes += e.bytes.len() as u64,
            Err(StoreError::Corrupted { .. }) => damaged.push(at),
            Err(_) => {}
        }
        at += 1;
    }
    (if at >= stop { end } else { at }, damaged)
}
