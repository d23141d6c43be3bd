//! The name server's side of the 4.x remoting protocol (what a 4.x client asks
//! at start and every 30 s; `../shared/docs/rocketmq-remoting.md` §1.2-1.3),
//! answered from the [`Registry`] with no I/O:
//!
//! - GET_ROUTEINFO_BY_TOPIC (105): `TopicRouteData` with each broker group as
//!   a broker name, its leader as broker id 0 and each member (the leader too;
//!   the others if heard from lately) as its node id + 1 ([`broker_addrs`]), at
//!   their remoting addresses; groups
//!   whose nodes serve no remoting port are left out. Map keys are quoted
//!   (standard JSON), which every client reads. TOPIC_NOT_EXIST when no group
//!   serves the topic. A writable group of a topic that is neither FIFO nor
//!   MIXED also gets a write-only [failover alias](failover_alias).
//!
//! **Failover alias.** A 4.x producer sends only to broker id 0 of a broker
//! name, and learns a new leader only at its next route refresh (every 30 s):
//! after a leader dies, every send to that broker name fails until then. It
//! does retry a failed send at once on a queue of *another* broker name (the
//! C++ core makes up to 5 attempts, Java's `DefaultMQProducer` 3). So such a
//! group `G` is also listed as `G@1`, at a follower of the route (the one
//! with the lowest node id heard from lately), with the same queue ids and
//! permission WRITE only:
//! consumers subscribe to readable queues only and never take its queues, and
//! a send to queue `q` of `G@1` is stored in queue `q` of the topic like any
//! other (any node takes a send and passes it to the leader). When the leader
//! dies, the retry of a send to `G` reaches `G@1`'s follower, which holds it
//! until the election is over; when that follower dies, the retry goes to `G`.
//! The price: half of a 4.x producer's round-robin sends go through a
//! follower. Per-key order across a failover: a retried keyed send (the C++
//! core's `send_orderly` retries) moves to another broker name's queue, as it
//! would in a RocketMQ cluster of several masters; FIFO (and MIXED) topics get
//! no alias, so there a keyed send stays on its queue and waits for the route
//! refresh. An alias whose name another group of the route has is left out.
//! - GET_BROKER_CLUSTER_INFO (106): `ClusterInfo`.
//! - GET_ALL_TOPIC_LIST_FROM_NAMESERVER (206): `TopicList`.
//! - GET_KV_CONFIG (101): QUERY_NOT_FOUND (this name server keeps no KV
//!   config; clients ask for `ORDER_TOPIC_CONFIG` and go on without it).
//! - Anything else: REQUEST_CODE_NOT_SUPPORTED.

use std::collections::BTreeMap;

use ledgermq_remoting::codes::{request, response};
use ledgermq_remoting::RemotingCommand;
use serde::Serialize;

use crate::pb::GroupRoute;
use crate::registry::Registry;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct QueueData<'a> {
    broker_name: &'a str,
    read_queue_nums: u32,
    write_queue_nums: u32,
    perm: u32,
    topic_sys_flag: u32,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BrokerData<'a> {
    cluster: &'a str,
    broker_name: &'a str,
    broker_addrs: BTreeMap<String, String>,
    enable_acting_master: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TopicRouteData<'a> {
    order_topic_conf: Option<String>,
    queue_datas: Vec<QueueData<'a>>,
    broker_datas: Vec<BrokerData<'a>>,
    filter_server_table: BTreeMap<String, Vec<String>>,
}

/// Broker id → remoting address of one group: the leader as 0, and every
/// member as its node id + 1 (its *member id*), the leader too when
/// `leader_member_id` (topic routes, which consumers read). A member keeps its
/// member id whichever member leads, so a broker's pull answer can name one
/// (`suggestWhichBrokerId`, `broker/src/remoting/pull.rs`) that a consumer's
/// route lists whether it was fetched before or after an election. Members
/// without a remoting address are left out, and so are members other than the
/// leader not heard from within [`STALE_MEMBER_MS`] while the group has a
/// leader (a consumer told to pull from one then pulls from another member).
fn broker_addrs(g: &GroupRoute, leader_member_id: bool) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for m in g.members.iter().filter(|m| !m.remoting_addr.is_empty()) {
        let leads = g.has_leader && m.node_id == g.leader_node_id;
        if leads {
            out.insert("0".to_owned(), m.remoting_addr.clone());
            if !leader_member_id {
                continue;
            }
        } else if g.has_leader && m.silent_ms > STALE_MEMBER_MS {
            continue;
        }
        out.insert((m.node_id + 1).to_string(), m.remoting_addr.clone());
    }
    out
}

/// Permission bits (RocketMQ's `PermName`): WRITE.
const PERM_WRITE: u32 = 2;

/// A member other than the leader silent for longer than this is left out of a
/// group with a leader ([`broker_addrs`]): three of the brokers' default 3 s
/// name server heartbeats, as the brokers' own routes judge staleness. Brokers
/// configured to heartbeat every 9 s or less often drop out of routes for part
/// of each period: their consumers then pull from the leader, and the group
/// may lose its alias meanwhile.
const STALE_MEMBER_MS: u64 = 9_000;

/// The failover alias of group `g` for a topic of type `message_type`, whose
/// broker ids map to `addrs` (see the module doc): `(G@1, address)` at the
/// lowest broker id above 0 heard from lately, else at the lowest one, never
/// at the leader's address; none for a FIFO or MIXED topic, a topic without
/// WRITE, or a group with no member but the leader.
fn failover_alias(g: &GroupRoute, addrs: &BTreeMap<String, String>) -> Option<(String, String)> {
    use crate::pb::MessageType;
    if g.perm & PERM_WRITE == 0
        || [MessageType::Fifo as i32, MessageType::Mixed as i32].contains(&g.message_type)
    {
        return None;
    }
    let mut others: Vec<(u64, &String)> = addrs
        .iter()
        .filter_map(|(id, a)| id.parse().ok().map(|id| (id, a)))
        .filter(|&(id, a)| id != 0 && Some(a) != addrs.get("0"))
        .collect();
    others.sort();
    let fresh = |addr: &String| {
        g.members
            .iter()
            .any(|m| &m.remoting_addr == addr && m.silent_ms <= STALE_MEMBER_MS)
    };
    let (_, addr) = others.iter().find(|(_, a)| fresh(a)).or(others.first())?;
    Some((format!("{}@1", g.broker_group), (*addr).clone()))
}

fn json_answer(req: &RemotingCommand, body: &impl Serialize) -> RemotingCommand {
    let mut r = RemotingCommand::response_to(req, response::SUCCESS, None);
    r.body = serde_json::to_vec(body).expect("route JSON");
    r
}

/// The answer to `req` at `now_ms` (see the module doc).
pub fn handle(registry: &Registry, req: &RemotingCommand, now_ms: u64) -> RemotingCommand {
    match req.code {
        request::GET_ROUTEINFO_BY_TOPIC => {
            let topic = req.ext_fields.get("topic").map_or("", String::as_str);
            let route = registry.route(topic, now_ms);
            let groups: Vec<(&GroupRoute, BTreeMap<String, String>)> = route
                .groups
                .iter()
                .map(|g| (g, broker_addrs(g, true)))
                .filter(|(_, addrs)| !addrs.is_empty())
                .collect();
            if groups.is_empty() {
                return RemotingCommand::response_to(
                    req,
                    response::TOPIC_NOT_EXIST,
                    Some(format!(
                        "No topic route info in name server for the topic: {topic}"
                    )),
                );
            }
            let aliases: Vec<(&GroupRoute, (String, String))> = groups
                .iter()
                .filter_map(|(g, addrs)| Some((*g, failover_alias(g, addrs)?)))
                .filter(|(_, (name, _))| !groups.iter().any(|(g, _)| &g.broker_group == name))
                .collect();
            let mut data = TopicRouteData {
                order_topic_conf: None,
                queue_datas: groups
                    .iter()
                    .map(|(g, _)| QueueData {
                        broker_name: &g.broker_group,
                        read_queue_nums: g.queue_count,
                        write_queue_nums: g.queue_count,
                        perm: g.perm,
                        topic_sys_flag: 0,
                    })
                    .collect(),
                broker_datas: groups
                    .iter()
                    .map(|(g, addrs)| BrokerData {
                        cluster: &g.cluster,
                        broker_name: &g.broker_group,
                        broker_addrs: addrs.clone(),
                        enable_acting_master: false,
                    })
                    .collect(),
                filter_server_table: BTreeMap::new(),
            };
            for (g, (name, addr)) in &aliases {
                data.queue_datas.push(QueueData {
                    broker_name: name,
                    read_queue_nums: 0,
                    write_queue_nums: g.queue_count,
                    perm: PERM_WRITE,
                    topic_sys_flag: 0,
                });
                data.broker_datas.push(BrokerData {
                    cluster: &g.cluster,
                    broker_name: name,
                    broker_addrs: BTreeMap::from([("0".to_owned(), addr.clone())]),
                    enable_acting_master: false,
                });
            }
            json_answer(req, &data)
        }
        request::GET_BROKER_CLUSTER_INFO => {
            #[derive(Serialize)]
            #[serde(rename_all = "camelCase")]
            struct ClusterInfo<'a> {
                broker_addr_table: BTreeMap<String, BrokerData<'a>>,
                cluster_addr_table: BTreeMap<String, Vec<String>>,
            }
            let groups = registry.groups(now_ms);
            let mut info = ClusterInfo {
                broker_addr_table: BTreeMap::new(),
                cluster_addr_table: BTreeMap::new(),
            };
            for g in &groups {
                let addrs = broker_addrs(g, false);
                if addrs.is_empty() {
                    continue;
                }
                info.cluster_addr_table
                    .entry(g.cluster.clone())
                    .or_default()
                    .push(g.broker_group.clone());
                info.broker_addr_table.insert(
                    g.broker_group.clone(),
                    BrokerData {
                        cluster: &g.cluster,
                        broker_name: &g.broker_group,
                        broker_addrs: addrs,
                        enable_acting_master: false,
                    },
                );
            }
            json_answer(req, &info)
        }
        request::GET_ALL_TOPIC_LIST_FROM_NAMESERVER => {
            #[derive(Serialize)]
            #[serde(rename_all = "camelCase")]
            struct TopicList {
                topic_list: Vec<String>,
                broker_addr: Option<String>,
            }
            json_answer(
                req,
                &TopicList {
                    topic_list: registry.topics().into_iter().collect(),
                    broker_addr: None,
                },
            )
        }
        request::GET_KV_CONFIG => RemotingCommand::response_to(
            req,
            response::QUERY_NOT_FOUND,
            Some("No config item".into()),
        ),
        other => RemotingCommand::response_to(
            req,
            response::REQUEST_CODE_NOT_SUPPORTED,
            Some(format!("request code {other} not supported")),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::{BrokerNode, Role, TopicConfig};

    fn node(id: u64, role: Role, remoting: bool) -> BrokerNode {
        BrokerNode {
            cluster: "C".into(),
            broker_group: "g".into(),
            node_id: id,
            client_addr: format!("127.0.0.1:{}", 8081 + id),
            role: role as i32,
            term: 2,
            commit_index: 0,
            cut_off: false,
            member_addr: String::new(),
            topics: vec![TopicConfig {
                name: "T".into(),
                queue_count: 4,
                perm: 6,
                message_type: 1,
            }],
            remoting_addr: if remoting {
                format!("127.0.0.1:{}", 10911 + id)
            } else {
                String::new()
            },
        }
    }

    fn req(code: i32, fields: &[(&str, &str)]) -> RemotingCommand {
        let mut r = RemotingCommand::request(code, fields.iter().copied());
        r.opaque = 7;
        r
    }

    #[test]
    fn routes_name_the_leader_broker_zero_at_its_remoting_address() {
        let mut r = Registry::default();
        r.register(node(0, Role::Follower, true), 0);
        r.register(node(1, Role::Leader, true), 0);
        r.register(node(2, Role::Follower, true), 0);
        let a = handle(&r, &req(105, &[("topic", "T")]), 0);
        assert_eq!((a.code, a.opaque, a.is_response()), (0, 7, true));
        let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(v["queueDatas"][0]["brokerName"], "g");
        assert_eq!(v["queueDatas"][0]["writeQueueNums"], 4);
        assert_eq!(v["queueDatas"][0]["perm"], 6);
        let addrs = &v["brokerDatas"][0]["brokerAddrs"];
        // The leader is 0 and, like every member, its node id + 1 too.
        assert_eq!(addrs["0"], "127.0.0.1:10912");
        assert_eq!(addrs["1"], "127.0.0.1:10911");
        assert_eq!(addrs["2"], "127.0.0.1:10912");
        assert_eq!(addrs["3"], "127.0.0.1:10913");
        assert_eq!(addrs.as_object().unwrap().len(), 4);
        assert_eq!(v["brokerDatas"][0]["cluster"], "C");
        // The failover alias: write-only, at broker id 1.
        let q = &v["queueDatas"][1];
        assert_eq!(q["brokerName"], "g@1");
        assert_eq!(
            (q["perm"].as_u64(), q["writeQueueNums"].as_u64()),
            (Some(2), Some(4))
        );
        assert_eq!(q["readQueueNums"], 0);
        let b = &v["brokerDatas"][1];
        assert_eq!(b["brokerName"], "g@1");
        assert_eq!(
            b["brokerAddrs"],
            serde_json::json!({ "0": "127.0.0.1:10911" })
        );
        assert_eq!(v["queueDatas"].as_array().unwrap().len(), 2);
        let missing = handle(&r, &req(105, &[("topic", "U")]), 0);
        assert_eq!(missing.code, response::TOPIC_NOT_EXIST);
        assert_eq!(handle(&r, &req(9999, &[]), 0).code, 3);
        assert_eq!(handle(&r, &req(101, &[]), 0).code, 22);
    }

    #[test]
    fn groups_without_remoting_are_left_out_and_a_leaderless_group_has_no_broker_zero() {
        let mut r = Registry::default();
        r.register(node(0, Role::Follower, true), 0);
        r.register(node(1, Role::Candidate, true), 0);
        let a = handle(&r, &req(105, &[("topic", "T")]), 0);
        let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        let addrs = v["brokerDatas"][0]["brokerAddrs"].as_object().unwrap();
        assert!(!addrs.contains_key("0"), "{addrs:?}");
        assert_eq!(addrs.len(), 2);
        // The alias still takes sends, at broker id 1.
        assert_eq!(v["brokerDatas"][1]["brokerAddrs"]["0"], "127.0.0.1:10911");
        let mut grpc_only = Registry::default();
        grpc_only.register(node(0, Role::Leader, false), 0);
        assert_eq!(
            handle(&grpc_only, &req(105, &[("topic", "T")]), 0).code,
            response::TOPIC_NOT_EXIST
        );
    }

    #[test]
    fn cluster_info_and_topic_list() {
        let mut r = Registry::default();
        r.register(node(0, Role::Leader, true), 0);
        let a = handle(&r, &req(106, &[]), 0);
        let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(v["clusterAddrTable"]["C"][0], "g");
        // The leader as 0 only: cluster info is for operators, not consumers.
        assert_eq!(
            v["brokerAddrTable"]["g"]["brokerAddrs"],
            serde_json::json!({"0": "127.0.0.1:10911"})
        );
        let t = handle(&r, &req(206, &[]), 0);
        let v: serde_json::Value = serde_json::from_slice(&t.body).unwrap();
        assert_eq!(v["topicList"][0], "T");
    }

    fn broker_names(r: &Registry, now_ms: u64) -> Vec<String> {
        let a = handle(r, &req(105, &[("topic", "T")]), now_ms);
        let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        v["brokerDatas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["brokerName"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn no_alias_for_a_group_of_one_a_read_only_fifo_or_mixed_topic_or_a_taken_name() {
        let mut r = Registry::default();
        r.register(node(0, Role::Leader, true), 0);
        assert_eq!(broker_names(&r, 0), ["g"]);
        for (perm, message_type) in [(4, 1), (6, 2), (6, 5)] {
            let mut r = Registry::default();
            for (id, role) in [(0, Role::Leader), (1, Role::Follower)] {
                let mut n = node(id, role, true);
                n.topics[0].perm = perm;
                n.topics[0].message_type = message_type;
                r.register(n, 0);
            }
            assert_eq!(
                broker_names(&r, 0),
                ["g"],
                "perm {perm} type {message_type}"
            );
        }
        let mut r = Registry::default();
        r.register(node(0, Role::Leader, true), 0);
        r.register(node(1, Role::Follower, true), 0);
        assert_eq!(broker_names(&r, 0), ["g", "g@1"]);
        // Node 0 leads, so member id 1 is the leader's address: the alias goes
        // to the follower's.
        let a = handle(&r, &req(105, &[("topic", "T")]), 0);
        let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(v["brokerDatas"][1]["brokerAddrs"]["0"], "127.0.0.1:10912");
        let mut taken = node(5, Role::Leader, true);
        taken.broker_group = "g@1".into();
        r.register(taken, 0);
        assert_eq!(broker_names(&r, 0), ["g", "g@1"], "the real group only");
    }

    #[test]
    fn a_member_not_heard_from_lately_is_left_out_and_gets_no_alias() {
        let mut r = Registry::default();
        r.register(node(0, Role::Follower, true), 0);
        r.register(node(1, Role::Leader, true), 20_000);
        r.register(node(2, Role::Follower, true), 20_000);
        let a = handle(&r, &req(105, &[("topic", "T")]), 20_000);
        let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        // Node 0 (broker id 1), silent for 20 s, is left out; the alias goes to
        // node 2 (broker id 3).
        let addrs = &v["brokerDatas"][0]["brokerAddrs"];
        assert_eq!(
            addrs,
            &serde_json::json!({"0": "127.0.0.1:10912", "2": "127.0.0.1:10912", "3": "127.0.0.1:10913"})
        );
        assert_eq!(v["brokerDatas"][1]["brokerName"], "g@1");
        assert_eq!(v["brokerDatas"][1]["brokerAddrs"]["0"], "127.0.0.1:10913");
        // Only the leader heard from lately: no alias (never at the leader).
        let a = handle(&r, &req(105, &[("topic", "T")]), 40_000);
        let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(v["brokerDatas"].as_array().unwrap().len(), 1, "{v}");
    }
}
