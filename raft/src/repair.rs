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
//!   for the repair before it answers;
//! - a scrub after every start ([`scrub`]), which reads the whole log once at a
//!   bounded rate, so that damage openraft never reads again (entries already
//!   applied and replicated) is found before a consumer or a failover needs it.
//!
//! An entry no peer holds intact under the same log id (every copy damaged, or
//! this node's entry was never committed and the others hold another term there)
//! stays damaged: reads of it keep failing, and the scrub logs it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ledgermq_store::{MessageStore, StoreError};
use serde::{Deserialize, Serialize};
use tonic::transport::Channel;

use crate::codec::{entry_to_records, log_id, records_to_entry};
use crate::network::pb::raft_peer_client::RaftPeerClient;
use crate::network::{decode, lazy_channel, peer_request, NetworkFilter};
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
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Rounds over the peers before a repair gives up, and the wait between them:
/// about 2 s for a peer that is restarting or briefly cut off.
const ROUNDS: u32 = 10;
const ROUND_GAP: Duration = Duration::from_millis(200);
/// The scrub reads at most this many CommitLog bytes, then pauses for
/// [`SCRUB_PAUSE`]: at most 80 MiB/s, so a start with a large log does not starve
/// the node of CPU or disk.
const SCRUB_CHUNK_BYTES: u64 = 4 << 20;
const SCRUB_PAUSE: Duration = Duration::from_millis(50);

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

/// Fetches damaged entries from this node's peers and writes them back. Cheap to
/// share (`Arc`).
pub struct EntryRepair {
    self_id: NodeId,
    /// Every other member: id → peer address.
    peers: BTreeMap<NodeId, String>,
    store: Arc<MessageStore>,
    filter: NetworkFilter,
    channels: Mutex<BTreeMap<NodeId, Channel>>,
    /// One repair at a time (the log store and the scrub may meet the same entry).
    running: tokio::sync::Mutex<()>,
}

impl EntryRepair {
    /// For node `self_id` of a group of `members` (id → peer address, this node
    /// included), whose store is `store`.
    pub fn new(
        self_id: NodeId,
        members: &BTreeMap<NodeId, String>,
        store: Arc<MessageStore>,
        filter: NetworkFilter,
    ) -> Self {
        let peers = members
            .iter()
            .filter(|(&id, _)| id != self_id)
            .map(|(&id, a)| (id, a.clone()))
            .collect();
        Self {
            self_id,
            peers,
            store,
            filter,
            channels: Mutex::new(BTreeMap::new()),
            running: tokio::sync::Mutex::new(()),
        }
    }

    /// Repairs entry `log_index` from a peer's copy (the term is what this node's
    /// Raft index says) and returns it, trying every peer for up to [`ROUNDS`]
    /// rounds. `None` when this node cannot say which term the entry is of, or no
    /// peer gave an intact copy that fits (each failure is logged).
    pub async fn repair(&self, log_index: u64) -> Option<Entry> {
        let _one = self.running.lock().await;
        let loc = match self.store.commit_log().entry_location(log_index) {
            Ok(loc) => loc,
            Err(e) => {
                tracing::error!(log_index, error = %e, "a damaged entry cannot be repaired: its place in the log is unknown");
                return None;
            }
        };
        // Repaired meanwhile (by the other caller)?
        if let Ok(Some(entry)) = read_intact(
            &self.store,
            EntryWanted {
                log_index,
                term: loc.term,
            },
        ) {
            return Some(entry);
        }
        let wanted = EntryWanted {
            log_index,
            term: loc.term,
        };
        for round in 0..ROUNDS {
            if round > 0 {
                tokio::time::sleep(ROUND_GAP).await;
            }
            for &peer in self.peers.keys() {
                let Some(entry) = self.ask(peer, wanted).await else {
                    continue;
                };
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
                    Err(e) => {
                        tracing::error!(log_index, from = peer, error = %e, "writing a peer's copy of a damaged entry failed");
                    }
                }
            }
        }
        tracing::error!(
            log_index,
            term = loc.term,
            "no peer gave an intact copy of a damaged entry; it stays damaged here"
        );
        None
    }

    /// Asks `peer` for `wanted`; `None` on any failure or if it holds no intact
    /// entry with that log id.
    async fn ask(&self, peer: NodeId, wanted: EntryWanted) -> Option<Entry> {
        if self.filter.is_blocked(self.self_id, peer) || self.filter.is_blocked(peer, self.self_id)
        {
            return None;
        }
        let channel = self.channel(peer)?;
        let req = peer_request(self.self_id, &wanted, CALL_TIMEOUT).ok()?;
        let mut client = RaftPeerClient::new(channel);
        let call = client.read_entry(req);
        let reply = match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(status)) => {
                tracing::debug!(peer, %status, "ReadEntry failed");
                return None;
            }
            Err(_) => return None,
        };
        match decode::<Result<Option<Entry>, String>>(reply.get_ref()) {
            Ok(Ok(Some(e))) if e.log_id == log_id(wanted.term, wanted.log_index) => Some(e),
            Ok(Ok(_)) => None,
            Ok(Err(e)) => {
                tracing::debug!(peer, error = %e, "ReadEntry answered an error");
                None
            }
            Err(status) => {
                tracing::debug!(peer, %status, "ReadEntry's answer does not decode");
                None
            }
        }
    }

    fn channel(&self, peer: NodeId) -> Option<Channel> {
        let mut cache = self.channels.lock().unwrap();
        if let Some(c) = cache.get(&peer) {
            return Some(c.clone());
        }
        let c = lazy_channel(self.peers.get(&peer)?, Duration::from_millis(500)).ok()?;
        cache.insert(peer, c.clone());
        Some(c)
    }

    /// Writes `entry` over this node's damaged copy (off the runtime's threads: it
    /// fsyncs).
    async fn write_back(&self, wanted: EntryWanted, entry: Entry) -> Result<(), String> {
        let records = entry_to_records(entry).map_err(|e| e.to_string())?;
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            store
                .rewrite_entry(wanted.term, wanted.log_index, &records)
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())?
    }
}

/// Reads every entry this node's log holds at start once, each record's CRC
/// checked, at most [`SCRUB_CHUNK_BYTES`] per [`SCRUB_PAUSE`], and repairs each
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
        let Some(r) = repair.upgrade().filter(|r| !r.store.is_closed()) else {
            return;
        };
        let (store, from) = (r.store.clone(), next);
        let read = tokio::task::spawn_blocking(move || damaged_in_chunk(&store, from, end)).await;
        let Ok((upto, damaged)) = read else { return };
        checked += upto - next;
        next = upto;
        for log_index in damaged {
            if r.repair(log_index).await.is_some() {
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
