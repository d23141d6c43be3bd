//! One broker node's client-facing state: its Raft node, its settings, the
//! consumption table, the name servers, and the way to the group's leader.
//!
//! Every node accepts every call. Writes (sends, offset commits) go through
//! [`RaftNode`], which forwards them to the leader over the Raft transport;
//! consumption calls (receive, ack, change invisible duration, dead-lettering) need
//! the leader's consumption state, so a follower passes the whole call on to the
//! leader's client service, marked so it is not passed on again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ledgermq_meta::{Command, GroupConfig, RetryPolicy, TopicConfig, TopicMessageType, TopicPerm};
use ledgermq_raft::RaftNode;
use tonic::transport::{Channel, Endpoint};

use crate::consume::BroadcastClients;
use crate::consumers::Consumers;
use crate::error::ErrorKind;
use crate::error::{refuse, BrokerError};
use crate::pb::messaging_service_client::MessagingServiceClient;
use crate::route::{Members, NameServers};
use crate::transactions::end::EndLocks;
use crate::transactions::producers::Producers;

/// Most queues per topic any configuration allows (`max_queues_per_topic` is at
/// most this).
pub const MAX_QUEUES: u32 = 1024;

/// Metadata key marking a call already passed on by a follower.
pub const FORWARDED_HEADER: &str = "x-ledgermq-forwarded";
/// Metadata key of the client id (RocketMQ 5 clients send it on every call).
pub const CLIENT_ID_HEADER: &str = "x-mq-client-id";

/// Client-protocol settings of a broker node.
#[derive(Debug, Clone)]
pub struct ServiceSettings {
    /// Largest message body accepted, bytes (RocketMQ: 4 MiB); sent to clients in
    /// the Settings reply.
    pub max_body_bytes: usize,
    /// Create a topic on first use (send or route query) instead of answering
    /// TOPIC_NOT_FOUND (RocketMQ's `autoCreateTopicEnable`).
    pub auto_create_topics: bool,
    /// Queues of an auto-created topic.
    pub default_queue_count: u32,
    /// Create a consumer group on first use (RocketMQ's
    /// `autoCreateSubscriptionGroup`, default on); otherwise
    /// CONSUMER_GROUP_NOT_FOUND.
    pub auto_create_groups: bool,
    /// Record a clustering or broadcasting group's deliveries through Raft
    /// (`Command::DeliveryAttempts`) before answering each receive, so a new
    /// leader counts attempts on exactly. It adds a Raft commit (an fsync on a
    /// majority under SYNC_FLUSH) to every receive's latency: with one consumer
    /// receiving in turn, consumption fell from the send rate to about 40 % of
    /// it on the benchmark (docs/benchmarks.md), so it is off by default (then
    /// a new leader counts a message in flight from 1 again).
    pub exact_delivery_attempts: bool,
    /// Longest long poll, ms (RocketMQ proxy: 20 s).
    pub max_long_polling_ms: u64,
    /// Invisible duration when the client gives none (push consumers), ms.
    pub default_invisible_ms: u64,
    /// Most messages per receive (RocketMQ proxy: 32).
    pub max_receive_batch: usize,
    /// Members the name servers have not heard from for this long are left out of
    /// routes, ms (three heartbeat periods).
    pub stale_member_ms: u64,
    /// Refuse calls without the `x-mq-client-id` header (CLIENT_ID_REQUIRED), as
    /// the reference proxy does.
    pub require_client_id: bool,
    /// Most queues of a topic.
    pub max_queues_per_topic: u32,
    /// Auto-creation stops at this many consumer groups (CONSUMER_GROUP_NOT_FOUND).
    pub max_consumer_groups: usize,
    /// Most client ids consuming from one broadcasting group at once
    /// (TOO_MANY_REQUESTS past it).
    pub max_broadcast_clients_per_group: usize,
    /// A broadcasting client id not seen for this long frees its place, ms.
    pub broadcast_client_idle_ms: u64,
    /// Most messages in one SendMessage request (PAYLOAD_TOO_LARGE past it).
    pub max_messages_per_send: usize,
    /// Telemetry replies buffered for a client that does not read them; past this
    /// its Telemetry stream ends.
    pub telemetry_reply_buffer: usize,
    /// Latest delivery time a delay message may ask for, ms after it is sent
    /// (ILLEGAL_DELIVERY_TIME past it; the reference proxy's `maxDelayTimeMills`,
    /// 1 day).
    pub max_delay_ms: u64,
    /// A transactional message the client gave no recovery duration is first
    /// checked back this long after it is stored, ms (RocketMQ's
    /// `transactionTimeOut`: 6 s).
    pub transaction_timeout_ms: u64,
    /// Time between checks back of one orphaned transaction, ms (RocketMQ 5's
    /// `transactionCheckInterval`: 30 s).
    pub transaction_check_interval_ms: u64,
    /// Most checks back of one orphaned transaction; it is discarded when the
    /// time of the next comes (RocketMQ's `transactionCheckMax`: 15).
    pub transaction_check_max: u32,
    /// Client authentication and ACLs ([`crate::auth`]); off by default.
    pub auth: crate::auth::AuthSettings,
    /// TLS on the client port, and the CA other members' client ports are
    /// checked against (`[tls]`); none by default.
    pub tls: Option<crate::config::tls::ClientTls>,
    /// With [`Self::tls`], which connections the remoting port serves
    /// (`remoting_tls_mode`; TLS only by default).
    pub remoting_tls_mode: ledgermq_tls::TlsMode,
}

impl Default for ServiceSettings {
    fn default() -> Self {
        Self {
            max_body_bytes: 4 << 20,
            auth: crate::auth::AuthSettings::default(),
            tls: None,
            remoting_tls_mode: ledgermq_tls::TlsMode::Enforcing,
            auto_create_topics: false,
            default_queue_count: 8,
            auto_create_groups: true,
            exact_delivery_attempts: false,
            max_long_polling_ms: 20_000,
            default_invisible_ms: 60_000,
            max_receive_batch: 32,
            stale_member_ms: 9_000,
            require_client_id: true,
            // RocketMQ creates 8 by default; 64 queues cost at most 384 MB of
            // preallocated ConsumeQueue files.
            max_queues_per_topic: 64,
            max_consumer_groups: 10_000,
            max_broadcast_clients_per_group: 1024,
            broadcast_client_idle_ms: 120_000,
            // Also the Raft batcher's most messages per entry.
            max_messages_per_send: 1024,
            telemetry_reply_buffer: 16,
            max_delay_ms: 86_400_000,
            transaction_timeout_ms: 6_000,
            transaction_check_interval_ms: 30_000,
            transaction_check_max: 15,
        }
    }
}

/// How long [`Broker::ensure_topic`] waits for this node to apply a topic it
/// created.
const TOPIC_APPLY_WAIT: Duration = Duration::from_secs(3);

/// Where a consumption call runs.
pub enum Target {
    /// Here: this node is the ready leader.
    Local,
    /// On the leader, through its client port (the messaging service:
    /// [`Broker::messaging_client`]; or the admin service).
    Leader(Channel),
}

/// One broker node's service state.
pub struct Broker {
    /// The Raft member.
    pub node: Arc<RaftNode>,
    /// Broker group name.
    pub group: String,
    /// Settings.
    pub settings: ServiceSettings,
    /// Consumption state while leading.
    pub consumers: Arc<Consumers>,
    /// The name servers.
    pub namesrv: NameServers,
    members: Members,
    channels: Mutex<HashMap<String, Channel>>,
    rr: AtomicUsize,
    /// Held while auto-creating a consumer group, so concurrent first uses cannot
    /// overshoot `max_consumer_groups`.
    group_creation: tokio::sync::Mutex<()>,
    /// Client ids consuming from broadcasting groups (this node, while leading).
    broadcast_clients: Mutex<BroadcastClients>,
    /// Makes the ends of one half message one at a time.
    pub(crate) end_locks: EndLocks,
    /// Producers connected to this node, for transaction checks back.
    pub(crate) producers: Producers,
    /// 4.x producers connected to this node's remoting port, for checks back.
    pub(crate) remoting_producers: crate::transactions::remoting_producers::RemotingProducers,
    /// This node's Prometheus metrics.
    pub metrics: Arc<crate::metrics::BrokerMetrics>,
    /// The consumers connected to this node (consumerConnection).
    pub consumer_clients: crate::consumer_clients::ConsumerClients,
    /// When this broker started (brokerStatus's uptime).
    pub started: std::time::Instant,
    /// The node's effective configuration as TOML, defaults included, set once
    /// at start by `BrokerNode::start` (getBrokerConfig); unset for a broker
    /// built without a configuration file (tests).
    pub effective_config: std::sync::OnceLock<String>,
}

impl Broker {
    /// A broker over `node`. `members`: this group's client addresses;
    /// `metrics`: where its calls and messages are counted.
    pub fn new(
        node: Arc<RaftNode>,
        group: String,
        settings: ServiceSettings,
        namesrv: NameServers,
        members: Members,
        metrics: Arc<crate::metrics::BrokerMetrics>,
    ) -> Arc<Self> {
        Arc::new(Self {
            consumers: Consumers::new(node.clone()),
            node,
            group,
            settings,
            namesrv,
            members,
            channels: Mutex::new(HashMap::new()),
            rr: AtomicUsize::new(0),
            group_creation: tokio::sync::Mutex::new(()),
            broadcast_clients: Mutex::new(BroadcastClients::default()),
            end_locks: EndLocks::default(),
            producers: Producers::default(),
            remoting_producers: Default::default(),
            metrics,
            consumer_clients: Default::default(),
            started: std::time::Instant::now(),
            effective_config: std::sync::OnceLock::new(),
        })
    }

    /// This group's member client addresses as configured (node id → `host:port`).
    pub fn members(&self) -> &Members {
        &self.members
    }

    /// A rotating counter (queue choice, fair polling order).
    pub fn next_rr(&self) -> usize {
        self.rr.fetch_add(1, Ordering::Relaxed)
    }

    /// The topic's configuration in this group.
    pub fn topic(&self, name: &str) -> Option<TopicConfig> {
        self.node
            .shared_meta()
            .read()
            .unwrap()
            .topics
            .get(name)
            .cloned()
    }

    /// True if this broker group has consumer group `name`, as this node
    /// applied it (no copy of its configuration).
    pub fn has_group(&self, name: &str) -> bool {
        self.node
            .shared_meta()
            .read()
            .unwrap()
            .groups
            .contains_key(name)
    }

    /// The consumer group's configuration.
    pub fn group_config(&self, name: &str) -> Option<GroupConfig> {
        self.node
            .shared_meta()
            .read()
            .unwrap()
            .groups
            .get(name)
            .cloned()
    }

    /// The consumer group's configuration and its retry policy (None: the
    /// group has none, or none was given it), read together.
    pub fn group_config_and_retry_policy(
        &self,
        name: &str,
    ) -> (Option<GroupConfig>, Option<RetryPolicy>) {
        let meta = self.node.shared_meta();
        let meta = meta.read().unwrap();
        (
            meta.groups.get(name).cloned(),
            meta.retry_policies.get(name).cloned(),
        )
    }

    /// The topic's configuration, creating it when auto-creation is on. Error:
    /// TOPIC_NOT_FOUND.
    pub async fn topic_or_create(&self, name: &str) -> Result<TopicConfig, BrokerError> {
        if let Some(t) = self.topic(name) {
            return Ok(t);
        }
        if !self.settings.auto_create_topics {
            return Err(refuse(
                ErrorKind::TopicNotFound,
                format!("topic {name} does not exist in broker group {}", self.group),
            ));
        }
        let t = TopicConfig {
            name: name.to_owned(),
            queue_count: self.settings.default_queue_count,
            perm: TopicPerm::READ_WRITE,
            message_type: TopicMessageType::Normal,
        };
        self.node
            .write_command(Command::EnsureTopic(t.clone()))
            .await?;
        Ok(self.topic(name).unwrap_or(t))
    }

    /// Creates topic `name` (one queue, readable and writable; a retry or
    /// dead-letter topic) unless it exists, and waits until this node has applied it (a follower's write
    /// is applied on the leader first). Errors: ILLEGAL_TOPIC (a name no topic
    /// may have), the write's.
    pub async fn ensure_topic(&self, name: &str) -> Result<(), BrokerError> {
        ledgermq_store::consume_queue::validate_topic(name)
            .map_err(|e| refuse(ErrorKind::IllegalTopic, e.to_string()))?;
        if self.topic(name).is_some() {
            return Ok(());
        }
        self.node
            .write_command(Command::EnsureTopic(TopicConfig {
                name: name.to_owned(),
                queue_count: 1,
                perm: TopicPerm::READ_WRITE,
                message_type: TopicMessageType::Normal,
            }))
            .await?;
        let deadline = tokio::time::Instant::now() + TOPIC_APPLY_WAIT;
        while self.topic(name).is_none() {
            if tokio::time::Instant::now() >= deadline {
                return Err(refuse(
                    ErrorKind::NoLeader,
                    format!("topic {name} was created but is not applied here yet"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// The consumer group's configuration, creating it (clustering, not FIFO) when
    /// auto-creation is on and the broker group has fewer than
    /// `max_consumer_groups`. Error: CONSUMER_GROUP_NOT_FOUND.
    pub async fn group_or_create(&self, name: &str) -> Result<GroupConfig, BrokerError> {
        if let Some(g) = self.group_config(name) {
            return Ok(g);
        }
        if !self.settings.auto_create_groups {
            return Err(refuse(
                ErrorKind::ConsumerGroupNotFound,
                format!("consumer group {name} does not exist"),
            ));
        }
        let _creating = self.group_creation.lock().await;
        let groups = {
            let meta = self.node.shared_meta();
            let meta = meta.read().unwrap();
            if let Some(g) = meta.groups.get(name) {
                return Ok(g.clone());
            }
            meta.groups.len()
        };
        if groups >= self.settings.max_consumer_groups {
            return Err(refuse(
                ErrorKind::ConsumerGroupNotFound,
                format!(
                    "consumer group {name} does not exist and is not created: broker group {} \
                     has {groups} consumer groups (max_consumer_groups = {})",
                    self.group, self.settings.max_consumer_groups
                ),
            ));
        }
        let g = GroupConfig {
            name: name.to_owned(),
            fifo: false,
            broadcast: false,
            max_delivery_attempts: 16,
        };
        self.node
            .write_command(Command::EnsureGroup(g.clone()))
            .await?;
        Ok(self.group_config(name).unwrap_or(g))
    }

    /// Admits `client_id` as a consumer of broadcasting group `group`: known ids,
    /// or new ones while fewer than `max_broadcast_clients_per_group` were seen
    /// within `broadcast_client_idle_ms`. Error: TOO_MANY_REQUESTS.
    pub fn admit_broadcast_client(&self, group: &str, client_id: &str) -> Result<(), BrokerError> {
        let max = self.settings.max_broadcast_clients_per_group;
        let idle = Duration::from_millis(self.settings.broadcast_client_idle_ms);
        let admitted = self.broadcast_clients.lock().unwrap().admit(
            group,
            client_id,
            Instant::now(),
            max,
            idle,
        );
        if admitted {
            return Ok(());
        }
        Err(refuse(
            ErrorKind::TooManyRequests,
            format!(
                "broadcasting group {group} already has {max} consuming client ids \
                 (max_broadcast_clients_per_group); one frees its place after {} ms unseen",
                idle.as_millis()
            ),
        ))
    }

    /// Where a consumption call must run: here if this node is the ready leader;
    /// else on the leader (unless the call was passed on already). Waits for a
    /// leader until `deadline`. Error: `NoLeader`.
    pub async fn target(&self, forwarded: bool, deadline: Instant) -> Result<Target, BrokerError> {
        loop {
            if self.consumers.ready_term().is_some() {
                return Ok(Target::Local);
            }
            if let Some((leader, _)) = self.node.leader() {
                if leader != self.node.id() {
                    if forwarded {
                        // Passed on to a node that no longer leads: let the sender
                        // look for the leader again rather than wait here.
                        return Err(refuse(
                            ErrorKind::NoLeader,
                            format!(
                                "node {} no longer leads; leader is {leader}",
                                self.node.id()
                            ),
                        ));
                    }
                    match self.node_channel(leader).await {
                        Ok(c) => return Ok(Target::Leader(c)),
                        Err(e) => tracing::debug!(error = %e, "leader not reachable yet"),
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(refuse(
                    ErrorKind::NoLeader,
                    format!(
                        "broker group {} has no reachable leader right now",
                        self.group
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// This node's copy of the group metadata, read-locked (a poisoned lock
    /// is read as it stands: the broker only reads it).
    pub(crate) fn meta(&self) -> std::sync::RwLockReadGuard<'_, ledgermq_meta::GroupMeta> {
        self.node
            .shared_meta()
            .read()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// A channel to member `node`'s client port (one per address, reused), the
    /// leader's or, for a transaction check back, another's. Error:
    /// `Leader` when its address is not a valid endpoint; `NameServer` when it
    /// cannot be learned.
    pub(crate) async fn node_channel(&self, node: u64) -> Result<Channel, BrokerError> {
        let addr = self.members.client_addr(node, &self.namesrv).await?;
        let mut ch = self.channels.lock().unwrap();
        let channel = match ch.get(&addr) {
            Some(c) => c.clone(),
            None => {
                let scheme = if self.settings.tls.is_some() {
                    "https"
                } else {
                    "http"
                };
                let leader_error = |e: tonic::transport::Error| BrokerError::Leader {
                    addr: addr.clone(),
                    reason: e.to_string(),
                };
                let mut e = Endpoint::from_shared(format!("{scheme}://{addr}"))
                    .map_err(leader_error)?
                    .connect_timeout(Duration::from_secs(1))
                    .tcp_nodelay(true);
                // The other members' client ports serve TLS as this one does,
                // with certificates of the group's CA.
                if let Some(tls) = &self.settings.tls {
                    e = e
                        .tls_config(tls.tonic_client(false))
                        .map_err(leader_error)?;
                }
                let c = e.connect_lazy();
                ch.insert(addr.clone(), c.clone());
                c
            }
        };
        Ok(channel)
    }

    /// The messaging service of the node at the other end of `channel` (a
    /// [`Target::Leader`]): messages up to the max body size, and batches of them,
    /// pass through.
    pub fn messaging_client(channel: Channel) -> MessagingServiceClient<Channel> {
        MessagingServiceClient::new(channel)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20)
    }
}
