//! `transferLeader`, `brokerStatus` and `getBrokerConfig`: a broker group's
//! leadership, and each node's own status and effective configuration.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Result};
use ledgermq_broker::admin_pb::broker_admin_client::BrokerAdminClient;
use ledgermq_broker::admin_pb::{
    BrokerStatusRequest, GetBrokerConfigRequest, KeyValues, TransferLeaderRequest,
};

type Client = BrokerAdminClient<tonic::transport::Channel>;

async fn admin(addr: &str, call_timeout: Duration) -> Result<Client> {
    Ok(BrokerAdminClient::new(
        crate::cluster::channel(addr, Some(call_timeout)).await?,
    ))
}

/// Asks group `group`'s leader (the first of `members`, client addresses,
/// that says it leads) to hand leadership to `target` (or the most caught-up
/// follower); prints the new leader.
pub async fn transfer_leader(
    group: &str,
    members: &[String],
    target: Option<u64>,
    timeout: Duration,
) -> Result<()> {
    let mut tried = Vec::new();
    for addr in members {
        let mut c = match admin(addr, timeout + Duration::from_secs(5)).await {
            Ok(c) => c,
            Err(e) => {
                tried.push(format!("{addr}: {e}"));
                continue;
            }
        };
        let r = c
            .transfer_leader(TransferLeaderRequest {
                target_node_id: target,
                timeout_ms: timeout.as_millis() as u64,
            })
            .await?
            .into_inner();
        if r.not_leader {
            tried.push(format!("{addr}: not the leader"));
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
