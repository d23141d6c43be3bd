//! [`BrokerNode`]: one running member of a broker group as a library entry, so that
//! `mqbroker` is short and a node can be started and stopped inside a test.
//!
//! Start order: the Raft node (store recovery, openraft, the peer port), the
//! broker's service state, the client port with the leader-term services, then
//! the announcements to the name servers. Stop order ([`BrokerNode::shutdown`]): leadership
//! handed to a caught-up follower, calls in flight drained through the new leader,
//! the client port closed, the name servers told, the store shut down cleanly.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ledgermq_namesrv::registrar::Registrar;
use ledgermq_raft::{BatchConfig, NetworkFilter, RaftNode, RaftNodeConfig, RaftTiming};
use tokio::task::JoinHandle;

use crate::announce::{spawn_announcer, Identity};
use crate::broker::Broker;
use crate::config::BrokerConfig;
use crate::error::BrokerError;
use crate::grpc::server::ClientServer;
use crate::route::{Members, NameServers};

/// What a start takes beyond the configuration file.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// Take part in elections at once even if this node may have lost entries it
    /// had acknowledged (`mqbroker --forget-lost-acknowledged`).
    pub forget_lost_acknowledged: bool,
    /// Fault injection on the peer transport (tests); the default lets everything
    /// through.
    pub filter: NetworkFilter,
}

/// Timings of a node that are not in the configuration file.
#[derive(Debug, Clone, Copy)]
pub struct NodeTimings {
    /// How long a write may wait for its commit before it answers Timeout.
    pub write_timeout: Duration,
    /// How often the node's registration is refreshed at the name servers (besides
    /// every role change).
    pub announce_refresh: Duration,
    /// How long a name server gets to answer a registration.
    pub namesrv_timeout: Duration,
    /// On shutdown, how long a leadership hand-over may take.
    pub hand_over_timeout: Duration,
    /// On shutdown, after the hand-over: how long calls in flight get to finish
    /// before the client port closes.
    pub shutdown_drain: Duration,
}

impl Default for NodeTimings {
    fn default() -> Self {
        Self {
            write_timeout: Duration::from_millis(2500),
            announce_refresh: Duration::from_secs(1),
            namesrv_timeout: Duration::from_secs(3),
            hand_over_timeout: Duration::from_secs(5),
            shutdown_drain: Duration::from_millis(1500),
        }
    }
}

/// One running broker node (see the module doc).
pub struct BrokerNode {
    node: Arc<RaftNode>,
    broker: Arc<Broker>,
    server: ClientServer,
    remoting: Option<crate::remoting::RemotingServer>,
    announcer: JoinHandle<()>,
    registrar: Arc<Registrar>,
    timings: NodeTimings,
    /// Counts term and leader changes (`crate::metrics::scrape`).
    raft_watch: JoinHandle<()>,
    metrics_server: Option<ledgermq_namesrv::metrics::MetricsServer>,
}

/// The address admin calls for this node alone go to, as announced: its
/// `[client_addrs]` entry, else `client_addr` unless that is a wildcard
/// (`0.0.0.0`), else empty (tools then use the announced `client_addr`).
fn member_addr(cfg: &BrokerConfig) -> String {
    if let Some(a) = cfg
        .member_client_addrs()
        .ok()
        .and_then(|m| m.get(&cfg.node_id).cloned())
    {
        return a;
    }
    match cfg.client_addr.parse::<SocketAddr>() {
        Ok(a) if a.ip().is_unspecified() => String::new(),
        _ => cfg.client_addr.clone(),
    }
}

fn config_error(key: &'static str, reason: impl std::fmt::Display) -> BrokerError {
    BrokerError::Config {
        key,
        reason: reason.to_string(),
    }
}

impl BrokerNode {
    /// Starts the node `cfg` describes. Errors: `Config` (a value that does not
    /// parse, naming its key), and whatever opening the store, starting Raft or
    /// binding a port returns.
    pub async fn start(
        cfg: &BrokerConfig,
        opts: StartOptions,
        timings: NodeTimings,
    ) -> Result<Self, BrokerError> {
        let members = cfg.members().map_err(|e| config_error("peers", e))?;
        let raft_addr: SocketAddr = members
            .get(&cfg.node_id)
            .ok_or_else(|| config_error("node_id", "not among peers"))?
            .parse()
            .map_err(|e| config_error("peers", format!("this node's address: {e}")))?;
        let client_addr: SocketAddr = cfg
            .client_addr
            .parse()
            .map_err(|e| config_error("client_addr", e))?;
        // `store_config` refuses only an unknown `flush` mode.
        let mut store = cfg.store_config().map_err(|e| config_error("flush", e))?;
        store.forget_lost_acknowledged = opts.forget_lost_acknowledged;
        let member_clients = cfg
            .member_client_addrs()
            .map_err(|e| config_error("client_addrs", e))?;
        // `[tls]` covers the client port and, with mutual TLS, the peer port.
        let tls = cfg.tls.load(true).map_err(|e| config_error("tls", e))?;
        let peer_tls = tls
            .as_ref()
            .map(ledgermq_raft::network::PeerTls::new)
            .transpose()
            .map_err(|e| config_error("tls", e))?;
        let node = RaftNode::start(
            RaftNodeConfig {
                node_id: cfg.node_id,
                listen_addr: raft_addr,
                members,
                store,
                timing: RaftTiming {
                    heartbeat_interval_ms: cfg.raft_heartbeat.as_millis() as u64,
                    election_timeout_min_ms: cfg.raft_election_min.as_millis() as u64,
                    election_timeout_max_ms: cfg.raft_election_max.as_millis() as u64,
                },
                batch: BatchConfig::default(),
                store_host: client_addr,
                write_timeout_ms: timings.write_timeout.as_millis() as u64,
                cluster_name: cfg.broker_group.clone(),
                retention_interval_ms: cfg.retention_interval.as_millis() as u64,
                join: cfg.join,
                peer_tls,
            },
            opts.filter,
        )
        .await?;
        let metrics = Arc::new(crate::metrics::BrokerMetrics::new(
            &cfg.cluster,
            &cfg.broker_group,
            cfg.node_id,
        ));
        {
            let m = metrics.clone();
            node.store()
                .commit_log()
                .set_flush_observer(Box::new(move |took| m.flush(took)));
        }
        let raft_watch = crate::metrics::scrape::spawn_raft_watch(node.clone(), metrics.clone());
        let mut settings = cfg.service_settings();
        // The name servers are reached over TLS with `namesrv_tls` (checked
        // against this node's CA), and registrations are signed with the
        // registration credentials when they are set (never the members' own:
        // the name servers see what is signed).
        if cfg.auth.enabled
            && !cfg.namesrv_addrs.is_empty()
            && cfg.auth.registration_access_key.is_none()
        {
            tracing::warn!(
                "[auth] is on but registrations are unsigned (no auth.registration_access_key): \
                 a name server with [auth] refuses them"
            );
        }
        let namesrv_access = ledgermq_namesrv::registrar::NameServerAccess {
            credentials: cfg
                .auth
                .registration()
                .map_err(|e| config_error("auth", e))?,
            tls: tls
                .as_ref()
                .filter(|_| cfg.namesrv_tls)
                .map(|m| m.tonic_client(false)),
        };
        settings.tls = tls;
        let broker = Broker::new(
            node.clone(),
            cfg.broker_group.clone(),
            settings,
            NameServers::new(cfg.namesrv_addrs.clone(), namesrv_access.tls.clone()),
            Members::new(cfg.broker_group.clone(), member_clients),
            metrics,
        );
        match toml::to_string(cfg) {
            Ok(text) => {
                let _ = broker.effective_config.set(text);
            }
            Err(e) => tracing::warn!(error = %e, "the effective configuration does not render"),
        }
        // The client port serves before the node is announced, so that routes
        // never name a port that is not listening (and a port that cannot be
        // bound leaves nothing registered).
        let server = match crate::grpc::server::serve(broker.clone(), client_addr).await {
            Ok(s) => s,
            Err(e) => {
                let _ = node.stop(true).await;
                return Err(e);
            }
        };
        let remoting = match &cfg.remoting_addr {
            None => None,
            Some(addr) => {
                let listen: SocketAddr = match addr.parse() {
                    Ok(a) => a,
                    Err(e) => {
                        server.stop(Duration::ZERO).await;
                        let _ = node.stop(true).await;
                        return Err(config_error("remoting_addr", e));
                    }
                };
                let mut advertised = listen;
                if advertised.ip().is_unspecified() {
                    advertised.set_ip(client_addr.ip());
                }
                if advertised.ip().is_unspecified() {
                    server.stop(Duration::ZERO).await;
                    let _ = node.stop(true).await;
                    return Err(config_error(
                        "remoting_addr",
                        "a wildcard host needs a client_addr with a host clients can \
                         reach: 4.x clients are told this address",
                    ));
                }
                if cfg.remoting_tls_mode.is_none() && broker.settings.tls.is_some() {
                    tracing::warn!(
                        "[tls] is set and remoting_tls_mode is not: the remoting port serves TLS \
                         only (before this release it served plain text); set \
                         remoting_tls_mode = \"permissive\" to serve 4.x clients without TLS"
                    );
                }
                match crate::remoting::serve(broker.clone(), listen, advertised).await {
                    Ok(s) => Some(s),
                    Err(e) => {
                        server.stop(Duration::ZERO).await;
                        let _ = node.stop(true).await;
                        return Err(e);
                    }
                }
            }
        };
        // Last of what can fail, so no earlier failure leaves it serving.
        let metrics_server = match &cfg.metrics_addr {
            None => None,
            Some(addr) => {
                // Weak: a scrape in flight at shutdown must not keep the
                // broker (and its Raft node) alive.
                let b = Arc::downgrade(&broker);
                let render: ledgermq_namesrv::metrics::Render = Arc::new(move || {
                    b.upgrade()
                        .map(|b| crate::metrics::scrape::render(&b))
                        .unwrap_or_default()
                });
                match ledgermq_namesrv::metrics::serve_metrics(addr, render).await {
                    Ok(s) => Some(s),
                    Err(e) => {
                        raft_watch.abort();
                        server.stop(Duration::ZERO).await;
                        if let Some(r) = remoting {
                            r.stop().await;
                        }
                        let _ = node.stop(true).await;
                        return Err(config_error("metrics_addr", e));
                    }
                }
            }
        };
        let registrar = Arc::new(Registrar::start(
            cfg.namesrv_addrs.clone(),
            cfg.namesrv_heartbeat,
            timings.namesrv_timeout,
            namesrv_access,
        ));
        let announcer = spawn_announcer(
            node.clone(),
            registrar.clone(),
            Identity {
                cluster: cfg.cluster.clone(),
                broker_group: cfg.broker_group.clone(),
                client_addr: cfg.advertised_client_addr().to_owned(),
                member_addr: member_addr(cfg),
                remoting_addr: remoting
                    .as_ref()
                    .map_or(String::new(), |r| r.advertised.to_string()),
                auto_create_queue_count: cfg
                    .auto_create_topics
                    .then_some(cfg.default_topic_queue_count),
            },
            timings.announce_refresh,
        );
        Ok(Self {
            node,
            broker,
            server,
            remoting,
            announcer,
            registrar,
            timings,
            raft_watch,
            metrics_server,
        })
    }

    /// The Raft node.
    pub fn raft_node(&self) -> &Arc<RaftNode> {
        &self.node
    }

    /// The term whose leader-term services (`crate::leader_term`) run on this
    /// node now, if any.
    pub fn services_term(&self) -> Option<u64> {
        self.server.services_term()
    }

    /// The address this node's remoting service announces, if it serves one.
    pub fn remoting_addr(&self) -> Option<SocketAddr> {
        self.remoting.as_ref().map(|r| r.advertised)
    }

    /// The broker's service state.
    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }

    /// Resolves when the Raft core has stopped by itself (a storage failure, a
    /// panic), with why; the node can then not serve, and its process should exit
    /// so that a supervisor restarts it and recovery runs.
    pub async fn failed(&self) -> String {
        let mut metrics = self.node.raft().metrics();
        loop {
            if let Err(e) = &metrics.borrow_and_update().running_state {
                return e.to_string();
            }
            if metrics.changed().await.is_err() {
                return "the Raft core stopped".to_string();
            }
        }
    }

    /// Stops the node in the order of the module doc. A leader that cannot hand
    /// over (no caught-up follower within `hand_over_timeout`) stops anyway and the
    /// followers elect. Errors: the store's clean shutdown.
    pub async fn shutdown(self) -> Result<(), BrokerError> {
        if self.node.is_leader() {
            match self
                .node
                .transfer_leadership(None, self.timings.hand_over_timeout)
                .await
            {
                Ok(to) => tracing::info!(to, "leadership handed over"),
                Err(e) => {
                    tracing::warn!(error = %e, "could not hand leadership over; followers will elect")
                }
            }
        }
        // Calls taken before the hand-over finish through the new leader.
        self.server.stop(self.timings.shutdown_drain).await;
        if let Some(r) = self.remoting {
            r.stop().await;
        }
        self.announcer.abort();
        let _ = self.announcer.await; // drops its handle on the registrar
        if let Some(m) = self.metrics_server {
            m.stop().await; // no more scrapes (each holds the broker weakly)
        }
        self.raft_watch.abort();
        let _ = self.raft_watch.await;
        drop(self.broker);
        match Arc::try_unwrap(self.registrar) {
            Ok(r) => r.stop(true).await,
            Err(_) => tracing::warn!("registrar still shared; not unregistering"),
        }
        self.node.stop(true).await?;
        Ok(())
    }
}
