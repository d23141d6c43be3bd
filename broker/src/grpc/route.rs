//! QueryRoute and QueryAssignment: 5.x routes for clients from the name servers'
//! view (or this group's own, for a topic they do not know yet).
//!
//! Each broker group appears as `Broker{name: group, id: 0}`. Every member accepts
//! every call, so routes name all members, and a client whose connection to the
//! old leader breaks carries on through another member without waiting for its
//! next route refresh (the Rust client caches a route for its whole life):
//! - [`EndpointStyle::AllMembers`] (clients whose gRPC stack balances over several
//!   addresses: Rust's tonic `balance_list`, Java): one `Endpoints` with every
//!   member, leader first.
//! - [`EndpointStyle::SpreadMembers`] (grpc-core clients such as Python's: a
//!   multi-address target makes grpc-core send an `:authority` of all the
//!   addresses joined by commas, which HTTP/2 servers other than Netty's refuse):
//!   one member per queue, the leader first, round robin, so a send that fails on
//!   a dead member is retried by the client on the next queue, another member.
//!
//! Members that set `client_endpoint` (one DNS name for the whole group, every
//! member serving the same port on its own address) announce that name instead of
//! their own address; [`crate::route::member_addrs`] keeps it once, so in either style every
//! queue names the one `DOMAIN_NAME` endpoint, and the client's gRPC channel
//! resolves every member's address and fails over between them by itself.

use ledgermq_meta::{TopicMessageType, TopicPerm};
use ledgermq_namesrv::pb as ns;

use crate::broker::Broker;
use crate::error::{refuse, BrokerError, ErrorKind};
use crate::grpc::ToStatus;
use crate::kinds::{accept_message_types_pb, message_type_from_ns, permission_to_pb};
use crate::message::{check_group, check_topic};
use crate::pb;
use crate::route::member_addrs;

/// `host:port` strings as protocol endpoints (scheme set: IPv4, IPv6 or domain
/// name; a domain name takes one address, as the clients require). Unparsable
/// entries are left out.
pub fn endpoints(addrs: &[String]) -> pb::Endpoints {
    let mut scheme = None;
    let mut addresses = Vec::new();
    for a in addrs {
        let Some((host, port)) = a.rsplit_once(':') else {
            continue;
        };
        let Ok(port) = port.parse::<u16>() else {
            continue;
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let s = match host.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(_)) => pb::AddressScheme::IPv4,
            Ok(std::net::IpAddr::V6(_)) => pb::AddressScheme::IPv6,
            Err(_) => pb::AddressScheme::DomainName,
        };
        if *scheme.get_or_insert(s) != s
            || (s == pb::AddressScheme::DomainName && !addresses.is_empty())
        {
            continue;
        }
        addresses.push(pb::Address {
            host: host.to_owned(),
            port: i32::from(port),
        });
    }
    pb::Endpoints {
        scheme: scheme.unwrap_or(pb::AddressScheme::IPv4) as i32,
        addresses,
    }
}

/// How a route names a group's members (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointStyle {
    /// One `Endpoints` with every member, leader first.
    AllMembers,
    /// One member per queue, round robin from the leader.
    SpreadMembers,
}

impl EndpointStyle {
    /// The style for a client that sent `x-mq-language: language`: RUST and JAVA
    /// balance over addresses; other (grpc-core) clients get one address per queue.
    pub fn for_language(language: Option<&str>) -> Self {
        match language {
            Some("RUST") | Some("JAVA") => EndpointStyle::AllMembers,
            _ => EndpointStyle::SpreadMembers,
        }
    }
}

/// The message queues of `topic` in the name servers' answer: every queue of every
/// group, writable member id 0, with the group's permission and message type.
pub fn message_queues(
    topic: &str,
    route: &ns::QueryRouteResponse,
    style: EndpointStyle,
    stale_ms: u64,
) -> Vec<pb::MessageQueue> {
    let mut out = Vec::new();
    let mut groups: Vec<_> = route.groups.iter().collect();
    groups.sort_by(|a, b| a.broker_group.cmp(&b.broker_group));
    for g in groups {
        let addrs = member_addrs(g, stale_ms);
        if addrs.is_empty() {
            continue;
        }
        out.extend(group_queues(
            topic,
            &g.broker_group,
            &addrs,
            g.queue_count,
            TopicPerm::from_bits(g.perm),
            message_type_from_ns(g.message_type),
            style,
        ));
    }
    out
}

/// The queues of one group.
pub fn group_queues(
    topic: &str,
    group: &str,
    addrs: &[String],
    queue_count: u32,
    perm: TopicPerm,
    mtype: TopicMessageType,
    style: EndpointStyle,
) -> Vec<pb::MessageQueue> {
    let broker = |id: i32| pb::Broker {
        name: group.to_owned(),
        id: 0,
        endpoints: Some(match style {
            EndpointStyle::AllMembers => endpoints(addrs),
            EndpointStyle::SpreadMembers => {
                endpoints(&addrs[id as usize % addrs.len().max(1)..][..1.min(addrs.len())])
            }
        }),
    };
    (0..queue_count as i32)
        .map(|id| pb::MessageQueue {
            topic: Some(pb::Resource {
                resource_namespace: String::new(),
                name: topic.to_owned(),
            }),
            id,
            permission: permission_to_pb(perm) as i32,
            broker: Some(broker(id)),
            accept_message_types: accept_message_types_pb(mtype),
        })
        .collect()
}

/// QueryRoute: the topic's queues on every broker group, from the name servers;
/// this group's own view when the name servers do not know the topic yet (just
/// created). Error: TOPIC_NOT_FOUND.
pub async fn query_route(
    b: &Broker,
    req: pb::QueryRouteRequest,
    style: EndpointStyle,
) -> pb::QueryRouteResponse {
    match route_queues(b, req.topic.map(|t| t.name).unwrap_or_default(), style).await {
        Ok(q) => pb::QueryRouteResponse {
            status: Some(pb::Status::ok()),
            message_queues: q,
        },
        Err(e) => pb::QueryRouteResponse {
            status: Some(e.to_status()),
            message_queues: vec![],
        },
    }
}

async fn route_queues(
    b: &Broker,
    topic: String,
    style: EndpointStyle,
) -> Result<Vec<pb::MessageQueue>, BrokerError> {
    check_topic(&topic)?;
    let from_namesrv = match b.namesrv.route(&topic).await {
        Ok(r) => r
            .map(|r| message_queues(&topic, &r, style, b.settings.stale_member_ms))
            .unwrap_or_default(),
        Err(e) => {
            tracing::warn!(error = %e, "name servers unreachable; answering this group's view");
            vec![]
        }
    };
    if !from_namesrv.is_empty() {
        return Ok(from_namesrv);
    }
    let t = b.topic_or_create(&topic).await?;
    let mut addrs = Vec::new();
    if let Some((leader, _)) = b.node.leader() {
        if let Some(a) = b.members().configured().get(&leader) {
            addrs.push(a.clone());
        }
    }
    for a in b.members().configured().values() {
        if !addrs.contains(a) {
            addrs.push(a.clone());
        }
    }
    let q = group_queues(
        &topic,
        &b.group,
        &addrs,
        t.queue_count,
        t.perm,
        t.message_type,
        style,
    );
    if q.is_empty() {
        return Err(refuse(
            ErrorKind::TopicNotFound,
            format!("topic {topic} has no queues"),
        ));
    }
    Ok(q)
}

/// QueryAssignment: one assignment per readable broker group and endpoint, queue
/// id -1 (any queue of that group: the leader spreads receives over them).
pub async fn query_assignment(
    b: &Broker,
    req: pb::QueryAssignmentRequest,
    style: EndpointStyle,
) -> pb::QueryAssignmentResponse {
    let result = async {
        check_group(&req.group.map(|g| g.name).unwrap_or_default())?;
        let queues = route_queues(b, req.topic.map(|t| t.name).unwrap_or_default(), style).await?;
        let mut seen = std::collections::BTreeSet::new();
        let mut out = Vec::new();
        for mut q in queues {
            let readable = matches!(
                pb::Permission::try_from(q.permission),
                Ok(pb::Permission::Read | pb::Permission::ReadWrite)
            );
            // One per group and endpoint: with spread endpoints, a push
            // consumer polls through every member and rides out a dead one.
            let key = q
                .broker
                .as_ref()
                .map(|b| (b.name.clone(), format!("{:?}", b.endpoints)));
            if readable && seen.insert(key) {
                q.id = -1;
                out.push(pb::Assignment {
                    message_queue: Some(q),
                });
            }
        }
        Ok::<_, BrokerError>(out)
    }
    .await;
    match result {
        Ok(assignments) => pb::QueryAssignmentResponse {
            status: Some(pb::Status::ok()),
            assignments,
        },
        Err(e) => pb::QueryAssignmentResponse {
            status: Some(e.to_status()),
            assignments: vec![],
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ns::GroupRoute;

    fn member(id: u64, addr: &str) -> ns::Member {
        ns::Member {
            node_id: id,
            client_addr: addr.into(),
            ..Default::default()
        }
    }

    #[test]
    fn routes_list_every_group_with_the_leader_first() {
        let route = ns::QueryRouteResponse {
            found: true,
            topic: "T".into(),
            groups: vec![
                GroupRoute {
                    broker_group: "b".into(),
                    has_leader: false,
                    members: vec![member(1, "127.0.0.1:9002"), member(0, "127.0.0.1:9001")],
                    queue_count: 2,
                    perm: 4,
                    message_type: ns::MessageType::Normal as i32,
                    ..Default::default()
                },
                GroupRoute {
                    broker_group: "a".into(),
                    has_leader: true,
                    leader_addr: "127.0.0.1:8082".into(),
                    members: vec![member(0, "127.0.0.1:8081"), member(1, "127.0.0.1:8082")],
                    queue_count: 3,
                    perm: 6,
                    message_type: ns::MessageType::Fifo as i32,
                    ..Default::default()
                },
            ],
        };
        let spread = message_queues("T", &route, EndpointStyle::SpreadMembers, 1000);
        let first_ports: Vec<i32> = spread[..3].iter().map(|q| ports(q)[0]).collect();
        assert_eq!(first_ports, vec![8082, 8081, 8082]);
        assert!(spread.iter().all(|q| ports(q).len() == 1));
        let q = message_queues("T", &route, EndpointStyle::AllMembers, 1000);
        assert_eq!(q.len(), 5);
        let a = q[0].broker.as_ref().unwrap();
        assert_eq!((a.name.as_str(), a.id), ("a", 0));
        let e = a.endpoints.as_ref().unwrap();
        assert_eq!(e.scheme, pb::AddressScheme::IPv4 as i32);
        assert_eq!(ports(&q[0]), vec![8082, 8081]);
        assert_eq!(q[0].permission, pb::Permission::ReadWrite as i32);
        assert_eq!(
            q[0].accept_message_types,
            vec![pb::MessageType::Fifo as i32]
        );
        assert_eq!((q[2].id, q[3].id), (2, 0));
        assert_eq!(q[3].permission, pb::Permission::Read as i32);
        assert_eq!(ports(&q[3]), vec![9001, 9002]);
        // A member silent for longer than the stale limit is left out.
        let mut r = route.clone();
        r.groups[1].members[0].silent_ms = 5000;
        let q = message_queues("T", &r, EndpointStyle::AllMembers, 1000);
        assert_eq!(ports(&q[0]), vec![8082]);
    }

    fn ports(q: &pb::MessageQueue) -> Vec<i32> {
        let b = q.broker.as_ref().unwrap();
        b.endpoints
            .as_ref()
            .unwrap()
            .addresses
            .iter()
            .map(|a| a.port)
            .collect()
    }

    #[test]
    fn members_sharing_a_client_endpoint_give_one_domain_name_endpoint() {
        let route = ns::QueryRouteResponse {
            found: true,
            topic: "T".into(),
            groups: vec![GroupRoute {
                broker_group: "a".into(),
                has_leader: true,
                leader_addr: "mq.local:8081".into(),
                members: (0..3).map(|i| member(i, "mq.local:8081")).collect(),
                queue_count: 4,
                perm: 6,
                message_type: ns::MessageType::Normal as i32,
                ..Default::default()
            }],
        };
        for style in [EndpointStyle::SpreadMembers, EndpointStyle::AllMembers] {
            let q = message_queues("T", &route, style, 1000);
            assert_eq!(q.len(), 4);
            for queue in &q {
                let e = queue.broker.as_ref().unwrap().endpoints.as_ref().unwrap();
                assert_eq!(e.scheme, pb::AddressScheme::DomainName as i32);
                assert_eq!(ports(queue), vec![8081]);
                assert_eq!(e.addresses[0].host, "mq.local");
            }
        }
    }

    #[test]
    fn endpoints_set_their_scheme() {
        assert_eq!(
            endpoints(&["[::1]:81".into()]).scheme,
            pb::AddressScheme::IPv6 as i32
        );
        let d = endpoints(&["mq.local:81".into(), "other:82".into()]);
        assert_eq!(d.scheme, pb::AddressScheme::DomainName as i32);
        assert_eq!(d.addresses.len(), 1);
        assert_eq!(endpoints(&["nonsense".into()]).addresses.len(), 0);
    }
}
