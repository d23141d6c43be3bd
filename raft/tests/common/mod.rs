//! An in-process test cluster: three real nodes (store files, openraft, tonic peer
//! servers on loopback) sharing one fault-injection filter.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ledgermq_raft::{BatchConfig, NetworkFilter, NodeId, RaftNode, RaftNodeConfig, RaftTiming};
use ledgermq_store::{FlushMode, MessageRecord, StoreConfig};
use ledgermq_testkit::free_port;

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub cfgs: BTreeMap<NodeId, RaftNodeConfig>,
    pub nodes: BTreeMap<NodeId, Option<Arc<RaftNode>>>,
    pub filter: NetworkFilter,
}

/// A command committing `group`'s consumer offset of (`topic`, queue 0).
pub fn commit_offset(group: &str, topic: &str, offset: u64) -> ledgermq_raft::Command {
    ledgermq_raft::Command::CommitOffsets(vec![ledgermq_raft::OffsetCommit {
        group: group.into(),
        topic: topic.into(),
        queue_id: 0,
        offset,
    }])
}

pub fn message(topic: &str, queue_id: i32, body: &str) -> MessageRecord {
    MessageRecord::message(topic, queue_id, body.as_bytes().to_vec(), 0).with_property("KEYS", body)
}

/// True once `idx` is below the log's first index, waiting up to a second.
fn purged_soon(store: &ledgermq_store::MessageStore, idx: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        if store.commit_log().first_log_index() > idx {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

impl Cluster {
    pub async fn start(n: u64, flush: FlushMode) -> Self {
        Self::start_with(n, flush, |_| {}).await
    }

    pub async fn start_with(n: u64, flush: FlushMode, tweak: impl Fn(&mut RaftNodeConfig)) -> Self {
        let mut c = Self::configure(n, flush, tweak);
        for id in 0..n {
            c.restart(id).await;
        }
        c
    }

    /// Like [`Cluster::start_with`], but every node starts at once
    /// ([`Cluster::start_together`]).
    pub async fn start_together_with(
        n: u64,
        flush: FlushMode,
        tweak: impl Fn(&mut RaftNodeConfig),
    ) -> Self {
        let mut c = Self::configure(n, flush, tweak);
        let ids: Vec<NodeId> = (0..n).collect();
        c.start_together(&ids).await;
        c
    }

    /// The configuration of `n` nodes on free loopback ports, none started.
    fn configure(n: u64, flush: FlushMode, tweak: impl Fn(&mut RaftNodeConfig)) -> Self {
        let members: BTreeMap<NodeId, String> = (0..n)
            .map(|i| (i, format!("127.0.0.1:{}", free_port())))
            .collect();
        Self::configure_in(tempfile::tempdir().unwrap(), members, flush, tweak)
    }

    /// The configuration of `members` (id → peer address), each storing under
    /// `dir/n<id>`, none started.
    pub fn configure_in(
        dir: tempfile::TempDir,
        members: BTreeMap<NodeId, String>,
        flush: FlushMode,
        tweak: impl Fn(&mut RaftNodeConfig),
    ) -> Self {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
        let mut cfgs = BTreeMap::new();
        for (&id, addr) in &members {
            let mut store = StoreConfig::small(dir.path().join(format!("n{id}")), 64 * 1024);
            store.flush_mode = flush;
            store.flush_interval_ms = 100;
            cfgs.insert(
                id,
                RaftNodeConfig {
                    node_id: id,
                    listen_addr: addr.parse().unwrap(),
                    members: members.clone(),
                    store,
                    timing: RaftTiming {
                        heartbeat_interval_ms: 100,
                        election_timeout_min_ms: 500,
                        election_timeout_max_ms: 900,
                    },
                    batch: BatchConfig::default(),
                    store_host: addr.parse().unwrap(),
                    write_timeout_ms: 3000,
                    cluster_name: "test-group".into(),
                    retention_interval_ms: 0,
                    join: false,
                    peer_tls: None,
                },
            );
            tweak(cfgs.get_mut(&id).unwrap());
        }
        Self {
            dir,
            cfgs,
            nodes: BTreeMap::new(),
            filter: NetworkFilter::default(),
        }
    }

    /// Starts (or restarts) every node in `ids` at once, so that their openraft
    /// timers (the election tick) begin within a few milliseconds of each other.
    pub async fn start_together(&mut self, ids: &[NodeId]) {
        let starts = ids
            .iter()
            .map(|id| RaftNode::start(self.cfgs[id].clone(), self.filter.clone()));
        let nodes = futures::future::join_all(starts).await;
        for (&id, node) in ids.iter().zip(nodes) {
            self.nodes.insert(id, Some(node.unwrap()));
        }
    }

    pub async fn restart(&mut self, id: NodeId) {
        let node = RaftNode::start(self.cfgs[&id].clone(), self.filter.clone())
            .await
            .unwrap();
        self.nodes.insert(id, Some(node));
    }

    /// Stops a node as a crash would (no clean shutdown of the store).
    pub async fn crash(&mut self, id: NodeId) {
        if let Some(n) = self.nodes.insert(id, None).flatten() {
            n.stop(false).await.unwrap();
        }
    }

    pub fn node(&self, id: NodeId) -> &Arc<RaftNode> {
        self.nodes[&id].as_ref().expect("node is running")
    }

    pub fn live(&self) -> impl Iterator<Item = &Arc<RaftNode>> {
        self.nodes.values().flatten()
    }

    /// Waits until the live nodes that can talk to a leader agree on it.
    pub async fn wait_leader(&self, timeout: Duration) -> NodeId {
        let deadline = Instant::now() + timeout;
        loop {
            let leaders: Vec<_> = self
                .live()
                .filter(|n| n.is_leader())
                .map(|n| n.id())
                .collect();
            if let [l] = leaders[..] {
                let agree = self
                    .live()
                    .filter(|n| {
                        !self.filter.is_blocked(n.id(), l) && !self.filter.is_blocked(l, n.id())
                    })
                    .all(|n| n.leader().map(|x| x.0) == Some(l));
                if agree {
                    return l;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no single leader within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until `leader` has heard every member say, in its current term, that
    /// it decodes log command set `set` (AppendEntries answers, heartbeats
    /// included).
    pub async fn wait_members_decode(&self, leader: NodeId, set: u8, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.node(leader).members_decode(set) {
            assert!(
                Instant::now() < deadline,
                "leader {leader} never learned that its followers decode log command set {set}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until every live member has purged the start of its log.
    pub async fn wait_purged(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self
            .live()
            .any(|n| n.store().commit_log().first_log_index() == 0)
        {
            assert!(Instant::now() < deadline, "the members did not purge");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until every live node has applied everything the leader has.
    pub async fn wait_converged(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let ms: Vec<_> = self
                .live()
                .map(|n| n.raft().metrics().borrow().clone())
                .collect();
            let last = ms.iter().filter_map(|m| m.last_log_index).max();
            if ms
                .iter()
                .all(|m| m.last_applied.map(|l| l.index) == last && m.last_log_index == last)
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "nodes did not converge: {:?}",
                ms.iter()
                    .map(|m| (m.id, m.last_log_index, m.last_applied))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Replica audit: the committed (applied) prefixes of all live nodes are identical
    /// record by record (log index, term, CRC), and no ConsumeQueue holds an entry
    /// past a node's applied index.
    pub fn audit(&self) {
        let mut prefixes = Vec::new();
        for n in self.live() {
            let applied = n
                .raft()
                .metrics()
                .borrow()
                .last_applied
                .map_or(0, |l| l.index + 1);
            let store = n.store();
            assert!(
                store.dispatched_next_log_index() <= applied,
                "node {} dispatched past its applied index",
                n.id()
            );
            let mut entries = BTreeMap::new();
            for idx in store.commit_log().first_log_index()..applied {
                let e = match store.read_entry(idx) {
                    Ok(e) => e,
                    // Retention running meanwhile purged it (its segment goes
                    // first, then the log's first index moves).
                    Err(ledgermq_store::StoreError::OutOfRange { .. })
                        if purged_soon(store, idx) =>
                    {
                        continue
                    }
                    Err(e) => panic!("node {}: log index {idx}: {e}", n.id()),
                };
                let crcs: Vec<u32> = e.records().map(|r| r.unwrap().crc()).collect();
                entries.insert(idx, (e.location.term, crcs));
            }
            prefixes.push((n.id(), entries));
        }
        for (a, pa) in &prefixes {
            for (b, pb) in &prefixes {
                for (idx, ea) in pa {
                    if let Some(eb) = pb.get(idx) {
                        assert_eq!(ea, eb, "nodes {a} and {b} differ at log index {idx}");
                    }
                }
            }
        }
        // Every queue offset holds the same message (by CRC) on every node holding it.
        let mut placements: BTreeMap<(String, i32, u64), (NodeId, u32)> = BTreeMap::new();
        for n in self.live() {
            let store = n.store();
            for ((topic, q), _) in store.consume_queues().all() {
                let (lo, hi) = store.queue_offsets(&topic, q);
                for off in lo..hi {
                    let crc = store.get_message(&topic, q, off).unwrap().view().crc();
                    if let Some((other, c)) =
                        placements.insert((topic.clone(), q, off), (n.id(), crc))
                    {
                        assert_eq!(
                            c,
                            crc,
                            "nodes {other} and {} hold different messages at {topic}/{q}@{off}",
                            n.id()
                        );
                    }
                }
            }
        }
    }

    /// The bodies of every message in a queue of one node, in queue order.
    pub fn queue_bodies(&self, id: NodeId, topic: &str, queue_id: i32) -> Vec<String> {
        let store = self.node(id).store();
        let (lo, hi) = store.queue_offsets(topic, queue_id);
        let (msgs, _) = store
            .get_messages(topic, queue_id, lo, (hi - lo) as usize, |_| true)
            .unwrap();
        msgs.iter()
            .map(|m| String::from_utf8(m.view().body().to_vec()).unwrap())
            .collect()
    }
}
