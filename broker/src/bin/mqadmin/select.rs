//! Which broker groups and nodes a command goes to, from what the name
//! servers know.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use ledgermq_namesrv::pb::{BrokerNode, QueryRouteRequest, Role};

use crate::cluster::{self, client};

/// Which broker groups a change goes to (all the name server knows by default).
#[derive(clap::Args, Default)]
pub struct Scope {
    /// Only broker groups of this cluster.
    #[arg(short = 'c', long = "clusterName")]
    pub cluster: Option<String>,
    /// Only this broker group.
    #[arg(short = 'b', long = "brokerName")]
    pub broker_group: Option<String>,
}

/// Every node the name servers know of each broker group in `scope`. Error:
/// none.
async fn selected(namesrv: &str, scope: &Scope) -> Result<BTreeMap<String, Vec<BrokerNode>>> {
    let mut out: BTreeMap<String, Vec<BrokerNode>> = BTreeMap::new();
    for n in cluster::nodes(namesrv)
        .await?
        .into_iter()
        .filter_map(|n| n.node)
    {
        let in_scope = scope.cluster.as_ref().is_none_or(|c| *c == n.cluster)
            && scope
                .broker_group
                .as_ref()
                .is_none_or(|g| *g == n.broker_group);
        if in_scope {
            out.entry(n.broker_group.clone()).or_default().push(n);
        }
    }
    if out.is_empty() {
        bail!("the name server knows no broker group matching the scope");
    }
    Ok(out)
}

/// Each selected broker group with its members' client addresses, leader first.
pub async fn groups(namesrv: &str, scope: &Scope) -> Result<BTreeMap<String, Vec<String>>> {
    Ok(selected(namesrv, scope)
        .await?
        .into_iter()
        .map(|(g, nodes)| {
            let mut m: Vec<(bool, String)> = nodes
                .iter()
                .map(|n| {
                    (
                        n.role != Role::Leader as i32,
                        cluster::member_addr(n).to_owned(),
                    )
                })
                .collect();
            m.sort();
            (g, m.into_iter().map(|(_, a)| a).collect())
        })
        .collect())
}

/// Each selected broker group with the id and client address of each node the
/// name servers know of it, in id order.
pub async fn group_nodes(
    namesrv: &str,
    scope: &Scope,
) -> Result<BTreeMap<String, Vec<(u64, String)>>> {
    Ok(selected(namesrv, scope)
        .await?
        .into_iter()
        .map(|(g, nodes)| {
            let mut m: Vec<(u64, String)> = nodes
                .iter()
                .map(|n| (n.node_id, cluster::member_addr(n).to_owned()))
                .collect();
            m.sort();
            (g, m)
        })
        .collect())
}

/// The client addresses of broker group `group`'s members, leader first.
pub async fn group_members(namesrv: &str, group: &str) -> Result<Vec<String>> {
    let scope = Scope {
        cluster: None,
        broker_group: Some(group.to_owned()),
    };
    Ok(groups(namesrv, &scope)
        .await?
        .remove(group)
        .unwrap_or_default())
}

/// The selected broker groups ([`groups`]) that serve `topic`, as its route at
/// the name server says. Error: none of them does.
pub async fn topic_groups(
    namesrv: &str,
    scope: &Scope,
    topic: &str,
) -> Result<BTreeMap<String, Vec<String>>> {
    let route = client(namesrv)
        .await?
        .query_route(QueryRouteRequest {
            topic: topic.to_owned(),
        })
        .await?
        .into_inner();
    let serving: std::collections::BTreeSet<String> =
        route.groups.into_iter().map(|g| g.broker_group).collect();
    let mut selected = groups(namesrv, scope).await?;
    selected.retain(|g, _| serving.contains(g));
    if selected.is_empty() {
        bail!("topic {topic} is not served by any broker group in the scope");
    }
    Ok(selected)
}
