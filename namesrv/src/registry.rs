//! The route registry: what the name server knows of broker nodes, and the routes it
//! derives. Plain data and functions: the caller passes the clock in.

use std::collections::BTreeMap;

use crate::pb::{BrokerNode, ClusterNode, GroupRoute, Member, QueryRouteResponse, Role};

type NodeKey = (String, String, u64);

#[derive(Debug, Clone)]
struct Seen {
    node: BrokerNode,
    last_ms: u64,
}

/// Every node that registered and has not expired.
#[derive(Debug, Default)]
pub struct Registry {
    nodes: BTreeMap<NodeKey, Seen>,
}

impl Registry {
    /// Records a registration or heartbeat of `node` at `now_ms`.
    pub fn register(&mut self, node: BrokerNode, now_ms: u64) {
        let key = (
            node.cluster.clone(),
            node.broker_group.clone(),
            node.node_id,
        );
        self.nodes.insert(
            key,
            Seen {
                node,
                last_ms: now_ms,
            },
        );
    }

    /// Forgets a node (it shut down).
    pub fn unregister(&mut self, cluster: &str, group: &str, node_id: u64) -> bool {
        self.nodes
            .remove(&(cluster.to_owned(), group.to_owned(), node_id))
            .is_some()
    }

    /// Drops nodes silent for longer than `expiry_ms`; returns them.
    pub fn expire(&mut self, now_ms: u64, expiry_ms: u64) -> Vec<BrokerNode> {
        let dead: Vec<NodeKey> = self
            .nodes
            .iter()
            .filter(|(_, s)| now_ms.saturating_sub(s.last_ms) > expiry_ms)
            .map(|(k, _)| k.clone())
            .collect();
        dead.into_iter()
            .filter_map(|k| self.nodes.remove(&k))
            .map(|s| s.node)
            .collect()
    }

    /// The route of `topic`: every broker group one of whose nodes serves it, with the
    /// group's leader and the topic's config.
    ///
    /// The leader is the node claiming leadership with the highest term, unless a
    /// majority of the group's members already report a higher term (the claim is
    /// from before an election that node has not heard of, e.g. it crashed). One
    /// partitioned candidate raising its term alone does not unseat a leader. The
    /// config is the leader's; without a leader, the one of the node with the highest
    /// (term, commit index). Members that report themselves cut off from their group
    /// are left out (and never the leader), unless every member is cut off.
    pub fn route(&self, topic: &str, now_ms: u64) -> QueryRouteResponse {
        let mut out = Vec::new();
        for ((cluster, group), all) in self.by_group() {
            let (leader, members) = leader_and_members(&all);
            let config = leader
                .and_then(|l| l.node.topics.iter().find(|t| t.name == topic))
                .or_else(|| {
                    members
                        .iter()
                        .filter_map(|s| {
                            s.node
                                .topics
                                .iter()
                                .find(|t| t.name == topic)
                                .map(|t| (s, t))
                        })
                        .max_by_key(|(s, _)| (s.node.term, s.node.commit_index))
                        .map(|(_, t)| t)
                })
                .cloned();
            let Some(config) = config else { continue };
            let mut g = group_route(cluster, group, leader, &members, now_ms);
            g.queue_count = config.queue_count;
            g.perm = config.perm;
            g.message_type = config.message_type;
            out.push(g);
        }
        QueryRouteResponse {
            found: !out.is_empty(),
            topic: topic.to_owned(),
            groups: out,
        }
    }

    /// Every topic some registered node serves.
    pub fn topics(&self) -> std::collections::BTreeSet<String> {
        self.nodes
            .values()
            .flat_map(|s| s.node.topics.iter().map(|t| t.name.clone()))
            .collect()
    }

    /// Every broker group as a route shows it (leader, members), whatever
    /// topics it serves; queue count, permission and type are left unset.
    pub fn groups(&self, now_ms: u64) -> Vec<GroupRoute> {
        let mut out = Vec::new();
        for ((cluster, group), all) in self.by_group() {
            let (leader, members) = leader_and_members(&all);
            out.push(group_route(cluster, group, leader, &members, now_ms));
        }
        out
    }

    /// Every registered node with how long it has been silent.
    pub fn cluster(&self, now_ms: u64) -> Vec<ClusterNode> {
        self.nodes
            .values()
            .map(|s| ClusterNode {
                node: Some(s.node.clone()),
                silent_ms: now_ms.saturating_sub(s.last_ms),
            })
            .collect()
    }
}

impl Registry {
    fn by_group(&self) -> BTreeMap<(&str, &str), Vec<&Seen>> {
        let mut groups: BTreeMap<(&str, &str), Vec<&Seen>> = BTreeMap::new();
        for ((cluster, group, _), s) in &self.nodes {
            groups.entry((cluster, group)).or_default().push(s);
        }
        groups
    }
}

/// A group's leader and the members routes show (see [`Registry::route`]).
fn leader_and_members<'a>(all: &[&'a Seen]) -> (Option<&'a Seen>, Vec<&'a Seen>) {
    let majority = all.len() / 2 + 1;
    // Nodes cut off from their group refuse writes: leave them out, unless
    // every member is (then nothing better is known).
    let members: Vec<&Seen> = if all.iter().all(|s| s.node.cut_off) {
        all.to_vec()
    } else {
        all.iter().copied().filter(|s| !s.node.cut_off).collect()
    };
    let leader = members
        .iter()
        .copied()
        .filter(|s| s.node.role == Role::Leader as i32 && !s.node.cut_off)
        .max_by_key(|s| (s.node.term, s.node.commit_index))
        .filter(|l| all.iter().filter(|m| m.node.term > l.node.term).count() < majority);
    (leader, members)
}

/// A group's route without a topic's config (queue count, perm, type unset).
fn group_route(
    cluster: &str,
    group: &str,
    leader: Option<&Seen>,
    members: &[&Seen],
    now_ms: u64,
) -> GroupRoute {
    GroupRoute {
        cluster: cluster.to_owned(),
        broker_group: group.to_owned(),
        leader_node_id: leader.map_or(0, |l| l.node.node_id),
        leader_addr: leader.map_or(String::new(), |l| l.node.client_addr.clone()),
        leader_term: leader.map_or(0, |l| l.node.term),
        has_leader: leader.is_some(),
        members: members
            .iter()
            .map(|s| Member {
                node_id: s.node.node_id,
                client_addr: s.node.client_addr.clone(),
                role: s.node.role,
                term: s.node.term,
                commit_index: s.node.commit_index,
                silent_ms: now_ms.saturating_sub(s.last_ms),
                cut_off: s.node.cut_off,
                remoting_addr: s.node.remoting_addr.clone(),
            })
            .collect(),
        queue_count: 0,
        perm: 0,
        message_type: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::{MessageType, TopicConfig};

    fn node(group: &str, id: u64, role: Role, term: u64, topics: &[(&str, u32)]) -> BrokerNode {
        BrokerNode {
            cluster: "C".into(),
            broker_group: group.into(),
            node_id: id,
            client_addr: format!("127.0.0.1:{}", 8080 + id),
            role: role as i32,
            term,
            commit_index: 0,
            cut_off: false,
            remoting_addr: String::new(),
            member_addr: String::new(),
            topics: topics
                .iter()
                .map(|(n, q)| TopicConfig {
                    name: n.to_string(),
                    queue_count: *q,
                    perm: 6,
                    message_type: MessageType::Normal as i32,
                })
                .collect(),
        }
    }

    #[test]
    fn the_leader_with_the_highest_term_wins() {
        let mut r = Registry::default();
        r.register(node("g1", 0, Role::Leader, 3, &[("T", 4)]), 0);
        r.register(node("g1", 1, Role::Leader, 5, &[("T", 4)]), 0);
        r.register(node("g1", 2, Role::Follower, 5, &[("T", 4)]), 0);
        let route = r.route("T", 10);
        assert!(route.found);
        assert_eq!(route.groups.len(), 1);
        let g = &route.groups[0];
        assert_eq!(
            (g.leader_node_id, g.leader_term, g.leader_addr.as_str()),
            (1, 5, "127.0.0.1:8081")
        );
        assert_eq!(g.members.len(), 3);
        assert_eq!(g.members[0].silent_ms, 10);
    }

    #[test]
    fn routes_span_groups_and_use_the_newest_config() {
        let mut r = Registry::default();
        r.register(node("g1", 0, Role::Leader, 2, &[("T", 4)]), 0);
        r.register(node("g1", 1, Role::Follower, 1, &[("T", 2)]), 0);
        r.register(node("g2", 0, Role::Candidate, 7, &[("T", 8), ("U", 1)]), 0);
        let route = r.route("T", 0);
        assert_eq!(route.groups.len(), 2);
        assert_eq!(route.groups[0].queue_count, 4, "the highest term's config");
        assert!(!route.groups[1].has_leader);
        assert_eq!(route.groups[1].queue_count, 8);
        assert!(!r.route("nope", 0).found);
    }

    #[test]
    fn a_stale_leader_claim_is_dropped_once_a_majority_moved_on() {
        let mut r = Registry::default();
        r.register(node("g1", 0, Role::Leader, 3, &[("T", 4)]), 0);
        r.register(node("g1", 1, Role::Follower, 3, &[("T", 4)]), 0);
        r.register(node("g1", 2, Role::Candidate, 9, &[("T", 4)]), 0);
        // One partitioned candidate with a high term does not unseat the leader.
        assert_eq!(r.route("T", 0).groups[0].leader_node_id, 0);
        // A majority at a higher term: the old claim is stale, no leader until the new
        // one announces itself.
        r.register(node("g1", 1, Role::Candidate, 4, &[("T", 4)]), 0);
        assert!(!r.route("T", 0).groups[0].has_leader);
        r.register(node("g1", 1, Role::Leader, 4, &[("T", 4)]), 0);
        assert_eq!(r.route("T", 0).groups[0].leader_node_id, 1);
    }

    #[test]
    fn cut_off_nodes_are_left_out_of_routes() {
        let mut r = Registry::default();
        let mut old = node("g1", 0, Role::Leader, 3, &[("T", 4)]);
        old.cut_off = true;
        r.register(old, 0);
        r.register(node("g1", 1, Role::Follower, 3, &[("T", 4)]), 0);
        r.register(node("g1", 2, Role::Follower, 3, &[("T", 4)]), 0);
        // A leader cut off from its group is no leader to route to, nor a member.
        let g = &r.route("T", 0).groups[0];
        assert!(!g.has_leader, "{g:?}");
        let ids: Vec<_> = g.members.iter().map(|m| m.node_id).collect();
        assert_eq!(ids, [1, 2]);
        // If every member is cut off, all are listed (nothing better is known).
        for id in 1..3 {
            let mut n = node("g1", id, Role::Follower, 3, &[("T", 4)]);
            n.cut_off = true;
            r.register(n, 0);
        }
        assert_eq!(r.route("T", 0).groups[0].members.len(), 3);
    }

    #[test]
    fn silent_nodes_expire_and_unregister_removes() {
        let mut r = Registry::default();
        r.register(node("g1", 0, Role::Leader, 1, &[("T", 1)]), 0);
        r.register(node("g1", 1, Role::Follower, 1, &[("T", 1)]), 100_000);
        assert!(r.expire(119_000, 120_000).is_empty());
        let gone = r.expire(121_000, 120_000);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].node_id, 0);
        assert!(!r.route("T", 121_000).groups[0].has_leader);
        assert!(r.unregister("C", "g1", 1));
        assert!(!r.route("T", 0).found);
        assert!(r.cluster(0).is_empty());
    }
}
