//! A broker node's `mqbroker -c FILE` configuration as the harnesses write it: the
//! keys of `ledgermq_broker::config::BrokerConfig` that harnesses set, serialized
//! with `toml` (so paths and names are quoted correctly). A broker unit test
//! (`config::tests::the_test_kits_broker_files_load`) loads a file with every
//! option set through `BrokerConfig::load` and checks each value, and the
//! in-process node test starts from these files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::KitError;

/// One broker node's configuration (keys as in `deploy/local/n0.toml`). Options
/// left `None` are not written, so the broker's defaults apply.
#[derive(Debug, Clone, Serialize)]
pub struct BrokerToml {
    /// RocketMQ cluster name.
    pub cluster: String,
    /// Broker group (one Raft group).
    pub broker_group: String,
    /// This node's id within the group.
    pub node_id: u64,
    /// This node's client gRPC address, `host:port`.
    pub client_addr: String,
    /// Name servers, `host:port` each.
    pub namesrv_addrs: Vec<String>,
    /// Store root directory.
    pub store_root: PathBuf,
    /// `sync` (SYNC_FLUSH) or `async` (ASYNC_FLUSH).
    pub flush: String,
    /// CommitLog segment size in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit_log_segment_bytes: Option<u64>,
    /// Name-server heartbeat period, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namesrv_heartbeat_ms: Option<u64>,
    /// Used-disk ratio above which the node warns (harnesses set 0.99: their
    /// machines' disks are often fuller than a server's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_space_warning_ratio: Option<f64>,
    /// Period of retention runs, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_interval_ms: Option<u64>,
    /// The `host:port` routes advertise instead of each node's own client address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_endpoint: Option<String>,
    /// Time between checks back of one orphaned transaction, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transaction_check_interval_ms: Option<u64>,
    /// Most checks back of one orphaned transaction.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transaction_check_max: Option<u32>,
    /// Create a topic on its first send or route query.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_create_topics: Option<bool>,
    /// `exact_delivery_attempts`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exact_delivery_attempts: Option<bool>,
    /// The 4.x remoting address, `host:port` (unset: no remoting service).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remoting_addr: Option<String>,
    /// The Prometheus endpoint's address, `host:port` (unset: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_addr: Option<String>,
    /// Call the name servers over TLS, checked against `tls.ca_file` (needs
    /// [`BrokerToml::tls`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namesrv_tls: Option<bool>,
    /// Every member: node id → Raft peer address (`[peers]`).
    pub peers: BTreeMap<String, String>,
    /// Every member: node id → client address (`[client_addrs]`).
    pub client_addrs: BTreeMap<String, String>,
    /// Client authentication and ACLs (`[auth]`; unset: every call allowed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthToml>,
    /// TLS on the client port and mutual TLS on the Raft port (`[tls]`, paths
    /// best absolute; unset: plain text).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<ledgermq_tls::TlsFiles>,
}

/// A broker node's `[auth]` table (the keys of
/// `ledgermq_broker::config::AuthConfig` that harnesses set; see
/// `deploy/local-secure/n0.toml`).
#[derive(Debug, Clone, Serialize)]
pub struct AuthToml {
    /// Check every client call's signature and permissions.
    pub enabled: bool,
    /// The members' own access key (an admin's).
    pub inner_access_key: String,
    /// Its secret key.
    pub inner_secret_key: String,
    /// What the node signs its name-server registrations with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registration_access_key: Option<String>,
    /// Its secret key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registration_secret_key: Option<String>,
    /// Users the first leader creates (`[[auth.users]]`).
    pub users: Vec<UserToml>,
}

/// One `[[auth.users]]` entry.
#[derive(Debug, Clone, Serialize)]
pub struct UserToml {
    /// The access key.
    pub username: String,
    /// The secret key.
    pub secret_key: String,
    /// May make admin calls.
    pub admin: bool,
    /// `Topic:NAME` / `Group:NAME` → `PUB`, `SUB`, `PUB|SUB` or `DENY`.
    pub permissions: BTreeMap<String, String>,
}

impl BrokerToml {
    /// Node `node_id` of a group whose members' Raft addresses are `raft_addrs`
    /// and client addresses `client_addrs` (member `i` at index `i`), SYNC_FLUSH,
    /// every option at the broker's default.
    pub fn member(
        cluster: &str,
        broker_group: &str,
        node_id: usize,
        raft_addrs: &[String],
        client_addrs: &[String],
        store_root: &Path,
    ) -> Self {
        let by_id = |addrs: &[String]| {
            addrs
                .iter()
                .enumerate()
                .map(|(i, a)| (i.to_string(), a.clone()))
                .collect()
        };
        Self {
            cluster: cluster.to_owned(),
            broker_group: broker_group.to_owned(),
            node_id: node_id as u64,
            client_addr: client_addrs[node_id].clone(),
            namesrv_addrs: Vec::new(),
            store_root: store_root.to_path_buf(),
            flush: "sync".to_owned(),
            commit_log_segment_bytes: None,
            namesrv_heartbeat_ms: None,
            disk_space_warning_ratio: None,
            retention_interval_ms: None,
            client_endpoint: None,
            transaction_check_interval_ms: None,
            transaction_check_max: None,
            auto_create_topics: None,
            exact_delivery_attempts: None,
            remoting_addr: None,
            metrics_addr: None,
            namesrv_tls: None,
            peers: by_id(raft_addrs),
            client_addrs: by_id(client_addrs),
            auth: None,
            tls: None,
        }
    }

    /// The file's text.
    pub fn to_toml(&self) -> String {
        toml::to_string(self)
            .expect("a BrokerToml always serializes: strings, numbers and string maps")
    }

    /// Writes the file to `path`. Error: [`KitError::Io`].
    pub fn write(&self, path: &Path) -> Result<(), KitError> {
        std::fs::write(path, self.to_toml())
            .map_err(KitError::io(format!("writing {}", path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_every_member_and_only_the_options_set() {
        let raft = ["127.0.0.1:1".to_owned(), "127.0.0.1:2".to_owned()];
        let client = ["127.0.0.1:3".to_owned(), "127.0.0.1:4".to_owned()];
        let mut t = BrokerToml::member("C", "g", 1, &raft, &client, Path::new("/tmp/a \"b\""));
        t.namesrv_heartbeat_ms = Some(1000);
        let text = t.to_toml();
        let v: toml::Value = toml::from_str(&text).unwrap();
        assert_eq!(v["node_id"].as_integer(), Some(1));
        assert_eq!(v["client_addr"].as_str(), Some("127.0.0.1:4"));
        assert_eq!(v["store_root"].as_str(), Some("/tmp/a \"b\""));
        assert_eq!(v["namesrv_heartbeat_ms"].as_integer(), Some(1000));
        assert_eq!(v["peers"]["0"].as_str(), Some("127.0.0.1:1"));
        assert_eq!(v["client_addrs"]["1"].as_str(), Some("127.0.0.1:4"));
        assert!(v.get("retention_interval_ms").is_none(), "{text}");
        assert!(v.get("client_endpoint").is_none(), "{text}");
    }
}
