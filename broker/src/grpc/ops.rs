//! The day-to-day admin calls of `mqadmin` that are not about messages:
//! TransferLeader (`transferLeader`), BrokerStatus (`brokerStatus`) and
//! GetBrokerConfig (`getBrokerConfig`). The status and configuration are this
//! node's own, never passed on; the key/value rendering is plain (no I/O but
//! what the callers read).

use std::time::Duration;

use ledgermq_raft::RaftNodeError;

use crate::admin_pb::{KeyValue, KeyValues, TransferLeaderRequest, TransferLeaderResponse};
use crate::broker::Broker;

/// How long a TransferLeader waits when the request names no timeout.
const DEFAULT_TRANSFER_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a TransferLeader may wait.
const MAX_TRANSFER_TIMEOUT: Duration = Duration::from_secs(600);

/// Hands leadership over as `r` asks, if this node leads.
pub async fn transfer_leader(b: &Broker, r: TransferLeaderRequest) -> TransferLeaderResponse {
    let node = &b.node;
    if !node.is_leader() {
        return TransferLeaderResponse {
            error: "this node is not the leader".into(),
            leader_id: node.leader().map(|l| l.0),
            not_leader: true,
        };
    }
    let timeout = match r.timeout_ms {
        0 => DEFAULT_TRANSFER_TIMEOUT,
        ms => Duration::from_millis(ms).min(MAX_TRANSFER_TIMEOUT),
    };
    if let Some(t) = r.target_node_id {
        let voters = node
            .raft()
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect::<Vec<_>>();
        if t == node.id() || !voters.contains(&t) {
            return TransferLeaderResponse {
                error: format!("node {t} is not another voter of this group (voters {voters:?})"),
                leader_id: Some(node.id()),
                not_leader: false,
            };
        }
    }
    tracing::info!(target = ?r.target_node_id, "transferLeader asked");
    match node.transfer_leadership(r.target_node_id, timeout).await {
        Ok(to) => TransferLeaderResponse {
            error: String::new(),
            leader_id: Some(to),
            not_leader: false,
        },
        Err(RaftNodeError::NotLeader { leader }) => TransferLeaderResponse {
            error: "this node stopped leading before the hand-over".into(),
            leader_id: leader,
            not_leader: true,
        },
        Err(e) => TransferLeaderResponse {
            error: e.to_string(),
            leader_id: node.leader().map(|l| l.0),
            not_leader: false,
        },
    }
}

fn kv(key: &str, value: impl ToString) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: value.to_string(),
    }
}

/// This node's status: identity, Raft, store and traffic since start.
pub fn broker_status(b: &Broker) -> KeyValues {
    let node = &b.node;
    let m = node.raft().metrics().borrow().clone();
    let status = crate::grpc::raft_status::raft_status(node.id(), &m);
    let store = node.store();
    let log = store.commit_log();
    let (topics, groups) = {
        let meta = node.shared_meta().read().unwrap();
        (meta.topics.len(), meta.groups.len())
    };
    let (msgs_in, bytes_in, msgs_out, bytes_out) = b.metrics.totals();
    let opt = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    let disk = store
        .disk_used_ratio()
        .map_or_else(|e| format!("unknown ({e})"), |r| format!("{r:.4}"));
    let entries = vec![
        kv("brokerGroup", &b.group),
        kv("nodeId", node.id()),
        kv("version", env!("CARGO_PKG_VERSION")),
        kv("uptimeSeconds", b.started.elapsed().as_secs()),
        kv("role", &status.role),
        kv("term", status.term),
        kv("leaderId", opt(status.leader_id)),
        kv("voters", format!("{:?}", status.voters)),
        kv("learners", format!("{:?}", status.learners)),
        kv("lastLogIndex", opt(status.last_log_index)),
        kv("appliedIndex", opt(status.applied_index)),
        kv("inContactWithQuorum", node.in_contact_with_quorum()),
        kv("commitLogFirstIndex", log.first_log_index()),
        kv("commitLogNextIndex", log.next_log_index()),
        kv(
            "flushDiskType",
            match store.config().flush_mode {
                ledgermq_store::FlushMode::Sync => "SYNC_FLUSH",
                ledgermq_store::FlushMode::Async => "ASYNC_FLUSH",
            },
        ),
        kv("diskUsedRatio", disk),
        kv("topicCount", topics),
        kv("consumerGroupCount", groups),
        kv("messagesInTotal", msgs_in),
        kv("messagesInBytes", bytes_in),
        kv("messagesOutTotal", msgs_out),
        kv("messagesOutBytes", bytes_out),
    ];
    KeyValues {
        node_id: node.id(),
        entries,
    }
}

/// This node's effective configuration: the TOML text `BrokerNode::start`
/// rendered (defaults included), one entry per top-level key, tables (peers,
/// client addresses) as inline TOML. Empty when none was set.
pub fn broker_config(b: &Broker) -> KeyValues {
    KeyValues {
        node_id: b.node.id(),
        entries: b
            .effective_config
            .get()
            .map(|text| config_entries(text))
            .unwrap_or_default(),
    }
}

/// The top-level keys of TOML document `text`, in order, each with its value
/// as TOML. No I/O.
pub fn config_entries(text: &str) -> Vec<KeyValue> {
    let Ok(doc) = text.parse::<toml::Table>() else {
        return vec![kv("error", "the configuration does not parse as TOML")];
    };
    doc.iter()
        .map(|(k, v)| {
            let value = match v {
                toml::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            kv(k, value)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_lists_every_top_level_key_with_tables_inline() {
        let e = config_entries(
            "cluster = \"C\"\nnode_id = 1\njoin = false\n[peers]\n0 = \"a:1\"\n1 = \"b:2\"\n",
        );
        let got: Vec<(&str, &str)> = e
            .iter()
            .map(|k| (k.key.as_str(), k.value.as_str()))
            .collect();
        assert_eq!(got[0], ("cluster", "C"));
        assert_eq!(got[1], ("join", "false"));
        assert_eq!(got[2], ("node_id", "1"));
        assert_eq!(got[3].0, "peers");
        assert!(
            got[3].1.contains("\"a:1\"") && got[3].1.contains("\"b:2\""),
            "{}",
            got[3].1
        );
        assert_eq!(config_entries("= bad")[0].key, "error");
    }
}
