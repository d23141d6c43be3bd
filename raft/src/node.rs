//! [`RaftNode`]: one member of a broker group — the store, openraft, the peer server,
//! leader-side batching, forwarding of writes from followers, leadership transfer.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ledgermq_store::{MessageRecord, MessageStore, StoreConfig};
use openraft::{BasicNode, ServerState, SnapshotPolicy};
use tokio::task::JoinHandle;

use crate::elections::{ElectionGate, Hold};
use crate::error::{ForwardRefusal, RaftNodeError};
use crate::log_store::LogStore;
use crate::meta::MetaDb;
use crate::network::pb::raft_peer_client::RaftPeerClient;
use crate::network::pb::raft_peer_server::RaftPeerServer;
use crate::network::{
    decode, lazy_channel, peer_request, set_forward_budget, NetworkFilter, PeerNetworkFactory,
};
use crate::server::PeerService;
use crate::state_machine::{MetaView, StateMachine};
use crate::types::{Command, NodeId, Placed, Raft, Request, Response};
use crate::writer::{BatchConfig, Writer};

mod disk;
mod membership;
pub use membership::{
    leader_budget, plan_add, plan_remove, unfinished, AddStep, ChangeDone, ForwardedChange,
    MembershipChange, MembershipOutcome, MembershipRefusal, RemoveStep, MAX_CHANGE_TIME,
};
mod storage;
pub use storage::SET_ASIDE_MESSAGES_LOG;
mod status;
pub use status::{NodeRole, NodeStatus};
mod transfer;
mod upkeep;
mod write;
use upkeep::{probe_peers, rejoin_elections_when_caught_up, retention_loop};

/// Raft timing: a heartbeat every 100 ms, election timeouts of 300–500 ms.
///
/// openraft 0.9 makes a follower that knew a leader wait the leader's lease (the
/// maximum election timeout) plus its own election timeout before it campaigns
/// (0.8–1.0 s after the last heartbeat with these defaults, at least seven
/// heartbeats lost), and a candidate refused by a voter with a longer log waits
/// two maximum timeouts more, while that voter campaigns on its own timer. With
/// 400–700 ms, a new leader took 2.4–3.3 s after a kill or an isolation in jepsen
/// runs (seed 7), and acknowledged throughput from 2 s into a killed leader was
/// 68–73 % of the fault-free rate; with these, 94 %.
#[derive(Debug, Clone)]
pub struct RaftTiming {
    /// Leader heartbeat period in ms.
    pub heartbeat_interval_ms: u64,
    /// Lower bound of the randomized election timeout in ms.
    pub election_timeout_min_ms: u64,
    /// Upper bound of the randomized election timeout in ms.
    pub election_timeout_max_ms: u64,
}

impl Default for RaftTiming {
    fn default() -> Self {
        Self {
            heartbeat_interval_ms: 100,
            election_timeout_min_ms: 300,
            election_timeout_max_ms: 500,
        }
    }
}

/// Everything a node needs.
#[derive(Debug, Clone)]
pub struct RaftNodeConfig {
    /// This node's id within the group.
    pub node_id: NodeId,
    /// Address the peer gRPC server listens on.
    pub listen_addr: SocketAddr,
    /// Every member of the group (this node included): id → peer address `host:port`.
    pub members: BTreeMap<NodeId, String>,
    /// The store; its metadata database lives in `<root>/meta`.
    pub store: StoreConfig,
    /// Raft timing.
    pub timing: RaftTiming,
    /// Leader-side batching.
    pub batch: BatchConfig,
    /// Address written as the store host of messages this node accepts as leader.
    pub store_host: SocketAddr,
    /// How long a write may wait for its commit before it answers Timeout, in ms.
    pub write_timeout_ms: u64,
    /// Name of the openraft cluster (the broker group's name).
    pub cluster_name: String,
    /// How often retention runs, in ms (RocketMQ: every 10 s); 0 turns it off.
    pub retention_interval_ms: u64,
    /// A node joining a running group (`mqadmin addNode`): it never initializes
    /// a membership of its own, and waits for the leader to add it as a learner.
    /// Without it a node with an empty store initializes the group with
    /// `members`.
    pub join: bool,
    /// Mutual TLS on the peer port and to the peers (every member's, all or
    /// none); plain TCP when None.
    pub peer_tls: Option<crate::network::PeerTls>,
}

/// One running member of a broker group.
pub struct RaftNode {
    id: NodeId,
    raft: Raft,
    store: Arc<MessageStore>,
    meta: MetaDb,
    /// The group metadata, read-only here (the state machine writes it).
    shared: MetaView,
    writer: Arc<Writer>,
    filter: NetworkFilter,
    server: std::sync::Mutex<Option<(JoinHandle<()>, tokio::sync::watch::Sender<bool>)>>,
    write_timeout: Duration,
    /// One multiplexed channel per peer address, shared by forwarded writes.
    channels: std::sync::Mutex<BTreeMap<String, tonic::transport::Channel>>,
    /// The state machine's next snapshot source (see `StateMachine::snapshot_target`).
    snapshot_target: Arc<std::sync::atomic::AtomicU64>,
    /// One purge at a time (each sets `snapshot_target`).
    purging: tokio::sync::Mutex<()>,
    /// Which peers were heard from lately.
    contacts: crate::contact::Contacts,
    /// Set when the node stops: a Raft append waiting for disk space gives up
    /// (`LogStore::stop_flag`).
    stopping: Arc<std::sync::atomic::AtomicBool>,
    /// The holds on openraft's election timer.
    elections: Arc<ElectionGate>,
    /// The log command set each peer decodes.
    formats: crate::peer_formats::PeerFormats,
    /// Role, term, leader and readiness, changed only when one of them changes.
    status: tokio::sync::watch::Receiver<NodeStatus>,
    /// AppendEntries answered, by transport.
    appends: Arc<crate::server::AppendCounts>,
    /// Mutual TLS to the peers, if the group has it.
    peer_tls: Option<crate::network::PeerTls>,
}

impl RaftNode {
    fn channel(&self, addr: &str) -> Result<tonic::transport::Channel, String> {
        let mut cache = self.channels.lock().unwrap();
        if let Some(c) = cache.get(addr) {
            return Ok(c.clone());
        }
        let c = lazy_channel(addr, Duration::from_millis(500), self.peer_tls.as_ref())?;
        cache.insert(addr.to_owned(), c.clone());
        Ok(c)
    }

    /// Opens the store and metadata (recovering after a crash), starts openraft and
    /// the peer server, and initializes the group's membership if this node has
    /// never been part of one (every member may do so with the same member list).
    pub async fn start(
        cfg: RaftNodeConfig,
        filter: NetworkFilter,
    ) -> Result<Arc<Self>, RaftNodeError> {
        if !cfg.members.contains_key(&cfg.node_id) {
            return Err(RaftNodeError::InvalidInput(format!(
                "node {} is not among the members",
                cfg.node_id
            )));
        }
        let storage::Storage {
            store,
            meta,
            vote_file,
            set_aside,
        } = storage::open(&cfg.store)?;
        // Before openraft reads the log (it does at start): a damaged entry is
        // fetched from a peer then too.
        let repair = Arc::new(crate::repair::EntryRepair::new(
            cfg.node_id,
            &cfg.members,
            store.clone(),
            filter.clone(),
            cfg.peer_tls.clone(),
        ));
        // One flag stops both an append waiting for disk space and a repair.
        let log_store = LogStore::new(
            store.clone(),
            meta.clone(),
            vote_file,
            cfg.node_id,
            cfg.batch.max_replication_bytes,
            repair.clone(),
        );
        let stopping = log_store.stop_flag();
        let sm = StateMachine::open(store.clone(), meta.clone())?;
        let shared = sm.shared();
        let snapshot_target = sm.snapshot_target();
        let purge_point_moved = sm.purge_point_moved();
        let config = openraft::Config {
            cluster_name: cfg.cluster_name.clone(),
            heartbeat_interval: cfg.timing.heartbeat_interval_ms,
            election_timeout_min: cfg.timing.election_timeout_min_ms,
            election_timeout_max: cfg.timing.election_timeout_max_ms,
            // Snapshots are taken at segment boundaries as entries are applied
            // (`crate::boundary`); openraft takes one only when retention asks for
            // the one at its purge point, so that is the snapshot a lagging follower
            // gets.
            snapshot_policy: SnapshotPolicy::Never,
            // A snapshot is built only at the index retention purges through (a
            // segment boundary, `crate::boundary`), so openraft purges the log
            // through it in the same step: the snapshot it sends a lagging follower
            // never sits above where the log begins.
            max_in_snapshot_log_to_keep: 0,
            // openraft 0.9 gives an AppendEntries the heartbeat interval as its
            // deadline: at most 8 entries, and at most `max_replication_bytes` of
            // them (`LogStore::limited_get_log_entries`), keep a catching-up
            // follower's calls well within it.
            max_payload_entries: 8,
            ..Default::default()
        }
        .validate()
        .map_err(|e| RaftNodeError::InvalidInput(e.to_string()))?;
        let contacts = crate::contact::Contacts::new(
            cfg.node_id,
            cfg.members.keys().copied().collect(),
            Duration::from_millis(cfg.timing.election_timeout_max_ms),
        );
        let longer_log = crate::elections::LongerLogSeen::default();
        let formats = crate::peer_formats::PeerFormats::default();
        let network = PeerNetworkFactory {
            from: cfg.node_id,
            filter: filter.clone(),
            contacts: contacts.clone(),
            backoff: Duration::from_millis(cfg.timing.heartbeat_interval_ms),
            longer_log: longer_log.clone(),
            formats: formats.clone(),
            tls: cfg.peer_tls.clone(),
        };
        // The peer server runs before openraft starts: openraft reads the log at
        // start, and a damaged entry is fetched from a peer then, which must be
        // able to ask this node in turn (a group restarting together). Until
        // `core` is set it answers only `ReadEntry`.
        let core = Arc::new(std::sync::OnceLock::new());
        let node_cell = Arc::new(std::sync::OnceLock::new());
        let appends = Arc::new(crate::server::AppendCounts::default());
        let service = PeerService {
            node_id: cfg.node_id,
            core: core.clone(),
            filter: filter.clone(),
            store: store.clone(),
            contacts: contacts.clone(),
            appends: appends.clone(),
            node: node_cell.clone(),
        };
        let listener = tokio::net::TcpListener::bind(cfg.listen_addr)
            .await
            .map_err(|e| RaftNodeError::Transport(format!("binding {}: {e}", cfg.listen_addr)))?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let acceptor = cfg.peer_tls.as_ref().map(|t| t.acceptor.clone());
        let server = tokio::spawn(async move {
            // One port: AppendEntries on the framed transport, the rest on gRPC
            // (`crate::framed`). Dropping the accept loop closes its connections.
            let (grpc_tx, grpc_rx) = tokio::sync::mpsc::channel(64);
            let accept = crate::framed::accept_loop(
                listener,
                service.clone(),
                grpc_tx,
                stop_rx.clone(),
                acceptor,
            );
            let grpc = tonic::transport::Server::builder()
                .initial_stream_window_size(Some(crate::network::HTTP2_STREAM_WINDOW_BYTES))
                .initial_connection_window_size(Some(crate::network::HTTP2_CONNECTION_WINDOW_BYTES))
                .add_service(RaftPeerServer::new(service).max_decoding_message_size(256 << 20))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::ReceiverStream::new(grpc_rx),
                    crate::framed::stopped(stop_rx),
                );
            // Both end on the stop signal: the accept loop at once (closing the
            // listener and the framed connections), gRPC once drained.
            let (res, ()) = tokio::join!(grpc, accept);
            if let Err(e) = res {
                tracing::error!(error = %e, "raft peer server stopped");
            }
        });
        let raft = match Raft::new(cfg.node_id, Arc::new(config), network, log_store, sm).await {
            Ok(raft) => raft,
            Err(e) => {
                stop_server(server, &stop_tx).await;
                return Err(RaftNodeError::Raft(e.to_string()));
            }
        };
        let writer = Writer::start(
            raft.clone(),
            store.clone(),
            cfg.batch.clone(),
            cfg.store_host,
            (cfg.node_id, formats.clone()),
        );
        let elections = ElectionGate::new(raft.clone());
        // The lost-entries-vote canary (debug builds, tests only) campaigns anyway.
        if store.commit_log().lost_acknowledged()
            && !crate::canary::enabled(crate::canary::Canary::LostEntriesVote)
        {
            // Protocol-aware recovery: this node's log lost entries it had
            // acknowledged, which a majority may have counted on. Its log cannot
            // speak for them, so it neither campaigns nor votes (`PeerService::vote`)
            // until it has them back from a leader.
            tracing::warn!(
                node = cfg.node_id,
                "lost acknowledged entries: staying out of elections until caught up"
            );
            elections.hold(Hold::LostEntries);
            tokio::spawn(rejoin_elections_when_caught_up(
                elections.clone(),
                store.clone(),
            ));
        }
        // Served only now: a vote that arrives sees the lost-entries hold.
        let _ = core.set(crate::server::Core {
            raft: raft.clone(),
            writer: writer.clone(),
            elections: elections.clone(),
        });
        for into in set_aside {
            tokio::spawn(storage::remove_set_aside_when_caught_up(
                store.clone(),
                into,
            ));
        }
        tokio::spawn(crate::elections::retry_campaigns(
            raft.clone(),
            elections.clone(),
            longer_log,
            cfg.timing.election_timeout_min_ms,
            cfg.timing.election_timeout_max_ms,
        ));
        let (status, _) = status::spawn_status_watch(raft.metrics());
        let node = Arc::new(Self {
            id: cfg.node_id,
            raft,
            store,
            meta,
            shared: MetaView::new(shared),
            writer,
            filter,
            server: std::sync::Mutex::new(Some((server, stop_tx))),
            write_timeout: Duration::from_millis(cfg.write_timeout_ms),
            channels: std::sync::Mutex::new(BTreeMap::new()),
            snapshot_target,
            purging: tokio::sync::Mutex::new(()),
            contacts,
            stopping,
            elections,
            formats,
            appends,
            peer_tls: cfg.peer_tls.clone(),
            status,
        });
        // A crash between a snapshot build and its purge: finish the purge, so the
        // snapshot sits where the log begins.
        let m = node.raft.metrics().borrow().clone();
        if let Some(snap) = m
            .snapshot
            .filter(|s| m.purged.is_none_or(|p| p.index < s.index))
        {
            if let Err(e) = node.raft.trigger().purge_log(snap.index).await {
                tracing::warn!(error = %e, "finishing an interrupted purge failed");
            }
        }
        let _ = node_cell.set(Arc::downgrade(&node));
        tokio::spawn(membership::follow_membership(
            Arc::downgrade(&node),
            repair.clone(),
        ));
        tokio::spawn(crate::repair::scrub(Arc::downgrade(&repair)));
        tokio::spawn(probe_peers(
            Arc::downgrade(&node),
            cfg.members.clone(),
            Duration::from_millis(cfg.timing.heartbeat_interval_ms),
        ));
        tokio::spawn(disk::watch_disk(
            Arc::downgrade(&node),
            Duration::from_millis(100),
        ));
        if cfg.retention_interval_ms > 0 {
            tokio::spawn(retention_loop(
                Arc::downgrade(&node),
                Duration::from_millis(cfg.retention_interval_ms),
                purge_point_moved,
            ));
        }
        if !cfg.join
            && !node
                .raft
                .is_initialized()
                .await
                .map_err(|e| RaftNodeError::Raft(e.to_string()))?
        {
            let members: BTreeMap<NodeId, BasicNode> = cfg
                .members
                .iter()
                .map(|(&id, addr)| (id, BasicNode::new(addr.clone())))
                .collect();
            if let Err(e) = node.raft.initialize(members).await {
                tracing::debug!(error = %e, "membership already initialized elsewhere");
            }
        }
        Ok(node)
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The commit index this node last saved (openraft's `save_committed`, which
    /// may lag the leader's; `None` before the first commit). Errors: `Storage`.
    pub fn saved_commit_index(&self) -> Result<Option<u64>, RaftNodeError> {
        Ok(crate::log_store::saved_committed(&self.meta)?.map(|l| l.index))
    }

    /// This node's role, term, leader and readiness to serve as leader
    /// ([`NodeStatus::ready_term`]); the watch is notified only when one of them
    /// changes, not on every applied entry.
    pub fn status(&self) -> tokio::sync::watch::Receiver<NodeStatus> {
        self.status.clone()
    }

    /// The status as of openraft's latest metrics, read now (the watch of
    /// [`Self::status`] follows them one task hop later): for decisions such as
    /// whether to serve a call as leader.
    pub fn status_now(&self) -> NodeStatus {
        NodeStatus::from_metrics(&self.raft.metrics().borrow())
    }

    /// The openraft handle (metrics, triggers).
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// The store.
    pub fn store(&self) -> &Arc<MessageStore> {
        &self.store
    }

    /// The group metadata as of the last applied entry.
    pub fn shared_meta(&self) -> &MetaView {
        &self.shared
    }

    /// The fault-injection filter of this node's transport.
    pub fn filter(&self) -> &NetworkFilter {
        &self.filter
    }

    /// The leader this node knows of, with its peer address.
    pub fn leader(&self) -> Option<(NodeId, String)> {
        let m = self.raft.metrics().borrow().clone();
        let leader = m.current_leader?;
        let addr = m
            .membership_config
            .membership()
            .get_node(&leader)?
            .addr
            .clone();
        Some((leader, addr))
    }

    /// True if this node heard from a majority of its group (itself included)
    /// within the maximum election timeout; a node that did not is cut off and
    /// refuses writes at once (`CutOff`).
    pub fn in_contact_with_quorum(&self) -> bool {
        self.contacts.in_contact_with_quorum()
    }

    /// Where this node stands, for deciding which member readers should use
    /// ([`ReplicaView`]): followers within `max_lag` entries count as caught
    /// up; a follower follows while it hears from a leader within
    /// `leader_grace` (longer than an election, so it keeps its readers
    /// through one) and from a majority within the contact window.
    pub fn replica_view(&self, max_lag: u64, leader_grace: Duration) -> ReplicaView {
        let in_contact = self.contacts.peers_in_contact();
        let follows_leader = self.contacts.in_contact_with_quorum()
            && self.contacts.leader_heard_within(leader_grace);
        let m = self.raft.metrics();
        let m = m.borrow();
        let leads = m.state == ServerState::Leader && m.current_leader == Some(self.id);
        let caught_up = match (leads, &m.replication, m.last_log_index) {
            (true, Some(replication), Some(last)) => in_contact
                .into_iter()
                .filter(|id| {
                    replication
                        .get(id)
                        .and_then(|matched| matched.as_ref())
                        .is_some_and(|l| l.index.saturating_add(max_lag) >= last)
                })
                .collect(),
            _ => Vec::new(),
        };
        ReplicaView {
            leads,
            caught_up,
            follows: !leads && follows_leader,
        }
    }

    fn check_in_contact(&self) -> Result<(), RaftNodeError> {
        let window_ms = self.contacts.window_ms();
        if !self.contacts.in_contact_with_quorum() {
            return Err(RaftNodeError::CutOff { window_ms });
        }
        // A follower forwards only to a leader it hears from, and that answers it
        // (a leader that does not hear it, packets lost one way, would leave the
        // write waiting for its deadline).
        if !self.is_leader() {
            let unanswered = self
                .leader()
                .is_some_and(|(l, _)| self.contacts.unanswered(l));
            if unanswered || !self.contacts.leader_heard_lately() {
                return Err(RaftNodeError::LeaderUnreachable { window_ms });
            }
        }
        Ok(())
    }

    /// True if every member of the group (learners included) has said, in this
    /// node's current term, that it decodes log command set `set`
    /// ([`crate::format::LOG_COMMANDS`]), so a command of that set may be
    /// written; false for a set this release does not know.
    pub fn members_decode(&self, set: u8) -> bool {
        self.formats.members_decode_now(&self.raft, self.id, set)
    }

    /// True unless a member of the group (learners included) last said that it
    /// decodes only a log command set below `set` (`PeerFormats`' weaker rule:
    /// a member that is down, or not heard from yet in this term, does not
    /// count); false for a set this release does not know.
    pub fn no_member_says_below(&self, set: u8) -> bool {
        self.formats
            .no_member_says_below_now(&self.raft, self.id, set)
    }

    /// AppendEntries this node has answered since it started, as (over the
    /// framed peer transport, over gRPC): a metric, and how tests see which
    /// transport replication used.
    pub fn append_entries_answered(&self) -> (u64, u64) {
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        (load(&self.appends.framed), load(&self.appends.grpc))
    }

    /// True if this node currently leads.
    pub fn is_leader(&self) -> bool {
        let m = self.raft.metrics().borrow().clone();
        m.state == ServerState::Leader && m.current_leader == Some(self.id)
    }

    /// Stops Raft and the server; with `clean`, flushes and shuts the store down so the
    /// next start needs no recovery scan. Without it the files are left as a crash
    /// would leave them (the page cache still holds what was written).
    pub async fn stop(&self, clean: bool) -> Result<(), RaftNodeError> {
        // An append waiting for disk space would hold the shutdown up.
        self.stopping
            .store(true, std::sync::atomic::Ordering::Release);
        let _ = self.raft.shutdown().await;
        // Close the listener and every open connection (peers then reconnect to
        // whatever serves this address next).
        let server = self.server.lock().unwrap().take();
        if let Some((task, stop)) = server {
            stop_server(task, &stop).await;
        }
        if clean {
            self.meta.flush()?;
            self.store.shutdown()?;
        }
        Ok(())
    }
}

/// Stops the peer server `task` through `stop`: the listener and the framed
/// connections close at once, gRPC connections get up to 2 s to drain before
/// the task is aborted. Returns once the task has ended, so the port is free.
async fn stop_server(mut task: JoinHandle<()>, stop: &tokio::sync::watch::Sender<bool>) {
    let _ = stop.send(true);
    if tokio::time::timeout(Duration::from_secs(2), &mut task)
        .await
        .is_err()
    {
        task.abort();
        let _ = task.await;
    }
}

/// A node's place in its group as [`RaftNode::replica_view`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaView {
    /// This node leads.
    pub leads: bool,
    /// If it leads: the followers heard from within the contact window whose
    /// log is within the given lag of its own, in id order.
    pub caught_up: Vec<NodeId>,
    /// If it does not lead: it hears from a majority, and from a leader within
    /// the given grace.
    pub follows: bool,
}
