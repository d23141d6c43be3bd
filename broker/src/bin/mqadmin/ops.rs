//! `transferLeader`, `brokerStatus`, `getBrokerConfig` and
//! `consumerConnection`: a broker group's leadership, each node's own status
//! and effective configuration, and the consumers connected to the nodes.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Result};
use ledgermq_broker::admin_pb::{
    BrokerStatusRequest, ConsumerConnectionRequest, ConsumerConnectionResponse,
    GetBrokerConfigRequest, KeyValues, TransferLeaderRequest,
};

type Client = crate::cluster::AdminClient;

async fn admin(addr: &str, call_timeout: Duration) -> Result<Client> {
    Ok(crate::cluster::admin_client(
        crate::cluster::channel(addr, Some(call_timeout)).await?,
    ))
}

/// Asks group `group`'s leader (the first of `members`, client addresses,
/// that says it leads) to hand leadership to `target` (or the most caught-up
/// follower); prints the new leader. A member that does not answer, or does
/// not lead, is passed over for the next.
pub async fn transfer_leader(
    group: &str,
    members: &[String],
    target: Option<u64>,
    timeout: Duration,
) -> Result<()> {
    let mut tried = Vec::new();
    for addr in members {
        let answer = async {
            let mut c = admin(addr, timeout + Duration::from_secs(5)).await?;
            anyhow::Ok(
                c.transfer_leader(TransferLeaderRequest {
                    target_node_id: target,
                    timeout_ms: timeout.as_millis() as u64,
                })
                .await?
                .into_inner(),
            )
        }
        .await;
        let r = match answer {
            Ok(r) => r,
            Err(e) => {
                tried.push(format!("{addr}: {e}"));
                continue;
            }
        };
        if r.not_leader {
            let hint = r
                .leader_id
                .map_or(String::new(), |l| format!(" (it names node {l})"));
            tried.push(format!("{addr}: not the leader{hint}"));
            continue;
        }
        if !r.error.is_empty() {
            bail!("{group}: {addr}: {}", r.error);
        }
        match r.leader_id {
            Some(l) => println!("{group}: leadership handed over to node {l}"),
            None => println!("{group}: leadership handed over"),
        }
        return Ok(());
    }
    bail!(
        "{group}: no member took the hand-over: {}",
        tried.join("; ")
    )
}

/// Prints `answers` (one per node: node id, address, its key/value pairs or
/// why it did not answer) as RocketMQ prints brokerStatus: `key : value`
/// lines under a header per node. Error: a node that did not answer.
fn print_key_values(answers: Vec<(String, String, Result<KeyValues>)>) -> Result<()> {
    let mut failed = 0;
    for (group, addr, answer) in answers {
        match answer {
            Ok(kv) => {
                println!("# {group} node {} ({addr})", kv.node_id);
                let width = kv.entries.iter().map(|e| e.key.len()).max().unwrap_or(0);
                for e in kv.entries {
                    println!("{:<width$} : {}", e.key, e.value);
                }
            }
            Err(e) => {
                failed += 1;
                println!("# {group} {addr}: no answer: {e}");
            }
        }
        println!();
    }
    if failed > 0 {
        bail!("{failed} node(s) did not answer");
    }
    Ok(())
}

/// Which node-local call to make.
pub enum NodeCall {
    /// BrokerStatus.
    Status,
    /// GetBrokerConfig.
    Config,
}

/// Makes `call` of every node of `groups` (name → client addresses) and
/// prints the answers.
pub async fn each_node(groups: BTreeMap<String, Vec<String>>, call: NodeCall) -> Result<()> {
    let mut answers = Vec::new();
    for (group, members) in groups {
        for addr in members {
            let answer = async {
                let mut c = admin(&addr, Duration::from_secs(10)).await?;
                Ok(match call {
                    NodeCall::Status => c.broker_status(BrokerStatusRequest {}).await?,
                    NodeCall::Config => c.get_broker_config(GetBrokerConfigRequest {}).await?,
                }
                .into_inner())
            }
            .await;
            answers.push((group.clone(), addr, answer));
        }
    }
    print_key_values(answers)
}

/// One consumer as `consumerConnection` prints it: merged over the nodes it
/// is connected to.
#[derive(Debug, Default, PartialEq)]
pub struct Consumer {
    /// `gRPC 5.x` or `remoting 4.x`.
    pub protocol: String,
    /// Its language and version, as it says them.
    pub language: String,
    /// Its version.
    pub version: String,
    /// Its address, as the first node that lists it saw it.
    pub addr: String,
    /// The nodes it is connected to, `group/node`.
    pub nodes: Vec<String>,
    /// Least time since a node heard from it, in ms.
    pub idle_ms: u64,
}

/// Merges node answers (broker group, ConsumerConnection answer) by client
/// id. No I/O.
pub fn merge_connections(
    answers: Vec<(String, ConsumerConnectionResponse)>,
) -> BTreeMap<String, Consumer> {
    let mut out: BTreeMap<String, Consumer> = BTreeMap::new();
    for (group, r) in answers {
        for c in r.connections {
            let e = out.entry(c.client_id).or_insert_with(|| Consumer {
                protocol: c.protocol,
                language: c.language,
                version: c.version,
                addr: c.addr,
                idle_ms: u64::MAX,
                nodes: Vec::new(),
            });
            e.nodes.push(format!("{group}/{}", r.node_id));
            e.idle_ms = e.idle_ms.min(c.idle_ms);
        }
    }
    out
}

/// `consumerConnection`: the consumers of consumer group `consumer_group`
/// connected to any node of `groups` (name → client addresses). Error: none
/// is (RocketMQ: the group is not online), or a node did not answer.
pub async fn consumer_connection(
    groups: BTreeMap<String, Vec<String>>,
    consumer_group: &str,
) -> Result<()> {
    let mut answers = Vec::new();
    let mut silent = Vec::new();
    for (group, members) in groups {
        for addr in members {
            let answer = async {
                let mut c = admin(&addr, Duration::from_secs(10)).await?;
                anyhow::Ok(
                    c.consumer_connection(ConsumerConnectionRequest {
                        group: consumer_group.to_owned(),
                    })
                    .await?
                    .into_inner(),
                )
            }
            .await;
            match answer {
                Ok(r) => answers.push((group.clone(), r)),
                Err(e) => silent.push(format!("{group} {addr}: {e}")),
            }
        }
    }
    let merged = merge_connections(answers);
    for s in &silent {
        println!("no answer: {s}");
    }
    if merged.is_empty() {
        bail!("the consumer group {consumer_group} has no consumer connected to any node");
    }
    println!(
        "{:<40} {:<13} {:<8} {:<8} {:<22} {:>8}  #Nodes",
        "#ClientId", "#Protocol", "#Language", "#Version", "#Address", "#Idle"
    );
    for (id, c) in &merged {
        println!(
            "{id:<40} {:<13} {:<8} {:<8} {:<22} {:>7.1}s  {}",
            c.protocol,
            c.language,
            c.version,
            c.addr,
            c.idle_ms as f64 / 1000.0,
            c.nodes.join(",")
        );
    }
    if !silent.is_empty() {
        bail!("{} node(s) did not answer", silent.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ledgermq_broker::admin_pb::ConsumerConnection;

    fn conn(id: &str, idle_ms: u64) -> ConsumerConnection {
        ConsumerConnection {
            client_id: id.into(),
            protocol: "remoting 4.x".into(),
            language: "CPP".into(),
            version: "399".into(),
            addr: "10.0.0.9:4000".into(),
            idle_ms,
        }
    }

    #[test]
    fn a_consumer_connected_to_several_nodes_is_listed_once() {
        let answer = |node_id, conns| ConsumerConnectionResponse {
            node_id,
            connections: conns,
        };
        let m = merge_connections(vec![
            (
                "broker-a".into(),
                answer(0, vec![conn("c1", 900), conn("c2", 10)]),
            ),
            ("broker-a".into(), answer(1, vec![conn("c1", 300)])),
        ]);
        assert_eq!(m.len(), 2);
        assert_eq!(m["c1"].nodes, ["broker-a/0", "broker-a/1"]);
        assert_eq!(m["c1"].idle_ms, 300);
        assert_eq!(m["c2"].nodes, ["broker-a/0"]);
    }
}
