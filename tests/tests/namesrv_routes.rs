//! Two real `mqnamesrv` processes and a three-node broker group on loopback: routes
//! follow leader changes, silent nodes expire, a restarted name server fills up again
//! within one heartbeat period, and a hung name server does not slow heartbeats to
//! the others.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ledgermq_broker::announce::{spawn_announcer, Identity};
use ledgermq_namesrv::pb::name_server_client::NameServerClient;
use ledgermq_namesrv::pb::{ListClusterRequest, QueryRouteRequest, QueryRouteResponse, Role};
use ledgermq_namesrv::registrar::Registrar;
use ledgermq_raft::{
    BatchConfig, Command as RaftCommand, NetworkFilter, RaftNode, RaftNodeConfig, RaftTiming,
    TopicConfig, TopicMessageType, TopicPerm,
};
use ledgermq_store::StoreConfig;
use ledgermq_testkit::{bin, free_port};
use tokio::task::JoinHandle;

const HEARTBEAT: Duration = Duration::from_millis(1000);
const T: Duration = Duration::from_secs(20);

struct NameSrv {
    addr: String,
    child: Child,
    cfg: std::path::PathBuf,
}

impl NameSrv {
    fn start(dir: &std::path::Path, port: u16) -> Self {
        let cfg = dir.join(format!("namesrv-{port}.toml"));
        std::fs::write(&cfg, "scan_interval_ms = 200\nnode_expiry_ms = 2500\n").unwrap();
        let addr = format!("127.0.0.1:{port}");
        let child = spawn(&cfg, &addr);
        wait_listening(&addr);
        Self { addr, child, cfg }
    }

    fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn(&self.cfg, &self.addr);
        wait_listening(&self.addr);
    }
}

impl Drop for NameSrv {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(cfg: &std::path::Path, addr: &str) -> Child {
    Command::new(bin("mqnamesrv").unwrap())
        .arg("-c")
        .arg(cfg)
        .args(["--listen", addr])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn wait_listening(addr: &str) {
    ledgermq_testkit::wait_listening(addr, T).unwrap();
}

async fn route(addr: &str, topic: &str) -> Option<QueryRouteResponse> {
    let mut c = NameServerClient::connect(format!("http://{addr}"))
        .await
        .ok()?;
    c.query_route(QueryRouteRequest {
        topic: topic.into(),
    })
    .await
    .ok()
    .map(|r| r.into_inner())
}

async fn cluster(addr: &str) -> Vec<(u64, u64)> {
    let Ok(mut c) = NameServerClient::connect(format!("http://{addr}")).await else {
        return vec![];
    };
    let Ok(r) = c.list_cluster(ListClusterRequest {}).await else {
        return vec![];
    };
    r.into_inner()
        .nodes
        .into_iter()
        .map(|n| (n.node.unwrap().node_id, n.silent_ms))
        .collect()
}

struct Node {
    raft: Arc<RaftNode>,
    announcer: JoinHandle<()>,
}

struct Group {
    nodes: BTreeMap<u64, Node>,
}

impl Group {
    async fn start(dir: &std::path::Path, namesrvs: Vec<String>) -> Self {
        let members: BTreeMap<u64, String> = (0..3)
            .map(|i| (i, format!("127.0.0.1:{}", free_port())))
            .collect();
        let mut nodes = BTreeMap::new();
        for (&id, addr) in &members {
            let cfg = RaftNodeConfig {
                node_id: id,
                listen_addr: addr.parse().unwrap(),
                members: members.clone(),
                store: StoreConfig::small(dir.join(format!("n{id}")), 1 << 20),
                timing: RaftTiming::default(),
                batch: BatchConfig::default(),
                store_host: addr.parse().unwrap(),
                write_timeout_ms: 3000,
                cluster_name: "g1".into(),
                retention_interval_ms: 0,
                join: false,
                peer_tls: None,
            };
            let raft = RaftNode::start(cfg, NetworkFilter::default())
                .await
                .unwrap();
            let registrar = Arc::new(Registrar::start(
                namesrvs.clone(),
                HEARTBEAT,
                Duration::from_millis(500),
                Default::default(),
            ));
            let id = Identity {
                cluster: "DefaultCluster".into(),
                broker_group: "broker-a".into(),
                client_addr: format!("127.0.0.1:{}", 18000 + id),
                remoting_addr: String::new(),
                member_addr: format!("127.0.0.1:{}", 18000 + id),
                auto_create_queue_count: None,
            };
            let announcer =
                spawn_announcer(raft.clone(), registrar, id, Duration::from_millis(200));
            nodes.insert(raft.id(), Node { raft, announcer });
        }
        Self { nodes }
    }

    async fn leader(&self) -> u64 {
        let deadline = Instant::now() + T;
        loop {
            if let Some(n) = self.nodes.values().find(|n| n.raft.is_leader()) {
                return n.raft.id();
            }
            assert!(Instant::now() < deadline, "no leader");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops a node as a crash would: no more heartbeats, no unregister.
    async fn crash(&mut self, id: u64) {
        let n = self.nodes.remove(&id).unwrap();
        n.announcer.abort();
        n.raft.stop(false).await.unwrap();
    }
}

/// Waits until `addr` routes TopicN with `leader` (client address port 18000+id).
async fn wait_route_leader(addr: &str, pred: impl Fn(u64) -> bool) -> u64 {
    let deadline = Instant::now() + T;
    loop {
        if let Some(r) = route(addr, "TopicN").await {
            if let Some(g) = r.groups.first().filter(|g| g.has_leader) {
                if pred(g.leader_node_id) {
                    assert_eq!(
                        g.leader_addr,
                        format!("127.0.0.1:{}", 18000 + g.leader_node_id)
                    );
                    return g.leader_node_id;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "{addr} never routed the expected leader"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn name_servers_follow_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let mut ns1 = NameSrv::start(dir.path(), free_port());
    let ns2 = NameSrv::start(dir.path(), free_port());
    // A name server that accepts connections and never answers.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hung_addr = hung.local_addr().unwrap().to_string();
    let mut group = Group::start(
        dir.path(),
        vec![hung_addr, ns1.addr.clone(), ns2.addr.clone()],
    )
    .await;
    let leader = group.leader().await;
    group.nodes[&leader]
        .raft
        .write_command(RaftCommand::UpdateTopic(TopicConfig {
            name: "TopicN".into(),
            queue_count: 8,
            perm: TopicPerm::READ_WRITE,
            message_type: TopicMessageType::Normal,
        }))
        .await
        .unwrap();
    for ns in [&ns1, &ns2] {
        assert_eq!(wait_route_leader(&ns.addr, |l| l == leader).await, leader);
        let r = route(&ns.addr, "TopicN").await.unwrap();
        assert_eq!(r.groups[0].queue_count, 8);
        assert_eq!(r.groups[0].members.len(), 3);
    }
    // The hung name server does not delay heartbeats to the others: every node was
    // heard from within about one period.
    tokio::time::sleep(HEARTBEAT * 2).await;
    for (id, silent_ms) in cluster(&ns1.addr).await {
        assert!(
            silent_ms < 1500,
            "node {id} silent for {silent_ms} ms at ns1"
        );
    }

    // A leader change reaches every name server within about a second of the election.
    group.crash(leader).await;
    let killed = Instant::now();
    let new_leader = group.leader().await;
    let elected = killed.elapsed();
    for ns in [&ns1, &ns2] {
        assert_eq!(
            wait_route_leader(&ns.addr, |l| l != leader).await,
            new_leader
        );
    }
    let routed = killed.elapsed();
    eprintln!(
        "leader killed: elected after {} ms, routed by both name servers after {} ms",
        elected.as_millis(),
        routed.as_millis()
    );
    assert!(
        routed - elected < Duration::from_millis(1500),
        "routes lagged the election by {:?}",
        routed - elected
    );
    let r = route(&ns2.addr, "TopicN").await.unwrap();
    assert_eq!(
        r.groups[0]
            .members
            .iter()
            .find(|m| m.node_id == new_leader)
            .unwrap()
            .role,
        Role::Leader as i32
    );

    // The crashed node expires (silent > 2.5 s, scanned every 200 ms).
    let deadline = Instant::now() + T;
    loop {
        let ids: Vec<u64> = cluster(&ns2.addr).await.into_iter().map(|n| n.0).collect();
        if !ids.contains(&leader) {
            assert_eq!(ids.len(), 2);
            break;
        }
        assert!(Instant::now() < deadline, "the silent node never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A restarted name server is full again after one heartbeat period.
    ns1.restart();
    let restarted = Instant::now();
    assert!(
        cluster(&ns1.addr).await.is_empty(),
        "a restarted name server starts empty"
    );
    loop {
        if cluster(&ns1.addr).await.len() == 2 {
            break;
        }
        assert!(
            restarted.elapsed() < HEARTBEAT * 2,
            "not repopulated within a heartbeat period"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        wait_route_leader(&ns1.addr, |l| l == new_leader).await,
        new_leader
    );
    drop(hung);
}
