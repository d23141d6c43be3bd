//! `mqadmin`: administration commands, RocketMQ style.
//!
//! - `clusterList -n NAMESRV`: one line per node: client address, role, term, commit
//!   (applied) index, seconds since its last heartbeat.
//! - `topicRoute -n NAMESRV -t TOPIC`: the topic's broker groups, queues and leaders.
//!
//! `updateTopic` and `updateSubGroup` arrive with the broker's client service
//! (issue 5). `-n` takes one name server (`host:port`) or several separated by `;`.

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use ledgermq_namesrv::pb::name_server_client::NameServerClient;
use ledgermq_namesrv::pb::{ListClusterRequest, QueryRouteRequest, Role};

#[derive(Parser)]
#[command(
    name = "mqadmin",
    about = "LedgerMQ administration (RocketMQ mqadmin subset)"
)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// List every broker node the name server knows.
    #[command(name = "clusterList")]
    ClusterList {
        /// Name server address(es), `host:port[;host:port...]`.
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
    },
    /// Show where a topic's queues live and who leads each group.
    #[command(name = "topicRoute")]
    TopicRoute {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        /// Topic.
        #[arg(short = 't', long = "topic")]
        topic: String,
    },
}

fn role_name(r: i32) -> &'static str {
    match Role::try_from(r) {
        Ok(Role::Leader) => "leader",
        Ok(Role::Follower) => "follower",
        Ok(Role::Candidate) => "candidate",
        Ok(Role::Learner) => "learner",
        _ => "unknown",
    }
}

async fn client(namesrv: &str) -> Result<NameServerClient<tonic::transport::Channel>> {
    let mut last = None;
    for addr in namesrv.split(';').map(str::trim).filter(|a| !a.is_empty()) {
        match NameServerClient::connect(format!("http://{addr}")).await {
            Ok(c) => return Ok(c),
            Err(e) => last = Some(format!("{addr}: {e}")),
        }
    }
    bail!(
        "no name server reachable ({})",
        last.unwrap_or_else(|| "none given".into())
    )
}

#[tokio::main]
async fn main() -> Result<()> {
    match Args::parse().cmd {
        Cmd::ClusterList { namesrv } => {
            let nodes = client(&namesrv)
                .await?
                .list_cluster(ListClusterRequest {})
                .await?
                .into_inner()
                .nodes;
            println!(
                "{:<16} {:<12} {:<5} {:<22} {:<10} {:>6} {:>12} {:>8}",
                "cluster", "group", "node", "address", "role", "term", "commit", "silent"
            );
            for n in nodes {
                let (silent, n) = (n.silent_ms, n.node.unwrap_or_default());
                println!(
                    "{:<16} {:<12} {:<5} {:<22} {:<10} {:>6} {:>12} {:>7.1}s",
                    n.cluster,
                    n.broker_group,
                    n.node_id,
                    n.client_addr,
                    role_name(n.role),
                    n.term,
                    n.commit_index,
                    silent as f64 / 1000.0
                );
            }
        }
        Cmd::TopicRoute { namesrv, topic } => {
            let r = client(&namesrv)
                .await?
                .query_route(QueryRouteRequest {
                    topic: topic.clone(),
                })
                .await?
                .into_inner();
            if !r.found {
                bail!("topic {topic} is not served by any broker group");
            }
            for g in r.groups {
                let leader = if g.has_leader {
                    g.leader_addr.clone()
                } else {
                    "(none)".into()
                };
                println!(
                    "topic {topic} group {} cluster {}: {} queues, perm {}, leader {} (node {}, term {})",
                    g.broker_group, g.cluster, g.queue_count, g.perm, leader, g.leader_node_id, g.leader_term
                );
                for m in g.members {
                    println!(
                        "  node {} {} {} term {} commit {}",
                        m.node_id,
                        m.client_addr,
                        role_name(m.role),
                        m.term,
                        m.commit_index
                    );
                }
            }
        }
    }
    Ok(())
}
