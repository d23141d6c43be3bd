//! A broker node's view of its surroundings: the name servers it asks for routes
//! and the cluster listing ([`NameServers`]), the client addresses of its group's
//! members ([`Members`], to pass calls on to the leader), and the order members
//! are named in ([`member_addrs`]). Protocol routes are built from these by each
//! adapter (`grpc::route` for the 5.x protocol).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ledgermq_namesrv::pb::name_server_client::NameServerClient;
use ledgermq_namesrv::pb::{self as ns, GroupRoute};
use tonic::transport::Channel;

use crate::error::BrokerError;

/// Deadline of one call to a name server.
const NAMESRV_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// A group's member addresses, leader first, then by node id, leaving out members
/// the name server has not heard from for `stale_ms` (they are probably down; the
/// name server itself forgets them later). If every member is stale, all are kept.
pub fn member_addrs(g: &GroupRoute, stale_ms: u64) -> Vec<String> {
    let mut members: Vec<_> = g
        .members
        .iter()
        .filter(|m| !m.client_addr.is_empty())
        .collect();
    members.sort_by_key(|m| (m.client_addr != g.leader_addr || !g.has_leader, m.node_id));
    let fresh: Vec<_> = members.iter().filter(|m| m.silent_ms <= stale_ms).collect();
    let chosen: Vec<_> = if fresh.is_empty() {
        members.iter().collect()
    } else {
        fresh
    };
    let mut out: Vec<String> = Vec::new();
    for m in chosen {
        if !out.contains(&m.client_addr) {
            out.push(m.client_addr.clone());
        }
    }
    out
}

/// Calls to the name servers, with one lazily connected channel each.
pub struct NameServers {
    addrs: Vec<String>,
    tls: Option<tonic::transport::ClientTlsConfig>,
    channels: Mutex<HashMap<String, Channel>>,
    cluster_cache: Mutex<Option<(Instant, Vec<ns::ClusterNode>)>>,
}

impl NameServers {
    /// Name servers at `addrs` (`host:port` each), over TLS with `tls`.
    pub fn new(addrs: Vec<String>, tls: Option<tonic::transport::ClientTlsConfig>) -> Self {
        Self {
            addrs,
            tls,
            channels: Mutex::new(HashMap::new()),
            cluster_cache: Mutex::new(None),
        }
    }

    fn client(&self, addr: &str) -> Result<NameServerClient<Channel>, BrokerError> {
        let mut ch = self.channels.lock().unwrap();
        if let Some(c) = ch.get(addr) {
            return Ok(NameServerClient::new(c.clone()));
        }
        let c = ledgermq_namesrv::registrar::endpoint(addr, self.tls.as_ref())
            .map_err(|e| BrokerError::NameServer(format!("{addr}: {e}")))?
            .connect_timeout(NAMESRV_CALL_TIMEOUT)
            .timeout(NAMESRV_CALL_TIMEOUT)
            .connect_lazy();
        ch.insert(addr.to_owned(), c.clone());
        Ok(NameServerClient::new(c))
    }

    /// The first name server's route that finds `topic`; `Ok(None)` if every name
    /// server that answered knows no group serving it. Error if none answered.
    pub async fn route(&self, topic: &str) -> Result<Option<ns::QueryRouteResponse>, BrokerError> {
        let mut last_err = None;
        let mut answered = false;
        for addr in &self.addrs {
            let req = ns::QueryRouteRequest {
                topic: topic.to_owned(),
            };
            match self.client(addr)?.query_route(req).await {
                Ok(r) => {
                    answered = true;
                    let r = r.into_inner();
                    if r.found {
                        return Ok(Some(r));
                    }
                }
                Err(e) => last_err = Some(format!("{addr}: {}", e.message())),
            }
        }
        if answered || self.addrs.is_empty() {
            Ok(None)
        } else {
            Err(BrokerError::NameServer(last_err.unwrap_or_default()))
        }
    }

    /// Every node the name servers know (the first that answers), cached for
    /// `max_age`.
    pub async fn cluster(&self, max_age: Duration) -> Result<Vec<ns::ClusterNode>, BrokerError> {
        if let Some((at, nodes)) = self.cluster_cache.lock().unwrap().as_ref() {
            if at.elapsed() < max_age {
                return Ok(nodes.clone());
            }
        }
        let mut last_err = String::from("no name server configured");
        for addr in &self.addrs {
            match self
                .client(addr)?
                .list_cluster(ns::ListClusterRequest {})
                .await
            {
                Ok(r) => {
                    let nodes = r.into_inner().nodes;
                    *self.cluster_cache.lock().unwrap() = Some((Instant::now(), nodes.clone()));
                    return Ok(nodes);
                }
                Err(e) => last_err = format!("{addr}: {}", e.message()),
            }
        }
        Err(BrokerError::NameServer(last_err))
    }
}

/// Client addresses of this group's members: from the configuration, else from the
/// name servers' listing.
pub struct Members {
    group: String,
    configured: BTreeMap<u64, String>,
}

impl Members {
    /// `configured`: node id → client address, as the configuration gives them.
    pub fn new(group: String, configured: BTreeMap<u64, String>) -> Self {
        Self { group, configured }
    }

    /// The configured addresses (node id → `host:port`).
    pub fn configured(&self) -> &BTreeMap<u64, String> {
        &self.configured
    }

    /// The client address of member `node_id`.
    pub async fn client_addr(
        &self,
        node_id: u64,
        namesrv: &NameServers,
    ) -> Result<String, BrokerError> {
        if let Some(a) = self.configured.get(&node_id) {
            return Ok(a.clone());
        }
        namesrv
            .cluster(Duration::from_millis(500))
            .await?
            .into_iter()
            .filter_map(|n| n.node)
            .find(|n| n.broker_group == self.group && n.node_id == node_id)
            // The member's own address: `client_addr` is the whole group's
            // name when it announces a `client_endpoint` (empty from an
            // earlier release, whose `client_addr` is then its own).
            .map(|n| {
                if n.member_addr.is_empty() {
                    n.client_addr
                } else {
                    n.member_addr
                }
            })
            .ok_or_else(|| {
                BrokerError::NameServer(format!(
                    "no client address known for node {node_id} of group {}",
                    self.group
                ))
            })
    }
}
