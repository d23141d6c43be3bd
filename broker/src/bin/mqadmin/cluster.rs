//! `clusterList` and `topicList`: what the name servers know of the nodes and
//! the topics they serve (`ListCluster`), printed.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Result};
use ledgermq_namesrv::pb::name_server_client::NameServerClient;
use ledgermq_namesrv::pb::{BrokerNode, ClusterNode, ListClusterRequest, Role};

/// The access key and secret key admin calls are signed with (`--accessKey`,
/// `--secretKey`), set once at start.
static CREDENTIALS: std::sync::OnceLock<ledgermq_broker::auth::Credentials> =
    std::sync::OnceLock::new();

/// Signs every admin call with [`CREDENTIALS`] when given (the 5.x clients'
/// `authorization` and `x-mq-date-time` headers, `ledgermq_broker::auth`).
pub fn set_credentials(access_key: Option<String>, secret_key: Option<String>) -> Result<()> {
    match (access_key, secret_key) {
        (Some(access_key), Some(secret_key)) => {
            let _ = CREDENTIALS.set(ledgermq_broker::auth::Credentials {
                access_key,
                secret_key,
            });
            Ok(())
        }
        (None, None) => Ok(()),
        _ => bail!("--accessKey and --secretKey go together"),
    }
}

/// The CA certificates (PEM) the brokers' client ports are checked against
/// when they serve TLS (`--tlsCa`), set once at start.
static TLS_CA: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
/// The same for the name servers (`--namesrvCa`).
static NAMESRV_CA: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();

/// Connects to the brokers over TLS, trusting the CA certificates in
/// `brokers` (PEM), and to the name servers over TLS, trusting those in
/// `namesrv`. Error: a file cannot be read.
pub fn set_tls_ca(
    brokers: Option<&std::path::Path>,
    namesrv: Option<&std::path::Path>,
) -> Result<()> {
    for (path, cell, flag) in [
        (brokers, &TLS_CA, "--tlsCa"),
        (namesrv, &NAMESRV_CA, "--namesrvCa"),
    ] {
        if let Some(p) = path {
            let pem =
                std::fs::read(p).map_err(|e| anyhow::anyhow!("{flag} {}: {e}", p.display()))?;
            let _ = cell.set(pem);
        }
    }
    Ok(())
}

/// The interceptor that signs admin calls ([`set_credentials`]).
#[derive(Clone, Copy)]
pub struct Signer;

impl tonic::service::Interceptor for Signer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(c) = CREDENTIALS.get() {
            if !c.access_key.is_ascii() {
                return Err(tonic::Status::invalid_argument("access key not ASCII"));
            }
            ledgermq_proto::signature::sign_request(&mut req, c);
        }
        Ok(req)
    }
}

/// A broker node's admin client whose calls are signed ([`Signer`]).
pub type AdminClient = ledgermq_broker::admin_pb::broker_admin_client::BrokerAdminClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Signer>,
>;

/// The admin client of `channel`, signing its calls.
pub fn admin_client(channel: tonic::transport::Channel) -> AdminClient {
    ledgermq_broker::admin_pb::broker_admin_client::BrokerAdminClient::with_interceptor(
        channel, Signer,
    )
}

/// A channel to broker node `addr` (`host:port`, its client port: over TLS
/// with `--tlsCa`) that gives up connecting after 3 s, and on a call after
/// `call_timeout` if given (an unreachable node does not stall a command).
pub async fn channel(
    addr: &str,
    call_timeout: Option<std::time::Duration>,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    channel_trusting(addr, call_timeout, TLS_CA.get()).await
}

/// [`channel`] to a name server (over TLS with `--namesrvCa`).
pub async fn namesrv_channel(
    addr: &str,
    call_timeout: Option<std::time::Duration>,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    channel_trusting(addr, call_timeout, NAMESRV_CA.get()).await
}

async fn channel_trusting(
    addr: &str,
    call_timeout: Option<std::time::Duration>,
    ca: Option<&Vec<u8>>,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let tls = ca.map(|ca| {
        tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(ca))
    });
    let mut e = ledgermq_namesrv::registrar::endpoint(addr, tls.as_ref())?
        .connect_timeout(std::time::Duration::from_secs(3));
    if let Some(t) = call_timeout {
        e = e.timeout(t);
    }
    e.connect().await
}

/// A client of the first name server of `namesrv` (`host:port`, several
/// separated by `;`) that answers a connection within 3 s (calls time out
/// after 10 s). Error: none does.
pub async fn client(namesrv: &str) -> Result<NameServerClient<tonic::transport::Channel>> {
    let mut last = None;
    for addr in namesrv.split(';').map(str::trim).filter(|a| !a.is_empty()) {
        match namesrv_channel(addr, Some(std::time::Duration::from_secs(10))).await {
            Ok(c) => return Ok(NameServerClient::new(c)),
            Err(e) => last = Some(format!("{addr}: {e}")),
        }
    }
    bail!(
        "no name server reachable ({})",
        last.unwrap_or_else(|| "none given".into())
    )
}

/// Where admin calls for `node` alone go: its own client address, or, from a
/// release before nodes told it, the address it announces to clients (which
/// is the whole group's when `client_endpoint` is set).
pub fn member_addr(node: &BrokerNode) -> &str {
    if node.member_addr.is_empty() {
        &node.client_addr
    } else {
        &node.member_addr
    }
}

/// The name of a node's role as printed.
pub fn role_name(r: i32) -> &'static str {
    match Role::try_from(r) {
        Ok(Role::Leader) => "leader",
        Ok(Role::Follower) => "follower",
        Ok(Role::Candidate) => "candidate",
        Ok(Role::Learner) => "learner",
        _ => "unknown",
    }
}

/// Every node the name server knows, with how long since it last heard of it.
pub async fn nodes(namesrv: &str) -> Result<Vec<ClusterNode>> {
    Ok(client(namesrv)
        .await?
        .list_cluster(ListClusterRequest {})
        .await?
        .into_inner()
        .nodes)
}

/// `clusterList`: one line per node; the last column says whether routes
/// name it (`in`) or leave it out (`cut-off`).
pub async fn cluster_list(namesrv: &str) -> Result<()> {
    println!(
        "{:<16} {:<12} {:<5} {:<22} {:<10} {:>6} {:>12} {:>8}  routes",
        "cluster", "group", "node", "address", "role", "term", "commit", "silent"
    );
    for n in nodes(namesrv).await? {
        let (silent, n) = (n.silent_ms, n.node.unwrap_or_default());
        println!(
            "{:<16} {:<12} {:<5} {:<22} {:<10} {:>6} {:>12} {:>7.1}s  {}",
            n.cluster,
            n.broker_group,
            n.node_id,
            member_addr(&n),
            role_name(n.role),
            n.term,
            n.commit_index,
            silent as f64 / 1000.0,
            // Cut off from its group, or outside its membership: left out of
            // routes while another member is not.
            if n.cut_off { "cut-off" } else { "in" }
        );
    }
    Ok(())
}

/// Topic name → the (cluster, broker group) pairs serving it, as the nodes
/// told the name server; `cluster` keeps only that cluster's. No I/O.
pub fn topics(
    nodes: &[ClusterNode],
    cluster: Option<&str>,
) -> BTreeMap<String, BTreeSet<(String, String)>> {
    let mut out: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for n in nodes.iter().filter_map(|n| n.node.as_ref()) {
        if cluster.is_some_and(|c| c != n.cluster) {
            continue;
        }
        for t in &n.topics {
            out.entry(t.name.clone())
                .or_default()
                .insert((n.cluster.clone(), n.broker_group.clone()));
        }
    }
    out
}

/// `topicList`: one topic per line (RocketMQ's output); with `-c`, the
/// cluster's topics only, each after its cluster and followed by the broker
/// groups serving it (where RocketMQ prints a consumer group). Error: a
/// cluster the name server does not know.
pub async fn topic_list(namesrv: &str, cluster: Option<&str>) -> Result<()> {
    let nodes = nodes(namesrv).await?;
    let topics = topics(&nodes, cluster);
    match cluster {
        None => topics.keys().for_each(|t| println!("{t}")),
        Some(c) => {
            if !nodes
                .iter()
                .any(|n| n.node.as_ref().is_some_and(|n| n.cluster == c))
            {
                bail!("the name server knows no cluster {c:?}");
            }
            println!("{:<20} {:<48} #Broker Names", "#Cluster Name", "#Topic");
            for (t, at) in topics {
                let groups: Vec<&str> = at.iter().map(|(_, g)| g.as_str()).collect();
                println!("{c:<20} {t:<48} {}", groups.join(","));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ledgermq_namesrv::pb::{BrokerNode, TopicConfig};

    fn node(cluster: &str, group: &str, topics: &[&str]) -> ClusterNode {
        ClusterNode {
            node: Some(BrokerNode {
                cluster: cluster.into(),
                broker_group: group.into(),
                topics: topics
                    .iter()
                    .map(|t| TopicConfig {
                        name: (*t).into(),
                        queue_count: 4,
                        perm: 6,
                        ..TopicConfig::default()
                    })
                    .collect(),
                ..BrokerNode::default()
            }),
            silent_ms: 0,
        }
    }

    #[test]
    fn topics_are_listed_once_with_the_groups_serving_them() {
        let nodes = [
            node("C", "a", &["T", "U"]),
            node("C", "a", &["T", "U"]),
            node("C", "b", &["T"]),
            node("D", "x", &["V"]),
        ];
        let all = topics(&nodes, None);
        assert_eq!(all.keys().collect::<Vec<_>>(), ["T", "U", "V"]);
        let groups: Vec<&str> = all["T"].iter().map(|(_, g)| g.as_str()).collect();
        assert_eq!(groups, ["a", "b"]);
        assert_eq!(topics(&nodes, Some("D")).keys().collect::<Vec<_>>(), ["V"]);
    }
}
