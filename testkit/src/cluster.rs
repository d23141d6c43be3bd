//! A local LedgerMQ cluster of real processes on loopback: one `mqnamesrv` and one
//! or more three-node broker groups of `mqbroker`, with `mqadmin` for topics and
//! groups. Used by the quickstart and by the client integration tests.
//!
//! Binaries are looked up in `LEDGERMQ_BIN_DIR`, else next to the running
//! executable (or one directory up, for test executables under `deps/`); build
//! them first with `cargo build --bins` (`scripts/test` does).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use ledgermq_proto::namesrv_pb::name_server_client::NameServerClient;
use ledgermq_proto::namesrv_pb::{ListClusterRequest, Role};

use crate::{bin, free_port, wait_listening, BrokerToml, KitError};

type Result<T> = std::result::Result<T, KitError>;

/// Reads a configuration file as TOML. Error: [`KitError::Config`].
fn read_toml(path: &Path) -> Result<toml::Value> {
    let config = |reason: String| KitError::Config {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| config(e.to_string()))?;
    toml::from_str(&text).map_err(|e| config(e.to_string()))
}

/// One broker node process.
pub struct BrokerProc {
    /// Broker group.
    pub group: String,
    /// Node id within the group.
    pub node_id: u64,
    /// Client gRPC address.
    pub client_addr: String,
    /// Its Prometheus endpoint (`ClusterOptions::metrics`), `host:port`.
    pub metrics_addr: Option<String>,
    /// Its configuration file.
    pub config: PathBuf,
    /// Its log file (stdout and stderr).
    pub log: PathBuf,
    /// Store directory given with `--store-dir`, if any.
    pub store_dir: Option<PathBuf>,
    /// Extra environment of its process (kept for a restart).
    pub env: Vec<(String, String)>,
    netns: Option<String>,
    child: Option<Child>,
}

/// A command running `program`, inside network namespace `netns` if one is given
/// (`ip netns exec`, which also bind-mounts `/etc/netns/NAME/hosts` over
/// `/etc/hosts` for it; it execs `program`, so the child's pid is the program's).
fn command(netns: Option<&str>, program: &Path) -> Command {
    match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(program);
            c
        }
        None => Command::new(program),
    }
}

impl BrokerProc {
    fn spawn(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(KitError::io(format!("opening {}", self.log.display())))?;
        let mut cmd = command(self.netns.as_deref(), &bin("mqbroker")?);
        cmd.arg("-c").arg(&self.config);
        if let Some(d) = &self.store_dir {
            cmd.arg("--store-dir").arg(d);
        }
        let child = cmd
            .env("RUST_LOG", "info,openraft=warn")
            // Text logs (which harnesses read) unless a test asks otherwise.
            .env_remove("LEDGERMQ_LOG_FORMAT")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(
                log.try_clone()
                    .map_err(KitError::io("duplicating a log handle"))?,
            )
            .stderr(log)
            .spawn()
            .map_err(KitError::io("spawning mqbroker"))?;
        self.child = Some(child);
        Ok(())
    }

    /// True while the process runs.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

/// How to lay the cluster out.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Broker groups (`broker-a`, `broker-b`, ...), three nodes each.
    pub groups: usize,
    /// `sync` or `async`.
    pub flush: String,
    /// Ports from the free range (tests) or the `deploy/local` ones (quickstart:
    /// name server 9876, clients 8081.., Raft 40911..).
    pub fixed_ports: bool,
    /// Heartbeat period of brokers to the name server, ms.
    pub namesrv_heartbeat_ms: u64,
    /// Use the ready configurations of this directory (`namesrv.toml`, `n0.toml`,
    /// `n1.toml`, `n2.toml`: `deploy/local`) instead of writing new ones; stores go
    /// under the cluster directory (`--store-dir`). One group only.
    pub deploy_dir: Option<PathBuf>,
    /// Run every process (`mqnamesrv`, `mqbroker`, `mqadmin`) inside this network
    /// namespace (`ip netns exec`: it also sees the namespace's own
    /// `/etc/netns/NAME/hosts`). The caller's thread must be inside it too for the
    /// harness's own connections (see `ledgermq_jepsen::workload::in_namespace`).
    pub netns: Option<String>,
    /// Node `i` of every group listens on its own loopback address 127.0.0.(i+1),
    /// clients and Raft, with the same ports on every node (the name server on
    /// 127.0.0.1): the layout of nodes behind one DNS name. Fixed ports (client
    /// 8081 + 10 per group, Raft 40911 + 10 per group, name server 9876), so only
    /// for a fresh network namespace ([`Self::netns`]).
    pub node_per_address: bool,
    /// Written as `client_endpoint` into every node's configuration: the `host:port`
    /// routes advertise instead of each node's own client address.
    pub client_endpoint: Option<String>,
    /// Extra environment of node `i` of every group at index `i` (e.g. libfaketime
    /// for a skewed wall clock); nodes past the end get none.
    pub node_env: Vec<Vec<(String, String)>>,
    /// Every node's `transaction_check_interval_ms` and `transaction_check_max`
    /// (None: the broker's defaults, 30 s and 15).
    pub transaction_checks: Option<(u64, u32)>,
    /// Every node's `exact_delivery_attempts` (delivery attempts recorded
    /// through Raft).
    pub exact_delivery_attempts: bool,
    /// Every node serves the 4.x remoting protocol (`remoting_addr`: port
    /// 10911 + the node's offset with fixed ports, else a free one).
    pub remoting: bool,
    /// Every node creates topics on first use (`auto_create_topics`).
    pub auto_create_topics: bool,
    /// Every node and the name server serve Prometheus metrics
    /// (`metrics_addr`, a free port each).
    pub metrics: bool,
    /// The CA certificate (PEM file) of a deployed configuration whose name
    /// server serves TLS (`[tls]`): the harness's own calls to the name server
    /// are then made over TLS, checked against it.
    pub tls_ca: Option<PathBuf>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            groups: 1,
            flush: "sync".into(),
            fixed_ports: false,
            namesrv_heartbeat_ms: 1000,
            deploy_dir: None,
            netns: None,
            node_per_address: false,
            client_endpoint: None,
            node_env: Vec::new(),
            transaction_checks: None,
            exact_delivery_attempts: false,
            remoting: false,
            auto_create_topics: false,
            metrics: false,
            tls_ca: None,
        }
    }
}

/// A running cluster; every process is killed when it is dropped.
pub struct LocalCluster {
    /// The name server's address.
    pub namesrv_addr: String,
    /// The name server's Prometheus endpoint (`ClusterOptions::metrics`).
    pub namesrv_metrics_addr: Option<String>,
    /// Broker nodes, group by group, node id order.
    pub nodes: Vec<BrokerProc>,
    namesrv: Child,
    dir: PathBuf,
    netns: Option<String>,
    /// The CA (PEM) the name server's TLS certificate chains to, if it serves TLS.
    namesrv_ca_pem: Option<Vec<u8>>,
}

impl LocalCluster {
    /// Writes configurations under `dir` and starts every process; returns once each
    /// group has a leader the name server knows of.
    pub async fn start(dir: &Path, opts: &ClusterOptions) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .map_err(KitError::io(format!("creating {}", dir.display())))?;
        if let Some(deploy) = &opts.deploy_dir {
            let ca = match &opts.tls_ca {
                Some(p) => Some(
                    std::fs::read(p).map_err(KitError::io(format!("reading {}", p.display())))?,
                ),
                None => None,
            };
            return Self::start_deployed(dir, deploy, ca).await;
        }
        let fixed = opts.fixed_ports || opts.node_per_address;
        let port = |p: u16| if fixed { p } else { free_port() };
        // Node i's host and the port offset of node i of group g.
        let host = |i: usize| {
            if opts.node_per_address {
                format!("127.0.0.{}", i + 1)
            } else {
                "127.0.0.1".to_owned()
            }
        };
        let offset =
            |g: usize, i: usize| (g * 10 + if opts.node_per_address { 0 } else { i }) as u16;
        let namesrv_addr = format!("127.0.0.1:{}", port(9876));
        let ns_cfg = dir.join("namesrv.toml");
        let metrics_addr = || opts.metrics.then(|| format!("127.0.0.1:{}", free_port()));
        let namesrv_metrics_addr = metrics_addr();
        let metrics_line = namesrv_metrics_addr
            .as_ref()
            .map_or(String::new(), |a| format!("metrics_addr = \"{a}\"\n"));
        std::fs::write(
            &ns_cfg,
            format!(
                "listen = \"{namesrv_addr}\"\nscan_interval_ms = 500\nnode_expiry_ms = 10000\n{metrics_line}"
            ),
        )
        .map_err(KitError::io(format!("writing {}", ns_cfg.display())))?;
        let mut cluster = Self::with_namesrv(dir, &ns_cfg, &namesrv_addr, opts.netns.clone())?;
        cluster.namesrv_metrics_addr = namesrv_metrics_addr;
        for g in 0..opts.groups {
            let group = format!("broker-{}", (b'a' + g as u8) as char);
            let raft: Vec<String> = (0..3)
                .map(|i| format!("{}:{}", host(i), port(40911 + offset(g, i))))
                .collect();
            let client: Vec<String> = (0..3)
                .map(|i| format!("{}:{}", host(i), port(8081 + offset(g, i))))
                .collect();
            for i in 0..3 {
                let name = format!("{group}-n{i}");
                let config = dir.join(format!("{name}.toml"));
                let mut toml = BrokerToml::member(
                    "DefaultCluster",
                    &group,
                    i,
                    &raft,
                    &client,
                    &dir.join(&name),
                );
                toml.namesrv_addrs = vec![namesrv_addr.clone()];
                toml.flush = opts.flush.clone();
                toml.commit_log_segment_bytes = Some(64 << 20);
                toml.namesrv_heartbeat_ms = Some(opts.namesrv_heartbeat_ms);
                toml.disk_space_warning_ratio = Some(0.99);
                toml.client_endpoint = opts.client_endpoint.clone();
                if opts.exact_delivery_attempts {
                    toml.exact_delivery_attempts = Some(true);
                }
                if opts.auto_create_topics {
                    toml.auto_create_topics = Some(true);
                }
                if opts.remoting {
                    toml.remoting_addr =
                        Some(format!("{}:{}", host(i), port(10911 + offset(g, i))));
                }
                toml.metrics_addr = metrics_addr();
                toml.transaction_check_interval_ms = opts.transaction_checks.map(|c| c.0);
                toml.transaction_check_max = opts.transaction_checks.map(|c| c.1);
                toml.write(&config)?;
                let mut node = BrokerProc {
                    group: group.clone(),
                    node_id: i as u64,
                    client_addr: client[i].clone(),
                    metrics_addr: toml.metrics_addr.clone(),
                    config,
                    log: dir.join(format!("{name}.log")),
                    store_dir: None,
                    env: opts.node_env.get(i).cloned().unwrap_or_default(),
                    netns: opts.netns.clone(),
                    child: None,
                };
                node.spawn()?;
                cluster.nodes.push(node);
            }
        }
        for n in &cluster.nodes {
            wait_listening(&n.client_addr, Duration::from_secs(20))?;
        }
        for g in 0..opts.groups {
            let group = format!("broker-{}", (b'a' + g as u8) as char);
            cluster.wait_leader(&group, Duration::from_secs(20)).await?;
        }
        Ok(cluster)
    }

    /// A cluster of just a name server started from `ns_cfg`, listening on `addr`.
    fn with_namesrv(dir: &Path, ns_cfg: &Path, addr: &str, netns: Option<String>) -> Result<Self> {
        let ns_log_path = dir.join("namesrv.log");
        let ns_log = std::fs::File::create(&ns_log_path)
            .map_err(KitError::io(format!("creating {}", ns_log_path.display())))?;
        let namesrv = command(netns.as_deref(), &bin("mqnamesrv")?)
            .arg("-c")
            .arg(ns_cfg)
            .env_remove("LEDGERMQ_LOG_FORMAT")
            .stdout(
                ns_log
                    .try_clone()
                    .map_err(KitError::io("duplicating a log handle"))?,
            )
            .stderr(ns_log)
            .spawn()
            .map_err(KitError::io("spawning mqnamesrv"))?;
        let cluster = Self {
            namesrv_addr: addr.to_owned(),
            namesrv_metrics_addr: None,
            nodes: Vec::new(),
            namesrv,
            dir: dir.to_path_buf(),
            netns,
            namesrv_ca_pem: None,
        };
        wait_listening(addr, Duration::from_secs(10))?;
        Ok(cluster)
    }

    /// Runs `mqadmin` commands (each an argument list without `-n`), then waits
    /// until `group` has a leader and the name server has heard of the changes (the
    /// brokers announce within a second). Returns the leader's index.
    pub async fn prepare(&self, group: &str, commands: &[&[&str]]) -> Result<usize> {
        for c in commands {
            self.admin(c)?;
        }
        let leader = self.wait_leader(group, Duration::from_secs(10)).await?;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        Ok(leader)
    }

    async fn start_deployed(dir: &Path, deploy: &Path, ca: Option<Vec<u8>>) -> Result<Self> {
        let ns_cfg = deploy.join("namesrv.toml");
        let listen = read_toml(&ns_cfg)?;
        let namesrv_addr = listen
            .get("listen")
            .and_then(|v| v.as_str())
            .ok_or_else(|| KitError::Config {
                path: ns_cfg.clone(),
                reason: "no listen address".into(),
            })?
            .to_owned();
        let mut cluster = Self::with_namesrv(dir, &ns_cfg, &namesrv_addr, None)?;
        cluster.namesrv_ca_pem = ca;
        for i in 0..3u64 {
            let config = deploy.join(format!("n{i}.toml"));
            let v = read_toml(&config)?;
            let field = |k: &str| {
                v.get(k)
                    .and_then(|x| x.as_str())
                    .map(str::to_owned)
                    .ok_or_else(|| KitError::Config {
                        path: config.clone(),
                        reason: format!("no {k}"),
                    })
            };
            let mut node = BrokerProc {
                group: field("broker_group")?,
                node_id: i,
                client_addr: field("client_addr")?,
                metrics_addr: field("metrics_addr").ok(),
                config: config.clone(),
                log: dir.join(format!("n{i}.log")),
                store_dir: Some(dir.join(format!("n{i}"))),
                env: Vec::new(),
                netns: None,
                child: None,
            };
            node.spawn()?;
            cluster.nodes.push(node);
        }
        for n in &cluster.nodes {
            wait_listening(&n.client_addr, Duration::from_secs(20))?;
        }
        let group = cluster.nodes[0].group.clone();
        cluster.wait_leader(&group, Duration::from_secs(20)).await?;
        Ok(cluster)
    }

    /// The directory holding configurations, stores and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The node the name server names leader of `group` (the highest term's
    /// claim among running nodes), as an index into `nodes`.
    pub async fn leader(&self, group: &str) -> Option<usize> {
        let endpoint = match &self.namesrv_ca_pem {
            Some(ca) => {
                tonic::transport::Endpoint::from_shared(format!("https://{}", self.namesrv_addr))
                    .ok()?
                    .tls_config(
                        tonic::transport::ClientTlsConfig::new()
                            .ca_certificate(tonic::transport::Certificate::from_pem(ca)),
                    )
                    .ok()?
            }
            None => {
                tonic::transport::Endpoint::from_shared(format!("http://{}", self.namesrv_addr))
                    .ok()?
            }
        };
        let mut c = NameServerClient::new(endpoint.connect().await.ok()?);
        let nodes = c
            .list_cluster(ListClusterRequest {})
            .await
            .ok()?
            .into_inner()
            .nodes;
        nodes
            .into_iter()
            .filter_map(|n| n.node)
            .filter(|n| n.broker_group == group && n.role == Role::Leader as i32)
            .filter_map(|n| {
                let idx = self
                    .nodes
                    .iter()
                    .position(|p| p.group == group && p.node_id == n.node_id)?;
                self.nodes[idx].is_running().then_some((n.term, idx))
            })
            .max()
            .map(|(_, idx)| idx)
    }

    /// Waits until the name server knows a running leader of `group`.
    pub async fn wait_leader(&self, group: &str, timeout: Duration) -> Result<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(i) = self.leader(group).await {
                return Ok(i);
            }
            if Instant::now() > deadline {
                return Err(KitError::NoLeader {
                    group: group.to_owned(),
                    waited_ms: timeout.as_millis(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts a new node `node_id` of `group` that joins it (`join = true`, for
    /// `mqadmin addNode`): node `idx` of the group's configuration with this
    /// node's id, free ports, an empty store under the cluster directory, and
    /// itself added to `[peers]` and `[client_addrs]`. Returns its index in
    /// [`Self::nodes`] and its Raft peer address, once its client port listens.
    pub fn start_joiner(&mut self, group: &str, node_id: u64) -> Result<(usize, String)> {
        let model = self
            .nodes
            .iter()
            .find(|n| n.group == group)
            .ok_or_else(|| KitError::Config {
                path: self.dir.clone(),
                reason: format!("no node of group {group}"),
            })?;
        let mut cfg = read_toml(&model.config)?;
        let name = format!("{group}-n{node_id}");
        let raft = format!("127.0.0.1:{}", free_port());
        let client = format!("127.0.0.1:{}", free_port());
        let metrics = model
            .metrics_addr
            .as_ref()
            .map(|_| format!("127.0.0.1:{}", free_port()));
        let t = cfg.as_table_mut().expect("a TOML file is a table");
        let id = node_id.to_string();
        t.insert("node_id".into(), toml::Value::Integer(node_id as i64));
        t.insert("client_addr".into(), client.clone().into());
        t.insert("join".into(), true.into());
        t.insert(
            "store_root".into(),
            self.dir.join(&name).display().to_string().into(),
        );
        if let Some(m) = &metrics {
            t.insert("metrics_addr".into(), m.clone().into());
        }
        if t.contains_key("remoting_addr") {
            t.insert(
                "remoting_addr".into(),
                format!("127.0.0.1:{}", free_port()).into(),
            );
        }
        for (key, addr) in [("peers", &raft), ("client_addrs", &client)] {
            if let Some(toml::Value::Table(m)) = t.get_mut(key) {
                m.insert(id.clone(), addr.clone().into());
            }
        }
        let config = self.dir.join(format!("{name}.toml"));
        let text = toml::to_string(&cfg).map_err(|e| KitError::Config {
            path: config.clone(),
            reason: e.to_string(),
        })?;
        std::fs::write(&config, text)
            .map_err(KitError::io(format!("writing {}", config.display())))?;
        let mut node = BrokerProc {
            group: group.to_owned(),
            node_id,
            client_addr: client.clone(),
            metrics_addr: metrics,
            config,
            log: self.dir.join(format!("{name}.log")),
            store_dir: None,
            env: Vec::new(),
            netns: self.netns.clone(),
            child: None,
        };
        node.spawn()?;
        self.nodes.push(node);
        wait_listening(&client, Duration::from_secs(20))?;
        Ok((self.nodes.len() - 1, raft))
    }

    /// SIGKILLs node `idx`.
    pub fn kill(&mut self, idx: usize) {
        if let Some(mut c) = self.nodes[idx].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts node `idx` again (after [`Self::kill`]).
    pub fn restart(&mut self, idx: usize) -> Result<()> {
        self.kill(idx);
        self.nodes[idx].spawn()?;
        wait_listening(&self.nodes[idx].client_addr, Duration::from_secs(20))
    }

    /// Runs `mqadmin ARGS -n NAMESRV`; returns its output, error if it failed.
    pub fn admin(&self, args: &[&str]) -> Result<String> {
        let out = command(self.netns.as_deref(), &bin("mqadmin")?)
            .args(args)
            .args(["-n", &self.namesrv_addr])
            .output()
            .map_err(KitError::io("running mqadmin"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            return Err(KitError::Admin {
                args: args.iter().map(|a| a.to_string()).collect(),
                output: text,
            });
        }
        Ok(text)
    }

    /// Every client address of the group's running nodes, leader first.
    pub fn client_addrs(&self, group: &str) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.group == group && n.is_running())
            .map(|n| n.client_addr.clone())
            .collect()
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
        let _ = self.namesrv.kill();
        let _ = self.namesrv.wait();
    }
}
