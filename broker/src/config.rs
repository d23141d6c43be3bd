//! `mqbroker -c FILE`: the broker node's TOML configuration.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ledgermq_store::{FlushMode, StoreConfig};
use serde::{Deserialize, Serialize};

pub mod auth;
mod defaults;
pub mod properties;
pub mod tls;

use defaults::*;

/// One broker node's settings. Example (`deploy/local/n0.toml`):
///
/// ```toml
/// cluster = "DefaultCluster"
/// broker_group = "broker-a"
/// node_id = 0
/// client_addr = "127.0.0.1:8081"
/// namesrv_addrs = ["127.0.0.1:9876"]
/// store_root = "/tmp/ledgermq/n0"
/// flush = "sync"
///
/// [peers]
/// 0 = "127.0.0.1:40911"
/// 1 = "127.0.0.1:40912"
/// 2 = "127.0.0.1:40913"
/// ```
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    /// RocketMQ cluster name.
    pub cluster: String,
    /// Broker group name (RocketMQ's broker name); one Raft group.
    pub broker_group: String,
    /// This node's id within the group.
    pub node_id: u64,
    /// Every member of the group: node id (as a string key) → Raft peer address.
    pub peers: BTreeMap<String, String>,
    /// Address of this node's client gRPC service, `host:port`.
    pub client_addr: String,
    /// The `host:port` clients are told to use for this group instead of each
    /// node's `client_addr`: a DNS name that resolves to every member's address,
    /// each member serving the same port (how RocketMQ proxies are deployed). The
    /// node announces it to the name servers, so QueryRoute and QueryAssignment
    /// answers name it (one endpoint for the whole group) and a client's gRPC
    /// channel fails over between the members by itself. Requires `[client_addrs]`
    /// for every member (the name servers then know only the shared name).
    #[serde(default)]
    pub client_endpoint: Option<String>,
    /// Where `GET /metrics` (Prometheus text, `crate::metrics`) is served,
    /// `host:port`; none when unset. RocketMQ's `metricsExporterType=PROM`
    /// with `metricsPromExporterHost`/`metricsPromExporterPort` (5557) in a
    /// `.properties` file sets it.
    #[serde(default)]
    pub metrics_addr: Option<String>,
    /// Address of this node's 4.x remoting service, `host:port` (RocketMQ's
    /// `listenPort`, 10911): the address it listens on and the one it
    /// announces, so routes give 4.x clients this address (a host of
    /// `0.0.0.0` is announced with `client_addr`'s host, which then must not
    /// be a wildcard too). Unset: no remoting
    /// service (three nodes on one host need three ports, so there is no
    /// default).
    #[serde(default)]
    pub remoting_addr: Option<String>,
    /// Name servers to register with, `host:port` each.
    #[serde(default)]
    pub namesrv_addrs: Vec<String>,
    /// Store root directory.
    pub store_root: PathBuf,
    /// `sync` (SYNC_FLUSH) or `async` (ASYNC_FLUSH).
    #[serde(default = "default_flush")]
    pub flush: String,
    /// CommitLog segment size in bytes (RocketMQ: 1 GiB).
    #[serde(default = "default_segment_bytes")]
    pub commit_log_segment_bytes: u64,
    /// Name-server heartbeat period, key `namesrv_heartbeat_ms` (RocketMQ: 30 s;
    /// here 3 s, so routes leave out a member that went down within three periods).
    #[serde(
        rename = "namesrv_heartbeat_ms",
        default = "default_heartbeat",
        deserialize_with = "millis",
        serialize_with = "ser_millis"
    )]
    pub namesrv_heartbeat: Duration,
    /// Raft heartbeat period, key `raft_heartbeat_ms`.
    #[serde(
        rename = "raft_heartbeat_ms",
        default = "default_raft_heartbeat",
        deserialize_with = "millis",
        serialize_with = "ser_millis"
    )]
    pub raft_heartbeat: Duration,
    /// Raft election timeout lower bound, key `raft_election_min_ms`.
    #[serde(
        rename = "raft_election_min_ms",
        default = "default_election_min",
        deserialize_with = "millis",
        serialize_with = "ser_millis"
    )]
    pub raft_election_min: Duration,
    /// Raft election timeout upper bound, key `raft_election_max_ms`.
    #[serde(
        rename = "raft_election_max_ms",
        default = "default_election_max",
        deserialize_with = "millis",
        serialize_with = "ser_millis"
    )]
    pub raft_election_max: Duration,
    /// Client addresses of the group's members: node id (as a string key) →
    /// `host:port`. Used to pass consumption calls on to the leader and in routes;
    /// members left out are looked up on the name servers.
    #[serde(default)]
    pub client_addrs: BTreeMap<String, String>,
    /// This node joins a running group (`mqadmin addNode`): on its first start
    /// (an empty store) it waits to be added as a learner instead of
    /// initializing the group from `peers`; ignored once it holds a membership.
    /// `peers` must still name this node's own peer address. Off by default;
    /// `mqbroker --join` sets it too.
    #[serde(default)]
    pub join: bool,
    /// Create topics on first use (RocketMQ's `autoCreateTopicEnable`); off by
    /// default: create them with `mqadmin updateTopic`.
    #[serde(default)]
    pub auto_create_topics: bool,
    /// Create consumer groups on first use (RocketMQ's
    /// `autoCreateSubscriptionGroup`, on by default).
    #[serde(default = "default_true")]
    pub auto_create_groups: bool,
    /// Record every delivery of a clustering or broadcasting group through Raft
    /// before the receive is answered, so attempt counts are exact across
    /// failover (`ServiceSettings::exact_delivery_attempts`); off by default: it
    /// adds a Raft commit to every receive.
    #[serde(default)]
    pub exact_delivery_attempts: bool,
    /// Client authentication and ACLs (`[auth]`, [`auth::AuthConfig`]); off
    /// by default.
    #[serde(default)]
    pub auth: auth::AuthConfig,
    /// TLS on the client port (`[tls]`, [`tls::TlsConfig`]); none by default.
    #[serde(default)]
    pub tls: tls::TlsConfig,
    /// Call the name servers over TLS, checking them against `tls.ca_file`
    /// (their `[tls]`); plain HTTP/2 by default. Needs `[tls]`.
    #[serde(default)]
    pub namesrv_tls: bool,
    /// With `[tls]`, which connections the remoting port serves:
    /// `enforcing` (the default) TLS only, `permissive` plain ones too (4.x
    /// clients that cannot speak TLS, as RocketMQ's `tls.server.mode`).
    /// Needs `[tls]` and `remoting_addr`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remoting_tls_mode: Option<ledgermq_tls::TlsMode>,
    /// Largest message body in bytes (RocketMQ: 4 MiB).
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
    /// Requests without the `x-mq-client-id` header answer CLIENT_ID_REQUIRED, as
    /// the reference proxy does (on by default; every official client sends it).
    #[serde(default = "default_true")]
    pub require_client_id: bool,
    /// Most queues of a topic (UpdateTopic refuses more): each queue that receives
    /// a message preallocates a 6,000,000-byte ConsumeQueue file.
    #[serde(default = "default_max_queues_per_topic")]
    pub max_queues_per_topic: u32,
    /// Most consumer groups a broker group auto-creates (groups made with
    /// `mqadmin updateSubGroup` do not count against a refusal, but are counted).
    #[serde(default = "default_max_consumer_groups")]
    pub max_consumer_groups: usize,
    /// Most client ids consuming from one broadcasting group at once (each keeps
    /// its own offsets, under `group@client-id`).
    #[serde(default = "default_max_broadcast_clients")]
    pub max_broadcast_clients_per_group: usize,
    /// A broadcasting client id not seen for this long frees its place, key
    /// `broadcast_client_idle_ms` (RocketMQ's `broadcastOffsetExpireSecond`: 120 s).
    #[serde(
        rename = "broadcast_client_idle_ms",
        default = "default_broadcast_client_idle",
        deserialize_with = "millis",
        serialize_with = "ser_millis"
    )]
    pub broadcast_client_idle: Duration,
    /// Latest delivery time a delay message may ask for, after it is sent, key
    /// `max_delay_ms` (the reference proxy's `maxDelayTimeMills`: 1 day).
    #[serde(
        rename = "max_delay_ms",
        default = "default_max_delay",
        deserialize_with = "millis",
        serialize_with = "ser_millis"
    )]
    pub max_delay: Duration,
    /// Most messages in one SendMessage request.
    #[serde(default = "default_max_messages_per_send")]
    pub max_messages_per_send: usize,
    /// Telemetry replies buffered for a client that does not read them; past this
    /// the client loses its Telemetry stream.
    #[serde(default = "default_telemetry_reply_buffer")]
    pub telemetry_reply_buffer: usize,
    /// A transactional message whose client gave no recovery duration is first
    /// checked back this long after it is stored, ms (RocketMQ's
    /// `transactionTimeOut`: 6,000).
    #[serde(default = "default_transaction_timeout_ms")]
    pub transaction_timeout_ms: u64,
    /// Time between checks back of one orphaned transaction, ms (RocketMQ 5's
    /// `transactionCheckInterval`: 30,000).
    #[serde(default = "default_transaction_check_interval_ms")]
    pub transaction_check_interval_ms: u64,
    /// Most checks back of one orphaned transaction before it is discarded
    /// (RocketMQ's `transactionCheckMax`: 15).
    #[serde(default = "default_transaction_check_max")]
    pub transaction_check_max: u32,
    /// Above this used fraction of the store's disk (as `df` counts it), new
    /// messages are refused with a "disk full" status while reads go on
    /// (RocketMQ's `diskSpaceWarningLevelRatio`: 0.90; 1.0 turns the check off).
    #[serde(default = "default_disk_space_warning_ratio")]
    pub disk_space_warning_ratio: f64,
    /// Above this used fraction of a member's disk, retention takes the oldest
    /// CommitLog segments even if they have not expired, on every member of the
    /// group, but only what every consumer group has consumed (RocketMQ's
    /// `diskSpaceCleanForciblyRatio`: 0.85, which also takes unconsumed messages;
    /// 1.0 turns forced cleaning off).
    #[serde(default = "default_disk_force_clean_ratio")]
    pub disk_force_clean_ratio: f64,
    /// Hours a CommitLog segment is kept after its newest message (RocketMQ's
    /// `fileReservedTime`, 72).
    #[serde(default = "default_file_reserved_time_hours")]
    pub file_reserved_time_hours: u64,
    /// Local hour of day, 0-23, at which expired segments are deleted
    /// (RocketMQ's `deleteWhen`, 4).
    #[serde(default = "default_delete_when_hour")]
    pub delete_when_hour: u32,
    /// Above this used fraction of the disk, expired segments are deleted at
    /// any hour (RocketMQ's `diskMaxUsedSpaceRatio`, as a fraction: 0.75).
    #[serde(default = "default_disk_max_used_space_ratio")]
    pub disk_max_used_space_ratio: f64,
    /// Queues of a topic created automatically (RocketMQ's
    /// `defaultTopicQueueNums`, 8).
    #[serde(default = "default_topic_queue_count")]
    pub default_topic_queue_count: u32,
    /// Period of this member's retention runs, key `retention_interval_ms`
    /// (RocketMQ's `cleanResourceInterval`: 10,000 ms). Each run deletes at most 10
    /// segments.
    #[serde(
        rename = "retention_interval_ms",
        default = "default_retention_interval",
        deserialize_with = "millis",
        serialize_with = "ser_millis"
    )]
    pub retention_interval: Duration,
    /// Removed (accepted and ignored, so files written for earlier releases still
    /// load): the jepsen harness's durable mark, a file where the node recorded its
    /// last fsynced CommitLog offset. The harness now finds what a power loss takes
    /// from the kernel's page cache instead of asking the node.
    #[serde(default, rename = "durable_mark_file", skip_serializing)]
    _removed_durable_mark_file: Option<serde::de::IgnoredAny>,
}

/// A configuration that cannot be used, with the reason.
#[derive(Debug, thiserror::Error)]
#[error("broker configuration {path}: {reason}")]
pub struct ConfigError {
    /// The file.
    pub path: String,
    /// What is wrong.
    pub reason: String,
}

impl BrokerConfig {
    /// Reads and checks a TOML file, or a RocketMQ broker `.properties` (or
    /// `.conf`) file ([`properties`]; the keys it does not use are logged in
    /// one warning). Error: the file cannot be read, does not parse, or holds
    /// a value out of range, named by its key.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let err = |reason: String| ConfigError {
            path: path.display().to_string(),
            reason,
        };
        let mut cfg: Self = if properties::is_properties(path) {
            let home = std::env::var("HOME").ok();
            let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
            let (table, unused) = properties::to_toml(&bytes, home.as_deref()).map_err(err)?;
            if !unused.is_empty() {
                tracing::warn!(
                    file = %path.display(),
                    keys = %unused.join(", "),
                    "RocketMQ configuration keys LedgerMQ does not use, ignored"
                );
            }
            table
                .try_into()
                .map_err(|e: toml::de::Error| err(e.to_string()))?
        } else {
            let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
            toml::from_str(&text).map_err(|e| err(e.to_string()))?
        };
        let members = cfg.members().map_err(err)?;
        cfg.flush_mode().map_err(err)?;
        cfg.member_client_addrs().map_err(err)?;
        if !members.contains_key(&cfg.node_id) {
            return Err(err(format!("node_id {} is not among [peers]", cfg.node_id)));
        }
        cfg.auth.settings().map_err(err)?;
        cfg.auth.registration().map_err(err)?;
        cfg.tls
            .resolve(path.parent().unwrap_or_else(|| Path::new(".")));
        let no_tls = cfg.tls.load(true).map_err(err)?.is_none();
        if no_tls && cfg.namesrv_tls {
            return Err(err(
                "namesrv_tls needs [tls] (its ca_file checks the name servers)".into(),
            ));
        }
        if cfg.remoting_tls_mode.is_some() && (no_tls || cfg.remoting_addr.is_none()) {
            return Err(err(
                "remoting_tls_mode needs [tls] and remoting_addr (it says which \
                 connections the remoting port serves with TLS on)"
                    .into(),
            ));
        }
        let s = cfg.service_settings();
        if !(1..=crate::broker::MAX_QUEUES).contains(&s.max_queues_per_topic) {
            return Err(err(format!(
                "max_queues_per_topic must be 1..={}, not {}",
                crate::broker::MAX_QUEUES,
                s.max_queues_per_topic
            )));
        }
        if !(1..=s.max_queues_per_topic).contains(&s.default_queue_count) {
            return Err(err(format!(
                "default_topic_queue_count must be 1..={} (max_queues_per_topic), not {}",
                s.max_queues_per_topic, s.default_queue_count
            )));
        }
        let store_max = ledgermq_store::commit_log::DEFAULT_MAX_MESSAGE_SIZE_BYTES;
        if !(1..=store_max).contains(&s.max_body_bytes) {
            return Err(err(format!(
                "max_body_bytes must be 1..={store_max} (the store's limit), not {}",
                s.max_body_bytes
            )));
        }
        if cfg.delete_when_hour > 23 {
            return Err(err(format!(
                "delete_when_hour must be 0..=23, not {}",
                cfg.delete_when_hour
            )));
        }
        if !(cfg.disk_max_used_space_ratio > 0.0 && cfg.disk_max_used_space_ratio <= 1.0) {
            return Err(err(format!(
                "disk_max_used_space_ratio must be in (0, 1], not {}",
                cfg.disk_max_used_space_ratio
            )));
        }
        if s.max_messages_per_send == 0 || s.telemetry_reply_buffer == 0 {
            return Err(err(
                "max_messages_per_send and telemetry_reply_buffer must be at least 1".into(),
            ));
        }
        if s.transaction_check_interval_ms == 0 || s.transaction_check_max == 0 {
            return Err(err(
                "transaction_check_interval_ms and transaction_check_max must be at least 1".into(),
            ));
        }
        if !(cfg.disk_space_warning_ratio > 0.0 && cfg.disk_space_warning_ratio <= 1.0) {
            return Err(err(format!(
                "disk_space_warning_ratio must be in (0, 1], not {}",
                cfg.disk_space_warning_ratio
            )));
        }
        if cfg.retention_interval.is_zero() {
            return Err(err("retention_interval_ms must be at least 1".into()));
        }
        if !(cfg.disk_force_clean_ratio > 0.0 && cfg.disk_force_clean_ratio <= 1.0) {
            return Err(err(format!(
                "disk_force_clean_ratio must be in (0, 1], not {}",
                cfg.disk_force_clean_ratio
            )));
        }
        cfg.check_client_endpoint(&members).map_err(err)?;
        Ok(cfg)
    }

    /// What this node announces as its client address: `client_endpoint` if set,
    /// else `client_addr`.
    pub fn advertised_client_addr(&self) -> &str {
        self.client_endpoint.as_deref().unwrap_or(&self.client_addr)
    }

    /// `client_endpoint`, if set, is `host:port` and every member's own client
    /// address is configured (passing calls on to the leader needs them).
    fn check_client_endpoint(&self, members: &BTreeMap<u64, String>) -> Result<(), String> {
        let Some(e) = &self.client_endpoint else {
            return Ok(());
        };
        let port_ok = e
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !port_ok {
            return Err(format!("client_endpoint {e:?} is not host:port"));
        }
        let known = self.member_client_addrs()?;
        if let Some(id) = members.keys().find(|id| !known.contains_key(id)) {
            return Err(format!(
                "client_endpoint is set, so [client_addrs] must name every member; node {id} is missing"
            ));
        }
        Ok(())
    }

    /// The client-protocol settings: the configured ones, defaults for the rest.
    pub fn service_settings(&self) -> crate::broker::ServiceSettings {
        crate::broker::ServiceSettings {
            max_body_bytes: self.max_body_bytes,
            auto_create_topics: self.auto_create_topics,
            auto_create_groups: self.auto_create_groups,
            exact_delivery_attempts: self.exact_delivery_attempts,
            stale_member_ms: (self.namesrv_heartbeat.as_millis() as u64).saturating_mul(3),
            require_client_id: self.require_client_id,
            max_queues_per_topic: self.max_queues_per_topic,
            max_consumer_groups: self.max_consumer_groups,
            max_broadcast_clients_per_group: self.max_broadcast_clients_per_group,
            broadcast_client_idle_ms: self.broadcast_client_idle.as_millis() as u64,
            max_messages_per_send: self.max_messages_per_send,
            telemetry_reply_buffer: self.telemetry_reply_buffer,
            max_delay_ms: self.max_delay.as_millis() as u64,
            transaction_timeout_ms: self.transaction_timeout_ms,
            transaction_check_interval_ms: self.transaction_check_interval_ms,
            transaction_check_max: self.transaction_check_max,
            default_queue_count: self.default_topic_queue_count,
            remoting_tls_mode: self.remoting_tls_mode.unwrap_or_default(),
            // Checked by `load`; a config built in code with a bad `[auth]`
            // keeps checking clients (closed, not open), without inner
            // credentials.
            auth: self.auth.settings().unwrap_or_else(|e| {
                tracing::warn!(error = %e, "the [auth] settings are not valid");
                crate::auth::AuthSettings {
                    enabled: self.auth.enabled,
                    max_clock_skew_ms: self.auth.max_clock_skew_ms,
                    inner: None,
                    bootstrap_users: Vec::new(),
                }
            }),
            ..crate::broker::ServiceSettings::default()
        }
    }

    /// The peers with numeric ids.
    pub fn members(&self) -> Result<BTreeMap<u64, String>, String> {
        self.peers
            .iter()
            .map(|(k, v)| {
                k.parse::<u64>()
                    .map(|id| (id, v.clone()))
                    .map_err(|_| format!("peer id {k:?} is not a number"))
            })
            .collect()
    }

    /// Client addresses by node id: `client_addrs`, plus this node's `client_addr`.
    pub fn member_client_addrs(&self) -> Result<BTreeMap<u64, String>, String> {
        let mut out = BTreeMap::new();
        for (k, v) in &self.client_addrs {
            let id = k
                .parse::<u64>()
                .map_err(|_| format!("client_addrs id {k:?} is not a number"))?;
            out.insert(id, v.clone());
        }
        out.insert(self.node_id, self.client_addr.clone());
        Ok(out)
    }

    /// The flush mode.
    pub fn flush_mode(&self) -> Result<FlushMode, String> {
        self.flush.parse()
    }

    /// The store settings (RocketMQ defaults with this node's root, segment size and
    /// flush mode).
    pub fn store_config(&self) -> Result<StoreConfig, String> {
        let mut s = StoreConfig::new(&self.store_root);
        s.commit_log.segment_bytes = self.commit_log_segment_bytes;
        s.flush_mode = self.flush_mode()?;
        s.retention.disk_space_warning_ratio = self.disk_space_warning_ratio;
        s.retention.disk_force_clean_ratio = self.disk_force_clean_ratio;
        s.retention.file_reserved_time_hours = self.file_reserved_time_hours;
        s.retention.delete_when_hour = self.delete_when_hour;
        s.retention.disk_max_used_space_ratio = self.disk_max_used_space_ratio;
        Ok(s)
    }
}

#[cfg(test)]
mod tests;
