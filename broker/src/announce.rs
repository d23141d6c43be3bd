//! Keeps the name servers told what this node is: its role, term, applied index and
//! the group's topics, from the Raft metrics and the replicated metadata. A change of
//! role or term is sent at once (the registrar's urgent path), and so is being cut
//! off from the group (routes then leave the node out); the rest rides on the
//! periodic heartbeat.

use std::sync::Arc;
use std::time::Duration;

use ledgermq_namesrv::pb::{BrokerNode, Role, TopicConfig};
use ledgermq_namesrv::registrar::Registrar;
use ledgermq_raft::RaftNode;
use openraft::ServerState;
use tokio::task::JoinHandle;

use crate::kinds::message_type_to_ns;

/// Who this node is to clients.
#[derive(Debug, Clone)]
pub struct Identity {
    /// RocketMQ cluster name.
    pub cluster: String,
    /// Broker group (RocketMQ's broker name); one Raft group.
    pub broker_group: String,
    /// The address clients reach this node's gRPC service at, `host:port`.
    pub client_addr: String,
    /// This node's own client address (`client_addr` of its config), which
    /// admin calls for this node alone use; differs from [`Self::client_addr`]
    /// when the group announces one `client_endpoint`.
    pub member_addr: String,
    /// The address 4.x clients reach this node's remoting service at, or
    /// empty when it serves none.
    pub remoting_addr: String,
    /// `Some(queues)` when this node creates topics on first use: it then
    /// announces RocketMQ's default topic [`DEFAULT_TOPIC`] with that many
    /// queues, as a RocketMQ broker with `autoCreateTopicEnable` does, so a
    /// 4.x producer finds a route for a topic no one created yet.
    pub auto_create_queue_count: Option<u32>,
}

/// RocketMQ's default topic (`TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC`):
/// a 4.x producer that finds no route for a topic sends it to the brokers
/// that serve this one, which create it.
pub const DEFAULT_TOPIC: &str = "TBW102";

/// RocketMQ's permission of [`DEFAULT_TOPIC`]: readable, writable, inherited.
const DEFAULT_TOPIC_PERM: u32 = 7;

/// The name-server view of `node` right now.
pub fn describe(node: &RaftNode, id: &Identity) -> BrokerNode {
    let m = node.raft().metrics().borrow().clone();
    let role = match m.state {
        ServerState::Leader => Role::Leader,
        ServerState::Follower => Role::Follower,
        ServerState::Candidate => Role::Candidate,
        ServerState::Learner | ServerState::Shutdown => Role::Learner,
    };
    let mut topics: Vec<TopicConfig> = node
        .shared_meta()
        .read()
        .unwrap()
        .topics
        .values()
        .map(|t| TopicConfig {
            name: t.name.clone(),
            queue_count: t.queue_count,
            perm: t.perm.bits(),
            message_type: message_type_to_ns(t.message_type) as i32,
        })
        .collect();
    if let Some(queue_count) = id.auto_create_queue_count {
        if !topics.iter().any(|t| t.name == DEFAULT_TOPIC) {
            topics.push(TopicConfig {
                name: DEFAULT_TOPIC.into(),
                queue_count,
                perm: DEFAULT_TOPIC_PERM,
                message_type: message_type_to_ns(ledgermq_meta::TopicMessageType::Normal) as i32,
            });
        }
    }
    BrokerNode {
        cluster: id.cluster.clone(),
        broker_group: id.broker_group.clone(),
        node_id: node.id(),
        client_addr: id.client_addr.clone(),
        role: role as i32,
        term: m.current_term,
        commit_index: m.last_applied.map_or(0, |l| l.index),
        topics,
        // A node outside its group's membership (joining) is left out of
        // routes as a cut-off one is; so is a learner no leader replicates to
        // (a removed node never receives its removal: it stays a learner in
        // its own view).
        cut_off: !node.in_contact_with_quorum()
            || !node.is_member()
            || (m.state == ServerState::Learner && !node.leader_heard_lately()),
        remoting_addr: id.remoting_addr.clone(),
        member_addr: id.member_addr.clone(),
    }
}

/// Feeds `registrar` with [`describe`] on every Raft metrics change and at least
/// every `refresh` (topics change through applied entries).
pub fn spawn_announcer(
    node: Arc<RaftNode>,
    registrar: Arc<Registrar>,
    id: Identity,
    refresh: Duration,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut metrics = node.raft().metrics();
        let mut tick = tokio::time::interval(refresh);
        loop {
            registrar.update(describe(&node, &id));
            tokio::select! {
                changed = metrics.changed() => if changed.is_err() { return },
                _ = tick.tick() => {}
            }
        }
    })
}
