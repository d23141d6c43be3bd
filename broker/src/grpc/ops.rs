//! The day-to-day admin calls of `mqadmin` that are not about messages:
//! TransferLeader (`transferLeader`), BrokerStatus (`brokerStatus`),
//! GetBrokerConfig (`getBrokerConfig`) and ConsumerConnection
//! (`consumerConnection`). The status and configuration are this
//! node's own, never passed on; the key/value rendering is plain (no I/O but
//! what the callers read).

use std::time::Duration;

use ledgermq_raft::RaftNodeError;

use crate::admin_pb::{
    ConsumerConnection, ConsumerConnectionResponse, KeyValue, KeyValues, TransferLeaderRequest,
    TransferLeaderResponse,
};
use crate::broker::Broker;

/// How long a TransferLeader waits when the request names no timeout.
const DEFAULT_TRANSFER_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a TransferLeader may wait: writes pause while it does.
const MAX_TRANSFER_TIMEOUT: Duration = Duration::from_secs(30);
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
    if let Some(why) = node.hand_over_refusal(r.target_node_id) {
        return TransferLeaderResponse {
            error: format!("{why}: not handed over"),
            leader_id: Some(node.id()),
            not_leader: false,
        };
    }
    if r.target_node_id == Some(node.id()) {
        // Already there: nothing to do.
        return TransferLeaderResponse {
            error: String::new(),
            leader_id: Some(node.id()),
            not_leader: false,
        };
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

/// Why topic `name` may not be deleted with deleteTopic, if it may not: the
/// broker's own topics (half messages, timers, the default topic), and a
/// consumer group's retry and dead-letter topics, which go with the group
/// (deleteSubGroup). No I/O.
pub fn undeletable_topic(name: &str) -> Option<String> {
    let system = [
        ledgermq_store::half_index::HALF_TOPIC,
        ledgermq_store::half_index::OP_HALF_TOPIC,
        ledgermq_store::timer_index::TIMER_TOPIC,
        crate::announce::DEFAULT_TOPIC,
    ];
    if system.contains(&name) || name.starts_with("rmq_sys_") || name.starts_with("RMQ_SYS_") {
        return Some(format!(
            "{name} is one of the broker's own topics: not deleted"
        ));
    }
    if name.starts_with("%RETRY%") || name.starts_with("%DLQ%") {
        return Some(format!(
            "{name} belongs to a consumer group: deleteSubGroup deletes it with the group"
        ));
    }
    None
}

fn kv(key: &str, value: impl ToString) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: value.to_string(),
    }
}

/// This node's status: identity, Raft, store and traffic since start, printed
/// as `key : value` lines the way RocketMQ's brokerStatus prints its own
/// (the keys are this broker's, plus RocketMQ's `bootTimestamp` and
/// `brokerVersionDesc`).
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
        kv(
            "brokerVersionDesc",
            concat!("LedgerMQ ", env!("CARGO_PKG_VERSION")),
        ),
        kv("bootTimestamp", boot_timestamp_ms(b)),
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

/// The consumers of `group` connected to this node.
pub fn consumer_connection(b: &Broker, group: &str) -> ConsumerConnectionResponse {
    ConsumerConnectionResponse {
        node_id: b.node.id(),
        connections: b
            .consumer_clients
            .list(group)
            .into_iter()
            .map(|s| ConsumerConnection {
                client_id: s.client_id,
                protocol: s.info.protocol.to_owned(),
                language: s.info.language,
                version: s.info.version,
                addr: s.info.addr,
                idle_ms: s.idle.as_millis() as u64,
            })
            .collect(),
    }
}

/// When this broker started, in ms since the Unix epoch.
fn boot_timestamp_ms(b: &Broker) -> i64 {
    let up_ms = i64::try_from(b.started.elapsed().as_millis()).unwrap_or(i64::MAX);
    ledgermq_store::store::now_ms().saturating_sub(up_ms)
}

/// This node's effective configuration: the TOML text `BrokerNode::start`
/// rendered (defaults included), one entry per top-level key, tables (peers,
/// client addresses) as inline TOML; an `error` entry when none was kept.
pub fn broker_config(b: &Broker) -> KeyValues {
    KeyValues {
        node_id: b.node.id(),
        entries: match b.effective_config.get() {
            Some(text) => config_entries(text),
            None => vec![kv(
                "error",
                "this node kept no configuration (it did not render at start: see its log)",
            )],
        },
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
    fn the_brokers_own_topics_and_a_groups_are_not_deleted_alone() {
        for t in [
            "TBW102",
            "RMQ_SYS_TRANS_HALF_TOPIC",
            "rmq_sys_wheel_timer",
            "%RETRY%G",
            "%DLQ%G",
        ] {
            assert!(undeletable_topic(t).is_some(), "{t}");
        }
        assert_eq!(undeletable_topic("TopicA"), None);
    }

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
